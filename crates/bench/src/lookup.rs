//! The lookup benchmark: a table of 1,000,000 rows of 1000 bytes (just over 1 GB) and 10,000
//! random point selects, in the five configurations of the published SQL Server experiment; then
//! configurations that stress the cache (an extension of half the database, Zipfian ids); and
//! beside them stock SQLite with the same memory (`stock_*`: SQLite's page cache of that size,
//! the OS page cache held to a budget by a memory cgroup), which runs by default when the data
//! device is real (the emulation is bpe's and does not slow stock SQLite down).

use crate::args::selected;
use crate::args::LookupArgs;
use crate::child::{start, Runner, Setup};
use crate::db::{self, Journal};
use crate::progress;
use crate::reference::{self, reference_mib};
use crate::report::{
    fmt_duration, print_storage, print_table_left, ratio, BenchReport, ConfigResult,
};
use crate::storage::{db_bytes, load_once, Storage};
use crate::zipf;
use rand::{rngs::StdRng, Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::path::Path;
use std::sync::atomic::Ordering::Relaxed;

/// The configurations: the seed's five in its order, with its SQL Server 2014 figures
/// (seconds), then the ones it did not have (NaN): stock SQLite beside bpe, an extension smaller
/// than the database, and skewed lookups.
pub const CONFIGS: [(&str, f64); 11] = [
    ("ram_resident", 1.5),
    ("cold_slow_disk", 122.0),
    ("limited_memory", 116.0),
    ("limited_memory_bpe", 4.6),
    ("ssd_cold", 6.3),
    ("stock_ram_resident", f64::NAN),
    ("stock_limited_memory", f64::NAN),
    ("limited_memory_bpe_half_ext", f64::NAN),
    ("limited_memory_bpe_zipf", f64::NAN),
    ("stock_limited_memory_zipf", f64::NAN),
    ("restart", f64::NAN),
];

/// The configuration of stock SQLite with the limited memory.
const STOCK: &str = "stock_limited_memory";

/// How much memory a configuration has.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Memory {
    /// Enough for the whole database.
    Enough,
    /// The limited `max server memory` (--memory-mb).
    Limited,
}

/// Its extension, if any.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Extension {
    None,
    /// --extension-mb.
    Full,
    /// Half the database: the ring wraps and evicts.
    Half,
}

/// What a configuration is made of.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Shape {
    memory: Memory,
    extension: Extension,
    /// Full scan before the timed lookups.
    warm: bool,
    /// Stock SQLite (unix VFS, page cache = the memory, OS page cache in a memory cgroup).
    stock: bool,
    /// The database copy on the fast disk, without the data device's emulation.
    fast_disk: bool,
    distribution: Distribution,
    /// Warmed by a full scan in a process that then exits; the lookups run in a new process
    /// that takes the extension file over (a warm restart).
    restart: bool,
}

fn shape(name: &str) -> Shape {
    let base = Shape {
        memory: Memory::Limited,
        extension: Extension::None,
        warm: true,
        stock: name.starts_with("stock_"),
        fast_disk: false,
        distribution: match name.ends_with("_zipf") {
            true => Distribution::Zipf {
                s: zipf::LOOKUP_EXPONENT,
            },
            false => Distribution::Uniform,
        },
        restart: false,
    };
    match name {
        "ram_resident" | "stock_ram_resident" => Shape {
            memory: Memory::Enough,
            ..base
        },
        "cold_slow_disk" => Shape {
            memory: Memory::Enough,
            warm: false,
            ..base
        },
        "limited_memory_bpe" | "limited_memory_bpe_zipf" => Shape {
            extension: Extension::Full,
            ..base
        },
        "limited_memory_bpe_half_ext" => Shape {
            extension: Extension::Half,
            ..base
        },
        "restart" => Shape {
            extension: Extension::Full,
            restart: true,
            ..base
        },
        "ssd_cold" => Shape {
            warm: false,
            fast_disk: true,
            ..base
        },
        // limited_memory, stock_limited_memory, stock_limited_memory_zipf.
        _ => base,
    }
}

/// The configurations a run makes: those `--configs` names, or without it all of them, stock
/// SQLite only on a real data device (the in-process emulation is bpe's and would not slow
/// stock SQLite down).
fn chosen(filter: Option<&[String]>, emulated_device: bool) -> Vec<&'static str> {
    CONFIGS
        .iter()
        .map(|(name, _)| *name)
        .filter(|name| match filter {
            Some(_) => selected(filter, name),
            None => !(shape(name).stock && emulated_device),
        })
        .collect()
}

