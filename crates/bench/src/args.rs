//! Command-line arguments: `sqlite-bpe bench <lookup|scan|oltp|dw|autocommit> [options]`.

use std::path::PathBuf;

/// Benchmarks after the published SQL Server BPE experiments.
#[derive(clap::Args, Debug, Clone)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub experiment: Experiment,
}

#[derive(clap::Subcommand, Debug, Clone)]
pub enum Experiment {
    /// 10,000 random point selects on 1,000,000 rows of 1000 bytes: the seed's five
    /// configurations, an extension of half the database (limited_memory_bpe_half_ext), Zipfian
    /// lookups (limited_memory_bpe_zipf), and on a real device (slowvol:..., real) stock SQLite
    /// beside them (stock_ram_resident, stock_limited_memory, stock_limited_memory_zipf).
    Lookup(LookupArgs),
    /// SELECT AVG(ActualCost) over a ~1 GB transaction history: cold, warm, 256 MB, extension;
    /// on a real device (slowvol:..., real) also stock SQLite (stock_cold, stock_warm,
    /// stock_limited_memory).
    Scan(ScanArgs),
    /// TPC-C-like OLTP: memory at 100 % and 25 % of the database, extension on (2x or 0.5x the
    /// database) and off, writers queued or left to SQLite's locking, and stock SQLite beside
    /// them on a real device.
    Oltp(OltpArgs),
    /// TPC-H's 22 queries at a scale exceeding memory, extension on and off; on a real device
    /// also stock SQLite, and both with the whole database in memory.
    Dw(DwArgs),
    /// The cost of a read transaction: autocommit point lookups against lookups in one
    /// transaction, rollback journal and WAL, bpe and stock SQLite, alone and beside a plain
    /// SQLite writer process; and both with SQLite's default page cache (`*_defaults`), and a
    /// connection per lookup (`*_per_connection`, on 4 threads in `*_per_connection_threads`;
    /// bpe's SQL functions only on connections that ask in `*_per_connection_sql_on_demand`).
    Autocommit(AutocommitArgs),
    /// Four worker processes running the lookup workload on one database: one shared extension
    /// (the default) against an extension each (BPE_EXTENSION_SHARED=0), and stock SQLite on a real device.
    /// The first worker warms up with a full scan; then the others start.
    Workers(WorkersArgs),
    /// Draws the plot of a saved --json result again.
    Plot(PlotArgs),
}

#[derive(clap::Args, Debug, Clone)]
pub struct PlotArgs {
    /// A result written by --json.
    pub json: PathBuf,
    /// The picture to write (.png or .svg).
    pub out: PathBuf,
}

/// Options every benchmark takes.
#[derive(clap::Args, Debug, Clone)]
pub struct CommonArgs {
    /// Data device, emulated in-process (every read, write and sync of the database's files
    /// is charged latency + size / bandwidth, under an IOPS cap): `emulated:hdd` (8 ms per
    /// read, write and sync, 150 MB/s, 150 IOPS), `emulated:san` (1 ms, 400 MB/s),
    /// `emulated:gp3` (1 ms, 125 MB/s, 3000 IOPS), `emulated:ssd` (100 µs, 1 ms per sync,
    /// 500 MB/s), `emulated:2ms`, `emulated:500us`, `emulated:8ms:150:150` (latency, optional
    /// IOPS cap, optional MB/s); `real` (no emulation: whatever device --data-dir is on); or a
    /// kernel-throttled slow volume the benchmark makes, uses and removes (needs root, loop
    /// devices and cgroup v1 blkio): `slowvol:hdd` (150 IOPS, 200 MiB/s, reads and writes
    /// each), `slowvol:gp3` (3000, 125 MiB/s, reads and writes each), `slowvol:<IOPS>`,
    /// `slowvol:<IOPS>:<MiB/s>` (reads only); any of them with `+<N>ms` or `+<N>us`
    /// (`slowvol:gp3+1ms`, a network volume: each request held that long, through FUSE, which
    /// the throttle alone never adds below its cap). Default: emulated:hdd (autocommit:
    /// emulated:2ms), or real when --data-dir is given.
    #[arg(long, value_name = "DEVICE")]
    pub data_device: Option<String>,
    /// Leave the slow volume (`--data-device slowvol:...`) mounted after the run, with its
    /// databases: a later run with the same IOPS reuses it instead of loading again.
    #[arg(long)]
    pub keep_volume: bool,
    /// Directory for the database files (e.g. a slow volume). Default: under --ext-dir.
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// Directory on the fast local disk for extension files and the physical reference
    /// (never /tmp, which may be tmpfs). Default: ./bpe-bench-work.
    #[arg(long, value_name = "DIR")]
    pub ext_dir: Option<PathBuf>,
    /// Small scale, under a minute per benchmark.
    #[arg(long)]
    pub quick: bool,
    /// Write the results as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Draw the results to FILE (.png or .svg).
    #[arg(long, value_name = "FILE")]
    pub plot: Option<PathBuf>,
    /// Run only these configurations (comma-separated names).
    #[arg(long, value_delimiter = ',', value_name = "NAMES")]
    pub configs: Option<Vec<String>>,
    /// Load the data again even if a matching database exists.
    #[arg(long)]
    pub reload: bool,
    /// Size in MiB of the physical reference's scratch file (default 1024, 256 with --quick;
    /// 0 skips the reference).
    #[arg(long, value_name = "MIB")]
    pub reference_mib: Option<u64>,
    /// Counter sampling interval.
    #[arg(long, default_value_t = 250, value_name = "MS")]
    pub sample_ms: u64,
}

