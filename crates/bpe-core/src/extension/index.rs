//! The extension's in-RAM index: where each cached page sits in the ring, and what each region
//! of the ring holds.
//!
//! The ring is a sequence of regions (one write batch each, 512 KiB). A page takes exactly its
//! own size (any power of two from 512 B to 64 KiB), so databases of every page size share one
//! extension without waste. Each region lists its entries in write order; a page is found
//! through an open-addressing table of 4-byte entry handles (region, position).
//!
//! Memory per cached page: 16 B entry + 5.3 B of table at load factor <= 3/4 = 21.3 B (4 KiB
//! pages: 0.52 % of what they cache; compare ZFS L2ARC ~96 B per block, Oracle Smart Flash
//! Cache ~100 B, dm-cache smq ~25 B, CacheLib BlockCache ~12 B). The table grows only when
//! pages smaller than 4 KiB need more entries than it was sized for; the extension charges
//! every byte against max server memory (see `Extension::index_bytes`).

use crate::page::{FileKey, PageKey};

/// Bytes of one place in the ring's addressing unit.
pub const UNIT: usize = 512;
/// Entries a region can hold at most (a region of 512-byte pages).
pub const MAX_PER_REGION: usize = crate::config::EXTENSION_BATCH_BYTES / UNIT;

/// Where a cached page sits and how to check it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Location {
    /// Byte offset in the ring.
    pub offset: u64,
    pub len: usize,
    /// crc32c of the page's number and bytes.
    pub crc: u32,
    /// Taken over from a checkpoint: the ring may have moved on since it was written, so a
    /// mismatch is a plain miss, not a sign of a failing device.
    pub restored: bool,
}

/// One cached page: `#[repr(C)]` because a shared extension keeps entries in a mapping that
/// every participating process reads.
#[derive(Clone, Copy, Default)]
#[repr(C)]
pub struct Entry {
    /// 0 marks a dead entry (keys start at 1).
    file: FileKey,
    page: u32,
    crc: u32,
    /// Offset within the region, in UNITs.
    unit: u16,
    size_log2: u8,
    restored: bool,
}

const _: () = assert!(std::mem::size_of::<Entry>() <= 16);

pub struct ExtensionIndex {
    regions: Vec<Vec<Entry>>,
    region_bytes: u64,
    /// Handle + 1 of the entry for a page, or 0.
    buckets: Vec<u32>,
    len: usize,
    /// Bytes of the ring the cached pages take.
    live_bytes: u64,
}

pub(crate) fn handle(region: usize, pos: usize) -> u32 {
    (region * MAX_PER_REGION + pos) as u32
}

pub(crate) fn split(h: u32) -> (usize, usize) {
    (h as usize / MAX_PER_REGION, h as usize % MAX_PER_REGION)
}

/// Table size for `entries` at load factor <= 3/4.
pub(crate) fn buckets_for(entries: usize) -> usize {
    entries + entries / 3 + 1
}

impl ExtensionIndex {
    /// Bytes an index sized for `regions` regions of 4 KiB pages takes at first.
    pub fn bytes_for(regions: usize, region_bytes: u64) -> u64 {
        let per_region = (region_bytes / 4096) as usize;
        (buckets_for(regions * per_region) * 4
            + regions * (per_region * std::mem::size_of::<Entry>() + 24)) as u64
    }

    pub fn new(regions: usize, region_bytes: u64) -> Self {
        assert!(
            regions * MAX_PER_REGION < u32::MAX as usize,
            "ring too large"
        );
        let per_region = (region_bytes / 4096) as usize;
        ExtensionIndex {
            regions: (0..regions)
                .map(|_| Vec::with_capacity(per_region))
                .collect(),
            region_bytes,
            buckets: vec![0; buckets_for(regions * per_region)],
            len: 0,
            live_bytes: 0,
        }
    }

    /// Bytes allocated now.
    pub fn bytes(&self) -> u64 {
        (self.buckets.len() * 4
            + self
                .regions
                .iter()
                .map(|r| r.capacity() * std::mem::size_of::<Entry>() + 24)
                .sum::<usize>()) as u64
    }

