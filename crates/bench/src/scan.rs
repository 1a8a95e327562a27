//! The scan benchmark: `SELECT AVG(ActualCost)` over a ~1 GB transaction history, cold from the
//! slow device, warm, with 256 MB of memory, and with 256 MB plus an extension (the first run
//! fills it, the second reads from it); on a real data device, stock SQLite beside them with the
//! same memory (`stock_cold` then `stock_warm`, `stock_limited_memory`: SQLite's page cache of
//! that size, the OS page cache held to a budget by a memory cgroup).

use crate::args::selected;
use crate::args::ScanArgs;
use crate::child::{start, Runner};
use crate::reference::measure_reference;
use crate::report::{fmt_duration, print_configs, print_storage, ratio, BenchReport, ConfigResult};
use crate::storage::{db_bytes, load_once, Storage};
use crate::{cgroup, db};
use crate::{progress, reference};
use anyhow::Context;
use rand::{rngs::StdRng, Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::path::Path;
use std::sync::atomic::Ordering::Relaxed;

/// A configuration's process: the runs it makes one after the other, its memory, and what it
/// runs on.
struct Child {
    name: &'static str,
    runs: &'static [&'static str],
    memory: Mem,
    extension: bool,
    /// The data device (with its emulation, if any); false: the copy on the fast disk.
    slow_device: bool,
    /// Stock SQLite (unix VFS, page cache = the memory, OS page cache in a memory cgroup).
    stock: bool,
}

const fn process(name: &'static str, runs: &'static [&'static str], memory: Mem) -> Child {
    Child {
        name,
        runs,
        memory,
        extension: false,
        slow_device: true,
        stock: false,
    }
}

/// The seed's configurations, then stock SQLite's with the same memory (run by default on a
/// real data device only: the in-process emulation is bpe's and would not slow stock SQLite).
const CHILDREN: [Child; 6] = [
    process("cold", &["cold", "warm"], Mem::Enough),
    process(
        "limited_memory",
        &["limited_memory", "limited_memory_run2"],
        Mem::Limited,
    ),
    Child {
        extension: true,
        ..process(
            "limited_memory_bpe",
            &["limited_memory_bpe_fill", "limited_memory_bpe"],
            Mem::Limited,
        )
    },
    Child {
        slow_device: false,
        ..process("ssd_cold", &["ssd_cold"], Mem::Enough)
    },
    Child {
        stock: true,
        ..process("stock_cold", &["stock_cold", "stock_warm"], Mem::Enough)
    },
    Child {
        stock: true,
        ..process(
            "stock_limited_memory",
            &["stock_limited_memory"],
            Mem::Limited,
        )
    },
];

/// The configuration processes a run starts: those with a run `--configs` names, or without it
/// all, stock SQLite's only on a real data device.
fn chosen(filter: Option<&[String]>, emulated_device: bool) -> Vec<&'static Child> {
    CHILDREN
        .iter()
        .filter(|c| match filter {
            Some(_) => c.runs.iter().any(|r| selected(filter, r)),
            None => !(c.stock && emulated_device),
        })
        .collect()
}

#[derive(Clone, Copy)]
enum Mem {
    Enough,
    Limited,
}

/// SQL Server 2014's figures from the published walk-through (seconds).
fn sql_server(name: &str) -> Option<f64> {
    match name {
        "cold" => Some(38.1),
        "warm" => Some(2.6),
        "limited_memory" | "limited_memory_run2" => Some(37.8),
        "limited_memory_bpe_fill" => Some(42.0),
        _ => None,
    }
}

/// What a configuration's process runs on its setup.
#[derive(Serialize, Deserialize)]
struct Scans {
    runs: Vec<String>,
    table_bytes: u64,
}