/// What configuration `name` runs; `os_cache` says what holds stock SQLite's OS page cache.
fn describe(
    name: &str,
    memory_mb: u64,
    extension_mb: u64,
    database_mb: u64,
    os_cache: &str,
) -> String {
    let shape = shape(name);
    let skew = match shape.distribution {
        Distribution::Zipf { s } => format!(", Zipfian ids (s = {s})"),
        Distribution::Uniform => String::new(),
    };
    let text = match name {
        "ram_resident" => "all data in RAM (L1), warmed by a full scan".into(),
        "cold_slow_disk" => "caches dropped, data on the slow device, enough memory".into(),
        "limited_memory" => format!("{memory_mb} MB max memory, no extension"),
        "limited_memory_bpe" | "limited_memory_bpe_zipf" => {
            format!("{memory_mb} MB + {extension_mb} MB extension warmed by a full scan")
        }
        "limited_memory_bpe_half_ext" => format!(
            "{memory_mb} MB + {extension_mb} MB extension ({:.2}x the database: the ring wraps and evicts), warmed by a full scan",
            extension_mb as f64 / database_mb.max(1) as f64
        ),
        "ssd_cold" => {
            format!("database on the fast disk, {memory_mb} MB, caches dropped, no extension")
        }
        "restart" => format!(
            "{memory_mb} MB + {extension_mb} MB extension warmed by a full scan in a process that exits; the lookups in a new process that takes the extension over"
        ),
        _ => format!(
            "stock SQLite (unix VFS): {memory_mb} MB page cache, OS page cache {os_cache}, warmed by a full scan"
        ),
    };
    text + &skew
}

pub(crate) const ROW_BYTES: usize = 1000;
const SEED: u64 = 20140401;

/// Which ids the lookups ask for.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Distribution {
    /// Every id equally likely.
    Uniform,
    /// Zipfian over ranks with exponent `s`, ranks scrambled over the ids ([`zipf::Zipf`]).
    Zipf { s: f64 },
}

/// What a configuration's process runs on its setup.
#[derive(Serialize, Deserialize)]
struct Lookups {
    rows: u64,
    lookups: u64,
    /// Full scan before the timed lookups.
    warm: bool,
    distribution: Distribution,
    /// Time the restore of the extension's checkpoint beside the lookups.
    #[serde(default)]
    restore: bool,
}

/// What the experiment runs: its scale and configurations.
#[derive(Clone, Debug)]
pub struct Plan {
    /// Rows of 1000 bytes in the table.
    pub rows: u64,
    /// Random point selects per configuration.
    pub lookups: u64,
    /// max server memory of the limited configurations, MB.
    pub memory_mb: u64,
    /// Extension size, MB; None: four times the database, at least twice `memory_mb`.
    pub extension_mb: Option<u64>,
    /// The configurations to run (names of [`CONFIGS`]); None: all, stock_limited_memory only
    /// on a real data device.
    pub configs: Option<Vec<String>>,
    /// Journal mode of the timed runs.
    pub journal: Journal,
    /// Memory limit of stock_limited_memory's cgroup, MB; None: [`crate::cgroup::stock_budget_mb`].
    pub cgroup_mb: Option<u64>,
    /// Load the table again even if a complete one is there.
    pub reload: bool,
    /// Size of the physical reference's scratch file, MiB (0: no reference).
    pub reference_mib: u64,
    /// Counter sampling interval.
    pub sample_ms: u64,
    /// Recorded with the results: the plan is --quick's.
    pub quick: bool,
}

impl Plan {
    /// `bench lookup`'s plan: its arguments, with the published scale (or --quick's) for the
    /// ones not given.
    pub fn from_args(a: &LookupArgs) -> Plan {
        let c = &a.common;
        let quick = c.quick;
        Plan {
            rows: a.rows.unwrap_or(if quick { 40_000 } else { 1_000_000 }),
            lookups: a.lookups.unwrap_or(if quick { 1_000 } else { 10_000 }),
            memory_mb: a.memory_mb.unwrap_or(if quick { 16 } else { 256 }),
            extension_mb: Some(a.extension_mb.unwrap_or(if quick { 256 } else { 4096 })),
            configs: c.configs.clone(),
            journal: a.journal,
            cgroup_mb: a.cgroup_mb,
            reload: c.reload,
            reference_mib: reference_mib(c),
            sample_ms: c.sample_ms,
            quick,
        }
    }

