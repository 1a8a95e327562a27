//! The OLTP benchmark: a TPC-C-like workload written from the public specification (nine
//! tables, five transaction types in the specified mix, consistency conditions 1-4 checked at the
//! end), with memory at 100 % and 25 % of the database, extension on and off.
//!
//! Not a TPC-C result: no keying or think times (every terminal runs back to back, as HammerDB
//! does), no response-time constraints, and the run is minutes, not hours.
//!
//! The terminals are threads of one process with a connection each. In most configurations
//! their write transactions take turns in an in-process queue and a separate connection
//! checkpoints the WAL, as a multi-threaded application on SQLite would arrange it; SQLite's own
//! busy handler and autocheckpoint would make the run measure sleeps (see `drive`,
//! `checkpointer`). The `_no_queue` configurations measure exactly that: SQLite's locking
//! alone, as an application that arranges nothing gets it ([`configs::Writers`]).
//!
//! Beside the bpe configurations, `stock_*` run stock SQLite with the same memory (its page
//! cache, split over the terminals' connections) and its OS page cache held to a budget by a
//! memory cgroup; they run by default on a real data device only ([`configs::plan`]).

mod busy;
mod checkpointer;
mod configs;
mod load;
mod txn;

use crate::args::OltpArgs;
use crate::cgroup;
use crate::child::{start, Runner};
use crate::db::{self, Journal, Sqlite, Synchronous};
use crate::progress;
use crate::reference::measure_reference;
use crate::report::{
    print_configs, print_memory_cgroups, print_storage, ratio, BenchReport, ConfigResult,
};
use crate::storage::{db_bytes, load_once, Storage};
use configs::{OltpConfig, Writers, CONFIGS};
use load::Rand;
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use txn::{Kind, Outcome, Terminal, KINDS};

/// What a configuration's process runs on its setup.
#[derive(Serialize, Deserialize)]
struct Mix {
    warehouses: u32,
    items: u32,
    terminals: u32,
    seconds: u64,
    warmup_seconds: u64,
    writers: Writers,
    synchronous: Synchronous,
}

/// Runs the benchmark and prints its results; returns them.
pub fn run(a: &OltpArgs) -> anyhow::Result<BenchReport> {
    let c = &a.common;
    let warehouses = a.warehouses.unwrap_or(if c.quick { 1 } else { 10 });
    let seconds = a.seconds.unwrap_or(if c.quick { 4 } else { 120 });
    let items = a.items.unwrap_or(100_000);
    anyhow::ensure!(a.terminals > 0, "--terminals must be at least 1");
    let storage = Storage::from_args(c, "oltp")?;
    let plan = configs::plan(c.configs.as_deref(), storage.data_device.emulated)?;
    let base = storage
        .data_dir
        .join(format!("tpcc-w{warehouses}-i{items}.db"));
    load(&base, warehouses, items, c.reload)?;
    let db_mb = (db_bytes(&base) >> 20).max(1);
    let reference = measure_reference(c, &storage)?;
    let mut report = BenchReport::new("oltp", storage.clone(), reference);
    let cgroup_mb = |memory_mb: u64| a.cgroup_mb.unwrap_or(cgroup::stock_budget_mb(memory_mb));
    report.parameters = json!({
        "warehouses": warehouses, "items": items, "terminals": a.terminals, "seconds": seconds,
        "database_mb": db_mb,
        "memory_mb": plan.iter().map(|c| (c.name, c.memory_mb(db_mb))).collect::<BTreeMap<_, _>>(),
        "extension_mb": plan.iter().filter_map(|c| Some((c.name, c.extension_mb(db_mb)?))).collect::<BTreeMap<_, _>>(),
        "stock_cgroup_mb": plan.iter().filter(|c| c.stock).map(|c| (c.name, cgroup_mb(c.memory_mb(db_mb)))).collect::<BTreeMap<_, _>>(),
        "writers": plan.iter().map(|c| (c.name, c.writers)).collect::<BTreeMap<_, _>>(),
        "pager_cache_kib": db::bpe_pager_cache_kib()?, "quick": c.quick,
        "journal": a.journal.label(), "synchronous": a.synchronous.pragma(),
    });
    print_storage(&storage, report.reference.as_ref());
    println!(
        "database:     {} ({db_mb} MB, {warehouses} warehouses; journal: {}, synchronous: {})",
        base.display(),
        a.journal.label(),
        a.synchronous.pragma()
    );
    let run_db = storage.data_dir.join("tpcc-run.db");
    let runner = Runner {
        bench: "oltp",
        storage: &storage,
        sample_ms: c.sample_ms,
    };
    for config in plan {
        let memory_mb = config.memory_mb(db_mb);
        let extension_mb = config.extension_mb(db_mb);
        copy_db(&base, &run_db)?;
        let description = describe(config, memory_mb, db_mb, extension_mb, a.terminals);
        let mut setup = runner.setup(config.name, description, &run_db, extension_mb);
        setup.journal = a.journal;
        let mix = Mix {
            warehouses,
            items,
            terminals: a.terminals,
            seconds,
            warmup_seconds: (seconds / 6).max(2),
            writers: config.writers,
            synchronous: a.synchronous,
        };
        let results = match config.stock {
            true => runner.run_stock(setup, mix, memory_mb, cgroup_mb(memory_mb))?,
            false => runner.run(setup, mix, memory_mb, true)?,
        };
        report.configs.extend(results);
    }
    remove_db(&run_db);
    report.summary = summarize(&report);
    print_results(&report);
    Ok(report)
}

