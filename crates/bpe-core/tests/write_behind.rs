//! Write-behind (`engine/write_behind.rs`): a page written behind is served from L1 at once,
//! reaches the data file once at the write-back however often it was written, never leaves L1
//! before that (no eviction, no drop of clean buffers, never to the extension), goes to the
//! extension like any clean page after it, and a failed write-back leaves the file, not a stale
//! or lost copy, as the page.

mod common;
use bpe_core::{BehindLog, Config, DataDevice, Engine, Sharing, Tier, Via};
use common::*;
use std::path::Path;

/// The page's version in the data file itself, past every cache.
fn on_disk(path: &Path, page: u64) -> (u64, u64) {
    let all = std::fs::read(path).unwrap();
    let at = page as usize * PAGE;
    decode(&all[at..at + PAGE]).expect("a whole page on disk")
}

#[test]
fn a_page_written_behind_is_read_at_once_and_reaches_the_file_at_the_write_back() {
    let dir = tempdir();
    let path = make_file(dir.path(), "data", 64, PAGE);
    let engine = engine(8 << 20);
    let f = engine.open_file(&path, PAGE).unwrap();
    let mut log = BehindLog::default();
    engine
        .write_page_behind(&f, 3, &page_bytes(3, 1, PAGE), Via(None), &mut log)
        .unwrap();
    assert_eq!(decode(&read(&engine, &f, 3).0), Some((3, 1)), "read back");
    assert_eq!(
        on_disk(&path, 3),
        (3, 0),
        "not in the file before the write-back"
    );
    assert_eq!(engine.counters().page_writes, 0);
    assert!(engine.dirty_bytes() > 0);

    engine.write_back(&f, &mut log, Via(None)).unwrap();
    assert!(log.is_empty());
    assert_eq!(on_disk(&path, 3), (3, 1));
    assert_eq!(engine.counters().page_writes, 1);
    assert_eq!(engine.dirty_bytes(), 0);
    engine.check_invariants();
}

#[test]
fn a_page_written_behind_many_times_is_written_back_once_at_its_last_version() {
    let dir = tempdir();
    let path = make_file(dir.path(), "data", 64, PAGE);
    let engine = engine(8 << 20);
    let f = engine.open_file(&path, PAGE).unwrap();
    let mut log = BehindLog::default();
    for version in 1..=20 {
        for page in [9, 2, 40, 2, 17] {
            let bytes = page_bytes(page, version, PAGE);
            engine
                .write_page_behind(&f, page, &bytes, Via(None), &mut log)
                .unwrap();
        }
    }
    assert_eq!(log.len(), 100);
    assert_eq!(engine.counters().pages_written_behind, 100);
    engine.write_back(&f, &mut log, Via(None)).unwrap();
    assert_eq!(
        engine.counters().page_writes,
        4,
        "one write per distinct page"
    );
    for page in [2, 9, 17, 40] {
        assert_eq!(on_disk(&path, page), (page, 20));
        assert_eq!(decode(&read(&engine, &f, page).0), Some((page, 20)));
    }
    engine.check_invariants();
}

/// A writer that spills the same few pages over and over keeps a log as long as its pages,
/// not its writes (a transaction may spill millions of times).
#[test]
fn the_log_of_many_rewrites_of_few_pages_stays_short() {
    let dir = tempdir();
    let path = make_file(dir.path(), "data", 64, PAGE);
    let engine = engine(8 << 20);
    let f = engine.open_file(&path, PAGE).unwrap();
    let mut log = BehindLog::default();
    for version in 1..=3000 {
        let page = version % 10;
        engine
            .write_page_behind(
                &f,
                page,
                &page_bytes(page, version, PAGE),
                Via(None),
                &mut log,
            )
            .unwrap();
        assert!(
            log.len() <= 1024,
            "{} keys after {version} writes",
            log.len()
        );
    }
    engine.write_back(&f, &mut log, Via(None)).unwrap();
    assert_eq!(engine.counters().page_writes, 10);
    for page in 0..10 {
        let last = 3000 - (10 - page) % 10;
        assert_eq!(on_disk(&path, page), (page, last));
    }
}

