//! Warm restart of a private extension at the core: an engine closes with its extension on, and
//! the next engine that enables an extension at the same path restores the checkpoint the first
//! left and serves the pages from it, but only those of files it can prove unchanged. A shared
//! extension starts warm from the shared memory it leaves instead (shared_engines.rs).
//! SQLite-level and SIGKILL tests are in sqlite-bpe's `restart.rs`.

mod common;

use bpe_core::{Engine, FileHandle, Sharing, Tier};
use common::*;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

const PAGES: u64 = 600;
const EXT: u64 = 16 << 20;
/// Less RAM than the file: most pages live only in the extension.
const MEMORY: u64 = 1 << 20;
/// Where the ring ends in a 16 MiB extension: 31 regions, then the two checkpoint slots.
const RING_END: u64 = EXT - (512 << 10);

/// Makes the data file and waits until its stamp is older than the racy window, so that the
/// engine can vouch for it (a stamp within a clock tick of a write cannot be trusted).
fn settled_file(dir: &Path, name: &str) -> std::path::PathBuf {
    let path = make_file(dir, name, PAGES, PAGE);
    std::thread::sleep(Duration::from_millis(60));
    path
}

/// An engine with the extension at `ext` that reads every page of `data` once (each reaches
/// the extension at load) and closes, leaving a checkpoint.
fn fill_and_close(data: &Path, ext: &Path) {
    let engine = engine(MEMORY);
    engine
        .enable_extension_as(ext, EXT, Sharing::Private)
        .unwrap();
    let f = engine.open_file(data, PAGE).unwrap();
    for p in 0..PAGES {
        let (bytes, _) = read(&engine, &f, p);
        assert_eq!(decode(&bytes), Some((p, 0)));
    }
    assert!(engine.wait_for_extension_writes(WAIT));
    // A readahead job holds the engine while it runs: the engine is gone at `drop` only after.
    assert!(engine.wait_for_readahead(WAIT));
    drop(f);
    drop(engine);
    assert!(ext.exists(), "a closed engine removed its extension file");
}

/// A new engine with the extension at `ext` and `data` open, once the restore has run.
fn restart(data: &Path, ext: &Path) -> (Arc<Engine>, FileHandle) {
    let engine = engine(MEMORY);
    engine
        .enable_extension_as(ext, EXT, Sharing::Private)
        .unwrap();
    let f = engine.open_file(data, PAGE).unwrap();
    assert!(engine.wait_for_extension_restore(WAIT));
    (engine, f)
}

#[test]
fn a_new_engine_serves_the_pages_a_closed_one_left_in_the_extension() {
    let dir = tempdir();
    let data = settled_file(dir.path(), "data");
    let ext = dir.path().join("ext.bpe");
    fill_and_close(&data, &ext);

    let (engine, f) = restart(&data, &ext);
    let c = engine.counters();
    assert!(
        c.ext_pages_restored >= PAGES - 10,
        "{} of {PAGES} pages restored",
        c.ext_pages_restored
    );
    assert_eq!(c.ext_pages_not_restored, 0);
    // The pages that were in the first engine's RAM (the last ones it read) are read back into
    // RAM: a read of them touches neither tier below.
    assert!(engine.wait_for_readahead(WAIT));
    let prewarmed = engine.counters().ext_pages_prewarmed;
    assert!(prewarmed > 50, "{prewarmed} pages prewarmed");
    let before = engine.counters();
    for p in PAGES - 20..PAGES {
        let (bytes, tier) = read(&engine, &f, p);
        assert_eq!(decode(&bytes), Some((p, 0)), "page {p}");
        assert_eq!(tier, Tier::Memory, "page {p} was not read back into RAM");
    }
    assert_eq!(engine.counters().ext_page_reads, before.ext_page_reads);
    let before = engine.counters();
    for p in 0..PAGES {
        let (bytes, _) = read(&engine, &f, p);
        assert_eq!(decode(&bytes), Some((p, 0)), "page {p}");
    }
    let after = engine.counters();
    // Pages come from the extension (some through its readahead, then from RAM), not the disk.
    let from_ext = after.ext_page_reads - before.ext_page_reads;
    let from_disk = after.page_reads - before.page_reads;
    assert!(
        from_ext >= PAGES - 10 && from_disk <= 10,
        "{from_ext} pages from the extension, {from_disk} from the data file"
    );
    engine.check_invariants();
}

