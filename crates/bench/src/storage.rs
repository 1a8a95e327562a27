//! Where the files go and what the data device is: every result records both.

use crate::args::CommonArgs;
use crate::slow_volume::{SlowVolume, VolumeInfo, VolumePreset};
use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// The data device as the benchmark saw it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct DataDevice {
    /// `emulated:hdd`, ..., or `real`.
    pub name: String,
    /// In-process emulation of the device's costs; false for a real device.
    pub emulated: bool,
    /// What the emulation charges (all zero for a real device).
    pub model: Emulation,
}

/// An emulated device's costs in the units of the `BPE_DATA_*` variables (µs, MB/s of 10^6
/// bytes, IOPS; 0: free or unlimited). See [`bpe_core::DeviceEmulation`] for the model.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Emulation {
    pub read_latency_us: u64,
    pub write_latency_us: u64,
    pub sync_latency_us: u64,
    pub read_mb_s: u64,
    pub write_mb_s: u64,
    pub read_iops: u32,
    pub write_iops: u32,
}

impl Emulation {
    /// The same latency for reads, writes and syncs, the same bandwidth and IOPS cap both ways.
    pub fn symmetric(latency_us: u64, mb_s: u64, iops: u32) -> Self {
        Emulation {
            read_latency_us: latency_us,
            write_latency_us: latency_us,
            sync_latency_us: latency_us,
            read_mb_s: mb_s,
            write_mb_s: mb_s,
            read_iops: iops,
            write_iops: iops,
        }
    }

    pub fn to_core(self) -> bpe_core::DeviceEmulation {
        let us = std::time::Duration::from_micros;
        bpe_core::DeviceEmulation {
            read_latency: us(self.read_latency_us),
            write_latency: us(self.write_latency_us),
            sync_latency: us(self.sync_latency_us),
            read_bandwidth: self.read_mb_s.saturating_mul(1_000_000),
            write_bandwidth: self.write_mb_s.saturating_mul(1_000_000),
            read_iops: self.read_iops,
            write_iops: self.write_iops,
        }
    }
}

impl DataDevice {
    /// What the in-process emulation charges, e.g. "read 8000 us + 150 MB/s, at most 150 IOPS;
    /// write ...; sync 8000 us"; None for a real device.
    pub fn emulation(&self) -> Option<String> {
        self.emulated.then(|| self.model.to_core().to_string())
    }

    pub fn parse(s: &str) -> anyhow::Result<Self> {
        let model = match s {
            // A 7200 rpm disk: a seek and half a turn per request, either way.
            "emulated:hdd" => Emulation::symmetric(8000, 150, 150),
            // A SAN LUN: a network round trip and the array's cache, no per-volume cap.
            "emulated:san" => Emulation::symmetric(1000, 400, 0),
            // An AWS gp3 volume at its baseline.
            "emulated:gp3" => Emulation::symmetric(1000, 125, 3000),
            // A SATA SSD: fast reads and writes, a slower cache flush.
            "emulated:ssd" => Emulation {
                sync_latency_us: 1000,
                ..Emulation::symmetric(100, 500, 0)
            },
            "real" | "none" => {
                return Ok(DataDevice {
                    name: "real".into(),
                    emulated: false,
                    model: Emulation::default(),
                })
            }
            _ => match s.strip_prefix("emulated:").and_then(custom_emulation) {
                Some(d) => d,
                None => bail!(
                    "unknown data device {s:?}: use emulated:hdd, emulated:san, emulated:gp3, emulated:ssd, emulated:<N>ms or emulated:<N>us (optionally :<IOPS>[:<MB/s>]), or real"
                ),
            },
        };
        let device = DataDevice {
            name: s.into(),
            emulated: true,
            model,
        };
        device
            .model
            .to_core()
            .validate()
            .map_err(|e| anyhow::anyhow!("data device {s:?}: {e}"))?;
        Ok(device)
    }

    /// An emulated device named `name`: `latency_us` per read, write and sync, at most `iops`
    /// requests a second each way (0: no cap), unlimited bandwidth.
    pub fn emulated(name: &str, latency_us: u64, iops: u32) -> Self {
        DataDevice {
            name: name.into(),
            emulated: true,
            model: Emulation::symmetric(latency_us, 0, iops),
        }
    }

    /// No emulation: the database read straight from the disk it is on.
    pub fn none() -> Self {
        DataDevice::parse("real").expect("known device")
    }

