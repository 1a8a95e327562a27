//! The transfer oracle: several processes move money between accounts and check,
//! inside every read transaction, that nothing they see is wrong.
//!
//! Processes of four kinds share one database (this test binary re-executed as children): plain
//! SQLite (the unix VFS), bpe without an extension, bpe with a private extension, and bpe with an
//! extension shared with another bpe process (`BPE_EXTENSION_SHARED=1`); the bpe ones with 2 MB
//! of max server memory, so that pages churn through the pool and the extension. Each runs two
//! threads: one with a long-lived connection, one that opens a new connection every few
//! transactions. Each thread loops on:
//!
//! - a **transfer**: `BEGIN IMMEDIATE`, read two random accounts (their checksums verified, their
//!   versions no older than any version committed or seen before the transaction began), move an
//!   amount from one to the other, bump both versions, rewrite both checksums (a hash of id,
//!   balance and version computed here, not in SQL) and both paddings (whose length depends on
//!   the version: rows change size, pages split and merge), `COMMIT`; the new versions are then
//!   published in memory shared by all processes;
//! - a **checked read transaction**: `BEGIN`, a full scan (every row's checksum and padding; the
//!   balances sum to the constant total; no row's version lower than the highest any process had
//!   committed or seen before the transaction began: a stale row), a second scan of the table
//!   and a third through an index on (version, balance), both of which must agree with the first
//!   (count, sum of balances, sum of versions), `COMMIT`; the versions seen are then published;
//! - in WAL mode, **checkpoints** by most processes, in every mode (PASSIVE, FULL, RESTART,
//!   TRUNCATE): the plain ones with `wal_autocheckpoint = 0` and explicit checkpoints, as rqlite
//!   does, one of them a TRUNCATE after each of its transfers, so that the WAL restarts often,
//!   by another process than the one reading;
//! - now and then a pause of 5-40 ms of the whole process (an application between bursts of
//!   requests), during which the others commit, checkpoint and restart the WAL unseen by it.
//!
//! Anything wrong is a line `VIOLATION ...` from the child, which then exits with code 2; an
//! SQLite error other than SQLITE_BUSY (`database disk image is malformed`, ...) is a violation
//! too. The parent stops the run at the first child that ends by itself and fails with every
//! VIOLATION line. Variants: WAL and rollback journal, each without kills and with a random child
//! SIGKILLed and started again every 100-500 ms. After the run, plain SQLite checks
//! `integrity_check`, every row, the total, and that no published version was lost. The parent
//! also checks that the run did real work: hundreds of transfers and checked read transactions,
//! pages served from the pool and from both kinds of extension, and (WAL) restarts of the WAL.
//!
//! `BPE_WAL_TRANSFERS_SECONDS` (default 8 per variant) runs longer,
//! `BPE_WAL_TRANSFERS_PROCESSES` (default 6; the kinds repeat) runs more processes,
//! `BPE_WAL_TRANSFERS_SEED` repeats a run's random choices (the children's seeds, which child is
//! killed when; the interleaving of the processes is the scheduler's).

mod common;

use common::*;
use rand::{rngs::StdRng, Rng, SeedableRng};
use rusqlite::{params, Connection, ErrorCode, OpenFlags};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

const ACCOUNTS: usize = 2000;
const BALANCE: i64 = 1000;
const TOTAL: i64 = ACCOUNTS as i64 * BALANCE;
const SECONDS: u64 = 8;
const PROCESSES: usize = 6;
const MAX_PROCESSES: usize = 24;
/// Busy timeout of transactions (checkpoints use a shorter one: they may wait for readers).
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);
/// A child with no transaction finished for this long is hung.
const STALL: Duration = Duration::from_secs(60);

/// The length of an account's padding at a version: rows change size with every transfer.
fn pad_len(id: i64, version: i64) -> i64 {
    200 + (mix(id as u64 ^ ((version as u64) << 20)) % 1200) as i64
}

fn mix(mut x: u64) -> u64 {
    // splitmix64's finalizer
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// The checksum of a row's (id, balance, version), computed here, never by SQL.
fn checksum(id: i64, balance: i64, version: i64) -> i64 {
    (mix(mix(mix(id as u64) ^ balance as u64) ^ version as u64) >> 1) as i64
}

// ---------------------------------------------------------------------------------------------
// The kinds of process.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Plain,
    Bpe,
    PrivateExtension,
    SharedExtension,
}

struct Role {
    name: &'static str,
    kind: Kind,
    /// `PRAGMA wal_autocheckpoint` (0: never; the process checkpoints explicitly).
    autocheckpoint: u32,
    /// The checkpoint modes this process runs itself (WAL mode), one after about one transfer
    /// in `every`.
    checkpoints: &'static [&'static str],
    every: u32,
}

