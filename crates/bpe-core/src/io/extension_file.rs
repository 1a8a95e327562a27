//! The extension file on fast local storage: created exclusively (never clobbering, never
//! following a symlink, mode 0600 because it holds database pages in the clear), preallocated,
//! and accessed with O_DIRECT.
//!
//! A process that ends with its extension on (a clean exit or a kill) leaves the file behind for
//! the next one to start warm from. Such a file is recognised: it carries our extended
//! attribute, belongs to this user with mode 0600, and no live process holds the OFD lock that
//! every enabled extension holds on its byte 0 (the kernel drops it with the last descriptor).
//! It is taken over if it has the size asked for, and replaced by a new file otherwise. Any
//! other file at the path is refused and left untouched.

use super::aligned::read_full;
use super::own_file::{self, Access};
use crate::error::{Error, ExtensionRefusal, Result};
use std::fs::File;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

pub struct ExtensionFile {
    path: PathBuf,
    file: File,
    dev: u64,
    ino: u64,
}

fn bad(path: &Path, reason: impl Into<String>) -> Error {
    Error::BadExtensionPath {
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

fn refused(path: &Path, why: ExtensionRefusal) -> Error {
    Error::ExtensionRefused {
        path: path.to_path_buf(),
        why,
    }
}

/// Checks a requested extension path without touching the file system beyond reads. A path
/// other processes use is refused unless the extension is to be `shared` with them.
pub fn validate_path(path: &Path, shared: bool) -> Result<()> {
    if !path.is_absolute() {
        return Err(bad(path, "the path must be absolute"));
    }
    let Some(name) = path.file_name() else {
        return Err(bad(path, "the path names no file"));
    };
    if let Some(suffix) = companion_suffix(&name.to_string_lossy()) {
        return Err(bad(
            path,
            format!(
                "a name ending in \"{suffix}\" is a database's companion file (SQLite's journal, \
                 WAL or shared memory would be this file)"
            ),
        ));
    }
    if super::shm_dir::is_in_namespace(path) {
        return Err(bad(
            path,
            "it is sqlite-bpe's own: in /dev/shm, names starting \"sqlite-bpe-\" are the \
             databases' commit logs and each user's directory of shared memory and counters",
        ));
    }
    let parent = path.parent().unwrap_or(Path::new("/"));
    match std::fs::metadata(parent) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => return Err(bad(path, "its parent is not a directory")),
        Err(e) => return Err(bad(path, format!("its directory is not usable: {e}"))),
    }
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => Err(bad(path, "it is a directory")),
        Ok(m) if m.file_type().is_symlink() => Err(bad(path, "it is a symbolic link")),
        Ok(_) => match inspect(path) {
            Found::Stale(..) => Ok(()), // replaced by create()
            Found::Live if shared => Ok(()),
            Found::Live => Err(refused(path, ExtensionRefusal::InUse)),
            Found::Foreign => Err(refused(path, ExtensionRefusal::FileExists)),
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(bad(path, e.to_string())),
    }
}

/// The companion-file suffix `name` ends with, if any: SQLite opens `<db>-journal`, `<db>-wal`,
/// `<db>-shm` and super-journals `<db>-mjXXXXXXXXX` next to a database, and an extension at such
/// a name would be overwritten by SQLite (or overwrite a live journal).
fn companion_suffix(name: &str) -> Option<&'static str> {
    for suffix in ["-journal", "-wal", "-shm"] {
        if name.ends_with(suffix) {
            return Some(suffix);
        }
    }
    // SQLite names super-journals "-mj" and nine hex digits (older versions: eight).
    let mj = name.rfind("-mj")?;
    let tail = &name[mj + 3..];
    (!tail.is_empty() && tail.bytes().all(|b| b.is_ascii_hexdigit())).then_some("-mjXXXXXXXXX")
}

impl ExtensionFile {
    /// Takes over the file a previous process of ours left at `path` if it is `size` bytes
    /// (true: its contents are worth restoring), or creates a new one (false).
    pub fn open(path: &Path, size: u64) -> Result<(ExtensionFile, bool)> {
        validate_path(path, false)?;
        if let Some((dev, ino)) = stale_extension(path) {
            // Left by processes that shared it: their index goes with them.
            remove_shared_memory(dev, ino);
            if let Some(file) = Self::take_over(path, dev, ino, size)? {
                return Ok((file, true));
            }
            log::info!(
                "replacing the buffer pool extension file {} left by a previous process (another size)",
                path.display()
            );
            remove_if_same(path, dev, ino);
        }
        Self::create(path, size).map(|f| (f, false))
    }

