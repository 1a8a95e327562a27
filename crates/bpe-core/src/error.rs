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
