//! Where pages come from and go: L1, L2, readahead, scan resistance, drop clean buffers.

mod common;
use bpe_core::Tier;
use common::*;

#[test]
fn evicted_pages_are_served_from_the_extension_after_sequential_writes() {
    let dir = tempdir();
    let path = make_file(dir.path(), "data", 600, PAGE);
    let engine = engine(512 << 10); // ~120 pages of RAM for a 600-page file
    let f = engine.open_file(&path, PAGE).unwrap();
    engine
        .enable_extension(&dir.path().join("ext.bpe"), 8 << 20)
        .unwrap();
    // Random order: no readahead, so every page comes from the data file once.
    let order: Vec<u64> = (0..600u64).map(|i| (i * 7919) % 600).collect();
    for &p in &order {
        let (bytes, _) = read(&engine, &f, p);
        assert_eq!(decode(&bytes), Some((p, 0)));
    }
    assert!(engine.wait_for_extension_writes(WAIT));
    let mut from_ext = 0;
    for &p in &order {
        let (bytes, tier) = read(&engine, &f, p);
        assert_eq!(decode(&bytes), Some((p, 0)));
        from_ext += (tier == Tier::Extension) as usize;
    }
    let c = engine.counters();
    assert!(
        from_ext > 300,
        "only {from_ext} of 600 pages came from the extension"
    );
    assert_eq!(c.ext_page_reads as usize, from_ext);
    // In random order each L2 hit is a request of its own, and each request is timed.
    assert_eq!(c.ext_read_requests, c.ext_page_reads);
    assert!(c.ext_read_micros > 0);
    // Every data-file read is timed too: the first pass alone made 600 of them.
    assert!(c.page_read_requests >= 600, "{}", c.page_read_requests);
    assert!(c.page_read_micros > 0);
    assert!(
        c.ext_page_writes >= 400,
        "{} extension writes",
        c.ext_page_writes
    );
    assert!(
        c.ext_sequential_write_percent >= 99,
        "{}% sequential",
        c.ext_sequential_write_percent
    );
    assert!(c.ext_allocated_pages > 0 && c.ext_in_use_percent > 0);
    // Pages promoted back to RAM and evicted again are not written a second time.
    let writes_before = c.ext_page_writes;
    for &p in order.iter().take(200) {
        read(&engine, &f, p);
    }
    assert!(engine.wait_for_extension_writes(WAIT));
    let rewritten = engine.counters().ext_page_writes - writes_before;
    assert!(
        rewritten < 50,
        "{rewritten} unchanged pages were written to the extension again"
    );
}

#[test]
fn pages_read_from_the_data_file_reach_the_extension_once_and_are_not_written_at_eviction() {
    let dir = tempdir();
    let path = make_file(dir.path(), "data", 200, PAGE);
    let engine = engine(4 << 20); // room for the whole file in RAM
    let f = engine.open_file(&path, PAGE).unwrap();
    engine
        .enable_extension(&dir.path().join("ext.bpe"), 8 << 20)
        .unwrap();
    for p in 0..200u64 {
        read(&engine, &f, (p * 37) % 200);
    }
    assert!(engine.wait_for_extension_writes(WAIT));
    let c = engine.counters();
    assert_eq!(c.lazy_writes, 0, "nothing was evicted");
    assert_eq!(
        c.ext_page_writes, 200,
        "every page read from the data file is admitted to the extension at load"
    );
    // A rewritten page loses its L2 copy; evicting everything then writes only that page.
    engine.write_page(&f, 5, &page_bytes(5, 1, PAGE)).unwrap();
    engine.set_max_memory(256 << 10).unwrap();
    for p in 100..200u64 {
        read(&engine, &f, p); // from L2: pushes page 5 out of RAM
    }
    assert!(engine.wait_for_extension_writes(WAIT));
    let in_ram = |p: u64| {
        engine
            .descriptors()
            .iter()
            .any(|d| d.page == p && d.tier == Tier::Memory)
    };
    assert!(!in_ram(5), "page 5 should have been evicted");
    assert!(engine.counters().lazy_writes > 100);
    assert_eq!(engine.counters().ext_page_writes, 201);
    let (bytes, _) = read(&engine, &f, 5);
    assert_eq!(decode(&bytes), Some((5, 1)));
}

/// The ring is written in order, so without care a page read again and again through the
/// extension keeps its first copy until the ring comes round and overwrites it, and its next
/// read goes to the data file, while the rest of the ring holds pages nobody reads. A page whose
/// copy has reached the older half of the ring is written anew at the head when it leaves RAM.
/// Here a hot set, read every round through the extension, lives beside a stream of cold pages
/// that turns the ring over about three times: the hot pages never go back to the data file.
#[test]
fn pages_still_read_are_written_again_before_the_ring_overwrites_them() {
    for sharing in [bpe_core::Sharing::Private, bpe_core::Sharing::Shared] {
        hot_pages_outlive_the_ring(sharing);
    }
}

