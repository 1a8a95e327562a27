//! bpe over another VFS (`bpe_base=NAME`), the path Litestream's read-replica VFS takes, with a
//! stand-in base VFS: the unix VFS plus `PRAGMA litestream_txid`, which names the snapshot a
//! connection reads as the test sets it (Litestream's VFS names the replicated transaction it
//! serves). The real Litestream VFS runs in `tests/replicated/litestream-vfs` (CI); this one runs
//! in `cargo test` and says what each rule of `vfs/base_file.rs` is for:
//! - a named snapshot is read through the cache, and only once;
//! - a new name is a new snapshot: a row changed under it is never read from the old one;
//! - no name, or a writing connection: reads go to the base VFS, as if bpe were not there;
//! - a file name that is not UTF-8 is cached under its own name (a lossy one would be another
//!   file's).

mod common;
use common::*;
use libsqlite3_sys as ffi;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::OnceLock;

/// The base VFS's name, as the URI gives it.
const BASE: &CStr = c"txid";

/// The snapshot the base VFS names for every connection; 0: it names none (the pragma is not
/// found, as for a base VFS that does not know it).
static TXID: AtomicU64 = AtomicU64::new(0);

/// The unix VFS's methods of a main database file with `xFileControl` answering
/// `litestream_txid`, made from the first one the stand-in opens.
static METHODS: OnceLock<Methods> = OnceLock::new();

struct Methods {
    ours: ffi::sqlite3_io_methods,
    /// The unix VFS's methods for a main database (on Linux always the same table).
    unix: usize,
    unix_file_control: unsafe extern "C" fn(*mut ffi::sqlite3_file, c_int, *mut c_void) -> c_int,
    unix_lock: unsafe extern "C" fn(*mut ffi::sqlite3_file, c_int) -> c_int,
}

/// Runs once, in the next SHARED lock a main database takes through the stand-in, before the
/// lock: a commit landing between bpe's two looks at the snapshot name.
type Hook = Box<dyn FnOnce() + Send>;
static BEFORE_SHARED_LOCK: std::sync::Mutex<Option<Hook>> = std::sync::Mutex::new(None);

/// The tests of this file share one process, its engine and `TXID`.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn unix_vfs() -> *mut ffi::sqlite3_vfs {
    // SAFETY: the unix VFS is registered by SQLite's initialization and lives for the process.
    let vfs = unsafe { ffi::sqlite3_vfs_find(c"unix".as_ptr()) };
    assert!(!vfs.is_null(), "no unix VFS");
    vfs
}

unsafe extern "C" fn base_open(
    _vfs: *mut ffi::sqlite3_vfs,
    name: *const c_char,
    file: *mut ffi::sqlite3_file,
    flags: c_int,
    out_flags: *mut c_int,
) -> c_int {
    let unix = unix_vfs();
    // SAFETY: file has the unix VFS's szOsFile bytes (ours is the same); the rest is SQLite's.
    let rc = unsafe { ((*unix).xOpen.unwrap())(unix, name, file, flags, out_flags) };
    // Only a main database answers the pragma (SQLite asks it there); the unix VFS gives its
    // other files other methods (a journal's take no locks). Its methods live for the process.
    let main_db = flags & ffi::SQLITE_OPEN_MAIN_DB != 0;
    // SAFETY: an open unix file has its methods.
    if rc == ffi::SQLITE_OK && main_db && unsafe { !(*file).pMethods.is_null() } {
        let methods = METHODS.get_or_init(|| {
            // SAFETY: as above.
            let unix_methods = unsafe { *(*file).pMethods };
            Methods {
                ours: ffi::sqlite3_io_methods {
                    xFileControl: Some(base_file_control),
                    xLock: Some(base_lock),
                    ..unix_methods
                },
                // SAFETY: as above.
                unix: unsafe { (*file).pMethods } as usize,
                unix_file_control: unix_methods.xFileControl.unwrap(),
                unix_lock: unix_methods.xLock.unwrap(),
            }
        });
        // SAFETY: as above.
        let unix_methods = unsafe { (*file).pMethods } as usize;
        assert_eq!(
            unix_methods, methods.unix,
            "main databases with other methods"
        );
        // SAFETY: the unix methods run on the unix file object, which this still is.
        unsafe { (*file).pMethods = &methods.ours };
    }
    rc
}

