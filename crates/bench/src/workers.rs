//! `sqlite-bpe bench workers`: the workers of a pre-fork server. Four processes run the lookup
//! workload on one database, each with its own max server memory, and the arms differ in their
//! second tier:
//!
//! - `shared`: one extension for all of them (the default, one file, one index in
//!   shared memory);
//! - `private`: an extension of the same size for each (`BPE_EXTENSION_SHARED=0`: four files,
//!   four indexes);
//! - `stock`: stock SQLite with the same memory each (page cache, OS page cache in a memory
//!   cgroup per process), on a real data device only (the emulation is bpe's).
//!
//! The first worker warms its tier with a full scan, as a long-running worker would have; then
//! the other three start (a restart of the pool, a scale-out) and every worker makes the same
//! number of random point selects. Reported per arm: bytes written to the SSD, the first 100
//! lookups' mean latency of the workers that started after the first (cold caches of their
//! own), the total throughput of the four, and the RAM the extension index takes.

use crate::args::WorkersArgs;
use crate::child::{start, Runner, Setup};
use crate::db;
use crate::lookup::{load, ROW_BYTES};
use crate::report::{print_storage, print_table_left, BenchReport, ConfigResult};
use crate::storage::{db_bytes, Storage};
use anyhow::Context;
use rand::{rngs::StdRng, Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

const ARMS: [&str; 3] = ["shared", "private", "stock"];
/// Lookups whose latency is "the first lookups" of a worker.
const FIRST: u64 = 100;

/// A worker's part of a configuration.
#[derive(Serialize, Deserialize)]
struct Worker {
    rows: u64,
    lookups: u64,
    /// Warm the tiers with a full scan first (the first worker).
    scan: bool,
    /// Written once the worker is warm, for the others to start.
    ready: Option<PathBuf>,
    seed: u64,
}

pub fn run(a: &WorkersArgs) -> anyhow::Result<BenchReport> {
    let storage = Storage::from_args(&a.common, "workers")?;
    let quick = a.common.quick;
    let rows = a.rows.unwrap_or(if quick { 40_000 } else { 1_000_000 });
    let lookups = a.lookups.unwrap_or(if quick { 2_000 } else { 10_000 });
    let memory_mb = a.memory_mb.unwrap_or(if quick { 16 } else { 256 });
    let db_path = storage.data_dir.join(format!("lookup-{rows}.db"));
    load(&db_path, rows, a.common.reload)?;
    let size_mb = db_bytes(&db_path) >> 20;
    let extension_mb = a
        .extension_mb
        .unwrap_or((size_mb * 2).max(memory_mb * 2).max(64));
    let reference = crate::reference::of(&storage, crate::reference::reference_mib(&a.common))?;
    let mut report = BenchReport::new("workers", storage.clone(), reference);
    report.parameters = json!({
        "rows": rows, "lookups_per_worker": lookups, "workers": a.workers,
        "memory_mb_per_worker": memory_mb, "extension_mb": extension_mb,
        "database_mb": size_mb, "database": db_path, "first_lookups": FIRST,
    });
    let runner = Runner {
        bench: "workers",
        storage: &storage,
        sample_ms: a.common.sample_ms,
    };
    for arm in ARMS {
        let stock = arm == "stock";
        if !crate::child::runs_by_default(
            a.common.configs.as_deref(),
            arm,
            stock,
            storage.data_device.emulated,
        ) {
            continue;
        }
        eprintln!("== {arm}: {} workers", a.workers);
        let results = run_arm(
            &runner,
            arm,
            &db_path,
            a.workers,
            rows,
            lookups,
            memory_mb,
            extension_mb,
        )?;
        report.configs.extend(results);
    }
    report.summary = summarize(&report);
    print_storage(&storage, report.reference.as_ref());
    print_results(&report);
    Ok(report)
}

#[allow(clippy::too_many_arguments)]
fn run_arm(
    runner: &Runner<'_>,
    arm: &str,
    db: &Path,
    workers: usize,
    rows: u64,
    lookups: u64,
    memory_mb: u64,
    extension_mb: u64,
) -> anyhow::Result<Vec<ConfigResult>> {
    let shared_path = runner.storage.extension_path(&format!("{arm}-shared"));
    let ready = runner
        .storage
        .ext_dir
        .join(format!("workers-ready-{}", std::process::id()));
    let _ = std::fs::remove_file(&ready);
    let env: &[(&str, &str)] = match arm {
        "shared" => &[("BPE_EXTENSION_SHARED", "1")],
        "private" => &[("BPE_EXTENSION_SHARED", "0")],
        _ => &[],
    };
    // Stock SQLite's OS page cache is held to its budget by a memory cgroup per worker, alive
    // until the arm is done.
    let limits: Vec<crate::cgroup::MemLimit> = (0..workers)
        .filter(|_| arm == "stock")
        .map(|i| {
            crate::cgroup::MemLimit::new(
                &format!("{arm}_{i}"),
                crate::cgroup::stock_budget_mb(memory_mb),
            )
        })
        .collect();
    let setup = |i: usize| -> Setup {
        let name = format!("{arm}_{i}");
        let extension = match arm {
            "shared" => Some(shared_path.clone()),
            "private" => Some(runner.storage.extension_path(&name)),
            _ => None,
        };
        let mut s = runner.setup(&name, format!("{arm} worker {i}"), db, None);
        s.extension = extension.map(|p| (p, extension_mb));
        // The shared file is removed once all are done (with its shared memory).
        s.keep_extension = arm == "shared";
        if let Some(limit) = limits.get(i) {
            s.sqlite = db::Sqlite::Stock {
                cache_kib: memory_mb * 1024,
            };
            s.memory_cgroup = limit.path();
        }
        s
    };
    let worker = |i: usize| Worker {
        rows,
        lookups,
        scan: i == 0,
        ready: (i == 0).then(|| ready.clone()),
        seed: 0x5eed + i as u64,
    };
    let emulated = arm != "stock";
    let first = runner.spawn(setup(0), worker(0), memory_mb, emulated, env)?;
    let deadline = Instant::now() + Duration::from_secs(3600);
    while !ready.exists() {
        anyhow::ensure!(Instant::now() < deadline, "the first worker never got warm");
        std::thread::sleep(Duration::from_millis(50));
    }
    let others: Vec<_> = (1..workers)
        .map(|i| runner.spawn(setup(i), worker(i), memory_mb, emulated, env))
        .collect::<anyhow::Result<_>>()?;
    let mut results = first.finish()?;
    for w in others {
        results.extend(w.finish()?);
    }
    let _ = std::fs::remove_file(&ready);
    if let Ok(m) = std::fs::metadata(&shared_path) {
        use std::os::unix::fs::MetadataExt;
        let id = bpe_core::FileIdentity {
            dev: m.dev(),
            ino: m.ino(),
        };
        if let Ok(p) = bpe_core::shared_memory_path(id) {
            let _ = std::fs::remove_file(p);
        }
        let _ = std::fs::remove_file(&shared_path);
    }
    Ok(results)
}

/// The worker's process.
pub(crate) fn child(
    config: serde_json::Value,
    sample_ms: u64,
) -> anyhow::Result<Vec<ConfigResult>> {
    let (setup, cfg, conn) = start::<Worker>(config)?;
    let mut details = json!({});
    if cfg.scan {
        let _: i64 = conn.query_row("SELECT sum(length(n)) FROM t", [], |r| r.get(0))?;
        db::wait_for_extension_writes();
    }
    if let Some(ready) = &cfg.ready {
        std::fs::write(ready, b"").context("telling the others to start")?;
    }
    let mut rng = StdRng::seed_from_u64(cfg.seed);
    let mut q = conn.prepare("SELECT n FROM t WHERE id = ?1")?;
    let mut first_us = 0.0;
    let mut result = ConfigResult::measure(&setup.name, &setup.description, sample_ms, |ops| {
        let mut bytes = 0;
        for i in 0..cfg.lookups {
            let t = Instant::now();
            let n: String = q.query_row([rng.gen_range(1..=cfg.rows) as i64], |r| r.get(0))?;
            if i < FIRST {
                first_us += t.elapsed().as_secs_f64() * 1e6;
            }
            bytes += n.len();
            ops.fetch_add(1, Relaxed);
        }
        anyhow::ensure!(
            bytes == cfg.lookups as usize * ROW_BYTES,
            "a lookup returned a wrong row"
        );
        Ok(std::mem::take(&mut details))
    })?;
    let total = db::snapshot();
    result.details = json!({
        "warmed_first": cfg.scan,
        "first_lookups_mean_us": first_us / FIRST.min(cfg.lookups).max(1) as f64,
        "ext_bytes_written": total.ext_bytes_written,
        "ext_page_reads": total.ext_page_reads,
        "ext_shared_page_reads": total.ext_shared_page_reads,
        "data_page_reads": total.page_reads,
        "index_bytes": total.ext_index_bytes,
        "shared_index_bytes": total.ext_shared_index_bytes,
        "shared_processes": total.ext_shared_processes,
    });
    Ok(vec![result])
}

fn arm_of(r: &ConfigResult) -> &str {
    r.name.rsplit_once('_').map_or(&r.name, |(a, _)| a)
}

fn summarize(r: &BenchReport) -> serde_json::Value {
    let mut out = serde_json::Map::new();
    for arm in ARMS {
        let ws: Vec<&ConfigResult> = r.configs.iter().filter(|c| arm_of(c) == arm).collect();
        if ws.is_empty() {
            continue;
        }
        let d = |c: &ConfigResult, k: &str| c.details[k].as_f64().unwrap_or(0.0);
        let later: Vec<f64> = ws
            .iter()
            .filter(|c| !c.details["warmed_first"].as_bool().unwrap_or(false))
            .map(|c| d(c, "first_lookups_mean_us"))
            .collect();
        // The workers run side by side: the pool's throughput is all their lookups over the
        // time until the last is done.
        let longest = ws.iter().map(|c| c.seconds).fold(1e-9, f64::max);
        let throughput = ws.iter().map(|c| c.operations as f64).sum::<f64>() / longest;
        let later_written: f64 = ws
            .iter()
            .filter(|c| !c.details["warmed_first"].as_bool().unwrap_or(false))
            .map(|c| d(c, "ext_bytes_written"))
            .sum();
        let index = match arm {
            // One index in shared memory, reported by every worker: count it once.
            "shared" => ws
                .iter()
                .map(|c| d(c, "shared_index_bytes"))
                .fold(0.0, f64::max),
            _ => ws.iter().map(|c| d(c, "index_bytes")).sum(),
        };
        out.insert(arm.into(), json!({
            "ssd_bytes_written": ws.iter().map(|c| d(c, "ext_bytes_written")).sum::<f64>(),
            "ssd_bytes_written_by_later_workers": later_written,
            "later_workers_first_lookups_mean_us": later.iter().sum::<f64>() / later.len().max(1) as f64,
            "second_worker_first_lookups_mean_us": ws.get(1).map(|c| d(c, "first_lookups_mean_us")),
            "total_lookups_per_s": throughput,
            "index_ram_bytes": index,
            "ext_reads_of_other_processes_pages": ws.iter().map(|c| d(c, "ext_shared_page_reads")).sum::<f64>(),
            "data_file_page_reads": ws.iter().map(|c| d(c, "data_page_reads")).sum::<f64>(),
        }));
    }
    serde_json::Value::Object(out)
}

fn print_results(r: &BenchReport) {
    let mb = |v: &serde_json::Value| format!("{:.1}", v.as_f64().unwrap_or(0.0) / 1e6);
    let headers = [
        "arm",
        "SSD MB written (by the later workers)",
        "2nd worker's first lookups (us)",
        "total lookups/s",
        "index RAM MB",
        "data-file page reads",
    ];
    let mut rows = Vec::new();
    for (arm, s) in r.summary.as_object().into_iter().flatten() {
        rows.push(vec![
            arm.clone(),
            format!(
                "{} ({})",
                mb(&s["ssd_bytes_written"]),
                mb(&s["ssd_bytes_written_by_later_workers"])
            ),
            format!(
                "{:.0}",
                s["second_worker_first_lookups_mean_us"]
                    .as_f64()
                    .unwrap_or(f64::NAN)
            ),
            format!("{:.0}", s["total_lookups_per_s"].as_f64().unwrap_or(0.0)),
            mb(&s["index_ram_bytes"]),
            format!("{:.0}", s["data_file_page_reads"].as_f64().unwrap_or(0.0)),
        ]);
    }
    println!();
    print_table_left(&headers, &rows, 1);
}
