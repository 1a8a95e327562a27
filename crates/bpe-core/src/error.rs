//! Errors of the core. Each names the problem; a failed call changes nothing.

use std::path::PathBuf;

/// Result alias of the core.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// I/O on a data file failed. This is a real error: the caller must see it.
    #[error("I/O error on {path}: {source}")]
    DataIo {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// SQL Server's error 868: the extension must be larger than the memory it extends.
    #[error(
        "error 868: buffer pool extension size ({size} bytes) must be larger than max server memory ({max_memory} bytes)"
    )]
    ExtensionNotLargerThanMemory { size: u64, max_memory: u64 },

    #[error(
        "buffer pool extension size {size} bytes is too small: it must be at least {minimum} bytes"
    )]
    ExtensionTooSmall { size: u64, minimum: u64 },

    #[error("buffer pool extension of {size} bytes needs {index_bytes} bytes of index memory, more than its budget of {budget} bytes (half of max server memory); raise max server memory or use a smaller extension")]
    IndexOverBudget {
        size: u64,
        index_bytes: u64,
        budget: u64,
    },

    #[error("buffer pool extension path {path:?} is invalid: {reason}")]
    BadExtensionPath { path: PathBuf, reason: String },

    /// No shared memory for a shared extension (a full /dev/shm, a directory that is not this
    /// user's): an extension shared by default falls back to a private one on it.
    #[error("buffer pool extension at {path:?} cannot be shared: {reason}")]
    SharedMemoryUnavailable { path: PathBuf, reason: String },

    /// Another process holds the shared extension's lock and does not let go (stopped by
    /// SIGSTOP, a debugger, a paused container): attaching is refused rather than waiting for
    /// it, and a private extension cannot take the file the others share.
    #[error(
        "buffer pool extension at {path:?} cannot be shared now: another process has held its \
         shared index's lock for over {waited_ms} ms (stopped by SIGSTOP or a debugger?); enable \
         it again once that process runs again or has exited"
    )]
    SharedLockHeld { path: PathBuf, waited_ms: u64 },

    /// The path is right, but what is there now cannot be used by this process: the code acts
    /// on `why` (a file that another process may be creating is tried again), never on words.
    #[error("buffer pool extension path {path:?} is invalid: {why}")]
    ExtensionRefused {
        path: PathBuf,
        why: ExtensionRefusal,
    },

    #[error("cannot create buffer pool extension file {path:?}: {source}")]
    ExtensionCreate {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error(
        "buffer pool extension is already enabled at {path:?}; turn it OFF first or resize it"
    )]
    ExtensionAlreadyEnabled { path: PathBuf },

    #[error(
        "buffer pool extension at {path:?} is enabled {enabled}; turn it OFF first to enable it {asked}"
    )]
    ExtensionSharingDiffers {
        path: PathBuf,
        enabled: &'static str,
        asked: &'static str,
    },

    #[error("buffer pool extension is not enabled")]
    ExtensionNotEnabled,

    #[error("max server memory {requested} bytes is below the minimum of {minimum} bytes")]
    MemoryBelowMinimum { requested: u64, minimum: u64 },

    #[error("max server memory {requested} bytes is above this machine's physical memory ({physical} bytes)")]
    MemoryAbovePhysical { requested: u64, physical: u64 },

    #[error("max server memory {requested} bytes would leave the extension index ({index_bytes} bytes) more than half of it; shrink or disable the extension first")]
    MemoryBelowIndex { requested: u64, index_bytes: u64 },

    #[error("page size {0} is not a power of two between 512 and 65536")]
    BadPageSize(usize),

    #[error("buffer of {got} bytes does not match the page size {page_size}")]
    BufferSize { got: usize, page_size: usize },

    #[error("cannot open data file {path:?}: {source}")]
    OpenData {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Why an extension file at a valid path cannot be used now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ExtensionRefusal {
    /// A file that is not a live extension is there (or one being created, not yet marked).
    #[error("a file already exists there; the extension never overwrites a file")]
    FileExists,
    /// Another process holds the extension for itself (a private extension, or one being laid
    /// out).
    #[error(
        "another process's buffer pool extension is using it for itself (SHARED = OFF or \
         BPE_EXTENSION_SHARED=0); leave sharing on, the default, in every process to share one"
    )]
    HeldForItself,
    /// Another process's private extension (found while taking a left-over file over).
    #[error("another process's buffer pool extension is using it")]
    InUse,
    /// Shared by other processes at another size.
    #[error(
        "the extension is shared at {0} bytes by other processes; detach them first to use \
         another size"
    )]
    SharedAtOtherSize(u64),
    /// Replaced again and again while this process opened it.
    #[error("it keeps changing while this process opens it")]
    KeepsChanging,
}

impl ExtensionRefusal {
    /// True when another process may be creating the file this moment: worth a retry.
    pub fn may_be_in_creation(self) -> bool {
        matches!(
            self,
            ExtensionRefusal::FileExists | ExtensionRefusal::HeldForItself
        )
    }
}
