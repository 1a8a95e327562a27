//! Configuration from the environment, for applications that cannot run SQL. Read once, when
//! the process-wide engine is created (the first load of the extension or `register()`).
//!
//! | variable | meaning |
//! |---|---|
//! | `BPE_MAX_SERVER_MEMORY_MB` | max server memory in MB (default 128) |
//! | `BPE_EXTENSION_FILE`, `BPE_EXTENSION_SIZE` | enable the extension at that absolute path with that size (`4GB`, `512 MB`, ...) |
//! | `BPE_DIRECT_IO` | `0` to read data files through the OS page cache (default `1`) |
//! | `BPE_READAHEAD` | `0` to turn readahead off (default `1`) |
//! | `BPE_DATA_LATENCY_US`, `BPE_DATA_IOPS` | emulate a slow data device: latency per read and an IOPS cap (benchmarks only) |

use bpe_core::{Config, DeviceEmulation};
use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, Default)]
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
        "1" | "on" | "true" | "yes" => Ok(true),
        "0" | "off" | "false" | "no" => Ok(false),
        _ => Err(format!("{name}={value:?} must be 0 or 1")),
    }
}

/// Parses a size such as `4GB`, `512 MB`, `64KB` (unit required).
pub fn parse_size(name: &str, value: &str) -> Result<u64, String> {
    let v = value.trim().to_ascii_uppercase();
    let split = v.find(|c: char| !c.is_ascii_digit()).unwrap_or(v.len());
    let (digits, unit) = v.split_at(split);
    let n: u64 = digits.parse().map_err(|_| {
        format!("{name}={value:?}: expected a whole number followed by KB, MB or GB")
    })?;
    let mult: u64 = match unit.trim() {
        "KB" => 1 << 10,
        "MB" => 1 << 20,
        "GB" => 1 << 30,
        "TB" => 1 << 40,
        "" => {
            return Err(format!(
                "{name}={value:?}: the unit is missing (KB, MB or GB)"
            ))
        }
        u => {
            return Err(format!(
                "{name}={value:?}: unknown unit {u:?} (KB, MB or GB)"
            ))
        }
    };
    match n.checked_mul(mult) {
        Some(0) => Err(format!("{name}={value:?}: the size must be greater than 0")),
        Some(b) => Ok(b),
        None => Err(format!("{name}={value:?}: the size overflows")),
    }
}

impl EnvConfig {
    pub fn from_env() -> Result<EnvConfig, String> {
        let mut config = Config::default();
        if let Some(v) = var("BPE_MAX_SERVER_MEMORY_MB") {
            let mb = number("BPE_MAX_SERVER_MEMORY_MB", &v)?;
            config.max_memory = mb
                .checked_mul(1 << 20)
                .ok_or_else(|| format!("BPE_MAX_SERVER_MEMORY_MB={v} overflows"))?;
            if config.max_memory < bpe_core::config::MIN_MAX_MEMORY {
                return Err(format!(
                    "BPE_MAX_SERVER_MEMORY_MB={v} is below the minimum of 1 MB"
                ));
            }
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
            .map(|v| number("BPE_DATA_IOPS", &v))
            .transpose()?;
        if latency.is_some() || iops.is_some() {
            config.data_device = Some(DeviceEmulation {
                latency: Duration::from_micros(latency.unwrap_or(0)),
                iops: iops.unwrap_or(0).min(u32::MAX as u64) as u32,
            });
        }
        let extension = match (var("BPE_EXTENSION_FILE"), var("BPE_EXTENSION_SIZE")) {
            (None, None) => None,
            (Some(path), Some(size)) => Some((
                PathBuf::from(path),
                parse_size("BPE_EXTENSION_SIZE", &size)?,
            )),
            _ => return Err("BPE_EXTENSION_FILE and BPE_EXTENSION_SIZE go together".into()),
        };
        Ok(EnvConfig { config, extension })
    }
}
