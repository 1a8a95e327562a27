//! Soak: reader threads and a writer on tiny memory and a small extension, while an operator
//! thread enables, resizes and disables the extension, drops clean buffers and changes max server
//! memory in a loop. Every row carries its own checksum and is verified on every read; every
//! committed row is there at the end. Resident memory stays within max server memory + the
//! extension's index + a fixed overhead, and neither memory nor file descriptors grow over time.
//!
//! `BPE_SOAK_SECONDS` sets the length (CI: the default, 8 s); a long run:
//!
//!   BPE_SOAK_SECONDS=600 cargo test --release -p sqlite-bpe --test soak -- --nocapture

mod common;
mod rows;
use common::*;
use rand::{Rng, SeedableRng};
use rusqlite::{params, Connection};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

const ROWS: i64 = 2000;
const PAYLOAD: usize = 600;
const READERS: usize = 3;
/// The most max server memory the operator thread sets, and the largest extension (its index
/// is carved out of max server memory, so it adds nothing on top).
const MAX_MEMORY_MB: u64 = 4;

/// What a process holds besides the pool and the index: SQLite's page cache per connection (64
/// pages × 5 connections here), its schema and statement caches, the thread stacks, the
/// extension's staging queue (up to 1024 pages waiting for the writer) and its 512 KiB write
/// buffer, the allocator's slack. A long release run holds the most (the staging queue full of
/// evicted frames, and malloc's arenas for 5 threads); the bound leaves room above what short
/// debug and long release runs were measured at (docs/BENCHMARKS.md, "Figures moved from
/// source comments"). docs/RELIABILITY.md.
const FIXED_OVERHEAD: u64 = 24 << 20;

