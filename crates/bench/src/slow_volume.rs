//! A real, kernel-throttled slow data device: `--data-device slowvol:hdd|gp3|<IOPS>`.
//!
//! The benchmark makes an ext4 file system on a loop device (direct I/O to a sparse image under
//! /var/tmp, so the host's page cache never answers for it), mounts it under /mnt, and caps the
//! read IOPS that the processes of a cgroup v1 blkio group may issue to it. The benchmark's own
//! process enters the group before its first configuration (its children, stock and bpe alike,
//! inherit it, and so do their cold-cache drops); the throttle is per device, so the extension's
//! and the reference's I/O on the fast disk is not slowed. Loading and the copy for "the fast
//! disk" happen before, unthrottled.
//!
//! The volume is removed when the run ends unless `--keep-volume` is given; a later run with the
//! same read IOPS then finds it mounted and reuses it (and the database loaded on it).
//!
//! The throttle shapes throughput, not each request: at queue depth 1 the mean latency is
//! 1/IOPS, but single requests can come back early and others wait a whole throttle slice.
//! Below the cap it adds no latency at all; a `+<N>ms` or `+<N>us` suffix
//! (`slowvol:gp3+1ms`) adds a network volume's: the loop device's image is then served through
//! FUSE, each request held that long ([`crate::latency_volume`]).

use crate::latency_volume;
use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::process::Command;

const BLKIO_ROOT: &str = "/sys/fs/cgroup/blkio";

/// Size of the sparse image: only what is written takes disk space.
pub const IMAGE_GIB: u64 = 16;

/// `slowvol:hdd` (150 IOPS and 200 MiB/s, a 7200 rpm disk), `slowvol:gp3` (3000 and 125 MiB/s,
/// an EBS gp3 volume's baseline): reads and writes each held to those figures, as the device
/// named holds them; `slowvol:<IOPS>` or `slowvol:<IOPS>:<MiB/s>`: reads only.
///
/// Writes are held where the writing process submits them itself (O_DIRECT, and the flush of
/// an `fsync`, which is where SQLite's commits and checkpoints wait); cgroup v1 does not charge
/// the kernel's background writeback to the group, so dirty pages it flushes on its own go
/// unthrottled.
///
/// The bandwidth cap matters for large requests: the loop device takes requests of up to 1.25
/// MiB and the kernel's readahead makes them, so with an IOPS cap alone a buffered sequential
/// read would run at IOPS x 1.25 MiB, far above what the device named allows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VolumePreset {
    /// As given, e.g. `slowvol:hdd`.
    pub name: String,
    pub read_iops: u32,
    /// Read bandwidth cap, MiB/s (None: no cap).
    pub read_mib_s: Option<u32>,
    /// Write caps, IOPS and MiB/s (None: writes are not held).
    pub write_iops: Option<u32>,
    pub write_mib_s: Option<u32>,
    /// Each request's latency, µs (None: the fast disk's own, under the throttle).
    pub latency_us: Option<u32>,
}

impl VolumePreset {
    /// The preset `s` names; None when `s` is not a `slowvol:` device at all.
    pub fn parse(s: &str) -> anyhow::Result<Option<VolumePreset>> {
        let Some(spec) = s.strip_prefix("slowvol:") else {
            return Ok(None);
        };
        let (spec, latency_us) = match spec.split_once('+') {
            None => (spec, None),
            Some((spec, latency)) => match parse_latency_us(latency) {
                Some(us) => (spec, Some(us)),
                None => bail!(
                    "bad latency in slow volume {s:?}: write it after the preset as +<N>ms or +<N>us (e.g. slowvol:gp3+1ms), a whole number above 0 and at most 1000 ms"
                ),
            },
        };
        let positive = |n: &str| n.parse::<u32>().ok().filter(|&v| v > 0);
        let (read_iops, read_mib_s) = match spec.split_once(':') {
            _ if spec == "hdd" => (Some(150), Some(200)),
            _ if spec == "gp3" => (Some(3000), Some(125)),
            Some((iops, mib_s)) => match positive(mib_s) {
                Some(bw) => (positive(iops), Some(bw)),
                None => (None, None),
            },
            None => (positive(spec), None),
        };
        let Some(read_iops) = read_iops else {
            bail!(
                "unknown slow volume {s:?}: use slowvol:hdd (150 IOPS, 200 MiB/s, reads and writes each), slowvol:gp3 (3000, 125 MiB/s, reads and writes each), slowvol:<IOPS> or slowvol:<IOPS>:<MiB/s> (reads only; whole numbers above 0)"
            );
        };
        // The named devices hold writes as they hold reads.
        let named = spec == "hdd" || spec == "gp3";
        Ok(Some(VolumePreset {
            name: s.into(),
            read_iops,
            read_mib_s,
            write_iops: named.then_some(read_iops),
            write_mib_s: read_mib_s.filter(|_| named),
            latency_us,
        }))
    }