#[derive(clap::Args, Debug, Clone)]
pub struct LookupArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// Rows in the table (default 1,000,000; 40,000 with --quick).
    #[arg(long)]
    pub rows: Option<u64>,
    /// Random point selects per configuration (default 10,000; 2,000 with --quick).
    #[arg(long)]
    pub lookups: Option<u64>,
    /// Limited `max server memory` in MB (default 256; 16 with --quick).
    #[arg(long)]
    pub memory_mb: Option<u64>,
    /// Extension size in MB (default 4096; 256 with --quick).
    #[arg(long)]
    pub extension_mb: Option<u64>,
    /// Journal mode of the timed runs.
    #[arg(long, value_enum, default_value_t = crate::db::Journal::Wal)]
    pub journal: crate::db::Journal,
    /// Memory limit in MB of the cgroup (v1 memory controller) that `stock_limited_memory` and
    /// `stock_limited_memory_zipf` run in: SQLite's page cache of --memory-mb, the process and
    /// the OS page cache of the data file together (default 2 x --memory-mb +
    /// 16: the OS page cache held to the page cache's budget; stock_ram_resident's is the same
    /// rule on its memory).
    #[arg(long, value_name = "MB")]
    pub cgroup_mb: Option<u64>,
}

#[derive(clap::Args, Debug, Clone)]
pub struct WorkersArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// Rows in the lookup table (default 1,000,000; 40,000 with --quick).
    #[arg(long)]
    pub rows: Option<u64>,
    /// Random point selects per worker (default 10,000; 2,000 with --quick).
    #[arg(long)]
    pub lookups: Option<u64>,
    /// `max server memory` in MB of each worker (default 256; 16 with --quick).
    #[arg(long)]
    pub memory_mb: Option<u64>,
    /// Extension size in MB: the shared one, and each private one (default twice the database).
    #[arg(long)]
    pub extension_mb: Option<u64>,
    /// Worker processes.
    #[arg(long, default_value_t = 4)]
    pub workers: usize,
}

#[derive(clap::Args, Debug, Clone)]
pub struct AutocommitArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// Rows of 1000 bytes in the table (default 20,000; 4,000 with --quick).
    #[arg(long)]
    pub rows: Option<u64>,
    /// `max server memory` in MB for bpe and SQLite's page cache for stock SQLite (default:
    /// enough for the whole database); the `*_defaults` pair keeps SQLite's default page cache
    /// on both sides, and stock's memory is then the OS page cache.
    #[arg(long)]
    pub memory_mb: Option<u64>,
    /// Seconds each configuration reads (default 5; 1 with --quick).
    #[arg(long)]
    pub seconds: Option<f64>,
    /// The plain SQLite writer beside the reader commits one updated row every MS.
    #[arg(long, default_value_t = 10, value_name = "MS")]
    pub writer_interval_ms: u64,
}

