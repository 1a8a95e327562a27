//! The physical reference, measured by each run on the file system it cares about: random O_DIRECT
//! read latency at queue depth 1 and 4, sequential O_DIRECT read and write bandwidth (1 MiB
//! requests), and, where `fio` is installed, fio's figures on the same file system.

use bpe_core::AlignedBuf;
use rand::{rngs::StdRng, Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Latency {
    pub mean_us: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub iops: f64,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Reference {
    pub dir: PathBuf,
    pub file_mib: u64,
    /// False where the file system refused O_DIRECT (figures then include the page cache).
    pub direct_io: bool,
    pub seq_write_mb_s: f64,
    pub seq_read_mb_s: f64,
    /// 4 KiB random reads at queue depth 1 (SQLite's page size: the extension's slot size).
    pub rand_read_4k_qd1: Latency,
    pub rand_read_8k_qd1: Latency,
    /// 8 KiB random reads from 4 threads.
    pub rand_read_8k_qd4: Latency,
    /// fio's figures on the same file system, when fio is installed.
    pub fio: Option<serde_json::Value>,
}

/// The size of the reference's scratch file a run asks for, MiB: --reference-mib, or 1024 (256
/// with --quick).
pub fn reference_mib(c: &crate::args::CommonArgs) -> u64 {
    c.reference_mib.unwrap_or(if c.quick { 256 } else { 1024 })
}

/// The reference for a run on its extension's file system (None with --reference-mib 0).
pub fn measure_reference(
    c: &crate::args::CommonArgs,
    storage: &crate::storage::Storage,
) -> anyhow::Result<Option<Reference>> {
    of(storage, reference_mib(c))
}

/// The reference on `storage`'s extension file system with a scratch file of `mib` MiB (None
/// for 0).
pub fn of(storage: &crate::storage::Storage, mib: u64) -> anyhow::Result<Option<Reference>> {
    if mib == 0 {
        return Ok(None);
    }
    let sp = crate::progress::spinner("reference");
    sp.set_message(format!("measuring {}", storage.ext_dir.display()));
    let r = measure(&storage.ext_dir, mib)?;
    sp.finish_and_clear();
    Ok(Some(r))
}

/// Measures `dir` with a scratch file of `mib` MiB, removed afterwards.
pub fn measure(dir: &Path, mib: u64) -> anyhow::Result<Reference> {
    let path = dir.join(format!("bench-reference-{}.tmp", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let guard = RemoveOnDrop(path.clone());
    let (file, direct_io) = open(&path)?;
    let mut r = Reference {
        dir: dir.to_path_buf(),
        file_mib: mib,
        direct_io,
        ..Default::default()
    };
    let mut buf = AlignedBuf::new(MIB as usize);
    buf.iter_mut()
        .enumerate()
        .for_each(|(i, b)| *b = (i * 7 + 3) as u8);
    let t = Instant::now();
    for i in 0..mib {
        file.write_all_at(&buf, i * MIB)?;
    }
    file.sync_data()?;
    r.seq_write_mb_s = mib as f64 / t.elapsed().as_secs_f64();
    // Into the core's readahead buffer (one huge page): a request in one piece, as the core's
    // readahead makes it (see bpe_core::Scratch).
    let mut read_buf = bpe_core::Scratch::new(MIB as usize);
    let t = Instant::now();
    for i in 0..mib {
        file.read_exact_at(&mut read_buf, i * MIB)?;
    }
    r.seq_read_mb_s = mib as f64 / t.elapsed().as_secs_f64();
    let budget = Duration::from_millis(1500);
    r.rand_read_4k_qd1 = random_reads(&file, mib * MIB, 4096, 1, budget);
    r.rand_read_8k_qd1 = random_reads(&file, mib * MIB, 8192, 1, budget);
    r.rand_read_8k_qd4 = random_reads(&file, mib * MIB, 8192, 4, budget);
    drop(file);
    r.fio = fio(&path);
    drop(guard);
    Ok(r)
}

/// A written scratch file on the extension's file system for re-measuring 4 KiB QD1 reads
/// right before and after one configuration: this disk's latency drifts by the hour, so a limit
/// computed from the figure taken minutes earlier at the run's start can be off by a third.
pub struct Probe {
    file: File,
    len: u64,
    _guard: RemoveOnDrop,
}

/// MiB of the probe's file. O_DIRECT reads bypass the OS page cache, so a file smaller than the
/// run-start reference's measures the same latency and is written in a fraction of the time.
const PROBE_MIB: u64 = 256;

impl Probe {
    /// Writes the probe's file in `dir` (None if the file system refuses O_DIRECT).
    pub fn new(dir: &Path) -> anyhow::Result<Option<Probe>> {
        let path = dir.join(format!("bench-probe-{}.tmp", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let guard = RemoveOnDrop(path.clone());
        let (file, direct_io) = open(&path)?;
        if !direct_io {
            return Ok(None);
        }
        let mut buf = AlignedBuf::new(MIB as usize);
        buf.iter_mut()
            .enumerate()
            .for_each(|(i, b)| *b = (i * 13 + 1) as u8);
        for i in 0..PROBE_MIB {
            file.write_all_at(&buf, i * MIB)?;
        }
        file.sync_data()?;
        Ok(Some(Probe {
            file,
            len: PROBE_MIB * MIB,
            _guard: guard,
        }))
    }

    /// 4 KiB random O_DIRECT reads at queue depth 1 for 1.5 s.
    pub fn rand_read_4k_qd1(&self) -> Latency {
        random_reads(&self.file, self.len, 4096, 1, Duration::from_millis(1500))
    }
}

fn open(path: &Path) -> anyhow::Result<(File, bool)> {
    let mut o = OpenOptions::new();
    o.read(true).write(true).create_new(true);
    match o.clone().custom_flags(libc::O_DIRECT).open(path) {
        Ok(f) => Ok((f, true)),
        Err(_) => {
            let _ = std::fs::remove_file(path);
            Ok((o.open(path)?, false))
        }
    }
}

/// `threads` threads each issuing one `size`-byte read at a time at random aligned offsets.
fn random_reads(file: &File, len: u64, size: usize, threads: usize, budget: Duration) -> Latency {
    let blocks = len / size as u64;
    let mut all: Vec<f64> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                s.spawn(move || {
                    let mut rng = StdRng::seed_from_u64(42 + t as u64);
                    let mut buf = AlignedBuf::new(size);
                    let mut lat = Vec::new();
                    let start = Instant::now();
                    while start.elapsed() < budget && lat.len() < 200_000 {
                        let off = rng.gen_range(0..blocks) * size as u64;
                        let t = Instant::now();
                        if file.read_exact_at(&mut buf, off).is_err() {
                            break;
                        }
                        lat.push(t.elapsed().as_secs_f64() * 1e6);
                    }
                    lat
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().unwrap_or_default())
            .collect()
    });
    if all.is_empty() {
        return Latency::default();
    }
    all.sort_by(|a, b| a.total_cmp(b));
    let n = all.len();
    let mean = all.iter().sum::<f64>() / n as f64;
    Latency {
        mean_us: mean,
        p50_us: all[n / 2],
        p99_us: all[(n * 99 / 100).min(n - 1)],
        iops: n as f64 / budget.as_secs_f64(),
    }
}

/// fio's random-read latency (8 KiB, QD1) and sequential read bandwidth on `path`, if installed.
fn fio(path: &Path) -> Option<serde_json::Value> {
    let which = std::process::Command::new("sh")
        .args(["-c", "command -v fio"])
        .output()
        .ok()?;
    if !which.status.success() {
        return None;
    }
    let file = path.with_extension("fio");
    let _guard = RemoveOnDrop(file.clone());
    let run = |name: &str, rw: &str, bs: &str| -> Option<serde_json::Value> {
        let out = std::process::Command::new("fio")
            .args([
                &format!("--name={name}"),
                &format!("--filename={}", file.display()),
                &format!("--rw={rw}"),
                &format!("--bs={bs}"),
                "--direct=1",
                "--iodepth=1",
                "--size=256M",
                "--runtime=3",
                "--time_based",
                "--output-format=json",
            ])
            .output()
            .ok()?;
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
        let read = &v["jobs"][0]["read"];
        Some(serde_json::json!({
            "iops": read["iops"],
            "bw_mb_s": read["bw_bytes"].as_f64().map(|b| b / MIB as f64),
            "mean_lat_us": read["lat_ns"]["mean"].as_f64().map(|n| n / 1000.0),
        }))
    };
    Some(serde_json::json!({
        "randread_8k_qd1": run("randread", "randread", "8k"),
        "read_1m_seq": run("seqread", "read", "1m"),
    }))
}

struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}
