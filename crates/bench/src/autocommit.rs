//! The cost of a read transaction. Random point lookups on a table that fits in memory, each in
//! its own (autocommit) transaction or all inside one, in rollback-journal and WAL mode, through
//! the bpe VFS and through stock SQLite (the unix VFS, SQLite's page cache given the same memory);
//! then the same autocommit reader beside a plain SQLite process that commits an updated row
//! every 10 ms.
//!
//! Every read transaction makes the VFS check whether another process changed the file: in
//! rollback mode SQLite reads the change counter (16 bytes at offset 24) and bpe with it the
//! file's stamp; in WAL mode the wal-index. What this costs on a cached database, and what a
//! foreign commit costs afterwards (bpe forgets the file's cached pages when another process
//! committed in rollback mode, and refetches them from the data device), is what this measures.

use crate::args::{selected, AutocommitArgs};
use crate::child::{start, Helper, Runner};
use crate::db::{self, Journal, Sqlite};
use crate::progress;
use crate::reference::measure_reference;
use crate::report::{print_storage, print_table_left, ratio, BenchReport, ConfigResult};
use crate::storage::{db_bytes, Storage};
use anyhow::Context;
use rand::{rngs::StdRng, Rng, SeedableRng};
use rusqlite::Connection;
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The configurations, in the order they run and print.
pub const CONFIGS: [&str; 26] = [
    "rollback_txn",
    "rollback_autocommit",
    "wal_txn",
    "wal_autocommit",
    "stock_rollback_txn",
    "stock_rollback_autocommit",
    "stock_wal_txn",
    "stock_wal_autocommit",
    "beside_writer_rollback",
    "stock_beside_writer_rollback",
    "beside_writer_wal",
    "stock_beside_writer_wal",
    "rollback_defaults",
    "stock_rollback_defaults",
    "wal_defaults",
    "stock_wal_defaults",
    "rollback_per_connection",
    "stock_rollback_per_connection",
    "wal_per_connection",
    "stock_wal_per_connection",
    "rollback_per_connection_sql_on_demand",
    "wal_per_connection_sql_on_demand",
    "rollback_per_connection_threads",
    "stock_rollback_per_connection_threads",
    "wal_per_connection_threads",
    "stock_wal_per_connection_threads",
];

/// Threads of the `*_per_connection_threads` configurations, each opening a connection per
/// lookup: a web server's request handlers. Opens and closes then race each other's (a close
/// that is the file's last in the process, an open that is its first).
const REQUEST_THREADS: usize = 4;

/// SQLite's default page cache (`PRAGMA cache_size = -2000`), KiB: what an application that
/// never sets it runs with. The `*_defaults` configurations give it to bpe and to stock alike,
/// so that they compare turning the cache on in such an application: bpe's L1 then stands
/// where stock has the OS page cache, with the same memory for either.
const SQLITE_DEFAULT_CACHE_KIB: u64 = 2000;

/// The writer beside a reader, as [`crate::run_child`] knows it.
pub const WRITER: &str = "autocommit_writer";

/// The table is the lookup benchmark's: rows of this many bytes.
const ROW_BYTES: usize = 1000;
const SEED: u64 = 20260101;

/// What the name of a configuration says: stock or bpe, journal, one transaction or autocommit,
/// a writer beside it.
struct Shape {
    stock: bool,
    journal: Journal,
    txn: bool,
    writer: bool,
    /// SQLite's default page cache on both sides (see [`SQLITE_DEFAULT_CACHE_KIB`]).
    defaults: bool,
    /// A new connection for each lookup, closed after it (a web request's), with SQLite's
    /// defaults: nothing else holds the file open meanwhile.
    per_connection: bool,
    /// Threads looking up (1, or [`REQUEST_THREADS`] for a connection per lookup on each).
    threads: usize,
    /// bpe with `BPE_SQL_SURFACE=on-demand`: a connection opened for a lookup gets no SQL
    /// functions or virtual tables (the warm connection asks for them).
    sql_on_demand: bool,
}

fn shape(name: &str) -> Shape {
    Shape {
        stock: name.starts_with("stock_"),
        journal: if name.contains("rollback") {
            Journal::Delete
        } else {
            Journal::Wal
        },
        txn: name.ends_with("_txn"),
        writer: name.contains("beside_writer"),
        defaults: name.ends_with("_defaults") || name.contains("_per_connection"),
        per_connection: name.contains("_per_connection"),
        threads: if name.ends_with("_threads") {
            REQUEST_THREADS
        } else {
            1
        },
        sql_on_demand: name.ends_with("_sql_on_demand"),
    }
}