/// Runs the benchmark and prints its results; returns them.
pub fn run(a: &ScanArgs) -> anyhow::Result<BenchReport> {
    let c = &a.common;
    crate::args::check_configs(
        c.configs.as_deref(),
        CHILDREN.iter().flat_map(|child| child.runs.iter().copied()),
        "scan",
    )?;
    let table_mb = a.table_mb.unwrap_or(if c.quick { 64 } else { 1024 });
    let memory_mb = a.memory_mb.unwrap_or(if c.quick { 16 } else { 256 });
    let extension_mb = a.extension_mb.unwrap_or(if c.quick { 256 } else { 4096 });
    let storage = Storage::from_args(c, "scan")?;
    let db_path = storage.data_dir.join(format!("scan-{table_mb}mb.db"));
    let rows = load(&db_path, table_mb << 20, c.reload)?;
    let table_bytes = db_bytes(&db_path);
    let enough_mb = (table_bytes >> 20) * 3 / 2 + 64;
    let fast_db = storage.on_fast_disk("scan", &db_path, c.reload)?;
    let reference = measure_reference(c, &storage)?;
    // A real data device gets its own reference (its sequential bandwidth is the scan's limit).
    let data_reference = if storage.own_data_dir && !storage.data_device.emulated {
        // Measured as the configurations will read it: under the slow volume's throttle.
        storage.enter_data_device()?;
        Some(reference::measure(&storage.data_dir, 128)?)
    } else {
        None
    };
    let mut report = BenchReport::new("scan", storage.clone(), reference);
    report.parameters = json!({
        "table_mb": table_mb, "table_bytes": table_bytes, "rows": rows,
        "limited_memory_mb": memory_mb, "enough_memory_mb": enough_mb,
        "extension_mb": extension_mb, "pager_cache_kib": db::bpe_pager_cache_kib()?,
        "data_reference": data_reference, "quick": c.quick,
    });
    print_storage(&storage, report.reference.as_ref());
    println!(
        "table:        {} ({} MB, {rows} rows)",
        db_path.display(),
        table_bytes >> 20
    );
    let runner = Runner {
        bench: "scan",
        storage: &storage,
        sample_ms: c.sample_ms,
    };
    for child in chosen(c.configs.as_deref(), storage.data_device.emulated) {
        let memory = match child.memory {
            Mem::Enough => enough_mb,
            Mem::Limited => memory_mb,
        };
        let description = match (child.stock, child.extension) {
            (true, _) => format!(
                "stock SQLite (unix VFS): {memory} MB page cache, OS page cache {{os_cache}}"
            ),
            (false, true) => format!("{memory} MB + extension"),
            (false, false) => format!("{memory} MB"),
        };
        let db = if child.slow_device {
            &db_path
        } else {
            &fast_db
        };
        let setup = runner.setup(
            child.name,
            description,
            db,
            child.extension.then_some(extension_mb),
        );
        let scans = Scans {
            runs: child.runs.iter().map(|s| s.to_string()).collect(),
            table_bytes,
        };
        let results = match child.stock {
            true => {
                let cgroup_mb = match child.memory {
                    Mem::Limited => a.cgroup_mb.unwrap_or(cgroup::stock_budget_mb(memory)),
                    Mem::Enough => cgroup::stock_budget_mb(memory),
                };
                runner.run_stock(setup, scans, memory, cgroup_mb)?
            }
            false => runner.run(setup, scans, memory, child.slow_device)?,
        };
        report.configs.extend(results);
    }
    report.summary = summarize(&report, table_bytes, data_reference.as_ref());
    print_results(&report);
    Ok(report)
}

/// Fills the table until the database reaches `bytes`; returns the row count.
fn load(path: &Path, bytes: u64, reload: bool) -> anyhow::Result<u64> {
    let rows = load_once(path, reload, |conn| {
        conn.execute_batch(
            "CREATE TABLE bigTransactionHistory (TransactionID INTEGER PRIMARY KEY, ProductID INTEGER NOT NULL, TransactionDate TEXT NOT NULL, Quantity INTEGER NOT NULL, ActualCost REAL NOT NULL)",
        )?;
        let dates: Vec<String> = (0..1461).map(|d| date_from_days(12965 + d)).collect();
        let mut rng = StdRng::seed_from_u64(2005);
        let pb = progress::bar(bytes >> 20, "load MB");
        let mut id: i64 = 0;
        loop {
            let tx = conn.unchecked_transaction()?;
            {
                let mut ins = tx.prepare_cached(
                    "INSERT INTO bigTransactionHistory VALUES (?1, ?2, ?3, ?4, ?5)",
                )?;
                for _ in 0..250_000 {
                    id += 1;
                    let qty: i64 = rng.gen_range(1..=100);
                    let cost = (rng.gen_range(1.0..2500.0f64) * 100.0).round() / 100.0;
                    ins.execute(rusqlite::params![
                        id,
                        rng.gen_range(1001..=50000i64),
                        dates[rng.gen_range(0..dates.len())],
                        qty,
                        cost
                    ])?;
                }
            }
            tx.commit()?;
            let pages: u64 = conn.query_row("PRAGMA page_count", [], |r| r.get(0))?;
            let size = pages * 4096;
            pb.set_position((size >> 20).min(bytes >> 20));
            if size >= bytes {
                break;
            }
        }
        pb.finish_and_clear();
        Ok(id.to_string())
    })?;
    rows.parse().with_context(|| {
        format!(
            "{}: the load's note {rows:?} is not a row count (--reload loads it again)",
            path.display()
        )
    })
}