    /// Opens the extension at `path` to share it with the other processes that do (see
    /// `extension/shared`): every participant holds a shared lock on byte 0 (so a process that
    /// wants the file for itself sees it live and is refused). A file of ours that no process
    /// holds for itself is joined if it has `size` bytes; one of another size is refused while
    /// others share it, and replaced if nobody does. A missing file is created.
    pub fn open_shared(path: &Path, size: u64) -> Result<ExtensionFile> {
        // Another process may be creating the file this moment (it has no mark yet, or holds
        // byte 0 for itself until it is laid out): a refusal then is retried for a while.
        let mut last = None;
        for _ in 0..100 {
            match Self::try_open_shared(path, size) {
                Ok(ext) => return Ok(ext),
                Err(e @ Error::ExtensionRefused { why, .. }) if why.may_be_in_creation() => {
                    last = Some(e)
                }
                Err(e) => return Err(e),
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        Err(last.unwrap_or_else(|| refused(path, ExtensionRefusal::KeepsChanging)))
    }

    fn try_open_shared(path: &Path, size: u64) -> Result<ExtensionFile> {
        for _ in 0..3 {
            if std::fs::symlink_metadata(path).is_err() {
                match Self::create(path, size) {
                    Ok(ext) => {
                        ext.share_lock()?;
                        return Ok(ext);
                    }
                    // Another process created it meanwhile: join it.
                    Err(Error::ExtensionCreate { source, .. })
                        if source.kind() == std::io::ErrorKind::AlreadyExists =>
                    {
                        continue
                    }
                    Err(e) => return Err(e),
                }
            }
            let (dev, ino) = match inspect(path) {
                Found::Foreign => return Err(refused(path, ExtensionRefusal::FileExists)),
                Found::Stale(dev, ino) => (dev, ino),
                Found::Live => match std::fs::symlink_metadata(path) {
                    Ok(m) => (m.dev(), m.ino()),
                    Err(_) => continue,
                },
            };
            let Ok(file) = own_file::open(path, Access::Update) else {
                continue;
            };
            let meta = file.metadata().map_err(|e| bad(path, e.to_string()))?;
            if (meta.dev(), meta.ino()) != (dev, ino) {
                continue; // replaced meanwhile
            }
            let ext = ExtensionFile {
                path: path.to_path_buf(),
                file,
                dev,
                ino,
            };
            ext.share_lock()?;
            if meta.len() == size {
                ext.set_direct()?;
                return Ok(ext);
            }
            // Another size: replace it only if nobody else has it.
            if !super::ofd::try_exclusive(&ext.file, 0) {
                return Err(refused(
                    path,
                    ExtensionRefusal::SharedAtOtherSize(meta.len()),
                ));
            }
            remove_shared_memory(dev, ino);
            ext.remove();
        }
        Err(refused(path, ExtensionRefusal::KeepsChanging))
    }

    /// Turns the lock on byte 0 into a shared one (or takes one): refused if a process holds
    /// the file for itself.
    fn share_lock(&self) -> Result<()> {
        if super::ofd::try_shared(&self.file, 0) {
            Ok(())
        } else {
            Err(refused(&self.path, ExtensionRefusal::HeldForItself))
        }
    }

    /// Opens and locks the left-over file (dev, ino) if it still is at `path` with `size` bytes.
    fn take_over(path: &Path, dev: u64, ino: u64, size: u64) -> Result<Option<ExtensionFile>> {
        let Ok(file) = own_file::open(path, Access::Update) else {
            return Ok(None);
        };
        let Ok(meta) = file.metadata() else {
            return Ok(None);
        };
        if (meta.dev(), meta.ino()) != (dev, ino) {
            return Ok(None); // replaced meanwhile: create_new will refuse whatever is there
        }
        let fl = lock_request(libc::F_WRLCK);
        // SAFETY: the descriptor is open (read-write) for the call; fl is a valid flock.
        if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_OFD_SETLK, &fl) } != 0 {
            return Err(refused(path, ExtensionRefusal::InUse));
        }
        if meta.len() != size {
            return Ok(None);
        }
        let ext = ExtensionFile {
            path: path.to_path_buf(),
            file,
            dev,
            ino,
        };
        ext.set_direct()?;
        Ok(Some(ext))
    }

    /// Creates and preallocates the file. On any failure nothing is left behind.
    fn create(path: &Path, size: u64) -> Result<ExtensionFile> {
        let create_err = |source| Error::ExtensionCreate {
            path: path.to_path_buf(),
            source,
        };
        let file = own_file::open(path, Access::CreateNew).map_err(create_err)?;
        let meta = file.metadata().map_err(create_err)?;
        let ext = ExtensionFile {
            path: path.to_path_buf(),
            file,
            dev: meta.dev(),
            ino: meta.ino(),
        };
        // From here on the file is ours: remove it if the rest fails.
        ext.mark_ours();
        if let Err(e) = ext.set_direct().and_then(|_| ext.preallocate(size)) {
            ext.remove();
            return Err(e);
        }
        Ok(ext)
    }

    /// Tags the file and takes the lock that tells a live extension from a stale one. Both are
    /// best effort: without them a left-over file is merely refused instead of replaced.
    fn mark_ours(&self) {
        let fd = self.file.as_raw_fd();
        // SAFETY: fd is open for the call; name and value are valid for their lengths.
        unsafe {
            libc::fsetxattr(
                fd,
                MARK_NAME.as_ptr(),
                MARK_VALUE.as_ptr() as *const libc::c_void,
                MARK_VALUE.len(),
                0,
            )
        };
        let fl = lock_request(libc::F_WRLCK);
        // SAFETY: fd is open (read-write) for the life of self.file; fl is a valid flock.
        unsafe { libc::fcntl(fd, libc::F_OFD_SETLK, &fl) };
    }