fn describe(s: &Shape, memory_mb: u64, interval_ms: u64) -> String {
    let sqlite = if s.defaults && s.stock {
        format!(
            "stock SQLite (unix VFS, SQLite's default {SQLITE_DEFAULT_CACHE_KIB} KiB page cache, \
             the OS page cache under it)"
        )
    } else if s.defaults {
        let surface = match s.sql_on_demand {
            true => ", SQL functions on demand",
            false => "",
        };
        format!(
            "bpe ({memory_mb} MB max server memory, SQLite's default {SQLITE_DEFAULT_CACHE_KIB} \
             KiB page cache{surface})"
        )
    } else if s.stock {
        format!("stock SQLite (unix VFS, {memory_mb} MB page cache)")
    } else {
        format!("bpe ({memory_mb} MB max server memory)")
    };
    let how = if s.txn {
        "all lookups in one transaction"
    } else if s.per_connection && s.threads > 1 {
        "a new connection for each lookup, on each of 4 threads"
    } else if s.per_connection {
        "a new connection for each lookup"
    } else {
        "autocommit lookups"
    };
    let writer = if s.writer {
        format!(", a plain SQLite process commits a row every {interval_ms} ms")
    } else {
        String::new()
    };
    format!("{sqlite}, {} journal, {how}{writer}", s.journal.label())
}

/// What a reader's process runs on its setup.
#[derive(Serialize, Deserialize)]
struct Reads {
    rows: u64,
    /// All lookups inside one transaction.
    txn: bool,
    /// The connection's page cache set back to SQLite's default (bpe's benchmark connections
    /// otherwise keep theirs at [`db::PAGER_CACHE_KIB`]).
    default_cache: bool,
    /// Each lookup on a connection of its own (see [`Shape::per_connection`]).
    #[serde(default)]
    per_connection: bool,
    /// Threads looking up, each with a connection per lookup when more than one.
    #[serde(default = "one")]
    threads: usize,
    seconds: f64,
    writer: Option<WriterConfig>,
    /// Where the writer's results go.
    work_dir: PathBuf,
}

/// The plain SQLite writer beside a reader (a process of its own, the unix VFS).
#[derive(Clone, Serialize, Deserialize)]
struct WriterConfig {
    db: PathBuf,
    rows: u64,
    journal: Journal,
    interval_ms: u64,
    /// Stops by itself after this long even if nobody tells it to.
    max_seconds: f64,
}

/// What the writer reports: when each commit returned (CLOCK_MONOTONIC, shared by the
/// processes of the machine), how long it took, and the row it updated. Commit `i` (from 0)
/// writes its sequence number `i + 1` into the first 10 bytes of the row.
#[derive(Default, Serialize, Deserialize)]
pub struct WriterResult {
    commits_ns: Vec<u64>,
    commit_us: Vec<f64>,
    ids: Vec<u64>,
}

/// One timed read: when it started (CLOCK_MONOTONIC ns), how long it took (ns), the row and the
/// writer's sequence number found in it (0: never updated).
#[derive(Clone, Copy)]
struct Read {
    start: u64,
    took: u32,
    id: u64,
    seq: u64,
}

