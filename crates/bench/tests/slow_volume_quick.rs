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
    if let Some(why) = missing_prerequisite() {
        eprintln!("skipped: {why}");
        return;
    }
    if !std::path::Path::new("/dev/fuse").exists() {
        eprintln!("skipped: no /dev/fuse");
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