/// 'YYYY-MM-DD' of a day number counted from 1970-01-01 (civil calendar).
fn date_from_days(z: i64) -> String {
    let z = z + 719468;
    let era = z.div_euclid(146097);
    let doe = z - era * 146097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}")
}

pub fn child(config: serde_json::Value, sample_ms: u64) -> anyhow::Result<Vec<ConfigResult>> {
    let (setup, cfg, conn) = start::<Scans>(config)?;
    let mut out = Vec::new();
    for (i, name) in cfg.runs.iter().enumerate() {
        let mut waited = 0.0;
        if i > 0 && setup.extension.is_some() {
            let t = std::time::Instant::now();
            db::wait_for_extension_writes();
            waited = t.elapsed().as_secs_f64();
        }
        let description = format!("run {} with {}", i + 1, setup.description);
        let sp = progress::spinner(name);
        sp.set_message("SELECT AVG(ActualCost) FROM bigTransactionHistory");
        let mut r = ConfigResult::measure(name, &description, sample_ms, |ops| {
            let avg: f64 = conn.query_row(
                "SELECT AVG(ActualCost) FROM bigTransactionHistory",
                [],
                |r| r.get(0),
            )?;
            ops.fetch_add(1, Relaxed);
            Ok(json!({ "avg": avg }))
        })?;
        sp.finish_and_clear();
        r.details["waited_for_extension_writer_s"] = json!(waited);
        r.details["mb_per_s"] = json!(cfg.table_bytes as f64 / 1048576.0 / r.seconds);
        // The I/O throttle this process ran under: a slow volume's group, or the root.
        r.details["blkio_cgroup"] = json!(crate::slow_volume::own_blkio_cgroup());
        out.push(r);
    }
    Ok(out)
}

fn summarize(
    r: &BenchReport,
    table_bytes: u64,
    data_ref: Option<&reference::Reference>,
) -> serde_json::Value {
    let d = &r.storage.data_device;
    const READAHEAD: u64 = bpe_core::config::READAHEAD_BYTES as u64;
    // The slow device's sequential bandwidth: measured for a real device; for the emulation,
    // what it allows at queue depth 1 with the core's largest request (readahead, 256 KiB).
    let slow_mb_s = match data_ref {
        Some(x) => x.seq_read_mb_s,
        None if d.emulated_read_s(READAHEAD) > 0.0 => {
            (READAHEAD as f64 / 1048576.0) / d.emulated_read_s(READAHEAD)
        }
        None => r.reference.as_ref().map_or(0.0, |x| x.seq_read_mb_s),
    };
    let fast_mb_s = r.reference.as_ref().map_or(0.0, |x| x.seq_read_mb_s);
    let mut runs = serde_json::Map::new();
    for c in &r.configs {
        let mb_s = table_bytes as f64 / 1048576.0 / c.seconds;
        let against = if c.name.starts_with("limited_memory_bpe")
            && c.name != "limited_memory_bpe_fill"
            || c.name == "ssd_cold"
        {
            fast_mb_s
        } else {
            slow_mb_s
        };
        runs.insert(
            c.name.clone(),
            json!({ "mb_per_s": mb_s, "device_mb_per_s": against, "fraction_of_device": mb_s / against }),
        );
    }
    let fill = r
        .config("limited_memory_bpe_fill")
        .map(ConfigResult::fill_summary);
    json!({
        "stock": stock_ratios(r),
        "slow_device_seq_mb_s": slow_mb_s,
        "fast_disk_seq_mb_s": fast_mb_s,
        "device_seq_write_mb_s": r.reference.as_ref().map(|x| x.seq_write_mb_s),
        "runs": runs,
        "extension_fill": fill,
    })
}

/// bpe against stock SQLite with the same memory: (key, bpe's run, stock's run, which is the
/// numerator).
const STOCK_RATIOS: [(&str, &str, &str); 4] = [
    // The fits-in-memory case: bpe must be no slower than 1.1x stock.
    ("warm_over_stock_warm", "warm", "stock_warm"),
    ("cold_over_stock_cold", "cold", "stock_cold"),
    (
        "stock_limited_memory_over_limited_memory_bpe",
        "stock_limited_memory",
        "limited_memory_bpe",
    ),
    (
        "stock_limited_memory_over_limited_memory",
        "stock_limited_memory",
        "limited_memory",
    ),
];