    /// `sqlite-bpe demo`'s plan: the experiment at demo scale (80,000 rows, about 80 MB;
    /// 10,000 lookups; 16 MB of memory; an extension four times the table), in three of its
    /// configurations (ram_resident, limited_memory, limited_memory_bpe), without the physical
    /// reference. Short enough for a first look (docs/BENCHMARKS.md, "The demo", has a run).
    pub fn demo() -> Plan {
        Plan {
            rows: 80_000,
            lookups: 10_000,
            memory_mb: 16,
            extension_mb: None,
            configs: Some(
                ["ram_resident", "limited_memory", "limited_memory_bpe"]
                    .map(String::from)
                    .to_vec(),
            ),
            journal: Journal::Wal,
            cgroup_mb: None,
            reload: false,
            reference_mib: 0,
            sample_ms: 250,
            quick: false,
        }
    }
}

/// Runs the benchmark and prints its results; returns them.
pub fn run(a: &LookupArgs) -> anyhow::Result<BenchReport> {
    crate::args::check_configs(
        a.common.configs.as_deref(),
        CONFIGS.iter().map(|(name, _)| *name),
        "lookup",
    )?;
    let storage = Storage::from_args(&a.common, "lookup")?;
    let report = measure(&Plan::from_args(a), &storage)?;
    print_storage(&storage, report.reference.as_ref());
    let p = &report.parameters;
    println!(
        "database:     {} ({} MB, {} rows)",
        p["database"].as_str().unwrap_or(""),
        p["database_mb"],
        p["rows"]
    );
    print_results(&report);
    Ok(report)
}

/// The configuration the physical limit judges.
const LIMIT_CONFIG: &str = "limited_memory_bpe";

/// Loads the table (unless a complete one is there), measures the physical reference, then
/// runs each configuration of `plan` in a process of its own; prints nothing on stdout.
pub fn measure(plan: &Plan, storage: &Storage) -> anyhow::Result<BenchReport> {
    let Plan { rows, lookups, .. } = *plan;
    let memory_mb = plan.memory_mb;
    let db_path = storage.data_dir.join(format!("lookup-{rows}.db"));
    load(&db_path, rows, plan.reload)?;
    let database_bytes = db_bytes(&db_path);
    let size_mb = database_bytes >> 20;
    let enough_mb = size_mb * 3 / 2 + 64;
    let min_extension_mb = bpe_core::MIN_EXTENSION_BYTES.div_ceil(1 << 20);
    let extension_mb = plan
        .extension_mb
        .unwrap_or_else(|| (size_mb * 4).max(memory_mb * 2).max(min_extension_mb));
    // Half the database, or what the core accepts: at least its minimum and more than max
    // server memory (SQL Server's rule).
    let half_extension_mb = (size_mb / 2).max(min_extension_mb).max(memory_mb + 1);
    let cgroup_mb = plan
        .cgroup_mb
        .unwrap_or(crate::cgroup::stock_budget_mb(memory_mb));
    let enough_cgroup_mb = crate::cgroup::stock_budget_mb(enough_mb);
    let fast_db = storage.on_fast_disk("lookup", &db_path, plan.reload)?;
    let reference = reference::of(storage, plan.reference_mib)?;
    let mut report = BenchReport::new("lookup", storage.clone(), reference);
    report.parameters = json!({
        "rows": rows, "row_bytes": ROW_BYTES, "lookups": lookups, "limited_memory_mb": memory_mb,
        "enough_memory_mb": enough_mb, "extension_mb": extension_mb,
        "half_extension_mb": half_extension_mb, "database_mb": size_mb,
        "database_bytes": database_bytes, "database": db_path,
        "pager_cache_kib": db::bpe_pager_cache_kib()?, "quick": plan.quick,
        "journal": plan.journal.label(), "stock_cgroup_mb": cgroup_mb,
        "stock_enough_memory_cgroup_mb": enough_cgroup_mb,
        "zipf_exponent": zipf::LOOKUP_EXPONENT,
    });
    // The physical limit's latency, re-measured beside the configuration it judges.
    let probe = match &report.reference {
        Some(_) => reference::Probe::new(&storage.ext_dir)?,
        None => None,
    };
    let runner = Runner {
        bench: "lookup",
        storage,
        sample_ms: plan.sample_ms,
    };
    for name in chosen(plan.configs.as_deref(), storage.data_device.emulated) {
        let shape = shape(name);
        let memory = match shape.memory {
            Memory::Enough => enough_mb,
            Memory::Limited => memory_mb,
        };
        let extension = match shape.extension {
            Extension::None => None,
            Extension::Full => Some(extension_mb),
            Extension::Half => Some(half_extension_mb),
        };
        let description = describe(
            name,
            memory,
            extension.unwrap_or(extension_mb),
            size_mb,
            "{os_cache}",
        );
        let path = if shape.fast_disk { &fast_db } else { &db_path };
        let mut setup = runner.setup(name, description, path, extension);
        setup.journal = plan.journal;
        let run = Lookups {
            rows,
            lookups,
            warm: shape.warm && !shape.restart,
            distribution: shape.distribution,
            restore: shape.restart,
        };
        let fill = match shape.restart {
            true => Some(fill_and_exit(&runner, &setup, rows, memory)?),
            false => None,
        };
        let beside = probe.as_ref().filter(|_| name == LIMIT_CONFIG);
        let before = beside.map(reference::Probe::rand_read_4k_qd1);
        let mut results = match (shape.stock, shape.memory) {
            (true, Memory::Enough) => runner.run_stock(setup, run, memory, enough_cgroup_mb)?,
            (true, Memory::Limited) => runner.run_stock(setup, run, memory, cgroup_mb)?,
            (false, _) => runner.run(setup, run, memory, !shape.fast_disk)?,
        };
        if let (Some(fill), Some(r)) = (fill, results.first_mut()) {
            r.details["fill_process"] = fill;
        }
        if let (Some(p), Some(before), Some(r)) = (beside, before, results.first_mut()) {
            r.details["reference_beside"] = json!({
                "before": before,
                "after": p.rand_read_4k_qd1(),
            });
        }
        report.configs.extend(results);
    }
    report.summary = summarize(&report, lookups);
    Ok(report)
}