    /// What the results call the device.
    pub fn description(&self) -> String {
        let bandwidth =
            |mib_s: Option<u32>| mib_s.map_or(String::new(), |b| format!(", {b} MiB/s"));
        let writes = match self.write_iops {
            Some(w) => format!("; writes {w} IOPS{}", bandwidth(self.write_mib_s)),
            None => String::new(),
        };
        let latency = match self.latency_us {
            Some(us) => format!("; every request held {us} µs (FUSE under the loop device)"),
            None => String::new(),
        };
        format!(
            "kernel-throttled loop volume, {} read IOPS{}{writes} (cgroup v1 blkio){latency}",
            self.read_iops,
            bandwidth(self.read_mib_s)
        )
    }

    /// The name of its image, mount point and cgroup: one per IOPS and latency, so that a kept
    /// volume is found again by a run with the same preset.
    fn tag(&self) -> String {
        match self.latency_us {
            Some(us) => format!("bpe-bench-slowvol-{}-{us}us", self.read_iops),
            None => format!("bpe-bench-slowvol-{}", self.read_iops),
        }
    }
}

/// `1ms` or `800us` as µs: a whole number above 0, at most a second.
fn parse_latency_us(s: &str) -> Option<u32> {
    let (n, scale) = if let Some(ms) = s.strip_suffix("ms") {
        (ms, 1000)
    } else {
        (s.strip_suffix("us")?, 1)
    };
    let us = n.parse::<u32>().ok()?.checked_mul(scale)?;
    (1..=1_000_000).contains(&us).then_some(us)
}

/// The volume as the results record it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct VolumeInfo {
    /// `kernel-throttled loop volume, N read IOPS (cgroup v1 blkio)`.
    pub description: String,
    pub read_iops: u32,
    /// Read bandwidth cap, MiB/s (None: no cap).
    pub read_mib_s: Option<u32>,
    /// Write caps (None: writes not held; results from before writes were held have none).
    #[serde(default)]
    pub write_iops: Option<u32>,
    #[serde(default)]
    pub write_mib_s: Option<u32>,
    /// Each request's added latency, µs (None: none added).
    #[serde(default)]
    pub latency_us: Option<u32>,
    /// Where the FUSE file system serving the image with that latency is mounted.
    #[serde(default)]
    pub latency_mount: Option<PathBuf>,
    /// The image on the fast disk (behind the FUSE file system, when there is one).
    pub image: PathBuf,
    pub image_gib: u64,
    pub loop_device: String,
    pub mount: PathBuf,
    pub blkio_cgroup: PathBuf,
    /// A volume an earlier run kept (`--keep-volume`) was found and used.
    pub reused: bool,
    /// This run leaves it in place.
    pub kept: bool,
}

/// A mounted, throttled volume; taken down when dropped unless kept.
#[derive(Debug)]
pub struct SlowVolume {
    pub info: VolumeInfo,
    /// The blkio group this process was in before it entered the volume's.
    left_from: std::sync::Mutex<Option<PathBuf>>,
}