#[test]
fn a_file_changed_between_engines_has_none_of_its_pages_restored() {
    let dir = tempdir();
    let data = settled_file(dir.path(), "data");
    let ext = dir.path().join("ext.bpe");
    fill_and_close(&data, &ext);
    // Another program rewrites page 7 while no engine watches (same size, same bytes elsewhere).
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new().write(true).open(&data).unwrap();
        f.write_all_at(&page_bytes(7, 1, PAGE), 7 * PAGE as u64)
            .unwrap();
    }
    let (engine, f) = restart(&data, &ext);
    let c = engine.counters();
    assert_eq!(c.ext_pages_restored, 0);
    assert!(c.ext_pages_not_restored >= PAGES - 10);
    let (bytes, tier) = read(&engine, &f, 7);
    assert_eq!(decode(&bytes), Some((7, 1)), "a stale page was served");
    assert_eq!(tier, Tier::DataFile);
}

/// `fill_and_close`, but the first page is read before the extension is on and kept hot, so
/// that only RAM holds it when the engine closes (as a live database's header usually is).
fn fill_and_close_first_page_in_ram_only(data: &Path, ext: &Path) {
    let engine = engine(MEMORY);
    let f = engine.open_file(data, PAGE).unwrap();
    assert_eq!(decode(&read(&engine, &f, 0).0), Some((0, 0)));
    engine
        .enable_extension_as(ext, EXT, Sharing::Private)
        .unwrap();
    for p in 1..PAGES {
        assert_eq!(decode(&read(&engine, &f, p).0), Some((p, 0)));
        assert_eq!(decode(&read(&engine, &f, 0).0), Some((0, 0)));
    }
    assert!(engine.wait_for_extension_writes(WAIT));
    assert!(engine.wait_for_readahead(WAIT));
    let first_page = |tier| {
        engine
            .descriptors()
            .iter()
            .any(|d| d.page == 0 && d.tier == tier)
    };
    assert!(first_page(Tier::Memory) && !first_page(Tier::Extension));
    drop(f);
    drop(engine);
}

/// Another program rewrites pages 0 and 7 while no engine watches. (Page 0 gets a byte of its
/// own besides: a test page ends in its own CRC, which makes every version of it the same CRC
/// residue, and a real header does not.)
fn rewrite_first_page_and_page_7(data: &Path) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new().write(true).open(data).unwrap();
    let mut first = page_bytes(0, 1, PAGE);
    first[100] ^= 0xff;
    f.write_all_at(&first, 0).unwrap();
    f.write_all_at(&page_bytes(7, 1, PAGE), 7 * PAGE as u64)
        .unwrap();
}

#[test]
fn a_first_page_only_ram_held_is_recorded_and_checked_at_the_next_start() {
    let dir = tempdir();
    let data = settled_file(dir.path(), "data");
    let ext = dir.path().join("ext.bpe");
    fill_and_close_first_page_in_ram_only(&data, &ext);
    {
        let (warm, _f) = restart(&data, &ext);
        let c = warm.counters();
        assert!(
            c.ext_pages_restored >= PAGES - 20 && c.ext_pages_not_restored == 0,
            "unchanged file: {} restored, {} not",
            c.ext_pages_restored,
            c.ext_pages_not_restored
        );
        // Prewarm jobs hold the engine: it (and its hold of the extension) goes only after.
        assert!(warm.wait_for_readahead(WAIT));
    }

    // A change the stamp does not show (a file system whose clock did not move): the first
    // page differs from the checkpoint's record of it, so nothing is restored.
    // The next fill starts from no extension file, as the first did. Over the warm one, its
    // prewarm threads race the reads for RAM and may push the first page out to the ring,
    // and the scenario needs it held by RAM alone.
    std::fs::remove_file(&ext).unwrap();
    fill_and_close_first_page_in_ram_only(&data, &ext);
    rewrite_first_page_and_page_7(&data);
    let engine = engine(MEMORY);
    engine.faults().unmoved_stamps_at_adoption(1);
    engine
        .enable_extension_as(&ext, EXT, Sharing::Private)
        .unwrap();
    let f = engine.open_file(&data, PAGE).unwrap();
    assert!(engine.wait_for_extension_restore(WAIT));
    assert_eq!(engine.counters().ext_pages_restored, 0);
    let (bytes, tier) = read(&engine, &f, 7);
    assert_eq!(decode(&bytes), Some((7, 1)), "a stale page was served");
    assert_eq!(tier, Tier::DataFile);
}

