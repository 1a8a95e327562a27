//! Connections through the `bpe` VFS, the operator's statements, and the engine's counters.
//!
//! Every connection keeps SQLite's own page cache small (`PRAGMA cache_size`), so that repeated
//! page reads reach the buffer pool under test instead of being answered by the pager of one
//! connection: SQL Server has one buffer pool and nothing above it, and the experiments measure it.

use bpe_core::{CounterSnapshot, Engine};
use rusqlite::{Connection, OpenFlags};
use serde::{Deserialize, Serialize};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// SQLite's page cache per connection, KiB (negative cache_size): 64 pages of 4 KiB.
pub const PAGER_CACHE_KIB: i64 = 256;

/// The VFS the benchmarks run on.
pub const VFS: &str = sqlite_bpe::VFS_NAME;

/// Registers the adapter (once per process). Its engine is created now, from the environment
/// the parent gave this process.
fn register() -> anyhow::Result<()> {
    sqlite_bpe::register().map_err(|e| anyhow::anyhow!("cannot register the bpe VFS: {e}"))
}

/// The journal mode of a timed run (`--journal`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Journal {
    /// Write-ahead log.
    Wal,
    /// Rollback journal (SQLite's default).
    Delete,
}

impl Journal {
    pub fn pragma(self) -> &'static str {
        match self {
            Journal::Wal => "WAL",
            Journal::Delete => "DELETE",
        }
    }

    /// As the results name it: `wal` or `rollback`.
    pub fn label(self) -> &'static str {
        match self {
            Journal::Wal => "wal",
            Journal::Delete => "rollback",
        }
    }
}

/// `PRAGMA synchronous` of a timed run (`--synchronous`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Synchronous {
    /// Every commit syncs (SQLite's default).
    Full,
    /// In WAL mode commits do not sync, checkpoints do; in rollback mode one sync fewer.
    Normal,
}

impl Synchronous {
    pub fn pragma(self) -> &'static str {
        match self {
            Synchronous::Full => "FULL",
            Synchronous::Normal => "NORMAL",
        }
    }
}

/// Which SQLite a timed run goes through.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Sqlite {
    /// The bpe VFS, SQLite's own page cache kept at [`PAGER_CACHE_KIB`].
    Bpe,
    /// Stock SQLite: the unix VFS, its page cache given the memory budget (`cache_kib`), the
    /// OS page cache under it.
    Stock { cache_kib: u64 },
}

impl Sqlite {
    /// The VFS's name.
    pub fn vfs(self) -> &'static str {
        match self {
            Sqlite::Bpe => VFS,
            Sqlite::Stock { .. } => "unix",
        }
    }
}

/// Opens `path` for a benchmark run through `sqlite` in `journal` mode.
pub fn open_with(path: &Path, sqlite: Sqlite, journal: Journal) -> anyhow::Result<Connection> {
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
        | OpenFlags::SQLITE_OPEN_CREATE
        | OpenFlags::SQLITE_OPEN_NO_MUTEX
        | OpenFlags::SQLITE_OPEN_URI;
    let (conn, cache_kib) = match sqlite {
        Sqlite::Bpe => {
            register()?;
            let conn = Connection::open_with_flags_and_vfs(path, flags, VFS)?;
            // The run's own connection asks for bpe's SQL functions (`bpe_exec`...), which a
            // process with `BPE_SQL_SURFACE=on-demand` gives no connection unasked.
            // SAFETY: the connection was just opened on the linked SQLite, by this thread.
            unsafe { sqlite_bpe::register_sql(conn.handle()) }
                .map_err(|e| anyhow::anyhow!("cannot install bpe's SQL functions: {e}"))?;
            (conn, bpe_pager_cache_kib()?)
        }
        Sqlite::Stock { cache_kib } => {
            (Connection::open_with_flags(path, flags)?, cache_kib as i64)
        }
    };
    conn.busy_timeout(Duration::from_secs(60))?;
    let mmap = match sqlite {
        Sqlite::Bpe => bpe_mmap_size()?,
        Sqlite::Stock { .. } => 0,
    };
    conn.execute_batch(&format!(
        "PRAGMA journal_mode = {}; PRAGMA cache_size = -{cache_kib}; PRAGMA mmap_size = {mmap};",
        journal.pragma()
    ))?;
    Ok(conn)
}

/// Opens `path` as an application opening a connection for one request does: through `sqlite`'s
/// VFS, SQLite's defaults (its page cache, the file's journal mode), nothing set.
pub fn open_for_request(path: &Path, sqlite: Sqlite) -> anyhow::Result<Connection> {
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
        | OpenFlags::SQLITE_OPEN_NO_MUTEX
        | OpenFlags::SQLITE_OPEN_URI;
    let conn = Connection::open_with_flags_and_vfs(path, flags, sqlite.vfs())?;
    conn.busy_timeout(Duration::from_secs(60))?;
    Ok(conn)
}