/// The pages written behind stay while a scan of the rest of the file evicts everything else
/// (with an extension, which must never get them), and while clean buffers are dropped: read
/// from the file instead, they would be a version behind.
#[test]
fn dirty_pages_stay_in_l1_through_evictions_and_drop_clean_buffers() {
    let dir = tempdir();
    let path = make_file(dir.path(), "data", 1024, PAGE);
    let engine = engine(2 << 20); // about a quarter of the file
    let f = engine.open_file(&path, PAGE).unwrap();
    engine
        .enable_extension(&dir.path().join("ext.bpe"), 16 << 20)
        .unwrap();
    let mut log = BehindLog::default();
    let dirty: Vec<u64> = (0..40).map(|i| i * 25).collect();
    for &p in &dirty {
        engine
            .write_page_behind(&f, p, &page_bytes(p, 7, PAGE), Via(None), &mut log)
            .unwrap();
    }
    assert_eq!(engine.counters().pages_written_behind, 40);
    for _ in 0..2 {
        for p in 0..1024 {
            let (bytes, _) = read(&engine, &f, p);
            let version = if dirty.contains(&p) { 7 } else { 0 };
            assert_eq!(decode(&bytes), Some((p, version)), "page {p}");
        }
    }
    assert!(engine.counters().lazy_writes > 1000, "the scans evicted");
    assert!(engine.wait_for_extension_writes(WAIT));
    engine.drop_clean_buffers();
    for &p in &dirty {
        assert_eq!(decode(&read(&engine, &f, p).0), Some((p, 7)), "page {p}");
        assert_eq!(on_disk(&path, p), (p, 0));
    }
    engine.check_invariants();
    engine.write_back(&f, &mut log, Via(None)).unwrap();
    for &p in &dirty {
        assert_eq!(on_disk(&path, p), (p, 7));
    }
    engine.check_invariants();
}

#[test]
fn past_its_share_of_l1_a_writer_writes_through() {
    let dir = tempdir();
    let path = make_file(dir.path(), "data", 512, PAGE);
    let engine = engine(2 << 20);
    let f = engine.open_file(&path, PAGE).unwrap();
    let mut log = BehindLog::default();
    for p in 0..512 {
        engine
            .write_page_behind(&f, p, &page_bytes(p, 1, PAGE), Via(None), &mut log)
            .unwrap();
    }
    let behind = engine.counters().pages_written_behind;
    let target = engine.settings().max_memory;
    assert!(
        engine.dirty_bytes() <= target / 4,
        "dirty pages over their share"
    );
    assert!(behind > 50 && behind < 512, "{behind} pages written behind");
    assert_eq!(engine.counters().page_writes, 512 - behind);
    engine.write_back(&f, &mut log, Via(None)).unwrap();
    for p in 0..512 {
        assert_eq!(on_disk(&path, p), (p, 1));
    }
    engine.check_invariants();
}

struct FailingDevice;

impl DataDevice for FailingDevice {
    fn read_at(&self, _offset: u64, _buf: &mut [u8]) -> std::io::Result<usize> {
        Err(std::io::Error::other("broken device"))
    }
    fn write_at(&self, _offset: u64, _data: &[u8]) -> std::io::Result<()> {
        Err(std::io::Error::other("broken device"))
    }
}