#[test]
fn a_checkpoint_without_a_first_page_to_check_never_vouches_on_the_stamp_alone() {
    let dir = tempdir();
    let data = settled_file(dir.path(), "data");
    let ext = dir.path().join("ext.bpe");
    // Pages 1.. only: neither tier ever held the first page.
    {
        let engine = engine(MEMORY);
        engine
            .enable_extension_as(&ext, EXT, Sharing::Private)
            .unwrap();
        let f = engine.open_file(&data, PAGE).unwrap();
        for p in 1..PAGES {
            assert_eq!(decode(&read(&engine, &f, p).0), Some((p, 0)));
        }
        assert!(engine.wait_for_extension_writes(WAIT));
        assert!(engine.wait_for_readahead(WAIT));
        assert!(!engine.descriptors().iter().any(|d| d.page == 0));
    }
    rewrite_first_page_and_page_7(&data);
    let engine = engine(MEMORY);
    engine.faults().unmoved_stamps_at_adoption(1);
    engine
        .enable_extension_as(&ext, EXT, Sharing::Private)
        .unwrap();
    let f = engine.open_file(&data, PAGE).unwrap();
    assert!(engine.wait_for_extension_restore(WAIT));
    assert_eq!(engine.counters().ext_pages_restored, 0);
    assert!(engine.counters().ext_pages_not_restored > 0);
    let (bytes, _) = read(&engine, &f, 7);
    assert_eq!(decode(&bytes), Some((7, 1)), "a stale page was served");
}

#[test]
fn a_damaged_checkpoint_or_an_unreadable_first_page_starts_cold() {
    let dir = tempdir();
    let data = settled_file(dir.path(), "data");
    let ext = dir.path().join("ext.bpe");
    fill_and_close(&data, &ext);

    // The first page cannot be read to compare with the copy: nothing is taken on trust.
    let engine = engine(MEMORY);
    engine.faults().fail_data_reads(1);
    engine
        .enable_extension_as(&ext, EXT, Sharing::Private)
        .unwrap();
    let _f = engine.open_file(&data, PAGE).unwrap();
    assert!(engine.wait_for_extension_restore(WAIT));
    assert_eq!(engine.counters().ext_pages_restored, 0);
    assert!(engine.counters().ext_pages_not_restored > 0);
    drop(_f);
    drop(engine);

    // Both checkpoint slots damaged: the file is taken over, cold, and works.
    let len = std::fs::metadata(&ext).unwrap().len();
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new().write(true).open(&ext).unwrap();
        for at in (RING_END..len).step_by(4096) {
            f.write_all_at(&[0xa5; 64], at).unwrap();
        }
    }
    let (engine, f) = restart(&data, &ext);
    assert_eq!(engine.counters().ext_pages_restored, 0);
    for p in 0..PAGES {
        assert_eq!(decode(&read(&engine, &f, p).0), Some((p, 0)));
    }
}

#[test]
fn disabling_deletes_the_file_and_the_next_start_is_cold() {
    let dir = tempdir();
    let data = settled_file(dir.path(), "data");
    let ext = dir.path().join("ext.bpe");
    fill_and_close(&data, &ext);
    let (engine, _f) = restart(&data, &ext);
    assert!(engine.counters().ext_pages_restored > 0);
    engine.disable_extension().unwrap();
    assert!(!ext.exists(), "OFF left the file");
}

/// A process killed after its checkpoint may have overwritten regions the checkpoint lists: the
/// restored copies there fail their checksum, and that is a plain miss, not a device fault.
#[test]
fn restored_copies_the_ring_overwrote_since_are_misses_not_faults() {
    let dir = tempdir();
    let data = settled_file(dir.path(), "data");
    let ext = dir.path().join("ext.bpe");
    fill_and_close(&data, &ext);
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new().write(true).open(&ext).unwrap();
        f.write_all_at(&vec![0x5a; RING_END as usize], 0).unwrap();
    }
    let (engine, f) = restart(&data, &ext);
    assert!(engine.counters().ext_pages_restored > 0);
    for p in 0..PAGES {
        assert_eq!(decode(&read(&engine, &f, p).0), Some((p, 0)), "page {p}");
    }
    let c = engine.counters();
    assert_eq!(c.ext_checksum_failures, 0);
    assert_eq!(
        engine.extension_status().state,
        bpe_core::ExtensionState::Enabled,
        "misses taken for faults disabled the extension"
    );
}

