//! Crashes: a real process using bpe is killed with SIGKILL at a random moment, and nothing it
//! reported committed may be lost, and nothing may be torn.
//!
//! The child is this test binary re-executed (`child_entry`, told what to do by environment
//! variables). It opens a bpe database (WAL and rollback journal, alternately), with 1 MB of max
//! server memory and a 4 MB extension enabled by `BPE_EXTENSION_FILE`/`BPE_EXTENSION_SIZE`, and
//! commits transactions that insert rows carrying a sequence number and a checksum, rewrite an
//! older row, and log the transaction in `txlog`; after each COMMIT returns it writes the sequence
//! number to stdout. Meanwhile other threads scan and verify the table (pushing pages through
//! the extension), checkpoint the WAL, and turn the extension on, off and resize it with
//! `bpe_exec`. The parent kills it after 50..800 ms (seeded, printed; `BPE_CRASH_SEED` repeats
//! the delays, `BPE_CRASH_ITERATIONS` runs longer), then checks the database through the plain
//! unix VFS and through bpe, in alternating order (so that each recovers a hot journal or WAL
//! first, half of the time): `PRAGMA integrity_check`, every reported sequence number present,
//! every transaction whole, every row's checksum right.
//!
//! The extension file a killed process leaves behind is taken over by the next one to enable an
//! extension at that path (warm restart: only pages of files provably unchanged are served, see
//! `restart.rs`), while a file another live extension holds, or any file that is not a dead
//! extension of ours, is refused and left as it was (see the last test). The children
//! checkpoint their index every 50 ms, so that kills land after checkpoints.
//!
//! Not covered: power loss (the kernel survives a SIGKILL, so what reached it is durable;
//! `synchronous` is NORMAL here to keep the loop fast).

mod common;
mod rows;

use bpe_core::Sharing;
use common::*;
use rand::{rngs::StdRng, Rng, SeedableRng};
use rusqlite::Connection;
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{mpsc, Mutex, MutexGuard};
use std::time::Duration;

static SERIAL: Mutex<()> = Mutex::new(());

const CHILD: &str = "BPE_CRASH_CHILD";
const DB: &str = "BPE_CRASH_DB";
const JOURNAL: &str = "BPE_CRASH_JOURNAL";
const SEED: &str = "BPE_CRASH_CHILD_SEED";
const EXT_SIZE: &str = "4MB";
const MARKER: &str = "sqlite-bpe crash test marker: this text is in the database";

fn serial() -> MutexGuard<'static, ()> {
    let guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    sqlite_bpe::register().expect("register");
    let _ = sqlite_bpe::engine().disable_extension();
    guard
}

/// A database with the schema and about 1.2 MB of rows (sequence number 0), made with plain SQLite.
fn create_db(path: &Path, journal: &str) {
    let c = open_unix(path);
    c.execute_batch(&format!(
        "PRAGMA journal_mode = {journal};
         CREATE TABLE rows(id INTEGER PRIMARY KEY, seq INTEGER NOT NULL, payload BLOB NOT NULL,
                           crc INTEGER NOT NULL);
         CREATE INDEX rows_seq ON rows(seq);
         CREATE TABLE txlog(seq INTEGER PRIMARY KEY, nrows INTEGER NOT NULL);
         CREATE TABLE note(t TEXT NOT NULL);
         INSERT INTO note VALUES ('{MARKER}');
         BEGIN;"
    ))
    .unwrap();
    for id in 1..=1500u64 {
        let p = rows::payload(id, 300 + (id as usize * 53) % 1000);
        c.execute(
            "INSERT INTO rows(id, seq, payload, crc) VALUES (?1, 0, ?2, ?3)",
            rusqlite::params![id, p, rows::crc32(&p)],
        )
        .unwrap();
    }
    c.execute_batch("INSERT INTO txlog VALUES (0, 1500); COMMIT;")
        .unwrap();
}

// ---------------------------------------------------------------------------------------------
// The child.