unsafe extern "C" fn base_file_control(
    file: *mut ffi::sqlite3_file,
    op: c_int,
    arg: *mut c_void,
) -> c_int {
    if op == ffi::SQLITE_FCNTL_PRAGMA {
        let args = arg as *mut *mut c_char;
        // SAFETY: SQLite's pragma arguments: [result, name, value], the name a C string.
        let name = unsafe { CStr::from_ptr(*args.add(1)) };
        if name.to_bytes().eq_ignore_ascii_case(b"litestream_txid") {
            let txid = TXID.load(SeqCst);
            if txid == 0 {
                return ffi::SQLITE_NOTFOUND;
            }
            let text = std::ffi::CString::new(format!("{txid:016x}")).unwrap();
            // SAFETY: SQLite frees the result with sqlite3_free; mprintf allocates it so.
            unsafe { *args = ffi::sqlite3_mprintf(c"%s".as_ptr(), text.as_ptr()) };
            return ffi::SQLITE_OK;
        }
    }
    let forward = METHODS.get().expect("opened").unix_file_control;
    // SAFETY: file is an open unix file.
    unsafe { forward(file, op, arg) }
}

unsafe extern "C" fn base_lock(file: *mut ffi::sqlite3_file, level: c_int) -> c_int {
    if level == ffi::SQLITE_LOCK_SHARED {
        let hook = BEFORE_SHARED_LOCK.lock().unwrap().take();
        if let Some(hook) = hook {
            hook();
        }
    }
    let forward = METHODS.get().expect("opened").unix_lock;
    // SAFETY: file is an open unix file.
    unsafe { forward(file, level) }
}

/// Registers the stand-in base VFS once (SQLite keeps the struct for the process).
fn register_base() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        sqlite_bpe::register().expect("register");
        // SAFETY: a copy of the unix VFS's struct, leaked (SQLite holds it for the process).
        let mut vfs = unsafe { *unix_vfs() };
        vfs.zName = BASE.as_ptr();
        vfs.xOpen = Some(base_open);
        vfs.pNext = std::ptr::null_mut();
        let vfs = Box::leak(Box::new(vfs));
        // SAFETY: vfs lives for the process; not the default.
        assert_eq!(unsafe { ffi::sqlite3_vfs_register(vfs, 0) }, ffi::SQLITE_OK);
    });
}

/// `path` as an SQLite URI through bpe over the stand-in (a URI is text: other bytes escaped).
fn uri(path: &Path) -> String {
    let mut s = String::from("file:");
    for &b in path.as_os_str().as_bytes() {
        match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'/' | b'.' | b'-' | b'_' => {
                s.push(b as char)
            }
            _ => s.push_str(&format!("%{b:02X}")),
        }
    }
    s + "?vfs=bpe&bpe_base=txid"
}

fn open_over_base(path: &Path) -> rusqlite::Connection {
    rusqlite::Connection::open_with_flags(uri(path), flags()).unwrap()
}

/// A database of 200 rows of 300 bytes (about 20 pages) written by plain SQLite.
fn make(path: &Path) {
    let c = open_unix(path);
    c.execute_batch(
        "CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT);
         WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 200)
           INSERT INTO t SELECT i, printf('%.300c', 'A') FROM n;",
    )
    .unwrap();
}

fn value(c: &rusqlite::Connection, id: i64) -> String {
    c.query_row("SELECT substr(v, 1, 8) FROM t WHERE id = ?1", [id], |r| {
        r.get(0)
    })
    .unwrap()
}

