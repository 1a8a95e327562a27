//! Enabling, disabling and resizing the extension online; every refusal names the problem and
//! changes nothing; faults in the extension cost speed, never data.

mod common;
use bpe_core::{Error, ExtensionState, Tier};
use common::*;
use std::os::unix::fs::PermissionsExt;

fn listing(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    v.sort();
    v
}

#[test]
fn invalid_requests_are_refused_with_a_named_reason() {
    let dir = tempdir();
    let data = make_file(dir.path(), "data", 4, PAGE);
    let engine = engine(4 << 20);
    engine.open_file(&data, PAGE).unwrap();
    let ext = dir.path().join("ext.bpe");
    let before = listing(dir.path());
    let cases: Vec<(std::path::PathBuf, u64, &str)> = vec![
        (ext.clone(), 4 << 20, "868"),
        (ext.clone(), 1 << 20, "868"),
        ("relative.bpe".into(), 64 << 20, "absolute"),
        (dir.path().join("missing/ext.bpe"), 64 << 20, "directory"),
        (dir.path().to_path_buf(), 64 << 20, "directory"),
        (data.clone(), 64 << 20, "already exists"),
        ("/dev/null".into(), 64 << 20, "already exists"),
        (ext.clone(), 1 << 50, "index"),
    ];
    for (path, size, needle) in cases {
        let err = engine
            .enable_extension(&path, size)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(needle),
            "{path:?} {size}: '{err}' does not say '{needle}'"
        );
        assert_eq!(engine.extension_status().state, ExtensionState::Disabled);
        assert_eq!(listing(dir.path()), before, "a refused request left a file");
    }
    let link = dir.path().join("link.bpe");
    std::os::unix::fs::symlink(dir.path().join("target.bpe"), &link).unwrap();
    let err = engine
        .enable_extension(&link, 64 << 20)
        .unwrap_err()
        .to_string();
    assert!(err.contains("symbolic link"), "{err}");
    assert!(
        !dir.path().join("target.bpe").exists(),
        "followed a symlink"
    );
    assert_eq!(
        std::fs::read(&data).unwrap().len(),
        4 * PAGE,
        "data file touched"
    );
}

#[test]
fn the_extension_file_is_private_exclusive_and_deleted_when_disabled() {
    let dir = tempdir();
    let engine = engine(1 << 20);
    let ext = dir.path().join("ext.bpe");
    engine.enable_extension(&ext, 8 << 20).unwrap();
    let meta = std::fs::metadata(&ext).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    assert_eq!(meta.len(), 8 << 20, "not preallocated to its size");
    let st = engine.extension_status();
    assert_eq!(
        (st.state, st.size_bytes),
        (ExtensionState::Enabled, 8 << 20)
    );
    assert!(matches!(
        engine.enable_extension(&dir.path().join("other.bpe"), 8 << 20),
        Err(Error::ExtensionAlreadyEnabled { .. })
    ));
    engine.disable_extension().unwrap();
    assert!(!ext.exists());
    assert_eq!(engine.extension_status().state, ExtensionState::Disabled);
    assert!(matches!(
        engine.disable_extension(),
        Err(Error::ExtensionNotEnabled)
    ));
    // Re-enable and resize online.
    engine.enable_extension(&ext, 4 << 20).unwrap();
    engine.resize_extension(6 << 20).unwrap();
    assert_eq!(std::fs::metadata(&ext).unwrap().len(), 6 << 20);
    assert_eq!(engine.extension_status().size_bytes, 6 << 20);
    let err = engine.resize_extension(1 << 20).unwrap_err().to_string();
    assert!(err.contains("868"), "{err}");
    assert_eq!(
        engine.extension_status().size_bytes,
        6 << 20,
        "a refused resize changed the size"
    );
}