    /// Bytes the index will take once [`ExtensionIndex::prepare`] made room for `more` entries
    /// in `region`.
    pub fn bytes_after_prepare(&self, region: usize, more: usize) -> u64 {
        let entry = std::mem::size_of::<Entry>();
        let r = &self.regions[region];
        let grow_region = (r.len() + more).saturating_sub(r.capacity()) * entry;
        let table = self.table_len_for(self.len + more) * 4;
        self.bytes() - self.buckets.len() as u64 * 4 + (table + grow_region) as u64
    }

    /// Bytes the index will take once [`ExtensionIndex::prepare_many`] made room for `count`
    /// more entries in each `(region, count)`.
    pub fn bytes_after_adding(&self, per_region: &[(usize, usize)]) -> u64 {
        let entry = std::mem::size_of::<Entry>();
        let more: usize = per_region.iter().map(|&(_, n)| n).sum();
        let grow: usize = per_region
            .iter()
            .map(|&(r, n)| {
                let r = &self.regions[r];
                (r.len() + n).saturating_sub(r.capacity()) * entry
            })
            .sum();
        let table = self.table_len_for(self.len + more) * 4;
        self.bytes() - self.buckets.len() as u64 * 4 + (table + grow) as u64
    }

    /// Makes room for what [`ExtensionIndex::bytes_after_adding`] was asked about.
    pub fn prepare_many(&mut self, per_region: &[(usize, usize)]) {
        let more: usize = per_region.iter().map(|&(_, n)| n).sum();
        let len = self.table_len_for(self.len + more);
        if len != self.buckets.len() {
            self.rehash(len);
        }
        for &(r, n) in per_region {
            self.regions[r].reserve_exact(n);
        }
    }

    fn table_len_for(&self, entries: usize) -> usize {
        if entries * 4 > self.buckets.len() * 3 {
            buckets_for(entries)
        } else {
            self.buckets.len()
        }
    }

    /// Makes room for `more` entries in `region` (what `bytes_after_prepare` said it would take).
    pub fn prepare(&mut self, region: usize, more: usize) {
        let len = self.table_len_for(self.len + more);
        if len != self.buckets.len() {
            self.rehash(len);
        }
        self.regions[region].reserve_exact(more);
    }

    /// Whether a page can be indexed at all (its number fits the 4-byte field).
    pub fn fits(key: PageKey) -> bool {
        fits(key)
    }

    /// Records that `key` now sits at byte `offset` of `region` (the region's entries are
    /// appended in write order), `restored` if taken over from a checkpoint (see
    /// [`Location::restored`]). An older copy of `key` elsewhere is dropped: one copy per page.
    pub fn insert(
        &mut self,
        key: PageKey,
        region: usize,
        offset: usize,
        len: usize,
        crc: u32,
        restored: bool,
    ) {
        self.grow_for_one();
        let placed = self.insert_entry(key, region, offset, len, crc, restored);
        assert!(placed, "region {region} is full");
    }

    /// Callers prepare first; this only keeps the table sound if one did not.
    fn grow_for_one(&mut self) {
        if (self.len + 1) * 4 > self.buckets.len() * 3 {
            self.rehash(buckets_for(self.len + 1));
        }
    }

    fn rehash(&mut self, len: usize) {
        let old = std::mem::replace(&mut self.buckets, vec![0; len]);
        for b in old.into_iter().filter(|&b| b != 0) {
            let mut i = self.home(self.key_of(b - 1));
            while self.buckets[i] != 0 {
                i = (i + 1) % len;
            }
            self.buckets[i] = b;
        }
    }

    /// Like `clear_region`, and gives the region's entry memory back (to make index room).
    pub fn release_region(&mut self, region: usize) -> usize {
        let n = self.clear_region(region);
        self.regions[region] = Vec::new();
        n
    }
}

