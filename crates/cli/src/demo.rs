//! `sqlite-bpe demo`: a small version of the published lookup experiment.
//!
//! A table of 1000-byte rows, random point lookups, and three configurations on one engine:
//! - `ram_resident`: max server memory above the table size, warmed: every page in RAM.
//! - `limited_memory`: max server memory well below the table, no extension: most lookups
//!   read the (slow) database file.
//! - `limited_memory_bpe`: the same memory plus an extension four times the table, warmed by a
//!   full scan: most lookups read the extension on the fast local disk instead.
//!
//! The slow data device of the experiment is emulated in-process (the adapter reads
//! `BPE_DATA_LATENCY_US` / `BPE_DATA_IOPS` when it creates the engine), so that the demo needs
//! no SAN and finishes in about a minute. [`measure`] is the experiment without printing.

use crate::report::{thousands, Table};
use anyhow::{bail, Context};
use indicatif::{ProgressBar, ProgressStyle};
use rand::{rngs::StdRng, Rng, SeedableRng};
use rusqlite::Connection;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const MB: u64 = 1 << 20;
const ROW_BYTES: usize = 1000;
const LOAD_CHUNK_ROWS: u64 = 5000;
/// SQLite's own page cache per connection, KiB: a few pages, so that lookups reach the buffer
/// pool under test instead of being answered by SQLite's pager (SQL Server has nothing above
/// its buffer pool, and the experiment measures the pool).
const PAGER_CACHE_KIB: u32 = 64;

/// The demo's knobs; the defaults finish in about a minute on a 2-core machine.
#[derive(clap::Args, Clone, Debug)]
pub struct DemoOptions {
    /// Rows of 1000 bytes in TestTable (80,000 make about 80 MB).
    #[arg(long, default_value_t = 80_000)]
    pub rows: u64,
    /// Random point lookups per configuration.
    #[arg(long, default_value_t = 10_000)]
    pub lookups: u64,
    /// max server memory (MB) of the limited configurations: keep it well below the table.
    #[arg(long, default_value_t = 16)]
    pub memory_mb: u64,
    /// Emulated latency of each database-file read, in microseconds (0: the real disk).
    /// 2000 is a SAN-like volume.
    #[arg(long, default_value_t = 2000)]
    pub latency_us: u64,
    /// Emulated IOPS limit of the database file (0: none).
    #[arg(long, default_value_t = 0)]
    pub iops: u32,
    /// Where to make the temporary work directory: a real disk, not tmpfs, so that O_DIRECT
    /// works and the extension can be created. Default: the current directory.
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// Seed of the random lookups (every configuration looks up the same rows).
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// No progress bars.
    #[arg(long)]
    pub quiet: bool,
}

impl Default for DemoOptions {
    fn default() -> Self {
        DemoOptions {
            rows: 80_000,
            lookups: 10_000,
            memory_mb: 16,
            latency_us: 2000,
            iops: 0,
            dir: None,
            seed: 42,
            quiet: false,
        }
    }
}

/// One configuration's measurement. Counter values are differences over the lookups.
#[derive(Clone, Debug)]
pub struct ConfigResult {
    pub name: &'static str,
    pub max_memory_mb: u64,
    pub extension_mb: Option<u64>,
    pub seconds: f64,
    pub lookups: u64,
    /// Pages read from the database file during the lookups.
    pub data_page_reads: i64,
    /// Pages read from the extension during the lookups.
    pub extension_page_reads: i64,
}

impl ConfigResult {
    pub fn lookups_per_second(&self) -> f64 {
        self.lookups as f64 / self.seconds.max(1e-9)
    }
}

/// What [`measure`] found.
#[derive(Clone, Debug)]
pub struct DemoReport {
    pub rows: u64,
    pub table_bytes: u64,
    /// The data-device emulation the engine runs with, as (latency, IOPS limit).
    pub emulation: Option<(Duration, u32)>,
    pub work_dir: PathBuf,
    pub results: Vec<ConfigResult>,
    /// Extension counters after the `limited_memory_bpe` lookups: (name, during the lookups,
    /// value at the end). "/sec" counters are cumulative, as in SQL Server.
    pub extension_counters: Vec<(String, i64, i64)>,
    pub warnings: Vec<String>,
}

