//! Configuration from the environment, for applications that cannot run SQL. Read once, when
//! the extension is first loaded (or `register()` first runs).
//!
//! | variable | meaning |
//! |---|---|
//! | `BPE_MAX_SERVER_MEMORY_MB` | max server memory in MB (default 128) |
//! | `BPE_EXTENSION_FILE`, `BPE_EXTENSION_SIZE` | enable the extension at that absolute path with that size (`4GB`, `512 MB`, ...); a relative path fails the load, as `FILENAME =` fails the statement |
//! | `BPE_DEFAULT_VFS` | `1` to make `bpe` the process's default VFS when the library loads: a plain file name (no `?vfs=bpe`) is then served by the pool, for hosts and ORMs that cannot pass URIs. Every main database the process opens afterwards goes through the pool (default `0`) |
//! | `BPE_EXTENSION_CHECKPOINT_MS` | how often the extension checkpoints its index while it (or a database file's stamp) changes, for the next process to start warm from after a crash (default 5000; a clean exit always writes one) |
//! | `BPE_EXTENSION_SHARED` | `0` to make an extension enabled without saying (`SHARED = ON|OFF` of the ON statement says) this process's own: refused while another process uses its path, checkpointed into its file so that even a reboot restarts warm (default `1`: shared with the other processes of this user that enable one at the same path, one ring and one index in shared memory for all of them; see docs/DESIGN.md) |
//! | `BPE_DIRECT_IO` | `0` to read data files through the OS page cache (default `1`) |
//! | `BPE_READAHEAD` | `0` to turn readahead off (default `1`) |
//! | `BPE_WRITE_BEHIND` | `1` to let a writer in rollback mode keep its page writes in RAM until its sync or unlock, so that a page SQLite spills many times in one transaction reaches the file once; the pages SQLite wrote are then not in the file for a raw reader (a file copy, a size check) after `sqlite3_db_cacheflush` or a cache spill, as they would be with stock SQLite. By default every page goes to the database file at once (default `0`; see docs/SQLITE.md, "Write-behind") |
//! | `BPE_LARGE_PAGES` | `0` to keep L1's page bytes on the kernel's 4 KiB pages; by default they are advised for transparent huge pages (`MADV_HUGEPAGE`), so that a hit rarely misses the TLB (default `1`; no effect where the kernel's `transparent_hugepage` is `never`) |
//! | `BPE_SQL_SURFACE` | `every-connection` (default): every connection opened after the load gets bpe's SQL functions and virtual tables (`bpe_exec`, `bpe_performance_counters`, ...); `on-demand`: only a connection that asks, by the URI parameter `bpe_sql=1` of its main database, by [`crate::register_sql`], or by loading the extension on it. Either way a connection's `bpe_sql=0` leaves them off it. The VFS serves every connection alike |
//! | `BPE_DATA_LATENCY_US`, `BPE_DATA_WRITE_LATENCY_US`, `BPE_DATA_SYNC_LATENCY_US` | emulate a slow data device (benchmarks only): microseconds per read, per write, per sync (at most 1 s) |
//! | `BPE_DATA_READ_MBPS`, `BPE_DATA_WRITE_MBPS` | its bandwidth in MB/s (10^6 bytes; 0 or unset: unlimited, else at least 1): a request takes its latency plus its size / bandwidth |
//! | `BPE_DATA_IOPS`, `BPE_DATA_WRITE_IOPS` | its read and write IOPS caps (0 or unset: none), across all threads |
//!
//! Any of the `BPE_DATA_*` variables turns the emulation on; it charges every I/O of the
//! databases' files (pages, journal, WAL, syncs: see `vfs/charged_file.rs`).
//!
//! The values go through the same checks as the same settings given in SQL (`check_max_memory`,
//! `check_extension_size`, the extension path rules), with one difference in what a failure
//! does: a value that is wrong in itself fails the load, naming the variable; an extension the
//! machine cannot give right now (its path is taken, the disk is full) leaves the VFS working
//! without it, with the reason in `sqlite3_log` and the extension's `last_failure`.

use bpe_core::{check_extension_size, check_max_memory, Config, DeviceEmulation, Engine};
use bpe_tsql::Statement;
use std::path::PathBuf;
use std::time::Duration;

/// The emulated data device's variables, each with how its value sets the model (see the table
/// above). [`emulation_env`] is the inverse, for benchmarks that start processes with a model.
const EMULATION_VARS: [(&str, Knob); 7] = [
    ("BPE_DATA_LATENCY_US", Knob::ReadLatency),
    ("BPE_DATA_WRITE_LATENCY_US", Knob::WriteLatency),
    ("BPE_DATA_SYNC_LATENCY_US", Knob::SyncLatency),
    ("BPE_DATA_READ_MBPS", Knob::ReadMbps),
    ("BPE_DATA_WRITE_MBPS", Knob::WriteMbps),
    ("BPE_DATA_IOPS", Knob::ReadIops),
    ("BPE_DATA_WRITE_IOPS", Knob::WriteIops),
];

