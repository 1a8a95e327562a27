//! Regression tests written from what applications do: short-lived connections on several
//! threads, files restored or swapped under an open database, chunk sizes, read-only shared
//! memory, operator input through every way in. Each test checks what the application sees (rows,
//! errors, file sizes, the operator tables), never the engine's internals.
//!
//! Tests that need a fresh process-wide engine (configured by environment variables at load) or
//! that could hang run in a child process: this test binary re-executed (`child_entry`, told what
//! to do by `APP_PATTERNS_CHILD`), killed by a watchdog if it does not finish in time, so a
//! deadlock is reported as a failure instead of hanging CI. A second process that must be plain
//! SQLite, or load the extension into a foreign host, is the stock `sqlite3` shell.

mod common;
mod rows;

use common::*;
use rand::{rngs::StdRng, Rng, SeedableRng};
use rusqlite::{Connection, ErrorCode, OpenFlags};
use std::collections::BTreeMap;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// In-process tests that change process-wide settings (memory, the extension) take turns.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    let guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    sqlite_bpe::register().expect("register");
    guard
}

fn extension_state(c: &Connection) -> (Option<String>, i64, Option<String>) {
    c.query_row(
        "SELECT path, state, last_failure FROM bpe_extension_configuration",
        [],
        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
    )
    .unwrap()
}

fn max_memory_mb(c: &Connection) -> String {
    c.query_row("PRAGMA bpe_max_server_memory_mb", [], |r| r.get(0))
        .unwrap()
}

/// Turns the extension off if it is on (the state other tests expect).
fn extension_off(c: &Connection) {
    let _ = try_exec(
        c,
        "ALTER SERVER CONFIGURATION SET BUFFER POOL EXTENSION OFF",
    );
}

fn is_busy(e: &rusqlite::Error) -> bool {
    e.sqlite_error_code() == Some(ErrorCode::DatabaseBusy)
}

// ---------------------------------------------------------------------------------------------
// Child processes.

const CHILD: &str = "APP_PATTERNS_CHILD";
const CHILD_DIR: &str = "APP_PATTERNS_DIR";
const CHILD_SEED: &str = "APP_PATTERNS_SEED";

/// Not a test: the body of the child processes (does nothing unless APP_PATTERNS_CHILD is set).
#[test]
#[ignore = "run by the tests of app_patterns.rs as a child process"]
fn child_entry() {
    let Some(mode) = child_mode(CHILD) else {
        return;
    };
    let dir = PathBuf::from(std::env::var(CHILD_DIR).unwrap());
    println!();
    match mode.as_str() {
        "churn" => child_churn(&dir),
        "wal-churn" => child_wal_churn(&dir),
        "slots-env" => child_slots(&dir, false),
        "slots-sql" => child_slots(&dir, true),
        "random" => child_random(&dir),
        other => panic!("unknown child mode {other}"),
    }
    println!("CHILD DONE");
}

struct ChildRun {
    timed_out: bool,
    success: bool,
    status: String,
    stdout: String,
    stderr: String,
}

impl ChildRun {
    fn lines_with(&self, prefix: &str) -> Vec<String> {
        self.stdout
            .lines()
            .filter_map(|l| {
                l.find(prefix)
                    .map(|at| l[at + prefix.len()..].trim().to_string())
            })
            .collect()
    }
    fn describe(&self) -> String {
        format!(
            "status {}{}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.status,
            if self.timed_out {
                " (killed by the watchdog)"
            } else {
                ""
            },
            self.stdout,
            self.stderr
        )
    }
}