/// Slot n plays ROLES[n % 6].
const ROLES: [Role; 6] = [
    Role {
        name: "plain, autocheckpoint off, TRUNCATE (rqlite)",
        kind: Kind::Plain,
        autocheckpoint: 0,
        checkpoints: &["TRUNCATE"],
        every: 1,
    },
    Role {
        name: "bpe, no extension",
        kind: Kind::Bpe,
        autocheckpoint: 100,
        checkpoints: &["PASSIVE", "RESTART"],
        every: 20,
    },
    Role {
        name: "bpe, shared extension",
        kind: Kind::SharedExtension,
        autocheckpoint: 1000,
        checkpoints: &[],
        every: 1,
    },
    Role {
        name: "plain, autocheckpoint off, every mode",
        kind: Kind::Plain,
        autocheckpoint: 0,
        checkpoints: &["PASSIVE", "FULL", "RESTART", "TRUNCATE"],
        every: 8,
    },
    Role {
        name: "bpe, private extension",
        kind: Kind::PrivateExtension,
        autocheckpoint: 1000,
        checkpoints: &["FULL", "TRUNCATE"],
        every: 20,
    },
    Role {
        name: "bpe, shared extension",
        kind: Kind::SharedExtension,
        autocheckpoint: 50,
        checkpoints: &["RESTART"],
        every: 16,
    },
];

fn role(slot: usize) -> &'static Role {
    &ROLES[slot % ROLES.len()]
}

// ---------------------------------------------------------------------------------------------
// Memory shared by the test and every child: a file mapped MAP_SHARED.
//
// Word 0: stop. Slot s's counters at SLOT_BASE + SLOT_WORDS * s. At VERSIONS + id - 1, the
// highest version of each account committed (and published after COMMIT returned) or seen in a
// read transaction by any process, as version << 8 | (writer slot + 1) (0: seen by a reader).

struct Shared {
    words: *const AtomicU64,
}

// SAFETY: the mapping lives for the process (never unmapped); the words are atomics.
unsafe impl Sync for Shared {}
unsafe impl Send for Shared {}

const STOP: usize = 0;
const SLOT_BASE: usize = 16;
const SLOT_WORDS: usize = 16;
const VERSIONS: usize = 512;

// Per slot (summed over its incarnations).
const TRANSFERS: usize = 0;
const READS: usize = 1;
const BUSY: usize = 2;
const CHECKPOINTS: usize = 3;
const CHECKPOINTS_BUSY: usize = 4;
const CONNECTIONS: usize = 5;
const L1_HITS: usize = 6;
const PAGE_READS: usize = 7;
const EXT_READS: usize = 8;
const EXT_SHARED_READS: usize = 9;
const INVALIDATIONS: usize = 10;
const FORGOTTEN: usize = 11;
const RESTORED: usize = 12;

impl Shared {
    const BYTES: usize = 32768;

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
        assert!(slot < MAX_PROCESSES && field < SLOT_WORDS);
        self.word(SLOT_BASE + SLOT_WORDS * slot + field)
    }

    fn field(&self, slot: usize, field: usize) -> u64 {
        self.slot(slot, field).load(SeqCst)
    }

    fn stopping(&self) -> bool {
        self.word(STOP).load(SeqCst) != 0
    }

    fn version_word(&self, id: i64) -> &AtomicU64 {
        self.word(VERSIONS + id as usize - 1)
    }

    fn publish(&self, id: i64, version: i64, writer: Option<usize>) {
        let w = ((version as u64) << 8) | writer.map_or(0, |s| s as u64 + 1);
        self.version_word(id).fetch_max(w, SeqCst);
    }
}

fn split(w: u64) -> (i64, Option<usize>) {
    (
        (w >> 8) as i64,
        (w & 0xff).checked_sub(1).map(|s| s as usize),
    )
}

// ---------------------------------------------------------------------------------------------
// The database.

fn flags() -> OpenFlags {
    OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE
}

fn open_plain(path: &Path) -> rusqlite::Result<Connection> {
    Connection::open_with_flags_and_vfs(path, flags(), "unix")
}

fn create_db(path: &Path, journal: &str) {
    let c = open_plain(path).unwrap();
    c.execute_batch(&format!(
        "PRAGMA journal_mode = {journal};
         CREATE TABLE accounts(id INTEGER PRIMARY KEY, balance INTEGER NOT NULL,
                               version INTEGER NOT NULL, checksum INTEGER NOT NULL,
                               writer INTEGER NOT NULL, pad BLOB NOT NULL);
         CREATE INDEX accounts_version ON accounts(version, balance);"
    ))
    .unwrap();
    let tx = c.unchecked_transaction().unwrap();
    for id in 1..=ACCOUNTS as i64 {
        tx.execute(
            "INSERT INTO accounts VALUES (?1, ?2, 0, ?3, -1, randomblob(?4))",
            params![id, BALANCE, checksum(id, BALANCE, 0), pad_len(id, 0)],
        )
        .unwrap();
    }
    tx.commit().unwrap();
}

// ---------------------------------------------------------------------------------------------
// The child.

const CHILD: &str = "BPE_WT_CHILD";
const CHILD_DIR: &str = "BPE_WT_DIR";
const CHILD_SEED: &str = "BPE_WT_SEED";
const CHILD_WAL: &str = "BPE_WT_WAL";

/// Not a test: the body of the child processes (does nothing unless BPE_WT_CHILD is set).
#[test]
#[ignore = "run by the wal_transfers tests as a child process"]
fn child_entry() {
    let Some(slot) = child_mode(CHILD) else {
        return;
    };
    let dir = PathBuf::from(std::env::var(CHILD_DIR).unwrap());
    let slot: usize = slot.parse().unwrap();
    let ctx = Ctx {
        slot,
        role: role(slot),
        db: dir.join("transfers.db"),
        wal: std::env::var(CHILD_WAL).unwrap() == "1",
        shared: Shared::map(&dir.join("shared")),
        seed: std::env::var(CHILD_SEED).unwrap().parse().unwrap(),
        seen: (0..ACCOUNTS).map(|_| AtomicU64::new(0)).collect(),
        progress: Arc::new(AtomicU64::new(0)),
        started: Instant::now(),
        quiet_until: AtomicU64::new(0),
    };
    child(&ctx);
}

