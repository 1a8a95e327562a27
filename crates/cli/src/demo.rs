//! `sqlite-bpe demo`: the lookup benchmark (`sqlite-bpe bench lookup`) at demo scale.
//!
//! A table of 1000-byte rows, random point lookups, and three configurations, each in a process
//! of its own (as the benchmark runs them: a process's engine is made once):
//! - `ram_resident`: max server memory above the table size, warmed: every page in RAM.
//! - `limited_memory`: max server memory well below the table, no extension: most lookups
//!   read the (slow) database file.
//! - `limited_memory_bpe`: the same memory plus an extension four times the table, warmed by a
//!   full scan: most lookups read the extension on the fast local disk instead.
//!
//! The slow data device of the experiment is emulated in-process (the `BPE_DATA_*` variables), so that the demo needs no SAN and finishes in about a minute. The files go
//! to a temporary directory, removed at the end. [`measure`] is the experiment without printing.

use anyhow::{bail, Context};
use bpe_bench::lookup::{self, Plan};
use bpe_bench::table::{thousands, Table};
use bpe_bench::{BenchReport, ConfigResult, DataDevice, Storage};
use std::path::PathBuf;

const MB: f64 = 1048576.0;

/// The demo's knobs; the defaults ([`Plan::demo`]) finish in about a minute on a 2-core machine.
#[derive(clap::Args, Clone, Debug)]
pub struct DemoOptions {
    /// Rows of 1000 bytes in the table (80,000 make about 80 MB).
    #[arg(long, default_value_t = Plan::demo().rows)]
    pub rows: u64,
    /// Random point lookups per configuration.
    #[arg(long, default_value_t = Plan::demo().lookups)]
    pub lookups: u64,
    /// max server memory (MB) of the limited configurations: keep it well below the table.
    #[arg(long, default_value_t = Plan::demo().memory_mb)]
    pub memory_mb: u64,
    /// Emulated latency of each database-file read, write and sync, in microseconds (0: the
    /// real disk).
    /// 2000 is a SAN-like volume.
    #[arg(long, default_value_t = 2000)]
    pub latency_us: u64,
    /// Emulated IOPS limit of the database file, reads and writes each (0: none).
    #[arg(long, default_value_t = 0)]
    pub iops: u32,
    /// Where to make the temporary work directory: a real disk, not tmpfs, so that O_DIRECT
    /// works and the extension can be created. Default: the current directory.
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// Also write the results as JSON to FILE (as `bench lookup --json` does).
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
}

impl Default for DemoOptions {
    fn default() -> Self {
        let plan = Plan::demo();
        DemoOptions {
            rows: plan.rows,
            lookups: plan.lookups,
            memory_mb: plan.memory_mb,
            latency_us: 2000,
            iops: 0,
            dir: None,
            json: None,
        }
    }
}

impl DemoOptions {
    /// Refuses options the demo cannot run with, before it prints or makes anything.
    pub fn validate(&self) -> anyhow::Result<()> {
        for (flag, value) in [
            ("--rows", self.rows),
            ("--lookups", self.lookups),
            ("--memory-mb", self.memory_mb),
        ] {
            if value == 0 {
                bail!("{flag} 0: the demo needs {flag} above 0");
            }
        }
        let base = self.base_dir();
        if !base.is_dir() {
            bail!("--dir {}: no such directory", base.display());
        }
        let fs = bpe_bench::fs_type(&base.canonicalize()?);
        if fs == "tmpfs" || fs == "ramfs" {
            bail!(
                "--dir {} is on {fs}, where the extension file cannot be read with O_DIRECT and the \
                 database would be read from RAM: give --dir a directory on a disk (the demo makes \
                 its work folder there and removes it at the end)",
                base.display()
            );
        }
        Ok(())
    }

    /// Where the demo makes its work folder.
    fn base_dir(&self) -> PathBuf {
        self.dir.clone().unwrap_or_else(|| PathBuf::from("."))
    }
}

/// What [`measure`] found: the benchmark's report, and where it ran.
#[derive(Clone, Debug)]
pub struct DemoReport {
    pub report: BenchReport,
    /// The temporary directory the files were in (removed by now).
    pub work_dir: PathBuf,
}

