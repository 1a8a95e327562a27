//! The database file's size as SQLite sees it. A read transaction's stamp (taken as its lock is
//! granted) answers SQLite's size query that follows, in place of a second stat call; these
//! tests check that the answer is always the file's size as a fresh fstat would give it: after
//! this connection changed the file under the same lock, and after another writer grew it
//! between transactions, in both journal modes.

mod common;
use common::*;
use libsqlite3_sys::*;
use rusqlite::Connection;
use std::ffi::{c_int, c_void};

const PAGE: i64 = 4096;

/// The connection's main database file, as its VFS sees it.
fn file_of(c: &Connection) -> *mut sqlite3_file {
    let mut f: *mut sqlite3_file = std::ptr::null_mut();
    // SAFETY: a live connection; the op writes one sqlite3_file pointer.
    let rc = unsafe {
        sqlite3_file_control(
            c.handle(),
            c"main".as_ptr(),
            SQLITE_FCNTL_FILE_POINTER,
            &mut f as *mut *mut sqlite3_file as *mut c_void,
        )
    };
    assert_eq!(rc, SQLITE_OK);
    assert!(!f.is_null());
    f
}

/// The file's methods (bpe's).
fn methods(f: *mut sqlite3_file) -> &'static sqlite3_io_methods {
    // SAFETY: an open file's methods outlive every call made on it in these tests.
    unsafe { &*(*f).pMethods }
}

fn lock(f: *mut sqlite3_file, level: c_int) {
    // SAFETY: an open file, called from the connection's only thread.
    assert_eq!(unsafe { methods(f).xLock.unwrap()(f, level) }, SQLITE_OK);
}

/// Takes the locks a writer takes, in SQLite's order: SHARED first (the read transaction's
/// stamp, and the size it hands over), then up to `level`.
fn lock_up_to(f: *mut sqlite3_file, level: c_int) {
    for l in [
        SQLITE_LOCK_SHARED,
        SQLITE_LOCK_RESERVED,
        SQLITE_LOCK_EXCLUSIVE,
    ] {
        if l <= level {
            lock(f, l);
        }
    }
}

fn unlock(f: *mut sqlite3_file) {
    // SAFETY: as above.
    let rc = unsafe { methods(f).xUnlock.unwrap()(f, SQLITE_LOCK_NONE) };
    assert_eq!(rc, SQLITE_OK);
}

fn size(f: *mut sqlite3_file) -> i64 {
    let mut n: i64 = -1;
    // SAFETY: as above; n is writable.
    assert_eq!(
        unsafe { methods(f).xFileSize.unwrap()(f, &mut n) },
        SQLITE_OK
    );
    n
}

fn write_page(f: *mut sqlite3_file, page: i64, byte: u8) {
    let buf = vec![byte; PAGE as usize];
    // SAFETY: as above; buf has PAGE bytes.
    let rc = unsafe {
        methods(f).xWrite.unwrap()(f, buf.as_ptr() as *const c_void, PAGE as c_int, page * PAGE)
    };
    assert_eq!(rc, SQLITE_OK);
}

fn truncate(f: *mut sqlite3_file, bytes: i64) {
    // SAFETY: as above.
    assert_eq!(
        unsafe { methods(f).xTruncate.unwrap()(f, bytes) },
        SQLITE_OK
    );
}

fn on_disk(path: &std::path::Path) -> i64 {
    std::fs::metadata(path).unwrap().len() as i64
}

/// A rollback-mode database of `pages` pages on the bpe VFS.
fn rollback_db(dir: &std::path::Path) -> (Connection, std::path::PathBuf) {
    let path = dir.join("size.db");
    let c = open_bpe(&path);
    c.execute_batch(
        "PRAGMA page_size = 4096; PRAGMA journal_mode = DELETE;
         CREATE TABLE t(id INTEGER PRIMARY KEY, v BLOB);
         WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 20)
         INSERT INTO t SELECT i, zeroblob(3000) FROM n;",
    )
    .unwrap();
    (c, path)
}