const SHOWN_COUNTERS: [&str; 5] = [
    "Extension page reads/sec",
    "Extension page writes/sec",
    "Extension allocated pages",
    "Extension sequential write percentage",
    "Page reads/sec",
];

/// Runs the experiment: loads the table, then measures each configuration.
pub fn measure(o: &DemoOptions) -> anyhow::Result<DemoReport> {
    if o.rows == 0 || o.lookups == 0 || o.memory_mb == 0 {
        bail!("--rows, --lookups and --memory-mb must be above 0");
    }
    let mut warnings = Vec::new();
    request_emulation(o, &mut warnings);

    let base = o.dir.clone().unwrap_or_else(|| PathBuf::from("."));
    let work = tempfile::Builder::new()
        .prefix("sqlite-bpe-demo-")
        .tempdir_in(&base)
        .with_context(|| format!("cannot make a work directory in {}", base.display()))?;
    let work_dir = work.path().canonicalize()?;
    let db = work_dir.join("demo.db");
    load(&db, o)?;

    let conn = crate::open(db.to_str().context("the work directory is not UTF-8")?)?;
    conn.execute_batch(&format!(
        "PRAGMA cache_size = -{PAGER_CACHE_KIB}; PRAGMA mmap_size = 0;"
    ))?;
    let table_bytes: u64 = conn.query_row(
        "SELECT page_count * page_size FROM pragma_page_count, pragma_page_size",
        [],
        |r| r.get(0),
    )?;
    let table_mb = table_bytes.div_ceil(MB);
    if o.memory_mb >= table_mb {
        warnings.push(format!(
            "max server memory ({} MB) is not below the table ({table_mb} MB): limited_memory is not limited",
            o.memory_mb
        ));
    }
    // What the engine really runs with (the adapter's engine is the process-wide one); the
    // request only if the adapter keeps its engine elsewhere.
    let emulation = match sqlite_bpe::existing_engine() {
        Some(engine) => engine.config().data_device.map(|d| (d.latency, d.iops)),
        None => Some((Duration::from_micros(o.latency_us), o.iops)),
    }
    .filter(|&(latency, iops)| !latency.is_zero() || iops > 0);
    let buffered = read_counters(&conn)?
        .get("Data files without O_DIRECT")
        .copied();
    if buffered.is_some_and(|n| n > 0) {
        warnings.push(format!(
            "{} does not allow O_DIRECT (tmpfs?): the database is read through the OS page cache; use --dir on a real disk",
            work_dir.display()
        ));
    }

    let mut rng = StdRng::seed_from_u64(o.seed);
    let ids: Vec<i64> = (0..o.lookups)
        .map(|_| rng.gen_range(1..=o.rows as i64))
        .collect();
    let ram_mb = table_mb * 2 + 16;
    let extension_mb = (table_mb * 4).max(o.memory_mb * 2).max(2);
    let extension = work_dir.join("demo.bpe");
    let runs: [(&'static str, u64, Option<u64>); 3] = [
        ("ram_resident", ram_mb, None),
        ("limited_memory", o.memory_mb, None),
        ("limited_memory_bpe", o.memory_mb, Some(extension_mb)),
    ];
    let mut results = Vec::new();
    let mut extension_counters = Vec::new();
    for (name, memory_mb, ext_mb) in runs {
        let before = prepare(
            &conn,
            name,
            memory_mb,
            ext_mb.map(|mb| (&*extension, mb)),
            o,
        )?;
        let seconds = lookups(&conn, name, &ids, o)?;
        let after = read_counters(&conn)?;
        let delta =
            |c: &str| after.get(c).copied().unwrap_or(0) - before.get(c).copied().unwrap_or(0);
        if ext_mb.is_some() {
            extension_counters = SHOWN_COUNTERS
                .iter()
                .map(|c| (c.to_string(), delta(c), after.get(*c).copied().unwrap_or(0)))
                .collect();
        }
        results.push(ConfigResult {
            name,
            max_memory_mb: memory_mb,
            extension_mb: ext_mb,
            seconds,
            lookups: o.lookups,
            data_page_reads: delta("Page reads/sec"),
            extension_page_reads: delta("Extension page reads/sec"),
        });
    }
    crate::bpe_exec(
        &conn,
        "ALTER SERVER CONFIGURATION SET BUFFER POOL EXTENSION OFF",
    )?;
    drop(conn);
    Ok(DemoReport {
        rows: o.rows,
        table_bytes,
        emulation,
        work_dir,
        results,
        extension_counters,
        warnings,
    })
}

/// Asks the adapter for the emulated data device. It reads the variables when it creates the
/// engine, which has to happen after this (once per process).
fn request_emulation(o: &DemoOptions, warnings: &mut Vec<String>) {
    if sqlite_bpe::existing_engine().is_some() {
        warnings.push(
            "the engine already existed in this process: it keeps the data-device emulation it was created with"
                .into(),
        );
        return;
    }
    // Set before any other thread exists (this runs first), so nothing reads them concurrently.
    if o.latency_us == 0 && o.iops == 0 {
        std::env::remove_var("BPE_DATA_LATENCY_US");
        std::env::remove_var("BPE_DATA_IOPS");
    } else {
        std::env::set_var("BPE_DATA_LATENCY_US", o.latency_us.to_string());
        std::env::set_var("BPE_DATA_IOPS", o.iops.to_string());
    }
}

/// Creates TestTable with SQLite's default VFS (loading is not what the demo measures).
fn load(db: &Path, o: &DemoOptions) -> anyhow::Result<()> {
    let conn = Connection::open(db)?;
    conn.execute_batch(
        "PRAGMA page_size = 4096; PRAGMA journal_mode = WAL; PRAGMA synchronous = OFF;
         CREATE TABLE TestTable(id INTEGER PRIMARY KEY, n TEXT);",
    )?;
    let bar = progress(o, o.rows, "loading TestTable");
    let mut insert = conn.prepare(&format!(
        "WITH RECURSIVE k(id) AS (SELECT ?1 UNION ALL SELECT id + 1 FROM k WHERE id < ?2)
         INSERT INTO TestTable(id, n) SELECT id, hex(randomblob({})) FROM k",
        ROW_BYTES / 2
    ))?;
    let mut first = 1;
    while first <= o.rows {
        let last = (first + LOAD_CHUNK_ROWS - 1).min(o.rows);
        insert.execute([first, last])?;
        bar.inc(last - first + 1);
        first = last + 1;
    }
    drop(insert);
    // Everything into the database file, so every configuration starts from the same file.
    conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))?;
    bar.finish_and_clear();
    Ok(())
}

