//! Database files as the VFS sees them: different page sizes through one pool, the header and
//! other partial reads, page-size changes by VACUUM, and mmap not bypassing the pool.

mod common;
use common::*;

/// The pool is process-wide and tests run on parallel threads: these look at its contents.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn make(path: &std::path::Path, page_size: u32, rows: i64) -> rusqlite::Connection {
    let c = open_bpe(path);
    c.execute_batch(&format!(
        "PRAGMA page_size = {page_size}; CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT);"
    ))
    .unwrap();
    let tx = c.unchecked_transaction().unwrap();
    for id in 0..rows {
        tx.execute(
            "INSERT INTO t VALUES (?1, printf('%.*c', 300, char(65 + ?1 % 26)))",
            [id],
        )
        .unwrap();
    }
    tx.commit().unwrap();
    c
}

fn checksum(c: &rusqlite::Connection) -> (i64, i64) {
    c.query_row("SELECT count(*), sum(unicode(v) * id) FROM t", [], |r| {
        Ok((r.get(0)?, r.get(1)?))
    })
    .unwrap()
}

#[test]
fn databases_with_different_page_sizes_share_the_pool() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempdir();
    let small = make(&dir.path().join("p1k.db"), 1024, 2000);
    let large = make(&dir.path().join("p8k.db"), 8192, 2000);
    let (a, b) = (checksum(&small), checksum(&large));
    assert_eq!(a, b);
    let cached: std::collections::BTreeSet<i64> = small
        .prepare("SELECT DISTINCT database_id FROM bpe_buffer_descriptors")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    // The other tests' files (closed, deleted) may have pages there too.
    let id = |c: &rusqlite::Connection| c.query_row("SELECT DB_ID()", [], |r| r.get(0)).unwrap();
    assert!(
        cached.contains(&id(&small)) && cached.contains(&id(&large)),
        "both files should have pages in the one pool: {cached:?}"
    );
    // VACUUM into another page size: the cached pages of the old size must not be served.
    small
        .execute_batch("PRAGMA page_size = 4096; VACUUM;")
        .unwrap();
    assert_eq!(checksum(&small), a);
    let page_size: i64 = small
        .query_row("PRAGMA page_size", [], |r| r.get(0))
        .unwrap();
    assert_eq!(page_size, 4096);
    let ok: String = small
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(ok, "ok");
}

#[test]
fn mmap_does_not_bypass_the_pool() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempdir();
    let path = dir.path().join("m.db");
    drop(make(&path, 4096, 3000));
    // A fresh connection, so SQLite's own cache holds nothing yet.
    let c = open_bpe(&path);
    c.execute_batch("PRAGMA mmap_size = 268435456; PRAGMA cache_size = 8;")
        .unwrap();
    let before = counter(&c, "Page lookups/sec");
    checksum(&c);
    let after = counter(&c, "Page lookups/sec");
    assert!(
        after - before >= 200,
        "only {} page lookups: reads went around the pool",
        after - before
    );
}

#[test]
fn a_header_read_of_a_fresh_or_foreign_file_works() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempdir();
    let path = dir.path().join("h.db");
    {
        let plain = open_unix(&path);
        plain
            .execute_batch("PRAGMA page_size = 2048; CREATE TABLE t(x); INSERT INTO t VALUES (42);")
            .unwrap();
    }
    let c = open_bpe(&path);
    let x: i64 = c.query_row("SELECT x FROM t", [], |r| r.get(0)).unwrap();
    assert_eq!(x, 42);
    let ps: i64 = c.query_row("PRAGMA page_size", [], |r| r.get(0)).unwrap();
    assert_eq!(ps, 2048);
}

/// A file name is bytes, not necessarily UTF-8: the pool caches the file under its own name
/// (a name made lossy would be another file's: the `-shm` beside it, LiteFS's position file
/// and `BPE_CACHE_PATHS` are all found from it), and `DB_ID()` finds it.
#[test]
fn a_database_whose_name_is_not_utf8_is_cached_under_its_own_name() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    sqlite_bpe::register().expect("register");
    let dir = tempdir();
    let path = not_utf8_name(dir.path());
    // By name, not by URI: a URI is text.
    let open = || rusqlite::Connection::open_with_flags_and_vfs(&path, flags(), c"bpe").unwrap();
    let c = open();
    c.execute_batch(
        "CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT);
         WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 200)
           INSERT INTO t SELECT i, printf('%.300c', 'A') FROM n;",
    )
    .unwrap();
    drop(c);
    let c = open();
    let rows: i64 = c
        .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
        .unwrap();
    assert_eq!(rows, 200);
    assert_cached_under(&path);
    let id: Option<i64> = c.query_row("SELECT db_id()", [], |r| r.get(0)).unwrap();
    assert!(id.is_some(), "DB_ID() did not find the database");
}
