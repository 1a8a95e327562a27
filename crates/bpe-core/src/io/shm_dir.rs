//! Where sqlite-bpe keeps its files in shared memory: each user's private directory under
//! /dev/shm (`sqlite-bpe-<uid>`, mode 0700) for published counters and shared extensions'
//! memory, and the namespace of names starting `sqlite-bpe-` directly in /dev/shm (the SQLite
//! adapter's commit logs). The directory is used only if it is this user's alone: another local
//! user who made it first could otherwise read or plant what is in it.

use std::fs;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// How the names of our own files and directories in /dev/shm start: each user's directory
/// (`sqlite-bpe-<uid>`) and, made by the SQLite adapter, the databases' commit logs
/// (`sqlite-bpe-<uid>-<dev>-<ino>`). Nothing else may be put at such a name.
pub(crate) const NAMESPACE: &str = "sqlite-bpe-";

pub(crate) fn uid() -> u32 {
    // SAFETY: getuid has no preconditions and cannot fail.
    unsafe { libc::getuid() }
}

/// Where the per-user directories are: /dev/shm where there is one, else the temp dir.
pub(crate) fn base() -> PathBuf {
    if Path::new("/dev/shm").is_dir() {
        PathBuf::from("/dev/shm")
    } else {
        std::env::temp_dir()
    }
}

/// This user's directory under `base`.
pub(crate) fn directory_in(base: &Path) -> PathBuf {
    base.join(format!("{NAMESPACE}{}", uid()))
}

/// The directory, created 0700 if missing; refused (PermissionDenied, naming it and why) if it
/// is not ours alone: then nothing is published there, nor shared memory made, since another
/// user could read or plant what is in it.
pub(crate) fn own_directory() -> std::io::Result<PathBuf> {
    own_directory_in(&base(), true)
}

/// This user's directory under `base` if it is this user's alone: a directory (not a symbolic
/// link), this user's, that nobody else may enter (mode 0700). Created so first if `create` and
/// missing. The one check of the directory, for writers and readers alike; every error names
/// the directory (and NotFound says it is not there).
pub(crate) fn own_directory_in(base: &Path, create: bool) -> std::io::Result<PathBuf> {
    let dir = directory_in(base);
    let named =
        |e: std::io::Error| std::io::Error::new(e.kind(), format!("{}: {e}", dir.display()));
    if create {
        match fs::DirBuilder::new().mode(0o700).create(&dir) {
            Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => return Err(named(e)),
            _ => {}
        }
    }
    let meta = fs::symlink_metadata(&dir).map_err(named)?;
    let mode = meta.permissions().mode() & 0o7777;
    let why = if meta.file_type().is_symlink() {
        "it is a symbolic link".to_string()
    } else if !meta.is_dir() {
        "it is not a directory".to_string()
    } else if meta.uid() != uid() {
        format!("it belongs to uid {}", meta.uid())
    } else if mode & 0o077 != 0 {
        format!("its mode is {mode:04o}, not 0700")
    } else {
        return Ok(dir);
    };
    Err(std::io::Error::new(
        std::io::ErrorKind::PermissionDenied,
        format!("{} is not this user's alone: {why}", dir.display()),
    ))
}

/// Whether `path` is in our own namespace in /dev/shm (a name starting with `sqlite-bpe-`
/// directly in /dev/shm, or anything below one), or in this user's directory wherever it is:
/// files of ours that nothing else may be put at (an extension file there would overwrite
/// them, or be overwritten). Looked at both as written and with its directory resolved
/// (symbolic links, `..`); /dev/shm is recognised by its identity too (a bind mount).
pub(crate) fn is_in_namespace(path: &Path) -> bool {
    let identity = |p: &Path| fs::metadata(p).ok().map(|m| (m.dev(), m.ino()));
    let shm = identity(Path::new("/dev/shm"));
    let own = identity(&directory());
    let resolved = path
        .parent()
        .zip(path.file_name())
        .and_then(|(dir, name)| Some(fs::canonicalize(dir).ok()?.join(name)));
    std::iter::once(path.to_path_buf())
        .chain(resolved)
        .any(|p| {
            p.ancestors().any(|a| {
                let Some(dir) = a.parent() else {
                    return false;
                };
                let named = a
                    .file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with(NAMESPACE));
                let in_shm = || dir == Path::new("/dev/shm") || identity(dir) == shm;
                (named && shm.is_some() && in_shm()) || (own.is_some() && identity(a) == own)
            })
        })
}

/// This user's directory (whether it is there or not).
pub(crate) fn directory() -> PathBuf {
    directory_in(&base())
}

/// The shared memory of the shared extension whose file is `identity`, in this user's directory.
pub(crate) fn extension_memory_path(identity: super::FileIdentity) -> std::io::Result<PathBuf> {
    own_directory().map(|d| {
        d.join(format!(
            "extension-{}-{}.shared",
            identity.dev, identity.ino
        ))
    })
}