impl IndexStore for ExtensionIndex {
    fn buckets(&self) -> &[u32] {
        &self.buckets
    }
    fn buckets_mut(&mut self) -> &mut [u32] {
        &mut self.buckets
    }
    fn region(&self, region: usize) -> &[Entry] {
        &self.regions[region]
    }
    fn region_mut(&mut self, region: usize) -> &mut [Entry] {
        &mut self.regions[region]
    }
    fn push(&mut self, region: usize, entry: Entry) -> bool {
        let r = &mut self.regions[region];
        if r.len() >= MAX_PER_REGION {
            return false;
        }
        r.push(entry);
        true
    }
    fn truncate(&mut self, region: usize) {
        self.regions[region].clear();
    }
    fn region_bytes(&self) -> u64 {
        self.region_bytes
    }
    fn len(&self) -> usize {
        self.len
    }
    fn live_bytes(&self) -> u64 {
        self.live_bytes
    }
    fn count(&mut self, entries: isize, bytes: i64) {
        self.len = self.len.wrapping_add_signed(entries);
        self.live_bytes = self.live_bytes.wrapping_add_signed(bytes);
    }
}

/// Whether a page can be indexed at all (its number fits the 4-byte field).
pub fn fits(key: PageKey) -> bool {
    key.file != 0 && key.page < u32::MAX as u64
}

/// Where the index's table and entries live: this process's RAM ([`ExtensionIndex`], which
/// grows) or a mapping shared by the processes of a shared extension (fixed in size). The
/// lookup, insertion and removal logic is written once, here, over either.
pub trait IndexStore {
    /// Handle + 1 of the entry for a page, or 0.
    fn buckets(&self) -> &[u32];
    fn buckets_mut(&mut self) -> &mut [u32];
    /// The entries of `region`, in write order.
    fn region(&self, region: usize) -> &[Entry];
    fn region_mut(&mut self, region: usize) -> &mut [Entry];
    /// Appends `entry` to `region`; false if the region lists all it can.
    fn push(&mut self, region: usize, entry: Entry) -> bool;
    /// Empties `region`'s list (its entries already removed from the table).
    fn truncate(&mut self, region: usize);
    fn region_bytes(&self) -> u64;
    /// Cached pages.
    fn len(&self) -> usize;
    /// Bytes of the ring the cached pages take.
    fn live_bytes(&self) -> u64;
    /// Adds to the two counts above.
    fn count(&mut self, entries: isize, bytes: i64);

    /// Whether `region` can list one more entry.
    fn has_room(&self, region: usize) -> bool {
        self.region(region).len() < MAX_PER_REGION
    }

    fn home(&self, key: PageKey) -> usize {
        let k = ((key.file as u64) << 32) | key.page;
        let h = k.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let h = h ^ (h >> 31);
        ((h as u128 * self.buckets().len() as u128) >> 64) as usize
    }

    fn entry(&self, h: u32) -> &Entry {
        let (r, p) = split(h);
        &self.region(r)[p]
    }

    fn key_of(&self, h: u32) -> PageKey {
        let e = self.entry(h);
        PageKey::new(e.file, e.page as u64)
    }

    /// (bucket position, handle) of a page.
    fn find(&self, key: PageKey) -> Option<(usize, u32)> {
        if !fits(key) {
            return None;
        }
        let buckets = self.buckets();
        let n = buckets.len();
        let mut i = self.home(key);
        loop {
            let b = buckets[i];
            if b == 0 {
                return None;
            }
            let e = self.entry(b - 1);
            if e.file == key.file && e.page as u64 == key.page {
                return Some((i, b - 1));
            }
            // A compare, not `% n`: a division per probe is most of a probe that hits in cache.
            i += 1;
            if i == n {
                i = 0;
            }
        }
    }

    fn location_of(&self, h: u32) -> Location {
        let (r, _) = split(h);
        let e = self.entry(h);
        Location {
            offset: r as u64 * self.region_bytes() + e.unit as u64 * UNIT as u64,
            len: 1 << e.size_log2,
            crc: e.crc,
            restored: e.restored,
        }
    }

    /// Where `key` is cached.
    fn lookup(&self, key: PageKey) -> Option<Location> {
        self.find(key).map(|(_, h)| self.location_of(h))
    }

    fn contains(&self, key: PageKey) -> bool {
        self.find(key).is_some()
    }

