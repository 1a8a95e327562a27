//! A checkpoint by another process between a WAL read transaction's read-mark lock and SQLite's
//! read of nBackfill (SQLite's walthread-4, made deterministic). SQLite locks its read mark,
//! then reads nBackfill, which says which pages it reads from the database file rather than the
//! WAL. bpe looks at the wal-index in the lock call, before that read: a backfill in between
//! copies frames into the file that this transaction then reads there, and that bpe's cache
//! holds older. The first read of the transaction looks again (`ReadTxn::first_read` in
//! `vfs/read_txn.rs`).
//!
//! A bpe reader in a child process caches a table's pages; this process, plain SQLite, updates
//! every row (WAL frames only: the file and the reader's cache still agree). The reader begins a
//! read transaction and stops itself at the pause point `WAL_READ_MARK_LOCKED`, its read mark
//! held; this process checkpoints, which backfills up to that mark; the reader goes on and must
//! read the updated rows, never the old ones; and its next read transaction keeps the rest of
//! the file (the backfill was accounted, not taken for a write outside SQLite). With 4 and 16
//! KiB pages.
//!
//! The reader reaches that point at every WAL read transaction, its warm-up reads among them, so
//! it stops through a hook (`bpe_core::pause::set_hook`) armed for the one transaction, not
//! through `BPE_PAUSE_AT`, which would stop it at each.

mod common;
use bpe_core::pause::{self, WAL_READ_MARK_LOCKED};
use common::*;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdout, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

const CHILD: &str = "BPE_TEST_WAL_BACKFILL_RACE_DB";
/// Rows of about 300 bytes: 30 pages of 4 KiB, 8 of 16 KiB.
const ROWS: i64 = 400;

fn read(conn: &rusqlite::Connection) -> (i64, i64) {
    conn.query_row("SELECT count(*), total(n) FROM t", [], |r| {
        Ok((r.get(0)?, r.get::<_, f64>(1)? as i64))
    })
    .unwrap()
}

/// The reader: opens the database through bpe and reads the table twice (every page cached),
/// says `ready`, waits for a line, then reads it once more, stopping itself (SIGSTOP) once, at
/// the read-mark lock of that read transaction; says what it read and what its pool forgot
/// meanwhile (counted without a read transaction of its own).
#[test]
#[ignore = "run by wal_backfill_race's test as a child process"]
fn child_entry() {
    let Some(db) = child_mode(CHILD) else {
        return;
    };
    // A hang anywhere (this process or the test's) ends the reader, and so the test's wait
    // for its output; stopped, it runs no watchdog, and the test's own deadline applies.
    std::thread::spawn(|| {
        std::thread::sleep(Duration::from_secs(60));
        println!("HUNG: the reader ran for 60 s");
        std::process::exit(3);
    });
    let conn = open_bpe(Path::new(&db));
    read(&conn);
    read(&conn);
    let before = sqlite_bpe::engine().counters();
    println!("ready");
    std::io::stdout().flush().unwrap();
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).unwrap();
    static STOPPED: AtomicBool = AtomicBool::new(false);
    pause::set_hook(Some(Box::new(|name| {
        if name == WAL_READ_MARK_LOCKED && !STOPPED.swap(true, Ordering::SeqCst) {
            // SAFETY: raise has no memory preconditions; the parent continues us.
            unsafe { libc::raise(libc::SIGSTOP) };
        }
    })));
    let (rows, sum) = read(&conn);
    pause::set_hook(None);
    let after = sqlite_bpe::engine().counters();
    // The next read transaction, once its look for writes outside SQLite's protocol is due
    // (one a millisecond at most: `OUTSIDE_WRITE_CHECK_INTERVAL`): the backfill was accounted
    // by the first read's look, so it is no such write.
    std::thread::sleep(Duration::from_millis(10));
    read(&conn);
    let next = sqlite_bpe::engine().counters();
    println!(
        "after rows={rows} sum={sum} stopped={} whole={} pages={} next_whole={}",
        STOPPED.load(Ordering::SeqCst),
        after.file_invalidations - before.file_invalidations,
        after.pages_forgotten - before.pages_forgotten,
        next.file_invalidations - after.file_invalidations,
    );
}

/// The reader's process, killed if a failed assertion leaves it behind (stopped, it would hold
/// its read mark and this binary's output pipe).
struct Reader {
    child: Child,
    out: BufReader<ChildStdout>,
    reaped: bool,
}

impl Reader {
    fn start(db: &Path) -> Reader {
        let mut child = child_command(CHILD, &db.to_string_lossy())
            .env_remove("BPE_PAUSE_AT")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        // The harness's "test child_entry ... " precedes the child's first line.
        while !line.trim_end().ends_with("ready") {
            line.clear();
            let n = out.read_line(&mut line).unwrap();
            assert!(n > 0, "the reader ended before it was ready");
        }
        Reader {
            child,
            out,
            reaped: false,
        }
    }

