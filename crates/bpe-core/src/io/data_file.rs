//! A database file's descriptors: one opened with O_DIRECT where the file system allows it, so
//! that the OS page cache does not stand in for our tiers (also used for sizes, stamps,
//! truncation and syncs, which O_DIRECT does not change), and one buffered, for writes (made
//! durable by the caller's sync at commit, exactly as without us) and reads through the OS page
//! cache. Linux keeps the two coherent: a direct read first writes back any dirty cached range.
//!
//! The buffered one is opened only when first needed: a caller that brings its own descriptor
//! for those (SQLite's, see `engine::Via`) never needs it, and a database open through SQLite
//! then costs one descriptor beside SQLite's own, not two (an application with a database per
//! tenant runs out of descriptors that much later).
//!
//! Callers that reach the file through a descriptor of their own (SQLite) pass `/proc/self/fd/N`
//! as the name to open: the descriptors then lead to the caller's file, whatever the path names
//! by now. See `files.rs` for when they are opened and closed.

use super::aligned::{is_block_aligned, read_full, round_down, round_up, Scratch};
use super::device::DataDevice;
use crate::config::DIRECT_IO_ALIGN;
use crate::error::{Error, Result};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::Relaxed;

/// Identity of a file on this machine: writes through any path reach the same inode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileIdentity {
    pub dev: u64,
    pub ino: u64,
}

/// One mixed word: the file registry's hasher (`PageKeyHash`) xors what it is given, and two
/// identities whose fields xor alike (snapshots: small source and transaction numbers, such as
/// (1, 2) and (2, 1)) would share a hash.
impl std::hash::Hash for FileIdentity {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        state.write_u64(self.dev.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ self.ino);
    }
}

/// The high bit of `dev` marks a snapshot's identity: no device number sets it.
const SNAPSHOT_DEV: u64 = 1 << 63;

impl FileIdentity {
    /// The identity of one immutable snapshot of a file the engine cannot open itself (a
    /// database another VFS serves, from object storage): `source` names the file for its
    /// caller (below 2^63), `version` the snapshot. Two identities are equal exactly when both are.
    pub fn snapshot(source: u64, version: u64) -> FileIdentity {
        assert!(source < SNAPSHOT_DEV, "a snapshot source is below 2^63");
        FileIdentity {
            dev: SNAPSHOT_DEV | source,
            ino: version,
        }
    }

    /// True for [`FileIdentity::snapshot`]'s identities.
    pub fn is_snapshot(&self) -> bool {
        self.dev & SNAPSHOT_DEV != 0
    }

    /// The file `path` leads to now (symbolic and /proc magic links followed).
    pub fn of_path(path: &Path) -> std::io::Result<FileIdentity> {
        let m = std::fs::metadata(path)?;
        Ok(FileIdentity {
            dev: m.dev(),
            ino: m.ino(),
        })
    }

    /// The file an open descriptor refers to.
    pub fn of_file(file: &File) -> std::io::Result<FileIdentity> {
        let m = file.metadata()?;
        Ok(FileIdentity {
            dev: m.dev(),
            ino: m.ino(),
        })
    }
}

/// What a file looks like from outside, one fstat away: which file, its size, and when its data
/// and its inode last changed (to the nanosecond). Any write changes at least the times.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FileStamp {
    pub identity: FileIdentity,
    pub size: u64,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
}

impl FileStamp {
    /// The stamp of a snapshot (`FileIdentity::snapshot`): its identity alone, since a
    /// snapshot never changes. Checkpoints record it so that the next process can adopt the
    /// snapshot's pages.
    pub fn of_snapshot(identity: FileIdentity) -> FileStamp {
        debug_assert!(identity.is_snapshot());
        FileStamp {
            identity,
            size: 0,
            mtime_ns: 0,
            ctime_ns: 0,
        }
    }

    pub fn of_metadata(m: &std::fs::Metadata) -> FileStamp {
        FileStamp {
            identity: FileIdentity {
                dev: m.dev(),
                ino: m.ino(),
            },
            size: m.size(),
            mtime_ns: m.mtime() * 1_000_000_000 + m.mtime_nsec(),
            ctime_ns: m.ctime() * 1_000_000_000 + m.ctime_nsec(),
        }
    }

    pub fn of_path(path: &Path) -> std::io::Result<FileStamp> {
        std::fs::metadata(path).map(|m| FileStamp::of_metadata(&m))
    }
}