/// Not a test: the body of the child processes (does nothing unless BPE_CRASH_CHILD is set).
#[test]
#[ignore = "run by the crash tests as a child process"]
fn child_entry() {
    let Some(mode) = child_mode(CHILD) else {
        return;
    };
    match mode.as_str() {
        "work" => child_work(),
        "hold" => child_hold(),
        "register" => child_register(),
        other => panic!("unknown child mode {other}"),
    }
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}").unwrap();
    out.flush().unwrap();
}

fn env_path(name: &str) -> PathBuf {
    PathBuf::from(std::env::var(name).unwrap())
}

fn connect(db: &Path) -> Connection {
    let c = open_bpe(db);
    c.busy_timeout(Duration::from_secs(60)).unwrap();
    c.execute_batch("PRAGMA cache_size = 1; PRAGMA synchronous = NORMAL;")
        .unwrap();
    c
}

/// Checks every row's checksum, and that the rows match the transaction log, in one snapshot.
fn child_verify(c: &Connection) {
    c.execute_batch("BEGIN").unwrap();
    let logged: i64 = c
        .query_row("SELECT sum(nrows) FROM txlog", [], |r| r.get(0))
        .unwrap();
    let mut stmt = c
        .prepare_cached("SELECT id, payload, crc FROM rows")
        .unwrap();
    let mut rows = stmt.query([]).unwrap();
    let mut n = 0;
    while let Some(r) = rows.next().unwrap() {
        let id: i64 = r.get(0).unwrap();
        let crc: i64 = r.get(2).unwrap();
        let payload = r.get_ref(1).unwrap().as_blob().unwrap();
        assert_eq!(rows::crc32(payload), crc, "row {id}: bad checksum (live)");
        n += 1;
    }
    drop(rows);
    drop(stmt);
    c.execute_batch("COMMIT").unwrap();
    assert_eq!(n, logged, "rows and txlog disagree (live)");
}