/// Runs the benchmark and prints its results; returns them.
pub fn run(a: &AutocommitArgs) -> anyhow::Result<BenchReport> {
    let c = &a.common;
    crate::args::check_configs(c.configs.as_deref(), CONFIGS, "autocommit")?;
    let quick = c.quick;
    let rows = a.rows.unwrap_or(if quick { 4_000 } else { 20_000 });
    let seconds = a.seconds.unwrap_or(if quick { 1.0 } else { 5.0 });
    let storage = Storage::from_args_or(c, "autocommit", "emulated:2ms")?;
    // A database for each journal mode, left in that mode, so that no run switches a file's.
    let db_for = |j: Journal| {
        storage
            .data_dir
            .join(format!("autocommit-{rows}-{}.db", j.label()))
    };
    for journal in [Journal::Delete, Journal::Wal] {
        let path = db_for(journal);
        crate::lookup::load(&path, rows, c.reload)?;
        open_plain(&path, journal)?;
    }
    let size_mb = db_bytes(&db_for(Journal::Delete)) >> 20;
    let memory_mb = a.memory_mb.unwrap_or(size_mb * 3 / 2 + 32);
    let reference = measure_reference(c, &storage)?;
    let mut report = BenchReport::new("autocommit", storage.clone(), reference);
    report.vfs = "bpe and unix (stock_*)".into();
    report.parameters = json!({
        "rows": rows, "row_bytes": ROW_BYTES, "seconds_per_config": seconds,
        "memory_mb": memory_mb, "database_mb": size_mb,
        "bpe_pager_cache_kib": db::bpe_pager_cache_kib()?, "stock_pager_cache_kib": memory_mb * 1024,
        "writer_interval_ms": a.writer_interval_ms, "quick": quick,
    });
    print_storage(&storage, report.reference.as_ref());
    println!(
        "databases:    {} and -wal.db ({size_mb} MB, {rows} rows of {ROW_BYTES} bytes); memory {memory_mb} MB",
        db_for(Journal::Delete).display()
    );
    let runner = Runner {
        bench: "autocommit",
        storage: &storage,
        sample_ms: c.sample_ms,
    };
    for name in CONFIGS {
        if !selected(c.configs.as_deref(), name) {
            continue;
        }
        let s = shape(name);
        let description = describe(&s, memory_mb, a.writer_interval_ms);
        let db = db_for(s.journal);
        let mut setup = runner.setup(name, description, &db, None);
        setup.journal = s.journal;
        if s.stock {
            setup.sqlite = Sqlite::Stock {
                cache_kib: match s.defaults {
                    true => SQLITE_DEFAULT_CACHE_KIB,
                    false => memory_mb * 1024,
                },
            };
        }
        let reads = Reads {
            rows,
            txn: s.txn,
            default_cache: s.defaults,
            per_connection: s.per_connection,
            threads: s.threads,
            seconds,
            writer: s.writer.then(|| WriterConfig {
                db: db.clone(),
                rows,
                journal: s.journal,
                interval_ms: a.writer_interval_ms,
                max_seconds: seconds + 120.0,
            }),
            work_dir: storage.ext_dir.clone(),
        };
        // Stock SQLite reads through the OS page cache: the emulation is bpe's, for its data
        // file reads, and is not set for the stock configurations. bpe's SQL surface is set
        // either way, so that none is inherited from the environment.
        let surface = match s.sql_on_demand {
            true => "on-demand",
            false => "every-connection",
        };
        eprintln!("== {}: {}", setup.name, setup.description);
        let running = runner.spawn(
            setup,
            reads,
            memory_mb,
            !s.stock,
            &[("BPE_SQL_SURFACE", surface)],
        )?;
        report.configs.extend(running.finish()?);
    }
    report.summary = summarize(&report);
    print_results(&report);
    Ok(report)
}

fn one() -> usize {
    1
}

/// Monotonic nanoseconds, comparable between the processes of one machine.
fn mono_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a plain syscall writing the struct we pass.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

const LOOKUP: &str = "SELECT n FROM t WHERE id = ?1";

/// A looked-up row's length and the writer's sequence number in it.
fn row_read(r: &rusqlite::Row) -> rusqlite::Result<(usize, u64)> {
    let b = r.get_ref(0)?.as_bytes()?;
    Ok((b.len(), sequence_number(b)))
}

/// Looks up random rows with `lookup` for `window`, counting each in `ops`; the reads, timed.
fn timed_lookups(
    mut rng: StdRng,
    rows: u64,
    window: Duration,
    ops: &AtomicU64,
    mut lookup: impl FnMut(i64) -> anyhow::Result<(usize, u64)>,
) -> anyhow::Result<Vec<Read>> {
    let mut reads = Vec::with_capacity(1 << 18);
    let t = Instant::now();
    while t.elapsed() < window {
        let id = rng.gen_range(1..=rows);
        let start = mono_ns();
        let (len, seq) = lookup(id as i64)?;
        let took = mono_ns() - start;
        anyhow::ensure!(len == ROW_BYTES, "a lookup returned a wrong row");
        reads.push(Read {
            start,
            took: took.min(u32::MAX as u64) as u32,
            id,
            seq,
        });
        ops.fetch_add(1, Relaxed);
    }
    Ok(reads)
}

/// Times a connection found the database locked by the writer and waited.
static BUSY_WAITS: AtomicU64 = AtomicU64::new(0);