/// The ratios of [`STOCK_RATIOS`] whose two runs are in `r` (seconds over seconds).
fn stock_ratios(r: &BenchReport) -> serde_json::Value {
    let mut out = serde_json::Map::new();
    for (key, a, b) in STOCK_RATIOS {
        if let (Some(a), Some(b)) = (r.config(a), r.config(b)) {
            out.insert(key.into(), json!(ratio(a.seconds, b.seconds)));
        }
    }
    out.into()
}

fn print_results(r: &BenchReport) {
    let headers = [
        "run",
        "configuration",
        "sqlite-bpe",
        "SQL Server",
        "logical reads",
        "physical reads",
        "readahead",
        "ext reads",
        "ext writes",
        "MB/s",
        "of device",
    ];
    print_configs(r, &headers, |c| {
        let k = &c.counters;
        let s = &r.summary["runs"][&c.name];
        // Stock SQLite has no engine to count pages.
        let count = |v: u64| match k.engine {
            true => v.to_string(),
            false => "-".into(),
        };
        vec![
            fmt_duration(c.seconds),
            sql_server(&c.name).map_or("-".into(), fmt_duration),
            count(k.page_lookups),
            count(k.page_reads),
            count(k.readahead_pages),
            count(k.ext_page_reads),
            count(k.ext_page_writes),
            format!("{:.0}", s["mb_per_s"].as_f64().unwrap_or(0.0)),
            format!(
                "{:.0} %",
                100.0 * s["fraction_of_device"].as_f64().unwrap_or(0.0)
            ),
        ]
    });
    println!(
        "\nslow device sequential read: {:.0} MB/s; fast disk: {:.0} MB/s ('of device' compares extension and ssd_cold runs with the fast disk, the others with the slow device)",
        r.summary["slow_device_seq_mb_s"].as_f64().unwrap_or(0.0),
        r.summary["fast_disk_seq_mb_s"].as_f64().unwrap_or(0.0)
    );
    for (key, a, b) in STOCK_RATIOS {
        if let Some(v) = r.summary["stock"][key].as_f64() {
            let target = match key {
                "warm_over_stock_warm" => "   (target: at most 1.1)",
                _ => "",
            };
            println!("{:<44} {v:>8.2}{target}", format!("{a} / {b}"));
        }
    }
    for c in r
        .configs
        .iter()
        .filter(|c| !c.details["memory_cgroup"].is_null())
    {
        crate::lookup::print_memory_cgroup(&c.name, &c.details["memory_cgroup"]);
    }
    let f = &r.summary["extension_fill"];
    if !f.is_null() {
        println!(
            "extension fill (limited_memory_bpe_fill): {:.0} MB written, {} % sequential, {:.0} MB/s mean, {:.0} MB/s peak, {} admissions dropped",
            f["ext_bytes_written"].as_f64().unwrap_or(0.0) / 1048576.0,
            f["ext_sequential_write_percent"],
            f["ext_write_mb_s_mean"].as_f64().unwrap_or(0.0),
            f["ext_write_mb_s_peak"].as_f64().unwrap_or(0.0),
            f["ext_admissions_dropped"],
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(children: Vec<&Child>) -> Vec<&str> {
        children.iter().map(|c| c.name).collect()
    }

    #[test]
    fn stock_runs_by_default_only_on_a_real_device() {
        let real = names(chosen(None, false));
        assert!(real.contains(&"stock_cold") && real.contains(&"stock_limited_memory"));
        assert_eq!(real.len(), CHILDREN.len());
        let emulated = names(chosen(None, true));
        assert!(emulated.iter().all(|n| !n.starts_with("stock_")));
        assert!(emulated.contains(&"limited_memory_bpe"));
    }

    #[test]
    fn naming_one_run_starts_its_process() {
        let f = ["stock_warm".to_string(), "cold".to_string()];
        assert_eq!(names(chosen(Some(&f), true)), ["cold", "stock_cold"]);
    }

    #[test]
    fn stock_children_are_stock_sqlite_on_the_data_device() {
        for c in CHILDREN.iter().filter(|c| c.name.starts_with("stock_")) {
            assert!(c.stock && c.slow_device && !c.extension, "{}", c.name);
            assert!(c.runs.iter().all(|r| r.starts_with("stock_")));
        }
        assert!(CHILDREN.iter().filter(|c| c.stock).count() == 2);
    }
}