/// The restart configuration's first process: the extension of `setup` warmed by a full scan,
/// then a clean exit, which leaves the file with its checkpoint. Returns its warm phase.
fn fill_and_exit(
    runner: &Runner<'_>,
    setup: &Setup,
    rows: u64,
    memory_mb: u64,
) -> anyhow::Result<serde_json::Value> {
    let mut fill = setup.clone();
    fill.name = format!("{}_fill", setup.name);
    fill.description = "the process that warms the extension and exits".into();
    fill.keep_extension = true;
    let run = Lookups {
        rows,
        lookups: 0,
        warm: true,
        distribution: Distribution::Uniform,
        restore: false,
    };
    let results = runner.run(fill, run, memory_mb, true)?;
    Ok(results
        .first()
        .map_or(json!(null), |r| r.details["warm"].clone()))
}

/// Creates the table unless a complete one with `rows` rows is there (loading is not timed).
pub(crate) fn load(path: &Path, rows: u64, reload: bool) -> anyhow::Result<()> {
    load_once(path, reload, |conn| {
        conn.execute_batch("CREATE TABLE t (id INTEGER PRIMARY KEY, n TEXT NOT NULL)")?;
        let pb = progress::bar(rows, "load");
        let value = "A".repeat(ROW_BYTES);
        let batch = 50_000;
        let mut id = 1;
        while id <= rows {
            let tx = conn.unchecked_transaction()?;
            {
                let mut ins = tx.prepare_cached("INSERT INTO t (id, n) VALUES (?1, ?2)")?;
                let end = (id + batch).min(rows + 1);
                for i in id..end {
                    ins.execute(rusqlite::params![i as i64, value])?;
                }
                pb.inc(end - id);
                id = end;
            }
            tx.commit()?;
        }
        pb.finish_and_clear();
        Ok(rows.to_string())
    })?;
    Ok(())
}

