//! Page identity.

/// The key under which one file's pages are cached. A file gets a new key whenever its cached
/// pages must be forgotten as a whole (another process changed it, its page size changed, it
/// was replaced): copies cached under the old key can then never be found again, whatever
/// thread still holds or installs them, and they leave both tiers as space is needed. Keys are
/// never reused while a copy cached under them could still be read: see `files.rs`.
pub type FileKey = u32;

/// A page: which file (by its current key), and its number in that file counted from 0
/// (byte offset / page size).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PageKey {
    pub file: FileKey,
    pub page: u64,
}

impl PageKey {
    pub fn new(file: FileKey, page: u64) -> Self {
        PageKey { file, page }
    }
}

/// A page's length and checksum (`page_crc` of its bytes), to compare a later read with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PageCheck {
    pub len: u32,
    pub crc: u32,
}

/// A data file as the shared extension's index names it now (see `extension/shared`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SharedFile {
    pub slot: u32,
    pub key: FileKey,
}

/// What a read from the data file (or L2) was made under: the page's shared name and write
/// epoch just before. A page is admitted to a shared extension only with it (a frame carries it
/// from the read to the eviction).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SharedRead {
    pub file: SharedFile,
    pub epoch: u64,
    /// The attachment it was made under (see `Attached::id`).
    pub attachment: u64,
}

/// Hashing for page tables (and the file registry's identities): page keys come from our own
/// files, not from an adversary, so a multiply-xorshift mix (a few cycles) replaces SipHash
/// (tens of cycles) on the hit path, and at each open and close of a file.
#[derive(Clone, Copy, Default)]
pub struct PageKeyHasher(u64);

impl std::hash::Hasher for PageKeyHasher {
    fn finish(&self) -> u64 {
        let h = self.0.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        h ^ (h >> 32)
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ b as u64).wrapping_mul(0x100_0000_01B3);
        }
    }
    fn write_u32(&mut self, n: u32) {
        self.0 = (self.0 ^ n as u64).rotate_left(40);
    }
    fn write_u64(&mut self, n: u64) {
        self.0 ^= n;
    }
}

pub type PageKeyHash = std::hash::BuildHasherDefault<PageKeyHasher>;

/// Where a read was served from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Tier {
    /// L1: the RAM buffer pool.
    Memory,
    /// L2: the buffer pool extension file.
    Extension,
    /// The data file itself.
    DataFile,
}