    /// Seconds one read of `bytes` takes at queue depth 1 under the emulation (0 for a real
    /// device): its latency plus its transfer, or the IOPS cap's spacing if that is longer.
    pub fn emulated_read_s(&self, bytes: u64) -> f64 {
        if !self.emulated {
            return 0.0;
        }
        let m = &self.model;
        let transfer = if m.read_mb_s > 0 {
            bytes as f64 / (m.read_mb_s as f64 * 1e6)
        } else {
            0.0
        };
        let gap = if m.read_iops > 0 {
            1.0 / m.read_iops as f64
        } else {
            0.0
        };
        (m.read_latency_us as f64 / 1e6 + transfer).max(gap)
    }
}

/// `2ms`, `500us`, `8ms:150`, `8ms:150:150`: a latency per read, write and sync, an optional
/// IOPS cap and an optional bandwidth in MB/s (both ways).
fn custom_emulation(spec: &str) -> Option<Emulation> {
    let mut parts = spec.split(':');
    let latency = parts.next()?;
    let iops = parts.next().map_or(Some(0), |i| i.parse().ok())?;
    let mb_s = parts.next().map_or(Some(0), |b| b.parse().ok())?;
    if parts.next().is_some() {
        return None;
    }
    let us = match (latency.strip_suffix("ms"), latency.strip_suffix("us")) {
        (Some(ms), _) => ms.parse::<u64>().ok()?.checked_mul(1000)?,
        (None, Some(us)) => us.parse().ok()?,
        _ => return None,
    };
    Some(Emulation::symmetric(us, mb_s, iops))
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
    /// The data directory was named (--data-dir), so it may be a slow volume of its own: runs
    /// on "the fast disk" use a copy of the database in the extension's directory.
    #[serde(skip)]
    pub own_data_dir: bool,
    /// The kernel-throttled volume the databases are on (`--data-device slowvol:...`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_volume: Option<VolumeInfo>,
    /// The volume itself: taken down when the last copy of this storage is dropped.
    #[serde(skip)]
    volume: Option<std::sync::Arc<SlowVolume>>,
}

impl Storage {
    pub fn from_args(c: &CommonArgs, bench: &str) -> anyhow::Result<Self> {
        Self::from_args_or(c, bench, "emulated:hdd")
    }

    /// As [`Storage::from_args`], with `default_device` when neither --data-device nor
    /// --data-dir is given.
    pub fn from_args_or(c: &CommonArgs, bench: &str, default_device: &str) -> anyhow::Result<Self> {
        // A slow volume is a device of its own, not one of DataDevice's.
        let preset = c.data_device.as_deref().map(VolumePreset::parse);
        if let Some(preset) = preset.transpose()?.flatten() {
            return Self::on_slow_volume(c, bench, &preset);
        }
        if c.keep_volume {
            bail!("--keep-volume keeps a slow volume: it needs --data-device slowvol:...");
        }
        let ext_dir = match &c.ext_dir {
            Some(d) => d.clone(),
            None => std::env::current_dir()?.join("bpe-bench-work"),
        };
        let data_dir = match &c.data_dir {
            Some(d) => d.clone(),
            None => ext_dir.join(format!("data-{bench}")),
        };
        let device = match (&c.data_device, &c.data_dir) {
            (Some(d), _) => DataDevice::parse(d)?,
            (None, Some(_)) => DataDevice::none(),
            (None, None) => DataDevice::parse(default_device)?,
        };
        let mut storage = Storage::at(device, &ext_dir, &data_dir)?;
        storage.own_data_dir = c.data_dir.is_some();
        Ok(storage)
    }

    /// The databases on the slow volume of `preset` (made now, or a kept one found), the
    /// extension files in --ext-dir.
    fn on_slow_volume(c: &CommonArgs, bench: &str, preset: &VolumePreset) -> anyhow::Result<Self> {
        if c.data_dir.is_some() {
            bail!("--data-dir and --data-device {} both say where the databases go: the slow volume is mounted by the benchmark, so leave --data-dir out", preset.name);
        }
        let volume = SlowVolume::up(preset, c.keep_volume)?;
        let ext_dir = match &c.ext_dir {
            Some(d) => d.clone(),
            None => std::env::current_dir()?.join("bpe-bench-work"),
        };
        let data_dir = volume.info.mount.join(format!("data-{bench}"));
        let device = DataDevice {
            name: preset.name.clone(),
            ..DataDevice::none()
        };
        let mut storage = Storage::at(device, &ext_dir, &data_dir)?;
        // Runs on "the fast disk" use a copy in the extension's directory.
        storage.own_data_dir = true;
        storage.data_volume = Some(volume.info.clone());
        storage.volume = Some(std::sync::Arc::new(volume));
        Ok(storage)
    }

    /// Moves this process, and every configuration's process it starts from now on, under the
    /// slow volume's throttle (nothing without one). Call after loading and copying the data.
    pub fn enter_data_device(&self) -> anyhow::Result<()> {
        match &self.volume {
            Some(v) => v.enter(),
            None => Ok(()),
        }
    }