fn child_work() {
    let db = env_path(DB);
    let journal = std::env::var(JOURNAL).unwrap();
    let seed: u64 = std::env::var(SEED).unwrap().parse().unwrap();
    let ext = env_path("BPE_EXTENSION_FILE");
    sqlite_bpe::register().expect("register");
    let writer = connect(&db);
    writer
        .execute_batch(&format!("PRAGMA journal_mode = {journal};"))
        .unwrap();

    // Readers: verify everything, over and over; with 1 MB of RAM this fills the extension.
    let d = db.clone();
    std::thread::spawn(move || {
        let c = connect(&d);
        let mut rng = StdRng::seed_from_u64(seed ^ 0x5ca7);
        for round in 0u64.. {
            if round % 4 == 3 {
                child_verify(&c);
            }
            // Mostly random lookups: scattered misses are served page by page by the extension,
            // where a scan's sequential ones are widened into readahead.
            let max_id: i64 = c
                .query_row("SELECT coalesce(max(id), 1) FROM rows", [], |r| r.get(0))
                .unwrap();
            // One read transaction: in rollback mode, 300 separate ones would mostly wait for
            // the writer.
            c.execute_batch("BEGIN").unwrap();
            for _ in 0..300 {
                let id = rng.gen_range(1..=max_id);
                let (payload, crc): (Vec<u8>, i64) = c
                    .query_row("SELECT payload, crc FROM rows WHERE id = ?1", [id], |r| {
                        Ok((r.get(0)?, r.get(1)?))
                    })
                    .unwrap();
                assert_eq!(rows::crc32(&payload), crc, "row {id}: bad checksum (live)");
            }
            c.execute_batch("COMMIT").unwrap();
            let k = sqlite_bpe::engine().counters();
            say(&format!(
                "EXT {} {} {}",
                k.ext_page_reads, k.ext_checksum_failures, k.ext_io_errors
            ));
            std::thread::sleep(Duration::from_millis(2));
        }
    });
    // Checkpoints (WAL): the pages reach the database file through bpe.
    if journal == "WAL" {
        let d = db.clone();
        std::thread::spawn(move || {
            let c = connect(&d);
            let mut i = 0;
            loop {
                let mode = if i % 8 == 7 { "TRUNCATE" } else { "PASSIVE" };
                let _: i64 = c
                    .query_row(&format!("PRAGMA wal_checkpoint({mode})"), [], |r| r.get(0))
                    .unwrap();
                i += 1;
                std::thread::sleep(Duration::from_millis(5));
            }
        });
    }
    // The operator: extension on, resized, off, buffers dropped, in a loop.
    std::thread::spawn(move || {
        let c = Connection::open_in_memory().unwrap();
        let mut rng = StdRng::seed_from_u64(seed ^ 0xadd);
        let script = [
            extension_on(ext.display(), "6 MB"),
            extension_on(ext.display(), "4 MB"),
            "ALTER SERVER CONFIGURATION SET BUFFER POOL EXTENSION OFF".to_string(),
            extension_on(ext.display(), "4 MB"),
            "DBCC DROPCLEANBUFFERS".to_string(),
        ];
        for statement in script.iter().cycle() {
            if let Err(e) = try_exec(&c, statement) {
                eprintln!("bpe_exec: {e}");
            }
            std::thread::sleep(Duration::from_millis(rng.gen_range(20..200)));
        }
    });

    // The writer: one transaction after another, each reported once COMMIT has returned.
    let mut rng = StdRng::seed_from_u64(seed);
    let mut seq: i64 = writer
        .query_row("SELECT max(seq) FROM txlog", [], |r| r.get(0))
        .unwrap();
    say(&format!("STARTED after {seq}"));
    loop {
        seq += 1;
        writer.execute_batch("BEGIN IMMEDIATE").unwrap();
        let n = rng.gen_range(1..=8);
        for _ in 0..n {
            let p = rows::payload(rng.gen(), rng.gen_range(50..600));
            writer
                .execute(
                    "INSERT INTO rows(seq, payload, crc) VALUES (?1, ?2, ?3)",
                    rusqlite::params![seq, p, rows::crc32(&p)],
                )
                .unwrap();
        }
        // Rewrite an older row: pages cached in either tier get written, too.
        let max_id: i64 = writer
            .query_row("SELECT coalesce(max(id), 1) FROM rows", [], |r| r.get(0))
            .unwrap();
        let p = rows::payload(rng.gen(), rng.gen_range(50..600));
        writer
            .execute(
                "UPDATE rows SET payload = ?1, crc = ?2 WHERE id = ?3",
                rusqlite::params![p, rows::crc32(&p), rng.gen_range(1..=max_id)],
            )
            .unwrap();
        writer
            .execute("INSERT INTO txlog VALUES (?1, ?2)", [seq, n])
            .unwrap();
        writer.execute_batch("COMMIT").unwrap();
        say(&format!("COMMITTED {seq}"));
    }
}

/// Fills the extension, says READY, and waits to be killed.
fn child_hold() {
    let db = env_path(DB);
    sqlite_bpe::register().expect("register");
    let c = connect(&db);
    for _ in 0..3 {
        let t: String = c.query_row("SELECT t FROM note", [], |r| r.get(0)).unwrap();
        assert_eq!(t, MARKER);
        child_verify(&c);
    }
    assert!(sqlite_bpe::engine().wait_for_extension_writes(Duration::from_secs(30)));
    // Several checkpoint intervals: the index as it is now is in the file.
    std::thread::sleep(Duration::from_secs(1));
    let k = sqlite_bpe::engine().counters();
    say(&format!(
        "READY {} pages, {} checkpoints",
        k.ext_allocated_pages, k.ext_checkpoints
    ));
    std::thread::sleep(Duration::from_secs(120));
}

