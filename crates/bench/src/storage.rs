//! Where the files go and what the data device is: every result records both.

use crate::args::CommonArgs;
use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// The data device as the benchmark saw it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct DataDevice {
    /// `emulated:hdd`, ..., or `real`.
    pub name: String,
    /// In-process emulation (per-request latency, IOPS cap); false for a real device.
    pub emulated: bool,
    pub latency_us: u64,
    /// 0: no cap.
    pub iops: u32,
}

impl DataDevice {
    pub fn parse(s: &str) -> anyhow::Result<Self> {
        let (latency_us, iops) = match s {
            "emulated:hdd" => (8000, 150),
            "emulated:san" => (1000, 0),
            "emulated:gp3" => (1000, 3000),
            "emulated:ssd" => (0, 0),
            "real" | "none" => {
                return Ok(DataDevice {
                    name: "real".into(),
                    emulated: false,
                    latency_us: 0,
                    iops: 0,
                })
            }
            _ => bail!(
                "unknown data device {s:?}: use emulated:hdd, emulated:san, emulated:gp3, emulated:ssd or real"
            ),
        };
        Ok(DataDevice {
            name: s.into(),
            emulated: true,
            latency_us,
            iops,
        })
    }

    /// No emulation: the database read straight from the disk it is on.
    pub fn none() -> Self {
        DataDevice::parse("real").expect("known device")
    }

    /// Seconds one request takes at queue depth 1 under the emulation (0 for a real device).
    pub fn emulated_request_s(&self) -> f64 {
        let lat = self.latency_us as f64 / 1e6;
        let gap = if self.iops > 0 {
            1.0 / self.iops as f64
        } else {
            0.0
        };
        lat.max(gap)
    }
}

/// The storage of one benchmark run.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Storage {
    pub data_device: DataDevice,
    pub data_dir: PathBuf,
    pub ext_dir: PathBuf,
    /// File system types (from /proc/mounts) of the two directories.
    pub data_fs: String,
    pub ext_fs: String,
}

impl Storage {
    pub fn from_args(c: &CommonArgs, bench: &str) -> anyhow::Result<Self> {
        let ext_dir = match &c.ext_dir {
            Some(d) => d.clone(),
            None => std::env::current_dir()?.join("bpe-bench-work"),
        };
        std::fs::create_dir_all(&ext_dir)
            .with_context(|| format!("creating {}", ext_dir.display()))?;
        let ext_dir = ext_dir.canonicalize()?;
        let data_dir = match &c.data_dir {
            Some(d) => d.clone(),
            None => ext_dir.join(format!("data-{bench}")),
        };
        std::fs::create_dir_all(&data_dir)
            .with_context(|| format!("creating {}", data_dir.display()))?;
        let data_dir = data_dir.canonicalize()?;
        let device = match (&c.data_device, &c.data_dir) {
            (Some(d), _) => DataDevice::parse(d)?,
            (None, Some(_)) => DataDevice::none(),
            (None, None) => DataDevice::parse("emulated:hdd")?,
        };
        let ext_fs = fs_type(&ext_dir);
        if ext_fs == "tmpfs" || ext_fs == "ramfs" {
            eprintln!(
                "warning: {} is on {ext_fs}: the extension cannot use O_DIRECT there; use --ext-dir on a disk",
                ext_dir.display()
            );
        }
        Ok(Storage {
            data_device: device,
            data_fs: fs_type(&data_dir),
            data_dir,
            ext_fs,
            ext_dir,
        })
    }

    /// A fresh path for an extension file (the core refuses an existing one).
    pub fn extension_path(&self, tag: &str) -> PathBuf {
        let p = self
            .ext_dir
            .join(format!("bench-{tag}-{}.bpe", std::process::id()));
        let _ = std::fs::remove_file(&p);
        p
    }
}

/// The file system type of the mount holding `path` (longest matching mount point).
pub fn fs_type(path: &Path) -> String {
    let Ok(mounts) = std::fs::read_to_string("/proc/mounts") else {
        return "unknown".into();
    };
    let mut best = (0, "unknown".to_string());
    for line in mounts.lines() {
        let mut f = line.split_whitespace();
        let (Some(_dev), Some(mnt), Some(fs)) = (f.next(), f.next(), f.next()) else {
            continue;
        };
        let mnt = mnt.replace("\\040", " ");
        if path.starts_with(&mnt) && mnt.len() >= best.0 {
            best = (mnt.len(), fs.to_string());
        }
    }
    best.1
}

/// Total size of a database and its WAL.
pub fn db_bytes(path: &Path) -> u64 {
    let wal = PathBuf::from(format!("{}-wal", path.display()));
    [path.to_path_buf(), wal]
        .iter()
        .filter_map(|p| std::fs::metadata(p).ok())
        .map(|m| m.len())
        .sum()
}

/// True when `path` holds a complete load (its `.loaded` marker exists) and no reload was asked.
pub fn is_loaded(path: &Path, reload: bool) -> bool {
    !reload && path.exists() && marker(path).exists()
}

/// Removes a database, its WAL, shared memory and load marker, before loading it anew.
pub fn remove_db(path: &Path) {
    for suffix in ["", "-wal", "-shm", ".loaded"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
}

/// Records a complete load, with what the loader wants to remember (e.g. a row count).
pub fn mark_loaded(path: &Path, note: &str) -> std::io::Result<()> {
    std::fs::write(marker(path), format!("{note}\n"))
}

pub fn marker(path: &Path) -> PathBuf {
    PathBuf::from(format!("{}.loaded", path.display()))
}