#[derive(Clone, Copy)]
enum Knob {
    ReadLatency,
    WriteLatency,
    SyncLatency,
    ReadMbps,
    WriteMbps,
    ReadIops,
    WriteIops,
}

const MB: u64 = 1_000_000;

impl Knob {
    /// Sets this knob of `model` to `value` (in the variable's unit); None if it does not fit.
    fn set(self, model: &mut DeviceEmulation, value: u64) -> Option<()> {
        let us = Duration::from_micros;
        match self {
            Knob::ReadLatency => model.read_latency = us(value),
            Knob::WriteLatency => model.write_latency = us(value),
            Knob::SyncLatency => model.sync_latency = us(value),
            Knob::ReadMbps => model.read_bandwidth = value.checked_mul(MB)?,
            Knob::WriteMbps => model.write_bandwidth = value.checked_mul(MB)?,
            Knob::ReadIops => model.read_iops = u32::try_from(value).ok()?,
            Knob::WriteIops => model.write_iops = u32::try_from(value).ok()?,
        }
        Some(())
    }

    /// This knob of `model`, in the variable's unit (bandwidth rounded to whole MB/s).
    fn get(self, model: &DeviceEmulation) -> u64 {
        let us = |d: Duration| d.as_micros().min(u64::MAX as u128) as u64;
        match self {
            Knob::ReadLatency => us(model.read_latency),
            Knob::WriteLatency => us(model.write_latency),
            Knob::SyncLatency => us(model.sync_latency),
            Knob::ReadMbps => model.read_bandwidth.div_ceil(MB),
            Knob::WriteMbps => model.write_bandwidth.div_ceil(MB),
            Knob::ReadIops => model.read_iops as u64,
            Knob::WriteIops => model.write_iops as u64,
        }
    }
}

/// The names of the emulated device's variables (for processes that must not inherit them).
pub fn emulation_var_names() -> impl Iterator<Item = &'static str> {
    EMULATION_VARS.iter().map(|(name, _)| *name)
}

/// The variables that configure `model` in a process started with them (every one set, so
/// that nothing inherited mixes in).
pub fn emulation_env(model: &DeviceEmulation) -> Vec<(&'static str, String)> {
    EMULATION_VARS
        .iter()
        .map(|(name, knob)| (*name, knob.get(model).to_string()))
        .collect()
}

/// The emulated data device the `BPE_DATA_*` variables describe; None if none is set. Each
/// value is checked on its own by the model's one rule, so that the error names its variable.
fn device_emulation_from_env() -> Result<Option<DeviceEmulation>, String> {
    device_emulation_from(var)
}

/// As [`device_emulation_from_env`], with the variables' values from `lookup`.
fn device_emulation_from(
    lookup: impl Fn(&str) -> Option<String>,
) -> Result<Option<DeviceEmulation>, String> {
    let mut model = DeviceEmulation::default();
    let mut any = false;
    for (name, knob) in EMULATION_VARS {
        let Some(v) = lookup(name) else { continue };
        any = true;
        let value = number(name, &v)?;
        let mut alone = DeviceEmulation::default();
        knob.set(&mut alone, value)
            .ok_or_else(|| format!("{name}={v} is too large"))?;
        alone.validate().map_err(|e| format!("{name}={v}: {e}"))?;
        knob.set(&mut model, value);
    }
    Ok(any.then_some(model))
}

#[derive(Clone, Debug, Default)]
pub struct EnvConfig {
    pub config: Config,
    pub extension: Option<(PathBuf, u64)>,
    /// Which connections get the SQL functions and virtual tables (`BPE_SQL_SURFACE`).
    pub sql_surface: SqlSurface,
}

/// Which connections the auto-extension gives bpe's SQL functions and virtual tables to. A
/// connection's own URI parameter `bpe_sql` overrides it either way.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SqlSurface {
    /// Every connection opened after the load (unless it says `bpe_sql=0`).
    #[default]
    EveryConnection,
    /// Only a connection that asks: `bpe_sql=1`, `register_sql`, or a load on it.
    OnDemand,
}