/// The child: one configuration, timed.
pub(crate) fn child(
    config: serde_json::Value,
    sample_ms: u64,
) -> anyhow::Result<Vec<ConfigResult>> {
    let started = std::time::Instant::now();
    let (setup, cfg, conn) = start::<Lookups>(config)?;
    let mut details = json!({});
    // The restore runs in the background while the lookups start: its time, seen from here.
    let restore = cfg.restore.then(|| {
        std::thread::spawn(move || {
            let settled = db::engine()
                .is_none_or(|e| e.wait_for_extension_restore(std::time::Duration::from_secs(600)));
            (settled, started.elapsed().as_secs_f64() * 1e3)
        })
    });
    if cfg.warm {
        let sp = progress::spinner("warm");
        sp.set_message("full scan");
        let warm = ConfigResult::measure("warm", "full scan", sample_ms, |ops| {
            let _: i64 = conn.query_row("SELECT sum(length(n)) FROM t", [], |r| r.get(0))?;
            db::wait_for_extension_writes();
            ops.fetch_add(1, Relaxed);
            Ok(json!({}))
        })?;
        sp.finish_and_clear();
        details["warm"] = warm.fill_summary();
    }
    details["extension_mb"] = json!(setup.extension.as_ref().map(|e| e.1));
    details["vfs"] = json!(setup.sqlite.vfs());
    details["journal"] = json!(setup.journal.label());
    // The I/O throttle this process ran under ("/" when none): a slow volume's group.
    details["blkio_cgroup"] = json!(crate::slow_volume::own_blkio_cgroup());
    let io_before = process_read_bytes();
    let pb = progress::bar(cfg.lookups, &setup.name);
    let mut rng = StdRng::seed_from_u64(SEED);
    let skewed = match cfg.distribution {
        Distribution::Zipf { s } => Some(zipf::Zipf::new(cfg.rows, s)?),
        Distribution::Uniform => None,
    };
    details["distribution"] = json!(cfg.distribution);
    let mut q = conn.prepare("SELECT n FROM t WHERE id = ?1")?;
    let mut result = ConfigResult::measure(&setup.name, &setup.description, sample_ms, |ops| {
        let mut bytes = 0usize;
        for i in 0..cfg.lookups {
            let id = match &skewed {
                Some(z) => z.sample(&mut rng),
                None => rng.gen_range(1..=cfg.rows),
            } as i64;
            let n: String = q.query_row([id], |r| r.get(0))?;
            bytes += n.len();
            ops.fetch_add(1, Relaxed);
            if i % 64 == 0 {
                pb.set_position(i);
            }
        }
        anyhow::ensure!(
            bytes == cfg.lookups as usize * ROW_BYTES,
            "a lookup returned a wrong row"
        );
        Ok(details)
    })?;
    pb.finish_and_clear();
    // Bytes this process had read from storage (the OS page cache's misses and O_DIRECT reads
    // alike): the one count of device reads that stock SQLite and bpe share.
    if let (Some(a), Some(b)) = (io_before, process_read_bytes()) {
        result.details["storage_read_bytes"] = json!(b.saturating_sub(a));
    }
    // The cumulative counters the engine shows at the end (SQL Server's "/sec" counters are
    // cumulative too), beside the phase's differences.
    let total = db::snapshot();
    if let Some(t) = restore {
        let (settled, ms) = t.join().expect("restore timer");
        let page_size = db::engine()
            .and_then(|e| e.files().first().map(|f| f.page_size))
            .unwrap_or(4096) as f64;
        let restored_gib = total.ext_pages_restored as f64 * page_size / (1u64 << 30) as f64;
        let restore_ms = db::engine()
            .and_then(|e| e.extension_restore_time())
            .map_or(f64::NAN, |d| d.as_secs_f64() * 1e3);
        result.details["restore"] = json!({
            "settled": settled,
            "ms_from_process_start": ms,
            "restore_ms": restore_ms,
            "restore_ms_per_gib": restore_ms / restored_gib.max(1e-9),
            "pages_restored": total.ext_pages_restored,
            "pages_not_restored": total.ext_pages_not_restored,
            "restored_gib": restored_gib,
        });
    }
    result.details["cumulative"] = json!({
        "page_reads": total.page_reads,
        "ext_page_reads": total.ext_page_reads,
        "ext_page_writes": total.ext_page_writes,
    });
    Ok(vec![result])
}

/// `read_bytes` of /proc/self/io: what this process caused to be read from storage.
fn process_read_bytes() -> Option<u64> {
    let io = std::fs::read_to_string("/proc/self/io").ok()?;
    io.lines()
        .find_map(|l| l.strip_prefix("read_bytes:"))
        .and_then(|v| v.trim().parse().ok())
}

