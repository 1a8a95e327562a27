//! What a shared extension's memory holds, where, and the view of it that its lock gives.
//!
//! ```text
//!   header    magic (set last by the creator), geometry, the file's id, the robust mutex
//!   totals    entry and byte counts, the ring's head, the key counter, recoveries   [locked]
//!   participants[64]   pid of each attached process                                  [locked]
//!   files[1024]        (dev, ino) -> current key and the stamp that vouches for it   [locked]
//!   regions[R]         state, owner, epoch, entry count                              [locked]
//!   stripes[S]         write epochs, read without the lock                           [atomic]
//!   pending[S]         invalidations not yet applied under the lock                  [atomic]
//!   buckets[B]         the page table (see index.rs)                                 [locked]
//!   entries[R x 1024]  each region's entries in write order                          [locked]
//! ```
//!
//! Nothing in it is a pointer: every process maps it at its own address. The locked parts are
//! touched only by the holder of the mutex, through [`Tables`]; the stripes are atomics.

use crate::extension::index::{buckets_for, Entry, IndexStore, MAX_PER_REGION};
use crate::io::shared_memory::RobustMutex;
use std::sync::atomic::AtomicU64;

/// The layout's version and kind; a segment with another value is not ours or not this build's.
pub const MAGIC: u64 = u64::from_le_bytes(*b"BPESHX05");

/// Bytes of the extension file's path kept in the header (PATH_MAX).
pub const PATH_BYTES: usize = 4096;
pub const MAX_PARTICIPANTS: usize = 64;
pub const MAX_FILES: usize = 1024;
/// Write-epoch stripes: twice the ring's 4 KiB pages, a power of two within these bounds. A
/// page's admission is refused when any page of its stripe was written since the page was
/// read, and a clean page may stay in L1 for many seconds before it is offered. With a fixed
/// 2^14 stripes, a write-heavy OLTP run moved each stripe far more often than its pages left
/// L1, and few of the pages leaving L1 reached a large extension; with 2^20, nearly all did
/// (docs/BENCHMARKS.md has the run). Each stripe costs 16 bytes of shared memory
/// (its epoch and its pending count): 32 bytes per 4 KiB of ring (0.8 %), at most 16 MiB.
pub const MIN_STRIPES: u64 = 1 << 14;
pub const MAX_STRIPES: u64 = 1 << 20;

/// Sizes of the parts that depend on the extension's size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
pub struct Geometry {
    pub regions: u64,
    pub region_bytes: u64,
    /// Table size: sized for pages of 2 KiB on average (4 KiB pages fill it to 3/8; pages of
    /// 512 B fill it before the ring, and what does not fit is not admitted).
    pub buckets: u64,
    /// Write-epoch stripes, a power of two (see [`MIN_STRIPES`]).
    pub stripes: u64,
}

impl Geometry {
    pub fn new(regions: usize, region_bytes: u64) -> Geometry {
        Geometry {
            regions: regions as u64,
            region_bytes,
            buckets: buckets_for(regions * (region_bytes / 2048) as usize) as u64,
            stripes: (regions as u64 * (region_bytes / 4096) * 2)
                .next_power_of_two()
                .clamp(MIN_STRIPES, MAX_STRIPES),
        }
    }
}

#[repr(C)]
pub struct Header {
    pub magic: AtomicU64,
    pub geometry: Geometry,
    /// Random, drawn by the creator and written on the extension file too (an extended
    /// attribute): a segment is that file's only, never another's that got its inode number.
    pub file_id: u64,
    pub mutex: RobustMutex,
    /// The extension file's path when the segment was laid out: a segment whose file is gone
    /// (removed by hand, a temporary directory cleaned) is swept by the next process to attach
    /// any shared extension (`remove_orphaned_memory`).
    pub path_len: u64,
    pub path: [u8; PATH_BYTES],
}

#[repr(C)]
pub struct Totals {
    pub len: u64,
    pub live_bytes: u64,
    /// The region the next claim starts looking at.
    pub ring_head: u64,
    /// The key the next file binding gets (keys are never reused while the segment lives).
    pub next_key: u64,
    /// Times a participant died holding the lock and the index was emptied.
    pub recoveries: u64,
}