/// Runs this binary's `child_entry` in `mode` with `env`; SIGKILLs it after `watchdog`.
fn run_child(mode: &str, dir: &Path, env: &[(&str, String)], watchdog: Duration) -> ChildRun {
    let mut cmd = child_command(CHILD, mode);
    cmd.env(CHILD_DIR, dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let run = wait_with_limit(cmd.spawn().unwrap(), watchdog);
    ChildRun {
        timed_out: run.timed_out,
        success: run.success(),
        status: run.status.to_string(),
        stdout: run.stdout,
        stderr: run.stderr,
    }
}

/// The stock sqlite3 shell with these BPE_ variables (and no others); (stdout, stderr, success).
fn shell_with_env(dir: &Path, env: &[(&str, String)], script: &str) -> (String, String, bool) {
    use std::io::Write;
    let shell =
        sqlite3_shell().expect("the sqlite3 shell is not installed (apt-get install sqlite3)");
    let mut cmd = Command::new(shell);
    cmd.arg("-batch")
        .current_dir(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for v in bpe_vars() {
        cmd.env_remove(v);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(script.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        out.status.success(),
    )
}

fn library_for_load() -> String {
    extension_library().with_extension("").display().to_string()
}

fn have_shell() -> bool {
    if sqlite3_shell().is_none() {
        println!("SKIPPED: no sqlite3 shell (CI installs it)");
        return false;
    }
    true
}

// ---------------------------------------------------------------------------------------------
// Four threads opening, reading and closing connections on two databases.

const CHURN_THREADS: usize = 4;
const CHURN_ROWS: i64 = 430;

fn churn_db(path: &Path) {
    let c = open_unix(path);
    c.execute_batch(
        "PRAGMA journal_mode = DELETE;
         CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT NOT NULL);",
    )
    .unwrap();
    let tx = c.unchecked_transaction().unwrap();
    for id in 1..=CHURN_ROWS {
        tx.execute(
            "INSERT INTO t VALUES (?1, ?2)",
            rusqlite::params![id, format!("{id:08}-{}", "v".repeat(90))],
        )
        .unwrap();
    }
    tx.commit().unwrap();
}

/// Each thread opens a connection, reads, closes, until `seconds` have passed; two threads on
/// each database (pairs race each other's last close far more often than four threads
/// alternating between the databases: a hang came sooner and in every run); every
/// `full_every`-th connection reads all rows (as many as the application that hung read),
/// the others only count them (more opens and closes per second: more chances at a race).
/// Prints `OPENS n`, `OPEN ERRORS n`, `READ ERRORS n` and a line per distinct error; if no
/// connection finishes for 10 s, prints `HUNG` and exits with status 3.
fn child_churn(dir: &Path) {
    let seconds: f64 = std::env::var("CHURN_SECONDS").map_or(4.0, |v| v.parse().unwrap());
    let full_every: usize = std::env::var("CHURN_FULL_EVERY").map_or(1, |v| v.parse().unwrap());
    let dbs = [dir.join("a.db"), dir.join("b.db")];
    for db in &dbs {
        churn_db(db);
    }
    sqlite_bpe::register().unwrap();
    let errors: Arc<Mutex<BTreeMap<String, usize>>> = Default::default();
    let opens = Arc::new(AtomicU64::new(0));
    let open_errors = Arc::new(AtomicU64::new(0));
    let read_errors = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    // The watchdog inside: progress must not stop.
    exit_if_stalled(opens.clone(), STALL, "connections opened or closed");
    let threads: Vec<_> = (0..CHURN_THREADS)
        .map(|t| {
            let dbs = dbs.clone();
            let errors = errors.clone();
            let (opens, open_errors, read_errors) =
                (opens.clone(), open_errors.clone(), read_errors.clone());
            std::thread::spawn(move || {
                let mut i = 0;
                while Instant::now() < deadline {
                    i += 1;
                    let db = &dbs[t % 2];
                    let full = i % full_every == 0;
                    let opened = Connection::open_with_flags(
                        format!("file:{}?vfs=bpe", db.display()),
                        flags(),
                    );
                    opens.fetch_add(1, Ordering::Relaxed);
                    let c = match opened {
                        Ok(c) => c,
                        Err(e) => {
                            open_errors.fetch_add(1, Ordering::Relaxed);
                            let why = sqlite_bpe::last_open_error().unwrap_or_default();
                            *errors
                                .lock()
                                .unwrap()
                                .entry(format!("open: {e} ({why})"))
                                .or_default() += 1;
                            continue;
                        }
                    };
                    let read = (|| -> rusqlite::Result<i64> {
                        if !full {
                            return c.query_row("SELECT count(*) FROM t", [], |r| r.get(0));
                        }
                        let mut stmt = c.prepare("SELECT id, v FROM t ORDER BY id")?;
                        let mut rows = stmt.query([])?;
                        let mut n = 0;
                        while let Some(r) = rows.next()? {
                            let id: i64 = r.get(0)?;
                            let v: String = r.get(1)?;
                            assert!(v.starts_with(&format!("{id:08}-")), "row {id}: {v}");
                            n += 1;
                        }
                        Ok(n)
                    })();
                    match read {
                        Ok(n) => assert_eq!(n, CHURN_ROWS, "rows missing"),
                        Err(e) => {
                            read_errors.fetch_add(1, Ordering::Relaxed);
                            *errors
                                .lock()
                                .unwrap()
                                .entry(format!("read: {e}"))
                                .or_default() += 1;
                        }
                    }
                    drop(c);
                    opens.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    println!("OPENS {}", opens.load(Ordering::Relaxed) / 2);
    println!("OPEN ERRORS {}", open_errors.load(Ordering::Relaxed));
    println!("READ ERRORS {}", read_errors.load(Ordering::Relaxed));
    for (e, n) in errors.lock().unwrap().iter() {
        println!("ERROR {n}x {e}");
    }
}

/// How long the child churns; a hang is caught by the child's own 10 s stall check, or the
/// watchdog.
const CHURN_SECONDS: &str = "5";
const CHURN_WATCHDOG: Duration = Duration::from_secs(60);
/// How long a child's progress counter may stand still before its watchdog calls it hung: a
/// hang never moves again, and a loaded machine (a shared CI runner at load 20) can stall a
/// thread for seconds, so this is generous; below the parents' watchdogs (60 s and more).
const STALL: Duration = Duration::from_secs(30);

fn churn(dir: &Path, full_every: usize) -> ChildRun {
    for f in ["a.db", "b.db", "a.db-journal", "b.db-journal"] {
        let _ = std::fs::remove_file(dir.join(f));
    }
    run_child(
        "churn",
        dir,
        &[
            ("CHURN_SECONDS", CHURN_SECONDS.into()),
            ("CHURN_FULL_EVERY", full_every.to_string()),
        ],
        CHURN_WATCHDOG,
    )
}

/// A lock-order inversion between the map of per-file state and a file's opener count
/// hung the process forever, sometimes, in exactly this pattern (four threads opening a
/// connection, reading and closing it, on two databases). Most connections only count the
/// rows, so that more opens and closes race in the time.
#[test]
fn four_threads_opening_reading_and_closing_connections_never_hang() {
    let dir = tempdir();
    let r = churn(dir.path(), 8);
    assert!(
        !r.timed_out && !r.stdout.contains("HUNG"),
        "the process hung (deadlock) opening and closing connections:\n{}",
        r.describe()
    );
    assert!(r.success, "the child failed:\n{}", r.describe());
    println!("{}", r.stdout);
}

/// A new open raced the previous last connection's close of the same file and was
/// refused with SQLITE_BUSY ("database is locked"): one process refused by itself. (With the
/// deadlock above fixed, every run of this mix still saw refusals, with or without every
/// connection reading all rows.)
#[test]
fn a_process_is_never_refused_by_itself_while_its_connections_open_and_close() {
    let dir = tempdir();
    let r = churn(dir.path(), 8);
    assert!(
        !r.timed_out && !r.stdout.contains("HUNG"),
        "the process hung (the lock-order deadlock) before the errors could be counted:\n{}",
        r.describe()
    );
    assert!(r.success, "the child failed:\n{}", r.describe());
    let opens: u64 = r.lines_with("OPENS")[0].parse().unwrap();
    let open_errors: u64 = r.lines_with("OPEN ERRORS")[0].parse().unwrap();
    let read_errors: u64 = r.lines_with("READ ERRORS")[0].parse().unwrap();
    println!("{opens} connections");
    assert!(
        open_errors + read_errors == 0,
        "{open_errors} opens and {read_errors} reads of {opens} connections failed:\n{}",
        r.lines_with("ERROR ").join("\n")
    );
}

// ---------------------------------------------------------------------------------------------
// Threads opening a connection per lookup on one WAL database, nobody writing.

const WAL_CHURN_THREADS: usize = 4;
const WAL_CHURN_CONNECTIONS: usize = 250;
const WAL_CHURN_ROWS: i64 = 2_000;

/// A row's value at `version`.
fn churn_value(id: i64, version: u64) -> String {
    format!("{id:08}-{version:010}-{}", "v".repeat(80))
}

/// Each thread opens a connection, looks up one row, checks it and closes the connection,
/// `WAL_CHURN_CONNECTIONS` times; the last close of the file in the process checkpoints and
/// deletes the WAL, and the next open creates it and its wal-index anew, racing the other
/// threads' opens. With `WAL_CHURN_WRITER` set, thread 0 instead updates a row per
/// connection, every other one through the unix VFS (a writer bpe does not see write), and
/// readers check that no row is older than its last commit before their lookup began (counted
/// in `STALE n`). Prints `PAGES n` (the database's), `PAGE READS n` (from the database file)
/// and `INVALIDATIONS n` (whole-file forgets).
fn child_wal_churn(dir: &Path) {
    let writer = std::env::var_os("WAL_CHURN_WRITER").is_some();
    let committed: Arc<Vec<AtomicU64>> =
        Arc::new((0..=WAL_CHURN_ROWS).map(|_| AtomicU64::new(0)).collect());
    let stale = Arc::new(AtomicU64::new(0));
    let db = dir.join("w.db");
    let c = open_unix(&db);
    c.execute_batch(
        "PRAGMA journal_mode = WAL;
         CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT NOT NULL);",
    )
    .unwrap();
    let tx = c.unchecked_transaction().unwrap();
    for id in 1..=WAL_CHURN_ROWS {
        tx.execute(
            "INSERT INTO t VALUES (?1, ?2)",
            rusqlite::params![id, churn_value(id, 0)],
        )
        .unwrap();
    }
    tx.commit().unwrap();
    let pages: i64 = c.query_row("PRAGMA page_count", [], |r| r.get(0)).unwrap();
    drop(c);
    // Past the racy window of the load's writes (a stamp taken within it cannot vouch for the
    // file, and every first token and rebuilt wal-index would forget it), every page in the
    // cache; then counted from there, through a connection to another file so that this one's
    // opens and closes stay the threads' own.
    std::thread::sleep(bpe_core::RACY_WINDOW * 2);
    let warm = open_bpe(&db);
    let _: i64 = warm
        .query_row("SELECT sum(length(v)) FROM t", [], |r| r.get(0))
        .unwrap();
    drop(warm);
    let counters = open_bpe(&dir.join("counters.db"));
    let reads_before = counter(&counters, "Page reads/sec");
    let forgets_before = counter(&counters, "File cache invalidations");
    let done = Arc::new(AtomicU64::new(0));
    exit_if_stalled(done.clone(), STALL, "lookups");
    let threads: Vec<_> = (0..WAL_CHURN_THREADS)
        .map(|t| {
            let (db, done) = (db.clone(), done.clone());
            let (committed, stale) = (committed.clone(), stale.clone());
            std::thread::spawn(move || {
                let mut rng = StdRng::seed_from_u64(t as u64);
                for i in 0..WAL_CHURN_CONNECTIONS {
                    let write = writer && t == 0;
                    let vfs = if write && i % 2 == 1 { "unix" } else { "bpe" };
                    let c = Connection::open_with_flags(
                        format!("file:{}?vfs={vfs}", db.display()),
                        flags(),
                    )
                    .unwrap();
                    c.busy_timeout(Duration::from_secs(5)).unwrap();
                    let id = rng.gen_range(1..=WAL_CHURN_ROWS);
                    if write {
                        let version = i as u64 + 1;
                        c.execute(
                            "UPDATE t SET v = ?2 WHERE id = ?1",
                            rusqlite::params![id, churn_value(id, version)],
                        )
                        .unwrap();
                        committed[id as usize].fetch_max(version, Ordering::SeqCst);
                    } else {
                        let expected = committed[id as usize].load(Ordering::SeqCst);
                        let v: String = c
                            .query_row("SELECT v FROM t WHERE id = ?1", [id], |r| r.get(0))
                            .unwrap();
                        assert!(v.starts_with(&format!("{id:08}-")), "row {id}: {v}");
                        let version: u64 = v[9..19].parse().unwrap();
                        if version < expected {
                            stale.fetch_add(1, Ordering::Relaxed);
                            println!("STALE ROW {id}: version {version}, committed {expected}");
                        }
                    }
                    drop(c);
                    done.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let reads = counter(&counters, "Page reads/sec") - reads_before;
    let forgets = counter(&counters, "File cache invalidations") - forgets_before;
    println!("PAGES {pages}");
    println!("PAGE READS {reads}");
    println!("INVALIDATIONS {forgets}");
    println!("STALE {}", stale.load(Ordering::Relaxed));
}

/// A lookup per connection on several threads, with nobody writing: every page comes from the
/// database file once, whatever the opens and closes race (the last close deletes the WAL, the
/// next open creates it and the wal-index anew). Found measuring a connection per lookup: each
/// whole-file forget made the next lookups read their pages again, and the cache ran well
/// below stock's speed in this shape.
#[test]
fn threads_opening_a_connection_per_lookup_on_a_wal_database_read_each_page_once() {
    let dir = tempdir();
    let r = run_child("wal-churn", dir.path(), &[], CHURN_WATCHDOG);
    assert!(r.success, "the child failed:\n{}", r.describe());
    let number = |name: &str| -> i64 { r.lines_with(name)[0].parse().unwrap() };
    let (pages, reads, forgets) = (
        number("PAGES"),
        number("PAGE READS"),
        number("INVALIDATIONS"),
    );
    println!("{reads} page reads, {forgets} whole-file forgets; {pages} pages");
    assert_eq!(
        forgets,
        0,
        "the file's cache was emptied {forgets} times with nobody writing:\n{}",
        r.describe()
    );
    assert!(
        reads <= pages,
        "{reads} page reads from a database of {pages} pages with nobody writing"
    );
}

/// The same with a writer beside the readers, a connection per update, every other one on the
/// unix VFS: the wal-index is rebuilt over a WAL with frames (recovery starts iChange and
/// nBackfill at 0 again), and what was checkpointed meanwhile must still be forgotten.
#[test]
fn threads_opening_a_connection_per_lookup_beside_a_writer_never_read_a_stale_row() {
    let dir = tempdir();
    let r = run_child(
        "wal-churn",
        dir.path(),
        &[("WAL_CHURN_WRITER", "1".into())],
        CHURN_WATCHDOG,
    );
    assert!(r.success, "the child failed:\n{}", r.describe());
    // The count is the last line that starts so (after any `STALE ROW` line).
    let stale: u64 = r
        .lines_with("STALE ")
        .last()
        .unwrap()
        .parse()
        .unwrap_or(u64::MAX);
    println!("{}", r.lines_with("INVALIDATIONS").join(""));
    assert_eq!(stale, 0, "stale rows read:\n{}", r.describe());
}

// ---------------------------------------------------------------------------------------------
// Pages larger than the extension's slot were never cached in it.

fn checked_db(path: &Path, page_size: usize, rows: i64) {
    let c = open_unix(path);
    c.execute_batch(&format!(
        "PRAGMA page_size = {page_size}; PRAGMA journal_mode = DELETE;
         CREATE TABLE t(id INTEGER PRIMARY KEY, payload BLOB NOT NULL, crc INTEGER NOT NULL);"
    ))
    .unwrap();
    let tx = c.unchecked_transaction().unwrap();
    for id in 1..=rows {
        let p = rows::payload(id as u64, 300 + (id as usize * 37) % 500);
        tx.execute(
            "INSERT INTO t VALUES (?1, ?2, ?3)",
            rusqlite::params![id, p, rows::crc32(&p)],
        )
        .unwrap();
    }
    tx.commit().unwrap();
    let ps: i64 = c.query_row("PRAGMA page_size", [], |r| r.get(0)).unwrap();
    assert_eq!(ps, page_size as i64);
}

fn scan_checked(c: &Connection, rows: i64) {
    let mut stmt = c
        .prepare_cached("SELECT id, payload, crc FROM t ORDER BY id")
        .unwrap();
    let mut q = stmt.query([]).unwrap();
    let mut expect = 1;
    while let Some(r) = q.next().unwrap() {
        let id: i64 = r.get(0).unwrap();
        let p = r.get_ref(1).unwrap().as_blob().unwrap();
        let crc: i64 = r.get(2).unwrap();
        assert_eq!(id, expect);
        assert_eq!(rows::crc32(p), crc, "row {id}: wrong payload");
        expect += 1;
    }
    assert_eq!(expect - 1, rows);
}

/// Waits until the extension's writer is idle: its counters stop moving.
fn drain(c: &Connection) {
    assert!(sqlite_bpe::engine().wait_for_extension_writes(Duration::from_secs(20)));
    let snap = |c: &Connection| {
        (
            counter(c, "Extension page writes/sec"),
            counter(c, "Extension admissions dropped"),
            counter(c, "Extension outstanding IO counter"),
        )
    };
    let mut last = snap(c);
    let mut stable = 0;
    for _ in 0..400 {
        std::thread::sleep(Duration::from_millis(25));
        let now = snap(c);
        if now == last && now.2 == 0 {
            stable += 1;
            if stable == 4 {
                return;
            }
        } else {
            stable = 0;
        }
        last = now;
    }
}

const SLOT_ROWS: i64 = 5000; // about 3 MB a database, three times max server memory

fn child_slots(dir: &Path, by_sql: bool) {
    let small = dir.join("p4k.db");
    let large = dir.join("p16k.db");
    checked_db(&small, 4096, SLOT_ROWS);
    checked_db(&large, 16384, SLOT_ROWS);
    let a = open_bpe(&small);
    a.execute_batch("PRAGMA cache_size = 1").unwrap();
    if by_sql {
        exec(&a, "EXEC sp_configure 'max server memory (MB)', 1");
        let out = exec(&a, &extension_on(dir.join("ext.bpe").display(), "32 MB"));
        println!("ON: {out}");
    }
    let (path, state, failure) = extension_state(&a);
    assert_eq!(
        state, 5,
        "the extension is not enabled: {path:?} {failure:?}"
    );
    // Opened (and first read) only now that the extension is on.
    let b = open_bpe(&large);
    b.execute_batch("PRAGMA cache_size = 1").unwrap();
    for _ in 0..2 {
        scan_checked(&a, SLOT_ROWS);
        drain(&a);
        scan_checked(&b, SLOT_ROWS);
        drain(&a);
    }
    let writes = counter(&a, "Extension page writes/sec");
    let dropped = counter(&a, "Extension admissions dropped");
    let dbs_in_extension: i64 = a
        .query_row(
            "SELECT count(DISTINCT database_id) FROM bpe_buffer_descriptors
             WHERE is_in_bpool_extension = 1",
            [],
            |r| r.get(0),
        )
        .unwrap();
    let per_db: Vec<(i64, i64)> = a
        .prepare(
            "SELECT database_id, count(*) FROM bpe_buffer_descriptors
             WHERE is_in_bpool_extension = 1 GROUP BY database_id",
        )
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let (_, _, failure) = extension_state(&a);
    println!(
        "SLOTS writes {writes} dropped {dropped} databases {dbs_in_extension} per-db {per_db:?} last_failure {failure:?}"
    );
    let mut problems = Vec::new();
    if writes == 0 {
        problems.push("no page was written to the extension".to_string());
    }
    if dbs_in_extension != 2 {
        problems.push(format!(
            "pages of {dbs_in_extension} of the 2 databases (4 KiB and 16 KiB pages) are in the extension: {per_db:?}"
        ));
    }
    if dropped != 0 {
        problems.push(format!(
            "{dropped} admissions were dropped silently (last_failure {failure:?})"
        ));
    }
    assert!(problems.is_empty(), "{}", problems.join("; "));
    scan_checked(&a, SLOT_ROWS);
    scan_checked(&b, SLOT_ROWS);
}

/// Pages larger than the slot, the extension enabled at load (BPE_EXTENSION_FILE) before any database is open.
#[test]
fn pages_of_every_size_reach_an_extension_enabled_at_load() {
    let dir = tempdir();
    let r = run_child(
        "slots-env",
        dir.path(),
        &[
            ("BPE_MAX_SERVER_MEMORY_MB", "1".into()),
            (
                "BPE_EXTENSION_FILE",
                dir.path().join("ext.bpe").display().to_string(),
            ),
            ("BPE_EXTENSION_SIZE", "32MB".into()),
        ],
        Duration::from_secs(120),
    );
    assert!(r.success, "{}", r.describe());
}

/// Pages larger than the slot, the extension enabled by SQL before the first read of the 16 KiB database.
#[test]
fn pages_of_every_size_reach_an_extension_enabled_by_sql_before_they_are_read() {
    let dir = tempdir();
    let r = run_child("slots-sql", dir.path(), &[], Duration::from_secs(120));
    assert!(r.success, "{}", r.describe());
}

// ---------------------------------------------------------------------------------------------
// A readonly_shm connection and a foreign commit + truncating checkpoint (walro2 3.2).

fn kv_value(c: &Connection) -> rusqlite::Result<String> {
    c.query_row("SELECT v FROM kv WHERE k = 7", [], |r| r.get(0))
}

/// walro2.test 3.1-3.2: both -wal and -shm are zero bytes, a readonly_shm connection reads, then
/// another process commits and truncates the WAL; the readonly_shm connection must see it.
fn readonly_shm_sees_foreign_commit(bpe: bool) -> Result<(), String> {
    let dir = tempdir();
    let db = dir.path().join("ro.db");
    {
        let c = open_unix(&db);
        c.execute_batch(
            "PRAGMA journal_mode = WAL;
             CREATE TABLE kv(k INTEGER PRIMARY KEY, v TEXT, pad TEXT);",
        )
        .unwrap();
        let tx = c.unchecked_transaction().unwrap();
        for k in 1..=2000 {
            tx.execute(
                "INSERT INTO kv VALUES (?1, 'old', ?2)",
                rusqlite::params![k, "p".repeat(100)],
            )
            .unwrap();
        }
        tx.commit().unwrap();
    }
    // The last connection closed: the WAL was checkpointed and both files deleted.
    let wal = dir.path().join("ro.db-wal");
    let shm = dir.path().join("ro.db-shm");
    assert!(!wal.exists() && !shm.exists());
    std::fs::File::create(&wal).unwrap();
    std::fs::File::create(&shm).unwrap();
    let uri = format!(
        "file:{}?readonly_shm=1{}",
        db.display(),
        if bpe { "&vfs=bpe" } else { "" }
    );
    if bpe {
        sqlite_bpe::register().unwrap();
    }
    let ro = Connection::open_with_flags(&uri, flags()).map_err(|e| e.to_string())?;
    ro.execute_batch("PRAGMA cache_size = 1")
        .map_err(|e| e.to_string())?;
    for _ in 0..2 {
        let n: i64 = ro
            .query_row("SELECT count(*) FROM kv WHERE v = 'old'", [], |r| r.get(0))
            .map_err(|e| e.to_string())?;
        assert_eq!(n, 2000);
        assert_eq!(kv_value(&ro).map_err(|e| e.to_string())?, "old");
    }
    let (out, err, ok) = run_shell(
        dir.path(),
        ".open ro.db\nUPDATE kv SET v = 'new' WHERE k = 7;\nPRAGMA wal_checkpoint(TRUNCATE);\nSELECT v FROM kv WHERE k = 7;\n",
    );
    assert!(
        ok && err.is_empty() && out.contains("new"),
        "the plain writer failed: {out} {err}"
    );
    let seen = kv_value(&ro).map_err(|e| e.to_string())?;
    let new_rows: i64 = ro
        .query_row("SELECT count(*) FROM kv WHERE v = 'new'", [], |r| r.get(0))
        .map_err(|e| e.to_string())?;
    if seen != "new" || new_rows != 1 {
        return Err(format!(
            "after another process's commit and wal_checkpoint(TRUNCATE), row 7 reads {seen:?} \
             and {new_rows} rows read 'new' (expected 'new' and 1)"
        ));
    }
    Ok(())
}

#[test]
fn a_readonly_shm_connection_sees_another_process_commit_and_truncate_the_wal() {
    if !have_shell() {
        return;
    }
    // The scenario holds with plain SQLite (walro2.test 3.2.1) ...
    readonly_shm_sees_foreign_commit(false)
        .unwrap_or_else(|e| panic!("the unix VFS itself fails the scenario: {e}"));
    // ... and must with bpe.
    if let Err(e) = readonly_shm_sees_foreign_commit(true) {
        panic!("bpe, readonly_shm=1: {e}");
    }
}

// ---------------------------------------------------------------------------------------------
// A database file changed outside SQLite's locking protocol while this process has it
// open is read fresh at the next read transaction, by a new connection and by the one that had it
// open, as with plain SQLite (each scenario is run against the unix VFS first, as the reference).

const OOB_ROWS: i64 = 600;

fn oob_value(tag: char, id: i64) -> String {
    format!("{tag}-{id:05}-{}", tag.to_string().repeat(200))
}

/// A rollback-journal database whose rows all carry `tag`; built by the same statements for
/// every tag, so that the files differ only in the rows' bytes (change counters equal).
fn oob_db(path: &Path, tag: char) {
    oob_db_in(path, tag, "DELETE");
}

/// [`oob_db`] in the journal mode `journal`.
fn oob_db_in(path: &Path, tag: char, journal: &str) {
    let c = open_unix(path);
    c.execute_batch(&format!(
        "PRAGMA journal_mode = {journal};
         CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT NOT NULL);"
    ))
    .unwrap();
    let tx = c.unchecked_transaction().unwrap();
    for id in 1..=OOB_ROWS {
        tx.execute(
            "INSERT INTO t VALUES (?1, ?2)",
            rusqlite::params![id, oob_value(tag, id)],
        )
        .unwrap();
    }
    tx.commit().unwrap();
}

fn header_counter(path: &Path) -> [u8; 4] {
    let f = std::fs::File::open(path).unwrap();
    let mut b = [0u8; 4];
    f.read_exact_at(&mut b, 24).unwrap();
    b
}

/// (rows whose value has tag `tag`, total rows), read by `c`.
fn tagged_rows(c: &Connection, tag: char) -> (i64, i64) {
    // SQLite's own page cache is emptied first: a file changed outside SQLite with the same
    // header bytes 24..40 leaves that cache valid in SQLite's eyes (stock SQLite serves it too),
    // and how much of it survives `cache_size = 1` varies; the reads must reach the VFS.
    c.execute_batch("PRAGMA shrink_memory").unwrap();
    let mut stmt = c.prepare("SELECT id, v FROM t ORDER BY id").unwrap();
    let mut rows = stmt.query([]).unwrap();
    let (mut tagged, mut total) = (0, 0);
    while let Some(r) = rows.next().unwrap() {
        let id: i64 = r.get(0).unwrap();
        let v: String = r.get(1).unwrap();
        if v == oob_value(tag, id) {
            tagged += 1;
        }
        total += 1;
    }
    (tagged, total)
}

fn open_reader(db: &Path, bpe: bool) -> Connection {
    let c = if bpe { open_bpe(db) } else { open_unix(db) };
    // SQLite's own cache is kept tiny, so that reads reach the VFS.
    c.execute_batch("PRAGMA cache_size = 1").unwrap();
    c
}

/// What a change made outside SQLite must look like afterwards.
struct Expect {
    /// (rows with tag 'B', rows) for a connection opened after the change.
    new_connection: (i64, i64),
    /// The same for the connection that had the file open across the change, at its next read
    /// transaction.
    holder: (i64, i64),
}

/// `app.db` holds 'A' rows; a connection ("holder") opens it and reads it all twice (the
/// pool caches it); `change` alters the file outside SQLite; then a new connection and the
/// holder read it again. Through bpe when `bpe`, else through the unix VFS (the reference).
/// Returns what differs from `expect`.
fn out_of_band(
    bpe: bool,
    journal: &str,
    change: impl Fn(&Path, &Path),
    expect: &Expect,
) -> Vec<String> {
    let dir = tempdir();
    let db = dir.path().join("app.db");
    oob_db_in(&db, 'A', journal);
    let holder = open_reader(&db, bpe);
    for _ in 0..2 {
        assert_eq!(tagged_rows(&holder, 'A'), (OOB_ROWS, OOB_ROWS));
    }
    change(dir.path(), &db);
    let vfs = if bpe { "bpe" } else { "unix" };
    let mut problems = Vec::new();
    let fresh = open_reader(&db, bpe);
    let seen = tagged_rows(&fresh, 'B');
    if seen != expect.new_connection {
        problems.push(format!(
            "{vfs}: a connection opened after the change read {} of {} rows as changed (expected {})",
            seen.0, seen.1, expect.new_connection.0
        ));
    }
    drop(fresh);
    let seen = tagged_rows(&holder, 'B');
    if seen != expect.holder {
        problems.push(format!(
            "{vfs}: the connection open across the change read {} of {} rows as changed at its next read transaction (expected {})",
            seen.0, seen.1, expect.holder.0
        ));
    }
    problems
}

/// Runs the scenario with the unix VFS (which must give `expect`: the scenario is sound) and
/// then with bpe.
fn check_out_of_band(change: impl Fn(&Path, &Path), expect: Expect) {
    check_out_of_band_in("DELETE", change, expect);
}

/// [`check_out_of_band`] with the database in the journal mode `journal`.
fn check_out_of_band_in(journal: &str, change: impl Fn(&Path, &Path), expect: Expect) {
    let reference = out_of_band(false, journal, &change, &expect);
    assert!(
        reference.is_empty(),
        "the scenario does not hold with plain SQLite: {reference:?}"
    );
    let problems = out_of_band(true, journal, &change, &expect);
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// `cp backup.db app.db` over the open file: same inode, new bytes, the same change counter
/// (the backup was made by the same statements with other values).
#[test]
fn a_database_restored_with_cp_over_the_open_file_is_read_fresh() {
    check_out_of_band(
        |dir, db| {
            let backup = dir.join("backup.db");
            oob_db(&backup, 'B');
            assert_eq!(header_counter(db), header_counter(&backup));
            let ino = std::fs::metadata(db).unwrap().ino();
            std::fs::copy(&backup, db).unwrap(); // O_TRUNC and write, like cp
            assert_eq!(
                std::fs::metadata(db).unwrap().ino(),
                ino,
                "cp keeps the inode"
            );
        },
        Expect {
            new_connection: (OOB_ROWS, OOB_ROWS),
            holder: (OOB_ROWS, OOB_ROWS),
        },
    );
}

/// The same in WAL mode with nothing waiting for a checkpoint, where the wal-index cannot show
/// the change: the new connection's first lock (before its wal-index is mapped) compares the
/// file's stamp, and the connection open across the copy then reads the new rows too. (The
/// open connection alone: the next test.)
#[test]
fn a_wal_database_restored_with_cp_over_the_open_file_is_read_fresh() {
    check_out_of_band_in(
        "WAL",
        |dir, db| {
            let backup = dir.join("backup.db");
            // (WAL mode ignores the header's change counter: the wal-index is its signal.)
            oob_db_in(&backup, 'B', "WAL");
            std::fs::copy(&backup, db).unwrap(); // O_TRUNC and write, like cp
        },
        Expect {
            new_connection: (OOB_ROWS, OOB_ROWS),
            holder: (OOB_ROWS, OOB_ROWS),
        },
    );
}

/// WAL mode with nothing to checkpoint, the connection open across the copy alone (no other
/// connection opens the file, whose first lock would look at the stamp): its read transactions
/// look at the stamp again once per interval (change_detect.rs), so the first one begun an
/// interval after the copy reads the new rows. Plain SQLite, with its page cache emptied,
/// reads them too.
#[test]
fn a_wal_connection_open_across_a_cp_restore_reads_it_fresh() {
    for bpe in [false, true] {
        let dir = tempdir();
        let db = dir.path().join("app.db");
        oob_db_in(&db, 'A', "WAL");
        let holder = open_reader(&db, bpe);
        for _ in 0..2 {
            assert_eq!(tagged_rows(&holder, 'A'), (OOB_ROWS, OOB_ROWS));
        }
        let backup = dir.path().join("backup.db");
        oob_db_in(&backup, 'B', "WAL");
        std::fs::copy(&backup, &db).unwrap(); // O_TRUNC and write, like cp
        std::thread::sleep(std::time::Duration::from_millis(5));
        assert_eq!(
            tagged_rows(&holder, 'B'),
            (OOB_ROWS, OOB_ROWS),
            "bpe: {bpe}: the connection open across the copy read old rows"
        );
    }
}

/// A page patched in place (`dd conv=notrunc`): one row's bytes replaced, header untouched.
#[test]
fn a_page_patched_in_place_is_read_fresh() {
    check_out_of_band(
        |_, db| {
            let old = oob_value('A', 7);
            let new = oob_value('B', 7);
            // Every copy of the row's bytes (b-tree balancing leaves stale copies in free space).
            let bytes = std::fs::read(db).unwrap();
            let at: Vec<usize> = (0..=bytes.len() - old.len())
                .filter(|&i| &bytes[i..i + old.len()] == old.as_bytes())
                .collect();
            assert!(!at.is_empty(), "row 7's bytes are not in the file");
            let f = std::fs::OpenOptions::new().write(true).open(db).unwrap();
            for &at in &at {
                assert!(at >= 4096, "row 7 is on the header page");
                f.write_all_at(new.as_bytes(), at as u64).unwrap(); // like dd conv=notrunc
            }
        },
        Expect {
            new_connection: (1, OOB_ROWS),
            holder: (1, OOB_ROWS),
        },
    );
}

/// Another database renamed over the path (`mv incoming.db app.db`): a new connection opens the
/// new file and reads it; the connection open across the rename keeps reading the file it has
/// open (as with plain SQLite).
#[test]
fn a_database_swapped_by_rename_is_read_fresh_by_a_new_connection() {
    check_out_of_band(
        |dir, db| {
            let incoming = dir.join("incoming.db");
            oob_db(&incoming, 'B');
            std::fs::rename(&incoming, db).unwrap();
        },
        Expect {
            new_connection: (OOB_ROWS, OOB_ROWS),
            holder: (0, OOB_ROWS),
        },
    );
}

// ---------------------------------------------------------------------------------------------
// SQLITE_FCNTL_CHUNK_SIZE on truncate.

const CHUNK: i32 = 64 * 1024;

fn set_chunk_size(c: &Connection, n: i32) {
    let mut n = n as std::ffi::c_int;
    // SAFETY: a live connection's handle; the argument is an int, as the op requires.
    let rc = unsafe {
        libsqlite3_sys::sqlite3_file_control(
            c.handle(),
            c"main".as_ptr(),
            libsqlite3_sys::SQLITE_FCNTL_CHUNK_SIZE,
            &mut n as *mut std::ffi::c_int as *mut std::ffi::c_void,
        )
    };
    assert_eq!(rc, libsqlite3_sys::SQLITE_OK);
}

/// The file's size after growing and shrinking with VACUUM and with incremental_vacuum.
fn sizes_with_chunk(c: &Connection, path: &Path) -> (u64, u64) {
    set_chunk_size(c, CHUNK);
    c.execute_batch(
        "PRAGMA journal_mode = DELETE; PRAGMA auto_vacuum = INCREMENTAL;
         CREATE TABLE t(id INTEGER PRIMARY KEY, v BLOB);",
    )
    .unwrap();
    let fill = |c: &Connection| {
        let tx = c.unchecked_transaction().unwrap();
        for id in 1..=2000 {
            tx.execute("INSERT INTO t(id, v) VALUES (?1, zeroblob(700))", [id])
                .unwrap();
        }
        tx.commit().unwrap();
    };
    fill(c);
    c.execute_batch("DELETE FROM t WHERE id > 150; PRAGMA incremental_vacuum;")
        .unwrap();
    let after_incremental = std::fs::metadata(path).unwrap().len();
    c.execute_batch("DELETE FROM t; INSERT INTO t(id, v) VALUES (1, zeroblob(700));")
        .unwrap();
    fill_more(c);
    c.execute_batch("DELETE FROM t WHERE id > 10; VACUUM;")
        .unwrap();
    let after_vacuum = std::fs::metadata(path).unwrap().len();
    (after_incremental, after_vacuum)
}

fn fill_more(c: &Connection) {
    let tx = c.unchecked_transaction().unwrap();
    for id in 2..=1500 {
        tx.execute("INSERT INTO t(id, v) VALUES (?1, zeroblob(900))", [id])
            .unwrap();
    }
    tx.commit().unwrap();
}

#[test]
fn a_chunk_size_is_kept_when_the_file_shrinks_as_with_the_unix_vfs() {
    let dir = tempdir();
    let unix_db = dir.path().join("unix.db");
    let bpe_db = dir.path().join("bpe.db");
    let unix = sizes_with_chunk(&open_unix(&unix_db), &unix_db);
    let bpe = sizes_with_chunk(&open_bpe(&bpe_db), &bpe_db);
    println!("unix {unix:?} bpe {bpe:?}");
    assert!(
        unix.0.is_multiple_of(CHUNK as u64) && unix.1.is_multiple_of(CHUNK as u64),
        "the scenario: the unix VFS keeps whole chunks ({unix:?})"
    );
    assert_eq!(
        bpe, unix,
        "file sizes (after incremental_vacuum, after VACUUM) with a {CHUNK}-byte chunk size: \
         bpe {bpe:?}, unix {unix:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// The extension file must never be a file SQLite opens.

/// The names SQLite gives a database's companion files (the super-journal's is `-mj` and hex).
const COMPANIONS: &[&str] = &["-wal", "-shm", "-journal", "-mjABCDEF901"];

#[test]
fn the_extension_is_refused_at_a_databases_companion_paths() {
    let _s = serial();
    let dir = tempdir();
    let admin = open_bpe(&dir.path().join("admin.db"));
    extension_off(&admin);
    exec(&admin, "EXEC sp_configure 'max server memory (MB)', 8");
    // The application's database exists but is not open yet.
    let app = dir.path().join("app.db");
    oob_db(&app, 'A');
    let mut problems = Vec::new();
    for suffix in COMPANIONS {
        let path = PathBuf::from(format!("{}{suffix}", app.display()));
        match try_exec(&admin, &extension_on(path.display(), "64 MB")) {
            Ok(out) => {
                problems.push(format!("ON at {}: accepted ({out})", path.display()));
                extension_off(&admin);
            }
            Err(e) => {
                println!("{suffix}: refused: {e}");
                if path.exists() {
                    problems.push(format!(
                        "{}: refused, but the file was created",
                        path.display()
                    ));
                }
            }
        }
        let _ = std::fs::remove_file(&path);
    }
    // An open rollback-journal database has no journal between transactions: its path is free,
    // and the next write transaction would open the extension as its journal.
    let open_db = dir.path().join("open.db");
    oob_db(&open_db, 'A');
    let app_conn = open_bpe(&open_db);
    app_conn
        .execute_batch("PRAGMA journal_mode = DELETE; SELECT count(*) FROM t;")
        .unwrap();
    let journal = PathBuf::from(format!("{}-journal", open_db.display()));
    assert!(!journal.exists());
    match try_exec(&admin, &extension_on(journal.display(), "64 MB")) {
        Ok(out) => {
            problems.push(format!(
                "ON at {} (database open): accepted ({out})",
                journal.display()
            ));
            extension_off(&admin);
        }
        Err(e) => println!("-journal of an open database: refused: {e}"),
    }
    app_conn
        .execute("UPDATE t SET v = v WHERE id = 1", [])
        .unwrap();
    drop(app_conn);
    extension_off(&admin);
    exec(&admin, "EXEC sp_configure 'max server memory (MB)', 128");
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// BPE_EXTENSION_FILE=<db>-wal at load, then the application opens its existing WAL-mode
/// database and updates and scans it with little memory (pages flowing through the extension,
/// DBCC DROPCLEANBUFFERS between rounds so that the extension keeps writing): the extension must
/// not take the WAL's path, and the database must come out whole. (Today SQLite opens the
/// extension file as the WAL, the extension's slot writes land on WAL frames, and the database
/// is left "malformed".)
#[test]
fn an_extension_at_a_databases_wal_path_set_at_load_is_refused_and_loses_nothing() {
    if !have_shell() {
        return;
    }
    let dir = tempdir();
    let db = dir.path().join("app.db");
    let wal = dir.path().join("app.db-wal");
    const ROWS: i64 = 4000;
    {
        let c = open_unix(&db);
        c.execute_batch(&format!(
            "PRAGMA journal_mode = WAL;
             CREATE TABLE t(id INTEGER PRIMARY KEY, ver INTEGER NOT NULL, payload TEXT NOT NULL);
             WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM s WHERE i < {ROWS})
             INSERT INTO t SELECT i, 0, printf('%0800d', i * 100) FROM s;"
        ))
        .unwrap();
    }
    assert!(!wal.exists(), "the last close removes the WAL");
    let env = [
        ("BPE_MAX_SERVER_MEMORY_MB", "1".to_string()),
        ("BPE_EXTENSION_FILE", wal.display().to_string()),
        ("BPE_EXTENSION_SIZE", "16MB".to_string()),
    ];
    let check = "SELECT 'SCAN|' || count(*) || '|' || sum(payload <> printf('%0800d', id * 100 + ver)) FROM t;\n";
    let mut script = format!(
        ".load {}\n\
         SELECT 'STATE|' || state || '|' || coalesce(path, '') || '|' || coalesce(last_failure, '') FROM bpe_extension_configuration;\n\
         .system test -e {wal} && echo WAL-PATH-EXISTS || echo WAL-PATH-ABSENT\n\
         .open file:app.db?vfs=bpe\n\
         PRAGMA cache_size = 1;\n\
         PRAGMA wal_autocheckpoint = 200;\n",
        library_for_load(),
        wal = wal.display()
    );
    for round in 0..10 {
        script.push_str(check);
        script.push_str(&format!(
            "UPDATE t SET ver = ver + 1, payload = printf('%0800d', id * 100 + ver + 1) WHERE id % 10 = {round};\n\
             SELECT 'DROP|' || bpe_exec('DBCC DROPCLEANBUFFERS');\n"
        ));
    }
    script.push_str(check);
    script.push_str(".quit\n");
    let (out, err, _) = shell_with_env(dir.path(), &env, &script);
    let mut problems = Vec::new();
    let load_refused = err.contains("BPE_EXTENSION_FILE") && !out.contains("STATE|");
    if !load_refused {
        let state = out
            .lines()
            .find(|l| l.starts_with("STATE|"))
            .unwrap_or_else(|| panic!("no state line: out {out} err {err}"))
            .to_string();
        let fields: Vec<&str> = state.split('|').collect();
        if fields[1] == "5" || fields[2] == wal.display().to_string() {
            problems.push(format!(
                "the extension was enabled at the WAL's path: {state}"
            ));
        } else if fields[3].is_empty() {
            problems.push(format!("refused without a reason in last_failure: {state}"));
        }
        if out.contains("WAL-PATH-EXISTS") {
            problems.push("a file was created at the WAL's path at load".into());
        }
        let scans = out
            .lines()
            .filter(|l| *l == format!("SCAN|{ROWS}|0"))
            .count();
        if scans != 11 || !err.is_empty() {
            problems.push(format!(
                "{scans} of the session's 11 scans read every row right (stderr: {err:?})"
            ));
        }
    }
    // Whatever happened, the database must be whole for plain SQLite.
    let (after, after_err, _) = run_shell(
        dir.path(),
        &format!(
            ".open app.db\nPRAGMA integrity_check;\n{check}SELECT 'VERSIONS|' || sum(ver) FROM t;\n"
        ),
    );
    if !after.starts_with("ok\n")
        || !after.contains(&format!("SCAN|{ROWS}|0"))
        || !after.contains(&format!("VERSIONS|{ROWS}"))
    {
        problems.push(format!(
            "the database is damaged afterwards (plain sqlite3): {} {after_err}",
            after.lines().take(6).collect::<Vec<_>>().join(" / ")
        ));
    }
    assert!(
        problems.is_empty(),
        "{}\n--- session stdout ---\n{out}\n--- session stderr ---\n{err}",
        problems.join("\n")
    );
}

/// The extension enabled at /x/other.db, then an application opens /x/other.db as a database:
/// that open must fail (not read or write the extension's bytes), and the extension must go on.
#[test]
fn opening_the_extension_file_as_a_database_fails_and_the_extension_goes_on() {
    let _s = serial();
    let dir = tempdir();
    let data = dir.path().join("data.db");
    checked_db(&data, 4096, 3000);
    let admin = open_bpe(&data);
    admin.execute_batch("PRAGMA cache_size = 1").unwrap();
    extension_off(&admin);
    exec(&admin, "EXEC sp_configure 'max server memory (MB)', 1");
    let ext = dir.path().join("other.db");
    exec(&admin, &extension_on(ext.display(), "16 MB"));
    for _ in 0..2 {
        scan_checked(&admin, 3000);
    }
    drain(&admin);
    let ext_bytes_before = std::fs::read(&ext).unwrap();
    let mut problems = Vec::new();
    match Connection::open_with_flags(format!("file:{}?vfs=bpe", ext.display()), flags()) {
        Err(e) => println!("refused: {e} / {:?}", sqlite_bpe::last_open_error()),
        Ok(c) => {
            let first = c.query_row("SELECT count(*) FROM sqlite_master", [], |r| {
                r.get::<_, i64>(0)
            });
            let write = c.execute_batch("CREATE TABLE IF NOT EXISTS intruder(x)");
            problems.push(format!(
                "the extension file opened as a database (first read: {first:?}, a write: {write:?})"
            ));
        }
    }
    let (path, state, failure) = extension_state(&admin);
    if state != 5 || path.as_deref() != Some(&*ext.display().to_string()) || !ext.exists() {
        problems.push(format!(
            "the extension did not go on: {path:?} state {state} {failure:?}, file exists {}",
            ext.exists()
        ));
    } else {
        let reads = counter(&admin, "Extension page reads/sec");
        scan_checked(&admin, 3000);
        if counter(&admin, "Extension page reads/sec") == reads {
            problems.push("the extension serves no reads afterwards".into());
        }
    }
    let ext_bytes_after = std::fs::read(&ext).unwrap_or_default();
    if ext_bytes_after.len() != ext_bytes_before.len() {
        problems.push(format!(
            "the extension file changed size: {} -> {}",
            ext_bytes_before.len(),
            ext_bytes_after.len()
        ));
    }
    extension_off(&admin);
    if ext.exists() {
        problems.push("OFF left the extension file".into());
    }
    exec(&admin, "EXEC sp_configure 'max server memory (MB)', 128");
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

// ---------------------------------------------------------------------------------------------
// The database path opened three times (SQLite's descriptor and bpe's two) must be one
// file, even while another thread exchanges two databases' names.

fn exchange(a: &Path, b: &Path) -> bool {
    let a = std::ffi::CString::new(a.as_os_str().as_encoded_bytes()).unwrap();
    let b = std::ffi::CString::new(b.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: two valid C strings; renameat2 only reads them.
    unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            a.as_ptr(),
            libc::AT_FDCWD,
            b.as_ptr(),
            libc::RENAME_EXCHANGE,
        ) == 0
    }
}

/// (dev, ino) of every open descriptor of this process that refers to one of `files`.
fn descriptors_of(files: &[(u64, u64)]) -> Vec<(i32, (u64, u64))> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc/self/fd").unwrap() {
        let Ok(entry) = entry else { continue };
        let Ok(fd) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        // stat of the magic link: the open file itself, wherever its name is now.
        if let Ok(m) = std::fs::metadata(entry.path()) {
            let id = (m.dev(), m.ino());
            if files.contains(&id) {
                found.push((fd, id));
            }
        }
    }
    found
}

#[test]
fn sqlite_and_bpe_open_the_same_file_while_names_are_exchanged() {
    let dir = tempdir();
    let x = dir.path().join("x.db");
    let y = dir.path().join("y.db");
    for (path, name) in [(&x, "X"), (&y, "Y")] {
        let c = open_unix(path);
        c.execute_batch(&format!(
            "PRAGMA journal_mode = DELETE;
             CREATE TABLE who(name TEXT);
             INSERT INTO who VALUES ('{name}');
             CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT);"
        ))
        .unwrap();
        for id in 1..=50 {
            c.execute(
                "INSERT INTO t VALUES (?1, ?2)",
                rusqlite::params![id, format!("{name}{}", "z".repeat(300))],
            )
            .unwrap();
        }
    }
    let id_of = |p: &Path| {
        let m = std::fs::metadata(p).unwrap();
        (m.dev(), m.ino())
    };
    let inode_x = id_of(&x);
    let inode_y = id_of(&y);
    sqlite_bpe::register().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let swaps = Arc::new(AtomicU64::new(0));
    let swapper = {
        let (x, y, stop, swaps) = (x.clone(), y.clone(), stop.clone(), swaps.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                assert!(
                    exchange(&x, &y),
                    "renameat2: {}",
                    std::io::Error::last_os_error()
                );
                swaps.fetch_add(1, Ordering::Relaxed);
            }
        })
    };
    // Closed files keep their descriptors for a reopen, the last few: opening and closing as
    // many others after each round closes them, so that what the check below sees is the
    // round's connection alone.
    let others: Vec<_> = (0..bpe_core::PARKED_FILES)
        .map(|i| {
            let p = dir.path().join(format!("other{i}.db"));
            open_unix(&p).execute_batch("CREATE TABLE t(x);").unwrap();
            p
        })
        .collect();
    let close_parked = || {
        for p in &others {
            open_bpe(p)
                .query_row("SELECT count(*) FROM t", [], |_| Ok(()))
                .unwrap();
        }
    };
    let mut problems = Vec::new();
    let (mut opened, mut refused) = (0, 0);
    let started = Instant::now();
    // Opens are slow while the names fly (the exchanges contend for the directory): a few
    // seconds of them, enough for some opens to be split across the two files.
    for round in 0..300 {
        if started.elapsed() > Duration::from_secs(6) {
            break;
        }
        let c = match Connection::open_with_flags(format!("file:{}?vfs=bpe", x.display()), flags())
        {
            Ok(c) => c,
            Err(e) => {
                refused += 1;
                if refused <= 3 {
                    println!("round {round}: open refused: {e}");
                }
                continue;
            }
        };
        opened += 1;
        let read = c.query_row("SELECT name FROM who", [], |r| r.get::<_, String>(0));
        let fds = descriptors_of(&[inode_x, inode_y]);
        let mut inodes: Vec<(u64, u64)> = fds.iter().map(|f| f.1).collect();
        inodes.sort();
        inodes.dedup();
        let expected = match read.as_deref() {
            Ok("X") => Some(inode_x),
            Ok("Y") => Some(inode_y),
            _ => None,
        };
        if inodes.len() != 1 || fds.len() < 2 || expected != Some(inodes[0]) {
            problems.push(format!(
                "round {round}: descriptors {fds:?} (x = {inode_x:?}, y = {inode_y:?}), read {read:?}"
            ));
        }
        drop(c);
        close_parked();
        if problems.len() >= 5 {
            break;
        }
    }
    stop.store(true, Ordering::Relaxed);
    swapper.join().unwrap();
    println!(
        "{opened} opens, {refused} refused, {} exchanges",
        swaps.load(Ordering::Relaxed)
    );
    assert!(
        problems.is_empty(),
        "one connection's descriptors refer to different files:\n{}",
        problems.join("\n")
    );
    assert!(
        opened >= 50,
        "only {opened} of the opens succeeded ({refused} refused)"
    );
}

// ---------------------------------------------------------------------------------------------
// Bad input handled one way, whatever way it comes in.

/// A text of several statements is validated whole before anything runs: the memory setting
/// before a failing ON must not be applied.
#[test]
fn a_failing_multi_statement_text_changes_nothing() {
    let _s = serial();
    let dir = tempdir();
    let c = open_bpe(&dir.path().join("app.db"));
    extension_off(&c);
    exec(&c, "EXEC sp_configure 'max server memory (MB)', 64");
    let existing = dir.path().join("existing.bpe");
    std::fs::write(&existing, b"someone's data").unwrap();
    let mut problems = Vec::new();
    for ext in [
        existing.clone(),
        dir.path().join("no-such-directory").join("x.bpe"),
    ] {
        let text = format!(
            "EXEC sp_configure 'max server memory (MB)', 8; {}",
            extension_on(ext.display(), "64 MB")
        );
        match try_exec(&c, &text) {
            Ok(out) => problems.push(format!("{text:?} was accepted: {out}")),
            Err(e) => println!("refused: {e}"),
        }
        let mb = max_memory_mb(&c);
        if !mb.starts_with("64") {
            problems.push(format!(
                "after the refused text {text:?}, max server memory is {mb} (was 64)"
            ));
        }
        exec(&c, "EXEC sp_configure 'max server memory (MB)', 64");
        extension_off(&c);
    }
    assert_eq!(std::fs::read(&existing).unwrap(), b"someone's data");
    exec(&c, "EXEC sp_configure 'max server memory (MB)', 128");
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The environment is checked as strictly as SQL: more memory than the machine has, a flag
/// that is not 0 or 1, an absurd emulated latency: the load fails naming the variable.
#[test]
fn environment_settings_are_checked_as_strictly_as_sql() {
    if !have_shell() {
        return;
    }
    let lib = library_for_load();
    let dir = tempdir();
    // `.bail on`: the shell stops at a failed load instead of running what follows.
    let load = format!(".bail on\n.load {lib}\nSELECT 'LOADED';\n");
    // A good configuration loads (the cases below fail for their own reason only).
    let good = [
        ("BPE_MAX_SERVER_MEMORY_MB", "64"),
        ("BPE_DIRECT_IO", "0"),
        ("BPE_READAHEAD", "1"),
        ("BPE_DATA_LATENCY_US", "100"),
    ];
    let env: Vec<(&str, String)> = good.iter().map(|(k, v)| (*k, v.to_string())).collect();
    let (out, err, _) = shell_with_env(dir.path(), &env, &load);
    assert!(
        out.contains("LOADED") && err.is_empty(),
        "a good configuration does not load: {out} {err}"
    );
    let mut problems = Vec::new();
    for (var, value) in [
        // SQL refuses more than physical RAM.
        ("BPE_MAX_SERVER_MEMORY_MB", "100000000"),
        // The documented values are 0 and 1.
        ("BPE_DIRECT_IO", "yes"),
        ("BPE_DIRECT_IO", "true"),
        ("BPE_READAHEAD", "yes"),
        // Years per read.
        ("BPE_DATA_LATENCY_US", "1000000000000"),
        ("BPE_DATA_LATENCY_US", "18446744073709551615"),
    ] {
        let (out, err, _) = shell_with_env(dir.path(), &[(var, value.to_string())], &load);
        if !err.contains(var) || out.contains("LOADED") {
            problems.push(format!(
                "{var}={value}: the load did not fail naming the variable (stdout {out:?}, stderr {err:?})"
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

// ---------------------------------------------------------------------------------------------
// Randomized: short-lived connections from four threads on three databases (4, 8 and 16 KiB
// pages; one in WAL mode), transfers that keep a constant sum and a commit counter that only
// grows, with little memory and the extension on.

const ACCOUNTS: i64 = 400;
const BALANCE: i64 = 1000;
/// `BPE_APP_PATTERNS_SECONDS=N` runs it longer.
const RANDOM_SECONDS: u64 = 3;

struct RandomDb {
    path: PathBuf,
    wal: bool,
}

fn random_dbs(dir: &Path) -> Vec<RandomDb> {
    [(4096, false), (8192, true), (16384, false)]
        .into_iter()
        .map(|(page, wal)| {
            let path = dir.join(format!("r{page}.db"));
            let c = open_unix(&path);
            c.execute_batch(&format!(
                "PRAGMA page_size = {page}; PRAGMA journal_mode = {};
                 CREATE TABLE acct(id INTEGER PRIMARY KEY, balance INTEGER NOT NULL,
                                   pad BLOB NOT NULL, crc INTEGER NOT NULL);
                 CREATE TABLE meta(k INTEGER PRIMARY KEY, commits INTEGER NOT NULL);
                 INSERT INTO meta VALUES (1, 0);",
                if wal { "WAL" } else { "DELETE" }
            ))
            .unwrap();
            let tx = c.unchecked_transaction().unwrap();
            for id in 1..=ACCOUNTS {
                let pad = rows::payload(
                    id as u64 * 7919 + page as u64,
                    100 + (id as usize * 53) % 1400,
                );
                tx.execute(
                    "INSERT INTO acct VALUES (?1, ?2, ?3, ?4)",
                    rusqlite::params![id, BALANCE, pad, rows::crc32(&pad)],
                )
                .unwrap();
            }
            tx.commit().unwrap();
            RandomDb { path, wal }
        })
        .collect()
}

/// Reads one snapshot and checks it: every account there, the sum kept, the checksums of a
/// window of `verify` accounts' pads right; returns the commit counter.
fn check_snapshot(c: &Connection, verify: std::ops::RangeInclusive<i64>) -> rusqlite::Result<i64> {
    c.execute_batch("BEGIN")?;
    let result = (|| {
        // Reads every leaf page of the table.
        let (n, sum): (i64, i64) =
            c.query_row("SELECT count(*), sum(balance) FROM acct", [], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })?;
        assert_eq!(n, ACCOUNTS, "accounts missing");
        assert_eq!(sum, ACCOUNTS * BALANCE, "transfers did not keep the sum");
        let mut stmt =
            c.prepare_cached("SELECT id, pad, crc FROM acct WHERE id BETWEEN ?1 AND ?2")?;
        let mut rows = stmt.query([verify.start(), verify.end()])?;
        let mut seen = 0;
        while let Some(r) = rows.next()? {
            let id: i64 = r.get(0)?;
            let pad = r.get_ref(1)?.as_blob()?;
            let crc: i64 = r.get(2)?;
            assert_eq!(
                rows::crc32(pad),
                crc,
                "account {id}: pad does not match its checksum"
            );
            seen += 1;
        }
        assert_eq!(
            seen,
            verify.end() - verify.start() + 1,
            "accounts missing in {verify:?}"
        );
        c.query_row("SELECT commits FROM meta WHERE k = 1", [], |r| r.get(0))
    })();
    let end = c.execute_batch("COMMIT");
    let commits = result?;
    end?;
    Ok(commits)
}

fn transfer(c: &Connection, rng: &mut StdRng) -> rusqlite::Result<()> {
    c.execute_batch("BEGIN IMMEDIATE")?;
    let result = (|| {
        let a = rng.gen_range(1..=ACCOUNTS);
        let b = rng.gen_range(1..=ACCOUNTS);
        let amount = rng.gen_range(1..=50);
        c.execute(
            "UPDATE acct SET balance = balance - ?2 WHERE id = ?1",
            [a, amount],
        )?;
        c.execute(
            "UPDATE acct SET balance = balance + ?2 WHERE id = ?1",
            [b, amount],
        )?;
        if rng.gen_bool(0.5) {
            let pad = rows::payload(rng.gen(), rng.gen_range(100..1500));
            c.execute(
                "UPDATE acct SET pad = ?2, crc = ?3 WHERE id = ?1",
                rusqlite::params![a, pad, rows::crc32(&pad)],
            )?;
        }
        c.execute("UPDATE meta SET commits = commits + 1 WHERE k = 1", [])?;
        c.execute_batch("COMMIT")
    })();
    if result.is_err() {
        let _ = c.execute_batch("ROLLBACK");
    }
    result
}

fn child_random(dir: &Path) {
    let seed: u64 = std::env::var(CHILD_SEED).unwrap().parse().unwrap();
    let dbs = Arc::new(random_dbs(dir));
    sqlite_bpe::register().unwrap();
    let seconds: u64 =
        std::env::var("BPE_APP_PATTERNS_SECONDS").map_or(RANDOM_SECONDS, |s| s.parse().unwrap());
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let failed = Arc::new(AtomicBool::new(false));
    let progress = Arc::new(AtomicU64::new(0));
    exit_if_stalled(progress.clone(), STALL, "operations finished");
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let (dbs, failed, progress) = (dbs.clone(), failed.clone(), progress.clone());
            std::thread::spawn(move || {
                let mut rng = StdRng::seed_from_u64(seed.wrapping_add(t));
                let mut seen = vec![0i64; dbs.len()];
                let mut committed = vec![0i64; dbs.len()];
                let (mut busy, mut reads, mut writes) = (0u64, 0u64, 0u64);
                let fail = |what: String| -> ! {
                    failed.store(true, Ordering::Relaxed);
                    panic!("thread {t}: {what}");
                };
                while Instant::now() < deadline && !failed.load(Ordering::Relaxed) {
                    let d = rng.gen_range(0..dbs.len());
                    let db = &dbs[d];
                    let c = match Connection::open_with_flags(
                        format!("file:{}?vfs=bpe", db.path.display()),
                        flags(),
                    ) {
                        Ok(c) => c,
                        Err(e) if is_busy(&e) => {
                            busy += 1;
                            continue;
                        }
                        Err(e) => fail(format!("open {}: {e}", db.path.display())),
                    };
                    c.busy_timeout(Duration::from_secs(5)).unwrap();
                    let setup = format!(
                        "PRAGMA cache_size = 2; PRAGMA synchronous = {};{}",
                        // OFF: more transactions in the time (no crash here, nothing to lose).
                        if rng.gen_bool(0.5) { "OFF" } else { "NORMAL" },
                        if db.wal { " PRAGMA wal_autocheckpoint = 20;" } else { "" }
                    );
                    match c.execute_batch(&setup) {
                        Ok(()) => {}
                        Err(e) if is_busy(&e) => {
                            busy += 1;
                            continue;
                        }
                        Err(e) => fail(format!("{setup}: {e}")),
                    }
                    for _ in 0..rng.gen_range(1..=6) {
                        progress.fetch_add(1, Ordering::Relaxed);
                        if rng.gen_bool(0.6) {
                            let from = rng.gen_range(1..=ACCOUNTS - 40);
                            match check_snapshot(&c, from..=from + 40) {
                                Ok(commits) => {
                                    if commits < seen[d] {
                                        fail(format!(
                                            "{}: the commit counter went back from {} to {commits}",
                                            db.path.display(),
                                            seen[d]
                                        ));
                                    }
                                    if commits < committed[d] {
                                        fail(format!(
                                            "{}: {commits} commits, fewer than this thread's own {}",
                                            db.path.display(),
                                            committed[d]
                                        ));
                                    }
                                    seen[d] = commits;
                                    reads += 1;
                                }
                                Err(e) if is_busy(&e) => busy += 1,
                                Err(e) => fail(format!("read {}: {e}", db.path.display())),
                            }
                        } else {
                            match transfer(&c, &mut rng) {
                                Ok(()) => {
                                    committed[d] += 1;
                                    writes += 1;
                                }
                                Err(e) if is_busy(&e) => busy += 1,
                                Err(e) => fail(format!("write {}: {e}", db.path.display())),
                            }
                        }
                    }
                }
                progress.fetch_add(1, Ordering::Relaxed);
                println!("THREAD {t} reads {reads} writes {writes} busy {busy}");
                committed
            })
        })
        .collect();
    let mut committed = vec![0i64; dbs.len()];
    for t in threads {
        for (i, n) in t.join().unwrap().into_iter().enumerate() {
            committed[i] += n;
        }
    }
    for (db, n) in dbs.iter().zip(&committed) {
        let c = open_bpe(&db.path);
        let commits = check_snapshot(&c, 1..=ACCOUNTS).unwrap();
        assert_eq!(
            commits,
            *n,
            "{}: committed transactions lost",
            db.path.display()
        );
        let ok: String = c
            .query_row("PRAGMA integrity_check", [], |r| r.get(0))
            .unwrap();
        assert_eq!(ok, "ok", "{}", db.path.display());
        println!("DB {} commits {commits}", db.path.display());
    }
    let ext: (i64, i64) = {
        let c = open_bpe(&dbs[0].path);
        (
            counter(&c, "Extension page writes/sec"),
            counter(&c, "Extension page reads/sec"),
        )
    };
    println!("EXTENSION writes {} reads {}", ext.0, ext.1);
    // And plain SQLite agrees.
    for (db, n) in dbs.iter().zip(&committed) {
        let c = Connection::open_with_flags(&db.path, OpenFlags::SQLITE_OPEN_READ_WRITE).unwrap();
        assert_eq!(check_snapshot(&c, 1..=ACCOUNTS).unwrap(), *n);
    }
}

#[test]
fn random_short_lived_connections_on_three_page_sizes_keep_every_invariant() {
    let seed: u64 = std::env::var("BPE_APP_PATTERNS_SEED")
        .ok()
        .map_or_else(rand::random, |s| s.parse().unwrap());
    println!("seed {seed} (BPE_APP_PATTERNS_SEED={seed} repeats it)");
    let dir = tempdir();
    let r = run_child(
        "random",
        dir.path(),
        &[
            (CHILD_SEED, seed.to_string()),
            ("BPE_MAX_SERVER_MEMORY_MB", "1".into()),
            (
                "BPE_EXTENSION_FILE",
                dir.path().join("ext.bpe").display().to_string(),
            ),
            ("BPE_EXTENSION_SIZE", "32MB".into()),
        ],
        Duration::from_secs(
            90 + RANDOM_SECONDS
                .max(std::env::var("BPE_APP_PATTERNS_SECONDS").map_or(0, |s| s.parse().unwrap())),
        ),
    );
    println!("{}", r.stdout);
    assert!(r.success, "seed {seed}: {}", r.describe());
}