/// What a configuration runs, for its row in the results.
fn describe(
    c: &OltpConfig,
    memory_mb: u64,
    db_mb: u64,
    extension_mb: Option<u64>,
    terminals: u32,
) -> String {
    let share = memory_mb as f64 * 100.0 / db_mb as f64;
    let mut d = match c.stock {
        true => format!(
            "stock SQLite: {memory_mb} MB page cache ({share:.0} % of the database) split over {terminals} terminals, OS page cache {{os_cache}}"
        ),
        false => format!("{memory_mb} MB ({share:.0} % of the database)"),
    };
    if let Some(mb) = extension_mb {
        d += &format!(
            " + {mb} MB extension ({:.1}x the database)",
            mb as f64 / db_mb as f64
        );
    }
    if c.writers == Writers::Sqlite {
        d += "; writers: SQLite's locking (no queue)";
    }
    d
}

/// Throughput per configuration, and each bpe configuration's against its stock peer's and
/// the extension's gains.
fn summarize(r: &BenchReport) -> serde_json::Value {
    let tpm = |n: &str| r.config(n).map(|c| c.operations as f64 * 60.0 / c.seconds);
    let over = |a: &str, b: &str| match (tpm(a), tpm(b)) {
        (Some(a), Some(b)) => json!(ratio(a, b)),
        _ => serde_json::Value::Null,
    };
    let over_stock: BTreeMap<&str, serde_json::Value> = CONFIGS
        .iter()
        .filter_map(|c| Some((c.name, over(c.name, c.stock_peer()?.name))))
        .filter(|(_, v)| !v.is_null())
        .collect();
    json!({
        "tpm": r.configs.iter().map(|c| (c.name.clone(), c.operations as f64 * 60.0 / c.seconds)).collect::<BTreeMap<_, _>>(),
        "bpe_over_no_bpe_at_25": over("memory_25_bpe", "memory_25"),
        "memory_100_over_bpe": over("memory_100", "memory_25_bpe"),
        "bpe_over_no_bpe_at_25_no_queue": over("memory_25_bpe_no_queue", "memory_25_no_queue"),
        "memory_100_over_bpe_no_queue": over("memory_100_no_queue", "memory_25_bpe_no_queue"),
        "ext_half_over_ext_double": over("memory_25_bpe_ext_half", "memory_25_bpe"),
        "queue_over_no_queue_bpe": over("memory_25_bpe", "memory_25_bpe_no_queue"),
        "queue_over_no_queue_stock": over("stock_memory_25", "stock_memory_25_no_queue"),
        "over_stock": over_stock,
    })
}

