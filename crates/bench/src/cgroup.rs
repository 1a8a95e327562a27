//! A cgroup v1 memory limit for one configuration's process, so that stock SQLite's OS page
//! cache is held to a memory budget as bpe's pool is by `max server memory`.
//!
//! The parent makes `/sys/fs/cgroup/memory/bpe-bench-<pid>-<name>` with the limit; the child
//! moves itself in before it opens anything (its page cache and anonymous memory are charged
//! there from then on; the executable's pages, already cached by the parent, are not). After
//! the child exits the parent reads the high-water mark and removes the group. Where the
//! controller is missing or not writable (no root, cgroup v2 only) nothing is limited and the
//! results say so.

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

const ROOT: &str = "/sys/fs/cgroup/memory";

/// Room in a stock configuration's memory cgroup for the process itself (heap, stacks, the
/// benchmark's own state), MB.
pub const STOCK_PROCESS_ALLOWANCE_MB: u64 = 16;

/// The memory cgroup of a stock configuration with a memory budget of `memory_mb` (every
/// benchmark's default; `--cgroup-mb` overrides it): SQLite's page cache of `memory_mb`, the OS
/// page cache held to the same budget (the comparison the benchmarks promise stock SQLite),
/// and [`STOCK_PROCESS_ALLOWANCE_MB`] for the process. Stock SQLite thus keeps up to twice
/// what bpe keeps in RAM (its pages may sit in both caches).
pub fn stock_budget_mb(memory_mb: u64) -> u64 {
    2 * memory_mb + STOCK_PROCESS_ALLOWANCE_MB
}

/// A memory limit for one configuration's process: a cgroup made for it (removed when
/// dropped), or why there is none.
pub struct MemLimit(Result<MemCgroup, String>);

struct MemCgroup {
    path: PathBuf,
    limit_bytes: u64,
}

/// What the group saw, for the results.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct MemCgroupReport {
    /// False when no limit could be set (`reason` says why).
    pub applied: bool,
    pub reason: Option<String>,
    pub limit_mb: u64,
    pub max_usage_mb: f64,
    /// Times the usage hit the limit (the kernel then reclaimed page cache).
    pub failcnt: u64,
    /// Page cache and anonymous memory charged at the end (memory.stat: cache, rss).
    pub cache_mb: f64,
    pub rss_mb: f64,
}

impl MemLimit {
    /// A group named after `tag` with `limit_mb`; where none can be made, a warning on stderr.
    pub fn new(tag: &str, limit_mb: u64) -> MemLimit {
        let limit = MemCgroup::create(tag, limit_mb);
        if let Err(why) = &limit {
            eprintln!("warning: {tag} runs without a memory limit: {why}");
        }
        MemLimit(limit)
    }

    /// The group's directory, for the child to [`join`].
    pub fn path(&self) -> Option<PathBuf> {
        self.0.as_ref().ok().map(|g| g.path.clone())
    }

    /// What holds the OS page cache, for a configuration's description.
    pub fn describe(&self) -> String {
        match &self.0 {
            Ok(g) => format!("in a {} MB memory cgroup", g.limit_bytes >> 20),
            Err(why) => format!("NOT limited ({why})"),
        }
    }

    /// The figures after the child ran in it.
    pub fn report(&self) -> MemCgroupReport {
        match &self.0 {
            Ok(g) => g.report(),
            Err(why) => MemCgroupReport {
                reason: Some(why.clone()),
                ..Default::default()
            },
        }
    }
}

impl MemCgroup {
    /// Makes the group with `limit_mb`, or says why it cannot.
    fn create(tag: &str, limit_mb: u64) -> Result<MemCgroup, String> {
        if !Path::new(ROOT).join("memory.limit_in_bytes").exists() {
            return Err(format!("no cgroup v1 memory controller at {ROOT}"));
        }
        let path = Path::new(ROOT).join(format!("bpe-bench-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir(&path);
        std::fs::create_dir(&path).map_err(|e| format!("cannot create {}: {e}", path.display()))?;
        let g = MemCgroup {
            path,
            limit_bytes: limit_mb << 20,
        };
        std::fs::write(
            g.path.join("memory.limit_in_bytes"),
            g.limit_bytes.to_string(),
        )
        .map_err(|e| format!("cannot set memory.limit_in_bytes: {e}"))?;
        Ok(g)
    }

    fn report(&self) -> MemCgroupReport {
        let num = |f: &str| -> u64 {
            std::fs::read_to_string(self.path.join(f))
                .ok()
                .and_then(|s| s.trim().parse().ok())
                .unwrap_or(0)
        };
        let stat = std::fs::read_to_string(self.path.join("memory.stat")).unwrap_or_default();
        let field = |name: &str| -> f64 {
            stat.lines()
                .find_map(|l| {
                    l.strip_prefix(name)?
                        .strip_prefix(' ')?
                        .trim()
                        .parse::<u64>()
                        .ok()
                })
                .unwrap_or(0) as f64
                / 1048576.0
        };
        MemCgroupReport {
            applied: true,
            reason: None,
            limit_mb: self.limit_bytes >> 20,
            max_usage_mb: num("memory.max_usage_in_bytes") as f64 / 1048576.0,
            failcnt: num("memory.failcnt"),
            cache_mb: field("cache"),
            rss_mb: field("rss"),
        }
    }
}

impl Drop for MemCgroup {
    fn drop(&mut self) {
        // Its process has exited; what it charged goes to the parent group.
        let _ = std::fs::remove_dir(&self.path);
    }
}

/// The child's side: moves this process into the group at `path`.
pub fn join(path: &Path) -> anyhow::Result<()> {
    std::fs::write(path.join("cgroup.procs"), std::process::id().to_string())
        .map_err(|e| anyhow::anyhow!("cannot join the memory cgroup {}: {e}", path.display()))
}
