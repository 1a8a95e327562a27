//! The extension's in-RAM index: which page each slot holds, and where each cached page is.
//!
//! Budget: at most 16 bytes per slot, allocated once when the extension is enabled and never
//! grown (compare ZFS L2ARC ~96 B per block, Oracle Smart Flash Cache ~100 B, dm-cache smq ~25 B,
//! CacheLib BlockCache ~12 B). Layout, per slot:
//!   file id  2 B  (0 = empty slot)
//!   page no  4 B  (SQLite pages are numbered below 2^32)
//!   crc32c   4 B  (of the page bytes, checked on every read)
//!   bucket   4 B x 4/3 (open addressing, linear probing, load factor <= 3/4, slot+1 or 0)
//! = 15.33 B per slot. Deletion shifts entries back instead of leaving tombstones, so lookups stay
//! short however long the extension runs.

use crate::page::{FileId, PageKey};

pub struct ExtensionIndex {
    slot_file: Vec<FileId>,
    slot_page: Vec<u32>,
    slot_crc: Vec<u32>,
    buckets: Vec<u32>,
    len: usize,
}

/// Bytes of index per slot at most (the hard cap the design promises).
pub const INDEX_BYTES_PER_SLOT_CAP: f64 = 16.0;

fn bucket_count(slots: usize) -> usize {
    slots + slots / 3 + 1
}

impl ExtensionIndex {
    /// Bytes an index for `slots` slots takes, before allocating it.
    pub fn bytes_for(slots: usize) -> u64 {
        (slots * (2 + 4 + 4) + bucket_count(slots) * 4) as u64
    }

    pub fn new(slots: usize) -> Self {
        ExtensionIndex {
            slot_file: vec![0; slots],
            slot_page: vec![0; slots],
            slot_crc: vec![0; slots],
            buckets: vec![0; bucket_count(slots)],
            len: 0,
        }
    }

    /// Bytes actually allocated.
    pub fn bytes(&self) -> u64 {
        (self.slot_file.capacity() * 2
            + self.slot_page.capacity() * 4
            + self.slot_crc.capacity() * 4
            + self.buckets.capacity() * 4) as u64
    }

    pub fn slots(&self) -> usize {
        self.slot_file.len()
    }

    /// Cached pages.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether a page can be indexed at all (its number fits the 4-byte field).
    pub fn fits(key: PageKey) -> bool {
        key.file != 0 && key.page < u32::MAX as u64
    }

    fn home(&self, key: PageKey) -> usize {
        let k = ((key.file as u64) << 32) | key.page;
        let h = k.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let h = h ^ (h >> 31);
        ((h as u128 * self.buckets.len() as u128) >> 64) as usize
    }

    fn key_of(&self, slot: usize) -> PageKey {
        PageKey::new(self.slot_file[slot], self.slot_page[slot] as u64)
    }

    /// (bucket position, slot) of a page.
    fn find(&self, key: PageKey) -> Option<(usize, usize)> {
        if !Self::fits(key) {
            return None;
        }
        let n = self.buckets.len();
        let mut i = self.home(key);
        loop {
            let b = self.buckets[i];
            if b == 0 {
                return None;
            }
            let slot = (b - 1) as usize;
            if self.slot_file[slot] == key.file && self.slot_page[slot] as u64 == key.page {
                return Some((i, slot));
            }
            i = (i + 1) % n;
        }
    }

    /// The slot holding `key` and its checksum.
    pub fn lookup(&self, key: PageKey) -> Option<(u32, u32)> {
        self.find(key)
            .map(|(_, slot)| (slot as u32, self.slot_crc[slot]))
    }

    pub fn contains(&self, key: PageKey) -> bool {
        self.find(key).is_some()
    }

    /// Records that `slot` now holds `key`. The slot must be empty; an older copy of `key`
    /// elsewhere is dropped (one copy per page).
    pub fn insert(&mut self, key: PageKey, slot: u32, crc: u32) {
        debug_assert!(Self::fits(key));
        let slot = slot as usize;
        assert_eq!(self.slot_file[slot], 0, "slot {slot} is occupied");
        self.remove(key);
        self.slot_file[slot] = key.file;
        self.slot_page[slot] = key.page as u32;
        self.slot_crc[slot] = crc;
        let n = self.buckets.len();
        let mut i = self.home(key);
        while self.buckets[i] != 0 {
            i = (i + 1) % n;
        }
        self.buckets[i] = slot as u32 + 1;
        self.len += 1;
    }