/// The environment variable that gives bpe connections SQLite's memory-mapped reads, which
/// bpe serves in place from L1 (`xFetch`): `PRAGMA mmap_size` in bytes, 0 (the default) for
/// none. Stock SQLite's arms never map the file: their memory is the page cache they are given.
pub const MMAP_SIZE_VAR: &str = "BPE_BENCH_MMAP_SIZE";

/// The environment variable that sets bpe connections' own SQLite page cache, KiB (default
/// [`PAGER_CACHE_KIB`]). An experiment, not a same-memory arm: with it SQLite's cache holds
/// pages beside L1's copies of them, so it bounds what a single copy (L1 as SQLite's page
/// cache) could gain (docs/BENCHMARKS.md, "The copy out of L1, bounded").
pub const PAGER_CACHE_VAR: &str = "BPE_BENCH_PAGER_CACHE_KIB";

/// [`MMAP_SIZE_VAR`]'s value, or an error naming it when it is not a byte count.
fn bpe_mmap_size() -> anyhow::Result<u64> {
    env_count(MMAP_SIZE_VAR, 0, "a size in bytes (0 for none)")
}

/// [`PAGER_CACHE_VAR`]'s value, or an error naming it when it is not a positive KiB count.
pub fn bpe_pager_cache_kib() -> anyhow::Result<i64> {
    let expected = "a size in KiB above 0";
    let kib = env_count(PAGER_CACHE_VAR, PAGER_CACHE_KIB as u64, expected)?;
    // 0 would be SQLite's "no limit given", and a KiB count past i64 a negative cache_size.
    i64::try_from(kib)
        .ok()
        .filter(|k| *k > 0)
        .ok_or_else(|| anyhow::anyhow!("{PAGER_CACHE_VAR}={kib}: expected {expected}"))
}

/// A count from the environment variable `var`, `default` when it is not set; an error naming
/// the variable and what it expects (`expected`) otherwise.
fn env_count(var: &str, default: u64, expected: &str) -> anyhow::Result<u64> {
    match std::env::var(var) {
        Err(std::env::VarError::NotPresent) => Ok(default),
        Ok(v) => v
            .trim()
            .parse()
            .map_err(|_| anyhow::anyhow!("{var}={v:?}: expected {expected}")),
        Err(e) => anyhow::bail!("{var}: {e}"),
    }
}

/// Opens `path` with SQLite's default VFS, for loading (not timed).
pub fn open_for_load(path: &Path) -> anyhow::Result<Connection> {
    let conn = Connection::open(path)?;
    conn.execute_batch(
        "PRAGMA journal_mode = WAL; PRAGMA synchronous = OFF; PRAGMA cache_size = -262144;",
    )?;
    Ok(conn)
}

/// Runs an operator statement in SQL Server syntax through the adapter's `bpe_exec`.
pub fn bpe_exec(conn: &Connection, stmt: &str) -> anyhow::Result<()> {
    let mut q = conn.prepare("SELECT bpe_exec(?1)")?;
    let mut rows = q.query([stmt])?;
    while rows.next()?.is_some() {}
    Ok(())
}

/// ALTER SERVER CONFIGURATION SET BUFFER POOL EXTENSION ON.
pub fn enable_extension(conn: &Connection, path: &Path, mb: u64) -> anyhow::Result<()> {
    bpe_exec(
        conn,
        &format!(
            "ALTER SERVER CONFIGURATION SET BUFFER POOL EXTENSION ON (FILENAME = '{}', SIZE = {mb} MB)",
            path.display()
        ),
    )
}

/// DBCC DROPCLEANBUFFERS, plus the OS page cache of the file (for runs without O_DIRECT).
pub fn drop_clean_buffers(conn: &Connection, path: &Path) -> anyhow::Result<()> {
    bpe_exec(conn, "DBCC DROPCLEANBUFFERS")?;
    drop_os_cache(path);
    Ok(())
}

/// Asks the kernel to forget its cached pages of `path` (POSIX_FADV_DONTNEED).
pub fn drop_os_cache(path: &Path) {
    use std::os::fd::AsRawFd;
    if let Ok(f) = std::fs::File::open(path) {
        let _ = f.sync_all();
        // SAFETY: a plain syscall on a descriptor we own; no memory is passed.
        unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    }
}

/// The process's engine, once a connection through the bpe VFS created it.
pub fn engine() -> Option<Arc<Engine>> {
    sqlite_bpe::existing_engine()
}

pub fn snapshot() -> CounterSnapshot {
    engine().map(|e| e.counters()).unwrap_or_default()
}

/// Waits for the extension's background writer to drain (after warming it).
pub fn wait_for_extension_writes() {
    if let Some(e) = engine() {
        e.wait_for_extension_writes(Duration::from_secs(600));
    }
}