struct Ctx {
    slot: usize,
    role: &'static Role,
    db: PathBuf,
    wal: bool,
    shared: &'static Shared,
    seed: u64,
    /// The highest version of each account this process has committed or seen.
    seen: Vec<AtomicU64>,
    progress: Arc<AtomicU64>,
    started: Instant,
    /// No transaction of this process begins before this time (µs since `started`).
    quiet_until: AtomicU64,
}

/// Why a transaction did not complete.
enum Fail {
    /// SQLITE_BUSY: counted, never a violation.
    Busy,
    /// Anything else: each line a violation.
    Violation(Vec<String>),
}

type Step<T> = Result<T, Fail>;

fn sql<T>(r: rusqlite::Result<T>, what: &str) -> Step<T> {
    r.map_err(|e| {
        if e.sqlite_error_code() == Some(ErrorCode::DatabaseBusy) {
            Fail::Busy
        } else {
            // A full disk fails the run too, but it is the machine's, not a wrong answer (a
            // test filling the same disk at the same time: bad_input.rs's 600 GB extension).
            let note = if e.sqlite_error_code() == Some(ErrorCode::DiskFull) {
                " [the disk was full: an environment failure, not a wrong answer]"
            } else {
                ""
            };
            Fail::Violation(vec![format!("SQLite error in {what}: {e} ({e:?}){note}")])
        }
    })
}

impl Ctx {
    fn bump(&self, field: usize) {
        self.shared.slot(self.slot, field).fetch_add(1, SeqCst);
    }

    fn bpe(&self) -> bool {
        self.role.kind != Kind::Plain
    }

    fn connect(&self, cache_pages: i64) -> Step<Connection> {
        let c = if self.bpe() {
            sql(
                Connection::open_with_flags_and_vfs(&self.db, flags(), "bpe"),
                "open (bpe)",
            )?
        } else {
            sql(open_plain(&self.db), "open (unix)")?
        };
        sql(c.busy_timeout(BUSY_TIMEOUT), "busy_timeout")?;
        sql(
            c.execute_batch(&format!("PRAGMA cache_size = {cache_pages}")),
            "cache_size",
        )?;
        if self.wal {
            sql(
                c.execute_batch(&format!(
                    "PRAGMA wal_autocheckpoint = {}",
                    self.role.autocheckpoint
                )),
                "wal_autocheckpoint",
            )?;
        }
        self.bump(CONNECTIONS);
        Ok(c)
    }

    /// Every account's highest version committed or seen by anyone, as of now.
    fn baseline(&self) -> Vec<u64> {
        (1..=ACCOUNTS as i64)
            .map(|id| self.shared.version_word(id).load(SeqCst))
            .collect()
    }

    fn publish(&self, id: i64, version: i64, writer: bool) {
        self.shared
            .publish(id, version, writer.then_some(self.slot));
        self.seen[id as usize - 1].fetch_max(version as u64, SeqCst);
    }

    /// Prints the violations (one line each, on both streams) and exits with code 2.
    fn violation(&self, thread: &str, lines: &[String]) -> ! {
        static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let _one = ONE.lock();
        let at = self.started.elapsed().as_secs_f64();
        for l in lines {
            let line = format!(
                "VIOLATION slot {} ({}), {thread} connection, {at:.3} s into this process: {l}",
                self.slot, self.role.name
            );
            println!("{line}");
            eprintln!("{line}");
        }
        if self.bpe() {
            let k = sqlite_bpe::engine().counters();
            println!(
                "VIOLATION CONTEXT slot {}: bpe counters: l1 hits {}, page reads {}, extension page \
                 reads {} (of other processes' pages {}), file invalidations {}, pages forgotten \
                 {}, pages restored {}",
                self.slot,
                k.l1_hits,
                k.page_reads,
                k.ext_page_reads,
                k.ext_shared_page_reads,
                k.file_invalidations,
                k.pages_forgotten,
                k.ext_pages_restored
            );
        }
        let _ = std::io::stdout().flush();
        std::process::exit(2);
    }
}