/// The extension counters shown for `limited_memory_bpe`: (counter name, its value during the
/// lookups, or None for a gauge, and its value at the end).
fn extension_counters(c: &ConfigResult) -> [(&'static str, Option<u64>, u64); 5] {
    let k = &c.counters;
    let total = |name: &str, during: u64| c.details["cumulative"][name].as_u64().unwrap_or(during);
    [
        (
            "Extension page reads/sec",
            Some(k.ext_page_reads),
            total("ext_page_reads", k.ext_page_reads),
        ),
        (
            "Extension page writes/sec",
            Some(k.ext_page_writes),
            total("ext_page_writes", k.ext_page_writes),
        ),
        ("Extension allocated pages", None, k.ext_allocated_pages),
        (
            "Extension sequential write percentage",
            None,
            k.ext_sequential_write_percent,
        ),
        (
            "Page reads/sec",
            Some(k.page_reads),
            total("page_reads", k.page_reads),
        ),
    ]
}

/// Runs the experiment: [`Plan::demo`] with the options' changes, on the emulated device, in a
/// temporary directory.
pub fn measure(o: &DemoOptions) -> anyhow::Result<DemoReport> {
    o.validate()?;
    let plan = Plan {
        rows: o.rows,
        lookups: o.lookups,
        memory_mb: o.memory_mb,
        ..Plan::demo()
    };
    let device = if o.latency_us == 0 && o.iops == 0 {
        DataDevice::none()
    } else {
        DataDevice::emulated(
            &format!("emulated:{}us", o.latency_us),
            o.latency_us,
            o.iops,
        )
    };
    let base = o.base_dir();
    let work = tempfile::Builder::new()
        .prefix("sqlite-bpe-demo-")
        .tempdir_in(&base)
        .with_context(|| format!("cannot make a work directory in {}", base.display()))?;
    let work_dir = work.path().canonicalize()?;
    let storage = Storage::at(device, &work_dir, &work_dir.join("data"))?;
    let report = lookup::measure(&plan, &storage)?;
    Ok(DemoReport { report, work_dir })
}

impl DemoReport {
    /// Why the figures may not show what the demo is for.
    pub fn warnings(&self) -> Vec<String> {
        let p = &self.report.parameters;
        let mut out = Vec::new();
        let table_mb = p["database_bytes"].as_u64().unwrap_or(0).div_ceil(1 << 20);
        let memory_mb = p["limited_memory_mb"].as_u64().unwrap_or(0);
        if memory_mb >= table_mb {
            out.push(format!(
                "max server memory ({memory_mb} MB) is not below the table ({table_mb} MB): limited_memory is not limited"
            ));
        }
        if self
            .report
            .configs
            .iter()
            .any(|c| c.counters.buffered_data_files > 0)
        {
            out.push(format!(
                "{} does not allow O_DIRECT (tmpfs?): the database was read through the OS page cache; use --dir on a real disk",
                self.work_dir.display()
            ));
        }
        out
    }

    /// The text the demo prints.
    pub fn render(&self) -> String {
        let r = &self.report;
        let p = &r.parameters;
        let mut out = String::new();
        out.push_str(&format!(
            "Table: {} rows of {} bytes, {:.1} MB, in {}\n",
            thousands(p["rows"].as_u64().unwrap_or(0)),
            p["row_bytes"],
            p["database_bytes"].as_u64().unwrap_or(0) as f64 / MB,
            self.work_dir.display()
        ));
        let d = &r.storage.data_device;
        out.push_str(&match d.emulation() {
            Some(e) => format!(
                "Database files: EMULATED slow device, {e} (the BPE_DATA_* variables); \
                 the extension is on the real local disk.\n"
            ),
            None => "Database file reads: the real local disk, no emulated latency.\n".into(),
        });
        for w in self.warnings() {
            out.push_str(&format!("warning: {w}\n"));
        }
        out.push('\n');
        let baseline = r.config("limited_memory").map_or(1.0, |c| c.seconds);
        let mut table = Table::new([
            "config",
            "max memory",
            "extension",
            "seconds",
            "lookups/s",
            "vs limited_memory",
            "file page reads",
            "extension page reads",
        ]);
        for c in &r.configs {
            let seconds = c.seconds.max(1e-9);
            table.push([
                c.name.clone(),
                format!("{} MB", c.counters.max_memory >> 20),
                c.details["extension_mb"]
                    .as_u64()
                    .map_or("off".into(), |mb| format!("{mb} MB")),
                format!("{:.3}", c.seconds),
                thousands((c.operations as f64 / seconds).round() as u64),
                format!("{:.1}x", baseline / seconds),
                c.counters.page_reads.to_string(),
                c.counters.ext_page_reads.to_string(),
            ]);
        }
        out.push_str(&table.render());
        if let Some(bpe) = r.config("limited_memory_bpe") {
            out.push_str("\nExtension counters (limited_memory_bpe; \"/sec\" counters are cumulative, as in SQL Server):\n");
            let mut counters = Table::new(["counter_name", "during lookups", "cntr_value"]);
            for (name, during, total) in extension_counters(bpe) {
                counters.push([
                    name.to_string(),
                    during.map_or("-".into(), |n| n.to_string()),
                    total.to_string(),
                ]);
            }
            out.push_str(&counters.render());
        }
        out
    }
}

/// `sqlite-bpe demo`: measures and prints.
pub fn run(o: &DemoOptions) -> anyhow::Result<()> {
    o.validate()?;
    eprintln!(
        "sqlite-bpe demo: {} random lookups in {} rows, three configurations{}",
        thousands(o.lookups),
        thousands(o.rows),
        if o.latency_us > 0 {
            format!(
                ", database I/O delayed {} us per request (emulated)",
                o.latency_us
            )
        } else {
            String::new()
        }
    );
    let demo = measure(o)?;
    print!("{}", demo.render());
    if let Some(path) = &o.json {
        demo.report.write_json(path)?;
    }
    Ok(())
}