    /// Records that `key` sits at byte `offset` of `region`, dropping any older copy. False
    /// (and nothing changed but that drop) if the region or the table is full.
    fn insert_entry(
        &mut self,
        key: PageKey,
        region: usize,
        offset: usize,
        len: usize,
        crc: u32,
        restored: bool,
    ) -> bool {
        debug_assert!(fits(key));
        debug_assert!(len.is_power_of_two() && len >= UNIT && offset.is_multiple_of(UNIT));
        self.remove(key);
        // Open addressing needs a free bucket to end every probe: at most 3/4 full.
        if (self.len() + 1) * 4 > self.buckets().len() * 3 {
            return false;
        }
        let pos = self.region(region).len();
        let entry = Entry {
            file: key.file,
            page: key.page as u32,
            crc,
            unit: (offset / UNIT) as u16,
            size_log2: len.trailing_zeros() as u8,
            restored,
        };
        if !self.push(region, entry) {
            return false;
        }
        let mut i = self.home(key);
        let buckets = self.buckets_mut();
        let n = buckets.len();
        while buckets[i] != 0 {
            i = (i + 1) % n;
        }
        buckets[i] = handle(region, pos) + 1;
        self.count(1, len as i64);
        true
    }

    /// Forgets `key`; returns where it was.
    fn remove(&mut self, key: PageKey) -> Option<Location> {
        let (pos, h) = self.find(key)?;
        let loc = self.location_of(h);
        let (r, p) = split(h);
        self.region_mut(r)[p].file = 0;
        self.buckets_mut()[pos] = 0;
        self.count(-1, -(loc.len as i64));
        self.shift_back(pos);
        Some(loc)
    }

    /// Forgets every entry of `region` (about to be overwritten); returns how many were live.
    fn clear_region(&mut self, region: usize) -> usize {
        let live: Vec<PageKey> = self
            .region(region)
            .iter()
            .filter(|e| e.file != 0)
            .map(|e| PageKey::new(e.file, e.page as u64))
            .collect();
        for k in &live {
            self.remove(*k);
        }
        self.truncate(region);
        live.len()
    }

    /// Backward-shift deletion: pulls later entries of the probe run into the hole at `hole`.
    fn shift_back(&mut self, mut hole: usize) {
        let n = self.buckets().len();
        let mut j = (hole + 1) % n;
        while self.buckets()[j] != 0 {
            let home = self.home(self.key_of(self.buckets()[j] - 1));
            // Move j into the hole unless its home lies cyclically in (hole, j].
            let home_in_between = if hole <= j {
                hole < home && home <= j
            } else {
                hole < home || home <= j
            };
            if !home_in_between {
                let buckets = self.buckets_mut();
                buckets[hole] = buckets[j];
                buckets[j] = 0;
                hole = j;
            }
            j = (j + 1) % n;
        }
    }

    /// The cached pages of one region, with where they sit.
    fn region_entries(&self, region: usize) -> impl Iterator<Item = (PageKey, Location)> + '_ {
        self.region(region)
            .iter()
            .enumerate()
            .filter(|(_, e)| e.file != 0)
            .map(move |(pos, e)| {
                (
                    PageKey::new(e.file, e.page as u64),
                    self.location_of(handle(region, pos)),
                )
            })
    }

    /// Forgets every page matching `pred`, in `regions`; returns how many.
    fn remove_where_in(
        &mut self,
        regions: std::ops::Range<usize>,
        mut pred: impl FnMut(PageKey) -> bool,
    ) -> usize {
        let victims: Vec<PageKey> = regions
            .flat_map(|r| self.region(r).iter())
            .filter(|e| e.file != 0)
            .map(|e| PageKey::new(e.file, e.page as u64))
            .filter(|k| pred(*k))
            .collect();
        for k in &victims {
            self.remove(*k);
        }
        victims.len()
    }
}

impl ExtensionIndex {
    /// Every cached page with its region.
    pub fn entries(&self) -> impl Iterator<Item = (usize, PageKey)> + '_ {
        self.regions.iter().enumerate().flat_map(|(r, entries)| {
            entries
                .iter()
                .filter(|e| e.file != 0)
                .map(move |e| (r, PageKey::new(e.file, e.page as u64)))
        })
    }

    /// Forgets every page matching `pred`; returns how many.
    pub fn remove_where(&mut self, pred: impl FnMut(PageKey) -> bool) -> usize {
        self.remove_where_in(0..self.regions.len(), pred)
    }
}