fn hot_pages_outlive_the_ring(sharing: bpe_core::Sharing) {
    let dir = tempdir();
    let path = make_file(dir.path(), "data", 7000, PAGE);
    let engine = engine(512 << 10); // ~120 pages of RAM
    let f = engine.open_file(&path, PAGE).unwrap();
    // 15 regions of 128 pages (and the checkpoint slots).
    engine
        .enable_extension_as(&dir.path().join("ext.bpe"), 8 << 20, sharing)
        .unwrap();
    let hot: Vec<u64> = (0..200u64).map(|i| (i * 7919) % 200).collect();
    let mut cold = (200..7000u64).map(|i| 200 + (i * 7919) % 6800);
    let mut hot_from_file = Vec::new();
    for round in 0..20 {
        let mut from_file = 0;
        for &p in &hot {
            let (bytes, tier) = read(&engine, &f, p);
            assert_eq!(decode(&bytes), Some((p, 0)));
            from_file += (tier == Tier::DataFile) as usize;
        }
        hot_from_file.push(from_file);
        // 320 pages never read again: two and a half regions of the ring a round.
        for p in cold.by_ref().take(320) {
            read(&engine, &f, p);
        }
        assert!(
            engine.wait_for_extension_writes(WAIT),
            "{sharing:?} round {round}"
        );
    }
    let c = engine.counters();
    assert!(
        c.ext_page_evictions > 2000,
        "{sharing:?}: the ring did not turn over: {} pages evicted from it",
        c.ext_page_evictions
    );
    assert_eq!(hot_from_file[0], 200, "the first round reads the data file");
    assert_eq!(
        hot_from_file[1..].iter().sum::<usize>(),
        0,
        "{sharing:?}: hot pages read from the data file again, by round: {hot_from_file:?}"
    );
}

/// Only a copy that served a read is renewed. A page read from the data file is admitted to the
/// extension then; where RAM holds pages longer than half a turn of the ring, its copy is in
/// the older half when it leaves RAM, and renewing it there wrote every page twice: the ring
/// turned twice as fast, and a scan a little larger than it found nothing left (faults.rs).
#[test]
fn pages_read_from_the_data_file_are_written_to_the_extension_once() {
    for sharing in [bpe_core::Sharing::Private, bpe_core::Sharing::Shared] {
        let dir = tempdir();
        let path = make_file(dir.path(), "data", 1200, PAGE);
        let engine = engine(512 << 10); // ~120 pages of RAM: less than a region of the ring
        let f = engine.open_file(&path, PAGE).unwrap();
        engine
            .enable_extension_as(&dir.path().join("ext.bpe"), 2 << 20, sharing)
            .unwrap();
        // Out of order, so that no readahead reads pages ahead of their reader.
        for i in 0..1200u64 {
            read(&engine, &f, (i * 7919) % 1200);
            if i % 32 == 31 {
                // The writer keeps up, so no admission is dropped for being behind.
                assert!(engine.wait_for_extension_writes(WAIT), "{sharing:?}");
            }
        }
        assert!(engine.wait_for_extension_writes(WAIT), "{sharing:?}");
        let c = engine.counters();
        assert_eq!(c.ext_admissions_dropped, 0, "{sharing:?}");
        assert!(
            c.lazy_writes > 1000,
            "{sharing:?}: RAM did not turn over: {} evictions",
            c.lazy_writes
        );
        assert_eq!(
            c.ext_page_writes, 1200,
            "{sharing:?}: pages read once from the data file were written to the extension again"
        );
    }
}

#[test]
fn a_write_drops_the_extension_copy_before_returning() {
    let dir = tempdir();
    let path = make_file(dir.path(), "data", 300, PAGE);
    let engine = engine(256 << 10);
    let f = engine.open_file(&path, PAGE).unwrap();
    engine
        .enable_extension(&dir.path().join("ext.bpe"), 4 << 20)
        .unwrap();
    for p in 0..300 {
        read(&engine, &f, (p * 31) % 300);
    }
    assert!(engine.wait_for_extension_writes(WAIT));
    let in_ext: Vec<u64> = engine
        .descriptors()
        .iter()
        .filter(|d| d.tier == Tier::Extension)
        .map(|d| d.page)
        .collect();
    assert!(!in_ext.is_empty());
    let in_ext_now = |p: u64| {
        engine
            .descriptors()
            .iter()
            .any(|d| d.tier == Tier::Extension && d.page == p)
    };
    for &p in &in_ext {
        engine.write_page(&f, p, &page_bytes(p, 7, PAGE)).unwrap();
        assert!(
            !in_ext_now(p),
            "page {p} kept its extension copy after a write"
        );
    }
    // Push the new versions out of RAM (into the extension, as new clean copies) and read back.
    for p in (0..300).filter(|p| !in_ext.contains(p)) {
        read(&engine, &f, p);
    }
    assert!(engine.wait_for_extension_writes(WAIT));
    let mut served_by_ext = 0;
    for &p in &in_ext {
        let (bytes, tier) = read(&engine, &f, p);
        assert_eq!(
            decode(&bytes),
            Some((p, 7)),
            "page {p} from {tier:?} is stale"
        );
        served_by_ext += (tier == Tier::Extension) as usize;
    }
    assert!(
        served_by_ext > 0,
        "the new versions never went through the extension"
    );
}