fn child(ctx: &Ctx) {
    if ctx.bpe() {
        sqlite_bpe::register().expect("register");
    }
    exit_if_stalled(ctx.progress.clone(), STALL, "transactions");
    std::thread::scope(|s| {
        s.spawn(|| worker(ctx, true));
        s.spawn(|| worker(ctx, false));
        // Publish the engine's counters as they grow (a kill loses at most the last 100 ms).
        let mut last = [0u64; 7];
        loop {
            let stop = ctx.shared.stopping();
            if ctx.bpe() {
                let k = sqlite_bpe::engine().counters();
                let now = [
                    k.l1_hits,
                    k.page_reads,
                    k.ext_page_reads,
                    k.ext_shared_page_reads,
                    k.file_invalidations,
                    k.pages_forgotten,
                    k.ext_pages_restored,
                ];
                let fields = [
                    L1_HITS,
                    PAGE_READS,
                    EXT_READS,
                    EXT_SHARED_READS,
                    INVALIDATIONS,
                    FORGOTTEN,
                    RESTORED,
                ];
                for i in 0..now.len() {
                    ctx.shared
                        .slot(ctx.slot, fields[i])
                        .fetch_add(now[i].saturating_sub(last[i]), SeqCst);
                }
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

/// One thread: transfers, checked read transactions and checkpoints, on a long-lived connection
/// or on short-lived ones (a new connection every 1-4 transactions).
fn worker(ctx: &Ctx, long: bool) {
    let thread = if long { "long-lived" } else { "short-lived" };
    let mut rng = StdRng::seed_from_u64(ctx.seed ^ if long { 0x10 } else { 0x20 });
    let mut conn: Option<Connection> = None;
    let mut left = 0u32;
    while !ctx.shared.stopping() {
        if conn.is_none() {
            // SQLite's own cache holds few pages: reads go to the VFS (and the pool).
            let pages = if long { 16 } else { rng.gen_range(4..64) };
            match ctx.connect(pages) {
                Ok(c) => conn = Some(c),
                Err(Fail::Busy) => {
                    ctx.bump(BUSY);
                    continue;
                }
                Err(Fail::Violation(lines)) => ctx.violation(thread, &lines),
            }
            left = if long { u32::MAX } else { rng.gen_range(1..=4) };
        }
        let c = conn.as_ref().unwrap();
        let transfer = rng.gen_bool(0.5);
        let r = if transfer {
            do_transfer(ctx, c, &mut rng)
        } else {
            read_check(ctx, c)
        };
        match r {
            Ok(()) => {
                ctx.bump(if transfer { TRANSFERS } else { READS });
                ctx.progress.fetch_add(1, SeqCst);
            }
            Err(Fail::Busy) => ctx.bump(BUSY),
            Err(Fail::Violation(lines)) => ctx.violation(thread, &lines),
        }
        if transfer
            && ctx.wal
            && !ctx.role.checkpoints.is_empty()
            && rng.gen_ratio(1, ctx.role.every)
        {
            let mode = ctx.role.checkpoints[rng.gen_range(0..ctx.role.checkpoints.len())];
            match checkpoint(c, mode, Duration::from_millis(rng.gen_range(0..1000))) {
                Ok(true) => ctx.bump(CHECKPOINTS),
                Ok(false) | Err(Fail::Busy) => ctx.bump(CHECKPOINTS_BUSY),
                Err(Fail::Violation(lines)) => ctx.violation(thread, &lines),
            }
        }
        left -= 1;
        if left == 0 {
            if let Err((_, e)) = conn.take().unwrap().close() {
                if e.sqlite_error_code() != Some(ErrorCode::DatabaseBusy) {
                    ctx.violation(thread, &[format!("SQLite error in close: {e} ({e:?})")]);
                }
            }
        }
        // Now and then the whole process idles for a while, as an application between bursts
        // of requests: other processes commit, checkpoint and restart the WAL meanwhile, unseen
        // by this one (no transaction of it begins).
        let now = ctx.started.elapsed().as_micros() as u64;
        if rng.gen_ratio(1, 12) {
            ctx.quiet_until
                .fetch_max(now + rng.gen_range(5_000..40_000), SeqCst);
        }
        let until = ctx
            .quiet_until
            .load(SeqCst)
            .max(now + rng.gen_range(0..1_500));
        std::thread::sleep(Duration::from_micros(until - now));
    }
}

/// `PRAGMA wal_checkpoint(mode)` with a busy timeout of `patience`: whether it completed.
fn checkpoint(c: &Connection, mode: &str, patience: Duration) -> Step<bool> {
    sql(c.busy_timeout(patience), "busy_timeout")?;
    let r = c.query_row(&format!("PRAGMA wal_checkpoint({mode})"), [], |r| {
        r.get::<_, i64>(0)
    });
    sql(c.busy_timeout(BUSY_TIMEOUT), "busy_timeout")?;
    Ok(sql(r, &format!("wal_checkpoint({mode})"))? == 0)
}

/// One account as read: (balance, version, checksum, writer, padding length).
type Row = (i64, i64, i64, i64, i64);

/// What is wrong with account `id` as read, given what had been published before the
/// transaction began (`base`) and what this process had seen (`ours`).
fn check_row(id: i64, row: Row, base: u64, ours: u64, problems: &mut Vec<String>) {
    let (balance, version, sum, writer, pad) = row;
    if sum != checksum(id, balance, version) {
        problems.push(format!(
            "account {id}: checksum {sum} does not match balance {balance}, version {version} \
             (written by slot {writer}): a torn or mixed row"
        ));
    }
    if pad != pad_len(id, version) {
        problems.push(format!(
            "account {id}: padding of {pad} bytes, version {version} has {}",
            pad_len(id, version)
        ));
    }
    let (published, by) = split(base);
    if version < published {
        problems.push(format!(
            "account {id}: version {version} (written by slot {writer}), but version {published} \
             had been {} before this transaction began (this process had seen version {ours}): \
             a stale row, {} version(s) old",
            by.map_or("seen by a reader".to_string(), |s| format!(
                "committed by slot {s} ({})",
                role(s).name
            )),
            published - version
        ));
    }
}

/// Moves an amount between two random accounts.
fn do_transfer(ctx: &Ctx, c: &Connection, rng: &mut StdRng) -> Step<()> {
    let a = rng.gen_range(1..=ACCOUNTS as i64);
    let mut b = rng.gen_range(1..ACCOUNTS as i64);
    if b >= a {
        b += 1;
    }
    let amount = rng.gen_range(1..=100);
    let base = [a, b].map(|id| ctx.shared.version_word(id).load(SeqCst));
    let ours = [a, b].map(|id| ctx.seen[id as usize - 1].load(SeqCst));
    sql(c.execute_batch("BEGIN IMMEDIATE"), "BEGIN IMMEDIATE")?;
    let r = (|| {
        let mut rows = [(0, 0, 0, 0, 0); 2];
        let mut problems = Vec::new();
        for (i, id) in [a, b].into_iter().enumerate() {
            let mut stmt = sql(
                c.prepare_cached(
                    "SELECT balance, version, checksum, writer, length(pad) FROM accounts
                     WHERE id = ?1",
                ),
                "prepare",
            )?;
            rows[i] = sql(
                stmt.query_row([id], |r| {
                    Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
                }),
                "transfer's read",
            )?;
            check_row(id, rows[i], base[i], ours[i], &mut problems);
        }
        if !problems.is_empty() {
            problems.push(format!(
                "(in the write transaction of a transfer from {a} to {b})"
            ));
            return Err(Fail::Violation(problems));
        }
        let delta = [-amount, amount];
        for (i, id) in [a, b].into_iter().enumerate() {
            let balance = rows[i].0 + delta[i];
            let version = rows[i].1 + 1;
            let mut stmt = sql(
                c.prepare_cached(
                    "UPDATE accounts SET balance = ?2, version = ?3, checksum = ?4, writer = ?5,
                     pad = randomblob(?6) WHERE id = ?1",
                ),
                "prepare",
            )?;
            let n = sql(
                stmt.execute(params![
                    id,
                    balance,
                    version,
                    checksum(id, balance, version),
                    ctx.slot as i64,
                    pad_len(id, version)
                ]),
                "transfer's update",
            )?;
            if n != 1 {
                return Err(Fail::Violation(vec![format!(
                    "account {id}: the update changed {n} rows"
                )]));
            }
        }
        sql(c.execute_batch("COMMIT"), "COMMIT of a transfer")?;
        Ok([rows[0].1 + 1, rows[1].1 + 1])
    })();
    match r {
        Ok(versions) => {
            ctx.publish(a, versions[0], true);
            ctx.publish(b, versions[1], true);
            Ok(())
        }
        Err(e) => {
            let _ = c.execute_batch("ROLLBACK");
            Err(e)
        }
    }
}

const SCAN: &str =
    "SELECT id, balance, version, checksum, writer, length(pad) FROM accounts ORDER BY id";
const AGGREGATE: &str = "SELECT count(*), sum(balance), sum(version) FROM accounts NOT INDEXED";
const BY_INDEX: &str = "SELECT count(*), sum(balance), sum(version) FROM accounts
                        INDEXED BY accounts_version WHERE version >= 0";

/// BEGIN, three scans that must agree with each other, the total and what was published before,
/// COMMIT; then what it saw is published.
fn read_check(ctx: &Ctx, c: &Connection) -> Step<()> {
    // Loaded before the read transaction's snapshot is taken (by its first SELECT).
    let base = ctx.baseline();
    let ours: Vec<u64> = ctx.seen.iter().map(|s| s.load(SeqCst)).collect();
    sql(c.execute_batch("BEGIN"), "BEGIN")?;
    let r = (|| {
        let mut problems = Vec::new();
        let mut versions = Vec::with_capacity(ACCOUNTS);
        let (mut n, mut sum, mut vsum) = (0i64, 0i64, 0i64);
        {
            let mut stmt = sql(c.prepare_cached(SCAN), "prepare")?;
            let mut rows = sql(stmt.query([]), "scan")?;
            while let Some(r) = sql(rows.next(), "scan")? {
                let id: i64 = sql(r.get(0), "scan")?;
                let row: Row = (
                    sql(r.get(1), "scan")?,
                    sql(r.get(2), "scan")?,
                    sql(r.get(3), "scan")?,
                    sql(r.get(4), "scan")?,
                    sql(r.get(5), "scan")?,
                );
                n += 1;
                if id != n {
                    problems.push(format!("scan: account {id} where account {n} was expected"));
                }
                if (1..=ACCOUNTS as i64).contains(&id) {
                    let i = id as usize - 1;
                    check_row(id, row, base[i], ours[i], &mut problems);
                }
                sum += row.0;
                vsum += row.1;
                versions.push((id, row.1));
            }
        }
        if n != ACCOUNTS as i64 || sum != TOTAL {
            problems.push(format!(
                "scan: {n} accounts with balances summing to {sum}, expected {ACCOUNTS} summing \
                 to {TOTAL} (off by {})",
                sum - TOTAL
            ));
        }
        let again: (i64, i64, i64) = sql(
            c.query_row(AGGREGATE, [], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?))),
            "second scan",
        )?;
        if again != (n, sum, vsum) {
            problems.push(format!(
                "second scan of the same transaction: (count, sum, sum of versions) {again:?}, \
                 the first gave {:?}",
                (n, sum, vsum)
            ));
        }
        let index: (i64, i64, i64) = sql(
            c.query_row(BY_INDEX, [], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?))),
            "index scan",
        )?;
        if index != (n, sum, vsum) {
            problems.push(format!(
                "scan of the index on (version, balance) in the same transaction: {index:?}, the \
                 table gave {:?}",
                (n, sum, vsum)
            ));
        }
        if !problems.is_empty() {
            if problems.len() > 40 {
                let more = problems.len() - 40;
                problems.truncate(40);
                problems.push(format!("... and {more} more problems in this transaction"));
            }
            problems.push(format!(
                "(in a read transaction: {n} accounts, sum {sum}, sum of versions {vsum})"
            ));
            return Err(Fail::Violation(problems));
        }
        sql(c.execute_batch("COMMIT"), "COMMIT of a read transaction")?;
        Ok(versions)
    })();
    match r {
        Ok(versions) => {
            for (id, v) in versions {
                ctx.publish(id, v, false);
            }
            Ok(())
        }
        Err(e) => {
            let _ = c.execute_batch("ROLLBACK");
            Err(e)
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The test.

struct Incarnation {
    process: std::process::Child,
    out: PathBuf,
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

fn spawn(slot: usize, n: usize, dir: &Path, wal: bool, seed: u64) -> Incarnation {
    let out = dir.join(format!("slot-{slot}-{n}.out"));
    let err = dir.join(format!("slot-{slot}-{n}.err"));
    let mut cmd = child_command(CHILD, &slot.to_string());
    cmd.env(CHILD_DIR, dir)
        .env(CHILD_SEED, seed.to_string())
        .env(CHILD_WAL, if wal { "1" } else { "0" })
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap());
    let kind = role(slot).kind;
    if kind != Kind::Plain {
        cmd.env("BPE_MAX_SERVER_MEMORY_MB", "2");
    }
    match kind {
        Kind::PrivateExtension => {
            cmd.env(
                "BPE_EXTENSION_FILE",
                dir.join(format!("private-{slot}.bpe")),
            )
            .env("BPE_EXTENSION_SIZE", "16MB");
        }
        Kind::SharedExtension => {
            cmd.env("BPE_EXTENSION_FILE", dir.join("shared.bpe"))
                .env("BPE_EXTENSION_SIZE", "16MB")
                .env("BPE_EXTENSION_SHARED", "1");
        }
        _ => {}
    }
    Incarnation {
        process: cmd.spawn().unwrap(),
        out,
    }
}

/// salt-1 of the wal-index header (it goes up by one at every restart of the WAL).
fn wal_salt(dir: &Path) -> Option<u32> {
    let f = std::fs::File::open(dir.join("transfers.db-shm")).ok()?;
    let mut b = [0u8; 48];
    f.read_exact_at(&mut b, 0).ok()?;
    (b[12] != 0).then(|| u32::from_ne_bytes(b[32..36].try_into().unwrap()))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// The last `n` lines of a text.
fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

struct Variant {
    name: String,
    wal: bool,
    kills: bool,
}

fn run(journal: &str, kills: bool) {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let v = Variant {
        name: format!("{journal}, {}", if kills { "kills" } else { "no kills" }),
        wal: journal == "WAL",
        kills,
    };
    let seconds: u64 =
        std::env::var("BPE_WAL_TRANSFERS_SECONDS").map_or(SECONDS, |s| s.parse().unwrap());
    let processes: usize =
        std::env::var("BPE_WAL_TRANSFERS_PROCESSES").map_or(PROCESSES, |s| s.parse().unwrap());
    assert!((ROLES.len()..=MAX_PROCESSES).contains(&processes));
    let seed: u64 = std::env::var("BPE_WAL_TRANSFERS_SEED")
        .ok()
        .map_or_else(rand::random, |s| s.parse().unwrap());
    println!(
        "{}: {seconds} s, {processes} processes, BPE_WAL_TRANSFERS_SEED={seed}",
        v.name
    );
    let mut rng = StdRng::seed_from_u64(seed);
    let dir = tempdir();
    let db = dir.path().join("transfers.db");
    create_db(&db, journal);
    let shared_path = dir.path().join("shared");
    Shared::create(&shared_path);
    let shared = Shared::map(&shared_path);

    let mut incarnations = vec![1usize; processes];
    let mut children = Children(
        (0..processes)
            .map(|slot| Some(spawn(slot, 1, dir.path(), v.wal, rng.gen())))
            .collect(),
    );
    let started = Instant::now();
    let deadline = started + Duration::from_secs(seconds);
    let mut next_kill = started + Duration::from_millis(rng.gen_range(100..500));
    let mut kills = vec![0usize; processes];
    let mut kill_log: Vec<String> = Vec::new();
    let mut salt = None;
    let mut restarts = 0u64;
    // (slot, what happened) of the children that ended by themselves.
    let mut failures: Vec<(usize, String)> = Vec::new();
    while Instant::now() < deadline && failures.is_empty() {
        std::thread::sleep(Duration::from_millis(20));
        if v.wal {
            if let Some(s) = wal_salt(dir.path()) {
                if let Some(old) = salt.filter(|&o| o != s) {
                    let d = s.wrapping_sub(old);
                    restarts += if d < 10_000 { d as u64 } else { 1 };
                }
                salt = Some(s);
            }
        }
        for slot in 0..processes {
            let inc = children.0[slot].as_mut().unwrap();
            if let Some(status) = inc.process.try_wait().unwrap() {
                failures.push((
                    slot,
                    format!(
                        "ended by itself {:.3} s into the run: {status}",
                        started.elapsed().as_secs_f64()
                    ),
                ));
            }
        }
        if v.kills && failures.is_empty() && Instant::now() >= next_kill {
            let slot = rng.gen_range(0..processes);
            let mut inc = children.0[slot].take().unwrap();
            inc.process.kill().unwrap(); // SIGKILL
            let status = inc.process.wait().unwrap();
            if status.signal() != Some(libc::SIGKILL) {
                failures.push((
                    slot,
                    format!(
                        "ended by itself {:.3} s into the run: {status}",
                        started.elapsed().as_secs_f64()
                    ),
                ));
                children.0[slot] = Some(inc);
                continue;
            }
            kill_log.push(format!(
                "{:.3} s: slot {slot} ({}) incarnation {} killed",
                started.elapsed().as_secs_f64(),
                role(slot).name,
                incarnations[slot]
            ));
            kills[slot] += 1;
            incarnations[slot] += 1;
            children.0[slot] = Some(spawn(
                slot,
                incarnations[slot],
                dir.path(),
                v.wal,
                rng.gen(),
            ));
            next_kill = Instant::now() + Duration::from_millis(rng.gen_range(100..500));
        }
    }
    // Stop: every child finishes its transaction and exits (or has already).
    shared.word(STOP).store(1, SeqCst);
    for slot in 0..processes {
        let inc = children.0[slot].as_mut().unwrap();
        let until = Instant::now() + Duration::from_secs(90);
        let status = loop {
            if let Some(status) = inc.process.try_wait().unwrap() {
                break Some(status);
            }
            if Instant::now() > until {
                let _ = inc.process.kill();
                let _ = inc.process.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let already = failures.iter().any(|f| f.0 == slot);
        match status {
            Some(s) if s.success() && read(&inc.out).contains("CHILD DONE") => {}
            _ if already => {}
            Some(s) => failures.push((slot, format!("failed at the end: {s}"))),
            None => failures.push((slot, "did not stop within 90 s".to_string())),
        }
    }
    let elapsed = started.elapsed();
    drop(children);

    // Every VIOLATION line of every incarnation (a killed one may have printed some too).
    let mut violations = Vec::new();
    for (slot, &last) in incarnations.iter().enumerate() {
        for n in 1..=last {
            let out = read(&dir.path().join(format!("slot-{slot}-{n}.out")));
            violations.extend(
                // (The first line may follow libtest's "test child_entry ... " on its line.)
                out.lines()
                    .filter_map(|l| {
                        ["VIOLATION", "CHILD PANIC", "HUNG"]
                            .iter()
                            .filter_map(|w| l.find(w))
                            .min()
                            .map(|at| &l[at..])
                    })
                    .map(|l| format!("[{slot}.{n}] {l}")),
            );
        }
    }

    let field = |slot, f| shared.field(slot, f);
    let sum = |f| (0..processes).map(|s| field(s, f)).sum::<u64>();
    let sum_kind = |f, kinds: &[Kind]| {
        (0..processes)
            .filter(|&s| kinds.contains(&role(s).kind))
            .map(|s| field(s, f))
            .sum::<u64>()
    };
    let mut report = format!(
        "{}: {:.1} s, {processes} processes, BPE_WAL_TRANSFERS_SEED={seed}; per slot: kills, \
         transfers, checked reads, busy, checkpoints done/busy, connections opened; bpe: L1 \
         hits, page reads, extension reads (of other processes' pages), file invalidations, \
         pages forgotten, pages restored\n",
        v.name,
        elapsed.as_secs_f64()
    );
    for (slot, killed) in kills.iter().enumerate() {
        report += &format!(
            "  slot {slot} ({}): {} kills, {} transfers, {} reads, {} busy, {}/{} checkpoints, \
             {} connections",
            role(slot).name,
            killed,
            field(slot, TRANSFERS),
            field(slot, READS),
            field(slot, BUSY),
            field(slot, CHECKPOINTS),
            field(slot, CHECKPOINTS_BUSY),
            field(slot, CONNECTIONS),
        );
        if role(slot).kind != Kind::Plain {
            report += &format!(
                "; {} hits, {} page reads, {} ext reads ({}), {} invalidations, {} forgotten, \
                 {} restored",
                field(slot, L1_HITS),
                field(slot, PAGE_READS),
                field(slot, EXT_READS),
                field(slot, EXT_SHARED_READS),
                field(slot, INVALIDATIONS),
                field(slot, FORGOTTEN),
                field(slot, RESTORED),
            );
        }
        report += "\n";
    }
    let (transfers, reads) = (sum(TRANSFERS), sum(READS));
    report += &format!(
        "SUMMARY {}: {:.1} s, {processes} processes, {} kills, {transfers} transfers, {reads} \
         checked read transactions, {} busy, {} checkpoints, WAL restarts seen >= {restarts}, \
         {} violations",
        v.name,
        elapsed.as_secs_f64(),
        kills.iter().sum::<usize>(),
        sum(BUSY),
        sum(CHECKPOINTS),
        violations.len()
    );
    println!("{report}");

    if !failures.is_empty() || !violations.is_empty() {
        let mut msg = format!(
            "{}: BPE_WAL_TRANSFERS_SEED={seed}: {} violation lines, {} children failed\n",
            v.name,
            violations.len(),
            failures.len()
        );
        for l in violations.iter().take(80) {
            msg += &format!("{l}\n");
        }
        for (slot, why) in &failures {
            let n = incarnations[*slot];
            msg += &format!(
                "--- slot {slot} ({}), incarnation {n}: {why}\n--- stderr (tail) ---\n{}\n",
                role(*slot).name,
                tail(&read(&dir.path().join(format!("slot-{slot}-{n}.err"))), 30)
            );
        }
        if !kill_log.is_empty() {
            msg += "--- the last kills ---\n";
            for l in &kill_log[kill_log.len().saturating_sub(12)..] {
                msg += &format!("{l}\n");
            }
        }
        // Whether the damage reached the database file (a stale page a writer built on).
        let check = open_plain(&db).and_then(|c| {
            c.prepare("PRAGMA integrity_check")?
                .query_map([], |r| r.get::<_, String>(0))?
                .take(10)
                .collect::<rusqlite::Result<Vec<String>>>()
        });
        msg += &format!("--- integrity_check of the database now (plain SQLite) ---\n{check:?}\n");
        msg += &report;
        // The database, its WAL and every child's output, for a post-mortem.
        msg += &format!("\nthe run's files are kept in {}", dir.keep().display());
        panic!("{msg}");
    }

    // The database, through plain SQLite.
    let c = open_plain(&db).unwrap();
    let integrity: Vec<String> = c
        .prepare("PRAGMA integrity_check")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(integrity, ["ok"], "{}: integrity_check", v.name);
    let mut problems = Vec::new();
    let (mut n, mut total, mut vsum) = (0i64, 0i64, 0i64);
    {
        let mut stmt = c.prepare(SCAN).unwrap();
        let mut rows = stmt.query([]).unwrap();
        while let Some(r) = rows.next().unwrap() {
            let id: i64 = r.get(0).unwrap();
            let row: Row = (
                r.get(1).unwrap(),
                r.get(2).unwrap(),
                r.get(3).unwrap(),
                r.get(4).unwrap(),
                r.get(5).unwrap(),
            );
            n += 1;
            assert_eq!(id, n, "{}: accounts missing", v.name);
            check_row(
                id,
                row,
                shared.version_word(id).load(SeqCst),
                0,
                &mut problems,
            );
            total += row.0;
            vsum += row.1;
        }
    }
    assert!(
        problems.is_empty(),
        "{}: the final database: {problems:#?}",
        v.name
    );
    assert_eq!(
        (n, total),
        (ACCOUNTS as i64, TOTAL),
        "{}: the total",
        v.name
    );
    let by_index: (i64, i64, i64) = c
        .query_row(BY_INDEX, [], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap();
    assert_eq!(by_index, (n, total, vsum), "{}: the index", v.name);
    // Every transfer reported committed bumped two versions.
    assert!(
        vsum as u64 >= 2 * transfers,
        "{}: versions sum to {vsum}, {transfers} transfers were reported committed",
        v.name
    );

    // The run tested something (rollback mode on a loaded 2-core machine does ~100 of each in
    // the default 8 s: writers and readers take turns there).
    assert!(
        transfers >= 30 && reads >= 30,
        "{}: too little work: {transfers} transfers, {reads} checked read transactions",
        v.name
    );
    for slot in 0..processes {
        assert!(
            field(slot, TRANSFERS) > 0 && field(slot, READS) > 0,
            "{}: slot {slot} ({}) did not both transfer and read",
            v.name,
            role(slot).name
        );
    }
    let bpe_kinds = [Kind::Bpe, Kind::PrivateExtension, Kind::SharedExtension];
    assert!(
        sum_kind(L1_HITS, &bpe_kinds) > 0 && sum_kind(PAGE_READS, &bpe_kinds) > 0,
        "{}: the bpe processes were served no page from their pools",
        v.name
    );
    assert!(
        sum_kind(EXT_READS, &[Kind::PrivateExtension]) > 0,
        "{}: no page was served from a private extension",
        v.name
    );
    assert!(
        sum_kind(EXT_READS, &[Kind::SharedExtension]) > 0,
        "{}: no page was served from the shared extension",
        v.name
    );
    assert!(
        sum_kind(INVALIDATIONS, &bpe_kinds) + sum_kind(FORGOTTEN, &bpe_kinds) > 0,
        "{}: no bpe process ever noticed another's change",
        v.name
    );
    if v.wal {
        assert!(sum(CHECKPOINTS) > 0, "{}: no checkpoint completed", v.name);
        assert!(restarts > 0, "{}: the WAL never restarted", v.name);
    }
}

#[test]
fn transfers_in_wal_mode() {
    run("WAL", false);
}

#[test]
fn transfers_in_wal_mode_with_kills() {
    run("WAL", true);
}

#[test]
fn transfers_in_rollback_mode() {
    run("DELETE", false);
}

#[test]
fn transfers_in_rollback_mode_with_kills() {
    run("DELETE", true);
}