/// Reports whether this process could set up bpe and open the database through it.
fn child_register() {
    match sqlite_bpe::register() {
        Ok(()) => say("REGISTER OK"),
        Err(e) => say(&format!("REGISTER ERR {e}")),
    }
    let db = env_path(DB);
    let conn = Connection::open_with_flags(format!("file:{}?vfs=bpe", db.display()), flags());
    match conn.as_ref().map_err(|e| e.to_string()).and_then(|c| {
        c.query_row("SELECT count(*) FROM txlog", [], |r| r.get::<_, i64>(0))
            .map_err(|e| e.to_string())
    }) {
        Ok(n) => say(&format!("OPEN OK {n}")),
        Err(e) => say(&format!("OPEN ERR {e}")),
    }
    // With the database still open: the pages a restore finds are adopted for open files (a
    // file opened and closed while the restore ran is adopted at its next open).
    if let (Some(engine), Ok(c)) = (sqlite_bpe::existing_engine(), conn.as_ref()) {
        engine.wait_for_extension_restore(Duration::from_secs(30));
        let k = engine.counters();
        say(&format!(
            "RESTORED {} NOT {}",
            k.ext_pages_restored, k.ext_pages_not_restored
        ));
        child_verify(c);
    }
}

// ---------------------------------------------------------------------------------------------
// The parent.

struct Child {
    process: std::process::Child,
    lines: mpsc::Receiver<String>,
    stderr: std::thread::JoinHandle<String>,
}

/// A child with the extension `ext` from the environment: shared (the default) unless
/// `sharing` is Private.
fn spawn_child(
    mode: &str,
    db: &Path,
    journal: &str,
    ext: &Path,
    seed: u64,
    sharing: Sharing,
) -> Child {
    let shared = if sharing == Sharing::Shared { "1" } else { "0" };
    let mut process = child_command(CHILD, mode)
        .env("BPE_EXTENSION_SHARED", shared)
        .env(DB, db)
        .env(JOURNAL, journal)
        .env(SEED, seed.to_string())
        .env("BPE_MAX_SERVER_MEMORY_MB", "1")
        .env("BPE_EXTENSION_FILE", ext)
        .env("BPE_EXTENSION_SIZE", EXT_SIZE)
        .env("BPE_EXTENSION_CHECKPOINT_MS", "50")
        // Half the children keep rollback-mode page writes in RAM until the sync or unlock
        // (write-behind, opt-in), half write them through.
        .env(
            "BPE_WRITE_BEHIND",
            if seed.is_multiple_of(2) { "1" } else { "0" },
        )
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, lines) = mpsc::channel();
    let mut out = BufReader::new(process.stdout.take().unwrap());
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        // Only whole lines count: the last one may have been cut by the kill.
        while out.read_until(b'\n', &mut buf).unwrap_or(0) > 0 && buf.ends_with(b"\n") {
            let _ = tx.send(String::from_utf8_lossy(&buf).trim_end().to_string());
            buf.clear();
        }
    });
    let mut err = process.stderr.take().unwrap();
    let stderr = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    Child {
        process,
        lines,
        stderr,
    }
}

impl Child {
    /// SIGKILLs the child, which must still be running; returns its whole output lines.
    fn kill(mut self) -> Vec<String> {
        if let Some(status) = self.process.try_wait().unwrap() {
            panic!(
                "the child ended by itself ({status}) before the kill:\n{}",
                self.stderr.join().unwrap()
            );
        }
        self.process.kill().unwrap(); // SIGKILL
        let status = self.process.wait().unwrap();
        let stderr = self.stderr.join().unwrap();
        assert_eq!(status.signal(), Some(libc::SIGKILL), "{status}:\n{stderr}");
        assert!(!stderr.contains("CHILD PANIC"), "{stderr}");
        self.lines.iter().collect()
    }

    /// Waits for a line starting with `prefix` (the child must not die first).
    fn wait_for(&mut self, prefix: &str) -> String {
        loop {
            match self.lines.recv_timeout(Duration::from_secs(120)) {
                Ok(line) if line.contains(prefix) => return line,
                Ok(_) => {}
                Err(e) => {
                    let _ = self.process.kill();
                    panic!("no '{prefix}' from the child ({e})");
                }
            }
        }
    }

    fn finish(self) -> (Vec<String>, String) {
        let output = self.process.wait_with_output().unwrap();
        assert!(output.status.success(), "{}", output.status);
        (self.lines.iter().collect(), self.stderr.join().unwrap())
    }
}