/// The checksum of a cached copy of page number `page`: its number and its bytes. A read passes
/// only if it returns the bytes that were written for this entry (the ring may have put other
/// bytes there since): that is what makes a copy safe to serve, whoever's page it was, as the
/// index says which file's page the entry is and the file's key (or, after a restart, its stamp)
/// says the copy is current. The file is not in the checksum because its key lives only as long
/// as the process, while a checkpointed entry must verify in the next one.
pub fn page_crc(page: u64, bytes: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(&page.to_le_bytes()), bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    const REGION: u64 = crate::config::EXTENSION_BATCH_BYTES as u64;

    #[test]
    fn four_kib_pages_cost_under_22_bytes_each() {
        for regions in [2usize, 100, 8192] {
            let idx = ExtensionIndex::new(regions, REGION);
            assert_eq!(idx.bytes(), ExtensionIndex::bytes_for(regions, REGION));
            let pages = regions * (REGION as usize / 4096);
            let per_page = idx.bytes() as f64 / pages as f64;
            assert!(per_page < 22.0, "{per_page} bytes per 4 KiB page");
        }
    }

    #[test]
    fn the_checksum_covers_the_page_number_and_bytes() {
        let bytes = vec![7u8; 4096];
        let a = page_crc(5, &bytes);
        assert_ne!(a, page_crc(6, &bytes), "another page");
        let mut other = bytes.clone();
        other[4095] ^= 1;
        assert_ne!(a, page_crc(5, &other), "other bytes");
        assert_eq!(a, page_crc(5, &bytes));
    }

    #[test]
    fn small_pages_grow_the_table_and_mixed_sizes_share_a_region() {
        let mut idx = ExtensionIndex::new(2, REGION);
        let before = idx.bytes();
        let mut off = 0;
        for p in 0..1024u64 {
            idx.insert(PageKey::new(3, p), 0, off, 512, p as u32, false);
            off += 512;
        }
        assert_eq!(idx.len(), 1024);
        assert!(idx.bytes() > before, "the table grew for 512-byte pages");
        assert_eq!(
            idx.lookup(PageKey::new(3, 1000)),
            Some(Location {
                offset: 1000 * 512,
                len: 512,
                crc: 1000,
                restored: false,
            })
        );
        idx.insert(PageKey::new(4, 0), 1, 0, 65536, 9, false);
        idx.insert(PageKey::new(5, 0), 1, 65536, 4096, 10, false);
        assert_eq!(
            idx.lookup(PageKey::new(5, 0)).unwrap().offset,
            REGION + 65536
        );
        assert_eq!(idx.clear_region(0), 1024);
        assert_eq!(idx.len(), 2);
        assert!(idx.lookup(PageKey::new(3, 7)).is_none());
    }

    proptest! {
        /// The index agrees with a plain map through inserts, removals and region reuse.
        #[test]
        fn matches_a_map(ops in proptest::collection::vec((0u8..4, 1u32..4, 0u64..60, 0usize..3), 1..500)) {
            let mut idx = ExtensionIndex::new(3, REGION);
            let mut model: HashMap<PageKey, (usize, u32)> = HashMap::new();
            let mut fill = [0usize; 3];
            for (op, file, page, region) in ops {
                let key = PageKey::new(file, page);
                match op {
                    0 | 1 => {
                        if fill[region] + 4096 > REGION as usize {
                            idx.clear_region(region);
                            model.retain(|_, (r, _)| *r != region);
                            fill[region] = 0;
                        }
                        let crc = (page as u32) ^ file;
                        idx.insert(key, region, fill[region], 4096, crc, false);
                        model.insert(key, (region, crc));
                        fill[region] += 4096;
                    }
                    2 => {
                        prop_assert_eq!(idx.remove(key).map(|l| l.crc), model.remove(&key).map(|m| m.1));
                    }
                    _ => {
                        let n = idx.clear_region(region);
                        let before = model.len();
                        model.retain(|_, (r, _)| *r != region);
                        prop_assert_eq!(n, before - model.len());
                        fill[region] = 0;
                    }
                }
                prop_assert_eq!(idx.len(), model.len());
                for (k, (r, crc)) in &model {
                    let loc = idx.lookup(*k).expect("indexed");
                    prop_assert_eq!(loc.crc, *crc);
                    prop_assert_eq!(loc.offset / REGION, *r as u64);
                }
            }
        }
    }
}