/// 3,000 pages on disk, 1 MB of RAM (~250 frames) and 60 hot pages, each read three times.
struct HotSet {
    _dir: tempfile::TempDir,
    engine: std::sync::Arc<bpe_core::Engine>,
    f: bpe_core::FileHandle,
    hot: Vec<u64>,
}

impl HotSet {
    const PAGES: u64 = 3000;

    fn new() -> Self {
        let dir = tempdir();
        let path = make_file(dir.path(), "data", Self::PAGES, PAGE);
        let engine = bpe_core::Engine::new(bpe_core::Config {
            max_memory: 1 << 20,
            readahead: false,
            ..Default::default()
        });
        let f = engine.open_file(&path, PAGE).unwrap();
        let hot: Vec<u64> = (0..60).map(|i| i * 41).collect();
        for _ in 0..3 {
            for &p in &hot {
                read(&engine, &f, p);
            }
        }
        HotSet {
            _dir: dir,
            engine,
            f,
            hot,
        }
    }

    fn cold(&self) -> impl Iterator<Item = u64> + '_ {
        (0..Self::PAGES).filter(|p| !self.hot.contains(p))
    }

    /// How many hot pages are still in RAM; each must read as `version`.
    fn still_in_memory(&self, version: u64) -> usize {
        self.hot
            .iter()
            .filter(|&&p| {
                let (bytes, tier) = read(&self.engine, &self.f, p);
                assert_eq!(decode(&bytes), Some((p, version)), "page {p}");
                tier == Tier::Memory
            })
            .count()
    }
}

#[test]
fn a_large_scan_does_not_flush_the_hot_set() {
    let h = HotSet::new();
    for p in h.cold() {
        read(&h.engine, &h.f, p);
    }
    let still_hot = h.still_in_memory(0);
    assert!(
        still_hot >= 54,
        "only {still_hot} of 60 hot pages survived a 3000-page scan"
    );
}

/// A WAL checkpoint (or a rollback-mode commit) rewrites the hot pages, and in WAL mode SQLite
/// reads them from the WAL meanwhile, not from L1: the rewritten frames see no access before the
/// next scan. They must keep the standing the old frames had.
#[test]
fn rewritten_hot_pages_keep_their_place_through_a_scan() {
    let h = HotSet::new();
    for &p in &h.hot {
        h.engine
            .write_page(&h.f, p, &page_bytes(p, 1, PAGE))
            .unwrap();
    }
    for p in h.cold() {
        read(&h.engine, &h.f, p);
    }
    let still_hot = h.still_in_memory(1);
    assert!(
        still_hot >= 54,
        "only {still_hot} of 60 rewritten hot pages survived a 3000-page scan"
    );
}

/// A large UPDATE reads each page once and writes it: its rewrites must stay on probation, as
/// the reads alone would, and leave the hot set in RAM.
#[test]
fn a_scan_that_writes_does_not_flush_the_hot_set() {
    let h = HotSet::new();
    for p in h.cold() {
        read(&h.engine, &h.f, p);
        h.engine
            .write_page(&h.f, p, &page_bytes(p, 1, PAGE))
            .unwrap();
    }
    let still_hot = h.still_in_memory(0);
    assert!(
        still_hot >= 54,
        "only {still_hot} of 60 hot pages survived a 3000-page scan that wrote every page"
    );
}

#[test]
fn sequential_reads_are_served_by_readahead() {
    let dir = tempdir();
    let path = make_file(dir.path(), "data", 512, PAGE);
    let engine = engine(8 << 20);
    let f = engine.open_file(&path, PAGE).unwrap();
    for p in 0..512 {
        assert_eq!(decode(&read(&engine, &f, p).0), Some((p, 0)));
        // The windows read ahead land before the next read: on a loaded machine the reader
        // would otherwise outrun them and the count would measure the scheduler.
        assert!(engine.wait_for_readahead(WAIT));
    }
    let c = engine.counters();
    assert!(
        c.readahead_pages > 400,
        "{} pages read ahead",
        c.readahead_pages
    );
    assert_eq!(c.page_reads, 512, "every page read from disk exactly once");
    assert!(c.l1_hits > 400);
}

