//! One configuration per child process: the current executable run again with the same
//! arguments and `BPE_BENCH_CHILD` set to the configuration (JSON). The engine is created in the
//! child from the environment the parent gives it, so memory, emulation and caches never leak
//! from one configuration into the next. A configuration's process may start helpers the same
//! way (e.g. a plain SQLite writer beside it), without the engine's settings.

use crate::cgroup::MemLimit;
use crate::db::{self, Journal, Sqlite};
use crate::report::ConfigResult;
use crate::storage::Storage;
use anyhow::{bail, Context};
use serde::{de::DeserializeOwned, Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

const CHILD_ENV: &str = "BPE_BENCH_CHILD";
/// A command each configuration's process runs under (a profiler: see tools/bench/instructions.sh).
const WRAPPER_ENV: &str = "BPE_BENCH_CHILD_WRAPPER";

#[derive(Serialize, Deserialize)]
pub struct ChildSpec {
    pub bench: String,
    pub config: serde_json::Value,
    /// Where the child writes its results (a configuration's `Vec<ConfigResult>`).
    pub result: PathBuf,
    pub sample_ms: u64,
}

/// What every configuration's process starts from.
#[derive(Clone, Serialize, Deserialize)]
pub struct Setup {
    pub name: String,
    pub description: String,
    /// The database it runs on.
    pub db: PathBuf,
    /// The extension it enables first: file and size in MB.
    pub extension: Option<(PathBuf, u64)>,
    /// The SQLite it runs on: the bpe VFS or stock SQLite.
    pub sqlite: Sqlite,
    pub journal: Journal,
    /// A memory cgroup (v1) the process moves into before it opens anything.
    pub memory_cgroup: Option<PathBuf>,
    /// Leave the extension file when the process is done (a warm restart's first process);
    /// otherwise the runner deletes it, so that every configuration starts cold.
    #[serde(default)]
    pub keep_extension: bool,
}

/// A configuration as the child gets it: the setup, and what the benchmark runs on it.
#[derive(Serialize, Deserialize)]
struct Config<T> {
    #[serde(flatten)]
    setup: Setup,
    #[serde(flatten)]
    run: T,
}

impl ChildSpec {
    /// `bench` with `config`, its results to a file in `work_dir` named after `role`.
    fn new(
        bench: &str,
        config: serde_json::Value,
        work_dir: &Path,
        role: &str,
        sample_ms: u64,
    ) -> ChildSpec {
        let result = work_dir.join(format!("bench-{role}-{}.json", std::process::id()));
        let _ = std::fs::remove_file(&result);
        ChildSpec {
            bench: bench.into(),
            config,
            result,
            sample_ms,
        }
    }

    /// This executable again, with this process's arguments, running the spec; under
    /// `BPE_BENCH_CHILD_WRAPPER` (a command and its arguments, split at spaces, such as
    /// `valgrind --tool=callgrind`) if set, which then runs the executable by its path.
    fn command(&self) -> anyhow::Result<Command> {
        let wrapper = std::env::var(WRAPPER_ENV).unwrap_or_default();
        let mut wrapper = wrapper.split_whitespace();
        let mut cmd = match wrapper.next() {
            Some(program) => {
                let exe = std::env::current_exe().context("finding the current executable")?;
                let mut cmd = Command::new(program);
                cmd.args(wrapper).arg(exe);
                cmd
            }
            // /proc/self/exe still names this process's executable after a rebuild replaced
            // the file.
            None => match Path::new("/proc/self/exe").exists() {
                true => Command::new("/proc/self/exe"),
                false => {
                    Command::new(std::env::current_exe().context("finding the current executable")?)
                }
            },
        };
        cmd.args(std::env::args_os().skip(1))
            .env(CHILD_ENV, serde_json::to_string(self)?);
        if let Some(name) = self.config.get("name").and_then(|n| n.as_str()) {
            // For the wrapper's output file names (valgrind's `%q{BPE_BENCH_CONFIG}`).
            cmd.env("BPE_BENCH_CONFIG", name);
        }
        Ok(cmd)
    }

    /// What the process wrote with [`write_results`], once it exited.
    fn take_results<T: DeserializeOwned>(&self) -> anyhow::Result<T> {
        let text = std::fs::read_to_string(&self.result)
            .with_context(|| format!("reading the results of the {} process", self.bench))?;
        let _ = std::fs::remove_file(&self.result);
        Ok(serde_json::from_str(&text)?)
    }
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
            sqlite: Sqlite::Bpe,
            journal: Journal::Wal,
            memory_cgroup: None,
            keep_extension: false,
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
        self.spawn(setup, run, memory_mb, emulated, &[])?.finish()
    }

    /// Starts one configuration's process like [`Runner::run`], with `env` added, and returns
    /// at once (several may run side by side).
    pub fn spawn<T: Serialize>(
        &self,
        setup: Setup,
        run: T,
        memory_mb: u64,
        emulated: bool,
        env: &[(&str, &str)],
    ) -> anyhow::Result<Running> {
        // A process that exits with its extension on leaves the file (for a warm restart).
        let leftover = setup
            .extension
            .as_ref()
            .filter(|_| !setup.keep_extension)
            .map(|(path, _)| path.clone());
        // The slow volume's throttle, inherited by the configuration's process.
        self.storage.enter_data_device()?;
        let role = format!("result-{}", setup.name);
        let config = serde_json::to_value(Config { setup, run })?;
        let spec = ChildSpec::new(
            self.bench,
            config,
            &self.storage.ext_dir,
            &role,
            self.sample_ms,
        );
        let mut cmd = spec.command()?;
        cmd.env("BPE_MAX_SERVER_MEMORY_MB", memory_mb.to_string())
            .env("BPE_DIRECT_IO", "1")
            .envs(env.iter().copied());
        let device = &self.storage.data_device;
        if emulated && device.emulated {
            cmd.envs(sqlite_bpe::emulation_env(&device.model.to_core()));
        } else {
            for var in sqlite_bpe::emulation_var_names() {
                cmd.env_remove(var);
            }
        }
        let process = cmd
            .spawn()
            .context("starting the configuration's process")?;
        Ok(Running {
            process,
            spec,
            leftover,
        })
    }

    /// Runs one configuration as stock SQLite: the unix VFS with a page cache of `memory_mb`,
    /// in a memory cgroup of `cgroup_mb` (SQLite's cache, the process and the OS page cache of
    /// the data file together) so that the OS page cache is held to a budget as bpe's pool is.
    /// `setup.description` may hold `{os_cache}`, replaced by what holds the OS page cache.
    /// Each result carries the group's figures in `details.memory_cgroup`.
    pub fn run_stock<T: Serialize>(
        &self,
        mut setup: Setup,
        run: T,
        memory_mb: u64,
        cgroup_mb: u64,
    ) -> anyhow::Result<Vec<ConfigResult>> {
        let limit = MemLimit::new(&setup.name, cgroup_mb);
        setup.description = setup.description.replace("{os_cache}", &limit.describe());
        setup.sqlite = Sqlite::Stock {
            cache_kib: memory_mb * 1024,
        };
        setup.memory_cgroup = limit.path();
        let mut results = self.run(setup, run, memory_mb, false)?;
        let report = serde_json::to_value(limit.report())?;
        for r in &mut results {
            r.details["memory_cgroup"] = report.clone();
        }
        Ok(results)
    }
}