#[test]
fn the_size_after_a_shared_lock_is_the_files() {
    let dir = tempdir();
    let (c, path) = rollback_db(dir.path());
    let f = file_of(&c);
    lock(f, SQLITE_LOCK_SHARED);
    assert_eq!(size(f), on_disk(&path));
    // Asked again (the first answer is given once): still the file's.
    assert_eq!(size(f), on_disk(&path));
    unlock(f);
}

#[test]
fn a_write_under_the_lock_is_in_the_size_that_follows() {
    let dir = tempdir();
    let (c, path) = rollback_db(dir.path());
    let f = file_of(&c);
    let before = on_disk(&path);
    lock_up_to(f, SQLITE_LOCK_EXCLUSIVE);
    // The first size query after the lock comes after a write that grew the file.
    write_page(f, before / PAGE, 0);
    assert_eq!(size(f), before + PAGE);
    unlock(f);
    assert_eq!(on_disk(&path), before + PAGE);
}

#[test]
fn a_truncation_under_the_lock_is_in_the_size_that_follows() {
    let dir = tempdir();
    let (c, path) = rollback_db(dir.path());
    let f = file_of(&c);
    let before = on_disk(&path);
    lock_up_to(f, SQLITE_LOCK_EXCLUSIVE);
    truncate(f, before + 3 * PAGE);
    assert_eq!(size(f), before + 3 * PAGE);
    unlock(f);
}

#[test]
fn a_size_hint_that_grows_the_file_is_in_the_size_that_follows() {
    let dir = tempdir();
    let (c, path) = rollback_db(dir.path());
    let f = file_of(&c);
    let before = on_disk(&path);
    let mut chunk: c_int = 64 * 1024;
    let mut hint: i64 = before + 64 * 1024;
    lock_up_to(f, SQLITE_LOCK_RESERVED);
    // SAFETY: an open file; CHUNK_SIZE takes an int, SIZE_HINT an i64.
    unsafe {
        let fc = methods(f).xFileControl.unwrap();
        assert_eq!(
            fc(
                f,
                SQLITE_FCNTL_CHUNK_SIZE,
                &mut chunk as *mut c_int as *mut c_void
            ),
            SQLITE_OK
        );
        assert_eq!(
            fc(
                f,
                SQLITE_FCNTL_SIZE_HINT,
                &mut hint as *mut i64 as *mut c_void
            ),
            SQLITE_OK
        );
    }
    let grown = on_disk(&path);
    assert!(
        grown > before,
        "the hint grew the file ({before} -> {grown})"
    );
    assert_eq!(size(f), grown);
    unlock(f);
}

/// One round of growth: rows ?1..=?2 of 3000 bytes each.
const GROW: &str = "WITH RECURSIVE n(i) AS (SELECT ?1 UNION ALL SELECT i + 1 FROM n WHERE i < ?2)
                    INSERT INTO t SELECT i, zeroblob(3000) FROM n";

