//! How fast the extension fills: a sequential read of a data file on the fast disk feeds L2 faster
//! than any SQL workload on this machine can, and the background writer's bandwidth is compared
//! with a raw sequential O_DIRECT write of the same size and request size on the same file system,
//! measured in the same run (the physical reference).
//!
//!   cargo bench -p bpe-core --bench fill            # 2 GiB; FILL_MIB=512 for less
//!
//! Files live under target/ (the project's disk, where O_DIRECT works), not in /tmp.

use bpe_core::{Config, Engine};
use std::io::Write;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::time::{Duration, Instant};

const PAGE: usize = 4096;
const BATCH: usize = 512 << 10; // the writer's batch size

fn main() {
    let mib: u64 = std::env::var("FILL_MIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2048);
    let base = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/bench-data");
    std::fs::create_dir_all(&base).unwrap();
    let dir = tempfile::tempdir_in(base).unwrap();
    let bytes = mib << 20;

    // The data file, written through the OS and then dropped from its cache by O_DIRECT reads.
    let data = dir.path().join("data");
    {
        let mut f = std::fs::File::create(&data).unwrap();
        let chunk: Vec<u8> = (0..BATCH).map(|i| (i / PAGE) as u8 ^ 0x5a).collect();
        for _ in 0..bytes / BATCH as u64 {
            f.write_all(&chunk).unwrap();
        }
        f.sync_all().unwrap();
    }

    let reference = raw_sequential_write(&dir.path().join("raw"), bytes);

    let engine = Engine::new(Config {
        max_memory: 64 << 20,
        ..Config::default()
    });
    let file = engine.open_file(&data, PAGE).unwrap();
    engine
        .enable_extension(&dir.path().join("ext.bpe"), bytes + (256 << 20))
        .unwrap();
    let before = engine.counters();
    let started = Instant::now();
    // Two readers, one per half of the file, each a sequential run served by readahead.
    let pages = bytes / PAGE as u64;
    std::thread::scope(|s| {
        for half in 0..2 {
            let (engine, file) = (&engine, &file);
            s.spawn(move || {
                let mut buf = vec![0u8; PAGE];
                for page in half * pages / 2..(half + 1) * pages / 2 {
                    engine.read_page(file, page, &mut buf).unwrap();
                }
            });
        }
    });
    let read_done = started.elapsed();
    assert!(engine.wait_for_extension_writes(Duration::from_secs(600)));
    let elapsed = started.elapsed();
    let c = engine.counters();
    let written = c.ext_bytes_written - before.ext_bytes_written;
    let dropped = c.ext_admissions_dropped - before.ext_admissions_dropped;
    let fill = written as f64 / 1e6 / elapsed.as_secs_f64();

    println!(
        "extension fill, {mib} MiB of 4 KiB pages read sequentially by 2 threads (no emulation)"
    );
    println!(
        "  reference: raw O_DIRECT sequential write, 512 KiB requests, QD1: {reference:.0} MB/s"
    );
    println!(
        "  extension writer: {:.0} MB/s ({} MB in {:.2} s; reads finished at {:.2} s)",
        fill,
        written / 1_000_000,
        elapsed.as_secs_f64(),
        read_done.as_secs_f64()
    );
    println!("  ratio to the reference: {:.2}", fill / reference);
    println!(
        "  sequential writes: {} %, admissions dropped (writer behind): {} of {} pages",
        c.ext_sequential_write_percent,
        dropped,
        bytes / PAGE as u64
    );
}

/// MB/s of writing `bytes` to a fresh preallocated file with O_DIRECT, BATCH bytes per request.
fn raw_sequential_write(path: &Path, bytes: u64) -> f64 {
    let f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .unwrap();
    // SAFETY: fallocate on a file we own, with valid offsets.
    let rc = unsafe { libc::fallocate(std::os::fd::AsRawFd::as_raw_fd(&f), 0, 0, bytes as i64) };
    assert_eq!(rc, 0, "fallocate");
    let layout = std::alloc::Layout::from_size_align(BATCH, 4096).unwrap();
    // SAFETY: a non-zero-sized, 4096-aligned allocation, freed below with the same layout.
    let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
    // SAFETY: ptr points to BATCH initialized (zeroed) bytes owned here.
    let chunk = unsafe { std::slice::from_raw_parts(ptr, BATCH) };
    let started = Instant::now();
    for i in 0..bytes / BATCH as u64 {
        f.write_all_at(chunk, i * BATCH as u64).unwrap();
    }
    // No fsync, as the extension writer never syncs: its contents need not survive a crash.
    let mb_s = bytes as f64 / 1e6 / started.elapsed().as_secs_f64();
    // SAFETY: allocated above with this layout.
    unsafe { std::alloc::dealloc(ptr, layout) };
    std::fs::remove_file(path).unwrap();
    mb_s
}
