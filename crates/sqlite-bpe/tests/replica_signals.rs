//! LiteFS's signals where they can mean something, and nowhere else. A database on a FUSE mount
//! with a `<db>-pos` file is LiteFS's; only on a replica (`.primary` in the mount's directory)
//! does a position that moved under an unchanged header say that a transaction is missing from
//! the wal-index. On a primary (or any mount with a moving `-pos` and no `.primary`: bindfs
//! here, which any user can set up) bpe must neither forget the file nor write SQLite's
//! wal-index; on a replica it may rewrite the lost header only under the WAL write lock, and
//! only if the header is still the one it read.
//!
//! A bpe reader in a child process is stopped (`BPE_PAUSE_AT`, SIGSTOP) at the pause points
//! around that write while this process commits as a plain SQLite writer; every commit that was
//! acknowledged must be in the file afterwards, and the next commit must work.
//!
//! Needs root, /dev/fuse and bindfs (CI installs it): skipped with a message elsewhere, unless
//! BPE_REQUIRE_FUSE=1 (CI), where a missing prerequisite fails.

mod common;
use bpe_core::pause::{LOST_HEADER_LOCKED, LOST_HEADER_SEEN};
use common::*;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const CHILD: &str = "BPE_REPLICA_SIGNALS_CHILD";
const CHILD_ARGS: [&str; 4] = ["--ignored", "--exact", "child_entry", "--nocapture"];

/// A bindfs mount of a directory of its own, unmounted when dropped.
struct Mount {
    _dir: tempfile::TempDir,
    mnt: PathBuf,
}

impl Mount {
    fn new() -> Option<Mount> {
        let dir = tempdir();
        let (src, mnt) = (dir.path().join("src"), dir.path().join("mnt"));
        std::fs::create_dir_all(&src).unwrap();
        std::fs::create_dir_all(&mnt).unwrap();
        let ok = Command::new("bindfs")
            .arg(&src)
            .arg(&mnt)
            .status()
            .is_ok_and(|s| s.success());
        ok.then_some(Mount { _dir: dir, mnt })
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("fusermount3")
            .args(["-u", "-z"])
            .arg(&self.mnt)
            .status()
            .or_else(|_| Command::new("umount").arg("-l").arg(&self.mnt).status());
    }
}

fn mount_or_skip() -> Option<Mount> {
    if let Some(m) = Mount::new() {
        return Some(m);
    }
    let why = "bindfs over FUSE is not available here (root, /dev/fuse and bindfs are needed)";
    assert!(std::env::var("BPE_REQUIRE_FUSE").is_err(), "{why}");
    println!("skipped: {why}");
    None
}

fn set_position(db: &Path, txid: u64) {
    let mut pos = db.as_os_str().to_owned();
    pos.push("-pos");
    std::fs::write(pos, format!("{txid:016x}/00000000000000{txid:02x}\n")).unwrap();
}

/// The child: opens `db` through bpe, reads, says `ready`, waits for a line, reads again (the
/// read transaction that sees the position moved), says what it read and how often the file was
/// forgotten, and exits.
#[test]
#[ignore]
fn child_entry() {
    let Ok(db) = std::env::var(CHILD) else {
        return;
    };
    let conn = open_bpe(Path::new(&db));
    let count = |c: &rusqlite::Connection| -> i64 {
        c.query_row("SELECT count(*) FROM t", [], |r| r.get(0))
            .unwrap()
    };
    let before = count(&conn);
    let forgotten = counter(&conn, "File cache invalidations");
    println!("ready rows={before}");
    std::io::stdout().flush().unwrap();
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).unwrap();
    let after = count(&conn);
    let forgotten = counter(&conn, "File cache invalidations") - forgotten;
    println!("after rows={after} forgotten={forgotten}");
}

/// The bpe reader in its own process.
struct Reader {
    child: Child,
    out: BufReader<std::process::ChildStdout>,
    /// The child's exit was already reaped by `stopped`.
    exited: bool,
}

