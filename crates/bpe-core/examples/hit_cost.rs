//! What one L1 hit costs when the pool is many times the CPU's caches, beside the physical
//! reference: a 4 KiB copy out of a plain buffer of the same size at the same random offsets.
//! Both are DRAM-bound; the difference is what the page table, the frame and the VFS-free
//! read path add. L1 runs on huge pages (the default) and on 4 KiB pages.
//!
//!   cargo run --release -p bpe-core --example hit_cost [-- ROUNDS READS MIB]
//!
//! Rounds alternate the three so that drifts of the machine hit all alike; CPU time of the
//! reading thread is printed beside wall time. Files live under target/ (the project's disk,
//! where O_DIRECT works), not in /tmp.

#[path = "support/mod.rs"]
mod support;
use bpe_core::{Config, Engine};
use std::path::Path;
use support::measure;

const PAGE: usize = 4096;

fn main() {
    let mut args = std::env::args().skip(1);
    let rounds: u32 = args.next().map_or(5, |a| a.parse().expect("ROUNDS"));
    let reads: u64 = args.next().map_or(2_000_000, |a| a.parse().expect("READS"));
    let mib: u64 = args.next().map_or(256, |a| a.parse().expect("MIB"));
    let pages = mib * (1 << 20) / PAGE as u64;
    // A scrambled walk over all pages: no two neighbours in a row, nothing for a prefetcher.
    let page_at = move |i: u64| i.wrapping_mul(2_654_435_761) % pages;

    let base = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/bench-data");
    std::fs::create_dir_all(&base).unwrap();
    let dir = tempfile::tempdir_in(base).unwrap();
    let bytes: Vec<u8> = (0..pages as usize * PAGE)
        .map(|i| (i / PAGE) as u8)
        .collect();
    let mut engines = Vec::new();
    for large_pages in [true, false] {
        let path = dir.path().join(format!("data-{large_pages}"));
        std::fs::write(&path, &bytes).unwrap();
        let engine = Engine::new(Config {
            max_memory: (mib + 64) << 20,
            readahead: false,
            large_pages,
            ..Config::default()
        });
        let f = engine.open_file(&path, PAGE).unwrap();
        let mut buf = vec![0u8; PAGE];
        for p in 0..pages {
            engine.read_page(&f, p, &mut buf).unwrap();
        }
        engines.push((large_pages, engine, f));
    }

    // L1's ranges are collapsed into huge pages once it stopped growing for a second.
    std::thread::sleep(std::time::Duration::from_secs(3));
    println!(
        "per 4 KiB read, {reads} random reads over {mib} MiB per round (wall ns / CPU ns of the thread):"
    );
    let mut buf = vec![0u8; PAGE];
    let mut sums = [(0.0, 0.0); 3];
    for r in 0..rounds {
        let start = r as u64 * reads;
        let copy = measure(reads, start, page_at, |p| {
            let at = p as usize * PAGE;
            buf.copy_from_slice(&bytes[at..at + PAGE]);
        });
        let mut line = format!(
            "round {r}: plain copy {:5.0} / {:5.0}",
            copy.0 * 1e3,
            copy.1 * 1e3
        );
        sums[0] = (sums[0].0 + copy.0, sums[0].1 + copy.1);
        for (i, (large, engine, f)) in engines.iter().enumerate() {
            let before = engine.counters();
            let hit = measure(reads, start, page_at, |p| {
                engine.read_page(f, p, &mut buf).unwrap();
            });
            let after = engine.counters();
            assert_eq!(
                after.l1_hits - before.l1_hits,
                reads,
                "every read an L1 hit"
            );
            let name = if *large { "huge pages" } else { "4 KiB pages" };
            line += &format!(
                "   L1 hit, {name} {:5.0} / {:5.0}",
                hit.0 * 1e3,
                hit.1 * 1e3
            );
            sums[i + 1] = (sums[i + 1].0 + hit.0, sums[i + 1].1 + hit.1);
        }
        println!("{line}");
    }
    let n = rounds as f64 / 1e3;
    println!(
        "mean:    plain copy {:5.0} / {:5.0}   L1 hit, huge pages {:5.0} / {:5.0}   L1 hit, 4 KiB pages {:5.0} / {:5.0}",
        sums[0].0 / n,
        sums[0].1 / n,
        sums[1].0 / n,
        sums[1].1 / n,
        sums[2].0 / n,
        sums[2].1 / n
    );
}
