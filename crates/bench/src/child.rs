//! One configuration per child process: the current executable run again with the same
//! arguments and `BPE_BENCH_CHILD` set to the configuration (JSON). The engine is created in the
//! child from the environment the parent gives it, so memory, emulation and caches never leak
//! from one configuration into the next.

use crate::db;
use crate::report::ConfigResult;
use crate::storage::Storage;
use anyhow::{bail, Context};
use serde::{de::DeserializeOwned, Deserialize, Serialize};
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

/// What every configuration's process starts from.
#[derive(Serialize, Deserialize)]
pub struct Setup {
    pub name: String,
    pub description: String,
    /// The database it runs on.
    pub db: PathBuf,
    /// The extension it enables first: file and size in MB.
    pub extension: Option<(PathBuf, u64)>,
}

/// A configuration as the child gets it: the setup, and what the benchmark runs on it.
#[derive(Serialize, Deserialize)]
struct Config<T> {
    #[serde(flatten)]
    setup: Setup,
    #[serde(flatten)]
    run: T,
}

/// The configuration this process runs, if it is a configuration's process.
pub fn spec_from_env() -> Option<ChildSpec> {
    let s = std::env::var(CHILD_ENV).ok()?;
    Some(serde_json::from_str(&s).expect("BPE_BENCH_CHILD holds a configuration"))
}

/// Runs a benchmark's configurations, each in a process of its own.
pub struct Runner<'a> {
    pub bench: &'static str,
    pub storage: &'a Storage,
    pub sample_ms: u64,
}

impl Runner<'_> {
    /// The setup of configuration `name` on `db`, with an extension of `extension_mb` MB (a
    /// fresh file in the extension's directory) when given.
    pub fn setup(
        &self,
        name: &str,
        description: String,
        db: &std::path::Path,
        extension_mb: Option<u64>,
    ) -> Setup {
        Setup {
            name: name.into(),
            description,
            db: db.to_path_buf(),
            extension: extension_mb.map(|mb| (self.storage.extension_path(name), mb)),
        }
    }

    /// Runs one configuration, announced on stderr: `setup`, then `run` (the benchmark's own
    /// part), with `memory_mb` of max server memory and the data device's emulation when
    /// `emulated` (none for a real device). Returns its results.
    pub fn run<T: Serialize>(
        &self,
        setup: Setup,
        run: T,
        memory_mb: u64,
        emulated: bool,
    ) -> anyhow::Result<Vec<ConfigResult>> {
        eprintln!("== {}: {}", setup.name, setup.description);
        let work_dir = &self.storage.ext_dir;
        let result = work_dir.join(format!("bench-result-{}.json", std::process::id()));
        let _ = std::fs::remove_file(&result);
        let spec = ChildSpec {
            bench: self.bench.into(),
            config: serde_json::to_value(Config { setup, run })?,
            result: result.clone(),
            sample_ms: self.sample_ms,
        };
        // /proc/self/exe still names this process's executable after a rebuild replaced the
        // file.
        let exe = match std::path::Path::new("/proc/self/exe").exists() {
            true => PathBuf::from("/proc/self/exe"),
            false => std::env::current_exe().context("finding the current executable")?,
        };
        let mut cmd = Command::new(exe);
        cmd.args(std::env::args_os().skip(1))
            .env(CHILD_ENV, serde_json::to_string(&spec)?)
            .env("BPE_MAX_SERVER_MEMORY_MB", memory_mb.to_string())
            .env("BPE_DIRECT_IO", "1");
        let device = &self.storage.data_device;
        if emulated && device.emulated {
            cmd.env("BPE_DATA_LATENCY_US", device.latency_us.to_string())
                .env("BPE_DATA_IOPS", device.iops.to_string());
        } else {
            cmd.env_remove("BPE_DATA_LATENCY_US")
                .env_remove("BPE_DATA_IOPS");
        }
        let status = cmd
            .status()
            .context("starting the configuration's process")?;
        if !status.success() {
            bail!("{} configuration failed ({status})", self.bench);
        }
        let text =
            std::fs::read_to_string(&result).context("reading the configuration's results")?;
        let _ = std::fs::remove_file(&result);
        Ok(serde_json::from_str(&text)?)
    }
}

/// The child's side, after running its configuration: hands the results to the parent.
pub fn write_results(spec: &ChildSpec, results: &[ConfigResult]) -> anyhow::Result<()> {
    std::fs::write(&spec.result, serde_json::to_vec(results)?)?;
    Ok(())
}

/// The child's side, first: its configuration (setup and the benchmark's part), and its database
/// opened through the bpe VFS with every cache of it emptied and the extension enabled.
pub fn start<T: DeserializeOwned>(
    config: serde_json::Value,
) -> anyhow::Result<(Setup, T, rusqlite::Connection)> {
    let Config { setup, run } = serde_json::from_value(config)?;
    let conn = db::open(&setup.db)?;
    db::drop_clean_buffers(&conn, &setup.db)?;
    if let Some((path, mb)) = &setup.extension {
        db::enable_extension(&conn, path, *mb)?;
    }
    Ok((setup, run, conn))
}