#[test]
fn drop_clean_buffers_empties_both_tiers() {
    let dir = tempdir();
    let path = make_file(dir.path(), "data", 200, PAGE);
    let engine = engine(256 << 10);
    let f = engine.open_file(&path, PAGE).unwrap();
    engine
        .enable_extension(&dir.path().join("ext.bpe"), 2 << 20)
        .unwrap();
    for p in 0..200 {
        read(&engine, &f, (p * 13) % 200);
    }
    assert!(engine.wait_for_extension_writes(WAIT));
    assert!(!engine.descriptors().is_empty());
    engine.drop_clean_buffers();
    assert!(engine.descriptors().is_empty());
    let c = engine.counters();
    assert_eq!((c.database_pages, c.ext_allocated_pages), (0, 0));
    assert_eq!(read(&engine, &f, 5).1, Tier::DataFile);
}

#[test]
fn shrinking_memory_evicts_at_once_and_growing_takes_effect() {
    let dir = tempdir();
    let path = make_file(dir.path(), "data", 400, PAGE);
    let engine = engine(4 << 20);
    let f = engine.open_file(&path, PAGE).unwrap();
    for p in 0..400 {
        read(&engine, &f, (p * 17) % 400);
    }
    assert_eq!(engine.counters().database_pages, 400);
    engine.set_max_memory(512 << 10).unwrap();
    let c = engine.counters();
    assert!(
        c.database_pages <= 128 && c.memory_bytes <= 512 << 10,
        "{c:?}"
    );
    engine.check_invariants();
    engine.set_max_memory(4 << 20).unwrap();
    for p in 0..400 {
        read(&engine, &f, p);
    }
    assert_eq!(engine.counters().database_pages, 400);
}

#[test]
fn past_end_of_file_is_short_and_not_cached() {
    let dir = tempdir();
    let path = make_file(dir.path(), "data", 4, PAGE);
    let engine = engine(1 << 20);
    let f = engine.open_file(&path, PAGE).unwrap();
    let mut buf = vec![1u8; PAGE];
    let r = engine.read_page(&f, 9, &mut buf).unwrap();
    assert_eq!(r.len, 0);
    assert!(buf.iter().all(|&b| b == 0));
    assert_eq!(engine.counters().database_pages, 0);
}

/// Descriptors of this process open on the file `path` names.
/// A miss reads into a slot of L1 that an earlier page may have held: past end of file, the
/// part the file lacks reads as zeros, never as what the slot held before.
#[test]
fn past_end_of_file_is_zeros_even_in_a_slot_an_earlier_page_held() {
    let dir = tempdir();
    let path = make_file(dir.path(), "data", 4, PAGE);
    let engine = engine(1 << 20);
    let f = engine.open_file(&path, PAGE).unwrap();
    for p in 0..4 {
        read(&engine, &f, p);
    }
    engine.forget_pages(&f, &[0, 1, 2, 3]); // their slots are free again, bytes and all
    let mut buf = vec![1u8; PAGE];
    let r = engine.read_page(&f, 9, &mut buf).unwrap();
    assert_eq!(r.len, 0);
    assert!(
        buf.iter().all(|&b| b == 0),
        "bytes of an earlier page leaked"
    );
}

fn open_descriptors_of(path: &std::path::Path) -> usize {
    use std::os::unix::fs::MetadataExt;
    let want = std::fs::metadata(path).unwrap().ino();
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| std::fs::metadata(e.ok()?.path()).ok())
        .filter(|m| m.ino() == want)
        .count()
}