/// What the engine counted: (page lookups, page reads from the file).
fn engine_reads() -> (u64, u64) {
    let c = sqlite_bpe::engine().counters();
    (c.page_lookups, c.page_reads)
}

#[test]
fn a_named_snapshot_is_read_through_the_cache_and_a_new_name_never_sees_the_old_pages() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    register_base();
    let dir = tempdir();
    let path = dir.path().canonicalize().unwrap().join("named.db");
    make(&path);
    let writer = open_unix(&path);
    TXID.store(1, SeqCst);
    let long_lived = open_over_base(&path);
    let scan = |c: &rusqlite::Connection| -> i64 {
        c.query_row("SELECT sum(length(v)) FROM t", [], |r| r.get(0))
            .unwrap()
    };
    let (lookups_0, _) = engine_reads();
    assert_eq!(scan(&long_lived), 200 * 300);
    let (lookups_1, reads_1) = engine_reads();
    let pages = lookups_1 - lookups_0;
    assert!(
        pages >= 15,
        "the first scan went around the cache ({pages} lookups)"
    );
    // A new connection (an empty page cache of SQLite's own) reads the same snapshot again:
    // every page from L1.
    assert_eq!(scan(&open_over_base(&path)), 200 * 300);
    let (lookups_2, reads_2) = engine_reads();
    assert!(
        lookups_2 - lookups_1 >= pages,
        "the second scan went around the cache ({} lookups)",
        lookups_2 - lookups_1
    );
    assert_eq!(
        reads_2, reads_1,
        "the snapshot's pages were read again from the base VFS"
    );

    // The base VFS moves to a new transaction with each commit (Litestream applies one, then
    // names it): every reader, old connection or new, sees each row as the last commit left it.
    for round in 2..=21i64 {
        let id = round * 7 % 200 + 1;
        let v = format!("{:08}", round);
        writer
            .execute(
                "UPDATE t SET v = ?1 || substr(v, 9) WHERE id = ?2",
                (&v, id),
            )
            .unwrap();
        TXID.store(round as u64, SeqCst);
        assert_eq!(value(&long_lived, id), v, "round {round}: a stale row");
        assert_eq!(value(&open_over_base(&path), id), v, "round {round}: new");
    }
}

#[test]
fn without_a_snapshot_name_or_after_a_write_reads_go_to_the_base_vfs() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    register_base();
    let dir = tempdir();
    let path = dir.path().canonicalize().unwrap().join("unnamed.db");
    make(&path);
    let writer = open_unix(&path);
    TXID.store(0, SeqCst);
    let reader = open_over_base(&path);
    assert_eq!(value(&reader, 5), "AAAAAAAA");
    let before = engine_reads();
    // The file changes and no name says so: a cached page would be stale.
    writer
        .execute(
            "UPDATE t SET v = 'unnamed!' || substr(v, 9) WHERE id = 5",
            [],
        )
        .unwrap();
    assert_eq!(value(&reader, 5), "unnamed!");
    assert_eq!(
        engine_reads(),
        before,
        "an unnamed snapshot went through the cache"
    );

    // A connection that writes through bpe reads around the cache from then on, though the
    // base VFS names a snapshot: what it reads may differ from the snapshot of that name. Here
    // the file changes again under the same name; a read through the cache would find the
    // pages its first read transaction cached for that name.
    TXID.store(1_000, SeqCst);
    let own_writer = open_over_base(&path);
    assert_eq!(value(&own_writer, 7), "AAAAAAAA");
    own_writer
        .execute(
            "UPDATE t SET v = 'written!' || substr(v, 9) WHERE id = 6",
            [],
        )
        .unwrap();
    writer
        .execute(
            "UPDATE t SET v = 'foreign!' || substr(v, 9) WHERE id = 7",
            [],
        )
        .unwrap();
    let before = engine_reads();
    assert_eq!(value(&own_writer, 7), "foreign!");
    assert_eq!(value(&own_writer, 6), "written!");
    assert_eq!(
        engine_reads().0,
        before.0,
        "a writing connection read through the cache"
    );
}