/// Sets memory and extension for a configuration, empties the pool and warms it with a full
/// scan. Returns the counters before the lookups.
fn prepare(
    conn: &Connection,
    name: &str,
    memory_mb: u64,
    extension: Option<(&Path, u64)>,
    o: &DemoOptions,
) -> anyhow::Result<HashMap<String, i64>> {
    crate::bpe_exec(
        conn,
        &format!("EXEC sp_configure 'max server memory (MB)', {memory_mb}; RECONFIGURE"),
    )?;
    let alter = "ALTER SERVER CONFIGURATION SET BUFFER POOL EXTENSION";
    match extension {
        Some((path, mb)) => crate::bpe_exec(
            conn,
            &format!(
                "{alter} ON (FILENAME = '{}', SIZE = {mb} MB)",
                path.display().to_string().replace('\'', "''")
            ),
        )?,
        None => crate::bpe_exec(conn, &format!("{alter} OFF"))?,
    };
    crate::bpe_exec(conn, "DBCC DROPCLEANBUFFERS")?;
    let bar = spinner(o, &format!("{name}: warming with a full scan"));
    conn.query_row("SELECT sum(length(n)) FROM TestTable", [], |_| Ok(()))?;
    if extension.is_some() {
        // Pages the scan pushed out of RAM are still on their way to the extension.
        if let Some(engine) = sqlite_bpe::existing_engine() {
            engine.wait_for_extension_writes(Duration::from_secs(60));
        }
    }
    bar.finish_and_clear();
    Ok(read_counters(conn)?)
}

