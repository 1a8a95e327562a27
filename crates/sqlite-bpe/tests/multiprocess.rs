//! Many processes on one database, whoever writes: four processes using bpe (2-8 MB of memory,
//! so pages churn through L1; two with an extension, each at its own path; one whose threads
//! close and reopen their connections, so that at times it has none; one that only reads, so it
//! never takes the WAL's write or checkpoint lock) and one plain SQLite process (the unix VFS),
//! each with two readers and (but the reading one) a writer, for a few seconds, in
//! rollback-journal and in WAL mode (where every writer also checkpoints, in every mode, and each
//! process has its own autocheckpoint), while the test SIGKILLs them at random moments (seeded)
//! and starts them again.
//!
//! The database keeps invariants that a stale page breaks:
//!
//! - `acct`: balances that always sum to a constant (every transfer moves an amount between two
//!   accounts in one transaction), and `blob`, a second copy of each balance next to a 0.8-2.4 KB
//!   payload and a checksum of both (rewritten with each transfer: the table is ~3 MB, so pages
//!   churn through a 2 MB pool and its extension). Every copy must equal its account's balance.
//! - `log`: an append-only commit log: each writer appends (writer, seq), seq = 1, 2, ... in the
//!   transaction of its transfer, and `meta.commits` counts them. After COMMIT returns, the writer
//!   appends seq to a side file outside the database (fsync'd), and publishes it in a small shared
//!   memory file.
//!
//! Every reader checks, in each read transaction (autocommit SELECTs and explicit BEGIN ... COMMIT
//! transactions), that the sum holds, the copies agree, the checksums are right, the log is whole
//! (each writer's seqs are 1..max) and as long as `meta.commits` says; that its view of the log
//! never goes backwards; and that every commit a writer had published before the read began is
//! there (a process that served a page from before another process's commit fails this even when
//! all its pages are consistently old). Any error but SQLITE_BUSY, in a reader or a writer, fails
//! the child, which aborts; the test fails on any child that ends by itself.
//!
//! At the end: `PRAGMA integrity_check` through both VFSs, the invariants, and every commit a
//! writer recorded as done is in the log.
//!
//! With the invalidations of `FileWatch::begin_read`/`begin_read_wal` disabled, both tests fail
//! within seconds (a broken sum, a commit missing from a later snapshot, a log shorter than
//! `meta.commits`); so they do with the WAL accounting of foreign backfills disabled.
//!
//! `BPE_MP_SECONDS` (default 8 per journal mode) runs longer, `BPE_MP_SEED` repeats a run's
//! kill schedule and choices.

mod common;
mod rows;

use common::*;
use rand::{rngs::StdRng, Rng, SeedableRng};
use rusqlite::{params, Connection, ErrorCode};
use std::io::{Read, Write};
use std::os::unix::io::AsRawFd;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::time::{Duration, Instant};

static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

const ACCOUNTS: i64 = 2000;
const BALANCE: i64 = 1000;
const PAD: std::ops::Range<usize> = 800..2400;
const SECONDS: u64 = 8;
/// A child that has done nothing for this long is hung (busy timeouts are 10 s).
const STALL: Duration = Duration::from_secs(40);

/// What one child process is.
struct Role {
    name: &'static str,
    bpe: bool,
    memory_mb: u32,
    extension: bool,
    /// `PRAGMA wal_autocheckpoint` (WAL mode): each process checkpoints at its own pace.
    autocheckpoint: u32,
    /// Has a writer (a process with none never takes the WAL's write or checkpoint lock).
    writer: bool,
    /// Each thread closes its connection after half of its transactions and opens a new one:
    /// at times the process has no connection to the database (a reopen after others wrote).
    short_lived: bool,
}

