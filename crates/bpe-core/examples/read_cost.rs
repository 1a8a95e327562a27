//! What one L2 hit costs beside a raw O_DIRECT pread of the same size, in wall time and in CPU
//! time of the reading thread. CPU time is what the read path adds and what can be removed; it
//! holds up on a busy machine, where wall times are noise.
//!
//!   cargo run --release -p bpe-core --example read_cost [-- ROUNDS READS]
//!
//! Rounds alternate raw and L2 so that drifts of the machine hit both alike. Files live under
//! target/ (the project's disk, where O_DIRECT works), not in /tmp.

#[path = "support/mod.rs"]
mod support;
use bpe_core::{AlignedBuf, Config, Engine};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::time::Duration;
use support::measure;

const PAGE: usize = 4096;
const PAGES: u64 = 8192; // 32 MiB

/// A scrambled walk over all pages, so neither readahead nor the device's prefetch helps.
fn page_at(i: u64) -> u64 {
    i.wrapping_mul(2_654_435_761) % PAGES
}

fn main() {
    let mut args = std::env::args().skip(1);
    let rounds: u32 = args.next().map_or(3, |a| a.parse().expect("ROUNDS"));
    let reads: u64 = args.next().map_or(20_000, |a| a.parse().expect("READS"));

    let base = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/bench-data");
    std::fs::create_dir_all(&base).unwrap();
    let dir = tempfile::tempdir_in(base).unwrap();
    let raw_path = dir.path().join("raw");
    let bytes: Vec<u8> = (0..PAGES as usize * PAGE)
        .map(|i| (i / PAGE) as u8)
        .collect();
    std::fs::write(&raw_path, &bytes).unwrap();
    let data_path = dir.path().join("data");
    std::fs::write(&data_path, &bytes).unwrap();

    let raw = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(&raw_path)
        .unwrap();
    let mut aligned = AlignedBuf::new(PAGE);

    // 2 MiB of RAM (about 1 of it for the index) for 32 MiB of pages: nearly every read is an L2 hit.
    let engine = Engine::new(Config {
        max_memory: 2 << 20,
        readahead: false,
        ..Config::default()
    });
    let f = engine.open_file(&data_path, PAGE).unwrap();
    engine
        .enable_extension(&dir.path().join("ext.bpe"), 64 << 20)
        .unwrap();
    let mut buf = vec![0u8; PAGE];
    for p in 0..PAGES {
        engine.read_page(&f, p, &mut buf).unwrap();
    }
    engine.wait_for_extension_writes(Duration::from_secs(60));

    println!("per 4 KiB read, {reads} reads per round (wall µs / CPU µs of the thread):");
    let mut sums = [(0.0, 0.0); 2];
    for r in 0..rounds {
        let start = r as u64 * reads;
        let a = measure(reads, start, page_at, |p| {
            raw.read_exact_at(&mut aligned[..PAGE], p * PAGE as u64)
                .unwrap()
        });
        let before = engine.counters();
        let b = measure(reads, start, page_at, |p| {
            engine.read_page(&f, p, &mut buf).unwrap();
        });
        let after = engine.counters();
        let l2 = (after.ext_page_reads - before.ext_page_reads) as f64 / reads as f64;
        println!(
            "round {r}: raw pread {:6.2} / {:5.2}   L2 hit {:6.2} / {:5.2}   ({:.1} % from L2)",
            a.0,
            a.1,
            b.0,
            b.1,
            l2 * 100.0
        );
        sums[0] = (sums[0].0 + a.0, sums[0].1 + a.1);
        sums[1] = (sums[1].0 + b.0, sums[1].1 + b.1);
    }
    let n = rounds as f64;
    println!(
        "mean:    raw pread {:6.2} / {:5.2}   L2 hit {:6.2} / {:5.2}   L2 adds {:.2} µs CPU",
        sums[0].0 / n,
        sums[0].1 / n,
        sums[1].0 / n,
        sums[1].1 / n,
        (sums[1].1 - sums[0].1) / n
    );
}
