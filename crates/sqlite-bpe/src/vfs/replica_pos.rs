//! LiteFS's position file: beside each database on a LiteFS mount, `<db>-pos` reads as the
//! replicated transaction the node has applied (`TXID/checksum`). On a replica, LiteFS sets it
//! before it rewrites the wal-index header, both while it holds every lock of the database
//! (WAL: the write, checkpoint, recover and all read-mark locks; rollback: EXCLUSIVE), so a
//! reader that holds its read lock sees a position that covers every page in the file.
//!
//! It is a second witness for the wal-index, not a replacement: LiteFS's header rewrite can be
//! lost (its own comment on `updateSHM` names a write through the `-shm` mmap that overwrites
//! it), and a reader that then sees an unchanged header would serve the pages it cached before
//! the transaction. A position that moved while the header did not forgets the whole file
//! (`FileWatch::replica_position`).
//!
//! Only on a replica. On the primary, SQLite's own writers commit and LiteFS moves the position
//! afterwards, when the writer unlocks: a reader that looks between the two sees a moved
//! position and an unchanged header with nothing lost, and SQLite's own protocol already shows
//! every commit there. LiteFS tells the two apart with `.primary` in the mount's directory: it
//! exists only on a replica (naming its primary). Without it, the position means nothing to bpe.
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// statfs's f_type of a FUSE mount.
const FUSE_SUPER_MAGIC: i64 = 0x6573_5546;

/// The position file of one database, open for the connection's life.
pub struct ReplicaPos {
    file: std::fs::File,
    /// `<mount>/.primary`: present on a replica only.
    primary_marker: PathBuf,
}

impl ReplicaPos {
    /// The position file of the database at `db`, if it is on a FUSE mount (`on_fuse` answers,
    /// given the `statfs` to ask if it does not know) and has one.
    pub fn find(
        db: &Path,
        on_fuse: impl FnOnce(&dyn Fn() -> Option<bool>) -> bool,
    ) -> Option<ReplicaPos> {
        if !on_fuse(&|| is_on_fuse(db)) {
            return None;
        }
        let mut name = db.as_os_str().to_owned();
        name.push("-pos");
        let file = std::fs::File::open(name).ok()?;
        let primary_marker = db.parent().unwrap_or(Path::new("/")).join(".primary");
        Some(ReplicaPos {
            file,
            primary_marker,
        })
    }

    /// The position now (LiteFS drops the kernel's cached copy whenever it changes). None if
    /// it cannot be read: then it says nothing.
    pub fn read(&self) -> Option<Vec<u8>> {
        let mut buf = [0u8; 128];
        let n = self.file.read_at(&mut buf, 0).ok()?;
        (n > 0).then(|| buf[..n].to_vec())
    }

    /// Whether the node is a replica now (LiteFS's `.primary` exists): asked only when the
    /// position says something, since a node can change roles. One `stat`; a node whose
    /// marker cannot be looked at is taken for the primary, where SQLite's protocol holds.
    pub fn is_replica(&self) -> bool {
        std::fs::symlink_metadata(&self.primary_marker).is_ok()
    }
}

/// Whether the file at `path` is on a FUSE mount (one `statfs`); None if it cannot tell.
fn is_on_fuse(path: &Path) -> Option<bool> {
    let c = CString::new(path.as_os_str().as_bytes()).ok()?;
    // SAFETY: statfs fills st for a valid C path; st is plain data, valid for writes.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 {
        return None;
    }
    Some(st.f_type as i64 == FUSE_SUPER_MAGIC)
}