/// The sequence numbers in the child's "COMMITTED n" lines.
fn committed(lines: &[String]) -> Vec<i64> {
    lines
        .iter()
        .filter_map(|l| l.split_once("COMMITTED ").map(|(_, n)| n))
        .map(|n| n.parse().unwrap_or_else(|_| panic!("bad line {n:?}")))
        .collect()
}

/// The child's last extension counters: (page reads, checksum failures, I/O errors).
fn extension_counters(lines: &[String]) -> (u64, u64, u64) {
    lines
        .iter()
        .rev()
        .find_map(|l| l.split_once("EXT ").map(|(_, v)| v))
        .map_or((0, 0, 0), |v| {
            let n: Vec<u64> = v.split(' ').map(|x| x.parse().unwrap()).collect();
            (n[0], n[1], n[2])
        })
}

/// Checks the database after a crash through one connection; returns the last sequence number.
fn check_db(c: &Connection, label: &str, reported: &[i64], before: i64) -> i64 {
    let integrity: Vec<String> = c
        .prepare("PRAGMA integrity_check")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(integrity, ["ok"], "{label}: integrity_check");

    let log: Vec<(i64, i64)> = c
        .prepare("SELECT seq, nrows FROM txlog ORDER BY seq")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    for (i, (seq, _)) in log.iter().enumerate() {
        assert_eq!(
            *seq, i as i64,
            "{label}: transaction {i} missing from txlog"
        );
    }
    let last = log.last().unwrap().0;
    // Durable: every transaction reported committed is there.
    let last_reported = reported.iter().copied().max().unwrap_or(before);
    assert!(
        last >= last_reported,
        "{label}: transaction {last_reported} was reported committed, the database ends at {last}"
    );
    // At most the one transaction whose COMMIT returned just before the kill is unreported.
    assert!(
        last <= last_reported + 1,
        "{label}: {last} transactions, {last_reported} reported"
    );

    // Whole: each transaction has exactly its rows; no rows of a transaction that is not there.
    let mut counts: HashMap<i64, i64> = c
        .prepare("SELECT seq, count(*) FROM rows GROUP BY seq")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    for (seq, nrows) in &log {
        assert_eq!(
            counts.remove(seq),
            Some(*nrows),
            "{label}: transaction {seq} is not whole"
        );
    }
    assert!(
        counts.is_empty(),
        "{label}: rows of uncommitted transactions: {counts:?}"
    );

    // Not torn: every row matches its checksum.
    let mut stmt = c.prepare("SELECT id, payload, crc FROM rows").unwrap();
    let mut q = stmt.query([]).unwrap();
    while let Some(r) = q.next().unwrap() {
        let id: i64 = r.get(0).unwrap();
        let crc: i64 = r.get(2).unwrap();
        assert_eq!(
            rows::crc32(r.get_ref(1).unwrap().as_blob().unwrap()),
            crc,
            "{label}: row {id} does not match its checksum"
        );
    }
    last
}

