//! SQLite's memory-mapped reads on bpe databases (`PRAGMA mmap_size` > 0): pages are
//! handed out in place from L1 (`xFetch`), not copied, and never stale: a plain (unix VFS)
//! writer's commits are seen by a long-lived bpe reader with memory-mapped reads on, in both
//! journal modes.

mod common;
use common::*;
use rusqlite::Connection;

const ROWS: i64 = 2000;

/// SQLite's page-cache misses of this connection so far (pages not served by its own cache,
/// nor memory-mapped).
fn cache_misses(c: &Connection) -> i32 {
    let (mut cur, mut hi) = (0, 0);
    // SAFETY: an open connection's handle; the out-pointers are valid.
    let rc = unsafe {
        libsqlite3_sys::sqlite3_db_status(
            c.handle(),
            libsqlite3_sys::SQLITE_DBSTATUS_CACHE_MISS,
            &mut cur,
            &mut hi,
            0,
        )
    };
    assert_eq!(rc, 0);
    cur
}

fn checksum(c: &Connection) -> (i64, i64) {
    c.query_row("SELECT sum(v), sum(v * id) FROM t", [], |r| {
        Ok((r.get(0)?, r.get(1)?))
    })
    .unwrap()
}

#[test]
fn memory_mapped_reads_come_from_l1_in_place_and_see_every_foreign_commit() {
    for mode in ["wal", "delete"] {
        let dir = tempdir();
        let db = dir.path().join("m.db");
        let setup = open_bpe(&db);
        setup
            .execute_batch(&format!(
                "PRAGMA journal_mode = {mode}; CREATE TABLE t (id INTEGER PRIMARY KEY, v INTEGER, pad BLOB);"
            ))
            .unwrap();
        setup
            .execute(
                "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?1)
                 INSERT INTO t SELECT i, 0, randomblob(500) FROM n",
                [ROWS],
            )
            .unwrap();
        drop(setup);

        let reader = open_bpe(&db);
        reader
            .execute_batch("PRAGMA cache_size = -64; PRAGMA mmap_size = 268435456;")
            .unwrap();
        let limit: i64 = reader
            .query_row("PRAGMA mmap_size", [], |r| r.get(0))
            .unwrap();
        assert_eq!(limit, 268_435_456, "{mode}: the mmap limit was not taken");
        checksum(&reader); // loads every page into L1
        let before = cache_misses(&reader);
        assert_eq!(checksum(&reader), (0, 0));
        let misses = cache_misses(&reader) - before;
        // About 300 pages; all but the first come from L1 in place (SQLite reads page 1
        // itself, and its own cache of 64 KiB cannot hold the table).
        assert!(
            misses <= 5,
            "{mode}: {misses} page-cache misses: xFetch did not serve L1's pages"
        );

        let writer = open_unix(&db);
        let mut vals = vec![0i64; ROWS as usize + 1];
        let mut x: u64 = 99;
        for round in 1..=60i64 {
            let tx = writer.unchecked_transaction().unwrap();
            for _ in 0..20 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let id = 1 + (x % ROWS as u64) as i64;
                tx.execute("UPDATE t SET v = ?1 WHERE id = ?2", [round, id])
                    .unwrap();
                vals[id as usize] = round;
            }
            tx.commit().unwrap();
            if mode == "wal" && round % 10 == 0 {
                writer
                    .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
                    .unwrap();
            }
            let want = vals
                .iter()
                .enumerate()
                .fold((0, 0), |(s, w), (id, v)| (s + v, w + v * id as i64));
            assert_eq!(
                checksum(&reader),
                want,
                "{mode}: round {round}: a stale page"
            );
        }
    }
}