/// A killed process leaves the last checkpoint it wrote, and its writer may have gone on into
/// regions the checkpoint lists. The writer therefore never enters more than a sixteenth of the
/// ring (at least one region) past the checkpoint in force without writing another, and a
/// restore treats that stretch as overwritten: here, with periodic checkpoints off, the fill
/// itself must write them as it moves through the ring.
#[test]
fn the_writer_checkpoints_before_it_outruns_the_checkpoint_in_force() {
    let dir = tempdir();
    let data = settled_file(dir.path(), "data");
    let ext = dir.path().join("ext.bpe");
    let engine = Engine::new(bpe_core::Config {
        max_memory: MEMORY,
        checkpoint_interval: Duration::from_secs(3600),
        ..bpe_core::Config::default()
    });
    engine
        .enable_extension_as(&ext, EXT, Sharing::Private)
        .unwrap();
    let f = engine.open_file(&data, PAGE).unwrap();
    // A first checkpoint in force (the bound starts from one).
    engine.close_extension().unwrap();
    engine
        .enable_extension_as(&ext, EXT, Sharing::Private)
        .unwrap();
    assert!(engine.wait_for_extension_restore(WAIT));
    let before = engine.counters().ext_checkpoints;
    for p in 0..PAGES {
        read(&engine, &f, p);
    }
    assert!(engine.wait_for_extension_writes(WAIT));
    // 600 pages of 4 KiB fill about five 512 KiB regions; a 31-region ring allows one past the
    // checkpoint's position, so a checkpoint is due at every second region entered.
    let written = engine.counters().ext_checkpoints - before;
    assert!(
        written >= 2,
        "{written} checkpoints while the writer crossed five regions"
    );
}

/// A short-lived process (a cron job, a CLI run) closes right after its reads: the pages still
/// queued for the extension's writer are written before the last checkpoint, not dropped, so
/// the next engine finds them all.
#[test]
fn a_clean_close_writes_the_pages_still_queued_before_its_checkpoint() {
    let dir = tempdir();
    let data = settled_file(dir.path(), "data");
    let ext = dir.path().join("ext.bpe");
    let engine = engine(MEMORY);
    engine
        .enable_extension_as(&ext, EXT, Sharing::Private)
        .unwrap();
    let f = engine.open_file(&data, PAGE).unwrap();
    for p in 0..PAGES {
        assert_eq!(decode(&read(&engine, &f, p).0), Some((p, 0)));
    }
    // No wait for the writer: close at once, as a process's exit does.
    assert!(engine.wait_for_readahead(WAIT));
    engine.close_extension().unwrap();
    let c = engine.counters();
    assert_eq!(c.ext_admissions_dropped, 0);
    let written = c.ext_page_writes;
    drop(f);
    drop(engine);

    let (warm, _f) = restart(&data, &ext);
    let restored = warm.counters().ext_pages_restored;
    assert!(
        written >= PAGES - 10 && restored == written,
        "{written} of {PAGES} pages written before the close, {restored} restored"
    );
}

/// Private, then shared, then private use of one extension path. The shared
/// engines rewrite the ring with another file's pages; the private checkpoint written before
/// must not come back over them (its entries would point at the other file's bytes: checksum
/// failures on every read, and an extension switched off after enough of them).
#[test]
fn a_shared_use_of_the_path_voids_the_private_checkpoint_before_it() {
    let dir = tempdir();
    let data = settled_file(dir.path(), "data");
    let other = dir.path().join("other");
    // Another file that fills the shared ring. A test page ends in its own CRC, which gives
    // every one the same CRC residue; a byte of its own makes each page's checksum its own, as
    // real pages' are.
    let other_page = |p: u64| {
        let mut b = page_bytes(p, 1, PAGE);
        b[100] ^= 0xff;
        b
    };
    std::fs::write(
        &other,
        (0..4 * PAGES).flat_map(other_page).collect::<Vec<u8>>(),
    )
    .unwrap();
    std::thread::sleep(Duration::from_millis(60));
    let ext = dir.path().join("ext.bpe");
    fill_and_close(&data, &ext);

    {
        let shared = Engine::new(bpe_core::Config {
            max_memory: MEMORY,
            shared_extension: true,
            ..bpe_core::Config::default()
        });
        shared.enable_extension(&ext, EXT).unwrap();
        let g = shared.open_file(&other, PAGE).unwrap();
        // Twice round a 16 MiB ring: every region the checkpoint named is rewritten.
        for round in 0..2 {
            for p in 0..4 * PAGES {
                let (bytes, _) = read(&shared, &g, p);
                assert!(bytes == other_page(p), "round {round} page {p}");
            }
            shared.drop_clean_buffers();
        }
        assert!(shared.wait_for_extension_writes(WAIT));
        assert!(shared.wait_for_readahead(WAIT));
    }

    let (engine, f) = restart(&data, &ext);
    for p in 0..PAGES {
        let (bytes, _) = read(&engine, &f, p);
        assert_eq!(decode(&bytes), Some((p, 0)), "page {p}");
    }
    let c = engine.counters();
    assert_eq!(
        c.ext_checksum_failures, 0,
        "the private checkpoint from before the shared use was restored over the shared ring \
         ({} pages restored)",
        c.ext_pages_restored
    );
    assert_eq!(c.ext_pages_restored, 0);
    assert_eq!(
        engine.extension_status().state,
        bpe_core::ExtensionState::Enabled
    );
}

