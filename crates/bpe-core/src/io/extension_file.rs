//! The extension file on fast local storage: created exclusively (never clobbering, never
//! following a symlink, mode 0600 because it holds database pages in the clear), preallocated,
//! and accessed with O_DIRECT.

use super::data_file::read_full;
use super::faults::FaultInjector;
use crate::{Error, Result};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub struct ExtensionFile {
    path: PathBuf,
    file: File,
    dev: u64,
    ino: u64,
    faults: Arc<FaultInjector>,
}

fn bad(path: &Path, reason: impl Into<String>) -> Error {
    Error::BadExtensionPath {
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

/// Checks a requested extension path without touching the file system beyond reads.
pub fn validate_path(path: &Path) -> Result<()> {
    if !path.is_absolute() {
        return Err(bad(path, "the path must be absolute"));
    }
    if path.file_name().is_none() {
        return Err(bad(path, "the path names no file"));
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
        Ok(_) => Err(bad(
            path,
            "a file already exists there; the extension never overwrites a file",
        )),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(bad(path, e.to_string())),
    }
}

impl ExtensionFile {
    /// Creates and preallocates the file. On any failure nothing is left behind.
    pub fn create(path: &Path, size: u64, faults: Arc<FaultInjector>) -> Result<ExtensionFile> {
        validate_path(path)?;
        let create_err = |source| Error::ExtensionCreate {
            path: path.to_path_buf(),
            source,
        };
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(path)
            .map_err(create_err)?;
        let meta = file.metadata().map_err(create_err)?;
        let ext = ExtensionFile {
            path: path.to_path_buf(),
            file,
            dev: meta.dev(),
            ino: meta.ino(),
            faults,
        };
        // From here on the file is ours: remove it if the rest fails.
        if let Err(e) = ext.set_direct().and_then(|_| ext.preallocate(size)) {
            ext.remove();
            return Err(e);
        }
        Ok(ext)
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

    /// Reads `buf.len()` bytes (aligned) at `offset`.
    pub fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        if let Some(e) = self.faults.take_extension_read_error() {
            return Err(e);
        }
        let n = read_full(&self.file, offset, buf)?;
        if n < buf.len() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "extension file is shorter than expected (truncated?)",
            ));
        }
        if self.faults.take_extension_corruption() {
            buf.iter_mut().step_by(97).for_each(|b| *b ^= 0x5a);
        }
        Ok(())
    }

    /// Writes an aligned batch at `offset`.
    pub fn write_at(&self, offset: u64, data: &[u8]) -> std::io::Result<()> {
        if let Some(e) = self.faults.take_extension_write_error() {
            return Err(e);
        }
        self.file.write_all_at(data, offset)
    }

    /// Deletes the file, but only if the path still names our inode: never a file that is not ours.
    pub fn remove(&self) {
        if let Ok(m) = std::fs::symlink_metadata(&self.path) {
            if m.dev() == self.dev && m.ino() == self.ino {
                let _ = std::fs::remove_file(&self.path);
            }
        }
    }
}