/// bpe asks the snapshot's name before the SHARED lock and again after it: a commit between the
/// two (here, inside the lock call) moves the name, and the read transaction reads around the
/// cache. Pinned to the name seen first, it would read that snapshot's cached pages: stale.
#[test]
fn a_commit_between_the_two_looks_at_the_name_is_not_read_from_the_old_snapshot() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    register_base();
    let dir = tempdir();
    let path = dir.path().canonicalize().unwrap().join("between.db");
    make(&path);
    TXID.store(40, SeqCst);
    let reader = open_over_base(&path);
    assert_eq!(value(&reader, 9), "AAAAAAAA"); // snapshot 40's pages, cached
    let writer_path = path.clone();
    *BEFORE_SHARED_LOCK.lock().unwrap() = Some(Box::new(move || {
        open_unix(&writer_path)
            .execute(
                "UPDATE t SET v = 'between!' || substr(v, 9) WHERE id = 9",
                [],
            )
            .unwrap();
        TXID.store(41, SeqCst);
    }));
    let before = engine_reads();
    assert_eq!(value(&reader, 9), "between!", "read from snapshot 40");
    assert!(
        BEFORE_SHARED_LOCK.lock().unwrap().is_none(),
        "the hook did not run"
    );
    assert_eq!(
        engine_reads().0,
        before.0,
        "a moved name was read through the cache"
    );
    assert_eq!(value(&reader, 9), "between!");
}

/// Snapshot names are per database (Litestream's TXIDs start at 1 for each): two files at the
/// same name are two snapshots, each with its own pages.
#[test]
fn two_databases_at_the_same_snapshot_name_keep_their_own_pages() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    register_base();
    let dir = tempdir();
    let root = dir.path().canonicalize().unwrap();
    let (a, b) = (root.join("a.db"), root.join("b.db"));
    make(&a);
    make(&b);
    open_unix(&b)
        .execute("UPDATE t SET v = 'only b!!' || substr(v, 9)", [])
        .unwrap();
    TXID.store(3, SeqCst);
    assert_eq!(value(&open_over_base(&a), 11), "AAAAAAAA");
    assert_eq!(value(&open_over_base(&b), 11), "only b!!");
    assert_eq!(value(&open_over_base(&a), 11), "AAAAAAAA");
}

#[test]
fn a_name_that_is_not_utf8_is_cached_under_its_own_name_over_a_base_vfs() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    register_base();
    let dir = tempdir();
    let path = not_utf8_name(dir.path());
    make(&path);
    TXID.store(77, SeqCst);
    let c = open_over_base(&path);
    assert_eq!(value(&c, 1), "AAAAAAAA");
    assert_cached_under(&path);
}

/// What a statement gave: its rows as text, or SQLite's error.
type Outcome = Result<Vec<String>, String>;

/// What each statement gave on `c`.
fn outcomes(c: &rusqlite::Connection, statements: &[&str]) -> Vec<Outcome> {
    statements
        .iter()
        .map(|sql| {
            let mut stmt = c.prepare(sql).map_err(|e| e.to_string())?;
            let columns = stmt.column_count();
            let rows = stmt
                .query_map([], |r| {
                    (0..columns)
                        .map(|i| {
                            r.get::<_, rusqlite::types::Value>(i)
                                .map(|v| format!("{v:?}"))
                        })
                        .collect::<Result<Vec<_>, _>>()
                        .map(|v| v.join("|"))
                })
                .map_err(|e| e.to_string())?;
            rows.collect::<Result<Vec<_>, _>>()
                .map_err(|e| e.to_string())
        })
        .collect()
}