#[test]
fn files_opened_twice_share_one_entry_and_closing_the_last_keeps_pages_for_a_reopen() {
    let dir = tempdir();
    let path = make_file(dir.path(), "data", 8, PAGE);
    let link = dir.path().join("alias");
    std::fs::hard_link(&path, &link).unwrap();
    let engine = engine(1 << 20);
    let a = engine.open_file(&path, PAGE).unwrap();
    let b = engine.open_file(&link, PAGE).unwrap();
    assert_eq!(a.id, b.id, "two names of one inode must share cached pages");
    read(&engine, &a, 1);
    assert_eq!(read(&engine, &b, 1).1, Tier::Memory);
    engine.close_file(&a);
    assert_eq!(
        read(&engine, &b, 1).1,
        Tier::Memory,
        "pages kept while an opener remains"
    );
    let descriptors = open_descriptors_of(&path);
    assert!(descriptors > 0);
    engine.close_file(&b);
    // A connection pool, or a connection per request, closes and reopens: the descriptors
    // wait for the reopen, and the cache survives while the file is unchanged.
    assert_eq!(
        open_descriptors_of(&path),
        descriptors,
        "closed at the last close"
    );
    let c = engine.open_file(&path, PAGE).unwrap();
    assert_eq!(
        open_descriptors_of(&path),
        descriptors,
        "the reopen opened the file again"
    );
    assert_eq!(c.id, a.id);
    assert_eq!(
        read(&engine, &c, 1).1,
        Tier::Memory,
        "reopen lost the cache"
    );
    engine.close_file(&c);
    // They are closed once as many other files have closed since as keep theirs.
    for i in 0..bpe_core::PARKED_FILES {
        let other = make_file(dir.path(), &format!("other{i}"), 1, PAGE);
        let h = engine.open_file(&other, PAGE).unwrap();
        engine.close_file(&h);
    }
    assert_eq!(
        open_descriptors_of(&path),
        0,
        "descriptors outlived the files closed after it"
    );
    // Changed while nobody had it open: the reopen forgets what was cached.
    let mut all = std::fs::read(&path).unwrap();
    all[PAGE..2 * PAGE].copy_from_slice(&page_bytes(1, 7, PAGE));
    std::fs::write(&path, all).unwrap();
    let d = engine.open_file(&path, PAGE).unwrap();
    let (bytes, tier) = read(&engine, &d, 1);
    assert_eq!(decode(&bytes), Some((1, 7)), "stale page after a reopen");
    assert_eq!(tier, Tier::DataFile);
    assert_eq!(engine.counters().file_invalidations, 1);
}

#[test]
fn data_files_are_read_with_o_direct_where_the_file_system_allows() {
    let dir = tempdir();
    let path = make_file(dir.path(), "data", 2, PAGE);
    let engine = engine(1 << 20);
    engine.open_file(&path, PAGE).unwrap();
    let probe = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(&path)
        .is_ok();
    assert_eq!(engine.files()[0].direct_io, probe);
    assert_eq!(engine.counters().buffered_data_files, u64::from(!probe));
}

use std::os::unix::fs::OpenOptionsExt;

/// A file another program rewrites several times a second (each change empties its
/// cache) has its misses read through the OS page cache, where that program's writes are; the
/// pages read are still the file's current ones.
#[test]
fn a_file_rewritten_several_times_a_second_is_read_through_the_os_page_cache() {
    let dir = tempdir();
    let path = make_file(dir.path(), "data", 8, PAGE);
    let engine = engine(1 << 20);
    let f = engine.open_file(&path, PAGE).unwrap();
    if !f.is_direct() {
        return; // O_DIRECT refused here: every read goes through the OS page cache anyway
    }
    for version in 1..=3 {
        use std::os::unix::fs::FileExt;
        let plain = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        plain
            .write_all_at(&page_bytes(5, version, PAGE), 5 * PAGE as u64)
            .unwrap();
        engine.invalidate_file(&f); // what the client's change detection does
        assert_eq!(decode(&read(&engine, &f, 5).0), Some((5, version)));
        assert_eq!(
            engine.files()[0].direct_io,
            version < 3,
            "after rewrite {version}"
        );
    }
    assert_eq!(engine.counters().buffered_data_files, 1);
}

#[test]
fn small_pages_round_out_to_whole_blocks() {
    let dir = tempdir();
    let path = make_file(dir.path(), "data", 64, 1024);
    let engine = engine(1 << 20);
    let f = engine.open_file(&path, 1024).unwrap();
    for p in [3u64, 0, 63, 17] {
        let mut buf = vec![0u8; 1024];
        engine.read_page(&f, p, &mut buf).unwrap();
        assert_eq!(decode(&buf), Some((p, 0)));
    }
    engine.write_page(&f, 5, &page_bytes(5, 3, 1024)).unwrap();
    engine.write_page(&f, 64, &page_bytes(64, 3, 1024)).unwrap();
    assert_eq!(
        std::fs::metadata(&path).unwrap().len(),
        65 * 1024,
        "a sub-block write grew the file by a block"
    );
    engine.drop_clean_buffers();
    let mut buf = vec![0u8; 1024];
    engine.read_page(&f, 5, &mut buf).unwrap();
    assert_eq!(decode(&buf), Some((5, 3)));
    engine.read_page(&f, 4, &mut buf).unwrap();
    assert_eq!(decode(&buf), Some((4, 0)));
}

#[test]
fn page_size_change_drops_the_files_cached_pages() {
    let dir = tempdir();
    let path = make_file(dir.path(), "data", 16, PAGE);
    let engine = engine(1 << 20);
    let f = engine.open_file(&path, PAGE).unwrap();
    read(&engine, &f, 2);
    engine.set_page_size(&f, 8192).unwrap();
    assert!(
        engine.descriptors().is_empty(),
        "pages of the old size still cached"
    );
    let mut buf = vec![0u8; 8192];
    engine.read_page(&f, 1, &mut buf).unwrap();
    assert_eq!(decode(&buf[..PAGE]), Some((2, 0)));
    assert!(engine.set_page_size(&f, 3000).is_err());
}

