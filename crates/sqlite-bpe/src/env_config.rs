//! Configuration from the environment, for applications that cannot run SQL. Read once, when
//! the extension is first loaded (or `register()` first runs).
//!
//! | variable | meaning |
//! |---|---|
//! | `BPE_MAX_SERVER_MEMORY_MB` | max server memory in MB (default 128) |
//! | `BPE_EXTENSION_FILE`, `BPE_EXTENSION_SIZE` | enable the extension at that absolute path with that size (`4GB`, `512 MB`, ...) |
//! | `BPE_DIRECT_IO` | `0` to read data files through the OS page cache (default `1`) |
//! | `BPE_READAHEAD` | `0` to turn readahead off (default `1`) |
//! | `BPE_DATA_LATENCY_US`, `BPE_DATA_IOPS` | emulate a slow data device: latency per read and an IOPS cap (benchmarks only) |
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

#[derive(Clone, Debug, Default)]
pub struct EnvConfig {
    pub config: Config,
    pub extension: Option<(PathBuf, u64)>,
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

/// A size such as `4GB` or `512 MB` ([`bpe_tsql::parse_size`], as `SIZE =` reads it); the error
/// names the setting.
pub fn parse_size(name: &str, value: &str) -> Result<u64, String> {
    bpe_tsql::parse_size(value).map_err(|e| format!("{name}={value:?}: {e}"))
}

impl EnvConfig {
    pub fn from_env() -> Result<EnvConfig, String> {
        let mut config = Config::default();
        if let Some(v) = var("BPE_MAX_SERVER_MEMORY_MB") {
            let mb = number("BPE_MAX_SERVER_MEMORY_MB", &v)?;
            let bytes = mb
                .checked_mul(1 << 20)
                .ok_or_else(|| format!("BPE_MAX_SERVER_MEMORY_MB={v} overflows"))?;
            check_max_memory(bytes, 0).map_err(|e| format!("BPE_MAX_SERVER_MEMORY_MB={v}: {e}"))?;
            config.max_memory = bytes;
        }
        if let Some(v) = var("BPE_DIRECT_IO") {
            config.direct_io = flag("BPE_DIRECT_IO", &v)?;
        }
        if let Some(v) = var("BPE_READAHEAD") {
            config.readahead = flag("BPE_READAHEAD", &v)?;
        }
        let latency = var("BPE_DATA_LATENCY_US")
            .map(|v| number("BPE_DATA_LATENCY_US", &v))
            .transpose()?;
        let iops = var("BPE_DATA_IOPS")
            .map(|v| {
                let n = number("BPE_DATA_IOPS", &v)?;
                u32::try_from(n).map_err(|_| format!("BPE_DATA_IOPS={v} is above {}", u32::MAX))
            })
            .transpose()?;
        if latency.is_some() || iops.is_some() {
            let emulation = DeviceEmulation {
                latency: Duration::from_micros(latency.unwrap_or(0)),
                iops: iops.unwrap_or(0),
            };
            emulation
                .validate()
                .map_err(|e| format!("BPE_DATA_LATENCY_US: {e}"))?;
            config.data_device = Some(emulation);
        }
        let extension = match (var("BPE_EXTENSION_FILE"), var("BPE_EXTENSION_SIZE")) {
            (None, None) => None,
            (Some(path), Some(size)) => {
                let bytes = parse_size("BPE_EXTENSION_SIZE", &size)?;
                check_extension_size(bytes, config.max_memory)
                    .map_err(|e| format!("BPE_EXTENSION_SIZE={size}: {e}"))?;
                Some((PathBuf::from(path), bytes))
            }
            _ => return Err("BPE_EXTENSION_FILE and BPE_EXTENSION_SIZE go together".into()),
        };
        Ok(EnvConfig { config, extension })
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
        };
        if let Err(e) = bpe_tsql::run_statements(engine, &[on]) {
            let reason = format!("BPE_EXTENSION_FILE: {e}");
            crate::api::log(libsqlite3_sys::SQLITE_WARNING, &reason);
            engine.note_extension_failure(reason);
        }
    }
}
