//! Memory shared by the processes of one user: a file in the user's private directory under
//! /dev/shm (0700, the file 0600), mapped read-write, and a robust process-shared mutex to put
//! in it. What lives in the mapping and how it is used is the caller's (see
//! `extension/shared`); this module is the FFI edge: the mapping's lifetime and the pthread
//! calls.

use super::own_file::{self, Access};
use std::cell::UnsafeCell;
use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;

/// A file of shared memory, mapped.
pub struct SharedMemory {
    ptr: NonNull<u8>,
    len: usize,
    path: PathBuf,
    file: File,
}

// SAFETY: the mapping is plain memory valid for the life of `self` in every thread; what is
// stored in it is made of atomics or guarded by a process-shared mutex by its users.
unsafe impl Send for SharedMemory {}
// SAFETY: as above.
unsafe impl Sync for SharedMemory {}

impl SharedMemory {
    /// Opens (creating if missing) the shared memory at `path`, `len` bytes, and maps it. A file
    /// of another length is made that length, zeroed, if `may_resize` (nobody else uses it), and
    /// refused otherwise. Refused unless it is a regular file of this user's, mode 0600, and
    /// unless its memory can be reserved (a full /dev/shm). The caller serializes opening and
    /// checks what it finds. Every error names the path.
    pub fn open(path: &Path, len: usize, may_resize: bool) -> std::io::Result<SharedMemory> {
        Self::open_unnamed(path, len, may_resize)
            .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", path.display())))
    }

    fn open_unnamed(path: &Path, len: usize, may_resize: bool) -> std::io::Result<SharedMemory> {
        let file = open_in_use(path)?;
        let meta = file.metadata()?;
        // SAFETY: geteuid has no preconditions.
        let uid = unsafe { libc::geteuid() };
        if !meta.is_file() || meta.uid() != uid || meta.mode() & 0o7777 != 0o600 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::PermissionDenied,
                "it is not this user's private file",
            ));
        }
        if meta.len() != len as u64 {
            if !may_resize {
                return Err(std::io::Error::other(format!(
                    "it is {} bytes where this extension needs {len}: the processes attached \
                     to it use another extension size or version; detach them first",
                    meta.len()
                )));
            }
            file.set_len(0)?;
            file.set_len(len as u64)?;
        }
        // Every time, also when the file was there: whoever sized it may not have reserved it.
        reserve(&file, path, len)?;
        // SAFETY: maps `len` bytes of a file that long, its memory reserved, shared, read-write;
        // the mapping is unmapped in Drop and never handed out beyond the life of self.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(SharedMemory {
            ptr: NonNull::new(ptr as *mut u8).expect("mmap returned null"),
            len,
            path: path.to_path_buf(),
            file,
        })
    }

    /// Zeroes the whole mapping (the file is emptied and regrown: its pages are freed, not
    /// written, then reserved again). Only while no other process uses it. After an error the
    /// mapping must not be touched (its memory may not be there): the caller drops it.
    pub fn zero(&self) -> std::io::Result<()> {
        self.file.set_len(0)?;
        self.file.set_len(self.len as u64)?;
        reserve(&self.file, &self.path, self.len)
    }

    pub fn base(&self) -> NonNull<u8> {
        self.ptr
    }

    /// Bytes of the mapping's file in memory now (all of it: `open` reserves it).
    pub fn resident_bytes(&self) -> u64 {
        self.file.metadata().map_or(0, |m| m.blocks() * 512)
    }

    /// Removes the file (the mappings of processes still holding it stay valid).
    /// Marks the file no longer in use by this process (it stays mapped, and valid memory, for
    /// as long as `self` lives; a sweeper may now remove it).
    pub fn release_use(&self) {
        // SAFETY: a plain syscall on a descriptor `self` owns.
        unsafe { libc::flock(self.file.as_raw_fd(), libc::LOCK_UN) };
    }

    #[cfg(test)]
    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn unlink(&self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Opens (creating if missing) the file at `path` and marks it in use for as long as the
/// descriptor lives: a shared `flock`, which the kernel drops when the process dies, however it
/// dies. A sweeper removes a file only while it holds the exclusive lock ([`remove_if_unused`]),
/// so a file is never removed under a process using it; one removed between this open and the
/// lock is not the path's any more, and is opened again. The lock is tried, not waited for:
/// a sweeper holds it for microseconds, but a process forked in that moment holds a copy of it
/// for as long as it lives, and an attach must not wait for that (it fails after a second, and
/// an extension shared by default is then private).
pub(crate) fn open_in_use(path: &Path) -> std::io::Result<File> {
    for _ in 0..1000 {
        let file = own_file::open(path, Access::UpdateOrCreate)?;
        // SAFETY: a plain syscall on a descriptor we own.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) } != 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EWOULDBLOCK) {
                return Err(e);
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
            continue; // a sweeper looks at it
        }
        let opened = file.metadata()?;
        match std::fs::symlink_metadata(path) {
            Ok(now) if (now.dev(), now.ino()) == (opened.dev(), opened.ino()) => return Ok(file),
            _ => continue, // swept meanwhile
        }
    }
    Err(std::io::Error::other(
        "it keeps being removed, or held by a sweeping process, while this process opens it",
    ))
}

