//! Microbenchmarks of the three read paths, beside a raw O_DIRECT pread of the same file as the
//! physical reference, and the L1 hit path under 2 threads (no global lock on a hit).
//!
//!   cargo bench -p bpe-core --bench paths
//!
//! Files live under target/ (the project's disk, where O_DIRECT works), not in /tmp.

use bpe_core::{Config, Engine, FileHandle};
use criterion::{criterion_group, criterion_main, Criterion};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

const PAGE: usize = 4096;
const PAGES: u64 = 4096; // 16 MiB data file

struct Rig {
    _dir: tempfile::TempDir,
    data: PathBuf,
}

fn rig() -> Rig {
    let base = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/bench-data");
    std::fs::create_dir_all(&base).unwrap();
    let dir = tempfile::tempdir_in(base).unwrap();
    let data = dir.path().join("data");
    let bytes: Vec<u8> = (0..PAGES as usize * PAGE)
        .map(|i| (i / PAGE) as u8)
        .collect();
    std::fs::write(&data, bytes).unwrap();
    Rig { _dir: dir, data }
}

fn engine(max_memory: u64) -> Arc<Engine> {
    Engine::new(Config {
        max_memory,
        readahead: false,
        ..Config::default()
    })
}

/// A scrambled walk over all pages, so neither readahead nor the device's prefetch helps.
fn page_at(i: u64) -> u64 {
    (i.wrapping_mul(2_654_435_761)) % PAGES
}

fn read(engine: &Engine, f: &FileHandle, page: u64, buf: &mut [u8]) {
    engine.read_page(f, page, buf).unwrap();
}

fn paths(c: &mut Criterion) {
    let rig = rig();
    let mut g = c.benchmark_group("read_4k");
    g.measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_secs(1));

    // Physical reference: what the device gives an O_DIRECT 4 KiB random read at queue depth 1.
    let raw = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(&rig.data)
        .unwrap();
    let mut aligned = bpe_core::AlignedBuf::new(PAGE);
    let mut i = 0u64;
    g.bench_function("raw_pread_o_direct", |b| {
        b.iter(|| {
            i += 1;
            raw.read_exact_at(&mut aligned[..PAGE], page_at(i) * PAGE as u64)
                .unwrap();
        })
    });

    let mut buf = vec![0u8; PAGE];

    let hot = engine(64 << 20);
    let f = hot.open_file(&rig.data, PAGE).unwrap();
    for p in 0..PAGES {
        read(&hot, &f, p, &mut buf);
    }
    g.bench_function("l1_hit", |b| {
        b.iter(|| {
            i += 1;
            read(&hot, &f, page_at(i), &mut buf);
        })
    });

    // Each engine owns the file it opens (a second one is refused), so each gets its own copy.
    let copy = |name: &str| {
        let path = rig.data.with_file_name(name);
        std::fs::copy(&rig.data, &path).unwrap();
        path
    };
    let l2 = engine(1 << 20);
    let f2 = l2.open_file(&copy("data-l2"), PAGE).unwrap();
    let ext = rig.data.with_extension("bpe");
    l2.enable_extension(&ext, 64 << 20).unwrap();
    for p in 0..PAGES {
        read(&l2, &f2, page_at(p), &mut buf);
    }
    l2.wait_for_extension_writes(Duration::from_secs(30));
    let before = l2.counters();
    g.bench_function("l2_hit", |b| {
        b.iter(|| {
            i += 1;
            read(&l2, &f2, page_at(i), &mut buf);
        })
    });
    let after = l2.counters();
    let lookups = after.page_lookups - before.page_lookups;
    println!(
        "l2_hit: {:.1}% of lookups served by the extension, {:.1}% by RAM",
        (after.ext_page_reads - before.ext_page_reads) as f64 * 100.0 / lookups as f64,
        (after.l1_hits - before.l1_hits) as f64 * 100.0 / lookups as f64,
    );

    let cold = engine(1 << 20);
    let f3 = cold.open_file(&copy("data-cold"), PAGE).unwrap();
    g.bench_function("miss_data_file", |b| {
        b.iter(|| {
            i += 1;
            read(&cold, &f3, page_at(i), &mut buf);
        })
    });
    g.finish();

    // The hit path with 1 and 2 threads: a global lock would halve per-thread throughput.
    let mut g = c.benchmark_group("l1_hit_threads");
    g.measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_secs(1));
    for threads in [1usize, 2] {
        g.bench_function(format!("{threads}_threads"), |b| {
            b.iter_custom(|iters| {
                let start = Instant::now();
                std::thread::scope(|s| {
                    for t in 0..threads {
                        let (hot, f) = (&hot, &f);
                        s.spawn(move || {
                            let mut buf = vec![0u8; PAGE];
                            for k in 0..iters {
                                read(hot, f, page_at(k * 2 + t as u64), &mut buf);
                            }
                        });
                    }
                });
                // Time per lookup across all threads: halves if hits scale perfectly.
                start.elapsed() / threads as u32
            })
        });
    }
    g.finish();
}

criterion_group!(benches, paths);
criterion_main!(benches);