    /// Forgets `key`; returns the slot it was in.
    pub fn remove(&mut self, key: PageKey) -> Option<u32> {
        let (pos, slot) = self.find(key)?;
        self.slot_file[slot] = 0;
        self.buckets[pos] = 0;
        self.len -= 1;
        self.shift_back(pos);
        Some(slot as u32)
    }

    /// Forgets whatever `slot` holds; returns that page.
    pub fn clear_slot(&mut self, slot: u32) -> Option<PageKey> {
        let slot = slot as usize;
        if self.slot_file[slot] == 0 {
            return None;
        }
        let key = self.key_of(slot);
        self.remove(key);
        Some(key)
    }

    /// Backward-shift deletion: pulls later entries of the probe run into the hole at `hole`.
    fn shift_back(&mut self, mut hole: usize) {
        let n = self.buckets.len();
        let mut j = (hole + 1) % n;
        while self.buckets[j] != 0 {
            let home = self.home(self.key_of((self.buckets[j] - 1) as usize));
            // Move j into the hole unless its home lies cyclically in (hole, j].
            let home_in_between = if hole <= j {
                hole < home && home <= j
            } else {
                hole < home || home <= j
            };
            if !home_in_between {
                self.buckets[hole] = self.buckets[j];
                self.buckets[j] = 0;
                hole = j;
            }
            j = (j + 1) % n;
        }
    }

    /// Every occupied slot with its page.
    pub fn entries(&self) -> impl Iterator<Item = (u32, PageKey)> + '_ {
        (0..self.slots())
            .filter(|&s| self.slot_file[s] != 0)
            .map(|s| (s as u32, self.key_of(s)))
    }

    /// Forgets every page matching `pred`; returns how many.
    pub fn remove_where(&mut self, mut pred: impl FnMut(PageKey) -> bool) -> usize {
        let victims: Vec<PageKey> = self
            .entries()
            .map(|(_, k)| k)
            .filter(|k| pred(*k))
            .collect();
        for k in &victims {
            self.remove(*k);
        }
        victims.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    #[test]
    fn stays_under_sixteen_bytes_per_slot() {
        for slots in [256usize, 1000, 1 << 20] {
            let per_slot = ExtensionIndex::bytes_for(slots) as f64 / slots as f64;
            assert!(
                per_slot <= INDEX_BYTES_PER_SLOT_CAP,
                "{per_slot} B per slot"
            );
            assert_eq!(
                ExtensionIndex::new(slots).bytes(),
                ExtensionIndex::bytes_for(slots)
            );
        }
    }

    proptest! {
        /// The index agrees with a plain map through inserts, removals and slot reuse.
        #[test]
        fn matches_a_map(ops in proptest::collection::vec((0u8..3, 1u16..4, 0u64..40, 0u32..64), 1..400)) {
            let mut idx = ExtensionIndex::new(64);
            let mut model: HashMap<PageKey, u32> = HashMap::new();
            for (op, file, page, slot) in ops {
                let key = PageKey::new(file, page);
                match op {
                    0 => {
                        if let Some(k) = idx.clear_slot(slot) { model.remove(&k); }
                        idx.insert(key, slot, slot ^ 7);
                        model.insert(key, slot);
                    }
                    1 => { prop_assert_eq!(idx.remove(key), model.remove(&key)); }
                    _ => {
                        let got = idx.clear_slot(slot);
                        let want = model.iter().find(|(_, s)| **s == slot).map(|(k, _)| *k);
                        if let Some(k) = want { model.remove(&k); }
                        prop_assert_eq!(got, want);
                    }
                }
                prop_assert_eq!(idx.len(), model.len());
                for (k, s) in &model {
                    prop_assert_eq!(idx.lookup(*k), Some((*s, *s ^ 7)));
                }
            }
        }
    }
}