/// SQLite's own busy handler sleeps 1, 2, 5, 10 ... ms, a quantum far longer than the reads
/// measured here: the readers and the writer retry every 20 µs instead (up to a minute), so
/// that a collision costs what the lock holder takes, not a sleep.
fn busy_retry(n: i32) -> bool {
    BUSY_WAITS.fetch_add(1, Relaxed);
    std::thread::sleep(Duration::from_micros(20));
    n < 3_000_000
}

/// The child: one configuration's reader, timed.
pub fn child(config: serde_json::Value, sample_ms: u64) -> anyhow::Result<Vec<ConfigResult>> {
    let (setup, cfg, conn) = start::<Reads>(config)?;
    conn.busy_handler(Some(busy_retry))?;
    if cfg.default_cache {
        conn.execute_batch(&format!("PRAGMA cache_size = -{SQLITE_DEFAULT_CACHE_KIB};"))?;
    }
    // SQLite's page cache as the connection has it (negative cache_size: KiB).
    let cache_size: i64 = conn.query_row("PRAGMA cache_size", [], |r| r.get(0))?;
    let mut details = json!({
        "vfs": setup.sqlite.vfs(),
        "journal": setup.journal.label(),
        "transaction": if cfg.txn { "one" } else { "autocommit" },
        "connection": if cfg.per_connection { "one per lookup" } else { "one" },
        "threads": cfg.threads,
        "pager_cache_kib": -cache_size,
    });
    if cfg.per_connection {
        // Whether a request's connection has bpe's SQL functions (not with
        // `BPE_SQL_SURFACE=on-demand`, nor on stock SQLite): what the `_sql_on_demand` arms vary.
        let c = db::open_for_request(&setup.db, setup.sqlite)?;
        details["request_sql_surface"] = json!(c.prepare("SELECT bpe_exec('')").is_ok());
    }
    let writer = match &cfg.writer {
        Some(w) => Some(Writer::start(w, &cfg.work_dir)?),
        None => None,
    };
    // Everything cached before the timed reads: a full scan (bpe: into its pool; stock: into
    // SQLite's page cache and the OS page cache). After the writer's first commit, which in WAL
    // mode starts a new WAL and so empties bpe's cache of the file (what another process's
    // restart followed cannot be known): the timed reads see the steady state of a writer
    // beside them, not the refill after that.
    let t = Instant::now();
    let _: i64 = conn.query_row("SELECT sum(length(n)) FROM t", [], |r| r.get(0))?;
    details["warm_seconds"] = json!(t.elapsed().as_secs_f64());
    BUSY_WAITS.store(0, Relaxed);
    let sp = progress::spinner(&setup.name);
    sp.set_message(format!("{} s of lookups", cfg.seconds));
    // Per connection: the warm connection closes first, so that each lookup's open and close
    // are the file's first and last, as for a request served alone.
    let conn = (!cfg.per_connection).then_some(conn);
    let mut q = conn.as_ref().map(|c| c.prepare(LOOKUP)).transpose()?;
    let request = |id: i64| -> anyhow::Result<(usize, u64)> {
        let c = db::open_for_request(&setup.db, setup.sqlite)?;
        Ok(c.query_row(LOOKUP, [id], row_read)?)
    };
    let mut reads: Vec<Read> = Vec::with_capacity(1 << 20);
    let window = Duration::from_secs_f64(cfg.seconds);
    let mut result = ConfigResult::measure(&setup.name, &setup.description, sample_ms, |ops| {
        if let (true, Some(c)) = (cfg.txn, &conn) {
            c.execute_batch("BEGIN")?;
        }
        if cfg.threads > 1 {
            let each = std::thread::scope(|scope| {
                let threads: Vec<_> = (0..cfg.threads)
                    .map(|i| {
                        let rng = StdRng::seed_from_u64(SEED + i as u64);
                        scope.spawn(move || timed_lookups(rng, cfg.rows, window, ops, request))
                    })
                    .collect();
                threads
                    .into_iter()
                    .map(|t| t.join().expect("a lookup thread panicked"))
                    .collect::<anyhow::Result<Vec<_>>>()
            })?;
            reads.extend(each.into_iter().flatten());
        } else {
            let rng = StdRng::seed_from_u64(SEED);
            reads = timed_lookups(rng, cfg.rows, window, ops, |id| match q.as_mut() {
                Some(q) => Ok(q.query_row([id], row_read)?),
                None => request(id),
            })?;
        }
        if let (true, Some(c)) = (cfg.txn, &conn) {
            c.execute_batch("COMMIT")?;
        }
        Ok(details)
    })?;
    sp.finish_and_clear();
    let busy_waits = BUSY_WAITS.load(Relaxed);
    let writer = match writer {
        Some(w) => Some(w.stop()?),
        None => None,
    };
    let (k, seconds) = (&result.counters, result.seconds);
    // Per read; None without an engine counting (stock SQLite).
    let per_read = |x: u64| k.engine.then(|| x as f64 / reads.len().max(1) as f64);
    let d = &mut result.details;
    d["reads_per_s"] = json!(reads.len() as f64 / seconds);
    d["latency_us"] = stats(reads.iter().map(|r| r.took as f64 / 1e3).collect());
    d["busy_waits"] = json!(busy_waits);
    d["file_cache_invalidations"] = json!(k.engine.then_some(k.file_invalidations));
    d["pages_forgotten"] = json!(k.engine.then_some(k.pages_forgotten));
    d["data_page_reads_per_read"] = json!(per_read(k.page_reads));
    d["page_lookups_per_read"] = json!(per_read(k.page_lookups));
    if let Some(w) = &writer {
        d["writer"] = writer_details(w, &reads, seconds);
        let stale = stale_reads(w, &reads);
        d["stale_reads"] = json!(stale);
        anyhow::ensure!(
            stale == 0,
            "{stale} reads returned a row older than a commit that had returned before they began"
        );
    }
    Ok(vec![result])
}