/// A failed write-back reports the error and keeps the pages (still the newest bytes) for the
/// next write-back to retry; a writer that gives up discards them, and then the file's bytes
/// are the page, as after a failed write through.
#[test]
fn a_failed_write_back_keeps_the_pages_for_a_retry_or_a_discard() {
    let dir = tempdir();
    let path = make_file(dir.path(), "data", 64, PAGE);
    let engine = engine(8 << 20);
    let f = engine.open_file(&path, PAGE).unwrap();
    let mut log = BehindLog::default();
    for p in [5, 6] {
        engine
            .write_page_behind(&f, p, &page_bytes(p, 3, PAGE), Via(None), &mut log)
            .unwrap();
    }
    let err = engine
        .write_back(&f, &mut log, Via(Some(&FailingDevice)))
        .unwrap_err();
    assert!(err.to_string().contains("broken device"), "{err}");
    assert_eq!(log.len(), 2, "both pages are left to write back");
    for p in [5, 6] {
        assert_eq!(decode(&read(&engine, &f, p).0), Some((p, 3)), "page {p}");
        assert_eq!(on_disk(&path, p), (p, 0));
    }
    engine.check_invariants();
    // The retry writes them.
    engine.write_back(&f, &mut log, Via(None)).unwrap();
    assert!(log.is_empty());
    assert_eq!(on_disk(&path, 5), (5, 3));
    assert_eq!(on_disk(&path, 6), (6, 3));

    // Failed again, and given up: the file's bytes.
    for p in [5, 6] {
        engine
            .write_page_behind(&f, p, &page_bytes(p, 4, PAGE), Via(None), &mut log)
            .unwrap();
    }
    assert!(engine
        .write_back(&f, &mut log, Via(Some(&FailingDevice)))
        .is_err());
    engine.discard_behind(&mut log);
    assert!(log.is_empty());
    assert_eq!(engine.dirty_bytes(), 0);
    for p in [5, 6] {
        assert_eq!(decode(&read(&engine, &f, p).0), Some((p, 3)), "page {p}");
    }
    engine.check_invariants();
}

#[test]
fn with_write_behind_off_every_page_goes_to_the_file_at_once() {
    let dir = tempdir();
    let path = make_file(dir.path(), "data", 64, PAGE);
    let engine = Engine::new(Config {
        max_memory: 8 << 20,
        write_behind: false,
        ..Config::default()
    });
    let f = engine.open_file(&path, PAGE).unwrap();
    let mut log = BehindLog::default();
    engine
        .write_page_behind(&f, 4, &page_bytes(4, 2, PAGE), Via(None), &mut log)
        .unwrap();
    assert!(log.is_empty());
    assert_eq!(on_disk(&path, 4), (4, 2));
    assert_eq!(engine.counters().pages_written_behind, 0);
}

/// Once written back, a page written behind is clean, and when it leaves L1 it goes to the
/// extension, shared or private, as a page written through does: its next read is an L2 hit,
/// never a data-file read (the slow disk), and returns what was written. (A shared extension
/// takes only a page that carries the epoch of its bytes: the write-back must give it one.)
#[test]
fn a_page_written_back_reaches_the_extension_when_it_leaves_l1() {
    for sharing in [Sharing::Shared, Sharing::Private] {
        let dir = tempdir();
        let path = make_file(dir.path(), "data", 1024, PAGE);
        let engine = engine(1 << 20); // about a quarter of the file
        let f = engine.open_file(&path, PAGE).unwrap();
        engine
            .enable_extension_as(&dir.path().join("ext.bpe"), 16 << 20, sharing)
            .unwrap();
        let mut log = BehindLog::default();
        let written: Vec<u64> = (0..40).map(|i| i * 25).collect();
        for &p in &written {
            engine
                .write_page_behind(&f, p, &page_bytes(p, 3, PAGE), Via(None), &mut log)
                .unwrap();
        }
        assert_eq!(engine.counters().pages_written_behind, 40, "{sharing:?}");
        engine.write_back(&f, &mut log, Via(None)).unwrap();
        // The rest of the file, twice, in an order with no runs (no readahead): L1 turns over.
        let others: Vec<u64> = (0..1024u64)
            .map(|i| (i * 7919) % 1024)
            .filter(|p| !written.contains(p))
            .collect();
        for _ in 0..2 {
            for &p in &others {
                read(&engine, &f, p);
            }
        }
        assert!(engine.wait_for_extension_writes(WAIT));
        let mut from_ext = 0;
        for &p in &written {
            let (bytes, tier) = read(&engine, &f, p);
            assert_eq!(decode(&bytes), Some((p, 3)), "{sharing:?}: page {p}");
            assert_ne!(
                tier,
                Tier::DataFile,
                "{sharing:?}: page {p} was read from the file"
            );
            from_ext += (tier == Tier::Extension) as usize;
        }
        assert!(from_ext >= 30, "{sharing:?}: only {from_ext} of 40 from L2");
        engine.check_invariants();
    }
}