fn load(path: &Path, warehouses: u32, items: u32, reload: bool) -> anyhow::Result<()> {
    load_once(path, reload, |conn| {
        load::load(conn, warehouses, items)?;
        conn.execute_batch("ANALYZE;")?;
        Ok("ok".into())
    })?;
    Ok(())
}

/// Every configuration starts from the same loaded database (copying is not timed).
fn copy_db(from: &Path, to: &Path) -> anyhow::Result<()> {
    remove_db(to);
    std::fs::copy(from, to)?;
    Ok(())
}

/// Removes a run's database and whatever files its journal mode left beside it.
fn remove_db(db: &Path) {
    for suffix in ["", "-wal", "-shm", "-journal"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", db.display()));
    }
}

/// Reads every table and index once, so the tiers start warm (and the extension full).
pub fn warm(conn: &rusqlite::Connection) -> anyhow::Result<()> {
    let objects: Vec<(String, String, String)> = conn
        .prepare("SELECT type, name, tbl_name FROM sqlite_schema WHERE type IN ('table', 'index') AND name NOT LIKE 'sqlite_%'")?
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
        .collect::<Result<_, _>>()?;
    for (kind, name, table) in objects {
        let sql = if kind == "index" {
            format!("SELECT count(*) FROM \"{table}\" INDEXED BY \"{name}\"")
        } else {
            // Every column in the expression, so that no covering index can answer instead of
            // the table (a plain count(*) reads the smallest index, and a WITHOUT ROWID table
            // is not read at all).
            let columns: Vec<String> = conn
                .prepare(&format!("PRAGMA table_info(\"{name}\")"))?
                .query_map([], |r| r.get(1))?
                .collect::<Result<_, _>>()?;
            let row = columns
                .iter()
                .map(|c| format!("quote(\"{c}\")"))
                .collect::<Vec<_>>()
                .join(" || ");
            format!("SELECT count(*) FROM \"{name}\" WHERE length({row}) > 0")
        };
        let _: i64 = conn.query_row(&sql, [], |r| r.get(0))?;
    }
    Ok(())
}

#[derive(Default)]
struct Tally {
    committed: [AtomicU64; 5],
    rolled_back: AtomicU64,
    busy: AtomicU64,
}

