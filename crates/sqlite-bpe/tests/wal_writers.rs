//! Several connections of one process, each writing and reading in WAL mode with SQLite's
//! automatic checkpoints: this process's own writes, WAL restarts and checkpoints must never make
//! it drop its cached pages (`File cache invalidations` stays put).

mod common;
use common::*;
use rand::{Rng, SeedableRng};
use std::time::{Duration, Instant};

#[test]
fn own_writers_and_checkpoints_never_invalidate_the_cache() {
    let dir = tempdir();
    let db = dir.path().join("w.db");
    let setup = open_bpe(&db);
    setup
        .execute_batch(
            "PRAGMA journal_mode=WAL; PRAGMA wal_autocheckpoint=100;
             CREATE TABLE t(id INTEGER PRIMARY KEY, n INTEGER, pad BLOB);",
        )
        .unwrap();
    let tx = setup.unchecked_transaction().unwrap();
    for id in 0..20_000i64 {
        tx.execute("INSERT INTO t VALUES (?1, 0, zeroblob(200))", [id])
            .unwrap();
    }
    tx.commit().unwrap();
    let before = counter(&setup, "File cache invalidations");
    let seconds: u64 = std::env::var("BPE_WAL_WRITERS_SECONDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4);
    let end = Instant::now() + Duration::from_secs(seconds);
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let db = &db;
            s.spawn(move || {
                let c = open_bpe(db);
                c.busy_timeout(Duration::from_secs(30)).unwrap();
                c.execute_batch("PRAGMA cache_size = 8").unwrap();
                let mut rng = rand::rngs::StdRng::seed_from_u64(t);
                while Instant::now() < end {
                    let tx = c.unchecked_transaction().unwrap();
                    for _ in 0..5 {
                        let id = rng.gen_range(0..20_000i64);
                        tx.execute("UPDATE t SET n = n + 1 WHERE id = ?1", [id])
                            .unwrap();
                    }
                    if rng.gen_ratio(1, 10) {
                        tx.execute("INSERT INTO t(n, pad) VALUES (1, zeroblob(300))", [])
                            .unwrap();
                    }
                    tx.commit().unwrap();
                    let id = rng.gen_range(0..20_000i64);
                    let _: i64 = c
                        .query_row("SELECT n FROM t WHERE id = ?1", [id], |r| r.get(0))
                        .unwrap();
                }
            });
        }
    });
    assert_eq!(
        counter(&setup, "File cache invalidations"),
        before,
        "this process's own WAL writers dropped its cached pages"
    );
}