    /// What the data device is, for the printed results: the slow volume's description, the
    /// emulation, or a real device.
    pub fn describe_data_device(&self) -> String {
        let d = &self.data_device;
        match (&self.data_volume, d.emulation()) {
            (Some(v), _) => format!("{}: {}", d.name, v.description),
            (None, Some(e)) => format!("{} (in-process: {e})", d.name),
            (None, None) => "real (no emulation)".to_string(),
        }
    }

    /// Extension files in `ext_dir` and databases in `data_dir` (made if missing), read through
    /// `device`.
    pub fn at(device: DataDevice, ext_dir: &Path, data_dir: &Path) -> anyhow::Result<Self> {
        let canonical = |dir: &Path| -> anyhow::Result<PathBuf> {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
            Ok(dir.canonicalize()?)
        };
        let ext_dir = canonical(ext_dir)?;
        let data_dir = canonical(data_dir)?;
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
            own_data_dir: false,
            data_volume: None,
            volume: None,
        })
    }

    /// The database `db` (of benchmark `bench`) on the fast disk: `db` itself, or with a data
    /// directory of its own, a copy in the extension's directory (made again when it differs or
    /// `reload` is asked).
    pub fn on_fast_disk(&self, bench: &str, db: &Path, reload: bool) -> anyhow::Result<PathBuf> {
        if !self.own_data_dir {
            return Ok(db.to_path_buf());
        }
        let dir = self.ext_dir.join(format!("data-{bench}-fast"));
        std::fs::create_dir_all(&dir)?;
        let copy = dir.join(db.file_name().context("the database has no file name")?);
        if reload || db_bytes(&copy) != db_bytes(db) {
            eprintln!("copying the database to the fast disk for the runs there");
            std::fs::copy(db, &copy)?;
        }
        Ok(copy)
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

/// The database at `path` as `fill` loads it, unless a complete load is there already (and no
/// reload was asked): the data is loaded once and kept for later runs (loading is not timed).
/// `fill` gets a connection with SQLite's default VFS and returns a note to keep with the load
/// (a row count, say); returns that note, read back when the load was already there.
pub fn load_once(
    path: &Path,
    reload: bool,
    fill: impl FnOnce(&rusqlite::Connection) -> anyhow::Result<String>,
) -> anyhow::Result<String> {
    let marker = PathBuf::from(format!("{}.loaded", path.display()));
    if !reload && path.exists() {
        if let Ok(note) = std::fs::read_to_string(&marker) {
            return Ok(note.trim().to_string());
        }
    }
    for suffix in ["", "-wal", "-shm", ".loaded"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    let conn = crate::db::open_for_load(path)?;
    let note = fill(&conn)?;
    // Everything into the database file, so every configuration starts from the same file.
    conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE);")?;
    drop(conn);
    std::fs::write(&marker, format!("{note}\n"))?;
    Ok(note)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        common: CommonArgs,
    }

    fn common(args: &[&str]) -> CommonArgs {
        Cli::try_parse_from(std::iter::once("bench").chain(args.iter().copied()))
            .unwrap()
            .common
    }

    fn error(args: &[&str]) -> String {
        Storage::from_args(&common(args), "test")
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn a_slow_volume_and_a_data_dir_are_refused_together() {
        let e = error(&["--data-device", "slowvol:hdd", "--data-dir", "/nowhere"]);
        assert!(e.contains("--data-dir") && e.contains("slowvol:hdd"), "{e}");
    }

    #[test]
    fn keep_volume_needs_a_slow_volume() {
        let e = error(&["--keep-volume", "--data-device", "emulated:hdd"]);
        assert!(e.contains("--keep-volume"), "{e}");
    }

    #[test]
    fn an_unknown_slow_volume_is_refused_before_anything_is_made() {
        let e = error(&["--data-device", "slowvol:quick"]);
        assert!(
            e.contains("slowvol:quick") && e.contains("slowvol:gp3"),
            "{e}"
        );
    }

    #[test]
    fn other_devices_have_no_volume_and_say_what_they_are() {
        let dir = tempfile::tempdir().unwrap();
        let ext = dir.path().display().to_string();
        let s = Storage::from_args(
            &common(&["--data-device", "emulated:hdd", "--ext-dir", &ext]),
            "test",
        )
        .unwrap();
        assert!(s.data_volume.is_none());
        s.enter_data_device().unwrap();
        assert!(s
            .describe_data_device()
            .starts_with("emulated:hdd (in-process"));
        let json = serde_json::to_value(&s).unwrap();
        assert!(json.get("data_volume").is_none(), "{json}");
    }
}