pub fn child(config: serde_json::Value, sample_ms: u64) -> anyhow::Result<Vec<ConfigResult>> {
    let (setup, cfg, conn) = start::<Mix>(config)?;
    let sqlite = per_connection(setup.sqlite, cfg.terminals);
    if let Sqlite::Stock { cache_kib } = sqlite {
        conn.execute_batch(&format!("PRAGMA cache_size = -{cache_kib};"))?;
    }
    let sp = progress::spinner("warm");
    sp.set_message("reading every table and index");
    warm(&conn)?;
    db::wait_for_extension_writes();
    sp.finish_and_clear();
    let queue = cfg.writers == Writers::Queue;
    // Only a WAL has frames to checkpoint; a rollback journal's writers write the database.
    let wal = setup.journal == Journal::Wal;
    let writers = Mutex::new(());
    let open = || -> anyhow::Result<rusqlite::Connection> {
        let conn = db::open_with(&setup.db, sqlite, setup.journal)?;
        let sync = cfg.synchronous.pragma();
        conn.execute_batch(&format!("PRAGMA synchronous = {sync};"))?;
        Ok(conn)
    };
    let mut terminals: Vec<Terminal> = (0..cfg.terminals)
        .map(|t| {
            let conn = open()?;
            busy::install(&conn)?;
            if queue && wal {
                // The checkpointer below does it, outside the writers' queue; the hook
                // replaces the connection's autocheckpoint.
                checkpointer::report_commits(&conn);
            }
            Ok(Terminal {
                conn,
                r: Rand::new(1000 + t as u64),
                w: t % cfg.warehouses + 1,
                d: t % load::DISTRICTS + 1,
                warehouses: cfg.warehouses,
                items: cfg.items,
            })
        })
        .collect::<anyhow::Result<_>>()?;
    let checkpointer = match queue && wal {
        true => Some(checkpointer::Checkpointer::new(open()?)),
        false => None,
    };
    let mut run = Run {
        terminals: &mut terminals,
        checkpointer,
        writers: queue.then_some(&writers),
    };
    // Warm-up: the mix runs untimed first (the published runs discarded their first pass too).
    let tally = Tally::default();
    let none = AtomicU64::new(0);
    drive(&mut run, cfg.warmup_seconds, &tally, &none, "warm-up")?;
    let tally = Tally::default();
    let (waits_before, slept_before) = busy::counts();
    let io_before = db::process_storage_bytes();
    let mut checkpoints = checkpointer::Checkpoints::default();
    let mut result = ConfigResult::measure(&setup.name, &setup.description, sample_ms, |ops| {
        checkpoints = drive(&mut run, cfg.seconds, &tally, ops, &setup.name)?;
        Ok(json!({}))
    })?;
    let (waits, slept) = busy::counts();
    let io = match (io_before, db::process_storage_bytes()) {
        (Some(a), Some(b)) => json!({
            "read_bytes": b.0.saturating_sub(a.0),
            "write_bytes": b.1.saturating_sub(a.1),
        }),
        _ => serde_json::Value::Null,
    };
    let checks = txn::check(&conn)?;
    // What the terminals ran with, as SQLite reports it (a pragma SQLite refused leaves the
    // mode as it was, silently).
    let (journal, synchronous) = match terminals.first() {
        Some(t) => (
            t.conn
                .query_row("PRAGMA journal_mode", [], |r| r.get::<_, String>(0))?,
            t.conn
                .query_row("PRAGMA synchronous", [], |r| r.get::<_, i64>(0))?,
        ),
        None => anyhow::bail!("no terminal ran"),
    };
    let per_kind: serde_json::Map<String, serde_json::Value> = KINDS
        .iter()
        .enumerate()
        .map(|(i, k)| {
            (
                k.name().to_string(),
                json!(tally.committed[i].load(Relaxed)),
            )
        })
        .collect();
    let new_orders = tally.committed[0].load(Relaxed) as f64;
    result.details = json!({
        "committed": per_kind,
        "rolled_back": tally.rolled_back.load(Relaxed),
        "busy_retries": tally.busy.load(Relaxed),
        "busy_waits": waits - waits_before,
        "busy_sleep_ms": slept - slept_before,
        "writers": cfg.writers,
        "checkpointer": (queue && wal).then(|| json!({
            "passive": checkpoints.passive,
            "restart": checkpoints.restart,
            "busy": checkpoints.busy,
            "writers_held_ms": checkpoints.writers_held.as_millis() as u64,
        })),
        "journal_mode": journal,
        "synchronous": synchronous,
        "vfs": setup.sqlite.vfs(),
        "storage_io": io,
        "tpm": result.operations as f64 * 60.0 / result.seconds,
        "tpmC": new_orders * 60.0 / result.seconds,
        "consistency": checks.iter().map(|(n, ok, what)| json!({"condition": n, "passed": ok, "detail": what})).collect::<Vec<_>>(),
        "warmup_seconds": cfg.warmup_seconds,
    });
    if let Some((n, _, what)) = checks.iter().find(|c| !c.1) {
        anyhow::bail!("consistency condition {n} failed: {what}");
    }
    Ok(vec![result])
}

