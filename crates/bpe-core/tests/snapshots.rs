//! Snapshots of a file only the caller can read (another VFS's database, from object storage):
//! each snapshot is a file of its own, so one snapshot's pages never answer for another's.

mod common;

use bpe_core::{DataDevice, FileIdentity, OpenKind, Tier, Via};
use common::{decode, engine, page_bytes, PAGE};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// The caller's device: serves every page at one version, counting its reads.
struct Remote {
    version: u64,
    reads: AtomicU64,
}

impl DataDevice for Remote {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<usize> {
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

fn remote(version: u64) -> Remote {
    Remote {
        version,
        reads: AtomicU64::new(0),
    }
}

fn read_via(
    e: &bpe_core::Engine,
    f: &bpe_core::FileHandle,
    page: u64,
    device: &dyn DataDevice,
) -> ((u64, u64), Tier) {
    let mut buf = vec![0u8; PAGE];
    let r = e
        .read_page_via(f, page, &mut buf, Via(Some(device)))
        .unwrap();
    (decode(&buf).expect("a whole page"), r.tier)
}

#[test]
fn each_snapshot_is_cached_apart_and_a_reopened_snapshot_keeps_its_pages() {
    let e = engine(64 << 20);
    let name = Path::new("/nowhere/replica.db");
    let (v1, v2) = (remote(1), remote(2));
    let (a, kind) = e
        .open_snapshot(name, FileIdentity::snapshot(7, 1), PAGE)
        .unwrap();
    assert_eq!(kind, OpenKind::New);
    for page in 0..8 {
        assert_eq!(read_via(&e, &a, page, &v1).0, (page, 1));
    }
    // Served from RAM the second time.
    assert_eq!(read_via(&e, &a, 3, &v1), ((3, 1), Tier::Memory));
    // The next snapshot of the same file: none of the first one's pages answer for it.
    let (b, _) = e
        .open_snapshot(name, FileIdentity::snapshot(7, 2), PAGE)
        .unwrap();
    for page in 0..8 {
        assert_eq!(read_via(&e, &b, page, &v2), ((page, 2), Tier::DataFile));
    }
    // A second opener of snapshot 1 shares it; closed by both and reopened, it keeps its pages.
    let (a2, kind) = e
        .open_snapshot(name, FileIdentity::snapshot(7, 1), PAGE)
        .unwrap();
    assert_eq!(kind, OpenKind::Shared);
    e.close_file(&a);
    e.close_file(&a2);
    let (a3, kind) = e
        .open_snapshot(name, FileIdentity::snapshot(7, 1), PAGE)
        .unwrap();
    assert!(matches!(kind, OpenKind::Reopened { changed: false, .. }));
    let before = v1.reads.load(Relaxed);
    assert_eq!(read_via(&e, &a3, 5, &v1), ((5, 1), Tier::Memory));
    assert_eq!(
        v1.reads.load(Relaxed),
        before,
        "a cached snapshot page read again"
    );
}

#[test]
fn a_snapshot_has_no_stamp_even_where_its_name_leads_to_a_local_file() {
    let dir = common::tempdir();
    let local = common::make_file(dir.path(), "replica.db", 4, PAGE);
    let e = engine(16 << 20);
    let (f, _) = e
        .open_snapshot(&local, FileIdentity::snapshot(1, 9), PAGE)
        .unwrap();
    // The local file's stamp must never vouch for the snapshot (the shared extension and
    // checkpoints bind files by their stamps).
    assert!(f.stamp_now().is_err());
    assert!(f.identity().is_snapshot());
    assert!(!FileIdentity::of_path(&local).unwrap().is_snapshot());
    // Pages come from the caller's device, not the local file of the same name.
    assert_eq!(read_via(&e, &f, 2, &remote(9)).0, (2, 9));
}

/// A replicated file's device at one transaction: each page as the last transaction up to
/// `version` that changed it wrote it (`changes[t]`: the pages transaction t+1 changed; all
/// pages were written by transaction 1).
struct Log {
    version: u64,
    changes: Vec<Vec<u64>>,
    reads: AtomicU64,
}

impl DataDevice for Log {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<usize> {
        self.reads.fetch_add(1, Relaxed);
        for (i, chunk) in buf.chunks_mut(PAGE).enumerate() {
            let page = offset / PAGE as u64 + i as u64;
            let written = (2..=self.version)
                .rev()
                .find(|&t| self.changes[t as usize - 2].contains(&page))
                .unwrap_or(1);
            chunk.copy_from_slice(&page_bytes(page, written, PAGE));
        }
        Ok(buf.len())
    }
    fn write_at(&self, _: u64, _: &[u8]) -> std::io::Result<()> {
        Err(std::io::Error::other("read-only"))
    }
}

#[test]
fn a_snapshot_takes_the_unchanged_pages_of_its_ancestors_and_reads_the_changed_ones() {
    use bpe_core::lineage::PageSet;
    let e = engine(64 << 20);
    let name = Path::new("/nowhere/replica.db");
    let changes = vec![vec![3], vec![5]];
    let at = |version| Log {
        version,
        changes: changes.clone(),
        reads: AtomicU64::new(0),
    };
    let open = |version| {
        e.open_snapshot(name, FileIdentity::snapshot(7, version), PAGE)
            .unwrap()
            .0
    };
    let (d1, d2, d3) = (at(1), at(2), at(3));
    let s1 = open(1);
    for page in 0..8 {
        assert_eq!(read_via(&e, &s1, page, &d1).0, (page, 1));
    }
    // Transaction 2 changed page 3: only that page is read again.
    let s2 = open(2);
    e.inherit(&s2, &s1, PageSet::new(vec![3]));
    for page in 0..4 {
        let (got, tier) = read_via(&e, &s2, page, &d2);
        assert_eq!(got, (page, if page == 3 { 2 } else { 1 }), "page {page}");
        let want = if page == 3 {
            Tier::DataFile
        } else {
            Tier::Memory
        };
        assert_eq!(tier, want, "page {page}");
    }
    assert_eq!(d2.reads.load(Relaxed), 1, "only the changed page is read");
    // Transaction 3 changed page 5. Page 3 comes from snapshot 2, page 7 (never read at 2)
    // from snapshot 1, page 5 from the device; snapshot 1's page 3 never answers.
    let s3 = open(3);
    e.inherit(&s3, &s2, PageSet::new(vec![5]));
    for page in 0..8 {
        let want = match page {
            3 => 2,
            5 => 3,
            _ => 1,
        };
        assert_eq!(read_via(&e, &s3, page, &d3).0, (page, want), "page {page}");
    }
    assert_eq!(d3.reads.load(Relaxed), 1, "only the changed page is read");
    assert_eq!(e.counters().pages_carried, 3 + 7);
    // The older snapshots still read as they were.
    assert_eq!(read_via(&e, &s1, 3, &d1), ((3, 1), Tier::Memory));
    assert_eq!(read_via(&e, &s2, 5, &d2).0, (5, 1));
}

#[test]
fn a_forgotten_ancestor_serves_nothing() {
    use bpe_core::lineage::PageSet;
    let e = engine(64 << 20);
    let name = Path::new("/nowhere/replica.db");
    let (s1, _) = e
        .open_snapshot(name, FileIdentity::snapshot(7, 1), PAGE)
        .unwrap();
    let d1 = remote(1);
    assert_eq!(read_via(&e, &s1, 0, &d1).0, (0, 1));
    let (s2, _) = e
        .open_snapshot(name, FileIdentity::snapshot(7, 2), PAGE)
        .unwrap();
    e.inherit(&s2, &s1, PageSet::default());
    // Its pages forgotten (a new key): the next snapshot reads from its device.
    e.invalidate_file(&s1);
    let d2 = remote(2);
    assert_eq!(read_via(&e, &s2, 0, &d2), ((0, 2), Tier::DataFile));
}