#[test]
fn index_memory_is_reported_and_within_22_bytes_per_4k_page() {
    let dir = tempdir();
    let engine = engine(64 << 20);
    engine
        .enable_extension(&dir.path().join("ext.bpe"), 256 << 20)
        .unwrap();
    let c = engine.counters();
    let pages = (256u64 << 20) / 4096;
    assert!(c.ext_index_bytes > 0);
    assert!(
        c.ext_index_bytes <= 22 * pages,
        "{} bytes for {pages} pages of 4 KiB",
        c.ext_index_bytes
    );
    // The checkpoint slots take under 1 % of the file; the rest is ring, all free.
    assert!(
        c.ext_free_pages <= pages && c.ext_free_pages * 100 >= pages * 99,
        "{} free of {pages}",
        c.ext_free_pages
    );
    engine.check_invariants();
}

#[test]
fn memory_settings_are_validated() {
    let dir = tempdir();
    let engine = engine(8 << 20);
    for bad in [0u64, 1024, 255 << 10, u64::MAX] {
        assert!(engine.set_max_memory(bad).is_err(), "{bad} accepted");
        assert_eq!(engine.max_memory(), 8 << 20);
    }
    // An index needing more than half of memory blocks the shrink.
    engine
        .enable_extension(&dir.path().join("ext.bpe"), 512 << 20)
        .unwrap();
    let err = engine.set_max_memory(1 << 20).unwrap_err().to_string();
    assert!(err.contains("index"), "{err}");
    assert_eq!(engine.max_memory(), 8 << 20);
}

/// A 400-page file, 256 KiB of RAM and a 4 MiB extension: most pages live in the extension.
fn rig() -> (
    tempfile::TempDir,
    std::sync::Arc<bpe_core::Engine>,
    bpe_core::FileHandle,
    std::path::PathBuf,
) {
    let dir = tempdir();
    let path = make_file(dir.path(), "data", 400, PAGE);
    let engine = engine(256 << 10);
    let f = engine.open_file(&path, PAGE).unwrap();
    let ext = dir.path().join("ext.bpe");
    engine.enable_extension(&ext, 4 << 20).unwrap();
    (dir, engine, f, ext)
}

/// Fills the extension with pages 0..n of `f` (RAM is far smaller).
fn fill(engine: &bpe_core::Engine, f: &bpe_core::FileHandle, n: u64) {
    for p in 0..n {
        read(engine, f, (p * 37) % n);
    }
    assert!(engine.wait_for_extension_writes(WAIT));
}

fn read_all_correct(engine: &bpe_core::Engine, f: &bpe_core::FileHandle, n: u64) -> usize {
    (0..n)
        .filter(|&p| {
            let (bytes, tier) = read(engine, f, p);
            assert_eq!(decode(&bytes), Some((p, 0)), "page {p} wrong from {tier:?}");
            tier == Tier::Extension
        })
        .count()
}