/// Whether any process maps `file` (at `path`), by its memory maps in /proc (the inode and
/// the path): a test of use that needs nothing of the processes using it. True where /proc
/// cannot tell (not readable, hidden processes aside: only this user's matter).
pub(crate) fn mapped_by_any_process(path: &Path, file: &File) -> bool {
    let Ok(ino) = file.metadata().map(|m| m.ino()) else {
        return true;
    };
    let Ok(processes) = std::fs::read_dir("/proc") else {
        return true;
    };
    let name = path.as_os_str().as_encoded_bytes();
    processes.flatten().any(|p| {
        let Ok(maps) = std::fs::read(p.path().join("maps")) else {
            return false; // gone, or another user's
        };
        // "address perms offset dev inode    path"
        maps.split(|&b| b == b'\n').any(|line| {
            let mut fields = line.split(|&b| b == b' ').filter(|f| !f.is_empty());
            let inode = fields.nth(4);
            let mapped = fields.next();
            inode == Some(ino.to_string().as_bytes()) && mapped == Some(name)
        })
    })
}

/// Removes the file at `path` if no process has it open through [`SharedMemory`] and
/// `unused(file)` agrees (it reads the file; it runs with the exclusive lock held). Returns
/// whether it was removed.
pub(crate) fn remove_if_unused(path: &Path, unused: impl FnOnce(&File) -> bool) -> bool {
    let Ok(file) = own_file::open(path, Access::Read) else {
        return false;
    };
    // SAFETY: a plain syscall on a descriptor we own; the lock goes with the descriptor.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        return false;
    }
    let same = match (file.metadata(), std::fs::symlink_metadata(path)) {
        (Ok(a), Ok(b)) => (a.dev(), a.ino()) == (b.dev(), b.ino()),
        _ => false,
    };
    let removed = same && unused(&file) && std::fs::remove_file(path).is_ok();
    // Given back explicitly, not by the close: a child forked meanwhile holds a copy of the
    // descriptor, and with it the lock, for as long as it lives.
    // SAFETY: a plain syscall on a descriptor we own.
    unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_UN) };
    removed
}

/// Allocates the memory of the file's first `len` bytes now (pages already there stay as they
/// are). tmpfs otherwise allocates a page when it is first touched, and a touch it cannot back (a
/// full /dev/shm) is a SIGBUS, not an error: a mapping is only touched once this succeeded.
fn reserve(file: &File, path: &Path, len: usize) -> std::io::Result<()> {
    let rc = loop {
        // SAFETY: a plain syscall on a descriptor we own; it returns an errno value.
        match unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, len as libc::off_t) } {
            libc::EINTR => continue,
            rc => break rc,
        }
    };
    if rc == 0 {
        return Ok(());
    }
    let e = std::io::Error::from_raw_os_error(rc);
    let why = match (rc, path.starts_with("/dev/shm")) {
        (libc::ENOSPC, true) => "/dev/shm is full: ",
        (libc::ENOSPC, false) => "its file system is full: ",
        _ => "",
    };
    Err(std::io::Error::new(
        e.kind(),
        format!("{why}cannot reserve its {len} bytes of memory ({e})"),
    ))
}

impl Drop for SharedMemory {
    fn drop(&mut self) {
        // SAFETY: ptr/len are the mapping made in `open`, unmapped once, here; no reference into
        // it outlives self (users borrow from self).
        unsafe { libc::munmap(self.ptr.as_ptr() as *mut libc::c_void, self.len) };
    }
}

/// A pthread mutex that works across processes and survives its holder's death: the next
/// locker is told (`EOWNERDEAD`) and must repair what the holder may have left half done.
#[repr(C)]
pub struct RobustMutex {
    inner: UnsafeCell<libc::pthread_mutex_t>,
}

/// What locking found.
#[derive(Debug, PartialEq, Eq)]
pub enum Locked {
    /// The previous holder unlocked it.
    Clean,
    /// The previous holder died holding it: what it guards may be half changed.
    OwnerDied,
}

