//! The engine's lock protocols under Shuttle's scheduler: every lock, latch, channel and thread
//! of the core is Shuttle's (the `shuttle` feature), so each iteration runs the same small
//! workload under another interleaving, chosen at random or by PCT (probabilistic concurrency
//! testing, which bounds the chance of missing a bug of small depth). Shuttle reports a deadlock
//! as a failure, and an assertion failure with the schedule that reproduces it.
//!
//! What is checked, against a model kept in plain atomics:
//! - a read returns a whole page of the right file, never older than the newest write that had
//!   completed before the read began (never stale, never torn, never another file's);
//! - the memory bound and the accounting hold afterwards (`Engine::check_invariants`);
//! - no interleaving deadlocks (Shuttle sees every thread blocked).
//!
//! Run: `cargo test -p bpe-core --features shuttle --test shuttle` (CI runs it;
//! `BPE_SHUTTLE_ITERATIONS` scales it).

mod common;
use bpe_core::{Config, Engine};
use common::*;
use shuttle::thread;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::Arc;

const PAGES: u64 = 12;

fn iterations(default: usize) -> usize {
    std::env::var("BPE_SHUTTLE_ITERATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A fresh engine whose memory holds fewer pages than the file has, so that loads evict (and
/// room for a small extension's index).
fn small_engine() -> Arc<Engine> {
    Engine::new(Config {
        max_memory: 48 << 10,
        // Private: Shuttle schedules the core's own locks, and a shared extension's index sits
        // behind a process-shared pthread mutex and file locks it cannot schedule (a task parked
        // holding that mutex stalls every other task for good). The shared protocol has its
        // own deterministic simulation (extension/shared/sim.rs).
        shared_extension: false,
        ..Config::default()
    })
}

/// Reads `page` and checks it against the model: version >= the floor published before.
fn checked_read(
    engine: &Engine,
    file: &bpe_core::FileHandle,
    page: u64,
    model: &[AtomicU64],
    tag: u64,
) {
    let floor = model[page as usize].load(SeqCst);
    let mut buf = vec![0u8; PAGE];
    let r = engine.read_page(file, page, &mut buf).unwrap();
    let (p, v) = decode(&buf).unwrap_or_else(|| panic!("page {page} torn (from {:?})", r.tier));
    assert_eq!(p, page, "read page {page}, got page {p} from {:?}", r.tier);
    assert_eq!(
        v / 1000,
        tag,
        "page {page} of file {tag} holds file {}'s bytes",
        v / 1000
    );
    assert!(
        v >= floor,
        "page {page}: version {v} from {:?}, {floor} was written",
        r.tier
    );
}

/// Pages at version `tag * 1000`, so that a page of one file is never mistaken for another's.
fn make_tagged(dir: &Path, tag: u64) -> PathBuf {
    make_tagged_pages(dir, tag, PAGES)
}

/// Pages of the extension's 512 KiB write batch.
const REGION_PAGES: u64 = (512 << 10) / PAGE as u64;

fn make_tagged_pages(dir: &Path, tag: u64, pages: u64) -> PathBuf {
    let path = dir.join(format!("data{tag}"));
    let mut all = Vec::new();
    for p in 0..pages {
        all.extend_from_slice(&page_bytes(p, tag * 1000, PAGE));
    }
    std::fs::write(&path, all).unwrap();
    path
}

/// Readers, a writer and whole-file invalidations, memory changes and drop-clean-buffers.
fn reads_writes_and_invalidations(with_extension: bool) {
    let dir = tempdir();
    let path = make_tagged(dir.path(), 1);
    let ext_path = dir.path().join("ext.bpe");
    let engine = small_engine();
    if with_extension {
        engine.enable_extension(&ext_path, 2 << 20).unwrap();
    }
    let file = engine.open_file(&path, PAGE).unwrap();
    let model: Arc<Vec<AtomicU64>> = Arc::new((0..PAGES).map(|_| AtomicU64::new(1000)).collect());
    let mut threads = Vec::new();
    for t in 0..2u64 {
        let (engine, file, model) = (engine.clone(), file.clone(), model.clone());
        threads.push(thread::spawn(move || {
            for i in 0..4 {
                checked_read(&engine, &file, (t * 3 + i) % PAGES, &model, 1);
            }
        }));
    }
    {
        let (engine, file, model) = (engine.clone(), file.clone(), model.clone());
        threads.push(thread::spawn(move || {
            for (i, page) in [1u64, 4, 1].into_iter().enumerate() {
                let version = 1001 + i as u64;
                engine
                    .write_page(&file, page, &page_bytes(page, version, PAGE))
                    .unwrap();
                model[page as usize].store(version, SeqCst);
            }
        }));
    }
    {
        let (engine, file, path, ext_path) =
            (engine.clone(), file.clone(), path.clone(), ext_path.clone());
        threads.push(thread::spawn(move || {
            engine.invalidate_file(&file);
            let second = engine.open_file(&path, PAGE).unwrap();
            engine.drop_clean_buffers();
            engine.set_max_memory(256 << 10).unwrap();
            engine.close_file(&second);
            if with_extension {
                let _ = engine.disable_extension();
                let _ = engine.enable_extension(&ext_path, 3 << 20);
            }
            engine.invalidate_file(&file);
        }));
    }
    for t in threads {
        t.join().unwrap();
    }
    for p in 0..PAGES {
        checked_read(&engine, &file, p, &model, 1);
    }
    engine.check_invariants();
    let _ = engine.disable_extension();
    engine.close_file(&file);
}

#[test]
fn l1_protocol_under_random_schedules() {
    shuttle::check_random(|| reads_writes_and_invalidations(false), iterations(300));
}

#[test]
fn l1_protocol_under_pct_schedules() {
    shuttle::check_pct(|| reads_writes_and_invalidations(false), iterations(300), 3);
}

#[test]
fn l1_and_l2_with_the_extension_toggled_under_random_schedules() {
    shuttle::check_random(|| reads_writes_and_invalidations(true), iterations(150));
}

#[test]
fn l1_and_l2_with_the_extension_toggled_under_pct_schedules() {
    shuttle::check_pct(|| reads_writes_and_invalidations(true), iterations(150), 3);
}

/// A writer that writes pages behind and then writes them back, beside readers, evictions (the
/// memory shrinks), drop-clean-buffers and the extension toggled: a read never returns a page
/// older than the last one written behind, and the write-back leaves every page's last version
/// in the file (read by a fresh engine). No whole-file invalidation: a writer holds the file's
/// write lock while it has pages behind, so no other writer's commit can come in between.
fn writes_behind(with_extension: bool) {
    let dir = tempdir();
    let path = make_tagged(dir.path(), 1);
    let ext_path = dir.path().join("ext.bpe");
    let engine = small_engine();
    if with_extension {
        engine.enable_extension(&ext_path, 2 << 20).unwrap();
    }
    let file = engine.open_file(&path, PAGE).unwrap();
    let model: Arc<Vec<AtomicU64>> = Arc::new((0..PAGES).map(|_| AtomicU64::new(1000)).collect());
    let mut threads = Vec::new();
    for t in 0..2u64 {
        let (engine, file, model) = (engine.clone(), file.clone(), model.clone());
        threads.push(thread::spawn(move || {
            for i in 0..4 {
                checked_read(&engine, &file, (t * 5 + i) % PAGES, &model, 1);
            }
        }));
    }
    {
        let (engine, file, model) = (engine.clone(), file.clone(), model.clone());
        threads.push(thread::spawn(move || {
            let mut log = bpe_core::BehindLog::default();
            for (i, page) in [1u64, 6, 1, 2].into_iter().enumerate() {
                let version = 1001 + i as u64;
                let bytes = page_bytes(page, version, PAGE);
                engine
                    .write_page_behind(&file, page, &bytes, bpe_core::Via(None), &mut log)
                    .unwrap();
                model[page as usize].store(version, SeqCst);
            }
            engine
                .write_back(&file, &mut log, bpe_core::Via(None))
                .unwrap();
        }));
    }
    {
        let (engine, ext_path) = (engine.clone(), ext_path.clone());
        threads.push(thread::spawn(move || {
            engine.drop_clean_buffers();
            let _ = engine.set_max_memory(40 << 10);
            if with_extension {
                let _ = engine.disable_extension();
                let _ = engine.enable_extension(&ext_path, 3 << 20);
            }
            engine.drop_clean_buffers();
        }));
    }
    for t in threads {
        t.join().unwrap();
    }
    for p in 0..PAGES {
        checked_read(&engine, &file, p, &model, 1);
    }
    engine.check_invariants();
    assert_eq!(engine.dirty_bytes(), 0);
    let _ = engine.disable_extension();
    engine.close_file(&file);
    let fresh = small_engine();
    let file = fresh.open_file(&path, PAGE).unwrap();
    for p in 0..PAGES {
        let mut buf = vec![0u8; PAGE];
        fresh.read_page(&file, p, &mut buf).unwrap();
        let want = model[p as usize].load(SeqCst);
        assert_eq!(decode(&buf), Some((p, want)), "page {p} in the file");
    }
}

#[test]
fn write_behind_under_random_schedules() {
    shuttle::check_random(|| writes_behind(true), iterations(150));
}

#[test]
fn write_behind_under_pct_schedules() {
    shuttle::check_pct(|| writes_behind(false), iterations(150), 3);
}

/// Two files opened, read, invalidated and closed from several threads: a read never returns
/// the other file's bytes, whatever the order of opens, closes and new keys.
fn files_come_and_go() {
    let dir = tempdir();
    let paths = [make_tagged(dir.path(), 1), make_tagged(dir.path(), 2)];
    let engine = small_engine();
    let model: Arc<Vec<AtomicU64>> = Arc::new((0..PAGES).map(|_| AtomicU64::new(0)).collect());
    let threads: Vec<_> = (0..3usize)
        .map(|t| {
            let (engine, paths, model) = (engine.clone(), paths.clone(), model.clone());
            thread::spawn(move || {
                for round in 0..2usize {
                    let n = (t + round) % 2;
                    let f = engine.open_file(&paths[n], PAGE).unwrap();
                    checked_read(
                        &engine,
                        &f,
                        (t + round) as u64 % PAGES,
                        &model,
                        n as u64 + 1,
                    );
                    if (t + round) % 2 == 0 {
                        engine.invalidate_file(&f);
                    }
                    checked_read(&engine, &f, PAGES - 1 - round as u64, &model, n as u64 + 1);
                    engine.close_file(&f);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    engine.check_invariants();
}

/// A warm restart racing writes: a first engine reads every page (each reaches its extension at
/// load) and closes, leaving a checkpoint; a second one takes the file over, restores and adopts
/// the file's pages on its writer thread while another thread writes pages and readers check
/// them. No interleaving may serve a page older than a write that completed before the read.
fn restart_under_writes() {
    let dir = tempdir();
    // A region's worth of pages: the writer writes a full batch without waiting for more (a
    // timed wait never ends under Shuttle), so that schedules where it runs before the close
    // leave pages to restore.
    let path = make_tagged_pages(dir.path(), 1, REGION_PAGES);
    // Older than the racy window: the first engine can vouch for the file's stamp.
    std::thread::sleep(std::time::Duration::from_millis(35));
    let ext_path = dir.path().join("ext.bpe");
    {
        let engine = small_engine();
        engine.enable_extension(&ext_path, 2 << 20).unwrap();
        let file = engine.open_file(&path, PAGE).unwrap();
        let model: Vec<AtomicU64> = (0..REGION_PAGES).map(|_| AtomicU64::new(1000)).collect();
        for p in 0..REGION_PAGES {
            checked_read(&engine, &file, p, &model, 1);
        }
        engine.close_extension().unwrap();
        engine.close_file(&file);
    }
    let engine = small_engine();
    engine.enable_extension(&ext_path, 2 << 20).unwrap();
    let file = engine.open_file(&path, PAGE).unwrap();
    let model: Arc<Vec<AtomicU64>> = Arc::new((0..PAGES).map(|_| AtomicU64::new(1000)).collect());
    let mut threads = Vec::new();
    for t in 0..2u64 {
        let (engine, file, model) = (engine.clone(), file.clone(), model.clone());
        threads.push(thread::spawn(move || {
            for i in 0..4 {
                checked_read(&engine, &file, (t * 5 + i * 2) % PAGES, &model, 1);
            }
        }));
    }
    {
        let (engine, file, model) = (engine.clone(), file.clone(), model.clone());
        threads.push(thread::spawn(move || {
            for (i, page) in [2u64, 5].into_iter().enumerate() {
                let version = 1001 + i as u64;
                engine
                    .write_page(&file, page, &page_bytes(page, version, PAGE))
                    .unwrap();
                model[page as usize].store(version, SeqCst);
            }
        }));
    }
    for t in threads {
        t.join().unwrap();
    }
    assert!(engine.wait_for_extension_restore(std::time::Duration::from_secs(60)));
    for p in 0..PAGES {
        checked_read(&engine, &file, p, &model, 1);
    }
    engine.check_invariants();
    let _ = engine.disable_extension();
    engine.close_file(&file);
}

#[test]
fn restart_under_random_schedules() {
    shuttle::check_random(restart_under_writes, iterations(100));
}

#[test]
fn restart_under_pct_schedules() {
    shuttle::check_pct(restart_under_writes, iterations(100), 3);
}

#[test]
fn file_lifecycle_under_random_schedules() {
    shuttle::check_random(files_come_and_go, iterations(300));
}

#[test]
fn file_lifecycle_under_pct_schedules() {
    shuttle::check_pct(files_come_and_go, iterations(300), 3);
}
