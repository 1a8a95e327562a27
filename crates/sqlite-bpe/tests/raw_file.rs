//! What a reader of the database file itself (a file copy, a size check: no SQLite locks) sees
//! in the middle of a rollback-mode write transaction, after SQLite wrote pages outside a
//! commit: `sqlite3_db_cacheflush` and a cache spill. Stock SQLite's page writes are in the file
//! when the call returns; with the default settings bpe's are too (write-behind, which keeps
//! them in RAM until the sync or unlock, is opt-in: `BPE_WRITE_BEHIND=1`). Each case runs the
//! same steps through the unix VFS and through bpe, and both must show the same file.
//!
//! Run with `BPE_WRITE_BEHIND=1` in the environment, these tests fail: that is the difference
//! SQLite's cacheflush.test, cachespill.test and io.test (io-3.2) found.

mod common;
use common::*;
use rusqlite::Connection;
use std::path::{Path, PathBuf};

/// The rows of `t`: (a, b).
type Rows = Vec<(i64, i64)>;

fn vfs_open(vfs: &str, path: &Path) -> Connection {
    match vfs {
        "bpe" => open_bpe(path),
        _ => open_unix(path),
    }
}

/// A rollback-mode database with one table of two rows, made by plain SQLite.
fn create(dir: &Path, name: &str) -> PathBuf {
    let path = dir.join(name);
    let c = open_unix(&path);
    c.execute_batch(
        "PRAGMA page_size = 4096; PRAGMA journal_mode = DELETE;
         CREATE TABLE t(a, b); INSERT INTO t VALUES (1, 2), (3, 4);",
    )
    .unwrap();
    path
}

/// The rows of `t` as plain SQLite reads them from a copy of the file's bytes alone (no
/// journal, no locks): what a backup made with `cp` would hold.
fn rows_of_a_copy(path: &Path) -> Rows {
    let copy = path.with_extension("copy");
    std::fs::copy(path, &copy).unwrap();
    let c = open_unix(&copy);
    let mut stmt = c.prepare("SELECT a, b FROM t ORDER BY a").unwrap();
    let rows = stmt
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    drop(stmt);
    drop(c);
    std::fs::remove_file(&copy).unwrap();
    rows
}

/// `sqlite3_db_cacheflush` in an open transaction: (rows of a copy before it, after it).
fn cacheflush(vfs: &str, dir: &Path) -> (Rows, Rows) {
    let path = create(dir, &format!("flush-{vfs}.db"));
    let c = vfs_open(vfs, &path);
    c.execute_batch("BEGIN; INSERT INTO t VALUES (5, 6);")
        .unwrap();
    let before = rows_of_a_copy(&path);
    c.cache_flush().unwrap();
    let after = rows_of_a_copy(&path);
    c.execute_batch("COMMIT").unwrap();
    (before, after)
}

#[test]
fn after_sqlite3_db_cacheflush_a_copy_of_the_file_holds_the_flushed_rows_as_with_stock() {
    let dir = tempdir();
    let stock = cacheflush("unix", dir.path());
    let old = vec![(1, 2), (3, 4)];
    let new = vec![(1, 2), (3, 4), (5, 6)];
    assert_eq!(stock, (old.clone(), new.clone()), "stock SQLite");
    assert_eq!(cacheflush("bpe", dir.path()), (old, new), "bpe");
}

/// A transaction of 200 rows of 900 bytes with a 10-page cache spills: (the file's size while
/// it is open, how many of its rows a copy of the file holds then, the file's size after a
/// ROLLBACK).
fn spill(vfs: &str, dir: &Path) -> (u64, usize, u64) {
    let path = create(dir, &format!("spill-{vfs}.db"));
    let size_before = std::fs::metadata(&path).unwrap().len();
    let c = vfs_open(vfs, &path);
    c.execute_batch(
        "PRAGMA cache_size = 10;
         BEGIN;
         WITH s(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM s WHERE i < 200)
         INSERT INTO t SELECT 1000 + i, printf('%.900c', 'x') || 'spilled row'
         FROM s;",
    )
    .unwrap();
    let size = std::fs::metadata(&path).unwrap().len();
    let bytes = std::fs::read(&path).unwrap();
    let needle = b"spilled row";
    let spilled = bytes.windows(needle.len()).filter(|w| w == needle).count();
    c.execute_batch("ROLLBACK").unwrap();
    let size_after = std::fs::metadata(&path).unwrap().len();
    assert_eq!(
        size_after, size_before,
        "{vfs}: the rollback restores the size"
    );
    (size, spilled, size_after)
}

#[test]
fn a_cache_spill_reaches_the_file_at_once_as_with_stock() {
    let dir = tempdir();
    let (stock_size, stock_spilled, _) = spill("unix", dir.path());
    // Stock wrote most of the 200 rows (about 50 pages) to the file before the commit.
    assert!(stock_size > 150_000, "stock's file: {stock_size} bytes");
    assert!(stock_spilled > 100, "stock spilled {stock_spilled} rows");
    let (size, spilled, _) = spill("bpe", dir.path());
    assert_eq!(size, stock_size, "the file's size in the transaction");
    assert_eq!(
        spilled, stock_spilled,
        "rows in the file in the transaction"
    );
}
