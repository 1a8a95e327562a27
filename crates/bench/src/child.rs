//! One configuration per child process: the current executable run again with the same
//! arguments and `BPE_BENCH_CHILD` set to the configuration (JSON). The engine is created in the
//! child from the environment the parent gives it, so memory, emulation and caches never leak
//! from one configuration into the next.

use crate::report::ConfigResult;
use crate::storage::DataDevice;
use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::process::Command;

const CHILD_ENV: &str = "BPE_BENCH_CHILD";

#[derive(Serialize, Deserialize)]
pub struct ChildSpec {
    pub bench: String,
    pub config: serde_json::Value,
    /// Where the child writes its `Vec<ConfigResult>`.
    pub result: PathBuf,
    pub sample_ms: u64,
}

/// How the child's engine is created (read by the adapter from the environment).
pub struct EngineEnv<'a> {
    pub memory_mb: u64,
    /// Emulated latency applies to the data files; None or a real device: no emulation.
    pub device: Option<&'a DataDevice>,
}

/// The configuration this process runs, if it is a configuration's process.
pub fn spec_from_env() -> Option<ChildSpec> {
    let s = std::env::var(CHILD_ENV).ok()?;
    Some(serde_json::from_str(&s).expect("BPE_BENCH_CHILD holds a configuration"))
}

/// Runs one configuration in a child process and returns its results.
pub fn run_config<C: Serialize>(
    bench: &str,
    config: &C,
    env: EngineEnv,
    sample_ms: u64,
    work_dir: &std::path::Path,
) -> anyhow::Result<Vec<ConfigResult>> {
    let result = work_dir.join(format!("bench-result-{}.json", std::process::id()));
    let _ = std::fs::remove_file(&result);
    let spec = ChildSpec {
        bench: bench.into(),
        config: serde_json::to_value(config)?,
        result: result.clone(),
        sample_ms,
    };
    // /proc/self/exe still names this process's executable after a rebuild replaced the file.
    let exe = match std::path::Path::new("/proc/self/exe").exists() {
        true => PathBuf::from("/proc/self/exe"),
        false => std::env::current_exe().context("finding the current executable")?,
    };
    let mut cmd = Command::new(exe);
    cmd.args(std::env::args_os().skip(1))
        .env(CHILD_ENV, serde_json::to_string(&spec)?)
        .env("BPE_MAX_SERVER_MEMORY_MB", env.memory_mb.to_string())
        .env("BPE_DIRECT_IO", "1");
    match env.device.filter(|d| d.emulated) {
        Some(d) => {
            cmd.env("BPE_DATA_LATENCY_US", d.latency_us.to_string())
                .env("BPE_DATA_IOPS", d.iops.to_string());
        }
        None => {
            cmd.env_remove("BPE_DATA_LATENCY_US")
                .env_remove("BPE_DATA_IOPS");
        }
    }
    let status = cmd
        .status()
        .context("starting the configuration's process")?;
    if !status.success() {
        bail!("{bench} configuration failed ({status})");
    }
    let text = std::fs::read_to_string(&result).context("reading the configuration's results")?;
    let _ = std::fs::remove_file(&result);
    Ok(serde_json::from_str(&text)?)
}

/// The child's side, after running its configuration: hands the results to the parent.
pub fn write_results(spec: &ChildSpec, results: &[ConfigResult]) -> anyhow::Result<()> {
    std::fs::write(&spec.result, serde_json::to_vec(results)?)?;
    Ok(())
}