fn summarize(r: &BenchReport, lookups: u64) -> serde_json::Value {
    let secs = |n: &str| r.config(n).map(|c| c.seconds);
    let (ram, lim, bpe, ssd) = (
        secs("ram_resident"),
        secs("limited_memory"),
        secs(LIMIT_CONFIG),
        secs("ssd_cold"),
    );
    let mut s = json!({});
    if let (Some(l), Some(b)) = (lim, bpe) {
        s["limited_memory_over_bpe"] = json!(ratio(l, b));
    }
    if let (Some(b), Some(m)) = (bpe, ram) {
        s["bpe_over_ram_resident"] = json!(ratio(b, m));
    }
    if let (Some(c), Some(b)) = (ssd, bpe) {
        s["ssd_cold_over_bpe"] = json!(ratio(c, b));
    }
    if let (Some(k), Some(b)) = (secs(STOCK), bpe) {
        s["stock_over_bpe"] = json!(ratio(k, b));
    }
    // The fits-in-memory case: bpe must be no slower than 1.1x stock SQLite with the same memory.
    if let (Some(m), Some(k)) = (ram, secs("stock_ram_resident")) {
        s["ram_resident_over_stock_ram_resident"] = json!(ratio(m, k));
    }
    if let (Some(k), Some(b)) = (
        secs("stock_limited_memory_zipf"),
        secs("limited_memory_bpe_zipf"),
    ) {
        s["stock_zipf_over_bpe_zipf"] = json!(ratio(k, b));
    }
    if let (Some(h), Some(b)) = (r.config("limited_memory_bpe_half_ext"), bpe) {
        s["half_ext"] = json!({
            "over_bpe": ratio(h.seconds, b),
            "extension_mb": r.parameters["half_extension_mb"],
            "ext_page_evictions": h.counters.ext_page_evictions,
            "ext_page_writes": h.counters.ext_page_writes,
            "ext_reads_per_lookup": h.counters.ext_page_reads as f64 / lookups as f64,
            "data_reads_per_lookup": h.counters.page_reads as f64 / lookups as f64,
        });
    }
    if let (Some(c), Some(b)) = (r.config("restart"), bpe) {
        let restore = &c.details["restore"];
        s["restart"] = json!({
            "over_warm": ratio(c.seconds, b),
            "restore_ms": restore["restore_ms"],
            "restore_ms_per_gib": restore["restore_ms_per_gib"],
            "settled_ms_from_process_start": restore["ms_from_process_start"],
            "pages_restored": restore["pages_restored"],
            "data_reads_per_lookup": c.counters.page_reads as f64 / lookups as f64,
        });
    }
    if let (Some(cfg), Some(m), Some(reference)) =
        (r.config(LIMIT_CONFIG), ram, r.reference.as_ref())
    {
        let l2_per_lookup = cfg.counters.ext_page_reads as f64 / lookups as f64;
        let data_per_lookup = cfg.counters.page_reads as f64 / lookups as f64;
        // The device as it was around the configuration's run when measured there (the mean of
        // the probes before and after it), else the run-start reference.
        let beside = &cfg.details["reference_beside"];
        let beside_us = ["before", "after"]
            .map(|w| beside[w]["mean_us"].as_f64())
            .into_iter()
            .collect::<Option<Vec<f64>>>()
            .map(|v| v.iter().sum::<f64>() / v.len() as f64);
        let latency_us = beside_us.unwrap_or(reference.rand_read_4k_qd1.mean_us);
        let latency_s = latency_us / 1e6;
        let ram_per_lookup = m / lookups as f64;
        let limit = lookups as f64 * (latency_s * l2_per_lookup + ram_per_lookup);
        s["physical_limit"] = json!({
            "device_read_latency_us": latency_us,
            "device_read_latency_measured": if beside_us.is_some() {
                "beside the configuration (mean of before and after)"
            } else {
                "at the run's start"
            },
            "run_start_latency_us": reference.rand_read_4k_qd1.mean_us,
            "l2_reads_per_lookup": l2_per_lookup,
            "data_reads_per_lookup": data_per_lookup,
            "ram_lookup_us": ram_per_lookup * 1e6,
            "limit_seconds": limit,
            "bpe_over_limit": ratio(cfg.seconds, limit),
            // Where a lookup's time went: the L2 requests as the core timed them, the in-RAM
            // work, and the rest (the engine's miss path: eviction, install, checksum, copies).
            "per_lookup_us": cfg.seconds * 1e6 / lookups as f64,
            "l2_request_us": (cfg.counters.ext_read_micros as f64)
                / cfg.counters.ext_read_requests.max(1) as f64,
            "l2_request_us_per_lookup": cfg.counters.ext_read_micros as f64 / lookups as f64,
        });
    }
    s
}