const ROLES: [Role; 5] = [
    Role {
        name: "bpe 2 MB + extension",
        bpe: true,
        memory_mb: 2,
        extension: true,
        autocheckpoint: 40,
        writer: true,
        short_lived: false,
    },
    Role {
        name: "bpe 4 MB, short-lived connections",
        bpe: true,
        memory_mb: 4,
        extension: false,
        autocheckpoint: 200,
        writer: true,
        short_lived: true,
    },
    Role {
        name: "bpe 2 MB + extension (2)",
        bpe: true,
        memory_mb: 2,
        extension: true,
        autocheckpoint: 1000,
        writer: true,
        short_lived: false,
    },
    Role {
        name: "bpe 8 MB, readers only",
        bpe: true,
        memory_mb: 8,
        extension: false,
        autocheckpoint: 1000,
        writer: false,
        short_lived: false,
    },
    Role {
        name: "plain SQLite",
        bpe: false,
        memory_mb: 0,
        extension: false,
        autocheckpoint: 100,
        writer: true,
        short_lived: false,
    },
];
const SLOTS: usize = ROLES.len();

// ---------------------------------------------------------------------------------------------
// Memory shared by the test and every child: a file mapped MAP_SHARED.

/// Word 0: stop. Then 8 words per slot (fields below), at 8 + 8 * slot.
struct Shared {
    words: *const AtomicU64,
}

// SAFETY: the mapping lives for the process (never unmapped); the words are atomics.
unsafe impl Sync for Shared {}
unsafe impl Send for Shared {}

const STOP: usize = 0;
/// The writer's last seq whose COMMIT returned (and is in its side file).
const DONE: usize = 0;
/// Bumped by every finished read or write: progress.
const ACTIVITY: usize = 1;
const READS: usize = 2;
const WRITES: usize = 3;
const BUSY: usize = 4;
const INVALIDATIONS: usize = 5;
const EXT_READS: usize = 6;
const CHECKPOINTS: usize = 7;

impl Shared {
    const BYTES: usize = 4096;

    fn create(path: &Path) {
        std::fs::write(path, vec![0u8; Self::BYTES]).unwrap();
    }

    fn map(path: &Path) -> &'static Shared {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .unwrap();
        // SAFETY: a fresh shared mapping of a file of BYTES bytes; never unmapped.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                Self::BYTES,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                f.as_raw_fd(),
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED, "mmap");
        Box::leak(Box::new(Shared {
            words: p as *const AtomicU64,
        }))
    }

    fn word(&self, i: usize) -> &AtomicU64 {
        assert!(i < Self::BYTES / 8);
        // SAFETY: in bounds of the live mapping, 8-byte aligned (page-aligned base).
        unsafe { &*self.words.add(i) }
    }

    fn slot(&self, slot: usize, field: usize) -> &AtomicU64 {
        self.word(8 + 8 * slot + field)
    }

    fn stopping(&self) -> bool {
        self.word(STOP).load(SeqCst) != 0
    }

    /// Every writer's last published seq.
    fn progress(&self) -> [i64; SLOTS] {
        std::array::from_fn(|w| self.slot(w, DONE).load(SeqCst) as i64)
    }
}

// ---------------------------------------------------------------------------------------------
// The database.

fn blob_crc(pad: &[u8], balance: i64) -> i64 {
    let mut v = pad.to_vec();
    v.extend_from_slice(&balance.to_le_bytes());
    rows::crc32(&v)
}

fn create_db(path: &Path, journal: &str) {
    let c = open_unix(path);
    c.execute_batch(&format!(
        "PRAGMA journal_mode = {journal};
         CREATE TABLE acct(id INTEGER PRIMARY KEY, balance INTEGER NOT NULL);
         CREATE TABLE blob(id INTEGER PRIMARY KEY, balance INTEGER NOT NULL, pad BLOB NOT NULL,
                           crc INTEGER NOT NULL);
         CREATE TABLE log(id INTEGER PRIMARY KEY, writer INTEGER NOT NULL, seq INTEGER NOT NULL,
                          a INTEGER NOT NULL, b INTEGER NOT NULL, amount INTEGER NOT NULL,
                          UNIQUE(writer, seq));
         CREATE TABLE meta(k INTEGER PRIMARY KEY, commits INTEGER NOT NULL);
         INSERT INTO meta VALUES (1, 0);"
    ))
    .unwrap();
    let tx = c.unchecked_transaction().unwrap();
    for id in 1..=ACCOUNTS {
        let pad = rows::payload(id as u64, PAD.start + (id as usize * 97) % PAD.len());
        tx.execute("INSERT INTO acct VALUES (?1, ?2)", [id, BALANCE])
            .unwrap();
        tx.execute(
            "INSERT INTO blob VALUES (?1, ?2, ?3, ?4)",
            params![id, BALANCE, pad, blob_crc(&pad, BALANCE)],
        )
        .unwrap();
    }
    tx.commit().unwrap();
}

