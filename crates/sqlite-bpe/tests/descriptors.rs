//! Descriptors per open database: an application with a database per tenant runs out of
//! descriptors (1,024 by default) after `1024 / per_database` databases, so bpe may hold only
//! few more than stock SQLite. Counted as the entries of /proc/self/fd while `DATABASES`
//! databases are open, each in a write transaction (after a first commit, so that everything a
//! writer keeps open is open), through the unix VFS and through bpe, in rollback and WAL mode.
//!
//! Stock holds the database and its journal (rollback) or WAL and wal-index (WAL); bpe adds one
//! descriptor of the database file (O_DIRECT reads, sizes, syncs: its buffered one is opened
//! only for callers that bring no descriptor of their own, which SQLite always does). The
//! commit log in /dev/shm is mapped, its descriptor closed (docs/SQLITE.md, "Descriptors").
//!
//! One test in this binary: nothing else opens or closes descriptors while it counts.

mod common;
use common::*;
use rusqlite::Connection;
use std::path::Path;

const DATABASES: usize = 16;

/// The descriptors open on files of `dir` whose names start with `prefix` (one phase's databases
/// and their journals, WALs and wal-indexes) or on bpe's shared memory in /dev/shm (the commit
/// logs). Others are left out: the engine's publisher opens its counters file for a moment each
/// second, and a database closed before the phase (the warm-up's) may keep a descriptor that bpe
/// lets go of later; a count of those would catch them or not depending on when it ran.
fn open_descriptors(dir: &Path, prefix: &str) -> usize {
    let dir = dir.canonicalize().unwrap();
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|target| {
            let shm = target.to_string_lossy();
            let in_phase = target.parent() == Some(dir.as_path())
                && target
                    .file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with(prefix));
            in_phase
                || (shm.starts_with("/dev/shm/sqlite-bpe-")
                    && !shm.ends_with(".tmp")
                    && !shm.ends_with(".counters"))
        })
        .count()
}

/// Descriptors per database with `DATABASES` databases of `dir` open through `vfs` in
/// `journal` mode, each in a write transaction.
fn per_database(dir: &Path, vfs: &str, journal: &str) -> f64 {
    let prefix = format!("{vfs}-{journal}-");
    let before = open_descriptors(dir, &prefix);
    let conns: Vec<Connection> = (0..DATABASES)
        .map(|i| {
            let path = dir.join(format!("{prefix}{i}.db"));
            let c = match vfs {
                "bpe" => open_bpe(&path),
                _ => open_unix(&path),
            };
            c.execute_batch(&format!(
                "PRAGMA journal_mode = {journal};
                 CREATE TABLE t(x); INSERT INTO t VALUES (1);
                 BEGIN; INSERT INTO t VALUES (2);"
            ))
            .unwrap();
            c
        })
        .collect();
    let during = open_descriptors(dir, &prefix);
    for c in conns {
        c.execute_batch("COMMIT").unwrap();
    }
    (during - before) as f64 / DATABASES as f64
}

#[test]
fn bpe_holds_at_most_one_descriptor_more_per_open_database_than_stock() {
    let dir = tempdir();
    // Whatever bpe opens once per process (its first connection) is not per database.
    drop(open_bpe(&dir.path().join("warm-up.db")));
    let mut report = Vec::new();
    for journal in ["DELETE", "WAL"] {
        let stock = per_database(dir.path(), "unix", journal);
        let bpe = per_database(dir.path(), "bpe", journal);
        report.push(format!("{journal}: stock {stock}, bpe {bpe}"));
        println!("{}", report.last().unwrap());
        // The data file's one descriptor of bpe's own (the processes' commit log, mapped at
        // the first rollback-mode commit, keeps no descriptor: peer_log.rs).
        assert!(
            bpe <= stock + 1.0,
            "{journal}: bpe holds {bpe} descriptors per database, stock {stock}"
        );
    }
}