impl SlowVolume {
    /// Brings the volume of `preset` up (or finds a kept one), with its throttle set.
    pub fn up(preset: &VolumePreset, keep: bool) -> anyhow::Result<SlowVolume> {
        check_prerequisites()?;
        let tag = preset.tag();
        let image = PathBuf::from(format!("/var/tmp/{tag}.img"));
        let mount = PathBuf::from(format!("/mnt/{tag}"));
        let cgroup = Path::new(BLKIO_ROOT).join(&tag);
        // With a latency the loop device reaches the image through the FUSE server.
        let latency_mount = preset
            .latency_us
            .map(|_| PathBuf::from(format!("/mnt/{tag}-net")));
        let loop_file = match &latency_mount {
            Some(m) => m.join(latency_volume::IMAGE_NAME),
            None => image.clone(),
        };
        let existing = loop_device_of(&loop_file)?;
        let reused = existing.is_some() && is_mount_point(&mount);
        let loop_device = match existing {
            Some(dev) if reused => dev,
            stale => {
                // A run that died half-way, or a kept volume whose latency server has ended,
                // left parts behind: start again from nothing.
                take_down_leftovers(&mount, stale, latency_mount.as_deref())?;
                eprintln!(
                    "making the slow volume: {IMAGE_GIB} GiB sparse image {}, ext4 on a loop device, mounted at {}",
                    image.display(),
                    mount.display()
                );
                let _ = std::fs::remove_file(&image);
                std::fs::File::create(&image)
                    .and_then(|f| f.set_len(IMAGE_GIB << 30))
                    .with_context(|| format!("creating {}", image.display()))?;
                run("mkfs.ext4", &["-q", "-F", &path_str(&image)])?;
                if let (Some(m), Some(us)) = (&latency_mount, preset.latency_us) {
                    start_latency_server(&image, m, us)?;
                }
                let dev = run(
                    "losetup",
                    &["-f", "--show", "--direct-io=on", &path_str(&loop_file)],
                )?;
                std::fs::create_dir_all(&mount)?;
                // No background zeroing of inode tables: it would write to the volume during
                // the timed runs.
                run("mount", &["-o", "noinit_itable", &dev, &path_str(&mount)])?;
                dev
            }
        };
        let volume = SlowVolume {
            info: VolumeInfo {
                description: preset.description(),
                read_iops: preset.read_iops,
                read_mib_s: preset.read_mib_s,
                write_iops: preset.write_iops,
                write_mib_s: preset.write_mib_s,
                latency_us: preset.latency_us,
                latency_mount,
                image,
                image_gib: IMAGE_GIB,
                loop_device,
                mount,
                blkio_cgroup: cgroup,
                reused,
                kept: keep,
            },
            left_from: std::sync::Mutex::new(None),
        };
        volume.set_throttle()?;
        if reused {
            eprintln!(
                "reusing the slow volume kept at {}",
                volume.info.mount.display()
            );
        }
        Ok(volume)
    }

    /// Makes the blkio group (if missing) and caps its reads from and writes to the loop device
    /// (a kept volume's earlier caps are replaced: 0 removes one).
    fn set_throttle(&self) -> anyhow::Result<()> {
        let cg = &self.info.blkio_cgroup;
        std::fs::create_dir_all(cg)
            .with_context(|| format!("creating the blkio cgroup {}", cg.display()))?;
        let dev_name = self.info.loop_device.trim_start_matches("/dev/");
        let majmin = std::fs::read_to_string(format!("/sys/block/{dev_name}/dev"))
            .with_context(|| format!("reading the device number of {dev_name}"))?;
        let bytes_per_s = |mib_s: Option<u32>| mib_s.map_or(0, |b| u64::from(b) << 20);
        for (file, limit) in [
            (
                "blkio.throttle.read_iops_device",
                u64::from(self.info.read_iops),
            ),
            (
                "blkio.throttle.read_bps_device",
                bytes_per_s(self.info.read_mib_s),
            ),
            (
                "blkio.throttle.write_iops_device",
                self.info.write_iops.map_or(0, u64::from),
            ),
            (
                "blkio.throttle.write_bps_device",
                bytes_per_s(self.info.write_mib_s),
            ),
        ] {
            let rule = format!("{} {limit}", majmin.trim());
            std::fs::write(cg.join(file), &rule)
                .with_context(|| format!("setting {file} to {rule:?} in {}", cg.display()))?;
        }
        Ok(())
    }

    /// Moves this process (and so every process it starts from now on) into the volume's blkio
    /// group. Idempotent.
    pub fn enter(&self) -> anyhow::Result<()> {
        let mut left_from = self.left_from.lock().unwrap_or_else(|e| e.into_inner());
        if left_from.is_some() {
            return Ok(());
        }
        let current = own_blkio_cgroup().unwrap_or_else(|| PathBuf::from(BLKIO_ROOT));
        join(&self.info.blkio_cgroup)?;
        *left_from = Some(current);
        Ok(())
    }