/// Each connection's SQLite: stock SQLite's page cache budget is the process's, split evenly
/// over the terminals (the first connection, which warms and checks, gets a share too); bpe's
/// connections share its pool, their own caches stay small.
fn per_connection(sqlite: Sqlite, terminals: u32) -> Sqlite {
    match sqlite {
        Sqlite::Stock { cache_kib } => Sqlite::Stock {
            cache_kib: (cache_kib / terminals.max(1) as u64).max(1),
        },
        bpe => bpe,
    }
}

/// The terminals, and with the writers' queue, the queue their write transactions take turns
/// in and a connection that checkpoints the WAL in the background while they run (without it,
/// SQLite's autocheckpoint does in the committing terminal).
struct Run<'a> {
    terminals: &'a mut [Terminal],
    checkpointer: Option<checkpointer::Checkpointer>,
    writers: Option<&'a Mutex<()>>,
}

/// Runs every terminal for `seconds`; counts completed transactions in `ops`.
fn drive(
    run: &mut Run,
    seconds: u64,
    tally: &Tally,
    ops: &AtomicU64,
    label: &str,
) -> anyhow::Result<checkpointer::Checkpoints> {
    let stop = AtomicBool::new(false);
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let pb = progress::bar(seconds, label);
    std::thread::scope(|s| {
        let Run {
            terminals,
            checkpointer,
            writers,
        } = run;
        let writers: Option<&Mutex<()>> = *writers;
        let stop_ref = &stop;
        let checkpointer = checkpointer
            .as_mut()
            .zip(writers)
            .map(|(c, writers)| s.spawn(move || c.run_until(writers, stop_ref, deadline)));
        let workers: Vec<_> = terminals
            .iter_mut()
            .map(|t| {
                let stop = &stop;
                s.spawn(move || -> anyhow::Result<()> {
                    // A transaction that failed with SQLITE_BUSY, to run again.
                    let mut retry = None;
                    while !stop.load(Relaxed) && Instant::now() < deadline {
                        let kind = retry.take().unwrap_or_else(|| Kind::pick(&mut t.r));
                        // SQLite has one write lock per database and no queue for it: a writer
                        // that finds it taken sleeps in the busy handler for 1, 2, 5, 10 ... ms
                        // while the lock sits idle, a quantum longer than a whole transaction
                        // here. With the queue, writers take turns here instead, as a
                        // multi-threaded application would; the busy handler stays for
                        // anything else.
                        let turn = writers
                            .filter(|_| kind.writes())
                            .map(|w| w.lock().unwrap_or_else(|e| e.into_inner()));
                        let outcome = t.run(kind);
                        drop(turn);
                        match outcome {
                            Ok(Outcome::Committed) => {
                                tally.committed[KINDS.iter().position(|k| *k == kind).unwrap_or(0)]
                                    .fetch_add(1, Relaxed);
                                ops.fetch_add(1, Relaxed);
                            }
                            Ok(Outcome::RolledBack) => {
                                tally.rolled_back.fetch_add(1, Relaxed);
                                ops.fetch_add(1, Relaxed);
                            }
                            Err(e) if is_busy(&e) => {
                                tally.busy.fetch_add(1, Relaxed);
                                retry = Some(kind);
                            }
                            Err(e) => {
                                stop.store(true, Relaxed);
                                return Err(e.context(format!("{kind:?}")));
                            }
                        }
                    }
                    Ok(())
                })
            })
            .collect();
        while Instant::now() < deadline && !stop.load(Relaxed) {
            std::thread::sleep(Duration::from_millis(200));
            pb.set_position(
                seconds
                    .saturating_sub(deadline.saturating_duration_since(Instant::now()).as_secs()),
            );
        }
        pb.finish_and_clear();
        let done = workers
            .into_iter()
            .map(|w| {
                w.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("terminal panicked")))
            })
            .collect::<anyhow::Result<Vec<()>>>();
        stop.store(true, Relaxed);
        let checkpointed = checkpointer.map_or(Ok(Default::default()), |c| {
            c.join()
                .unwrap_or_else(|_| Err(anyhow::anyhow!("checkpointer panicked")))
        });
        done.and(checkpointed)
    })
}