#[test]
fn sigkill_at_random_moments_loses_no_committed_transaction() {
    let _s = serial();
    let iterations: usize = std::env::var("BPE_CRASH_ITERATIONS")
        .ok()
        .map_or(20, |v| v.parse().expect("BPE_CRASH_ITERATIONS"));
    let seed = crash_seed();
    println!("{iterations} iterations, BPE_CRASH_SEED={seed}");
    let mut rng = StdRng::seed_from_u64(seed);
    let dir = tempdir();
    let dbs = [
        (dir.path().join("wal.db"), "WAL"),
        (dir.path().join("rollback.db"), "DELETE"),
    ];
    for (db, journal) in &dbs {
        create_db(db, journal);
    }
    let mut last = [0i64; 2];
    // This process reads through bpe with as little memory as the children.
    let admin = Connection::open_in_memory().unwrap();
    exec(&admin, "EXEC sp_configure 'max server memory (MB)', 1");
    let (mut total, mut stale, mut total_ext_reads) = (0, 0, 0);

    for i in 0..iterations {
        let which = i % 2;
        let (db, journal) = &dbs[which];
        let ext = dir.path().join(format!("ext-{i}.bpe"));
        let delay = rng.gen_range(50..=800);
        let child = spawn_child("work", db, journal, &ext, rng.gen(), Sharing::Shared);
        std::thread::sleep(Duration::from_millis(delay));
        let lines = child.kill();
        let reported = committed(&lines);
        total += reported.len();
        let (ext_reads, checksum_failures, io_errors) = extension_counters(&lines);
        total_ext_reads += ext_reads;
        println!(
            "iteration {i}: {journal}, killed after {delay} ms, {} commits reported after {}, \
             {ext_reads} extension page reads",
            reported.len(),
            last[which]
        );
        // Turning the extension on, off and resizing it under load is not a fault.
        assert_eq!(
            (checksum_failures, io_errors),
            (0, 0),
            "iteration {i}: extension faults while nothing was wrong"
        );
        if let Some(first) = reported.first() {
            assert_eq!(
                *first,
                last[which] + 1,
                "the child did not start where it should"
            );
        }

        // Recover and check through each VFS; which one recovers first alternates.
        let bpe_first = (i / 2) % 2 == 1;
        for use_bpe in [bpe_first, !bpe_first] {
            let (c, label) = if use_bpe {
                (open_bpe(db), format!("{journal}, iteration {i}, bpe VFS"))
            } else {
                (open_unix(db), format!("{journal}, iteration {i}, unix VFS"))
            };
            c.execute_batch("PRAGMA cache_size = 1").unwrap();
            let end = check_db(&c, &label, &reported, last[which]);
            if use_bpe == bpe_first {
                last[which] = end;
            } else {
                assert_eq!(end, last[which], "{label}: the VFSs disagree");
            }
        }

        // The extension file the killed process left behind, if it had one at that moment.
        if std::fs::symlink_metadata(&ext).is_ok() {
            stale += 1;
            check_left_extension_is_taken_over(&admin, &ext, db);
        }
    }
    println!(
        "{total} commits reported in all, {total_ext_reads} extension page reads; \
         {stale} extension files left behind"
    );
    assert!(
        total > 0,
        "no child ever committed: the test tested nothing"
    );
    assert!(total_ext_reads > 0, "no child ever read from its extension");
}