fn print_results(r: &BenchReport) {
    println!();
    let mut rows = Vec::new();
    for (i, (name, sql_server)) in CONFIGS.iter().enumerate() {
        let Some(c) = r.config(name) else { continue };
        let n = c.operations.max(1) as f64;
        // Stock SQLite has no engine to count pages.
        let engine = |v: String| if c.counters.engine { v } else { "-".into() };
        rows.push(vec![
            format!("{} {name}", i + 1),
            c.description.clone(),
            fmt_duration(c.seconds),
            match sql_server.is_nan() {
                true => "-".into(),
                false => fmt_duration(*sql_server),
            },
            engine(format!("{:.1}", c.counters.hit_ratio_percent)),
            engine(format!("{:.2}", c.counters.ext_page_reads as f64 / n)),
            engine(format!("{:.2}", c.counters.page_reads as f64 / n)),
            c.details["storage_read_bytes"]
                .as_f64()
                .map_or("-".into(), |b| format!("{:.2}", b / 4096.0 / n)),
        ]);
    }
    print_table_left(
        &[
            "#  config",
            "description",
            "sqlite-bpe",
            "SQL Server",
            "L1 hit %",
            "L2 reads/lookup",
            "data reads/lookup",
            "4 KiB storage reads/lookup",
        ],
        &rows,
        2,
    );
    let s = &r.summary;
    println!();
    let show = |label: &str, key: &str, theirs: &str| {
        if let Some(v) = s[key].as_f64() {
            println!("{label:<40} {v:>10.2}   (SQL Server: {theirs})");
        }
    };
    show(
        "limited_memory / limited_memory_bpe",
        "limited_memory_over_bpe",
        "25",
    );
    show(
        "limited_memory_bpe / ram_resident",
        "bpe_over_ram_resident",
        "3.1",
    );
    show("ssd_cold / limited_memory_bpe", "ssd_cold_over_bpe", "1.37");
    let ours = |label: &str, key: &str, note: &str| {
        if let Some(v) = s[key].as_f64() {
            println!("{label:<40} {v:>10.2}{note}");
        }
    };
    ours(
        "stock_limited_memory / limited_memory_bpe",
        "stock_over_bpe",
        "",
    );
    ours(
        "ram_resident / stock_ram_resident",
        "ram_resident_over_stock_ram_resident",
        "   (target: at most 1.1)",
    );
    ours(
        "stock_limited_memory_zipf / ..._bpe_zipf",
        "stock_zipf_over_bpe_zipf",
        "",
    );
    let h = &s["half_ext"];
    if let Some(v) = h["over_bpe"].as_f64() {
        println!(
            "{:<40} {v:>10.2}   ({} MB extension: {} L2 evictions, {} L2 writes during the lookups)",
            "limited_memory_bpe_half_ext / ..._bpe", h["extension_mb"], h["ext_page_evictions"], h["ext_page_writes"]
        );
    }
    let w = &s["restart"];
    if let Some(v) = w["over_warm"].as_f64() {
        println!(
            "{:<40} {v:>10.2}   (target: at most 1.2; restore: {} pages in {:.1} ms, {:.1} ms per GiB, settled {:.0} ms after the process started; {:.3} data reads/lookup)",
            "restart / limited_memory_bpe",
            w["pages_restored"],
            w["restore_ms"].as_f64().unwrap_or(0.0),
            w["restore_ms_per_gib"].as_f64().unwrap_or(0.0),
            w["settled_ms_from_process_start"].as_f64().unwrap_or(0.0),
            w["data_reads_per_lookup"].as_f64().unwrap_or(0.0),
        );
    }
    for c in r
        .configs
        .iter()
        .filter(|c| !c.details["memory_cgroup"].is_null())
    {
        print_memory_cgroup(&c.name, &c.details["memory_cgroup"]);
    }
    if let Some(p) = s.get("physical_limit") {
        println!(
            "physical limit for limited_memory_bpe:   {} = {:.2} L2 reads/lookup x {:.1} µs ({}; {:.1} µs at the run's start) + {:.1} µs in RAM, per lookup; measured / limit = {:.2}",
            fmt_duration(p["limit_seconds"].as_f64().unwrap_or(0.0)),
            p["l2_reads_per_lookup"].as_f64().unwrap_or(0.0),
            p["device_read_latency_us"].as_f64().unwrap_or(0.0),
            p["device_read_latency_measured"].as_str().unwrap_or(""),
            p["run_start_latency_us"].as_f64().unwrap_or(0.0),
            p["ram_lookup_us"].as_f64().unwrap_or(0.0),
            p["bpe_over_limit"].as_f64().unwrap_or(0.0),
        );
        let f = |k: &str| p[k].as_f64().unwrap_or(0.0);
        println!(
            "  per lookup: {:.1} µs = {:.1} µs in L2 requests ({:.1} µs each as the core timed them) + {:.1} µs as in RAM + {:.1} µs in the engine's miss path",
            f("per_lookup_us"),
            f("l2_request_us_per_lookup"),
            f("l2_request_us"),
            f("ram_lookup_us"),
            f("per_lookup_us") - f("l2_request_us_per_lookup") - f("ram_lookup_us"),
        );
    }
}