/// Runs `statements` on a copy of `original` (a new file if None) opened with `uri_tail`
/// (`vfs=...`), and returns what each gave, with the file's header bytes 18 and 19 (2 and 2:
/// WAL format) and whether a `-wal` file is left beside it.
fn run_on_copy(
    dir: &Path,
    name: &str,
    original: Option<&Path>,
    uri_tail: &str,
    statements: &[&str],
) -> (Vec<Outcome>, Vec<u8>, bool) {
    let path = dir.join(name);
    if let Some(original) = original {
        std::fs::copy(original, &path).unwrap();
    }
    let said = {
        let c = rusqlite::Connection::open_with_flags(
            format!("file:{}?{uri_tail}", path.display()),
            flags(),
        )
        .unwrap();
        outcomes(&c, statements)
    };
    let header = std::fs::read(&path).unwrap_or_default();
    let versions = header.get(18..20).unwrap_or_default().to_vec();
    let wal = dir.join(format!("{name}-wal")).exists();
    (said, versions, wal)
}

/// A base VFS without shared memory (`unix-none`: no xShmMap) cannot hold a WAL database's
/// wal-index. Through bpe, SQLite must see what it sees over the base VFS alone: `PRAGMA
/// journal_mode=wal` stays `delete` and the file stays a rollback-journal one; a database
/// already in WAL format is "unable to open"; exclusive locking mode (a wal-index on the heap)
/// works on both. Every statement gives what plain SQLite over the same base gives, and no panic
/// is caught at the edge with SQLite (before, WAL was accepted and every later statement was a
/// caught panic in xShmMap and a disk I/O error).
#[test]
fn over_a_base_vfs_without_shared_memory_wal_is_refused_as_plain_sqlite_refuses_it() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    register_base();
    let dir = tempdir();
    let root = dir.path().canonicalize().unwrap();
    let plain = "vfs=unix-none";
    let bpe = "vfs=bpe&bpe_base=unix-none";

    let new_db: &[&str] = &[
        "PRAGMA journal_mode=wal",
        "CREATE TABLE t(x)",
        "INSERT INTO t VALUES (1), (2)",
        "SELECT count(*) FROM t",
        "PRAGMA journal_mode",
        "PRAGMA journal_mode=wal",
        "INSERT INTO t VALUES (3)",
        "SELECT sum(x) FROM t",
    ];
    let expected = run_on_copy(&root, "plain-new.db", None, plain, new_db);
    assert_eq!(expected.0[0], Ok(vec!["Text(\"delete\")".to_string()]));
    assert_eq!(expected.1, [1, 1], "plain SQLite made a WAL file");
    let got = run_on_copy(&root, "bpe-new.db", None, bpe, new_db);
    assert_eq!(got, expected, "a new database over unix-none");

    // A database in WAL format, made by plain SQLite over the unix VFS (checkpointed and
    // closed: no -wal file left, the header still says WAL).
    let wal_db = root.join("wal.db");
    {
        let c = open_unix(&wal_db);
        c.execute_batch("PRAGMA journal_mode=wal; CREATE TABLE t(x); INSERT INTO t VALUES (7);")
            .unwrap();
    }
    let existing: &[&str] = &["SELECT x FROM t", "PRAGMA journal_mode", "SELECT x FROM t"];
    let expected = run_on_copy(&root, "plain-wal.db", Some(&wal_db), plain, existing);
    assert_eq!(
        expected.0[0],
        Err("unable to open database file".to_string()),
        "plain SQLite over unix-none opened a WAL database"
    );
    let got = run_on_copy(&root, "bpe-wal.db", Some(&wal_db), bpe, existing);
    assert_eq!(got, expected, "a WAL database over unix-none");

    // Exclusive locking mode keeps the wal-index on the heap: WAL works over both.
    let exclusive: &[&str] = &[
        "PRAGMA locking_mode=exclusive",
        "PRAGMA journal_mode=wal",
        "CREATE TABLE t(x)",
        "INSERT INTO t VALUES (4), (5)",
        "SELECT sum(x) FROM t",
    ];
    let expected = run_on_copy(&root, "plain-excl.db", None, plain, exclusive);
    assert_eq!(expected.0[1], Ok(vec!["Text(\"wal\")".to_string()]));
    let got = run_on_copy(&root, "bpe-excl.db", None, bpe, exclusive);
    assert_eq!(got, expected, "exclusive locking mode over unix-none");

    assert_no_caught_panic("WAL over unix-none");
}