fn is_busy(e: &anyhow::Error) -> bool {
    matches!(
        e.downcast_ref::<rusqlite::Error>(),
        Some(rusqlite::Error::SqliteFailure(f, _))
            if matches!(f.code, rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
    )
}

fn print_results(r: &BenchReport) {
    let headers = [
        "config",
        "description",
        "tpm",
        "tpmC",
        "tpm / stock's",
        "L1 hit %",
        "data reads/s",
        "ext reads/s",
        "ext writes/s",
        "storage reads/s",
        "busy waits",
        "busy retries",
        "consistency",
    ];
    let tpm = |c: &ConfigResult| c.details["tpm"].as_f64().unwrap_or(0.0);
    print_configs(r, &headers, |c| {
        let k = &c.counters;
        // Stock SQLite has no engine to count pages.
        let engine = |v: f64, digits: usize| match k.engine {
            true => format!("{v:.digits$}"),
            false => "-".into(),
        };
        let per_s = |n: u64| n as f64 / c.seconds;
        let peer = CONFIGS
            .iter()
            .find(|x| x.name == c.name)
            .and_then(|x| r.config(x.stock_peer()?.name));
        vec![
            format!("{:.0}", tpm(c)),
            format!("{:.0}", c.details["tpmC"].as_f64().unwrap_or(0.0)),
            peer.map_or("-".into(), |p| format!("{:.2}x", ratio(tpm(c), tpm(p)))),
            engine(k.hit_ratio_percent, 1),
            engine(per_s(k.page_reads), 0),
            engine(per_s(k.ext_page_reads), 0),
            engine(per_s(k.ext_page_writes), 0),
            c.details["storage_io"]["read_bytes"]
                .as_u64()
                .map_or("-".into(), |b| format!("{:.0}", per_s(b / 4096))),
            c.details["busy_waits"].to_string(),
            c.details["busy_retries"].to_string(),
            c.details["consistency"].as_array().map_or("-".into(), |a| {
                if a.iter().all(|x| x["passed"] == true) {
                    "1-4 passed".into()
                } else {
                    "FAILED".into()
                }
            }),
        ]
    });
    println!("(storage reads/s: 4 KiB reads from storage, /proc/self/io; \"tpm / stock's\": against stock SQLite with the same memory and writers)");
    let s = &r.summary;
    let show = |key: &str, label: &str| {
        if let Some(x) = s[key].as_f64() {
            println!("{label}: {x:.2}x");
        }
    };
    if let Some(x) = s["bpe_over_no_bpe_at_25"].as_f64() {
        println!(
            "\nat 25 % memory, extension on / off: {x:.2}x (SQL Server, HammerDB TPC-C: 1.42x)"
        );
    }
    show(
        "memory_100_over_bpe",
        "100 % memory / 25 % memory + extension",
    );
    show(
        "bpe_over_no_bpe_at_25_no_queue",
        "with SQLite's locking, at 25 % memory, extension on / off",
    );
    show(
        "memory_100_over_bpe_no_queue",
        "with SQLite's locking, 100 % memory / 25 % memory + extension",
    );
    show(
        "ext_half_over_ext_double",
        "extension of 0.5x / 2x the database, at 25 % memory",
    );
    show(
        "queue_over_no_queue_bpe",
        "bpe at 25 % + extension, writers' queue / SQLite's locking",
    );
    show(
        "queue_over_no_queue_stock",
        "stock SQLite at 25 %, writers' queue / SQLite's locking",
    );
    print_memory_cgroups(r);
}