#[test]
fn a_sequential_scan_keeps_its_readahead_across_pages_already_cached() {
    // As a b-tree scan meets interior pages between runs of leaves: every 20th page is cached.
    let dir = tempdir();
    let path = make_file(dir.path(), "data", 600, PAGE);
    let engine = engine(8 << 20);
    let f = engine.open_file(&path, PAGE).unwrap();
    for p in (0..600).step_by(20) {
        read(&engine, &f, p);
    }
    let scattered = engine.counters();
    assert_eq!(scattered.readahead_pages, 0, "scattered reads");
    for p in 0..600 {
        let (bytes, _) = read(&engine, &f, p);
        assert_eq!(decode(&bytes), Some((p, 0)));
        // The windows read ahead in the background land before the next read: on a loaded
        // machine the scan would otherwise outrun them and the counts would measure the
        // scheduler (as in `sequential_reads_are_served_by_readahead`).
        assert!(engine.wait_for_readahead(WAIT));
    }
    let c = engine.counters();
    let loaded_by_scan: u64 = 600 - 30;
    // Requests: the 3 single-page misses that start the run, then one per 256 KiB window. The
    // cached pages neither end a window nor reset the run.
    let requests = c.page_read_requests - scattered.page_read_requests;
    assert!(
        requests <= 3 + loaded_by_scan.div_ceil(63),
        "{requests} data-file requests for {loaded_by_scan} pages"
    );
    assert!(
        c.readahead_pages >= loaded_by_scan - 3,
        "{} of {loaded_by_scan} pages came by readahead",
        c.readahead_pages
    );
}

#[test]
fn a_scan_served_by_the_extension_reads_consecutive_slots_ahead() {
    let dir = tempdir();
    let path = make_file(dir.path(), "data", 600, PAGE);
    let engine = engine(512 << 10); // ~120 pages of RAM
    let f = engine.open_file(&path, PAGE).unwrap();
    engine
        .enable_extension(&dir.path().join("ext.bpe"), 8 << 20)
        .unwrap();
    // The first scan admits pages to L2 as it reads them: in scan order, into consecutive slots.
    for p in 0..600 {
        read(&engine, &f, p);
    }
    assert!(engine.wait_for_extension_writes(WAIT));
    let before = engine.counters();
    let reads_before = before.ext_page_reads;
    let mut tiers = std::collections::HashMap::new();
    for p in 0..600 {
        let (bytes, tier) = read(&engine, &f, p);
        assert_eq!(decode(&bytes), Some((p, 0)));
        *tiers.entry(tier).or_insert(0) += 1;
        // As above: a background window lands before the next read, or a scan on a loaded
        // machine outruns it (216 of 600 pages read one at a time in one CI rehearsal).
        assert!(engine.wait_for_readahead(WAIT));
    }
    let from_data = tiers.get(&Tier::DataFile).copied().unwrap_or(0);
    let from_ext_one_by_one = tiers.get(&Tier::Extension).copied().unwrap_or(0);
    assert_eq!(from_data, 0, "{tiers:?}");
    // A page that came by L2 readahead is an L1 hit when the scan reaches it.
    assert!(
        from_ext_one_by_one <= 40,
        "{from_ext_one_by_one} pages were read from L2 one at a time ({tiers:?})"
    );
    let after = engine.counters();
    let ext_reads = after.ext_page_reads - reads_before;
    assert!(ext_reads >= 480, "{ext_reads} pages came from L2");
    // The timed requests count requests, not pages: readahead brought many pages per request.
    let requests = after.ext_read_requests - before.ext_read_requests;
    assert!(
        requests * 4 <= ext_reads,
        "{requests} L2 read requests for {ext_reads} pages"
    );
}

/// Pages in a readahead window (the page read and the pages after it): READAHEAD_BYTES, at most
/// max server memory / READAHEAD_MEMORY_DIVISOR.
fn readahead_window(memory: u64) -> u64 {
    (bpe_core::config::READAHEAD_BYTES as u64)
        .min(memory / bpe_core::config::READAHEAD_MEMORY_DIVISOR)
        / PAGE as u64
}

/// Whether `page` (of the only file) is in L1.
fn in_memory(engine: &bpe_core::Engine, page: u64) -> bool {
    let l1 = |d: &bpe_core::BufferDescriptor| d.tier == Tier::Memory && d.page == page;
    engine.descriptors().iter().any(l1)
}

