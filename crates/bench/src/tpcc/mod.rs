//! The OLTP benchmark: a TPC-C-like workload written from the public specification (nine
//! tables, five transaction types in the specified mix, consistency conditions 1-4 checked at the
//! end), with memory at 100 % and 25 % of the database, extension on and off.
//!
//! Not a TPC-C result: no keying or think times (every terminal runs back to back, as HammerDB
//! does), no response-time constraints, and the run is minutes, not hours.
//!
//! The terminals are threads of one process with a connection each. Their write transactions
//! take turns in an in-process queue and a separate connection checkpoints the WAL, as a
//! multi-threaded application on SQLite would arrange it; SQLite's own busy handler and
//! autocheckpoint would make the run measure sleeps (see `drive`, `checkpoint_until`).

mod load;
mod txn;

use crate::args::selected;
use crate::args::OltpArgs;
use crate::child::{start, Runner};
use crate::db;
use crate::progress;
use crate::reference::measure_reference;
use crate::report::{print_configs, print_storage, ratio, BenchReport, ConfigResult};
use crate::storage::{db_bytes, load_once, Storage};
use load::Rand;
use serde::{Deserialize, Serialize};
use serde_json::json;
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
}

/// Runs the benchmark and prints its results; returns them.
pub fn run(a: &OltpArgs) -> anyhow::Result<BenchReport> {
    let c = &a.common;
    let warehouses = a.warehouses.unwrap_or(if c.quick { 1 } else { 10 });
    let seconds = a.seconds.unwrap_or(if c.quick { 4 } else { 120 });
    let items = a.items.unwrap_or(100_000);
    let storage = Storage::from_args(c, "oltp")?;
    let base = storage
        .data_dir
        .join(format!("tpcc-w{warehouses}-i{items}.db"));
    load(&base, warehouses, items, c.reload)?;
    let db_mb = (db_bytes(&base) >> 20).max(1);
    let reference = measure_reference(c, &storage)?;
    let mut report = BenchReport::new("oltp", storage.clone(), reference);
    let small = (db_mb / 4).max(8);
    let configs = [
        // "100 %": the whole database fits, with room for what the run adds.
        ("memory_100", db_mb * 5 / 4 + 16, false),
        ("memory_25", small, false),
        ("memory_25_bpe", small, true),
    ];
    let extension_mb = (db_mb * 2).max(small * 2).max(64);
    report.parameters = json!({
        "warehouses": warehouses, "items": items, "terminals": a.terminals, "seconds": seconds,
        "database_mb": db_mb, "extension_mb": extension_mb,
        "memory_mb": configs.iter().map(|c| (c.0, c.1)).collect::<std::collections::BTreeMap<_, _>>(),
        "pager_cache_kib": db::PAGER_CACHE_KIB, "quick": c.quick,
    });
    print_storage(&storage, report.reference.as_ref());
    println!(
        "database:     {} ({db_mb} MB, {warehouses} warehouses)",
        base.display()
    );
    let run_db = storage.data_dir.join("tpcc-run.db");
    let runner = Runner {
        bench: "oltp",
        storage: &storage,
        sample_ms: c.sample_ms,
    };
    for (name, memory_mb, ext) in configs {
        if !selected(c.configs.as_deref(), name) {
            continue;
        }
        let description = format!(
            "{memory_mb} MB ({:.0} % of the database){}",
            memory_mb as f64 * 100.0 / db_mb as f64,
            if ext {
                format!(" + {extension_mb} MB extension")
            } else {
                String::new()
            }
        );
        copy_db(&base, &run_db)?;
        let setup = runner.setup(name, description, &run_db, ext.then_some(extension_mb));
        let mix = Mix {
            warehouses,
            items,
            terminals: a.terminals,
            seconds,
            warmup_seconds: (seconds / 6).max(2),
        };
        report
            .configs
            .extend(runner.run(setup, mix, memory_mb, true)?);
    }
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", run_db.display()));
    }
    let tpm = |n: &str| {
        report
            .config(n)
            .map(|c| c.operations as f64 * 60.0 / c.seconds)
    };
    report.summary = json!({
        "tpm": report.configs.iter().map(|c| (c.name.clone(), c.operations as f64 * 60.0 / c.seconds)).collect::<std::collections::BTreeMap<_, _>>(),
        "bpe_over_no_bpe_at_25": match (tpm("memory_25_bpe"), tpm("memory_25")) {
            (Some(a), Some(b)) => json!(ratio(a, b)),
            _ => serde_json::Value::Null,
        },
        "memory_100_over_bpe": match (tpm("memory_100"), tpm("memory_25_bpe")) {
            (Some(a), Some(b)) => json!(ratio(a, b)),
            _ => serde_json::Value::Null,
        },
    });
    print_results(&report);
    Ok(report)
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
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", to.display()));
    }
    std::fs::copy(from, to)?;
    Ok(())
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
            format!("SELECT count(*) FROM (SELECT * FROM \"{name}\")")
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
    let sp = progress::spinner("warm");
    sp.set_message("reading every table and index");
    warm(&conn)?;
    db::wait_for_extension_writes();
    sp.finish_and_clear();
    let writers = Mutex::new(());
    let mut terminals: Vec<Terminal> = (0..cfg.terminals)
        .map(|t| {
            let conn = db::open(&setup.db)?;
            // The checkpointer below does it, outside the writers' queue.
            conn.execute_batch("PRAGMA wal_autocheckpoint = 0;")?;
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
    let mut run = Run {
        terminals: &mut terminals,
        checkpointer: db::open(&setup.db)?,
        writers: &writers,
    };
    // Warm-up: the mix runs untimed first (the published runs discarded their first pass too).
    let tally = Tally::default();
    let none = AtomicU64::new(0);
    drive(&mut run, cfg.warmup_seconds, &tally, &none, "warm-up")?;
    let tally = Tally::default();
    let mut result = ConfigResult::measure(&setup.name, &setup.description, sample_ms, |ops| {
        drive(&mut run, cfg.seconds, &tally, ops, &setup.name)?;
        Ok(json!({}))
    })?;
    let checks = txn::check(&conn)?;
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

/// The terminals, the queue their write transactions take turns in, and a connection that
/// checkpoints the WAL in the background while they run.
struct Run<'a> {
    terminals: &'a mut [Terminal],
    checkpointer: rusqlite::Connection,
    writers: &'a Mutex<()>,
}

/// WAL frames after which the checkpointer stops the writers to restart the WAL, so that it
/// stays bounded even when backfill cannot catch up with them.
const WAL_RESTART_FRAMES: i64 = 20_000;

/// Checkpoints as SQLite's autocheckpoint would, but on its own connection: an autocheckpoint
/// runs in the committing terminal, inside its turn in the writers' queue, and every other
/// writer would wait for it.
fn checkpoint_until(
    conn: &mut rusqlite::Connection,
    writers: &Mutex<()>,
    stop: &AtomicBool,
    deadline: Instant,
) -> anyhow::Result<()> {
    let checkpoint = |mode: &str| -> anyhow::Result<(i64, i64)> {
        let sql = format!("PRAGMA wal_checkpoint({mode})");
        Ok(conn.query_row(&sql, [], |r| Ok((r.get(1)?, r.get(2)?)))?)
    };
    while !stop.load(Relaxed) && Instant::now() < deadline {
        let (log, backfilled) = checkpoint("PASSIVE")?;
        if log > WAL_RESTART_FRAMES {
            let _turn = writers.lock().unwrap_or_else(|e| e.into_inner());
            checkpoint("RESTART")?;
        } else if log - backfilled < 1000 {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    Ok(())
}

/// Runs every terminal for `seconds`; counts completed transactions in `ops`.
fn drive(
    run: &mut Run,
    seconds: u64,
    tally: &Tally,
    ops: &AtomicU64,
    label: &str,
) -> anyhow::Result<()> {
    let stop = AtomicBool::new(false);
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let pb = progress::bar(seconds, label);
    std::thread::scope(|s| {
        let Run {
            terminals,
            checkpointer,
            writers,
        } = run;
        let writers: &Mutex<()> = writers;
        let stop_ref = &stop;
        let checkpointer =
            s.spawn(move || checkpoint_until(checkpointer, writers, stop_ref, deadline));
        let workers: Vec<_> = terminals
            .iter_mut()
            .map(|t| {
                let stop = &stop;
                s.spawn(move || -> anyhow::Result<()> {
                    while !stop.load(Relaxed) && Instant::now() < deadline {
                        let kind = Kind::pick(&mut t.r);
                        // SQLite has one write lock per database and no queue for it: a writer
                        // that finds it taken sleeps in the busy handler for 1, 2, 5, 10 ... ms
                        // while the lock sits idle, a quantum longer than a whole transaction
                        // here. Writers take turns here instead, as a multi-threaded
                        // application would; the busy timeout stays for anything else.
                        let turn = kind
                            .writes()
                            .then(|| writers.lock().unwrap_or_else(|e| e.into_inner()));
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
        let checkpointed = checkpointer
            .join()
            .unwrap_or_else(|_| Err(anyhow::anyhow!("checkpointer panicked")));
        done.and(checkpointed)
    })?;
    Ok(())
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
        "memory",
        "tpm",
        "tpmC",
        "L1 hit %",
        "page reads/s",
        "ext reads/s",
        "ext writes/s",
        "consistency",
    ];
    print_configs(r, &headers, |c| {
        let k = &c.counters;
        vec![
            format!("{:.0}", c.details["tpm"].as_f64().unwrap_or(0.0)),
            format!("{:.0}", c.details["tpmC"].as_f64().unwrap_or(0.0)),
            format!("{:.1}", k.hit_ratio_percent),
            format!("{:.0}", k.page_reads as f64 / c.seconds),
            format!("{:.0}", k.ext_page_reads as f64 / c.seconds),
            format!("{:.0}", k.ext_page_writes as f64 / c.seconds),
            c.details["consistency"].as_array().map_or("-".into(), |a| {
                if a.iter().all(|x| x["passed"] == true) {
                    "1-4 passed".into()
                } else {
                    "FAILED".into()
                }
            }),
        ]
    });
    if let Some(x) = r.summary["bpe_over_no_bpe_at_25"].as_f64() {
        println!(
            "\nat 25 % memory, extension on / off: {x:.2}x (SQL Server, HammerDB TPC-C: 1.42x)"
        );
    }
    if let Some(x) = r.summary["memory_100_over_bpe"].as_f64() {
        println!("100 % memory / 25 % memory + extension: {x:.2}x");
    }
}