/// A Litestream replica's log as bpe reads it (`vfs/replica_log.rs`): for each transaction an
/// LTX file at level 0 whose tail (page index, its length, the trailer) names the pages it
/// wrote. Its page frames are left out: bpe reads only the tail.
fn write_ltx(log: &Path, txid: u64, pages: &[u64], checksum: u64) {
    fn uvarint(mut v: u64, out: &mut Vec<u8>) {
        while v >= 0x80 {
            out.push(v as u8 | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
    }
    let mut index = Vec::new();
    for &p in pages {
        uvarint(p + 1, &mut index); // LTX numbers pages from 1
        uvarint(100, &mut index);
        uvarint(4096, &mut index);
    }
    uvarint(0, &mut index);
    let mut bytes = vec![0u8; 100];
    bytes.extend_from_slice(&index);
    bytes.extend_from_slice(&(index.len() as u64).to_be_bytes());
    bytes.extend_from_slice(&checksum.to_be_bytes());
    bytes.extend_from_slice(&[0u8; 8]);
    let dir = log.join("ltx").join("0");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(format!("{txid:016x}-{txid:016x}.ltx")), bytes).unwrap();
}

/// Pages whose bytes differ between two copies of a file (0-based).
fn changed_pages(before: &[u8], after: &[u8], page: usize) -> Vec<u64> {
    let pages = before.len().max(after.len()).div_ceil(page);
    (0..pages)
        .filter(|&p| {
            let at = |b: &[u8]| {
                b.get(p * page..((p + 1) * page).min(b.len()))
                    .map(<[u8]>::to_vec)
            };
            at(before) != at(after)
        })
        .map(|p| p as u64)
        .collect()
}

#[test]
fn a_new_transaction_reads_again_only_the_pages_the_replica_log_says_it_changed() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    register_base();
    let dir = tempdir();
    let root = dir.path().canonicalize().unwrap();
    let path = root.join("logged.db");
    let log = root.join("replica");
    make(&path);
    let writer = open_unix(&path);
    let mut image = std::fs::read(&path).unwrap();
    let pages = image.len() / 4096;
    write_ltx(&log, 1, &(0..pages as u64).collect::<Vec<_>>(), 1);
    TXID.store(1, SeqCst);
    let open = || {
        let uri = format!("{}&bpe_replica=file://{}", uri(&path), log.display());
        rusqlite::Connection::open_with_flags(uri, flags()).unwrap()
    };
    let long_lived = open();
    let scan = |c: &rusqlite::Connection| -> i64 {
        c.query_row("SELECT sum(length(v)) FROM t", [], |r| r.get(0))
            .unwrap()
    };
    assert_eq!(scan(&long_lived), 200 * 300);
    for round in 2..=11i64 {
        let id = round * 13 % 200 + 1;
        let v = format!("{:08}", round);
        writer
            .execute(
                "UPDATE t SET v = ?1 || substr(v, 9) WHERE id = ?2",
                (&v, id),
            )
            .unwrap();
        let now = std::fs::read(&path).unwrap();
        let changed = changed_pages(&image, &now, 4096);
        image = now;
        write_ltx(&log, round as u64, &changed, round as u64);
        TXID.store(round as u64, SeqCst);
        let (_, reads_before) = engine_reads();
        // Every row as the last commit left it, through a long-lived and a new connection.
        assert_eq!(value(&long_lived, id), v, "round {round}: a stale row");
        assert_eq!(scan(&long_lived), 200 * 300);
        assert_eq!(value(&open(), id), v, "round {round}: a stale row (new)");
        let (_, reads_after) = engine_reads();
        assert!(
            reads_after - reads_before <= changed.len() as u64,
            "round {round}: {} pages read from the base VFS, {} changed",
            reads_after - reads_before,
            changed.len()
        );
    }
}