fn seconds() -> u64 {
    std::env::var("BPE_SOAK_SECONDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(8)
}

fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kb << 10
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

fn row_payload(id: i64, version: i64) -> Vec<u8> {
    rows::payload((id as u64) << 32 | version as u64, PAYLOAD)
}

fn connect(db: &std::path::Path) -> Connection {
    let c = open_bpe(db);
    c.busy_timeout(Duration::from_secs(30)).unwrap();
    c.execute_batch("PRAGMA cache_size = 64").unwrap();
    c
}

/// Reads one row and checks it against its own checksum and its expected bytes.
fn verify_row(c: &Connection, id: i64) -> i64 {
    let (version, body, sum): (i64, Vec<u8>, i64) = c
        .query_row(
            "SELECT version, body, sum FROM r WHERE id = ?1",
            [id],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .unwrap();
    assert_eq!(rows::crc32(&body), sum, "row {id}: checksum mismatch");
    assert!(
        body == row_payload(id, version),
        "row {id} version {version}: wrong bytes"
    );
    version
}

#[test]
fn readers_a_writer_and_an_operator_loop_keep_every_row_and_the_memory_bound() {
    // Before the engine holds anything: the binary, the test harness, the allocator.
    let process_rss = rss_bytes();
    let dir = tempdir();
    let db = dir.path().join("soak.db");
    let ext = dir.path().join("soak.bpe");
    let setup = connect(&db);
    setup
        .execute_batch(
            "PRAGMA journal_mode = WAL;
             CREATE TABLE r(id INTEGER PRIMARY KEY, version INTEGER, body BLOB, sum INTEGER);",
        )
        .unwrap();
    {
        let tx = setup.unchecked_transaction().unwrap();
        for id in 0..ROWS {
            let body = row_payload(id, 0);
            tx.execute(
                "INSERT INTO r VALUES (?1, 0, ?2, ?3)",
                params![id, body, rows::crc32(&body)],
            )
            .unwrap();
        }
        tx.commit().unwrap();
    }
    setup
        .execute_batch("PRAGMA wal_checkpoint(TRUNCATE)")
        .unwrap();
    exec(
        &setup,
        &format!("EXEC sp_configure 'max server memory (MB)', {MAX_MEMORY_MB}"),
    );
    let engine = sqlite_bpe::engine();

    // The newest committed version of each row, for readers (never older) and for the end.
    let committed: Vec<AtomicI64> = (0..ROWS).map(|_| AtomicI64::new(0)).collect();
    let stop = AtomicBool::new(false);
    let samples: Mutex<Vec<(f64, u64, usize)>> = Mutex::new(Vec::new());
    let reads = AtomicI64::new(0);
    let operator_rounds = AtomicI64::new(0);
    let length = Duration::from_secs(seconds());

    // Let every thread open its connection and warm up before the baseline is taken.
    let started = Instant::now();
    let baseline_rss = std::sync::OnceLock::new();
    let baseline_fds = std::sync::OnceLock::new();
    std::thread::scope(|s| {
        let (db, stop, committed, reads) = (&db, &stop, &committed, &reads);
        let (ext, operator_rounds) = (&ext, &operator_rounds);
        for t in 0..READERS {
            s.spawn(move || {
                let c = connect(db);
                let mut rng = rand::rngs::StdRng::seed_from_u64(t as u64);
                while !stop.load(Ordering::Relaxed) {
                    if rng.gen_ratio(1, 50) {
                        // A range scan now and then: readahead through both tiers.
                        let from = rng.gen_range(0..ROWS - 200);
                        for id in from..from + 200 {
                            verify_row(&c, id);
                        }
                    } else {
                        let id = rng.gen_range(0..ROWS);
                        let floor = committed[id as usize].load(Ordering::Acquire);
                        let version = verify_row(&c, id);
                        assert!(
                            version >= floor,
                            "row {id} went back from {floor} to {version}"
                        );
                    }
                    reads.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
        s.spawn(move || {
            let c = connect(db);
            let mut rng = rand::rngs::StdRng::seed_from_u64(99);
            let mut version = 0;
            while !stop.load(Ordering::Relaxed) {
                version += 1;
                let ids: Vec<i64> = (0..8).map(|_| rng.gen_range(0..ROWS)).collect();
                let tx = c.unchecked_transaction().unwrap();
                for &id in &ids {
                    let body = row_payload(id, version);
                    tx.execute(
                        "UPDATE r SET version = ?2, body = ?3, sum = ?4 WHERE id = ?1",
                        params![id, version, body, rows::crc32(&body)],
                    )
                    .unwrap();
                }
                tx.commit().unwrap();
                for &id in &ids {
                    committed[id as usize].fetch_max(version, Ordering::Release);
                }
            }
        });
        s.spawn(move || {
            let c = connect(db);
            let on = |mb: u64| extension_on(ext.display(), &format!("{mb} MB"));
            let mut rng = rand::rngs::StdRng::seed_from_u64(7);
            while !stop.load(Ordering::Relaxed) {
                let memory = rng.gen_range(2..=MAX_MEMORY_MB);
                exec(
                    &c,
                    &format!("EXEC sp_configure 'max server memory (MB)', {memory}"),
                );
                exec(&c, &on(rng.gen_range(8..=16)));
                std::thread::sleep(Duration::from_millis(rng.gen_range(20..200)));
                exec(&c, &on(rng.gen_range(8..=16))); // a resize
                std::thread::sleep(Duration::from_millis(rng.gen_range(20..200)));
                if rng.gen_ratio(1, 3) {
                    exec(&c, "DBCC DROPCLEANBUFFERS");
                }
                exec(
                    &c,
                    "ALTER SERVER CONFIGURATION SET BUFFER POOL EXTENSION OFF",
                );
                std::thread::sleep(Duration::from_millis(rng.gen_range(0..50)));
                operator_rounds.fetch_add(1, Ordering::Relaxed);
            }
        });
        // The sampler, on this thread. If it panics, the others must still stop.
        struct StopOnDrop<'a>(&'a AtomicBool);
        impl Drop for StopOnDrop<'_> {
            fn drop(&mut self) {
                self.0.store(true, Ordering::Relaxed);
            }
        }
        let _stop_on_drop = StopOnDrop(stop);
        while started.elapsed() < length {
            std::thread::sleep(Duration::from_millis(100));
            // The pool's own accounting, read while everything moves: within the highest max
            // server memory set, plus one page per thread installing one at this instant.
            let c = engine.counters();
            assert!(
                c.memory_bytes <= (MAX_MEMORY_MB << 20) + 8 * (4096 + 96),
                "the pool holds {} bytes, over max server memory",
                c.memory_bytes
            );
            let t = started.elapsed().as_secs_f64();
            if t >= 1.0 {
                baseline_rss.get_or_init(rss_bytes);
                baseline_fds.get_or_init(open_fds);
            }
            samples.lock().unwrap().push((t, rss_bytes(), open_fds()));
        }
        stop.store(true, Ordering::Relaxed);
    });

    // At rest, the full invariants: accounting, memory bound, residency.
    engine.check_invariants();
    // Every committed version is there, every row verifies, the file is sound.
    let c = connect(&db);
    for id in 0..ROWS {
        let version = verify_row(&c, id);
        assert_eq!(
            version,
            committed[id as usize].load(Ordering::Acquire),
            "row {id}: the newest committed version is missing"
        );
    }
    let ok: String = c
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(ok, "ok");
    assert!(
        operator_rounds.load(Ordering::Relaxed) > 3,
        "the operator loop hardly ran"
    );

    let samples = samples.into_inner().unwrap();
    let after_warmup: Vec<_> = samples.iter().filter(|s| s.0 >= 1.0).collect();
    let base_rss = *baseline_rss.get().unwrap();
    let peak_rss = after_warmup.iter().map(|s| s.1).max().unwrap();
    println!(
        "{} s, {} reads, {} operator rounds; RSS at start {} KiB, after warm-up {} KiB, peak {} KiB (+{} KiB); fds {} -> {}",
        seconds(),
        reads.load(Ordering::Relaxed),
        operator_rounds.load(Ordering::Relaxed),
        process_rss >> 10,
        base_rss >> 10,
        peak_rss >> 10,
        peak_rss.saturating_sub(base_rss) >> 10,
        baseline_fds.get().unwrap(),
        samples.last().unwrap().2,
    );
    // The bound, from the process's size before the engine held anything: max server memory
    // (pool + index) and the fixed overhead on top.
    assert!(
        peak_rss <= process_rss + (MAX_MEMORY_MB << 20) + FIXED_OVERHEAD,
        "RSS peaked at {} KiB, {} KiB above the process's {} KiB at start",
        peak_rss >> 10,
        (peak_rss - process_rss) >> 10,
        process_rss >> 10
    );
    // No growth: the second half's peak is no higher than the first half's, within a margin and
    // the readahead buffers the core keeps (a fixed amount, first taken whenever two scans'
    // readaheads first overlap, which may fall in either half).
    let half = after_warmup.len() / 2;
    let first = after_warmup[..half].iter().map(|s| s.1).max().unwrap();
    let second = after_warmup[half..].iter().map(|s| s.1).max().unwrap();
    let margin = (4 << 20) + bpe_core::READAHEAD_BUFFERS_KEPT_BYTES as u64;
    assert!(
        second <= first + margin,
        "RSS grew: peak {} KiB in the first half, {} KiB in the second",
        first >> 10,
        second >> 10
    );
    // Descriptors, the same way, with room for the ones open only for a moment, which a sample
    // may catch in either half: an extension's three (its file twice, its shared memory) while
    // a resize's new extension is open and the old one not yet retired, and the counters file
    // the publisher writes once a second (two quiet runs sampled 22 with the extension off and
    // 25 with it on, nothing else). A leak at each operator round (about a dozen a half) still
    // shows.
    let fds_first = after_warmup[..half].iter().map(|s| s.2).max().unwrap();
    let fds_second = after_warmup[half..].iter().map(|s| s.2).max().unwrap();
    const FDS_OPEN_FOR_A_MOMENT: usize = 4;
    assert!(
        fds_second <= fds_first + FDS_OPEN_FOR_A_MOMENT,
        "file descriptors grew: {fds_first} -> {fds_second}"
    );
}