pub struct DataFile {
    path: PathBuf,
    /// Opened with O_DIRECT if `main_is_direct`, else buffered (and then the only one).
    main: File,
    main_is_direct: bool,
    /// The buffered descriptor where `main` is O_DIRECT, opened at its first use.
    buffered: std::sync::OnceLock<File>,
    identity: FileIdentity,
    /// Serializes writes: a sub-block write and a block write to the same block must not interleave.
    write_lock: crate::sync::Mutex<()>,
    /// Set while another program rewrites the file several times a second (see
    /// `files::RewriteWatch`): reads go through the OS page cache, where its writes are.
    through_os_cache: std::sync::atomic::AtomicBool,
}

impl DataFile {
    /// Opens `open_from` (named `path` in messages) read-write, or read-only where writing is
    /// refused: with O_DIRECT if `want_direct` and the file system allows it (tmpfs on older
    /// kernels refuses; reads then go through the OS page cache). One descriptor: the buffered
    /// one waits for its first use (see `buffered`).
    pub fn open(path: &Path, open_from: &Path, want_direct: bool) -> Result<DataFile> {
        let open_err = |source| Error::OpenData {
            path: path.to_path_buf(),
            source,
        };
        let open = |direct: bool, write: bool| {
            let flags = libc::O_CLOEXEC | if direct { libc::O_DIRECT } else { 0 };
            OpenOptions::new()
                .read(true)
                .write(write)
                .custom_flags(flags)
                .open(open_from)
        };
        // Read-write, or read-only where writing is refused.
        let open_rw = |direct: bool| open(direct, true).or_else(|_| open(direct, false));
        let (main, main_is_direct) = if want_direct {
            match open_rw(true) {
                Ok(f) => (f, true),
                Err(e) => {
                    let buffered = open_rw(false).map_err(open_err)?;
                    log::warn!(
                        "{}: O_DIRECT refused ({e}); reading through the OS page cache",
                        path.display()
                    );
                    (buffered, false)
                }
            }
        } else {
            (open_rw(false).map_err(open_err)?, false)
        };
        let identity = FileIdentity::of_file(&main).map_err(open_err)?;
        Ok(DataFile {
            path: path.to_path_buf(),
            main,
            main_is_direct,
            buffered: std::sync::OnceLock::new(),
            identity,
            write_lock: crate::sync::Mutex::new(crate::sync::Rank::Leaf, ()),
            through_os_cache: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// The buffered descriptor, opened now if this is its first use: the same open file as
    /// `main` (through /proc/self/fd, so a rename or an unlink since does not matter).
    fn buffered(&self) -> std::io::Result<&File> {
        if !self.main_is_direct {
            return Ok(&self.main);
        }
        if let Some(f) = self.buffered.get() {
            return Ok(f);
        }
        let from = PathBuf::from(format!("/proc/self/fd/{}", self.main.as_raw_fd()));
        let open = |write: bool| {
            OpenOptions::new()
                .read(true)
                .write(write)
                .custom_flags(libc::O_CLOEXEC)
                .open(&from)
        };
        let f = open(true).or_else(|_| open(false))?;
        if FileIdentity::of_file(&f)? != self.identity {
            // Never closed: closing a descriptor of a file this process has locks on would
            // drop those locks.
            std::mem::forget(f);
            return Err(std::io::Error::other(
                "/proc/self/fd leads to another file than the open one",
            ));
        }
        // Two threads may both open one at the first use: the loser's stays open, unused (as
        // above, a close could drop this process's locks on the file).
        if let Err(extra) = self.buffered.set(f) {
            std::mem::forget(extra);
        }
        Ok(self.buffered.get().expect("set above"))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn identity(&self) -> FileIdentity {
        self.identity
    }

    /// True when reads bypass the OS page cache.
    pub fn is_direct(&self) -> bool {
        self.main_is_direct && !self.follows_os_cache()
    }

    /// Reads through the OS page cache (`on`) or with O_DIRECT again; true if that changed.
    pub fn follow_os_cache(&self, on: bool) -> bool {
        self.main_is_direct && self.through_os_cache.swap(on, Relaxed) != on
    }

    pub fn follows_os_cache(&self) -> bool {
        self.through_os_cache.load(Relaxed)
    }

    fn io_err(&self, source: std::io::Error) -> Error {
        Error::DataIo {
            path: self.path.clone(),
            source,
        }
    }

    /// Current size of the file in bytes.
    pub fn size(&self) -> Result<u64> {
        self.main
            .metadata()
            .map(|m| m.len())
            .map_err(|e| self.io_err(e))
    }

    /// The file's stamp now (one fstat).
    pub fn stamp(&self) -> Result<FileStamp> {
        // fstat, not `File::metadata`: a read transaction may take a stamp, and std's statx
        // path (its probe, the conversion of a larger struct) costs about 150 instructions
        // more than the call itself, where the stamp needs only these six fields.
        // SAFETY: an all-zero `stat` is a valid value of this plain C struct.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: the descriptor is open for `self`'s life, and `st` is writable.
        if unsafe { libc::fstat(self.main.as_raw_fd(), &mut st) } != 0 {
            return Err(self.io_err(std::io::Error::last_os_error()));
        }
        Ok(FileStamp {
            identity: FileIdentity {
                dev: st.st_dev,
                ino: st.st_ino,
            },
            size: st.st_size as u64,
            mtime_ns: st.st_mtime * 1_000_000_000 + st.st_mtime_nsec,
            ctime_ns: st.st_ctime * 1_000_000_000 + st.st_ctime_nsec,
        })
    }

    /// Reads with O_DIRECT, rounding the request out to whole blocks. Returns how many bytes
    /// existed before end of file; the rest of `buf` is zero-filled. None if the file has no
    /// O_DIRECT descriptor. A request already on whole blocks into an aligned `buf` (a page of
    /// L1's slab, see `BufferPool::reserve_load`) is read straight into it; any other goes
    /// through an aligned scratch buffer and is copied out.
    pub fn read_direct(&self, offset: u64, buf: &mut [u8]) -> Option<std::io::Result<usize>> {
        let direct = self.main_is_direct.then_some(&self.main)?;
        if is_block_aligned(offset, buf) {
            return Some(read_full(direct, offset, buf).inspect(|&n| buf[n..].fill(0)));
        }
        let align = DIRECT_IO_ALIGN as u64;
        let start = round_down(offset, align);
        let end = round_up((offset + buf.len() as u64) as usize, DIRECT_IO_ALIGN) as u64;
        let mut block = Scratch::new((end - start) as usize);
        let got = match read_full(direct, start, &mut block) {
            Ok(n) => n,
            Err(e) => return Some(Err(e)),
        };
        let skip = (offset - start) as usize;
        let avail = got.saturating_sub(skip).min(buf.len());
        buf[..avail].copy_from_slice(&block[skip..skip + avail]);
        buf[avail..].fill(0);
        Some(Ok(avail))
    }

    /// Drops the file's clean pages from the OS page cache (after a sync they are all clean), so
    /// that written pages do not linger there as an unaccounted third cache tier. The first
    /// block stays: it holds the header that every read transaction checks (SQLite's change
    /// counter), and the page cache is where that check costs no device round trip.
    pub fn release_os_cache(&self) {
        if self.main_is_direct {
            let header = crate::config::DIRECT_IO_ALIGN as libc::off_t;
            // SAFETY: the descriptor is open; fadvise only drops clean cached pages of this
            // file (length 0: to its end).
            unsafe {
                libc::posix_fadvise(self.main.as_raw_fd(), header, 0, libc::POSIX_FADV_DONTNEED)
            };
        }
    }

    pub fn truncate(&self, len: u64) -> Result<()> {
        let _serial = self.write_lock.lock();
        self.main.set_len(len).map_err(|e| self.io_err(e))
    }

    pub fn sync(&self) -> Result<()> {
        self.main.sync_data().map_err(|e| self.io_err(e))?;
        self.release_os_cache();
        Ok(())
    }
}

/// The file's own descriptors as a device: O_DIRECT reads where available, buffered writes.
impl DataDevice for DataFile {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<usize> {
        if !self.follows_os_cache() {
            if let Some(r) = self.read_direct(offset, buf) {
                return r;
            }
        }
        let n = read_full(self.buffered()?, offset, buf)?;
        buf[n..].fill(0);
        Ok(n)
    }

    fn write_at(&self, offset: u64, data: &[u8]) -> std::io::Result<()> {
        let _serial = self.write_lock.lock();
        self.buffered()?.write_all_at(data, offset)
    }
}