#[test]
fn extension_read_errors_are_misses_and_repeated_ones_disable_it() {
    let (_dir, engine, f, ext) = rig();
    fill(&engine, &f, 400);
    engine.faults().fail_extension_reads(3);
    read_all_correct(&engine, &f, 400);
    let c = engine.counters();
    assert_eq!(c.ext_io_errors, 3);
    assert_eq!(
        engine.extension_status().state,
        ExtensionState::Enabled,
        "3 errors, then successes"
    );

    engine.faults().fail_extension_reads(1000);
    read_all_correct(&engine, &f, 400);
    let st = engine.extension_status();
    assert_eq!(
        st.state,
        ExtensionState::Disabled,
        "repeated errors did not disable it"
    );
    assert!(st.last_failure.unwrap().contains("read error"));
    engine.faults().fail_extension_reads(0);
    assert!(engine.wait_for_extension_writes(WAIT));
    for _ in 0..200 {
        if !ext.exists() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert!(!ext.exists(), "self-disabled extension left its file");
    engine.enable_extension(&ext, 4 << 20).unwrap();
    fill(&engine, &f, 400);
    assert!(
        read_all_correct(&engine, &f, 400) > 0,
        "re-enabled extension serves nothing"
    );
}

#[test]
fn corruption_by_another_writer_is_detected_and_served_from_the_data_file() {
    let (_dir, engine, f, ext) = rig();
    fill(&engine, &f, 400);
    // Scribble over the first 64 slots, as a stray process might.
    use std::os::unix::fs::FileExt;
    let scribbler = std::fs::OpenOptions::new().write(true).open(&ext).unwrap();
    for slot in 0..64u64 {
        scribbler
            .write_all_at(b"garbage!", slot * 4096 + 100)
            .unwrap();
    }
    drop(scribbler);
    read_all_correct(&engine, &f, 400);
    assert!(engine.counters().ext_checksum_failures > 0);
}

#[test]
fn write_errors_and_a_deleted_or_truncated_file_cost_only_hits() {
    let (_dir, engine, f, ext) = rig();
    engine.faults().fail_extension_writes(2);
    fill(&engine, &f, 400);
    assert_eq!(engine.counters().ext_io_errors, 2);
    read_all_correct(&engine, &f, 400);

    // Deleted while enabled: our descriptor still works, so it keeps serving.
    std::fs::remove_file(&ext).unwrap();
    read_all_correct(&engine, &f, 400);
    // Truncated while enabled (recreate it at the path first to have something to truncate).
    engine.disable_extension().unwrap();
    engine.enable_extension(&ext, 4 << 20).unwrap();
    fill(&engine, &f, 400);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&ext)
        .unwrap()
        .set_len(0)
        .unwrap();
    read_all_correct(&engine, &f, 400);
    assert!(
        engine.counters().ext_io_errors > 2,
        "short reads of a truncated file were not counted"
    );
}

#[test]
fn a_data_file_read_error_reaches_the_caller_and_nothing_is_cached() {
    let dir = tempdir();
    let path = make_file(dir.path(), "data", 8, PAGE);
    let engine = engine(1 << 20);
    let f = engine.open_file(&path, PAGE).unwrap();
    engine.faults().fail_data_reads(1);
    let mut buf = vec![0u8; PAGE];
    assert!(matches!(
        engine.read_page(&f, 3, &mut buf),
        Err(Error::DataIo { .. })
    ));
    assert_eq!(engine.counters().database_pages, 0);
    let (bytes, tier) = read(&engine, &f, 3);
    assert_eq!((decode(&bytes), tier), (Some((3, 0)), Tier::DataFile));
}

/// The engine owns the rules a batch of changes is checked by. Each change is checked
/// against what the ones before it leave, the first refusal names its index, and nothing
/// changes either way.
#[test]
fn a_batch_of_changes_is_checked_in_order_against_what_each_leaves_and_changes_nothing() {
    use bpe_core::SettingChange::{ExtensionOff, ExtensionOn, MaxMemory};
    let dir = tempdir();
    let engine = engine(16 << 20);
    let ext = dir.path().join("ext.bpe");
    let other = dir.path().join("other.bpe");
    let on = |path, size| ExtensionOn {
        path,
        size,
        sharing: None,
    };
    let before = (engine.settings(), listing(dir.path()));
    // 64 MB needs memory above 16 MB: refused alone, accepted after a memory raise.
    assert!(matches!(
        engine.check_changes(&[on(&ext, 8 << 20)]),
        Err((0, Error::ExtensionNotLargerThanMemory { .. }))
    ));
    assert!(engine
        .check_changes(&[MaxMemory { bytes: 32 << 20 }, on(&ext, 64 << 20)])
        .is_ok());
    // A second path while the first would be on: the second change is refused, by its index.
    assert!(matches!(
        engine.check_changes(&[on(&ext, 64 << 20), on(&other, 64 << 20)]),
        Err((1, Error::ExtensionAlreadyEnabled { .. }))
    ));
    // OFF in between makes the second path acceptable.
    assert!(engine
        .check_changes(&[on(&ext, 64 << 20), ExtensionOff, on(&other, 64 << 20)])
        .is_ok());
    assert_eq!(
        (engine.settings(), listing(dir.path())),
        before,
        "a check changed something"
    );
}