/// Mean and percentiles of a sample, in the sample's unit.
fn stats(mut v: Vec<f64>) -> serde_json::Value {
    if v.is_empty() {
        return json!(null);
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    let at = |p: f64| v[((n as f64 * p) as usize).min(n - 1)];
    json!({
        "n": n,
        "mean": v.iter().sum::<f64>() / n as f64,
        "p50": at(0.50),
        "p90": at(0.90),
        "p99": at(0.99),
        "p999": at(0.999),
        "max": v[n - 1],
    })
}

/// The writer's sequence number at the start of a row (0 for a row it never updated).
fn sequence_number(row: &[u8]) -> u64 {
    row.get(..10)
        .and_then(|b| std::str::from_utf8(b).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

/// Reads that returned a version of their row older than one whose commit had returned before
/// the read began: a stale page served after another process's commit.
fn stale_reads(w: &WriterResult, reads: &[Read]) -> u64 {
    let mut by_id: std::collections::HashMap<u64, Vec<(u64, u64)>> = Default::default();
    for (i, (&at, &id)) in w.commits_ns.iter().zip(&w.ids).enumerate() {
        by_id.entry(id).or_default().push((at, i as u64 + 1));
    }
    reads
        .iter()
        .filter(|r| {
            let Some(commits) = by_id.get(&r.id) else {
                return false;
            };
            let done = commits.partition_point(|c| c.0 < r.start);
            done > 0 && r.seq < commits[done - 1].1
        })
        .count() as u64
}

/// The writer's commits during the timed window, and the reads that came first after each
/// commit (the ones that see the change first) apart from the others.
fn writer_details(w: &WriterResult, reads: &[Read], seconds: f64) -> serde_json::Value {
    let (Some(first), Some(last)) = (reads.first(), reads.last()) else {
        return json!(null);
    };
    let (lo, hi) = (first.start, last.start + last.took as u64);
    let commits: Vec<u64> = w
        .commits_ns
        .iter()
        .copied()
        .filter(|c| (lo..hi).contains(c))
        .collect();
    let mut first_after = vec![false; reads.len()];
    for c in &commits {
        let i = reads.partition_point(|r| r.start < *c);
        if i < reads.len() {
            first_after[i] = true;
        }
    }
    let pick = |want: bool| -> Vec<f64> {
        reads
            .iter()
            .zip(&first_after)
            .filter(|(_, f)| **f == want)
            .map(|(r, _)| r.took as f64 / 1e3)
            .collect()
    };
    json!({
        "commits": commits.len(),
        "commits_per_s": commits.len() as f64 / seconds,
        "commit_us": stats(w.commit_us.clone()),
        "first_read_after_commit_us": stats(pick(true)),
        "other_reads_us": stats(pick(false)),
    })
}

/// A running writer process.
struct Writer(Helper);

impl Writer {
    /// Starts the writer and waits for its first commit.
    fn start(cfg: &WriterConfig, work_dir: &Path) -> anyhow::Result<Writer> {
        let mut helper = Helper::start(WRITER, cfg, work_dir)?;
        let out = helper
            .process
            .stdout
            .take()
            .context("the writer's stdout")?;
        let mut line = String::new();
        BufReader::new(out).read_line(&mut line)?;
        if line.trim() != "ready" {
            let _ = helper.process.kill();
            let _ = helper.process.wait();
            anyhow::bail!("the writer did not start ({:?})", line.trim());
        }
        Ok(Writer(helper))
    }

    /// Tells the writer to stop (its stdin closes) and collects what it did.
    fn stop(mut self) -> anyhow::Result<WriterResult> {
        drop(self.0.process.stdin.take());
        self.0.finish()
    }
}

/// Plain SQLite (the unix VFS, default settings) on `db` in `journal` mode, waiting for locks
/// as the readers do.
fn open_plain(db: &Path, journal: Journal) -> anyhow::Result<Connection> {
    let conn = Connection::open(db)?;
    conn.busy_handler(Some(busy_retry))?;
    conn.execute_batch(&format!("PRAGMA journal_mode = {};", journal.pragma()))?;
    Ok(conn)
}

/// The writer process: plain SQLite (the unix VFS, default settings but the busy handler),
/// one `UPDATE` of a random row per interval, each its own transaction, until its stdin closes.
/// Every commit changes a page (a fresh value), so every commit is one a reader must notice.
pub fn writer(config: serde_json::Value) -> anyhow::Result<WriterResult> {
    let cfg: WriterConfig = serde_json::from_value(config)?;
    let conn = open_plain(&cfg.db, cfg.journal)?;
    let stop = Arc::new(AtomicBool::new(false));
    {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut sink = Vec::new();
            let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut sink);
            stop.store(true, Relaxed);
        });
    }
    // Each run writes values no run wrote before: SQLite skips a page whose content an UPDATE
    // leaves as it was, and a transaction that changed no page commits nothing (no new change
    // counter, nothing for a reader to notice), so a rerun with the same rows and values would
    // measure nothing.
    let nonce = mono_ns();
    let mut rng = StdRng::seed_from_u64(nonce);
    let mut up = conn.prepare("UPDATE t SET n = ?2 WHERE id = ?1")?;
    let mut r = WriterResult::default();
    let interval = Duration::from_millis(cfg.interval_ms);
    let start = Instant::now();
    let max = Duration::from_secs_f64(cfg.max_seconds);
    let mut next = start;
    while !stop.load(Relaxed) && start.elapsed() < max {
        let id = rng.gen_range(1..=cfg.rows);
        let seq = r.commits_ns.len() + 1;
        let value = format!("{seq:>10}{nonce:>20}{}", "B".repeat(ROW_BYTES - 30));
        let t = Instant::now();
        up.execute(rusqlite::params![id as i64, value])?;
        r.commit_us.push(t.elapsed().as_secs_f64() * 1e6);
        r.commits_ns.push(mono_ns());
        r.ids.push(id);
        if r.commits_ns.len() == 1 {
            let mut out = std::io::stdout();
            writeln!(out, "ready")?;
            out.flush()?;
        }
        next += interval;
        let now = Instant::now();
        if next > now {
            std::thread::sleep(next - now);
        } else {
            next = now;
        }
    }
    Ok(r)
}

