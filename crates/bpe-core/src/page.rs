//! Page identity.

/// A data file registered with the engine. Small so that the extension index stays compact.
pub type FileId = u16;

/// A page: which file, and its number in that file counted from 0 (byte offset / page size).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PageKey {
    pub file: FileId,
    pub page: u64,
}

impl PageKey {
    pub fn new(file: FileId, page: u64) -> Self {
        PageKey { file, page }
    }
}

/// Where a read was served from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tier {
    /// L1: the RAM buffer pool.
    Memory,
    /// L2: the buffer pool extension file.
    Extension,
    /// The data file itself.
    DataFile,
}
