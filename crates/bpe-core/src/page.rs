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

/// Hashing for page tables: page keys come from our own files, not from an adversary, so a
/// multiply-xorshift mix (a few cycles) replaces SipHash (tens of cycles) on the hit path.
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
    fn write_u16(&mut self, n: u16) {
        self.0 = (self.0 ^ n as u64).rotate_left(48);
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