fn done_path(dir: &Path, slot: usize) -> PathBuf {
    dir.join(format!("done-{slot}.txt"))
}

fn is_busy(e: &rusqlite::Error) -> bool {
    e.sqlite_error_code() == Some(ErrorCode::DatabaseBusy)
}

// ---------------------------------------------------------------------------------------------
// The child.

const CHILD: &str = "BPE_MP_CHILD";
const CHILD_DIR: &str = "BPE_MP_DIR";
const CHILD_SEED: &str = "BPE_MP_CHILD_SEED";
const CHILD_WAL: &str = "BPE_MP_WAL";

/// Not a test: the body of the child processes (does nothing unless BPE_MP_CHILD is set).
#[test]
#[ignore = "run by the multiprocess tests as a child process"]
fn child_entry() {
    let Some(slot) = child_mode(CHILD) else {
        return;
    };
    let dir = PathBuf::from(std::env::var(CHILD_DIR).unwrap());
    let ctx = Ctx {
        slot: slot.parse().unwrap(),
        db: dir.join("mp.db"),
        wal: std::env::var(CHILD_WAL).unwrap() == "1",
        shared: Shared::map(&dir.join("shared")),
        seed: std::env::var(CHILD_SEED).unwrap().parse().unwrap(),
        dir,
    };
    child(&ctx);
}

struct Ctx {
    slot: usize,
    dir: PathBuf,
    db: PathBuf,
    wal: bool,
    shared: &'static Shared,
    seed: u64,
}

impl Ctx {
    fn role(&self) -> &'static Role {
        &ROLES[self.slot]
    }

    fn bump(&self, field: usize) {
        self.shared.slot(self.slot, field).fetch_add(1, SeqCst);
    }

    fn connect(&self) -> Connection {
        let c = if self.role().bpe {
            open_bpe(&self.db)
        } else {
            open_unix(&self.db)
        };
        c.busy_timeout(Duration::from_secs(10)).unwrap();
        // SQLite's own cache holds a few pages: reads go to the VFS (and the pool).
        c.execute_batch("PRAGMA cache_size = 4").unwrap();
        if self.wal {
            c.execute_batch(&format!(
                "PRAGMA wal_autocheckpoint = {}",
                self.role().autocheckpoint
            ))
            .unwrap();
        }
        c
    }

    /// Ok, or None for a counted SQLITE_BUSY; anything else fails the child.
    fn ok<T>(&self, r: rusqlite::Result<T>, what: &str) -> Option<T> {
        match r {
            Ok(v) => Some(v),
            Err(e) if is_busy(&e) => {
                self.bump(BUSY);
                None
            }
            Err(e) => panic!("slot {} ({}): {what}: {e}", self.slot, self.role().name),
        }
    }
}

