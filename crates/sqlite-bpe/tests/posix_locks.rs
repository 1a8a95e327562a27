//! A connection of another VFS in this process (a plain unix-VFS writer beside bpe readers, as
//! rqlite runs) keeps its locks when bpe's last connection to the file closes. Closing any
//! descriptor of a file drops all of the process's POSIX locks on it, so bpe's own descriptors
//! stay open while the process holds locks on the file (`bpe-core/src/io/posix_locks.rs`).

mod common;
use common::*;
use std::path::Path;

/// Whether another process can take the write lock now (`BEGIN IMMEDIATE`, no busy wait).
fn another_process_can_write(db: &Path) -> bool {
    let shell =
        sqlite3_shell().expect("the sqlite3 shell is not installed (apt-get install sqlite3)");
    let out = std::process::Command::new(shell)
        .arg(db)
        .arg("BEGIN IMMEDIATE; ROLLBACK;")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() || err.contains("database is locked"),
        "the probe failed otherwise: {err}"
    );
    out.status.success()
}

#[test]
fn closing_bpes_last_connection_keeps_another_vfss_locks() {
    let dir = tempdir();
    let db = dir.path().join("locks.db");
    let writer = open_unix(&db);
    writer
        .execute_batch(
            "CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT);
             WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < 500)
               INSERT INTO t SELECT i, 'x' FROM c;",
        )
        .unwrap();
    assert!(another_process_can_write(&db));
    // The plain writer holds the write lock (RESERVED: a POSIX lock on the file).
    writer
        .execute_batch("BEGIN IMMEDIATE; UPDATE t SET v = 'y' WHERE id = 1;")
        .unwrap();
    assert!(!another_process_can_write(&db));
    for round in 0..3 {
        let reader = open_bpe(&db);
        let n: i64 = reader
            .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
            .unwrap();
        assert_eq!(n, 500);
        drop(reader);
        assert!(
            !another_process_can_write(&db),
            "round {round}: closing bpe's connection dropped the writer's lock: another \
             process could write beside it"
        );
    }
    writer.execute_batch("COMMIT").unwrap();
    drop(writer);
    // With no lock left, bpe's descriptors close (and nothing holds the file).
    let reader = open_bpe(&db);
    let v: String = reader
        .query_row("SELECT v FROM t WHERE id = 1", [], |r| r.get(0))
        .unwrap();
    assert_eq!(v, "y");
    drop(reader);
    assert!(another_process_can_write(&db));
}
