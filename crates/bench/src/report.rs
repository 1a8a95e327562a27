//! Results: what each configuration measured, the JSON written by `--json`, and text tables.

use crate::db::Counters;
use crate::reference::Reference;
use crate::sampler::Sample;
use crate::storage::Storage;
use crate::table::Table;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One configuration's timed phase.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ConfigResult {
    pub name: String,
    pub description: String,
    pub seconds: f64,
    /// Lookups, scans, transactions or queries completed in `seconds`.
    pub operations: u64,
    pub counters: Counters,
    /// Buffer Manager counters sampled during the phase.
    pub series: Vec<Sample>,
    /// Benchmark-specific figures (per-query times, per-type counts, checks).
    #[serde(default)]
    pub details: Value,
}

/// What `--json` writes.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct BenchReport {
    pub benchmark: String,
    /// The VFS the timed runs went through (`bpe`).
    pub vfs: String,
    pub machine: Value,
    pub storage: Storage,
    pub reference: Option<Reference>,
    pub parameters: Value,
    pub configs: Vec<ConfigResult>,
    pub summary: Value,
}

impl BenchReport {
    pub fn new(benchmark: &str, storage: Storage, reference: Option<Reference>) -> Self {
        BenchReport {
            benchmark: benchmark.into(),
            vfs: crate::db::VFS.into(),
            machine: machine(),
            storage,
            reference,
            parameters: Value::Null,
            configs: Vec::new(),
            summary: Value::Null,
        }
    }

    pub fn config(&self, name: &str) -> Option<&ConfigResult> {
        self.configs.iter().find(|c| c.name == name)
    }

    /// Writes the report as JSON to `path` (what --json does).
    pub fn write_json(&self, path: &std::path::Path) -> anyhow::Result<()> {
        std::fs::write(path, serde_json::to_string_pretty(self)?)?;
        eprintln!("results written to {}", path.display());
        Ok(())
    }
}

fn machine() -> Value {
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_default();
    let unix = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    serde_json::json!({
        "cores": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        "memory_bytes": bpe_core::config::physical_memory(),
        "cpu": cpu,
        "kernel": kernel.trim(),
        "unix_time": unix,
    })
}

/// Prints rows under headers, columns padded to their widest cell, the first `left` columns
/// left-aligned and the others right-aligned.
pub fn print_table_left(headers: &[&str], rows: &[Vec<String>], left: usize) {
    let mut table = Table::new(headers.iter().copied()).left_columns(left);
    table.rows = rows.to_vec();
    print!("{}", table.render());
}

/// Prints a blank line, then a row per configuration of `r`: its name and description, then
/// `cells` of it, under `headers` (the first two left-aligned).
pub fn print_configs(
    r: &BenchReport,
    headers: &[&str],
    cells: impl Fn(&ConfigResult) -> Vec<String>,
) {
    println!();
    let rows: Vec<Vec<String>> = r
        .configs
        .iter()
        .map(|c| {
            let mut row = vec![c.name.clone(), c.description.clone()];
            row.extend(cells(c));
            row
        })
        .collect();
    print_table_left(headers, &rows, 2);
}

/// Seconds as the seeds write them: "1.5 s" below a minute, "2:02" above.
pub fn fmt_duration(s: f64) -> String {
    if s >= 60.0 {
        let whole = s.round() as u64;
        format!("{}:{:02}", whole / 60, whole % 60)
    } else if s >= 10.0 {
        format!("{s:.1} s")
    } else if s >= 0.1 {
        format!("{s:.2} s")
    } else {
        format!("{:.1} ms", s * 1000.0)
    }
}

pub fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 {
        a / b
    } else {
        f64::NAN
    }
}