#[derive(clap::Args, Debug, Clone)]
pub struct ScanArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// Table size in MB (default 1024; 64 with --quick).
    #[arg(long)]
    pub table_mb: Option<u64>,
    /// Limited `max server memory` in MB (default 256; 16 with --quick).
    #[arg(long)]
    pub memory_mb: Option<u64>,
    /// Extension size in MB (default 4096; 256 with --quick).
    #[arg(long)]
    pub extension_mb: Option<u64>,
    /// Memory limit in MB of the cgroup (v1 memory controller) that `stock_limited_memory` runs
    /// in: SQLite's page cache of --memory-mb, the process and the OS page cache of the data
    /// file together (default 2 x --memory-mb + 16: the OS page cache held to the page
    /// cache's budget; stock_cold's and stock_warm's are the same rule on their memory).
    #[arg(long, value_name = "MB")]
    pub cgroup_mb: Option<u64>,
}

#[derive(clap::Args, Debug, Clone)]
pub struct OltpArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// Warehouses (default 10; 1 with --quick).
    #[arg(long)]
    pub warehouses: Option<u32>,
    /// Seconds each configuration runs (default 120; 4 with --quick).
    #[arg(long)]
    pub seconds: Option<u64>,
    /// Concurrent terminals (connections), each running the transaction mix.
    #[arg(long, default_value_t = 4)]
    pub terminals: u32,
    /// Journal mode of every configuration. With `delete` (the rollback journal) there is no
    /// WAL to checkpoint: the writers' queue is only the queue.
    #[arg(long, value_enum, default_value_t = crate::db::Journal::Wal)]
    pub journal: crate::db::Journal,
    /// `PRAGMA synchronous` of every terminal, stock and bpe alike: `full` (SQLite's default:
    /// a WAL commit waits for its `fsync`) or `normal` (SQLite's advice for WAL: commits do not
    /// sync, checkpoints do; a power cut may lose the last commits, never consistency).
    #[arg(long, value_enum, default_value_t = crate::db::Synchronous::Full)]
    pub synchronous: crate::db::Synchronous,
    /// Items in the catalogue (the specification's 100,000; smaller with --quick).
    #[arg(long)]
    pub items: Option<u32>,
    /// Memory limit in MB of the cgroup (v1 memory controller) each stock_* configuration runs
    /// in: SQLite's page cache, the process and the OS page cache of the database and its WAL
    /// together (default 2 x the configuration's memory + 16: the OS page cache held to the
    /// page cache's budget).
    #[arg(long, value_name = "MB")]
    pub cgroup_mb: Option<u64>,
}

#[derive(clap::Args, Debug, Clone)]
pub struct DwArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// TPC-H scale factor (default 0.1, a 133 MB database; 0.02 with --quick). Answers are
    /// checked against the published ones at 1.
    #[arg(long)]
    pub scale: Option<f64>,
    /// Memory as a percentage of the database size (default 25).
    #[arg(long, default_value_t = 25)]
    pub memory_percent: u64,
    /// Only these queries (comma-separated numbers 1-22).
    #[arg(long, value_delimiter = ',')]
    pub queries: Option<Vec<u32>>,
    /// Memory limit in MB of the cgroup (v1 memory controller) each stock_* configuration runs
    /// in: SQLite's page cache, the process and the OS page cache of the database together
    /// (default 2 x the configuration's memory + 16: the OS page cache held to the page
    /// cache's budget).
    #[arg(long, value_name = "MB")]
    pub cgroup_mb: Option<u64>,
}

/// Refuses a `--configs` list that names a configuration `bench` does not have (instead of
/// running none of it), naming the unknown ones and the valid ones.
pub fn check_configs(
    filter: Option<&[String]>,
    valid: impl IntoIterator<Item = &'static str>,
    bench: &str,
) -> anyhow::Result<()> {
    let valid: Vec<&str> = valid.into_iter().collect();
    let Some(filter) = filter else {
        return Ok(());
    };
    let unknown: Vec<&str> = filter
        .iter()
        .map(String::as_str)
        .filter(|n| !valid.contains(n))
        .collect();
    if filter.is_empty() || !unknown.is_empty() {
        anyhow::bail!(
            "--configs: {} has no configuration {}; its configurations: {}",
            bench,
            if unknown.is_empty() {
                "'' (the list is empty)".to_string()
            } else {
                unknown
                    .iter()
                    .map(|n| format!("'{n}'"))
                    .collect::<Vec<_>>()
                    .join(", ")
            },
            valid.join(", ")
        );
    }
    Ok(())
}

/// Whether `--configs` asks for configuration `name` (all when it is absent).
pub fn selected(filter: Option<&[String]>, name: &str) -> bool {
    filter.is_none_or(|f| f.iter().any(|n| n == name))
}