impl Reader {
    /// Starts the reader (stopping itself at `pause_at`, if given) and waits until it read once.
    fn start(db: &Path, pause_at: Option<&str>) -> Reader {
        let mut cmd = Command::new(std::env::current_exe().unwrap());
        cmd.args(CHILD_ARGS)
            .env(CHILD, db)
            .env_remove("BPE_PAUSE_AT")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        if let Some(point) = pause_at {
            cmd.env("BPE_PAUSE_AT", point);
        }
        let mut child = cmd.spawn().unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        while !line.starts_with("ready") {
            line.clear();
            let n = out.read_line(&mut line).unwrap();
            assert!(n > 0, "the reader ended before it was ready");
        }
        Reader {
            child,
            out,
            exited: false,
        }
    }

    /// Lets the reader begin its second read transaction.
    fn go(&mut self) {
        let stdin = self.child.stdin.as_mut().unwrap();
        stdin.write_all(b"go\n").unwrap();
        stdin.flush().unwrap();
    }

    /// Waits until the reader stops at its pause point (true) or exits (false). The deadline
    /// only turns a hang into a failure.
    fn stopped(&mut self) -> bool {
        let pid = self.child.id() as libc::pid_t;
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let mut status = 0;
            // SAFETY: waitpid on our own child, with a status it writes into.
            let r = unsafe { libc::waitpid(pid, &mut status, libc::WUNTRACED | libc::WNOHANG) };
            assert!(r >= 0, "waitpid: {}", std::io::Error::last_os_error());
            if r == pid {
                if libc::WIFSTOPPED(status) {
                    return true;
                }
                assert!(
                    libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
                    "the reader failed (wait status {status:#x})"
                );
                self.exited = true;
                return false;
            }
            assert!(
                Instant::now() < deadline,
                "the reader neither stopped nor exited"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn resume(&mut self) {
        // SAFETY: kill with a signal number to our own child.
        assert_eq!(
            unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGCONT) },
            0
        );
    }

    /// Waits for the reader's end; (rows it read the second time, times it forgot the file).
    fn finish(&mut self) -> (i64, i64) {
        if !self.exited {
            assert!(!self.stopped(), "the reader stopped again at a pause point");
        }
        let mut rest = String::new();
        std::io::Read::read_to_string(&mut self.out, &mut rest).unwrap();
        if !self.exited {
            let status = self.child.wait().unwrap();
            self.exited = true;
            assert!(status.success(), "the reader failed: {status}");
        }
        let line = rest
            .lines()
            .find(|l| l.starts_with("after"))
            .unwrap_or_else(|| panic!("no result from the reader: {rest}"));
        let field = |k: &str| -> i64 {
            line.split_whitespace()
                .find_map(|w| w.strip_prefix(k))
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("no {k} in {line}"))
        };
        (field("rows="), field("forgotten="))
    }
}

impl Drop for Reader {
    /// A reader left stopped by a failed assertion would hold its locks, and the test binary's
    /// output pipe, for ever: it is killed.
    fn drop(&mut self) {
        if !self.exited && self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A database of 100 rows on the mount, in `journal` mode, at position 1.
fn database(mount: &Mount, journal: &str) -> (PathBuf, rusqlite::Connection) {
    let db = mount.mnt.join("db");
    let writer = open_unix(&db);
    writer
        .execute_batch(&format!(
            "PRAGMA journal_mode = {journal};
             CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT);
             WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 100)
             INSERT INTO t SELECT i, hex(randomblob(200)) FROM n;"
        ))
        .unwrap();
    set_position(&db, 1);
    (db, writer)
}

fn rows(conn: &rusqlite::Connection) -> i64 {
    conn.query_row("SELECT count(*) FROM t", [], |r| r.get(0))
        .unwrap()
}

/// Every acknowledged row is there for a new connection of either kind, the file is sound, and
/// the next commit works (a header written back over a commit makes it fail).
fn assert_nothing_lost(db: &Path, acknowledged: i64) {
    let plain = open_unix(db);
    assert_eq!(
        rows(&plain),
        acknowledged,
        "plain SQLite lost an acknowledged commit"
    );
    plain
        .execute("INSERT INTO t(v) VALUES ('next')", [])
        .expect("the commit after the reader's look");
    let check: String = plain
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(check, "ok");
    let bpe = open_bpe(db);
    assert_eq!(rows(&bpe), acknowledged + 1, "a bpe reader lost a commit");
}