/// The memory cgroup a stock SQLite configuration ran in, or why it ran without one.
pub(crate) fn print_memory_cgroup(name: &str, g: &serde_json::Value) {
    match g["applied"].as_bool() {
        Some(true) => println!(
            "{name}'s memory cgroup: limit {} MB, high-water {:.1} MB, limit hit {} times, at the end {:.1} MB page cache + {:.1} MB anonymous",
            g["limit_mb"],
            g["max_usage_mb"].as_f64().unwrap_or(0.0),
            g["failcnt"],
            g["cache_mb"].as_f64().unwrap_or(0.0),
            g["rss_mb"].as_f64().unwrap_or(0.0)
        ),
        _ => println!(
            "{name} ran WITHOUT a memory limit: {}",
            g["reason"].as_str().unwrap_or("unknown")
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stock_configurations_run_by_default_only_on_a_real_device() {
        let real = chosen(None, false);
        assert_eq!(real.len(), CONFIGS.len());
        for stock in [
            "stock_ram_resident",
            "stock_limited_memory",
            "stock_limited_memory_zipf",
        ] {
            assert!(real.contains(&stock), "{stock}");
        }
        let emulated = chosen(None, true);
        assert!(emulated.iter().all(|n| !n.starts_with("stock_")));
        for bpe in [
            "limited_memory_bpe",
            "limited_memory_bpe_half_ext",
            "limited_memory_bpe_zipf",
        ] {
            assert!(emulated.contains(&bpe), "{bpe}");
        }
    }

    #[test]
    fn configs_names_exactly_what_runs_even_stock_on_an_emulated_device() {
        let names = ["stock_ram_resident", "limited_memory_bpe_zipf", "no_such"].map(String::from);
        assert_eq!(
            chosen(Some(&names), true),
            ["stock_ram_resident", "limited_memory_bpe_zipf"]
        );
    }

    #[test]
    fn each_configuration_has_the_shape_its_name_says() {
        let zipf = Distribution::Zipf {
            s: zipf::LOOKUP_EXPONENT,
        };
        let s = shape("stock_ram_resident");
        assert!(s.stock && s.warm && s.memory == Memory::Enough);
        assert_eq!(s.extension, Extension::None);
        let s = shape("limited_memory_bpe_half_ext");
        assert!(!s.stock && s.memory == Memory::Limited && s.extension == Extension::Half);
        assert_eq!(s.distribution, Distribution::Uniform);
        let s = shape("limited_memory_bpe_zipf");
        assert_eq!((s.extension, s.distribution), (Extension::Full, zipf));
        let s = shape("stock_limited_memory_zipf");
        assert!(s.stock && s.memory == Memory::Limited && s.distribution == zipf);
        let s = shape("ssd_cold");
        assert!(s.fast_disk && !s.warm);
        assert!(!shape("cold_slow_disk").warm);
        assert_eq!(shape("limited_memory").extension, Extension::None);
    }
}