#[repr(C)]
pub struct Participant {
    pub pid: u32,
    pub attached: u32,
}

#[repr(C)]
pub struct FileSlot {
    pub dev: u64,
    pub ino: u64,
    /// 0: the slot is free.
    pub key: u32,
    /// 1 when `stamp` vouches for the key's entries: every change to the file up to that stamp
    /// was made by a participant that invalidated what it wrote.
    pub vouched: u32,
    pub size: u64,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
}

pub const FREE: u32 = 0;
pub const FILLING: u32 = 1;
pub const FULL: u32 = 2;

#[repr(C)]
pub struct RegionSlot {
    /// FREE, FILLING (by `owner`) or FULL.
    pub state: u32,
    /// The participant slot that wrote (or is writing) the region.
    pub owner: u32,
    pub owner_pid: u32,
    /// Entries listed (see `Tables::region`).
    pub entries: u32,
    /// Bumped at every claim and recovery: a claim made before is void.
    pub epoch: u64,
}

/// Byte offsets of the parts, from a geometry.
#[derive(Clone, Copy, Debug)]
pub struct Layout {
    pub geometry: Geometry,
    totals: usize,
    participants: usize,
    files: usize,
    regions: usize,
    pub stripes: usize,
    pub pending: usize,
    buckets: usize,
    entries: usize,
    pub len: usize,
}

fn place<T>(at: &mut usize, count: usize) -> usize {
    let start = at.next_multiple_of(64);
    *at = start + count * std::mem::size_of::<T>();
    start
}

impl Layout {
    pub fn new(geometry: Geometry) -> Layout {
        let regions = geometry.regions as usize;
        let mut at = std::mem::size_of::<Header>();
        let totals = place::<Totals>(&mut at, 1);
        let participants = place::<Participant>(&mut at, MAX_PARTICIPANTS);
        let files = place::<FileSlot>(&mut at, MAX_FILES);
        let region_slots = place::<RegionSlot>(&mut at, regions);
        let stripes = place::<AtomicU64>(&mut at, geometry.stripes as usize);
        let pending = place::<AtomicU64>(&mut at, geometry.stripes as usize);
        let buckets = place::<u32>(&mut at, geometry.buckets as usize);
        let entries = place::<Entry>(&mut at, regions * MAX_PER_REGION);
        Layout {
            geometry,
            totals,
            participants,
            files,
            regions: region_slots,
            stripes,
            pending,
            buckets,
            entries,
            len: at.next_multiple_of(4096),
        }
    }
}

/// The locked parts of a segment, borrowed by the lock's holder.
pub struct Tables<'a> {
    pub totals: &'a mut Totals,
    pub participants: &'a mut [Participant],
    pub files: &'a mut [FileSlot],
    pub regions: &'a mut [RegionSlot],
    buckets: &'a mut [u32],
    entries: &'a mut [Entry],
    region_bytes: u64,
}