/// On a mount without `.primary` (a LiteFS primary, or bindfs with a moving `-pos`), a position
/// that moved under an unchanged header is a commit LiteFS has not yet moved it for: the reader
/// never reaches the pause point (it writes nothing of SQLite's) and forgets nothing.
fn primary(journal: &str) {
    let Some(mount) = mount_or_skip() else {
        return;
    };
    let (db, writer) = database(&mount, journal);
    let mut reader = Reader::start(&db, Some(LOST_HEADER_SEEN));
    set_position(&db, 2);
    reader.go();
    assert!(
        !reader.stopped(),
        "{journal}: the reader acted on the position of a primary"
    );
    let (seen, forgotten) = reader.finish();
    assert_eq!(seen, 100);
    assert_eq!(
        forgotten, 0,
        "{journal}: the reader dropped its cache on a primary"
    );
    drop(writer);
    assert_nothing_lost(&db, 100);
}

#[test]
fn on_a_primary_a_moving_position_changes_nothing_in_wal_mode() {
    primary("WAL");
}

#[test]
fn on_a_primary_a_moving_position_changes_nothing_in_rollback_mode() {
    primary("DELETE");
}

/// A WAL database on a mount that is a replica's (`.primary` exists), and its bpe reader stopped
/// at `point` of the lost header's rewrite, after the position moved under an unchanged header.
fn replica_reader_stopped_at(
    point: &str,
) -> Option<(Mount, PathBuf, rusqlite::Connection, Reader)> {
    let mount = mount_or_skip()?;
    let (db, writer) = database(&mount, "WAL");
    std::fs::write(mount.mnt.join(".primary"), "primary.example\n").unwrap();
    let mut reader = Reader::start(&db, Some(point));
    set_position(&db, 2);
    reader.go();
    assert!(reader.stopped(), "the reader did not stop at {point}");
    Some((mount, db, writer, reader))
}

/// A replica's reader paused after it read the header it takes as lost, while a writer commits
/// (LiteFS, on a real replica; a plain writer here): the header it read is stale when it
/// resumes, and it must not write it back.
#[test]
fn a_replica_reader_paused_before_the_write_lock_never_writes_a_stale_header() {
    let Some((_mount, db, writer, mut reader)) = replica_reader_stopped_at(LOST_HEADER_SEEN) else {
        return;
    };
    writer
        .execute("INSERT INTO t(v) VALUES ('acknowledged')", [])
        .expect("a commit while the reader is stopped");
    reader.resume();
    let (_, forgotten) = reader.finish();
    assert!(forgotten >= 1, "a replica's lost header forgets the file");
    drop(writer);
    assert_nothing_lost(&db, 101);
}

/// A replica's reader paused holding the WAL write lock: a writer cannot commit meanwhile (it is
/// told SQLITE_BUSY, not acknowledged), and commits once the reader let go.
#[test]
fn a_replica_reader_holding_the_write_lock_keeps_writers_out_until_it_lets_go() {
    let Some((_mount, db, writer, mut reader)) = replica_reader_stopped_at(LOST_HEADER_LOCKED)
    else {
        return;
    };
    writer.busy_timeout(Duration::ZERO).unwrap();
    let refused = writer.execute("INSERT INTO t(v) VALUES ('refused')", []);
    assert!(
        matches!(&refused, Err(rusqlite::Error::SqliteFailure(e, _)) if e.code == rusqlite::ErrorCode::DatabaseBusy),
        "a writer committed past the reader's write lock: {refused:?}"
    );
    reader.resume();
    let (_, forgotten) = reader.finish();
    assert!(forgotten >= 1);
    writer
        .execute("INSERT INTO t(v) VALUES ('acknowledged')", [])
        .expect("a commit after the reader let go");
    drop(writer);
    assert_nothing_lost(&db, 101);
}