/// Times the lookups; returns seconds.
fn lookups(conn: &Connection, name: &str, ids: &[i64], o: &DemoOptions) -> anyhow::Result<f64> {
    let mut select = conn.prepare("SELECT n FROM TestTable WHERE id = ?1")?;
    let bar = progress(o, ids.len() as u64, &format!("{name}: lookups"));
    let start = Instant::now();
    for (i, id) in ids.iter().enumerate() {
        let n: String = select.query_row([id], |r| r.get(0))?;
        if n.len() != ROW_BYTES {
            bail!("row {id} has {} bytes, not {ROW_BYTES}", n.len());
        }
        if i % 64 == 0 {
            bar.set_position(i as u64);
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    bar.finish_and_clear();
    Ok(seconds)
}

/// sys.dm_os_performance_counters, by name.
fn read_counters(conn: &Connection) -> rusqlite::Result<HashMap<String, i64>> {
    let mut q = conn.prepare("SELECT counter_name, cntr_value FROM bpe_performance_counters")?;
    let rows = q.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))?;
    rows.map(|r| r.map(|(name, value)| (name.trim().to_string(), value)))
        .collect()
}

fn progress(o: &DemoOptions, len: u64, message: &str) -> ProgressBar {
    if o.quiet {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(len).with_message(message.to_string());
    if let Ok(style) = ProgressStyle::with_template("{msg:34} {bar:30} {pos}/{len} ({eta})") {
        bar.set_style(style);
    }
    bar
}

fn spinner(o: &DemoOptions, message: &str) -> ProgressBar {
    if o.quiet {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new_spinner().with_message(message.to_string());
    bar.enable_steady_tick(Duration::from_millis(100));
    bar
}

impl DemoReport {
    /// The text the demo prints.
    pub fn render(&self) -> String {
        let mut out = String::new();
        out.push_str(&format!(
            "TestTable: {} rows of {ROW_BYTES} bytes, {:.1} MB, in {}\n",
            thousands(self.rows),
            self.table_bytes as f64 / MB as f64,
            self.work_dir.display()
        ));
        out.push_str(&match self.emulation {
            Some((latency, iops)) => format!(
                "Database file reads: EMULATED slow device, {} us per read{} \
                 (BPE_DATA_LATENCY_US / BPE_DATA_IOPS); the extension is on the real local disk.\n",
                latency.as_micros(),
                if iops > 0 {
                    format!(", at most {iops} IOPS")
                } else {
                    String::new()
                }
            ),
            None => "Database file reads: the real local disk, no emulated latency.\n".into(),
        });
        for w in &self.warnings {
            out.push_str(&format!("warning: {w}\n"));
        }
        out.push('\n');
        let baseline = self
            .results
            .iter()
            .find(|r| r.name == "limited_memory")
            .map_or(1.0, |r| r.seconds);
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
        for r in &self.results {
            table.push([
                r.name.to_string(),
                format!("{} MB", r.max_memory_mb),
                r.extension_mb.map_or("off".into(), |mb| format!("{mb} MB")),
                format!("{:.3}", r.seconds),
                thousands(r.lookups_per_second().round() as u64),
                format!("{:.1}x", baseline / r.seconds.max(1e-9)),
                r.data_page_reads.to_string(),
                r.extension_page_reads.to_string(),
            ]);
        }
        out.push_str(&table.render());
        out.push_str("\nExtension counters (limited_memory_bpe; \"/sec\" counters are cumulative, as in SQL Server):\n");
        let mut counters = Table::new(["counter_name", "during lookups", "cntr_value"]);
        for (name, during, total) in &self.extension_counters {
            let during = if name.ends_with("/sec") {
                during.to_string()
            } else {
                "-".into()
            };
            counters.push([name.clone(), during, total.to_string()]);
        }
        out.push_str(&counters.render());
        out
    }
}

/// `sqlite-bpe demo`: measures and prints.
pub fn run(o: &DemoOptions) -> anyhow::Result<()> {
    eprintln!(
        "sqlite-bpe demo: {} random lookups in {} rows, three configurations{}",
        thousands(o.lookups),
        thousands(o.rows),
        if o.latency_us > 0 {
            format!(
                ", database reads delayed {} us each (emulated)",
                o.latency_us
            )
        } else {
            String::new()
        }
    );
    let report = measure(o)?;
    print!("{}", report.render());
    Ok(())
}