    fn set_direct(&self) -> Result<()> {
        let fd = self.file.as_raw_fd();
        // SAFETY: fd is a valid open descriptor owned by self.file for this whole call.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
        // SAFETY: as above; F_SETFL only changes status flags of the open file description.
        let rc = unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_DIRECT) };
        if flags < 0 || rc < 0 {
            return Err(bad(
                &self.path,
                format!(
                    "its file system does not support O_DIRECT ({})",
                    std::io::Error::last_os_error()
                ),
            ));
        }
        Ok(())
    }

    fn preallocate(&self, size: u64) -> Result<()> {
        // SAFETY: fd is valid for the call; fallocate with mode 0 only allocates blocks.
        let rc = unsafe { libc::fallocate(self.file.as_raw_fd(), 0, 0, size as libc::off_t) };
        if rc != 0 {
            return Err(Error::ExtensionCreate {
                path: self.path.clone(),
                source: std::io::Error::last_os_error(),
            });
        }
        Ok(())
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn identity(&self) -> super::FileIdentity {
        super::FileIdentity {
            dev: self.dev,
            ino: self.ino,
        }
    }

    pub fn raw_fd(&self) -> i32 {
        self.file.as_raw_fd()
    }

    /// Reads `buf.len()` bytes (aligned) at `offset`.
    pub fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        let n = read_full(&self.file, offset, buf)?;
        if n < buf.len() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "extension file is shorter than expected (truncated?)",
            ));
        }
        Ok(())
    }

    /// Writes an aligned batch at `offset`.
    pub fn write_at(&self, offset: u64, data: &[u8]) -> std::io::Result<()> {
        self.file.write_all_at(data, offset)
    }

    /// Releases the lock that marks the file as a live extension's (the extension is closed and
    /// the file left for the next process).
    pub fn unlock(&self) {
        let fl = lock_request(libc::F_UNLCK);
        // SAFETY: fd is open for the life of self.file; fl is a valid flock.
        unsafe { libc::fcntl(self.file.as_raw_fd(), libc::F_OFD_SETLK, &fl) };
    }

    /// Deletes the file, but only if the path still names our inode: never a file that is not ours.
    pub fn remove(&self) {
        remove_if_same(&self.path, self.dev, self.ino);
    }
}

const MARK_NAME: &std::ffi::CStr = c"user.sqlite-bpe";
const MARK_VALUE: &[u8] = b"buffer pool extension";

fn lock_request(kind: libc::c_int) -> libc::flock {
    // SAFETY: flock is plain data; zeroed is a valid value to fill in.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = kind as _;
    fl.l_whence = libc::SEEK_SET as _;
    fl.l_start = 0;
    fl.l_len = 1;
    fl
}

/// Removes the shared memory of the shared extension file (dev, ino), if there is one.
fn remove_shared_memory(dev: u64, ino: u64) {
    if let Ok(p) = super::shm_dir::extension_memory_path(super::FileIdentity { dev, ino }) {
        let _ = std::fs::remove_file(p);
    }
}

fn remove_if_same(path: &Path, dev: u64, ino: u64) {
    if let Ok(m) = std::fs::symlink_metadata(path) {
        if m.dev() == dev && m.ino() == ino {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// What a file at `path` is, as far as extensions go.
enum Found {
    /// Ours, and no live process holds it: (dev, ino).
    Stale(u64, u64),
    /// Ours, and a live process's extension holds it.
    Live,
    Foreign,
}

fn inspect(path: &Path) -> Found {
    let Ok(file) = own_file::open(path, Access::Inspect) else {
        return Found::Foreign;
    };
    let Ok(m) = file.metadata() else {
        return Found::Foreign;
    };
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    if !m.is_file() || m.uid() != uid || m.mode() & 0o7777 != 0o600 {
        return Found::Foreign;
    }
    let fd = file.as_raw_fd();
    let mut value = [0u8; 64];
    // SAFETY: fd is open for the call; value is writable for its length.
    let n = unsafe {
        libc::fgetxattr(
            fd,
            MARK_NAME.as_ptr(),
            value.as_mut_ptr() as *mut libc::c_void,
            value.len(),
        )
    };
    if n < 0 || &value[..n as usize] != MARK_VALUE {
        return Found::Foreign;
    }
    let mut fl = lock_request(libc::F_WRLCK);
    // SAFETY: fd is open for the call; fl is a valid flock that F_OFD_GETLK fills in.
    if unsafe { libc::fcntl(fd, libc::F_OFD_GETLK, &mut fl) } != 0 {
        return Found::Foreign;
    }
    if fl.l_type as libc::c_int == libc::F_UNLCK {
        Found::Stale(m.dev(), m.ino())
    } else {
        Found::Live
    }
}

/// An extension file whose process is gone: (dev, ino) to remove it by.
fn stale_extension(path: &Path) -> Option<(u64, u64)> {
    match inspect(path) {
        Found::Stale(dev, ino) => Some((dev, ino)),
        _ => None,
    }
}