/// A configuration's process, running.
pub struct Running {
    process: Child,
    spec: ChildSpec,
    /// The extension file to remove once it exits.
    leftover: Option<PathBuf>,
}

impl Running {
    /// Waits for the process and returns its results.
    pub fn finish(mut self) -> anyhow::Result<Vec<ConfigResult>> {
        let status = self.process.wait()?;
        if let Some(path) = self.leftover {
            let _ = std::fs::remove_file(path);
        }
        if !status.success() {
            bail!("{} configuration failed ({status})", self.spec.bench);
        }
        self.spec.take_results()
    }
}

/// A helper process a configuration's process started: this executable again, running `bench`
/// (a name [`crate::run_child`] knows) with its configuration, with none of the engine's
/// settings in its environment, its stdin and stdout piped to the starter.
pub struct Helper {
    pub process: Child,
    spec: ChildSpec,
}

impl Helper {
    /// Starts `bench` with `config`; its results go through a file in `work_dir`.
    pub fn start<C: Serialize>(bench: &str, config: &C, work_dir: &Path) -> anyhow::Result<Self> {
        let spec = ChildSpec::new(bench, serde_json::to_value(config)?, work_dir, "helper", 0);
        let mut cmd = spec.command()?;
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("BPE_") && k != CHILD_ENV {
                cmd.env_remove(k);
            }
        }
        let process = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting the {bench} process"))?;
        Ok(Helper { process, spec })
    }

    /// Waits for the helper to exit and returns what it wrote with [`write_results`].
    pub fn finish<T: DeserializeOwned>(mut self) -> anyhow::Result<T> {
        let status = self.process.wait()?;
        if !status.success() {
            bail!("the {} process failed ({status})", self.spec.bench);
        }
        self.spec.take_results()
    }
}

/// The child's side, after running its configuration: hands the results to the parent.
pub fn write_results<T: Serialize + ?Sized>(spec: &ChildSpec, results: &T) -> anyhow::Result<()> {
    std::fs::write(&spec.result, serde_json::to_vec(results)?)?;
    Ok(())
}

/// The child's side, first: its configuration (setup and the benchmark's part), and its database
/// opened through the setup's SQLite, in its memory cgroup, with every cache of it emptied (the
/// engine's and the OS page cache) and the extension enabled.
pub fn start<T: DeserializeOwned>(
    config: serde_json::Value,
) -> anyhow::Result<(Setup, T, rusqlite::Connection)> {
    let Config { setup, run } = serde_json::from_value(config)?;
    if let Some(path) = &setup.memory_cgroup {
        crate::cgroup::join(path)?;
    }
    let conn = db::open_with(&setup.db, setup.sqlite, setup.journal)?;
    match setup.sqlite {
        Sqlite::Bpe => db::drop_clean_buffers(&conn, &setup.db)?,
        Sqlite::Stock { .. } => db::drop_os_cache(&setup.db),
    }
    if let Some((path, mb)) = &setup.extension {
        db::enable_extension(&conn, path, *mb)?;
    }
    Ok((setup, run, conn))
}

/// Whether a benchmark runs configuration `name`: when `--configs` (`filter`) names it, or
/// without `--configs` always, but stock SQLite's (`stock`) only on a real data device: the
/// in-process emulation slows only bpe, so beside it stock SQLite would read a fast disk.
pub fn runs_by_default(filter: Option<&[String]>, name: &str, stock: bool, emulated: bool) -> bool {
    match filter {
        Some(names) => names.iter().any(|n| n == name),
        None => !(stock && emulated),
    }
}
