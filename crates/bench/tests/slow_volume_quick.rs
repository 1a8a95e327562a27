//! End to end, root only: `bpe-bench lookup` on a kernel-throttled slow volume it makes itself
//! prints stock SQLite beside bpe, runs every configuration under the volume's throttle, names
//! the device in its results and removes the volume. Skips itself (with a message) where the
//! machine cannot make the volume.

mod common;

use std::process::Command;

/// Root, loop devices and the blkio controller, as the benchmark needs them.
fn missing_prerequisite() -> Option<&'static str> {
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0");
    if !root {
        return Some("not root");
    }
    if !std::path::Path::new("/sys/fs/cgroup/blkio/blkio.throttle.read_iops_device").exists() {
        return Some("no cgroup v1 blkio controller");
    }
    if !std::path::Path::new("/dev/loop-control").exists() {
        return Some("no loop devices");
    }
    None
}

/// What a volume with a latency needs besides: /dev/fuse for its server.
fn missing_latency_prerequisite() -> Option<&'static str> {
    missing_prerequisite()
        .or_else(|| (!std::path::Path::new("/dev/fuse").exists()).then_some("no /dev/fuse"))
}

/// A small `lookup` on `device` (the benchmark makes the volume and takes it down), with `more`
/// arguments; what it printed and its JSON results.
fn quick_lookup_on(device: &str, more: &[&str]) -> (String, serde_json::Value) {
    let mut args = vec![
        "lookup",
        "--quick",
        "--data-device",
        device,
        "--rows",
        "4000",
        "--lookups",
        "200",
        "--memory-mb",
        "2",
        "--extension-mb",
        "64",
    ];
    args.extend_from_slice(more);
    common::run_bench_printing(&args)
}

#[test]
fn lookup_on_a_slow_volume_runs_stock_beside_bpe_under_the_throttle() {
    if let Some(why) = missing_prerequisite() {
        eprintln!("skipped: {why}");
        return;
    }
    // An IOPS figure of its own (1931), so that it never meets a volume another run keeps.
    let (stdout, v) = quick_lookup_on("slowvol:1931", &["--reference-mib", "16"]);
    let description = "kernel-throttled loop volume, 1931 read IOPS (cgroup v1 blkio)";
    assert!(stdout.contains(description), "{stdout}");
    for stock in [
        "stock_ram_resident",
        "stock_limited_memory",
        "stock_limited_memory_zipf",
    ] {
        assert!(stdout.contains(stock), "{stock} not printed: {stdout}");
    }
    let volume = &v["storage"]["data_volume"];
    assert_eq!(volume["description"], description);
    assert_eq!(v["configs"].as_array().unwrap().len(), 11);
    for c in v["configs"].as_array().unwrap() {
        // Every configuration's process, stock and bpe alike, ran in the volume's blkio group.
        assert_eq!(c["details"]["blkio_cgroup"], volume["blkio_cgroup"], "{c}");
    }
    // Taken down at the end: no mount, no image, no group.
    for path in ["mount", "image", "blkio_cgroup"] {
        let p = volume[path].as_str().unwrap();
        assert!(!std::path::Path::new(p).exists(), "{p} is still there");
    }
}

/// A network volume's latency (`+<N>us`): the volume is served through its FUSE server, the
/// results say so, and the server's mount goes with the volume.
#[test]
fn a_slow_volume_with_a_latency_is_served_through_fuse_and_taken_down() {
    if let Some(why) = missing_latency_prerequisite() {
        eprintln!("skipped: {why}");
        return;
    }
    let (stdout, v) = quick_lookup_on(
        "slowvol:1931+200us",
        &[
            "--reference-mib",
            "0",
            "--configs",
            "limited_memory_bpe,stock_limited_memory",
        ],
    );
    let description = "kernel-throttled loop volume, 1931 read IOPS (cgroup v1 blkio); every request held 200 µs (FUSE under the loop device)";
    assert!(stdout.contains(description), "{stdout}");
    let volume = &v["storage"]["data_volume"];
    assert_eq!(volume["latency_us"], 200);
    let server_mount = volume["latency_mount"].as_str().unwrap();
    assert_eq!(v["configs"].as_array().unwrap().len(), 2);
    for c in v["configs"].as_array().unwrap() {
        assert_eq!(c["details"]["blkio_cgroup"], volume["blkio_cgroup"], "{c}");
    }
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap();
    assert!(
        !mounts.contains(server_mount),
        "{server_mount} is still mounted"
    );
    for path in ["mount", "image", "blkio_cgroup", "latency_mount"] {
        let p = volume[path].as_str().unwrap();
        assert!(!std::path::Path::new(p).exists(), "{p} is still there");
    }
}