impl SqlSurface {
    /// The accepted values of `BPE_SQL_SURFACE`, in the error that refuses another.
    const VALUES: [(&'static str, SqlSurface); 2] = [
        ("every-connection", SqlSurface::EveryConnection),
        ("on-demand", SqlSurface::OnDemand),
    ];

    /// `BPE_SQL_SURFACE`'s value read; an unknown one is refused, naming the variable and the
    /// values it takes.
    fn parse(value: &str) -> Result<SqlSurface, String> {
        Self::VALUES
            .iter()
            .find(|(name, _)| *name == value.trim())
            .map(|(_, surface)| *surface)
            .ok_or_else(|| {
                format!(
                    "BPE_SQL_SURFACE={value:?} must be {} or {}",
                    Self::VALUES[0].0,
                    Self::VALUES[1].0
                )
            })
    }
}

fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

fn number(name: &str, value: &str) -> Result<u64, String> {
    value
        .trim()
        .parse::<u64>()
        .map_err(|_| format!("{name}={value:?} is not a whole non-negative number"))
}

fn flag(name: &str, value: &str) -> Result<bool, String> {
    match value.trim() {
        "1" => Ok(true),
        "0" => Ok(false),
        _ => Err(format!("{name}={value:?} must be 0 or 1")),
    }
}

/// Whether `BPE_DEFAULT_VFS` asks for `bpe` as the default VFS. Read at every load (the rest of
/// the environment only at the first), so a host can load once plainly and again to switch.
pub fn default_vfs_from_env() -> Result<bool, String> {
    match var("BPE_DEFAULT_VFS") {
        Some(v) => flag("BPE_DEFAULT_VFS", &v),
        None => Ok(false),
    }
}

/// A size such as `4GB` or `512 MB` ([`bpe_tsql::parse_size`], as `SIZE =` reads it); the error
/// names the setting.
pub fn parse_size(name: &str, value: &str) -> Result<u64, String> {
    bpe_tsql::parse_size(value).map_err(|e| format!("{name}={value:?}: {e}"))
}

/// `BPE_EXTENSION_FILE`'s path, by the rules `FILENAME =` follows in SQL (absolute, ...): a
/// path that is wrong in itself fails the load, as in SQL it fails the statement.
fn extension_path(path: &str) -> Result<PathBuf, String> {
    bpe_tsql::check_extension_path(path)
        .map_err(|reason| format!("BPE_EXTENSION_FILE={path:?}: {reason}"))?;
    Ok(PathBuf::from(path))
}

impl EnvConfig {
    pub fn from_env() -> Result<EnvConfig, String> {
        let mut config = Config {
            // Opt-in: SQLite's page writes outside a commit (`sqlite3_db_cacheflush`, cache
            // spills) are in the file when it returns, for anyone who reads the file itself.
            write_behind: false,
            ..Config::default()
        };
        if let Some(v) = var("BPE_MAX_SERVER_MEMORY_MB") {
            let mb = number("BPE_MAX_SERVER_MEMORY_MB", &v)?;
            let bytes = mb
                .checked_mul(1 << 20)
                .ok_or_else(|| format!("BPE_MAX_SERVER_MEMORY_MB={v} overflows"))?;
            check_max_memory(bytes, 0).map_err(|e| {
                format!(
                    "BPE_MAX_SERVER_MEMORY_MB={v}: {}",
                    bpe_tsql::error_message(&e)
                )
            })?;
            config.max_memory = bytes;
        }
        if let Some(v) = var("BPE_DIRECT_IO") {
            config.direct_io = flag("BPE_DIRECT_IO", &v)?;
        }
        if let Some(v) = var("BPE_READAHEAD") {
            config.readahead = flag("BPE_READAHEAD", &v)?;
        }
        if let Some(v) = var("BPE_WRITE_BEHIND") {
            config.write_behind = flag("BPE_WRITE_BEHIND", &v)?;
        }
        if let Some(v) = var("BPE_LARGE_PAGES") {
            config.large_pages = flag("BPE_LARGE_PAGES", &v)?;
        }
        if let Some(v) = var("BPE_EXTENSION_SHARED") {
            config.shared_extension = flag("BPE_EXTENSION_SHARED", &v)?;
        }
        if let Some(v) = var("BPE_EXTENSION_CHECKPOINT_MS") {
            let ms = number("BPE_EXTENSION_CHECKPOINT_MS", &v)?;
            if !(10..=3_600_000).contains(&ms) {
                return Err(format!(
                    "BPE_EXTENSION_CHECKPOINT_MS={v}: from 10 ms to one hour"
                ));
            }
            config.checkpoint_interval = std::time::Duration::from_millis(ms);
        }
        config.data_device = device_emulation_from_env()?;
        let sql_surface = match var("BPE_SQL_SURFACE") {
            Some(v) => SqlSurface::parse(&v)?,
            None => SqlSurface::EveryConnection,
        };
        let extension = match (var("BPE_EXTENSION_FILE"), var("BPE_EXTENSION_SIZE")) {
            (None, None) => None,
            (Some(path), Some(size)) => {
                let bytes = parse_size("BPE_EXTENSION_SIZE", &size)?;
                check_extension_size(bytes, config.max_memory).map_err(|e| {
                    format!("BPE_EXTENSION_SIZE={size}: {}", bpe_tsql::error_message(&e))
                })?;
                Some((extension_path(&path)?, bytes))
            }
            _ => return Err("BPE_EXTENSION_FILE and BPE_EXTENSION_SIZE go together".into()),
        };
        Ok(EnvConfig {
            config,
            extension,
            sql_surface,
        })
    }