/// The rows `reader` sees: their count and the largest id.
fn rows_seen(reader: &Connection) -> (i64, i64) {
    reader
        .query_row("SELECT count(*), max(id) FROM t", [], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .unwrap()
}

/// Another writer (the unix VFS, as another process would) grows the database between two of
/// bpe's read transactions, many times, at each page size applications use: each transaction sees every row, which it would not if
/// SQLite were handed a size from before the growth.
fn a_foreign_writer_growing_the_file_is_seen(journal: &str, page_size: u32) {
    let dir = tempdir();
    let path = dir.path().join("grow.db");
    let writer = open_unix(&path);
    writer
        .execute_batch(&format!(
            "PRAGMA page_size = {page_size}; PRAGMA journal_mode = {journal};
             CREATE TABLE t(id INTEGER PRIMARY KEY, v BLOB);"
        ))
        .unwrap();
    let reader = open_bpe(&path);
    for round in 1..=30i64 {
        writer
            .execute(GROW, [(round - 1) * 7 + 1, round * 7])
            .unwrap();
        if journal == "WAL" && round % 3 == 0 {
            // Into the file: the bpe reader then reads with read mark 0 (the file alone).
            writer
                .execute_batch("PRAGMA wal_checkpoint(TRUNCATE);")
                .unwrap();
        }
        assert_eq!(
            rows_seen(&reader),
            (round * 7, round * 7),
            "{journal}, {page_size}-byte pages, round {round}"
        );
    }
}

#[test]
fn a_foreign_writer_growing_the_file_is_seen_in_rollback_mode() {
    for page_size in [4096, 8192, 16384] {
        a_foreign_writer_growing_the_file_is_seen("DELETE", page_size);
    }
}

#[test]
fn a_foreign_writer_growing_the_file_is_seen_in_wal_mode() {
    for page_size in [4096, 8192, 16384] {
        a_foreign_writer_growing_the_file_is_seen("WAL", page_size);
    }
}

/// WAL mode as short-lived connections run it: a plain writer grows the file and closes (the
/// last connection checkpoints and deletes the WAL), then a new bpe connection reads. Its
/// wal-index is rebuilt from an empty WAL and holds no page count, so SQLite asks the file's
/// size under read mark 0: the case in WAL mode where the stamp's size answers it.
#[test]
fn a_wal_reader_opening_after_the_writers_closed_sees_the_grown_file() {
    for page_size in [4096, 8192, 16384] {
        let dir = tempdir();
        let path = dir.path().join("grow.db");
        let wal = dir.path().join("grow.db-wal");
        open_unix(&path)
            .execute_batch(&format!(
                "PRAGMA page_size = {page_size}; PRAGMA journal_mode = WAL;
                 CREATE TABLE t(id INTEGER PRIMARY KEY, v BLOB);"
            ))
            .unwrap();
        for round in 1..=20i64 {
            open_unix(&path)
                .execute(GROW, [(round - 1) * 7 + 1, round * 7])
                .unwrap();
            assert!(!wal.exists(), "the writer's close left its WAL");
            assert_eq!(
                rows_seen(&open_bpe(&path)),
                (round * 7, round * 7),
                "{page_size}-byte pages, round {round}"
            );
        }
    }
}

/// A hot journal left by a writer that grew the file: bpe's first read transaction takes the
/// stamp's size for SQLite's hot-journal check, and the rollback that follows truncates the file
/// back; SQLite must then see the truncated size, not the one handed over under the lock.
#[test]
fn a_hot_journal_rollback_that_shrinks_the_file_is_in_the_size_that_follows() {
    let dir = tempdir();
    let live = dir.path().join("live.db");
    let writer = open_unix(&live);
    writer
        .execute_batch(
            "PRAGMA page_size = 4096; PRAGMA journal_mode = DELETE; PRAGMA cache_size = 8;
             CREATE TABLE t(id INTEGER PRIMARY KEY, v BLOB);
             INSERT INTO t VALUES (1, zeroblob(3000));
             BEGIN;
             WITH RECURSIVE n(i) AS (SELECT 2 UNION ALL SELECT i + 1 FROM n WHERE i < 200)
             INSERT INTO t SELECT i, zeroblob(3000) FROM n;",
        )
        .unwrap();
    // The transaction spilled: the file grew past its committed size and its journal is hot.
    let crashed = dir.path().join("crashed.db");
    std::fs::copy(&live, &crashed).unwrap();
    std::fs::copy(
        dir.path().join("live.db-journal"),
        dir.path().join("crashed.db-journal"),
    )
    .unwrap();
    let grown = on_disk(&crashed);
    drop(writer);

    let reader = open_bpe(&crashed);
    let (n, pages): (i64, i64) = reader
        .query_row(
            "SELECT (SELECT count(*) FROM t), (SELECT page_count FROM pragma_page_count)",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert_eq!(n, 1, "the rolled-back rows are gone");
    let rolled_back = on_disk(&crashed);
    assert!(
        rolled_back < grown,
        "the rollback shrank the file ({grown} -> {rolled_back})"
    );
    assert_eq!(pages * PAGE, rolled_back);
    let check: String = reader
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(check, "ok");
}