/// The counters of one timed phase: differences of the cumulative counters, gauges at its end.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Counters {
    pub page_lookups: u64,
    pub l1_hits: u64,
    pub page_reads: u64,
    pub readahead_pages: u64,
    pub page_writes: u64,
    pub lazy_writes: u64,
    pub ext_page_reads: u64,
    pub ext_page_writes: u64,
    pub ext_page_evictions: u64,
    pub ext_bytes_written: u64,
    pub ext_admissions_dropped: u64,
    pub ext_checksum_failures: u64,
    /// Read requests to the extension file and the microseconds they took (the request alone).
    #[serde(default)]
    pub ext_read_requests: u64,
    #[serde(default)]
    pub ext_read_micros: u64,
    /// Times a file's cached pages were all dropped because it changed under the engine.
    #[serde(default)]
    pub file_invalidations: u64,
    /// Pages dropped one by one because another process changed them.
    #[serde(default)]
    pub pages_forgotten: u64,
    /// Cumulative since the engine started (the core keeps no per-phase figure).
    pub ext_sequential_write_percent: u64,
    pub hit_ratio_percent: f64,
    pub database_pages: u64,
    pub ext_allocated_pages: u64,
    pub memory_bytes: u64,
    pub max_memory: u64,
    pub buffered_data_files: u64,
    /// False when no engine was there to count (all counters are then zero).
    pub engine: bool,
}

impl Counters {
    pub fn between(a: &CounterSnapshot, b: &CounterSnapshot) -> Counters {
        let d = |x: u64, y: u64| y.saturating_sub(x);
        let lookups = d(a.page_lookups, b.page_lookups);
        let hits = d(a.l1_hits, b.l1_hits);
        Counters {
            page_lookups: lookups,
            l1_hits: hits,
            page_reads: d(a.page_reads, b.page_reads),
            readahead_pages: d(a.readahead_pages, b.readahead_pages),
            page_writes: d(a.page_writes, b.page_writes),
            lazy_writes: d(a.lazy_writes, b.lazy_writes),
            ext_page_reads: d(a.ext_page_reads, b.ext_page_reads),
            ext_page_writes: d(a.ext_page_writes, b.ext_page_writes),
            ext_page_evictions: d(a.ext_page_evictions, b.ext_page_evictions),
            ext_bytes_written: d(a.ext_bytes_written, b.ext_bytes_written),
            ext_admissions_dropped: d(a.ext_admissions_dropped, b.ext_admissions_dropped),
            ext_checksum_failures: d(a.ext_checksum_failures, b.ext_checksum_failures),
            ext_read_requests: d(a.ext_read_requests, b.ext_read_requests),
            ext_read_micros: d(a.ext_read_micros, b.ext_read_micros),
            file_invalidations: d(a.file_invalidations, b.file_invalidations),
            pages_forgotten: d(a.pages_forgotten, b.pages_forgotten),
            ext_sequential_write_percent: b.ext_sequential_write_percent,
            hit_ratio_percent: if lookups == 0 {
                100.0
            } else {
                hits as f64 * 100.0 / lookups as f64
            },
            database_pages: b.database_pages,
            ext_allocated_pages: b.ext_allocated_pages,
            memory_bytes: b.memory_bytes,
            max_memory: b.max_memory,
            buffered_data_files: b.buffered_data_files,
            engine: engine().is_some(),
        }
    }
}

/// Bytes this process has caused to be read from and written to storage so far (`read_bytes`
/// and `write_bytes` of /proc/self/io): OS page cache misses, write-back and O_DIRECT I/O alike,
/// the one count of device I/O that stock SQLite and bpe share.
pub fn process_storage_bytes() -> Option<(u64, u64)> {
    let io = std::fs::read_to_string("/proc/self/io").ok()?;
    let field = |name: &str| -> Option<u64> {
        io.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().parse().ok())
    };
    Some((field("read_bytes:")?, field("write_bytes:")?))
}

#[cfg(test)]
mod tests {
    use super::env_count;

    #[test]
    fn an_environment_count_is_its_default_unset_and_an_error_naming_the_variable_if_not_a_number()
    {
        // Variables of this test's own, so that no other test's connections see them.
        let var = "BPE_BENCH_TEST_COUNT_A";
        std::env::remove_var(var);
        assert_eq!(env_count(var, 7, "a count").unwrap(), 7);
        std::env::set_var(var, " 4096 ");
        assert_eq!(env_count(var, 7, "a count").unwrap(), 4096);
        std::env::set_var(var, "4 MB");
        let e = env_count(var, 7, "a count").unwrap_err().to_string();
        assert!(
            e.contains(var) && e.contains("4 MB") && e.contains("a count"),
            "{e}"
        );
        std::env::remove_var(var);
    }
}