/// The ratios of configurations: how much faster one reads than another, and what a read costs
/// beside a writer, bpe over stock.
fn summarize(r: &BenchReport) -> serde_json::Value {
    let rate = |n: &str| r.config(n).map(|c| c.operations as f64 / c.seconds);
    let lat = |n: &str, q: &str| {
        r.config(n)
            .and_then(|c| c.details["latency_us"][q].as_f64())
    };
    // (key, numerator, denominator)
    let mut ratios = Vec::new();
    // How much faster `a` reads than `b`: by lookups per second, and (`_p50`) by the median
    // lookup, less sensitive than the mean to a busy machine's preemptions.
    let mut faster = |key: String, a: &str, b: &str| {
        ratios.push((format!("{key}_p50"), lat(b, "p50"), lat(a, "p50")));
        ratios.push((key, rate(a), rate(b)));
    };
    for prefix in ["", "stock_"] {
        for j in ["rollback", "wal"] {
            let a = format!("{prefix}{j}_autocommit");
            faster(format!("{a}_over_txn"), &a, &format!("{prefix}{j}_txn"));
        }
    }
    for j in ["rollback", "wal"] {
        for m in ["txn", "autocommit", "defaults", "per_connection"] {
            let b = format!("{j}_{m}");
            faster(format!("{b}_bpe_over_stock"), &b, &format!("stock_{b}"));
        }
        // bpe with its SQL functions on demand, against the same stock arm.
        let b = format!("{j}_per_connection_sql_on_demand");
        let k = format!("stock_{j}_per_connection");
        faster(format!("{b}_bpe_over_stock"), &b, &k);
    }
    // What a read costs beside a writer, bpe over stock: mean, median, 99th percentile.
    for j in ["rollback", "wal"] {
        let (b, k) = (
            format!("beside_writer_{j}"),
            format!("stock_beside_writer_{j}"),
        );
        for (q, suffix) in [("mean", ""), ("p50", "_p50"), ("p99", "_p99")] {
            let key = format!("{b}_read_cost_bpe_over_stock{suffix}");
            ratios.push((key, lat(&b, q), lat(&k, q)));
        }
    }
    let mut s = json!({});
    for (key, x, y) in ratios {
        if let (Some(x), Some(y)) = (x, y) {
            s[key] = json!(ratio(x, y));
        }
    }
    s
}

