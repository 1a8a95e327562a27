//! A database file read with O_DIRECT, so the OS page cache does not stand in for our tiers.
//!
//! Two descriptors per file: one with O_DIRECT for reads, one buffered for writes (which SQLite
//! makes durable at commit with a sync, exactly as without us). Linux keeps the two coherent: a
//! direct read first writes back any dirty cached range.

use super::aligned::{round_down, round_up, AlignedBuf};
use super::emulation::Emulator;
use super::faults::FaultInjector;
use crate::config::DIRECT_IO_ALIGN;
use crate::{Error, Result};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The byte locked by [`DataFile::claim_ownership`]: 1 TiB, beyond SQLite's lock bytes (1 GiB).
pub const OWNER_LOCK_BYTE: i64 = 1 << 40;

pub struct DataFile {
    path: PathBuf,
    direct: Option<File>,
    buffered: File,
    emulator: Option<Arc<Emulator>>,
    faults: Arc<FaultInjector>,
    /// Serializes writes: a sub-block write and a block write to the same block must not interleave.
    write_lock: parking_lot::Mutex<()>,
}

/// Identity of a file on this machine: writes through any path reach the same inode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FileIdentity {
    pub dev: u64,
    pub ino: u64,
}

impl DataFile {
    /// Opens `path` read-write. With `want_direct`, also opens it with O_DIRECT; where the file
    /// system refuses (tmpfs on older kernels), reads fall back to the buffered descriptor.
    pub fn open(
        path: &Path,
        want_direct: bool,
        emulator: Option<Arc<Emulator>>,
        faults: Arc<FaultInjector>,
    ) -> Result<(DataFile, FileIdentity)> {
        let open_err = |source| Error::OpenData {
            path: path.to_path_buf(),
            source,
        };
        let buffered = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_CLOEXEC)
            .open(path)
            .or_else(|_| {
                OpenOptions::new()
                    .read(true)
                    .custom_flags(libc::O_CLOEXEC)
                    .open(path)
            })
            .map_err(open_err)?;
        let meta = buffered.metadata().map_err(open_err)?;
        let identity = FileIdentity {
            dev: meta.dev(),
            ino: meta.ino(),
        };
        let direct = if want_direct {
            let writable = OpenOptions::new()
                .read(true)
                .write(true)
                .custom_flags(libc::O_DIRECT | libc::O_CLOEXEC)
                .open(path);
            let fd = writable.or_else(|_| {
                OpenOptions::new()
                    .read(true)
                    .custom_flags(libc::O_DIRECT | libc::O_CLOEXEC)
                    .open(path)
            });
            match fd {
                Ok(f) => Some(f),
                Err(e) => {
                    log::warn!(
                        "{}: O_DIRECT refused ({e}); reading through the OS page cache",
                        path.display()
                    );
                    None
                }
            }
        } else {
            None
        };
        Ok((
            DataFile {
                path: path.to_path_buf(),
                direct,
                buffered,
                emulator,
                faults,
                write_lock: parking_lot::Mutex::new(()),
            },
            identity,
        ))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Claims the file for this process's cache with an open-file-description lock on one byte
    /// far past any lock byte SQLite uses (OFD locks coexist with the POSIX locks SQLite takes and
    /// go away with the descriptor, never on close of some other descriptor). Fails with
    /// WouldBlock if another process's cache holds it.
    pub fn claim_ownership(&self) -> std::io::Result<()> {
        let try_lock = |kind| {
            // SAFETY: flock is plain data; zeroed is a valid value to fill in.
            let mut fl: libc::flock = unsafe { std::mem::zeroed() };
            fl.l_type = kind as _;
            fl.l_whence = libc::SEEK_SET as _;
            fl.l_start = OWNER_LOCK_BYTE;
            fl.l_len = 1;
            // SAFETY: the descriptor is open for the life of self; fl is a valid flock.
            let rc = unsafe { libc::fcntl(self.buffered.as_raw_fd(), libc::F_OFD_SETLK, &fl) };
            if rc == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        };
        match try_lock(libc::F_WRLCK) {
            // A read-only descriptor cannot take a write lock; a read lock still excludes writers.
            Err(e) if e.raw_os_error() == Some(libc::EBADF) => try_lock(libc::F_RDLCK),
            other => other,
        }
        .map_err(|e| match e.raw_os_error() {
            Some(libc::EAGAIN) | Some(libc::EACCES) => {
                std::io::Error::new(std::io::ErrorKind::WouldBlock, e)
            }
            _ => e,
        })
    }

    /// True when reads bypass the OS page cache.
    pub fn is_direct(&self) -> bool {
        self.direct.is_some()
    }

    fn io_err(&self, source: std::io::Error) -> Error {
        Error::DataIo {
            path: self.path.clone(),
            source,
        }
    }

    /// Current size of the file in bytes.
    pub fn size(&self) -> Result<u64> {
        self.buffered
            .metadata()
            .map(|m| m.len())
            .map_err(|e| self.io_err(e))
    }

    /// Reads `buf.len()` bytes at `offset`. Returns how many bytes existed before end of file;
    /// the rest of `buf` is zero-filled. Unaligned requests are rounded out to whole blocks.
    pub fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<usize> {
        if let Some(e) = self.faults.take_data_read_error() {
            return Err(self.io_err(e));
        }
        if let Some(emu) = &self.emulator {
            emu.before_io();
        }
        let n = match &self.direct {
            Some(direct) => {
                let align = DIRECT_IO_ALIGN as u64;
                let start = round_down(offset, align);
                let end = round_up((offset + buf.len() as u64) as usize, DIRECT_IO_ALIGN) as u64;
                let mut block = AlignedBuf::new((end - start) as usize);
                let got = read_full(direct, start, &mut block).map_err(|e| self.io_err(e))?;
                let skip = (offset - start) as usize;
                let avail = got.saturating_sub(skip).min(buf.len());
                buf[..avail].copy_from_slice(&block[skip..skip + avail]);
                avail
            }
            None => read_full(&self.buffered, offset, buf).map_err(|e| self.io_err(e))?,
        };
        buf[n..].fill(0);
        Ok(n)
    }

    /// Writes `data` at `offset` through the OS page cache, as SQLite's own writes go: the caller
    /// makes them durable with [`DataFile::sync`] at commit, not one device round trip per page.
    /// Reads stay O_DIRECT; Linux keeps them coherent by writing back a dirty range before a
    /// direct read of it, and L1 serves most re-reads of a just-written page anyway.
    pub fn write_at(&self, offset: u64, data: &[u8]) -> Result<()> {
        let _serial = self.write_lock.lock();
        self.buffered
            .write_all_at(data, offset)
            .map_err(|e| self.io_err(e))
    }

    /// Drops the file's clean pages from the OS page cache (after a sync they are all clean), so
    /// that written pages do not linger there as an unaccounted third cache tier.
    pub fn release_os_cache(&self) {
        if self.direct.is_some() {
            // SAFETY: the descriptor is open; fadvise only drops clean cached pages of this file.
            unsafe {
                libc::posix_fadvise(self.buffered.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED)
            };
        }
    }

    pub fn truncate(&self, len: u64) -> Result<()> {
        let _serial = self.write_lock.lock();
        self.buffered.set_len(len).map_err(|e| self.io_err(e))
    }

    pub fn sync(&self) -> Result<()> {
        self.buffered.sync_data().map_err(|e| self.io_err(e))?;
        self.release_os_cache();
        Ok(())
    }
}

/// pread until `buf` is full or end of file; returns the bytes read.
pub fn read_full(file: &File, offset: u64, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}