/// A kept volume whose latency server has died (killed, or its machine's FUSE aborted) leaves
/// the loop device behind a mount that answers "not connected": the next run finds the loop
/// device from the volume's mount, detaches it, makes the volume again, and takes it down.
#[test]
fn a_kept_volume_whose_latency_server_died_is_made_again() {
    if let Some(why) = missing_latency_prerequisite() {
        eprintln!("skipped: {why}");
        return;
    }
    // Its own IOPS figure (1933): no other test or run meets this volume.
    let device = "slowvol:1933+200us";
    let args = ["--reference-mib", "0", "--configs", "limited_memory_bpe"];
    let mut kept_args = args.to_vec();
    kept_args.push("--keep-volume");
    let (_, first) = quick_lookup_on(device, &kept_args);
    let volume = &first["storage"]["data_volume"];
    let mount = volume["mount"].as_str().unwrap().to_string();
    let server_mount = volume["latency_mount"].as_str().unwrap().to_string();
    let loop_device = volume["loop_device"].as_str().unwrap().to_string();
    assert!(mount_source(&mount).is_some(), "{mount} was not kept");

    let server = latency_server_of(&server_mount).expect("the kept volume's server runs");
    let killed = Command::new("kill")
        .args(["-9", &server.to_string()])
        .status();
    assert!(killed.unwrap().success());
    // Gone, or a zombie where nothing reaps the orphaned server: either way it serves no more.
    // A watchdog only: a loaded machine may take a while to reap the server.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while std::fs::read_to_string(format!("/proc/{server}/stat"))
        .is_ok_and(|stat| !stat.contains(") Z "))
    {
        assert!(
            std::time::Instant::now() < deadline,
            "{server} outlived SIGKILL"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    // The parts the dead server leaves: the volume still mounted on its loop device.
    assert_eq!(mount_source(&mount).as_deref(), Some(loop_device.as_str()));

    let (_, second) = quick_lookup_on(device, &args);
    let again = &second["storage"]["data_volume"];
    assert_eq!(again["reused"], false, "{again}");
    assert_eq!(second["configs"].as_array().unwrap().len(), 1);
    // Everything is gone, the orphaned loop device with the rest.
    assert_eq!(mount_source(&mount), None);
    assert_eq!(mount_source(&server_mount), None);
    let loops = Command::new("losetup").arg("-a").output().unwrap();
    let loops = String::from_utf8_lossy(&loops.stdout);
    assert!(
        !loops.contains(&server_mount),
        "a loop device is left: {loops}"
    );
    for path in ["mount", "image", "blkio_cgroup", "latency_mount"] {
        let p = again[path].as_str().unwrap();
        assert!(!std::path::Path::new(p).exists(), "{p} is still there");
    }
}

/// The device mounted at `dir`, from /proc/mounts.
fn mount_source(dir: &str) -> Option<String> {
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap();
    mounts.lines().find_map(|l| {
        let mut fields = l.split_whitespace();
        let source = fields.next()?;
        (fields.next()? == dir).then(|| source.to_string())
    })
}

/// The process serving the latency volume mounted at `server_mount`.
fn latency_server_of(server_mount: &str) -> Option<u32> {
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
        let args: Vec<&[u8]> = cmdline.split(|&b| b == 0).collect();
        let serves = args.contains(&&b"__serve-latency-volume"[..]);
        let here = args.contains(&server_mount.as_bytes());
        (serves && here).then_some(pid)
    })
}