impl<'a> Tables<'a> {
    /// The locked parts of the segment at `base`.
    ///
    /// # Safety
    /// `base` is a live mapping of `layout.len` bytes laid out by `layout`, and the caller holds
    /// its mutex for `'a` (so no other thread of any process touches these parts meanwhile), and
    /// makes no other `Tables` of it for as long.
    pub unsafe fn of(base: *mut u8, layout: &Layout) -> Tables<'a> {
        let g = layout.geometry;
        let slice = |off: usize, n: usize| (base.add(off), n);
        let (p, n) = slice(layout.participants, MAX_PARTICIPANTS);
        let participants = std::slice::from_raw_parts_mut(p as *mut Participant, n);
        let (p, n) = slice(layout.files, MAX_FILES);
        let files = std::slice::from_raw_parts_mut(p as *mut FileSlot, n);
        let (p, n) = slice(layout.regions, g.regions as usize);
        let regions = std::slice::from_raw_parts_mut(p as *mut RegionSlot, n);
        let (p, n) = slice(layout.buckets, g.buckets as usize);
        let buckets = std::slice::from_raw_parts_mut(p as *mut u32, n);
        let (p, n) = slice(layout.entries, g.regions as usize * MAX_PER_REGION);
        let entries = std::slice::from_raw_parts_mut(p as *mut Entry, n);
        Tables {
            totals: &mut *(base.add(layout.totals) as *mut Totals),
            participants,
            files,
            regions,
            buckets,
            entries,
            region_bytes: g.region_bytes,
        }
    }

    /// Empties the index: every region free with a new epoch (voiding claims in flight), no
    /// entry, no bucket. The file bindings stay (their keys are names, not state).
    pub fn clear_index(&mut self) {
        self.buckets.fill(0);
        for r in self.regions.iter_mut() {
            r.state = FREE;
            r.entries = 0;
            r.epoch += 1;
        }
        self.totals.len = 0;
        self.totals.live_bytes = 0;
    }

    /// After a holder of the lock died (or panicked) mid-change, any table may be half changed:
    /// a file slot too (a new file's identity with the old one's key, say), which no check can
    /// tell. So the index is emptied and every file's key voided: keys are never reused, so no
    /// name handed out before is found again (a lookup under one is told the key moved, a
    /// binding follows only to a slot that holds its file, an admission under one is refused),
    /// and every file is bound afresh, in full.
    pub fn recover(&mut self) {
        self.clear_index();
        for f in self.files.iter_mut() {
            f.key = 0;
            f.vouched = 0;
        }
    }

    #[cfg(any(test, feature = "testing"))]
    /// The index is sound: every bucket leads to a live entry its probe finds, and the counts
    /// add up (tests and the crash tests' survivors).
    pub fn check(&self) -> Result<(), String> {
        let mut live = 0;
        let mut bytes = 0;
        for r in 0..self.regions.len() {
            for (key, loc) in self.region_entries(r) {
                live += 1;
                bytes += loc.len as u64;
                if self.lookup(key) != Some(loc) {
                    return Err(format!(
                        "entry {key:?} in region {r} is not found by its probe"
                    ));
                }
            }
        }
        let used = self.buckets.iter().filter(|&&b| b != 0).count();
        if (live, bytes, used) != (self.totals.len as usize, self.totals.live_bytes, live) {
            return Err(format!(
                "{live} live entries of {bytes} bytes, {used} buckets used; totals say {} of {}",
                self.totals.len, self.totals.live_bytes
            ));
        }
        Ok(())
    }
}

impl IndexStore for Tables<'_> {
    fn buckets(&self) -> &[u32] {
        self.buckets
    }
    fn buckets_mut(&mut self) -> &mut [u32] {
        super::stored();
        self.buckets
    }
    fn region(&self, region: usize) -> &[Entry] {
        let n = self.regions[region].entries as usize;
        &self.entries[region * MAX_PER_REGION..][..n]
    }
    fn region_mut(&mut self, region: usize) -> &mut [Entry] {
        super::stored();
        let n = self.regions[region].entries as usize;
        &mut self.entries[region * MAX_PER_REGION..][..n]
    }
    fn push(&mut self, region: usize, entry: Entry) -> bool {
        let n = self.regions[region].entries as usize;
        if n >= MAX_PER_REGION {
            return false;
        }
        self.entries[region * MAX_PER_REGION + n] = entry;
        super::stored();
        self.regions[region].entries += 1;
        super::stored();
        true
    }
    fn truncate(&mut self, region: usize) {
        self.regions[region].entries = 0;
        super::stored();
    }
    fn region_bytes(&self) -> u64 {
        self.region_bytes
    }
    fn len(&self) -> usize {
        self.totals.len as usize
    }
    fn live_bytes(&self) -> u64 {
        self.totals.live_bytes
    }
    fn count(&mut self, entries: isize, bytes: i64) {
        self.totals.len = self.totals.len.wrapping_add_signed(entries as i64);
        super::stored();
        self.totals.live_bytes = self.totals.live_bytes.wrapping_add_signed(bytes);
        super::stored();
    }
}