/// Prints the storage and the physical reference a run used.
pub fn print_storage(s: &Storage, r: Option<&Reference>) {
    println!("data device:  {}", s.describe_data_device());
    println!("data dir:     {} ({})", s.data_dir.display(), s.data_fs);
    println!("ext dir:      {} ({})", s.ext_dir.display(), s.ext_fs);
    if let Some(r) = r {
        println!(
            "reference on ext fs ({} MiB file{}): 4 KiB QD1 {:.1} µs, 8 KiB QD1 {:.1} µs, 8 KiB QD4 {:.1} µs ({:.0} IOPS), seq read {:.0} MB/s, seq write {:.0} MB/s",
            r.file_mib,
            if r.direct_io { ", O_DIRECT" } else { ", buffered" },
            r.rand_read_4k_qd1.mean_us,
            r.rand_read_8k_qd1.mean_us,
            r.rand_read_8k_qd4.mean_us,
            r.rand_read_8k_qd4.iops,
            r.seq_read_mb_s,
            r.seq_write_mb_s
        );
    }
}

impl ConfigResult {
    /// Times `work` with the counter sampler running; `work` counts its operations in the
    /// counter it is given and returns its details.
    pub fn measure(
        name: &str,
        description: &str,
        sample_ms: u64,
        work: impl FnOnce(&std::sync::atomic::AtomicU64) -> anyhow::Result<Value>,
    ) -> anyhow::Result<ConfigResult> {
        use std::sync::atomic::Ordering::Relaxed;
        let ops = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let before = crate::db::snapshot();
        let sampler = crate::sampler::Sampler::start(
            std::time::Duration::from_millis(sample_ms),
            ops.clone(),
        );
        let t = std::time::Instant::now();
        let details = work(&ops);
        let seconds = t.elapsed().as_secs_f64();
        let after = crate::db::snapshot();
        let series = sampler.finish();
        Ok(ConfigResult {
            name: name.into(),
            description: description.into(),
            seconds,
            operations: ops.load(Relaxed),
            counters: Counters::between(&before, &after),
            series,
            details: details?,
        })
    }

    /// How the extension filled during this phase: volume, sequential share, write bandwidth
    /// (mean over the phase and the best sampling interval).
    pub fn fill_summary(&self) -> Value {
        let k = &self.counters;
        let slot = 4096.0;
        let peak = self
            .series
            .iter()
            .map(|s| s.ext_page_writes_per_s)
            .fold(0.0, f64::max)
            * slot
            / 1048576.0;
        serde_json::json!({
            "seconds": self.seconds,
            "page_reads": k.page_reads,
            "readahead_pages": k.readahead_pages,
            "ext_page_writes": k.ext_page_writes,
            "ext_bytes_written": k.ext_bytes_written,
            "ext_sequential_write_percent": k.ext_sequential_write_percent,
            "ext_admissions_dropped": k.ext_admissions_dropped,
            "ext_write_mb_s_mean": k.ext_bytes_written as f64 / 1048576.0 / self.seconds,
            "ext_write_mb_s_peak": peak,
        })
    }
}

/// Prints, for each configuration that ran in a memory cgroup (stock SQLite's), the group's
/// limit and what it saw, or that it ran without one.
pub fn print_memory_cgroups(r: &BenchReport) {
    for c in &r.configs {
        let g = &c.details["memory_cgroup"];
        if g.is_null() {
            continue;
        }
        match g["applied"].as_bool() {
            Some(true) => println!(
                "{}'s memory cgroup: limit {} MB, high-water {:.1} MB, limit hit {} times, at the end {:.1} MB page cache + {:.1} MB anonymous",
                c.name,
                g["limit_mb"],
                g["max_usage_mb"].as_f64().unwrap_or(0.0),
                g["failcnt"],
                g["cache_mb"].as_f64().unwrap_or(0.0),
                g["rss_mb"].as_f64().unwrap_or(0.0)
            ),
            _ => println!(
                "{} ran WITHOUT a memory limit: {}",
                c.name,
                g["reason"].as_str().unwrap_or("unknown")
            ),
        }
    }
}
