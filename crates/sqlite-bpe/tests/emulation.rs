//! The emulated data device is charged for every I/O of a database's files, not only its page
//! reads: page writes, the rollback journal's and the WAL's reads and writes, and every sync.
//! Counts, not times: the test sets a 1 µs sync latency (any `BPE_DATA_*` variable turns the
//! emulation on) and reads what the device was charged.
//!
//! One test in its own binary: the environment is read once per process.

mod common;
use common::*;
use sqlite_bpe::engine;

/// Rows of 1000 bytes: 100 of them span about 25 pages of 4 KiB.
const ROWS: i64 = 100;

#[test]
fn journals_wal_and_syncs_are_charged_to_the_emulated_device() {
    std::env::set_var("BPE_DATA_SYNC_LATENCY_US", "1");
    let dir = tempdir();

    // Rollback journal: each commit writes the journal (the pages' old contents), syncs it,
    // writes the pages, syncs the database.
    let db = dir.path().join("rollback.db");
    let c = open_bpe(&db);
    c.execute_batch(
        "PRAGMA journal_mode=DELETE; PRAGMA synchronous=FULL;
         CREATE TABLE t(id INTEGER PRIMARY KEY, pad BLOB);",
    )
    .unwrap();
    let engine = engine();
    assert!(engine.emulates_data_device());
    let insert =
        format!("INSERT INTO t SELECT value, randomblob(1000) FROM generate_series(1, {ROWS})");
    if c.execute_batch(&insert).is_err() {
        // SQLite built without generate_series: a recursive CTE does the same.
        c.execute_batch(&format!(
            "WITH RECURSIVE n(v) AS (SELECT 1 UNION ALL SELECT v + 1 FROM n WHERE v < {ROWS})
             INSERT INTO t SELECT v, randomblob(1000) FROM n"
        ))
        .unwrap();
    }
    let before = engine.data_device_charges().unwrap();
    let page_writes = counter(&c, "Page writes/sec");
    c.execute_batch("UPDATE t SET pad = randomblob(1000)")
        .unwrap();
    let after = engine.data_device_charges().unwrap();
    let pages = counter(&c, "Page writes/sec") - page_writes;
    assert!(pages >= 20, "the update wrote {pages} pages");
    let writes = (after.writes - before.writes) as i64;
    // Every page written is charged, and so is the journal's copy of it.
    assert!(
        writes >= 2 * pages,
        "{writes} writes charged for {pages} page writes and their journal"
    );
    assert!(after.written_bytes - before.written_bytes >= 2 * pages as u64 * 4096);
    // The journal's sync and the database's.
    assert!(after.syncs - before.syncs >= 2, "{before:?} -> {after:?}");
    drop(c);

    // WAL: a commit writes its frames to the WAL and syncs it; the database file is untouched
    // until a checkpoint copies the pages (reading the WAL, writing the database, syncing it).
    let db = dir.path().join("wal.db");
    let c = open_bpe(&db);
    c.execute_batch(
        "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL; PRAGMA wal_autocheckpoint=0;
         CREATE TABLE t(id INTEGER PRIMARY KEY, pad BLOB);",
    )
    .unwrap();
    c.execute_batch(&format!(
        "WITH RECURSIVE n(v) AS (SELECT 1 UNION ALL SELECT v + 1 FROM n WHERE v < {ROWS})
         INSERT INTO t SELECT v, randomblob(1000) FROM n"
    ))
    .unwrap();
    let before = engine.data_device_charges().unwrap();
    let page_writes = counter(&c, "Page writes/sec");
    c.execute_batch("UPDATE t SET pad = randomblob(1000)")
        .unwrap();
    let after_commit = engine.data_device_charges().unwrap();
    assert_eq!(
        counter(&c, "Page writes/sec"),
        page_writes,
        "a WAL commit writes no database page"
    );
    assert!(
        after_commit.writes - before.writes >= 20,
        "the WAL's frames are charged: {before:?} -> {after_commit:?}"
    );
    assert!(
        after_commit.syncs > before.syncs,
        "the WAL's sync is charged"
    );
    c.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)").unwrap();
    let after_checkpoint = engine.data_device_charges().unwrap();
    assert!(
        after_checkpoint.reads - after_commit.reads >= 20,
        "the checkpoint's reads of the WAL are charged: {after_commit:?} -> {after_checkpoint:?}"
    );
    assert!(after_checkpoint.writes - after_commit.writes >= 20);
    assert!(after_checkpoint.syncs > after_commit.syncs);
}
