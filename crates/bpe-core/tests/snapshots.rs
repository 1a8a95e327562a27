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
    device: &Remote,
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