    /// Leaves the group again and, unless kept, unmounts and removes everything it made.
    fn down(&mut self) -> anyhow::Result<()> {
        if let Some(previous) = self.left_from.lock().map(|mut g| g.take()).ok().flatten() {
            join(&previous)?;
        }
        let latency_mount = self.info.latency_mount.as_deref();
        if self.info.kept {
            let unmount_server = latency_mount
                .map(|m| format!("; umount {}", m.display()))
                .unwrap_or_default();
            eprintln!(
                "slow volume kept at {} (a later run with the same --data-device reuses it; remove it with `umount {}; losetup -d {}{unmount_server}; rm {}`)",
                self.info.mount.display(),
                self.info.mount.display(),
                self.info.loop_device,
                self.info.image.display()
            );
            return Ok(());
        }
        run("umount", &[&path_str(&self.info.mount)])?;
        run("losetup", &["-d", &self.info.loop_device])?;
        if let Some(m) = latency_mount {
            // Ends the server.
            run("umount", &[&path_str(m)])?;
            let _ = std::fs::remove_dir(m);
            let _ = std::fs::remove_file(self.info.image.with_extension("log"));
        }
        std::fs::remove_file(&self.info.image)?;
        let _ = std::fs::remove_dir(&self.info.mount);
        // Fails while a process is still in it (a child that outlived us): left for a later run.
        if let Err(e) = std::fs::remove_dir(&self.info.blkio_cgroup) {
            eprintln!(
                "warning: cannot remove {}: {e}",
                self.info.blkio_cgroup.display()
            );
        }
        Ok(())
    }
}

impl Drop for SlowVolume {
    fn drop(&mut self) {
        if let Err(e) = self.down() {
            eprintln!(
                "warning: taking the slow volume at {} down: {e:#}",
                self.info.mount.display()
            );
        }
    }
}

/// Root, the blkio controller and loop devices, or an error naming what is missing.
pub fn check_prerequisites() -> anyhow::Result<()> {
    // SAFETY: geteuid has no preconditions and touches no memory.
    if unsafe { libc::geteuid() } != 0 {
        bail!("the slow volume (--data-device slowvol:...) needs root: it mounts a loop device and sets a blkio throttle");
    }
    if !Path::new(BLKIO_ROOT)
        .join("blkio.throttle.read_iops_device")
        .exists()
    {
        bail!("the slow volume needs the cgroup v1 blkio controller at {BLKIO_ROOT}, which is missing");
    }
    if !Path::new("/dev/loop-control").exists() {
        bail!("the slow volume needs loop devices (/dev/loop-control is missing)");
    }
    for tool in ["losetup", "mkfs.ext4", "mount", "umount"] {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .output()
            .is_ok_and(|o| o.status.success());
        if !found {
            bail!("the slow volume needs {tool}, which is not installed");
        }
    }
    Ok(())
}