fn child(ctx: &Ctx) {
    if ctx.role().bpe {
        sqlite_bpe::register().expect("register");
    }
    std::thread::scope(|s| {
        if ctx.role().writer {
            s.spawn(|| writer(ctx));
        }
        s.spawn(|| reader(ctx, false));
        s.spawn(|| reader(ctx, true));
        // Publish the engine's counters as they grow (a kill loses at most the last 100 ms).
        let mut last = (0, 0);
        loop {
            let stop = ctx.shared.stopping();
            if ctx.role().bpe {
                let k = sqlite_bpe::engine().counters();
                let now = (k.file_invalidations, k.ext_page_reads);
                ctx.shared
                    .slot(ctx.slot, INVALIDATIONS)
                    .fetch_add(now.0 - last.0, SeqCst);
                ctx.shared
                    .slot(ctx.slot, EXT_READS)
                    .fetch_add(now.1 - last.1, SeqCst);
                last = now;
            }
            if stop {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    });
    println!("CHILD DONE");
}

/// Moves an amount between two accounts, rewrites both copies, logs (writer, seq).
fn transfer(c: &Connection, writer: usize, seq: i64, rng: &mut StdRng) -> rusqlite::Result<()> {
    c.execute_batch("BEGIN IMMEDIATE")?;
    let r = (|| {
        let a = rng.gen_range(1..=ACCOUNTS);
        let mut b = rng.gen_range(1..ACCOUNTS);
        if b >= a {
            b += 1;
        }
        let amount = rng.gen_range(1..=50);
        c.execute(
            "UPDATE acct SET balance = balance - ?2 WHERE id = ?1",
            [a, amount],
        )?;
        c.execute(
            "UPDATE acct SET balance = balance + ?2 WHERE id = ?1",
            [b, amount],
        )?;
        for id in [a, b] {
            let balance: i64 =
                c.query_row("SELECT balance FROM acct WHERE id = ?1", [id], |r| r.get(0))?;
            let pad = rows::payload(rng.gen(), rng.gen_range(PAD));
            c.execute(
                "UPDATE blob SET balance = ?2, pad = ?3, crc = ?4 WHERE id = ?1",
                params![id, balance, pad, blob_crc(&pad, balance)],
            )?;
        }
        c.execute(
            "INSERT INTO log(writer, seq, a, b, amount) VALUES (?1, ?2, ?3, ?4, ?5)",
            params![writer, seq, a, b, amount],
        )?;
        c.execute("UPDATE meta SET commits = commits + 1 WHERE k = 1", [])?;
        c.execute_batch("COMMIT")
    })();
    if r.is_err() {
        let _ = c.execute_batch("ROLLBACK");
    }
    r
}

fn writer(ctx: &Ctx) {
    let mut conn = Some(ctx.connect());
    let c = conn.as_ref().unwrap();
    let mut rng = StdRng::seed_from_u64(ctx.seed ^ 0x77);
    // Where this writer's previous incarnation stopped (its last COMMIT may have returned
    // without being recorded: the database says).
    let mut seq: i64 = loop {
        if let Some(s) = ctx.ok(
            c.query_row(
                "SELECT coalesce(max(seq), 0) FROM log WHERE writer = ?1",
                [ctx.slot],
                |r| r.get(0),
            ),
            "writer start",
        ) {
            break s;
        }
    };
    let mut done = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(done_path(&ctx.dir, ctx.slot))
        .unwrap();
    while !ctx.shared.stopping() {
        let c = conn.get_or_insert_with(|| ctx.connect());
        if ctx
            .ok(transfer(c, ctx.slot, seq + 1, &mut rng), "transfer")
            .is_some()
        {
            seq += 1;
            writeln!(done, "{seq}").unwrap();
            done.sync_data().unwrap();
            ctx.shared.slot(ctx.slot, DONE).store(seq as u64, SeqCst);
            ctx.bump(WRITES);
            ctx.bump(ACTIVITY);
        }
        if ctx.wal && rng.gen_ratio(1, 10) {
            // Checkpoints of every kind, by every process: pages reach the database file
            // from any of them, while the others have the old ones cached.
            let mode = ["PASSIVE", "PASSIVE", "RESTART", "TRUNCATE"][rng.gen_range(0..4)];
            let r = c.query_row(&format!("PRAGMA wal_checkpoint({mode})"), [], |r| {
                r.get::<_, i64>(0)
            });
            if ctx.ok(r, "checkpoint").is_some() {
                ctx.bump(CHECKPOINTS);
            }
        }
        if ctx.role().short_lived && rng.gen_bool(0.5) {
            conn = None;
        }
        std::thread::sleep(Duration::from_micros(rng.gen_range(0..4000)));
    }
}

/// What one reader thread has seen: the log never goes backwards.
#[derive(Default)]
struct View {
    logged: i64,
    per_writer: [i64; SLOTS],
}

impl View {
    /// Checks one snapshot's log (rows of (writer, count, max seq)) against what the writers
    /// had published before it began (`progress`) and what this reader saw before.
    fn log(&mut self, ctx: &Ctx, rows: &[(usize, i64, i64)], progress: &[i64; SLOTS], what: &str) {
        let mut now = [0i64; SLOTS];
        for &(w, n, max) in rows {
            assert!(w < SLOTS, "{what}: unknown writer {w}");
            assert_eq!(
                n, max,
                "{what}: writer {w}'s log is not whole ({n} entries, last seq {max})"
            );
            now[w] = max;
        }
        for w in 0..SLOTS {
            assert!(
                now[w] >= progress[w],
                "{what}: writer {w}'s commit {} had returned before this read began, \
                 the snapshot ends at {} (stale pages) [slot {}]",
                progress[w],
                now[w],
                ctx.slot
            );
            assert!(
                now[w] >= self.per_writer[w],
                "{what}: writer {w}'s log went back from {} to {} [slot {}]",
                self.per_writer[w],
                now[w],
                ctx.slot
            );
        }
        self.per_writer = now;
    }

    fn logged(&mut self, ctx: &Ctx, logged: i64, commits: i64, what: &str) {
        assert_eq!(
            logged, commits,
            "{what}: {logged} log entries, meta says {commits} commits"
        );
        assert!(
            logged >= self.logged,
            "{what}: the log went back from {} to {logged} entries [slot {}]",
            self.logged,
            ctx.slot
        );
        self.logged = logged;
    }
}

fn check_totals(n: i64, sum: i64, what: &str) {
    assert_eq!(n, ACCOUNTS, "{what}: accounts missing");
    assert_eq!(
        sum,
        ACCOUNTS * BALANCE,
        "{what}: the balances do not sum up (a torn or stale page)"
    );
}

const TOTALS: &str = "SELECT (SELECT count(*) FROM acct), (SELECT sum(balance) FROM acct),
                             (SELECT count(*) FROM log), (SELECT commits FROM meta)";
const PER_WRITER: &str = "SELECT writer, count(*), max(seq) FROM log GROUP BY writer";
const LOOKUP: &str = "SELECT a.balance, b.balance, b.pad, b.crc FROM acct a JOIN blob b USING (id)
                      WHERE id = ?1";
const BLOB_SCAN: &str = "SELECT count(*), sum(balance) FROM blob";

fn per_writer(c: &Connection) -> rusqlite::Result<Vec<(usize, i64, i64)>> {
    let mut stmt = c.prepare_cached(PER_WRITER)?;
    let rows = stmt.query_map([], |r| {
        Ok((r.get::<_, i64>(0)? as usize, r.get(1)?, r.get(2)?))
    })?;
    rows.collect()
}

fn lookup(c: &Connection, id: i64, what: &str) -> rusqlite::Result<()> {
    let mut stmt = c.prepare_cached(LOOKUP)?;
    stmt.query_row([id], |r| {
        let (a, b): (i64, i64) = (r.get(0)?, r.get(1)?);
        let crc: i64 = r.get(3)?;
        let pad = r.get_ref(2)?.as_blob()?;
        assert_eq!(
            a, b,
            "{what}: account {id}'s balance {a} and its copy {b} differ (a stale page)"
        );
        assert_eq!(
            blob_crc(pad, b),
            crc,
            "{what}: account {id}'s copy does not match its checksum"
        );
        Ok(())
    })
}

fn totals(c: &Connection) -> rusqlite::Result<(i64, i64, i64, i64)> {
    c.prepare_cached(TOTALS)?
        .query_row([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
}

fn blob_scan(c: &Connection, what: &str) -> rusqlite::Result<()> {
    let (n, sum): (i64, i64) = c
        .prepare_cached(BLOB_SCAN)?
        .query_row([], |r| Ok((r.get(0)?, r.get(1)?)))?;
    check_totals(n, sum, &format!("{what} (copies)"));
    Ok(())
}

fn reader(ctx: &Ctx, explicit: bool) {
    let mut conn = None;
    let mut rng = StdRng::seed_from_u64(ctx.seed ^ if explicit { 0xe } else { 0xa });
    let mut view = View::default();
    while !ctx.shared.stopping() {
        let c = conn.get_or_insert_with(|| ctx.connect());
        // What the writers had published before this read transaction began.
        let progress = ctx.shared.progress();
        let done = if explicit {
            read_transaction(ctx, c, &mut rng, &mut view, &progress)
        } else {
            read_autocommit(ctx, c, &mut rng, &mut view, &progress)
        };
        if done {
            ctx.bump(READS);
            ctx.bump(ACTIVITY);
        }
        if ctx.role().short_lived && rng.gen_bool(0.5) {
            conn = None;
        }
        std::thread::sleep(Duration::from_micros(rng.gen_range(0..3000)));
    }
}

/// One statement, one read transaction: true if it ran (not busy).
fn read_autocommit(
    ctx: &Ctx,
    c: &Connection,
    rng: &mut StdRng,
    view: &mut View,
    progress: &[i64; SLOTS],
) -> bool {
    let what = "autocommit read";
    match rng.gen_range(0..6) {
        0 | 1 => {
            let Some((n, sum, logged, commits)) = ctx.ok(totals(c), TOTALS) else {
                return false;
            };
            check_totals(n, sum, what);
            view.logged(ctx, logged, commits, what);
        }
        2 | 3 => {
            let Some(rows) = ctx.ok(per_writer(c), PER_WRITER) else {
                return false;
            };
            view.log(ctx, &rows, progress, what);
        }
        4 => {
            let id = rng.gen_range(1..=ACCOUNTS);
            if ctx.ok(lookup(c, id, what), LOOKUP).is_none() {
                return false;
            }
        }
        _ => {
            if ctx.ok(blob_scan(c, what), BLOB_SCAN).is_none() {
                return false;
            }
        }
    }
    true
}

/// BEGIN, several statements on one snapshot, COMMIT: true if it ran (not busy).
fn read_transaction(
    ctx: &Ctx,
    c: &Connection,
    rng: &mut StdRng,
    view: &mut View,
    progress: &[i64; SLOTS],
) -> bool {
    let what = "read transaction";
    if ctx.ok(c.execute_batch("BEGIN"), "BEGIN").is_none() {
        return false;
    }
    let r = (|| {
        let (n, sum, logged, commits) = totals(c)?;
        check_totals(n, sum, what);
        for _ in 0..6 {
            lookup(c, rng.gen_range(1..=ACCOUNTS), what)?;
        }
        let rows = per_writer(c)?;
        // Same snapshot: the log's length agrees with the count read by the first statement.
        let total: i64 = rows.iter().map(|r| r.1).sum();
        assert_eq!(
            total, logged,
            "{what}: the log changed within one read transaction"
        );
        view.log(ctx, &rows, progress, what);
        view.logged(ctx, logged, commits, what);
        if rng.gen_ratio(1, 5) {
            blob_scan(c, what)?;
        }
        let (n2, sum2, logged2, _) = totals(c)?;
        check_totals(n2, sum2, what);
        assert_eq!(
            logged2, logged,
            "{what}: the log changed within one read transaction"
        );
        Ok(())
    })();
    let end = c.execute_batch("COMMIT");
    let r = r.and(end);
    if r.is_err() {
        let _ = c.execute_batch("ROLLBACK");
    }
    ctx.ok(r, what).is_some()
}

// ---------------------------------------------------------------------------------------------
// The test.

struct Incarnation {
    process: std::process::Child,
    stdout: std::thread::JoinHandle<String>,
    stderr: std::thread::JoinHandle<String>,
}

/// Every child still running is killed when the test ends, however it ends.
struct Children(Vec<Option<Incarnation>>);

impl Drop for Children {
    fn drop(&mut self) {
        for i in self.0.iter_mut().flatten() {
            let _ = i.process.kill();
            let _ = i.process.wait();
        }
    }
}

fn drain(mut r: impl Read + Send + 'static) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut s = String::new();
        let _ = r.read_to_string(&mut s);
        s
    })
}

fn spawn(slot: usize, dir: &Path, wal: bool, seed: u64) -> Incarnation {
    let role = &ROLES[slot];
    let mut cmd = child_command(CHILD, &slot.to_string());
    cmd.env(CHILD_DIR, dir)
        .env(CHILD_SEED, seed.to_string())
        .env(CHILD_WAL, if wal { "1" } else { "0" })
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if role.bpe {
        cmd.env("BPE_MAX_SERVER_MEMORY_MB", role.memory_mb.to_string());
        if role.extension {
            cmd.env(
                "BPE_EXTENSION_FILE",
                dir.join(format!("ext-{slot}.bpe")).display().to_string(),
            )
            .env("BPE_EXTENSION_SIZE", "16MB");
        }
    }
    let mut process = cmd.spawn().unwrap();
    let stdout = drain(process.stdout.take().unwrap());
    let stderr = drain(process.stderr.take().unwrap());
    Incarnation {
        process,
        stdout,
        stderr,
    }
}

/// Every seq in a writer's side file (whole lines only: a kill may cut the last).
fn recorded_done(dir: &Path, slot: usize) -> Vec<i64> {
    let text = std::fs::read_to_string(done_path(dir, slot)).unwrap_or_default();
    let whole = text.rfind('\n').map_or("", |at| &text[..at]);
    whole
        .lines()
        .map(|l| l.parse().unwrap_or_else(|_| panic!("bad line {l:?}")))
        .collect()
}

/// The final checks through one connection; returns (commits, each writer's last seq).
fn check_final(c: &Connection, label: &str, dir: &Path) -> (i64, [i64; SLOTS]) {
    c.execute_batch("PRAGMA cache_size = 4").unwrap();
    let integrity: Vec<String> = c
        .prepare("PRAGMA integrity_check")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(integrity, ["ok"], "{label}: integrity_check");
    c.execute_batch("BEGIN").unwrap();
    let (n, sum, logged, commits) = totals(c).unwrap();
    check_totals(n, sum, label);
    assert_eq!(logged, commits, "{label}: log and meta disagree");
    blob_scan(c, label).unwrap();
    for id in 1..=ACCOUNTS {
        lookup(c, id, label).unwrap();
    }
    let mut last = [0i64; SLOTS];
    for (w, n, max) in per_writer(c).unwrap() {
        assert_eq!(n, max, "{label}: writer {w}'s log is not whole");
        last[w] = max;
    }
    for (w, &max) in last.iter().enumerate() {
        let recorded = recorded_done(dir, w);
        if let Some(&r) = recorded.iter().max() {
            assert!(
                r <= max,
                "{label}: writer {w} recorded commit {r} as done; the log ends at {max}"
            );
        }
        for &seq in &recorded {
            let there: i64 = c
                .query_row(
                    "SELECT count(*) FROM log WHERE writer = ?1 AND seq = ?2",
                    params![w, seq],
                    |r| r.get(0),
                )
                .unwrap();
            assert_eq!(
                there, 1,
                "{label}: writer {w}'s commit {seq}, recorded as done, is not in the log"
            );
        }
    }
    c.execute_batch("COMMIT").unwrap();
    (commits, last)
}

fn run(journal: &str) {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let seconds: u64 = std::env::var("BPE_MP_SECONDS").map_or(SECONDS, |s| s.parse().unwrap());
    let seed: u64 = std::env::var("BPE_MP_SEED")
        .ok()
        .map_or_else(rand::random, |s| s.parse().unwrap());
    println!("{journal}: {seconds} s, BPE_MP_SEED={seed}");
    let mut rng = StdRng::seed_from_u64(seed);
    let wal = journal == "WAL";
    let dir = tempdir();
    create_db(&dir.path().join("mp.db"), journal);
    let shared_path = dir.path().join("shared");
    Shared::create(&shared_path);
    let shared = Shared::map(&shared_path);

    let mut children = Children(
        (0..SLOTS)
            .map(|slot| Some(spawn(slot, dir.path(), wal, rng.gen())))
            .collect(),
    );
    let started = Instant::now();
    let deadline = started + Duration::from_secs(seconds);
    let mut next_kill = started + Duration::from_millis(rng.gen_range(300..1200));
    let mut kills = [0usize; SLOTS];
    // (activity seen, when it last changed) per slot.
    let mut activity: Vec<(u64, Instant)> = (0..SLOTS).map(|_| (0, started)).collect();
    let failure = |slot: usize, inc: Incarnation, why: &str| -> String {
        format!(
            "{journal}, BPE_MP_SEED={seed}: slot {slot} ({}) {why}\n--- stderr ---\n{}\n--- stdout ---\n{}",
            ROLES[slot].name,
            inc.stderr.join().unwrap(),
            inc.stdout.join().unwrap()
        )
    };
    while Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(25));
        for (slot, seen) in activity.iter_mut().enumerate() {
            let inc = children.0[slot].as_mut().unwrap();
            if let Some(status) = inc.process.try_wait().unwrap() {
                let inc = children.0[slot].take().unwrap();
                panic!(
                    "{}",
                    failure(slot, inc, &format!("ended by itself: {status}"))
                );
            }
            let now = shared.slot(slot, ACTIVITY).load(SeqCst);
            if now != seen.0 {
                *seen = (now, Instant::now());
            } else if seen.1.elapsed() > STALL {
                let mut inc = children.0[slot].take().unwrap();
                let _ = inc.process.kill();
                panic!("{}", failure(slot, inc, "hung: no read or write finished"));
            }
        }
        if Instant::now() >= next_kill {
            let slot = rng.gen_range(0..SLOTS);
            let mut inc = children.0[slot].take().unwrap();
            inc.process.kill().unwrap(); // SIGKILL
            let status = inc.process.wait().unwrap();
            if status.signal() != Some(libc::SIGKILL) {
                panic!(
                    "{}",
                    failure(slot, inc, &format!("ended by itself: {status}"))
                );
            }
            kills[slot] += 1;
            children.0[slot] = Some(spawn(slot, dir.path(), wal, rng.gen()));
            activity[slot] = (shared.slot(slot, ACTIVITY).load(SeqCst), Instant::now());
            next_kill = Instant::now() + Duration::from_millis(rng.gen_range(300..1500));
        }
    }
    shared.word(STOP).store(1, SeqCst);
    for slot in 0..SLOTS {
        let mut inc = children.0[slot].take().unwrap();
        let until = Instant::now() + Duration::from_secs(60);
        let status = loop {
            if let Some(status) = inc.process.try_wait().unwrap() {
                break Some(status);
            }
            if Instant::now() > until {
                let _ = inc.process.kill();
                break None;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        match status {
            Some(s) if s.success() => {
                let out = inc.stdout.join().unwrap();
                assert!(out.contains("CHILD DONE"), "slot {slot}: {out}");
            }
            Some(s) => panic!("{}", failure(slot, inc, &format!("failed at the end: {s}"))),
            None => panic!("{}", failure(slot, inc, "did not stop within 60 s")),
        }
    }
    let elapsed = started.elapsed();

    println!(
        "{journal}: {:.1} s; per slot: kills, writes, reads, busy, checkpoints, \
         file cache invalidations, extension page reads",
        elapsed.as_secs_f64()
    );
    let field = |slot, f| shared.slot(slot, f).load(SeqCst);
    for (slot, role) in ROLES.iter().enumerate() {
        println!(
            "  slot {slot} ({}): {} kills, {} writes, {} reads, {} busy, {} checkpoints, \
             {} invalidations, {} extension page reads",
            role.name,
            kills[slot],
            field(slot, WRITES),
            field(slot, READS),
            field(slot, BUSY),
            field(slot, CHECKPOINTS),
            field(slot, INVALIDATIONS),
            field(slot, EXT_READS),
        );
    }

    // Through both VFSs, plain SQLite first (it recovers nothing: every child ended cleanly).
    let db = dir.path().join("mp.db");
    let plain = check_final(&open_unix(&db), &format!("{journal}, unix VFS"), dir.path());
    let bpe = check_final(&open_bpe(&db), &format!("{journal}, bpe VFS"), dir.path());
    assert_eq!(plain, bpe, "{journal}: the VFSs disagree");
    println!("{journal}: {} commits in the log", plain.0);

    // The run tested something: every process wrote and read, and the bpe processes noticed
    // the others' commits.
    for (slot, role) in ROLES.iter().enumerate() {
        assert!(
            plain.1[slot] > 0 || !role.writer,
            "slot {slot} ({}) never committed",
            role.name
        );
        assert!(
            field(slot, READS) > 0,
            "slot {slot} ({}) never read",
            role.name
        );
    }
    let invalidations: u64 = (0..SLOTS).map(|s| field(s, INVALIDATIONS)).sum();
    assert!(
        invalidations > 0,
        "no bpe process ever noticed another's commit"
    );
}

#[test]
fn bpe_and_plain_processes_share_a_database_in_rollback_mode() {
    run("DELETE");
}

#[test]
fn bpe_and_plain_processes_share_a_database_in_wal_mode() {
    run("WAL");
}