fn print_results(r: &BenchReport) {
    println!();
    let us = |v: &serde_json::Value| v.as_f64().map_or("-".into(), |x| format!("{x:.1}"));
    let mut rows = Vec::new();
    for c in &r.configs {
        let d = &c.details;
        let l = &d["latency_us"];
        rows.push(vec![
            c.name.clone(),
            d["vfs"].as_str().unwrap_or("").into(),
            format!("{:.0}", c.operations as f64 / c.seconds),
            us(&l["mean"]),
            us(&l["p50"]),
            us(&l["p99"]),
            d["data_page_reads_per_read"]
                .as_f64()
                .map_or("-".into(), |v| format!("{v:.3}")),
            d["file_cache_invalidations"]
                .as_u64()
                .map_or("-".into(), |v| v.to_string()),
            d["writer"]["commits"]
                .as_u64()
                .map_or("-".into(), |v| v.to_string()),
            us(&d["writer"]["first_read_after_commit_us"]["mean"]),
            us(&d["writer"]["other_reads_us"]["mean"]),
            d["busy_waits"].to_string(),
        ]);
    }
    print_table_left(
        &[
            "config",
            "vfs",
            "lookups/s",
            "mean µs",
            "p50 µs",
            "p99 µs",
            "data reads/lookup",
            "invalidations",
            "commits",
            "1st after commit µs",
            "others µs",
            "busy waits",
        ],
        &rows,
        2,
    );
    println!();
    let s = &r.summary;
    println!("{:<58} {:>8}  {:>8}", "ratio", "rate/mean", "p50");
    let mut lines = Vec::new();
    for (sqlite, prefix) in [("bpe", ""), ("stock", "stock_")] {
        for j in ["rollback", "wal"] {
            let label = format!("{sqlite} {j}: autocommit / one transaction (lookups/s)");
            lines.push((label, format!("{prefix}{j}_autocommit_over_txn")));
        }
    }
    for j in ["rollback", "wal"] {
        for m in [
            "txn",
            "autocommit",
            "defaults",
            "per_connection",
            "per_connection_sql_on_demand",
        ] {
            let label = format!("{j} {m}: bpe / stock (lookups/s)");
            lines.push((label, format!("{j}_{m}_bpe_over_stock")));
        }
    }
    for j in ["rollback", "wal"] {
        let label = format!("beside a writer, {j}: bpe / stock read time");
        lines.push((label, format!("beside_writer_{j}_read_cost_bpe_over_stock")));
    }
    let f = |k: &str| s[k].as_f64().map_or("-".into(), |v| format!("{v:.2}"));
    for (label, key) in lines {
        let target = match key.as_str() {
            "rollback_autocommit_over_txn" => "(target >= 0.8)",
            k if k.contains("read_cost") => "(target <= 2)",
            _ => "",
        };
        if s[&key].as_f64().is_some() {
            let p50 = f(&format!("{key}_p50"));
            println!("{label:<58} {:>8}  {p50:>8}   {target}", f(&key));
        }
    }
}