impl RobustMutex {
    /// Makes the mutex (process-shared, robust) in place.
    ///
    /// # Safety
    /// No thread of any process may use the mutex during the call.
    pub unsafe fn init(&self) -> std::io::Result<()> {
        let mut attr: libc::pthread_mutexattr_t = std::mem::zeroed();
        let check = |rc: libc::c_int| {
            if rc == 0 {
                Ok(())
            } else {
                Err(std::io::Error::from_raw_os_error(rc))
            }
        };
        check(libc::pthread_mutexattr_init(&mut attr))?;
        let made = check(libc::pthread_mutexattr_setpshared(
            &mut attr,
            libc::PTHREAD_PROCESS_SHARED,
        ))
        .and_then(|_| {
            check(libc::pthread_mutexattr_setrobust(
                &mut attr,
                libc::PTHREAD_MUTEX_ROBUST,
            ))
        })
        .and_then(|_| check(libc::pthread_mutex_init(self.inner.get(), &attr)));
        libc::pthread_mutexattr_destroy(&mut attr);
        made
    }

    /// Locks it if it is free now (None if not), without reading a clock: the common case of
    /// every lookup. After `OwnerDied` the caller repairs what it guards before unlocking.
    /// An error means it can never be locked again (a holder died and the next one unlocked
    /// without repairing): the caller stops using the memory.
    pub fn try_lock(&self) -> std::io::Result<Option<Locked>> {
        // SAFETY: the mutex was initialized by `init` (the segment's creator) before the
        // segment was published; pthread calls are the only access to it.
        match unsafe { libc::pthread_mutex_trylock(self.inner.get()) } {
            0 => Ok(Some(Locked::Clean)),
            libc::EBUSY => Ok(None),
            libc::EOWNERDEAD => {
                // SAFETY: this thread holds the mutex (EOWNERDEAD returns it locked).
                unsafe { libc::pthread_mutex_consistent(self.inner.get()) };
                Ok(Some(Locked::OwnerDied))
            }
            rc => Err(std::io::Error::from_raw_os_error(rc)),
        }
    }

    /// Locks it if that takes at most `wait` (None if not); `OwnerDied` and `Err` as for
    /// [`try_lock`](Self::try_lock). There is no wait without a bound: a holder stopped by
    /// SIGSTOP or a debugger would keep its caller as long as it is stopped.
    pub fn lock_within(&self, wait: std::time::Duration) -> std::io::Result<Option<Locked>> {
        let mut now = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: writes the current time into `now`, a valid timespec.
        unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut now) };
        let nanos = now.tv_nsec as u64 + wait.subsec_nanos() as u64;
        let deadline = libc::timespec {
            tv_sec: now.tv_sec
                + wait.as_secs() as libc::time_t
                + (nanos / 1_000_000_000) as libc::time_t,
            tv_nsec: (nanos % 1_000_000_000) as _,
        };
        // SAFETY: as in `try_lock`; the deadline is a valid absolute CLOCK_REALTIME time.
        match unsafe { libc::pthread_mutex_timedlock(self.inner.get(), &deadline) } {
            0 => Ok(Some(Locked::Clean)),
            libc::ETIMEDOUT => Ok(None),
            libc::EOWNERDEAD => {
                // SAFETY: this thread holds the mutex (EOWNERDEAD returns it locked).
                unsafe { libc::pthread_mutex_consistent(self.inner.get()) };
                Ok(Some(Locked::OwnerDied))
            }
            rc => Err(std::io::Error::from_raw_os_error(rc)),
        }
    }

    /// Unlocks it; only by the thread that locked it.
    pub fn unlock(&self) {
        // SAFETY: called by the holder (the guard that locked it), once.
        unsafe { libc::pthread_mutex_unlock(self.inner.get()) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// tmpfs backs a page when it is first touched, and a touch it cannot back is a SIGBUS:
    /// `open` reserves the whole file first, also one that someone else sized (sparse).
    #[test]
    fn open_reserves_the_memory_of_a_file_sized_by_someone_else() {
        let Ok(path) = super::super::shm_dir::own_directory()
            .map(|d| d.join(format!("reserve-test-{}", std::process::id())))
        else {
            return;
        };
        let len = 64 * 4096;
        let _ = std::fs::remove_file(&path);
        let file = own_file::open(&path, Access::CreateNew).unwrap();
        file.set_len(len as u64).unwrap();
        let sparse = file.metadata().unwrap().blocks() * 512;
        let mem = SharedMemory::open(&path, len, false).unwrap();
        let reserved = mem.resident_bytes();
        mem.zero().unwrap();
        let zeroed = mem.resident_bytes();
        mem.unlink();
        if sparse >= len as u64 {
            return; // not a file system with sparse files: nothing to tell
        }
        assert!(reserved >= len as u64, "{reserved} of {len} bytes reserved");
        assert!(zeroed >= len as u64, "{zeroed} of {len} bytes after zero");
    }
}
