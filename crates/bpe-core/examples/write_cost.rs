//! What one page write costs through the engine beside a raw `pwrite` of the same page, in wall
//! time and in CPU time of the writing thread. Written through, the engine's write is the same
//! `pwrite` plus L1's bookkeeping (the old frame out, the clean copy in): the difference is that
//! bookkeeping. Written behind, a round's writes replace frames only, and its write-back (timed
//! with it) writes each distinct page once: WRITES over 32,768 pages rewrite each about
//! WRITES / 32,768 times, as SQLite's spills of a large transaction do.
//!
//!   cargo run --release -p bpe-core --example write_cost [-- ROUNDS WRITES [DIR]]
//!
//! DIR (default target/bench-data) holds the files: on tmpfs (/dev/shm) the `pwrite` is a plain
//! copy, so the bookkeeping stands out of the file system's noise.
//!
//! Every page is resident first (the fits-in-memory case: each write replaces a frame). Rounds
//! alternate raw and engine so that drifts of the machine hit both alike.

#[path = "support/mod.rs"]
mod support;
use bpe_core::{BehindLog, Config, Engine, Via};
use std::os::unix::fs::FileExt;
use std::path::Path;
use support::measure;

const PAGE: usize = 4096;
const PAGES: u64 = 32768; // 128 MiB

/// A scrambled walk over all pages: each write finds its frame cold, as in a large table.
fn page_at(i: u64) -> u64 {
    i.wrapping_mul(2_654_435_761) % PAGES
}

fn main() {
    let mut args = std::env::args().skip(1);
    let rounds: u32 = args.next().map_or(4, |a| a.parse().expect("ROUNDS"));
    let writes: u64 = args.next().map_or(100_000, |a| a.parse().expect("WRITES"));

    let base = args.next().map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/bench-data"),
        std::path::PathBuf::from,
    );
    std::fs::create_dir_all(&base).unwrap();
    let dir = tempfile::tempdir_in(base).unwrap();
    let bytes = vec![7u8; PAGES as usize * PAGE];
    let raw_path = dir.path().join("raw");
    std::fs::write(&raw_path, &bytes).unwrap();
    let data_path = dir.path().join("data");
    std::fs::write(&data_path, &bytes).unwrap();
    let raw = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&raw_path)
        .unwrap();

    let engine = Engine::new(Config {
        max_memory: 1 << 30,
        readahead: false,
        ..Config::default()
    });
    let f = engine.open_file(&data_path, PAGE).unwrap();
    let mut buf = vec![0u8; PAGE];
    for p in 0..PAGES {
        engine.read_page(&f, p, &mut buf).unwrap();
    }

    println!("per 4 KiB write, {writes} writes per round (wall µs / CPU µs of the thread):");
    let mut sums = [(0.0, 0.0); 3];
    let mut log = BehindLog::default();
    for r in 0..rounds {
        let start = r as u64 * writes;
        buf[0] = r as u8;
        let a = measure(writes, start, page_at, |p| {
            raw.write_all_at(&buf, p * PAGE as u64).unwrap()
        });
        let b = measure(writes, start, page_at, |p| {
            engine.write_page(&f, p, &buf).unwrap()
        });
        let behind = measure(writes, start, page_at, |p| {
            engine
                .write_page_behind(&f, p, &buf, Via(None), &mut log)
                .unwrap()
        });
        let back = measure(1, 0, page_at, |_| {
            engine.write_back(&f, &mut log, Via(None)).unwrap()
        });
        // The write-back's time, spread over the round's writes.
        let per = writes as f64;
        let c = (behind.0 + back.0 / per, behind.1 + back.1 / per);
        println!(
            "round {r}: raw pwrite {:6.2} / {:5.2}   through {:6.2} / {:5.2}   behind {:6.2} / {:5.2}",
            a.0, a.1, b.0, b.1, c.0, c.1
        );
        for (sum, x) in sums.iter_mut().zip([a, b, c]) {
            *sum = (sum.0 + x.0, sum.1 + x.1);
        }
    }
    let n = rounds as f64;
    println!(
        "mean:    raw pwrite {:6.2} / {:5.2}   through {:6.2} / {:5.2}   behind {:6.2} / {:5.2}",
        sums[0].0 / n,
        sums[0].1 / n,
        sums[1].0 / n,
        sums[1].1 / n,
        sums[2].0 / n,
        sums[2].1 / n,
    );
}
