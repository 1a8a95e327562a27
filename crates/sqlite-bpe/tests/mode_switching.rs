//! Four processes on one database, each with one short-lived connection at a time: open it,
//! read, switch the journal mode (two processes to WAL, two to DELETE), insert a row, check
//! integrity, close; over and over (SQLite's walthread-2-processes, as applications that open a
//! connection per request run it). Between two of its connections a process has the file closed
//! while the others checkpoint, delete and create the WAL and write in rollback mode; the
//! pages its pool kept must be fresh at its next open, or its integrity check (and, once it
//! writes on a stale page, the database's) finds rows missing from the index.
//!
//! Until the pool's view of the wal-index survived a close, an equal stamp at the reopen was
//! trusted, and most runs of this test failed within seconds. With 4 and 16 KiB pages.

mod common;
use common::*;
use rusqlite::ErrorCode;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

const CHILD: &str = "BPE_TEST_MODE_SWITCH_CHILD";
const CHILD_DB: &str = "BPE_TEST_MODE_SWITCH_DB";
const CHILD_ID: &str = "BPE_TEST_MODE_SWITCH_ID";
/// How long each process runs its loop (a few hundred connections each).
const RUN: Duration = Duration::from_secs(4);

#[test]
#[ignore = "run by mode_switching's test as a child process"]
fn child_entry() {
    let Some(mode) = child_mode(CHILD) else {
        return;
    };
    let db = PathBuf::from(std::env::var(CHILD_DB).unwrap());
    let id: usize = std::env::var(CHILD_ID).unwrap().parse().unwrap();
    let until = Instant::now() + RUN;
    let mut rounds = 0u64;
    while Instant::now() < until {
        let c = open_bpe(&db);
        c.busy_timeout(Duration::from_secs(30)).unwrap();
        c.query_row("SELECT count(*) FROM sqlite_master", [], |r| {
            r.get::<_, i64>(0)
        })
        .unwrap();
        let switched = c.query_row(&format!("PRAGMA journal_mode = {mode}"), [], |r| {
            r.get::<_, String>(0)
        });
        match switched {
            Ok(_) => {}
            // Another process's connection is open: the switch waits for a later round.
            Err(e) if e.sqlite_error_code() == Some(ErrorCode::DatabaseBusy) => {}
            Err(e) => panic!("process {id}, round {rounds}: journal_mode = {mode}: {e}"),
        }
        c.execute_batch(&format!(
            "BEGIN; INSERT INTO t1 VALUES (NULL, randomblob({}));",
            100 + id
        ))
        .unwrap();
        c.execute_batch("COMMIT").unwrap();
        let check: String = c
            .query_row("PRAGMA integrity_check", [], |r| r.get(0))
            .unwrap();
        assert_eq!(check, "ok", "process {id} ({mode}), round {rounds}");
        rounds += 1;
        drop(c);
    }
    println!("ROUNDS {rounds}");
}

#[test]
fn short_lived_connections_of_four_processes_switching_journal_modes_see_every_write() {
    switching_journal_modes(4096);
}

#[test]
fn the_same_with_16_kib_pages() {
    switching_journal_modes(16384);
}

fn switching_journal_modes(page_size: u32) {
    let dir = tempdir();
    let db = dir.path().join("switching.db");
    open_unix(&db)
        .execute_batch(&format!(
            "PRAGMA page_size = {page_size}; CREATE TABLE t1(x INTEGER PRIMARY KEY, y UNIQUE)"
        ))
        .unwrap();
    let children: Vec<_> = ["DELETE", "DELETE", "WAL", "WAL"]
        .iter()
        .enumerate()
        .map(|(id, mode)| {
            child_command(CHILD, mode)
                .env(CHILD_DB, &db)
                .env(CHILD_ID, id.to_string())
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut inserted = 0u64;
    for (id, child) in children.into_iter().enumerate() {
        let done = wait_with_limit(child, RUN + Duration::from_secs(120));
        assert!(
            done.success(),
            "process {id} failed:\n{}\n{}",
            done.stdout,
            done.stderr
        );
        let rounds = done
            .stdout
            .split_once("ROUNDS ")
            .and_then(|(_, rest)| rest.split_whitespace().next()?.parse::<u64>().ok())
            .unwrap_or_else(|| panic!("process {id} did not say its rounds: {}", done.stdout));
        inserted += rounds;
    }
    assert!(inserted > 0, "no process completed a round");
    // Read by plain SQLite: the file itself, whatever any pool holds.
    let plain = open_unix(&db);
    let check: String = plain
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(check, "ok", "the database was written on a stale page");
    let rows: u64 = plain
        .query_row("SELECT count(*) FROM t1", [], |r| r.get(0))
        .unwrap();
    assert_eq!(rows, inserted, "a committed row is missing");
    let size: u32 = plain
        .query_row("PRAGMA page_size", [], |r| r.get(0))
        .unwrap();
    assert_eq!(size, page_size);
}
