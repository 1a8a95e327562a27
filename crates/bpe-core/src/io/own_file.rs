//! Opening the files the engine keeps beside the user's (the extension file, its shared memory,
//! the published samples): one place says how, so that none of them is ever opened through a
//! symbolic link (another user could plant one where ours goes) or inherited across an exec.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// How a file of ours is opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Read only; never waits (a FIFO planted under the name would block a plain open).
    Inspect,
    /// Read only.
    Read,
    /// Read and write, the file already there.
    Update,
    /// Read and write, made (mode 0600) if it is not there.
    UpdateOrCreate,
    /// Read and write, made (mode 0600); an error if something is there already.
    CreateNew,
}

/// Opens `path` as `access` says, never through a symbolic link, close-on-exec.
pub fn open(path: &Path, access: Access) -> std::io::Result<File> {
    let mut options = OpenOptions::new();
    let mut flags = libc::O_NOFOLLOW | libc::O_CLOEXEC;
    options.read(true);
    match access {
        Access::Inspect => flags |= libc::O_NONBLOCK,
        Access::Read => {}
        Access::Update => {
            options.write(true);
        }
        Access::UpdateOrCreate => {
            options.write(true).create(true).mode(0o600);
        }
        Access::CreateNew => {
            options.write(true).create_new(true).mode(0o600);
        }
    }
    options.custom_flags(flags).open(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn never_follows_a_symbolic_link_and_makes_files_for_this_user_alone() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("target");
        std::fs::write(&target, b"x").unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        for access in [
            Access::Inspect,
            Access::Read,
            Access::Update,
            Access::UpdateOrCreate,
        ] {
            let e = open(&link, access).expect_err("opened through a symbolic link");
            assert_eq!(e.raw_os_error(), Some(libc::ELOOP), "{access:?}");
        }
        let made = dir.path().join("made");
        open(&made, Access::CreateNew).unwrap();
        let mode = std::fs::metadata(&made).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert!(
            open(&made, Access::CreateNew).is_err(),
            "CreateNew over a file"
        );
        let f = open(&made, Access::Read).unwrap();
        let fd = std::os::fd::AsRawFd::as_raw_fd(&f);
        // SAFETY: fcntl(F_GETFD) on a descriptor this test owns.
        let fd_flags = unsafe { libc::fcntl(fd, libc::F_GETFD) };
        assert_ne!(fd_flags & libc::FD_CLOEXEC, 0, "not close-on-exec");
    }
}