/// The caller's device of a snapshot: every page at one version, its reads counted.
struct Remote {
    version: u64,
    reads: std::sync::atomic::AtomicU64,
}

impl bpe_core::DataDevice for Remote {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<usize> {
        use std::sync::atomic::Ordering::Relaxed;
        self.reads.fetch_add(1, Relaxed);
        for (i, chunk) in buf.chunks_mut(PAGE).enumerate() {
            let page = offset / PAGE as u64 + i as u64;
            chunk.copy_from_slice(&page_bytes(page, self.version, PAGE));
        }
        Ok(buf.len())
    }
    fn write_at(&self, _: u64, _: &[u8]) -> std::io::Result<()> {
        Err(std::io::Error::other("read-only"))
    }
}

#[test]
fn a_snapshot_s_pages_outlive_the_engine_and_a_later_snapshot_takes_them_after_a_restart() {
    use bpe_core::lineage::PageSet;
    use bpe_core::{FileIdentity, Via};
    use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
    let dir = tempdir();
    let ext = dir.path().join("ext.bpe");
    let name = Path::new("/nowhere/replica.db");
    let (s1, s2) = (FileIdentity::snapshot(9, 1), FileIdentity::snapshot(9, 2));
    let at = |version| Remote {
        version,
        reads: AtomicU64::new(0),
    };
    let read_via = |e: &Engine, f: &FileHandle, page: u64, device: &Remote| {
        let mut buf = vec![0u8; PAGE];
        e.read_page_via(f, page, &mut buf, Via(Some(device)))
            .unwrap();
        decode(&buf).expect("a whole page")
    };
    {
        let engine = engine(MEMORY);
        engine
            .enable_extension_as(&ext, EXT, Sharing::Private)
            .unwrap();
        let (f, _) = engine.open_snapshot(name, s1, PAGE).unwrap();
        let d1 = at(1);
        for p in 0..PAGES {
            assert_eq!(read_via(&engine, &f, p, &d1), (p, 1));
        }
        assert!(engine.wait_for_extension_writes(WAIT));
        assert!(engine.wait_for_readahead(WAIT));
        engine.close_file(&f);
    }
    let engine = engine(MEMORY);
    engine
        .enable_extension_as(&ext, EXT, Sharing::Private)
        .unwrap();
    assert!(engine.wait_for_extension_restore(WAIT));
    assert!(
        engine.holds_pages_of(s1),
        "the checkpoint kept the snapshot"
    );
    assert!(!engine.holds_pages_of(s2));
    // Transaction 2 changed page 7 only: the new snapshot takes every other page from the
    // restored one, and reads page 7 from its device.
    let (old, _) = engine.open_snapshot(name, s1, PAGE).unwrap();
    let (new, _) = engine.open_snapshot(name, s2, PAGE).unwrap();
    engine.inherit(&new, &old, PageSet::new(vec![7]));
    let (d1, d2) = (at(1), at(2));
    for p in 0..PAGES {
        let want = if p == 7 { 2 } else { 1 };
        let device = if p == 7 { &d2 } else { &d1 };
        assert_eq!(read_via(&engine, &new, p, device), (p, want), "page {p}");
    }
    let restored = engine.counters().ext_pages_restored;
    assert!(restored >= PAGES - 10, "{restored} pages restored");
    let device_reads = d1.reads.load(Relaxed) + d2.reads.load(Relaxed);
    assert!(
        device_reads <= 1 + 10,
        "{device_reads} pages read from the device after the restart"
    );
}