/// Starts the process serving `image` at `mount` with each request held `latency_us`
/// ([`latency_volume`]), and waits for the mount. Its own process group: a kept volume outlives
/// the run and the terminal's Ctrl-C.
fn start_latency_server(image: &Path, mount: &Path, latency_us: u32) -> anyhow::Result<()> {
    use std::os::unix::process::CommandExt;
    std::fs::create_dir_all(mount)?;
    let log_path = image.with_extension("log");
    let log = std::fs::File::create(&log_path)?;
    let mut server = Command::new(std::env::current_exe()?)
        .arg(latency_volume::SERVE_ARG)
        .arg(image)
        .arg(mount)
        .arg(latency_us.to_string())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(log)
        .process_group(0)
        .spawn()
        .context("starting the latency volume's server")?;
    let served = mount.join(latency_volume::IMAGE_NAME);
    for _ in 0..200 {
        if is_mount_point(mount) && served.exists() {
            return Ok(());
        }
        if let Some(status) = server.try_wait()? {
            let log = std::fs::read_to_string(&log_path).unwrap_or_default();
            bail!(
                "the latency volume's server ended ({status}): {}",
                log.trim()
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let _ = server.kill();
    bail!(
        "the latency volume's server did not mount {} within 10 s",
        mount.display()
    )
}

/// Unmounts and detaches what an earlier run left of a volume: the file system at `mount`, the
/// loop device under it and `loop_device` (found from the image when it could still be
/// reached), and the latency server's mount. When the server has died, the image behind the
/// loop device cannot be reached any more (the FUSE mount answers "not connected"), so the
/// loop device is found from `mount`'s entry in /proc/mounts instead.
fn take_down_leftovers(
    mount: &Path,
    loop_device: Option<String>,
    latency_mount: Option<&Path>,
) -> anyhow::Result<()> {
    let mounted_from = mount_source(mount);
    if mounted_from.is_some() {
        unmount(mount)?;
    }
    let mut devices: Vec<String> = loop_device.into_iter().collect();
    devices.extend(mounted_from.filter(|d| d.starts_with("/dev/loop")));
    devices.dedup();
    for dev in devices {
        run("losetup", &["-d", &dev])?;
    }
    if let Some(m) = latency_mount.filter(|m| is_mount_point(m)) {
        unmount(m)?;
    }
    Ok(())
}

/// `umount`, or a lazy one when the plain one fails (a dead FUSE server's mount, or a file
/// system whose device can no longer be written).
fn unmount(dir: &Path) -> anyhow::Result<()> {
    let dir = path_str(dir);
    if run("umount", &[&dir]).is_err() {
        run("umount", &["-l", &dir])?;
    }
    Ok(())
}

/// The device mounted at `dir`, from /proc/mounts.
fn mount_source(dir: &Path) -> Option<String> {
    let mounts = std::fs::read_to_string("/proc/mounts").ok()?;
    let dir = path_str(dir);
    mounts.lines().find_map(|l| {
        let mut fields = l.split_whitespace();
        let source = fields.next()?;
        (fields.next()? == dir).then(|| source.to_string())
    })
}

/// Runs `program` with `args`; its trimmed stdout, or an error with its stderr.
fn run(program: &str, args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new(program)
        .args(args)
        .output()
        .with_context(|| format!("running {program}"))?;
    if !out.status.success() {
        bail!(
            "{program} {} failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn path_str(p: &Path) -> String {
    p.display().to_string()
}

/// The loop device backed by `image`, if one is.
fn loop_device_of(image: &Path) -> anyhow::Result<Option<String>> {
    if !image.exists() {
        return Ok(None);
    }
    let out = run("losetup", &["-j", &path_str(image), "-O", "NAME", "-n"])?;
    Ok(out.lines().next().map(|l| l.trim().to_string()))
}

fn is_mount_point(dir: &Path) -> bool {
    mount_source(dir).is_some()
}

/// This process's blkio group (from /proc/self/cgroup), as a directory under the controller.
pub fn own_blkio_cgroup() -> Option<PathBuf> {
    let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    text.lines().find_map(|l| {
        let mut f = l.splitn(3, ':');
        let (_, controllers, path) = (f.next()?, f.next()?, f.next()?);
        controllers
            .split(',')
            .any(|c| c == "blkio")
            .then(|| Path::new(BLKIO_ROOT).join(path.trim_start_matches('/')))
    })
}

fn join(cgroup: &Path) -> anyhow::Result<()> {
    std::fs::write(cgroup.join("cgroup.procs"), std::process::id().to_string())
        .with_context(|| format!("moving this process into {}", cgroup.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_name_their_read_and_write_limits() {
        let p = |s| {
            let p = VolumePreset::parse(s).unwrap().unwrap();
            (p.read_iops, p.read_mib_s, p.write_iops, p.write_mib_s)
        };
        assert_eq!(p("slowvol:hdd"), (150, Some(200), Some(150), Some(200)));
        assert_eq!(p("slowvol:gp3"), (3000, Some(125), Some(3000), Some(125)));
        assert_eq!(p("slowvol:420"), (420, None, None, None));
        assert_eq!(p("slowvol:420:60"), (420, Some(60), None, None));
        let describe = |s| VolumePreset::parse(s).unwrap().unwrap().description();
        assert_eq!(
            describe("slowvol:gp3"),
            "kernel-throttled loop volume, 3000 read IOPS, 125 MiB/s; writes 3000 IOPS, 125 MiB/s (cgroup v1 blkio)"
        );
        assert_eq!(
            describe("slowvol:420:60"),
            "kernel-throttled loop volume, 420 read IOPS, 60 MiB/s (cgroup v1 blkio)"
        );
        assert_eq!(
            describe("slowvol:80"),
            "kernel-throttled loop volume, 80 read IOPS (cgroup v1 blkio)"
        );
    }

    #[test]
    fn a_latency_suffix_holds_every_request_and_names_its_own_volume() {
        let p = |s| VolumePreset::parse(s).unwrap().unwrap();
        let net = p("slowvol:gp3+1ms");
        assert_eq!(
            (net.read_iops, net.write_iops, net.latency_us),
            (3000, Some(3000), Some(1000))
        );
        assert_eq!(p("slowvol:420:60+800us").latency_us, Some(800));
        assert_eq!(p("slowvol:gp3").latency_us, None);
        assert!(net
            .description()
            .ends_with("; every request held 1000 µs (FUSE under the loop device)"));
        // A kept volume without the latency is not found again by a run with it, nor the reverse.
        assert_ne!(net.tag(), p("slowvol:gp3").tag());
        assert_ne!(net.tag(), p("slowvol:gp3+2ms").tag());
        for bad in [
            "slowvol:gp3+",
            "slowvol:gp3+1",
            "slowvol:gp3+0ms",
            "slowvol:gp3+1.5ms",
            "slowvol:gp3+1001ms",
            "slowvol:gp3+1s",
        ] {
            let e = VolumePreset::parse(bad).unwrap_err().to_string();
            assert!(e.contains(bad) && e.contains("+<N>ms"), "{bad}: {e}");
        }
    }

    #[test]
    fn other_devices_are_not_slow_volumes() {
        assert_eq!(VolumePreset::parse("emulated:hdd").unwrap(), None);
        assert_eq!(VolumePreset::parse("real").unwrap(), None);
    }

    #[test]
    fn bad_presets_are_refused_with_the_choices() {
        for bad in [
            "slowvol:",
            "slowvol:0",
            "slowvol:fast",
            "slowvol:-5",
            "slowvol:1.5",
            "slowvol:100:0",
            "slowvol:100:",
            "slowvol::100",
            "slowvol:hdd:100",
        ] {
            let e = VolumePreset::parse(bad).unwrap_err().to_string();
            assert!(e.contains(bad) && e.contains("slowvol:hdd"), "{bad}: {e}");
        }
    }

    #[test]
    fn the_same_iops_finds_the_same_volume() {
        let a = VolumePreset::parse("slowvol:hdd").unwrap().unwrap();
        let b = VolumePreset::parse("slowvol:150").unwrap().unwrap();
        assert_eq!(a.tag(), b.tag());
    }

    /// Root only: makes a small-IOPS volume, writes a file, checks the throttle is set, and
    /// takes it down.
    #[test]
    fn volume_comes_up_and_goes_away() {
        if let Err(why) = check_prerequisites() {
            eprintln!("skipped: {why}");
            return;
        }
        let mut preset = VolumePreset::parse("slowvol:77:5").unwrap().unwrap();
        preset.write_iops = Some(33);
        let v = SlowVolume::up(&preset, false).unwrap();
        let info = v.info.clone();
        assert!(is_mount_point(&info.mount));
        std::fs::write(info.mount.join("probe"), b"x").unwrap();
        let rule =
            std::fs::read_to_string(info.blkio_cgroup.join("blkio.throttle.read_iops_device"))
                .unwrap();
        assert!(rule.trim().ends_with(" 77"), "{rule}");
        let bps = std::fs::read_to_string(info.blkio_cgroup.join("blkio.throttle.read_bps_device"))
            .unwrap();
        assert!(bps.trim().ends_with(&format!(" {}", 5 << 20)), "{bps}");
        let writes =
            std::fs::read_to_string(info.blkio_cgroup.join("blkio.throttle.write_iops_device"))
                .unwrap();
        assert!(writes.trim().ends_with(" 33"), "{writes}");
        drop(v);
        assert!(!is_mount_point(&info.mount));
        assert!(!info.image.exists());
        assert!(!info.blkio_cgroup.exists());
        assert_eq!(loop_device_of(&info.image).unwrap(), None);
    }
}
