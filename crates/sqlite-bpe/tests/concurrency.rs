//! Many connections on many threads reading while one writes, all through one shared pool
//! (tiny memory and an extension, so pages keep moving between the tiers). Every row carries a
//! checksum of itself; readers verify each row they read, and that a row's version never goes
//! backwards for them.

mod common;
use common::*;
use rand::{Rng, SeedableRng};
use std::sync::atomic::{AtomicBool, Ordering};

const ROWS: i64 = 3000;

fn payload(id: i64, version: i64) -> (String, i64) {
    let text: String = (0..700)
        .map(|i| (b'a' + ((id * 7 + version * 13 + i) % 26) as u8) as char)
        .collect();
    let sum = text.bytes().fold(id ^ version, |acc, b| {
        acc.wrapping_mul(31).wrapping_add(b as i64)
    });
    (text, sum)
}

#[test]
fn readers_and_a_writer_share_one_pool_consistently() {
    let dir = tempdir();
    let db = dir.path().join("c.db");
    let setup = open_bpe(&db);
    setup
        .execute_batch("PRAGMA journal_mode=WAL; CREATE TABLE r(id INTEGER PRIMARY KEY, version INTEGER, body TEXT, sum INTEGER);")
        .unwrap();
    {
        let tx = setup.unchecked_transaction().unwrap();
        for id in 0..ROWS {
            let (body, sum) = payload(id, 0);
            tx.execute(
                "INSERT INTO r VALUES (?1, 0, ?2, ?3)",
                rusqlite::params![id, body, sum],
            )
            .unwrap();
        }
        tx.commit().unwrap();
    }
    // Pages still in the WAL are read by SQLite from the WAL itself; move them into the database
    // file, where reads go through the pool.
    setup
        .execute_batch("PRAGMA wal_checkpoint(TRUNCATE)")
        .unwrap();
    exec(&setup, "EXEC sp_configure 'max server memory (MB)', 1");
    exec(
        &setup,
        &format!(
            "ALTER SERVER CONFIGURATION SET BUFFER POOL EXTENSION ON (FILENAME = '{}', SIZE = 8 MB)",
            dir.path().join("c.bpe").display()
        ),
    );
    // A scan with the extension on pushes most rows through RAM into it; wait for the writer so
    // that the readers below surely read from both tiers.
    let _: i64 = setup
        .query_row("SELECT sum(length(body)) FROM r", [], |r| r.get(0))
        .unwrap();
    assert!(sqlite_bpe::engine().wait_for_extension_writes(std::time::Duration::from_secs(30)));
    let invalidations = counter(&setup, "File cache invalidations");
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let mut readers = Vec::new();
        for t in 0..4u64 {
            let (db, _stop) = (&db, &stop);
            readers.push(s.spawn(move || {
                let conn = open_bpe(db);
                conn.execute_batch("PRAGMA cache_size = 16").unwrap();
                let mut seen = vec![0i64; ROWS as usize];
                let mut rng = rand::rngs::StdRng::seed_from_u64(t);
                for _ in 0..1500 {
                    let id = rng.gen_range(0..ROWS);
                    let (version, body, sum): (i64, String, i64) = conn
                        .query_row(
                            "SELECT version, body, sum FROM r WHERE id = ?1",
                            [id],
                            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
                        )
                        .unwrap();
                    assert_eq!(
                        (body, sum),
                        payload(id, version),
                        "row {id} is inconsistent"
                    );
                    assert!(version >= seen[id as usize], "row {id} went back in time");
                    seen[id as usize] = version;
                }
            }));
        }
        let (db, stop) = (&db, &stop);
        s.spawn(move || {
            let conn = open_bpe(db);
            let mut rng = rand::rngs::StdRng::seed_from_u64(99);
            let mut version = 0;
            while !stop.load(Ordering::Relaxed) {
                version += 1;
                let tx = conn.unchecked_transaction().unwrap();
                for _ in 0..10 {
                    let id = rng.gen_range(0..ROWS);
                    let (body, sum) = payload(id, version);
                    tx.execute(
                        "UPDATE r SET version = ?2, body = ?3, sum = ?4 WHERE id = ?1",
                        rusqlite::params![id, version, body, sum],
                    )
                    .unwrap();
                }
                tx.commit().unwrap();
            }
        });
        let results: Vec<_> = readers.into_iter().map(|r| r.join()).collect();
        stop.store(true, Ordering::Relaxed);
        for r in results {
            if let Err(p) = r {
                std::panic::resume_unwind(p);
            }
        }
    });
    assert!(
        counter(&setup, "Extension page reads/sec") > 0,
        "the extension served nothing"
    );
    // The writer's commits, WAL restarts and checkpoints were all this process's own: none of
    // them may cost the cache its pages.
    assert_eq!(
        counter(&setup, "File cache invalidations"),
        invalidations,
        "this process's own WAL writes dropped its cached pages"
    );
    let ok: String = setup
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(ok, "ok");
}