/// Waits for a background readahead to bring `page` into L1.
fn wait_until_in_memory(engine: &bpe_core::Engine, page: u64) {
    let deadline = std::time::Instant::now() + WAIT;
    while !in_memory(engine, page) {
        assert!(
            std::time::Instant::now() < deadline,
            "the window after the one being read never arrived"
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

#[test]
fn reading_a_page_read_ahead_from_the_extension_fetches_the_next_window_in_the_background() {
    let dir = tempdir();
    let path = make_file(dir.path(), "data", 2400, PAGE);
    let memory = 4u64 << 20; // ~1000 pages of RAM: room for three windows
    let engine = engine(memory);
    let window = readahead_window(memory);
    let (first_end, second_end) = (2 + window - 1, 2 + 2 * (window - 1));
    let f = engine.open_file(&path, PAGE).unwrap();
    engine
        .enable_extension(&dir.path().join("ext.bpe"), 32 << 20)
        .unwrap();
    for p in 0..2400 {
        read(&engine, &f, p);
    }
    assert!(engine.wait_for_extension_writes(WAIT));
    // The scan's later pages filled RAM: its first windows are in L2 only.
    let resident = |page: u64| in_memory(&engine, page);
    // Pages 0-2 arm the stream; page 2's L2 hit reads 3..=first_end ahead in the foreground.
    for p in 0..3 {
        assert_eq!(read(&engine, &f, p).1, Tier::Extension);
    }
    let state = |pages: &[u64]| pages.iter().map(|&p| resident(p)).collect::<Vec<_>>();
    assert_eq!(
        state(&[3, first_end, first_end + 1, second_end]),
        [true, true, false, false]
    );
    // The first read of that window queues the next one for the background thread.
    let before = engine.counters();
    assert_eq!(read(&engine, &f, 3).1, Tier::Memory);
    wait_until_in_memory(&engine, second_end);
    // The window's last page is in; the job ends after it (as in the data-file test below).
    assert!(engine.wait_for_readahead(WAIT));
    let after = engine.counters();
    assert_eq!(after.ext_page_reads - before.ext_page_reads, window - 1);
    // The scan goes on through both windows without a read of its own.
    for p in 4..=second_end {
        let (bytes, tier) = read(&engine, &f, p);
        assert_eq!(decode(&bytes), Some((p, 0)));
        assert_eq!(tier, Tier::Memory, "page {p}");
    }
    engine.check_invariants();
}

#[test]
fn reading_a_page_read_ahead_from_the_data_file_fetches_the_next_window_in_the_background() {
    let dir = tempdir();
    let path = make_file(dir.path(), "data", 2400, PAGE);
    let memory = 8u64 << 20;
    let engine = engine(memory);
    let window = readahead_window(memory);
    let (first_end, second_end) = (2 + window - 1, 2 + 2 * (window - 1));
    let f = engine.open_file(&path, PAGE).unwrap();
    let resident = |page: u64| in_memory(&engine, page);
    // Pages 0-2 arm the stream; page 2's miss reads 3..=first_end with it, in the foreground.
    for p in 0..3 {
        assert_eq!(read(&engine, &f, p).1, Tier::DataFile);
    }
    let state = |pages: &[u64]| pages.iter().map(|&p| resident(p)).collect::<Vec<_>>();
    assert_eq!(
        state(&[3, first_end, first_end + 1, second_end]),
        [true, true, false, false]
    );
    // The first read of that window queues the next one for the background thread.
    let before = engine.counters();
    assert_eq!(read(&engine, &f, 3).1, Tier::Memory);
    wait_until_in_memory(&engine, second_end);
    assert!(engine.wait_for_readahead(WAIT));
    let after = engine.counters();
    assert_eq!(after.readahead_pages - before.readahead_pages, window - 1);
    assert_eq!(after.page_reads - before.page_reads, window - 1);
    // The scan goes on through both windows without a read of its own, and every page is
    // read from the file once.
    for p in 4..=second_end {
        let (bytes, tier) = read(&engine, &f, p);
        assert_eq!(decode(&bytes), Some((p, 0)));
        assert_eq!(tier, Tier::Memory, "page {p}");
    }
    assert!(engine.wait_for_readahead(WAIT));
    for p in second_end + 1..2400 {
        assert_eq!(decode(&read(&engine, &f, p).0), Some((p, 0)));
    }
    assert!(engine.wait_for_readahead(WAIT));
    assert_eq!(engine.counters().page_reads, 2400, "each page read once");
    engine.check_invariants();
}

#[test]
fn a_background_data_file_window_stops_before_the_pages_the_extension_holds() {
    let dir = tempdir();
    let path = make_file(dir.path(), "data", 1200, PAGE);
    let memory = 8u64 << 20;
    let engine = engine(memory);
    let f = engine.open_file(&path, PAGE).unwrap();
    engine
        .enable_extension(&dir.path().join("ext.bpe"), 16 << 20)
        .unwrap();
    // Pages 600.. reach L2: read in random order (no readahead), then pushed out of RAM.
    for i in 0..600u64 {
        read(&engine, &f, 600 + (i * 7) % 600);
    }
    engine.set_max_memory(256 << 10).unwrap();
    assert!(engine.wait_for_extension_writes(WAIT));
    engine.set_max_memory(memory).unwrap();
    let held_before = engine.counters();
    assert!(held_before.ext_allocated_pages >= 500, "{held_before:?}");
    // A cold scan: its data-file windows, the background ones too, end at page 600.
    for p in 0..1200 {
        assert_eq!(decode(&read(&engine, &f, p).0), Some((p, 0)));
    }
    assert!(engine.wait_for_readahead(WAIT));
    let c = engine.counters();
    let from_file = c.page_reads - held_before.page_reads;
    let from_ext = c.ext_page_reads - held_before.ext_page_reads;
    assert!(
        from_file <= 600 + 16,
        "{from_file} pages from the data file"
    );
    assert!(from_ext >= 500, "{from_ext} pages from the extension");
    engine.check_invariants();
}

/// Another program's commits emptying the file's cache within 100 ms of each other: a miss is
/// served from the file and not cached (its copy would be forgotten before a second read);
/// once they stop for longer than that, misses are cached again.
#[test]
fn a_file_emptied_every_few_milliseconds_serves_misses_uncached_until_it_goes_quiet() {
    let dir = tempdir();
    let path = make_file(dir.path(), "data", 16, PAGE);
    let engine = engine(4 << 20);
    let f = engine.open_file(&path, PAGE).unwrap();
    // Each attempt: two invalidations back to back, then the page twice. Retried, because a
    // stall of 100 ms between them (a loaded machine) rightly caches the page.
    let mut uncached = false;
    for _ in 0..20 {
        engine.invalidate_file(&f);
        engine.invalidate_file(&f);
        let (bytes, first) = read(&engine, &f, 5);
        let (again, second) = read(&engine, &f, 5);
        assert_eq!(
            (decode(&bytes), decode(&again)),
            (Some((5, 0)), Some((5, 0)))
        );
        assert_eq!(first, Tier::DataFile);
        if second == Tier::DataFile {
            uncached = true;
            break;
        }
    }
    assert!(uncached, "a miss between commits 0 ms apart was cached");
    std::thread::sleep(std::time::Duration::from_millis(250));
    let (_, first) = read(&engine, &f, 5);
    let (bytes, second) = read(&engine, &f, 5);
    assert_eq!(decode(&bytes), Some((5, 0)));
    assert_eq!(
        (first, second),
        (Tier::DataFile, Tier::Memory),
        "quiet for 250 ms: the miss is cached again"
    );
    engine.check_invariants();
}

/// A miss reads the L2 copy straight into the L1 slot it will be installed in and checks it
/// there: a copy failing its checksum is a miss, the page is read from the data file into the
/// same slot, and what L1 keeps afterwards is the file's page, not the corrupt bytes.
#[test]
fn an_extension_copy_failing_its_checksum_in_place_is_a_miss_then_a_data_file_read() {
    let dir = tempdir();
    let path = make_file(dir.path(), "data", 600, PAGE);
    let engine = engine(512 << 10); // ~120 pages of RAM
    let f = engine.open_file(&path, PAGE).unwrap();
    engine
        .enable_extension(&dir.path().join("ext.bpe"), 8 << 20)
        .unwrap();
    let order: Vec<u64> = (0..600u64).map(|i| (i * 7919) % 600).collect();
    for &p in &order {
        read(&engine, &f, p);
    }
    assert!(engine.wait_for_extension_writes(WAIT));
    let mut checked = 0;
    // Fewer than EXTENSION_FAULT_LIMIT: so many faults in a row would disable the extension.
    for &p in order.iter().filter(|&&p| !in_memory(&engine, p)).take(6) {
        let failures = engine.counters().ext_checksum_failures;
        engine.faults().corrupt_extension_reads(1);
        let (bytes, tier) = read(&engine, &f, p);
        assert_eq!(decode(&bytes), Some((p, 0)), "page {p} as served");
        if engine.counters().ext_checksum_failures == failures {
            continue; // L2 did not hold it after all (the corruption waits for the next read)
        }
        assert_eq!(
            tier,
            Tier::DataFile,
            "page {p}: a corrupt L2 copy is a miss"
        );
        let (again, tier) = read(&engine, &f, p);
        assert_eq!(tier, Tier::Memory);
        assert_eq!(decode(&again), Some((p, 0)), "page {p} as L1 kept it");
        checked += 1;
    }
    engine.faults().corrupt_extension_reads(0);
    assert!(checked >= 4, "only {checked} pages were read from L2");
    engine.check_invariants();
}