    /// Carries the settings out on a new engine: the extension, through the same statement SQL
    /// would run. If the machine refuses it, the VFS works without it (see the module comment).
    pub fn apply(&self, engine: &Engine) {
        let Some((path, size)) = &self.extension else {
            return;
        };
        let on = Statement::ExtensionOn {
            path: path.clone(),
            size_bytes: *size,
            sharing: None,
        };
        match bpe_tsql::run_statements(engine, &[on]) {
            Err(e) => {
                let reason = format!("BPE_EXTENSION_FILE: {e}");
                crate::api::log(libsqlite3_sys::SQLITE_WARNING, &reason);
                engine.note_extension_failure(reason);
            }
            // Enabled, but not as asked (private where no shared memory could be had).
            Ok(_) => {
                if let Some(why) = engine.extension_status().private_because {
                    crate::api::log(
                        libsqlite3_sys::SQLITE_WARNING,
                        &format!("BPE_EXTENSION_FILE: {why}"),
                    );
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn from(vars: &[(&str, String)]) -> Result<Option<DeviceEmulation>, String> {
        device_emulation_from(|name| {
            vars.iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.clone())
        })
    }

    #[test]
    fn the_emulation_variables_round_trip() {
        let model = DeviceEmulation {
            read_latency: Duration::from_micros(8000),
            write_latency: Duration::from_micros(9000),
            sync_latency: Duration::from_micros(7000),
            read_bandwidth: 150 * MB,
            write_bandwidth: 120 * MB,
            read_iops: 150,
            write_iops: 140,
        };
        assert_eq!(from(&emulation_env(&model)), Ok(Some(model)));
        assert_eq!(from(&[]), Ok(None));
        let one = [("BPE_DATA_WRITE_MBPS", "125".to_string())];
        assert_eq!(
            from(&one),
            Ok(Some(DeviceEmulation {
                write_bandwidth: 125 * MB,
                ..DeviceEmulation::default()
            }))
        );
    }

    #[test]
    fn the_extension_path_follows_the_filename_rules_of_sql() {
        assert_eq!(
            extension_path("/ssd/x.bpe"),
            Ok(PathBuf::from("/ssd/x.bpe"))
        );
        for (path, reason) in [
            ("rel.bpe", "must be absolute"),
            ("./x/rel.bpe", "must be absolute"),
            ("a\0b", "NUL"),
        ] {
            let err = extension_path(path).unwrap_err();
            assert!(
                err.starts_with("BPE_EXTENSION_FILE=") && err.contains(reason),
                "{path:?}: {err}"
            );
        }
        // SQL refuses the same path for the same reason.
        let sql = bpe_tsql::parse(
            "ALTER SERVER CONFIGURATION SET BUFFER POOL EXTENSION ON (FILENAME = 'rel.bpe', SIZE = 1 GB)",
        )
        .unwrap_err()
        .to_string();
        assert!(sql.contains("the path must be absolute"), "{sql}");
    }

    #[test]
    fn the_sql_surface_takes_its_two_values_and_refuses_others_naming_them() {
        assert_eq!(
            SqlSurface::parse("every-connection"),
            Ok(SqlSurface::EveryConnection)
        );
        assert_eq!(SqlSurface::parse(" on-demand "), Ok(SqlSurface::OnDemand));
        for bad in ["lazy", "1", "On-Demand", "every_connection"] {
            let err = SqlSurface::parse(bad).unwrap_err();
            assert!(
                err.starts_with("BPE_SQL_SURFACE=")
                    && err.contains("every-connection")
                    && err.contains("on-demand"),
                "{bad:?}: {err}"
            );
        }
    }

    #[test]
    fn a_bad_emulation_value_is_refused_naming_its_variable() {
        for (name, value) in [
            ("BPE_DATA_SYNC_LATENCY_US", "2000000"),
            ("BPE_DATA_WRITE_LATENCY_US", "18446744073709551615"),
            ("BPE_DATA_READ_MBPS", "18446744073709551615"),
            ("BPE_DATA_WRITE_IOPS", "5000000000"),
            ("BPE_DATA_WRITE_IOPS", "-1"),
        ] {
            let err = from(&[(name, value.to_string())]).unwrap_err();
            assert!(err.contains(name), "{name}={value}: {err}");
        }
    }
}