/// Enabling an extension at the path of one a killed process left takes the file over: the
/// database reads right through it (pages of files changed since are not restored), and OFF then
/// deletes it. The one exception: a process killed between creating the file and tagging it
/// (microseconds) leaves a file that cannot be told from a foreign one, which is then refused
/// and left as it was. Either way the left-over file was private.
fn check_left_extension_is_taken_over(admin: &Connection, ext: &Path, db: &Path) {
    let meta = std::fs::symlink_metadata(ext).unwrap();
    assert_eq!(
        meta.permissions().mode() & 0o777,
        0o600,
        "the extension holds pages in the clear: it must be private"
    );
    let bytes = std::fs::read(ext).unwrap();
    match try_exec(admin, &extension_on(ext.display(), EXT_SIZE)) {
        Ok(out) => {
            assert!(out.contains("enabled"), "{out}");
            let engine = sqlite_bpe::engine();
            assert!(engine.wait_for_extension_restore(Duration::from_secs(30)));
            let c = open_bpe(db);
            c.busy_timeout(Duration::from_secs(60)).unwrap();
            c.execute_batch("PRAGMA cache_size = 1").unwrap();
            // Twice: the second time, what the first read from the taken-over file is in RAM.
            child_verify(&c);
            child_verify(&c);
            let now = std::fs::symlink_metadata(ext).unwrap();
            assert_eq!(now.permissions().mode() & 0o777, 0o600);
            exec(
                admin,
                "ALTER SERVER CONFIGURATION SET BUFFER POOL EXTENSION OFF",
            );
            assert!(!ext.exists(), "disabling left the file");
        }
        Err(err) => {
            assert!(
                err.contains("already exists") && err.contains("never overwrites"),
                "{err}"
            );
            assert!(
                std::fs::read(ext).unwrap() == bytes,
                "a refused enable changed the file"
            );
            std::fs::remove_file(ext).unwrap();
        }
    }
    let state: String = admin
        .query_row(
            "SELECT state_description FROM bpe_extension_configuration",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(state, "BUFFER POOL EXTENSION DISABLED");
}

/// A private extension (`SHARED = OFF`): a shared one is joined, not refused, while its
/// process lives (shared.rs).
#[test]
fn an_extension_file_left_by_a_killed_process_is_taken_over_and_a_live_one_refused() {
    let _s = serial();
    let dir = tempdir();
    let db = dir.path().join("stale.db");
    create_db(&db, "DELETE");
    let ext = dir.path().join("stale.bpe");
    let admin = Connection::open_in_memory().unwrap();
    exec(&admin, "EXEC sp_configure 'max server memory (MB)', 1");

    let mut child = spawn_child("hold", &db, "DELETE", &ext, 0, Sharing::Private);
    let ready = child.wait_for("READY ");
    let pages = ready.split_once("READY ").unwrap().1.to_string();
    println!("the child has {pages} in its extension");

    // While its process lives, the file is another extension's: refused, untouched.
    let live = std::fs::read(&ext).unwrap();
    let private_on = format!(
        "{}, SHARED = OFF)",
        extension_on(ext.display(), EXT_SIZE).trim_end_matches(')')
    );
    let err = try_exec(&admin, &private_on).unwrap_err();
    assert!(err.contains("another process"), "{err}");
    assert!(
        std::fs::read(&ext).unwrap() == live,
        "a live extension was touched"
    );

    child.kill();
    // SIGKILL runs no exit handler: the file stays, private, at its full size, and holds pages
    // of the database in the clear until it is replaced.
    let meta = std::fs::symlink_metadata(&ext).expect("no extension file left behind");
    assert!(
        meta.len() <= 4 << 20 && meta.len() > 3 << 20,
        "{}",
        meta.len()
    );
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    let bytes = std::fs::read(&ext).unwrap();
    assert!(
        bytes.windows(MARKER.len()).any(|w| w == MARKER.as_bytes()),
        "the extension should hold the database's text"
    );

    // A new process configured by the environment to use that path takes the file over, opens
    // its database through bpe warm (nothing changed it), and leaves the file when it exits.
    let (lines, stderr) =
        spawn_child("register", &db, "DELETE", &ext, 0, Sharing::Private).finish();
    assert!(
        lines.iter().any(|l| l.ends_with("REGISTER OK"))
            && lines.iter().any(|l| l.ends_with("OPEN OK 1")),
        "{lines:?} {stderr}"
    );
    let restored: u64 = lines
        .iter()
        .find_map(|l| {
            l.split_once("RESTORED ")
                .and_then(|(_, n)| n.split(' ').next()?.parse().ok())
        })
        .unwrap_or_else(|| panic!("{lines:?} {stderr}"));
    assert!(
        restored > 0,
        "the new process started cold: {lines:?} {stderr}"
    );
    assert!(ext.exists(), "a clean exit removed the extension file");
    check_db(&open_unix(&db), "after hold", &[], 0);

    // A file at the path that is not a (dead) extension of ours is refused and kept as it is,
    // in the environment (the VFS still works, the reason is in last_failure) and in SQL.
    std::fs::remove_file(&ext).unwrap();
    std::fs::write(&ext, b"not an extension").unwrap();
    let (lines, stderr) =
        spawn_child("register", &db, "DELETE", &ext, 0, Sharing::Private).finish();
    assert!(
        lines.iter().any(|l| l.ends_with("REGISTER OK"))
            && lines.iter().any(|l| l.ends_with("OPEN OK 1")),
        "a refused extension must not take bpe down: {lines:?} {stderr}"
    );
    let err = try_exec(&admin, &private_on).unwrap_err();
    assert!(err.contains("already exists"), "{err}");
    assert_eq!(std::fs::read(&ext).unwrap(), b"not an extension");
}