    fn go(&mut self) {
        let stdin = self.child.stdin.as_mut().unwrap();
        stdin.write_all(b"go\n").unwrap();
        stdin.flush().unwrap();
    }

    /// Waits until the reader stops (at its pause point). The deadline only turns a hang into a
    /// failure.
    fn wait_stopped(&mut self) {
        let pid = self.child.id() as libc::pid_t;
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let mut status = 0;
            // SAFETY: waitpid on our own child, with a status it writes into.
            let r = unsafe { libc::waitpid(pid, &mut status, libc::WUNTRACED | libc::WNOHANG) };
            assert!(r >= 0, "waitpid: {}", std::io::Error::last_os_error());
            if r == pid {
                assert!(
                    libc::WIFSTOPPED(status),
                    "the reader ended without reaching its pause point (wait status {status:#x})"
                );
                return;
            }
            assert!(Instant::now() < deadline, "the reader never stopped");
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    fn resume(&mut self) {
        // SAFETY: kill with a signal number, to our own child.
        assert_eq!(
            unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGCONT) },
            0
        );
    }

    /// The reader's result line, once it exited with success.
    fn finish(&mut self) -> String {
        let mut rest = String::new();
        std::io::Read::read_to_string(&mut self.out, &mut rest).unwrap();
        let status = self.child.wait().unwrap();
        self.reaped = true;
        assert!(status.success(), "the reader failed: {status}\n{rest}");
        rest.lines()
            .find(|l| l.contains("after rows="))
            .unwrap_or_else(|| panic!("no result from the reader: {rest}"))
            .to_owned()
    }
}

impl Drop for Reader {
    fn drop(&mut self) {
        if !self.reaped {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn field(line: &str, key: &str) -> i64 {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key))
        .map(|v| match v {
            "true" => 1,
            "false" => 0,
            v => v.parse().unwrap(),
        })
        .unwrap_or_else(|| panic!("no {key} in {line}"))
}

#[test]
fn a_checkpoint_between_the_read_mark_lock_and_the_first_read_is_never_served_stale() {
    for page_size in [4096, 16384] {
        let dir = tempdir();
        let db = dir.path().join("wal.db");
        // This process is plain SQLite: it never registers bpe.
        let writer = open_unix(&db);
        writer
            .execute_batch(&format!(
                "PRAGMA page_size = {page_size};
                 PRAGMA journal_mode = WAL;
                 PRAGMA wal_autocheckpoint = 0;
                 CREATE TABLE t(id INTEGER PRIMARY KEY, n INTEGER, pad TEXT);
                 WITH RECURSIVE k(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM k WHERE i < {ROWS})
                 INSERT INTO t SELECT i, 0, hex(randomblob(140)) FROM k;"
            ))
            .unwrap();
        // Every frame backfilled: the reader reads (and caches) the table from the file.
        let (busy, log, done): (i64, i64, i64) = writer
            .query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?))
            })
            .unwrap();
        assert_eq!(
            (busy, done),
            (0, log),
            "{page_size}: the setup's checkpoint"
        );

        let mut reader = Reader::start(&db);
        // The new rows are WAL frames only (the writer restarts the WAL): the file, and the
        // reader's cache of it, are unchanged, and the reader's look at its lock finds nothing
        // to forget.
        let updated = writer.execute("UPDATE t SET n = 1", []).unwrap();
        assert_eq!(updated as i64, ROWS);
        reader.go();
        reader.wait_stopped();
        // The reader holds a read mark at the last frame: a PASSIVE checkpoint backfills them all
        // (read mark 0, which would bar it, is taken only when nothing waits).
        let (busy, log, done): (i64, i64, i64) = writer
            .query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?))
            })
            .unwrap();
        assert!(
            busy == 0 && log > 0 && done == log,
            "{page_size}: the checkpoint did not backfill every frame past the stopped reader \
             (busy {busy}, log {log}, checkpointed {done})"
        );
        reader.resume();
        let line = reader.finish();
        println!("{page_size}: {line}");
        assert_eq!(field(&line, "stopped="), 1, "{page_size}: {line}");
        assert_eq!(field(&line, "rows="), ROWS, "{page_size}: {line}");
        assert_eq!(
            field(&line, "sum="),
            ROWS,
            "{page_size}: the reader was served pages older than the backfill it read them \
             after ({line})"
        );
        assert_eq!(
            field(&line, "whole="),
            0,
            "{page_size}: the reader forgot the whole file, which hides the race ({line})"
        );
        assert!(
            field(&line, "pages=") > 0,
            "{page_size}: no backfilled page was forgotten ({line})"
        );
        assert_eq!(
            field(&line, "next_whole="),
            0,
            "{page_size}: the next read transaction forgot the whole file: the backfill's new \
             stamp was taken for a write outside SQLite's protocol ({line})"
        );
        drop(writer);
    }
}
