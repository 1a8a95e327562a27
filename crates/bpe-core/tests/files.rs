//! Files coming and going: a file's cached pages can never be served for another file, however
//! opens, closes and invalidations interleave, and one extension holds every page size.

mod common;
use bpe_core::Tier;
use common::*;

/// Pages of file `n` (version = file number): a read that returns another file's page is seen.
fn make_numbered(
    dir: &std::path::Path,
    n: u64,
    pages: u64,
    page_size: usize,
) -> std::path::PathBuf {
    let path = dir.join(format!("f{n}"));
    let mut all = Vec::new();
    for p in 0..pages {
        all.extend_from_slice(&page_bytes(p, n, page_size));
    }
    std::fs::write(&path, all).unwrap();
    path
}

/// Before file identities were keys, closing a file put its id back on a free list before its
/// pages were forgotten, and an open in between was served the closed file's pages (3,392 reads
/// of the wrong file in 300 rounds). Threads open, read, close and invalidate two files at once,
/// with the extension on so that copies live in both tiers.
#[test]
fn a_file_is_never_served_another_files_pages() {
    let dir = tempdir();
    let engine = engine(256 << 10);
    engine
        .enable_extension(&dir.path().join("ext.bpe"), 4 << 20)
        .unwrap();
    let paths: Vec<_> = (1..=3)
        .map(|n| make_numbered(dir.path(), n, 40, PAGE))
        .collect();
    std::thread::scope(|s| {
        for t in 0..4usize {
            let (engine, paths) = (&engine, &paths);
            s.spawn(move || {
                for round in 0..300usize {
                    let n = (t + round) % paths.len();
                    let f = engine.open_file(&paths[n], PAGE).unwrap();
                    for p in (round as u64 % 7..40).step_by(3) {
                        let (bytes, tier) = read(engine, &f, p);
                        assert_eq!(
                            decode(&bytes),
                            Some((p, n as u64 + 1)),
                            "file {} page {p} from {tier:?} held another file's bytes",
                            n + 1
                        );
                    }
                    if round % 17 == 0 {
                        engine.invalidate_file(&f);
                    }
                    engine.close_file(&f);
                }
            });
        }
    });
    engine.check_invariants();
}

/// One extension holds pages of every size at once, each taking its own size: nothing dropped,
/// every page read back from the extension intact.
#[test]
fn one_extension_holds_every_page_size() {
    let dir = tempdir();
    let engine = engine(512 << 10);
    let sizes = [512usize, 4096, 16384, 65536];
    let files: Vec<_> = sizes
        .iter()
        .enumerate()
        .map(|(i, &size)| {
            let path = make_numbered(dir.path(), i as u64 + 1, (1 << 20) / size as u64, size);
            (engine.open_file(&path, size).unwrap(), size)
        })
        .collect();
    // Enabled after the files are open and before any read, and the other way round: the
    // extension does not depend on which page sizes it saw first.
    engine
        .enable_extension(&dir.path().join("ext.bpe"), 16 << 20)
        .unwrap();
    for (f, size) in &files {
        let pages = (1 << 20) / *size as u64;
        for p in (0..pages).map(|i| (i * 7919) % pages) {
            let mut buf = vec![0u8; *size];
            engine.read_page(f, p, &mut buf).unwrap();
        }
    }
    assert!(engine.wait_for_extension_writes(WAIT));
    let c = engine.counters();
    assert_eq!(
        c.ext_admissions_dropped,
        0,
        "{:?}",
        engine.extension_status().last_failure
    );
    assert_eq!(c.ext_checksum_failures, 0);
    // 4 MiB of pages in a 16 MiB extension: all of it fits, in exactly its own bytes.
    let written: u64 = c.ext_bytes_written;
    assert!(
        written <= (4 << 20) + 64 * 4096,
        "{written} bytes written for 4 MiB of pages"
    );
    engine.set_max_memory(256 << 10).unwrap();
    engine.drop_clean_buffers(); // empties both tiers: refill, then evict from RAM only
    for (f, size) in &files {
        let pages = (1 << 20) / *size as u64;
        for p in 0..pages {
            let mut buf = vec![0u8; *size];
            engine.read_page(f, p, &mut buf).unwrap();
        }
    }
    assert!(engine.wait_for_extension_writes(WAIT));
    let mut from_ext = [0usize; 4];
    for (i, (f, size)) in files.iter().enumerate() {
        let pages = (1 << 20) / *size as u64;
        for p in (0..pages).rev() {
            let mut buf = vec![0u8; *size];
            let r = engine.read_page(f, p, &mut buf).unwrap();
            assert_eq!(
                decode(&buf),
                Some((p, i as u64 + 1)),
                "{size}-byte page {p}"
            );
            from_ext[i] += usize::from(r.tier == Tier::Extension);
        }
    }
    for (i, n) in from_ext.iter().enumerate() {
        assert!(*n > 0, "no {}-byte page came from the extension", sizes[i]);
    }
    engine.check_invariants();
}

/// A closed file reopened under another name (renamed; or a new file on the inode of a deleted
/// one) is known by its new name: descriptors and `DB_ID()` name files by path.
#[test]
fn a_file_reopened_under_another_name_is_known_by_it() {
    let dir = tempdir();
    let engine = engine(1 << 20);
    let old = make_numbered(dir.path(), 1, 8, PAGE);
    let f = engine.open_file(&old, PAGE).unwrap();
    assert_eq!(decode(&read(&engine, &f, 3).0), Some((3, 1)));
    assert!(engine.close_file(&f));
    let new = dir.path().join("renamed");
    std::fs::rename(&old, &new).unwrap();
    let f = engine.open_file(&new, PAGE).unwrap();
    assert_eq!(decode(&read(&engine, &f, 3).0), Some((3, 1)));
    let paths: Vec<_> = engine.files().into_iter().map(|i| i.path).collect();
    assert_eq!(paths, vec![new]);
}
