//! Where L1's page bytes live: one region of address space, reserved once, handed out in page-size
//! slots. The region is cut into 64 KiB chunks (the largest page); a chunk serves one page size
//! at a time (512 B .. 64 KiB, so several databases with different page sizes share it) and goes
//! back to the common pool when its last slot is freed. At most `limit` chunks are in use, so the
//! bytes L1 can make resident are bounded by the memory setting whatever the thread count, and a
//! miss never calls malloc for its page (per-page mallocs from many threads left glibc's
//! per-thread arenas holding freed frames: resident memory grew with the thread count).
//!
//! Chunks above the limit (after max server memory shrank) are returned to the OS as soon as
//! they are empty; the lowest free chunk is always used first, so the touched part stays dense.

use crate::config::{MAX_PAGE_SIZE, MIN_PAGE_SIZE};
use crate::sync::{Mutex, Rank};
use std::collections::BTreeSet;
use std::ptr::NonNull;
use std::sync::Arc;

/// Bytes of one chunk: the largest page.
pub const CHUNK_BYTES: usize = MAX_PAGE_SIZE;
/// A transparent huge page on x86-64 and arm64 with 4 KiB base pages: the region's alignment.
const HUGE_PAGE_BYTES: usize = 2 << 20;
const CHUNKS_PER_HUGE_PAGE: u32 = (HUGE_PAGE_BYTES / CHUNK_BYTES) as u32;
/// Page size classes: 512 B << class, class 0..=7.
const CLASSES: usize = (MAX_PAGE_SIZE / MIN_PAGE_SIZE).trailing_zeros() as usize + 1;
const NO_CLASS: u8 = u8::MAX;

/// The reserved address range. Pages are touched (made resident) only as slots are written.
struct Region {
    base: NonNull<u8>,
    chunks: usize,
}

// SAFETY: the region is plain memory owned by the slab; which thread may touch which slot is
// decided under the slab's lock (a slot has one owner between alloc and free).
unsafe impl Send for Region {}
// SAFETY: as above.
unsafe impl Sync for Region {}

impl Region {
    /// Reserves `chunks` chunks of address space (no memory is committed until touched),
    /// starting on a huge-page boundary, so that every 32 chunks make one huge page.
    fn reserve(chunks: usize) -> Option<Region> {
        let len = chunks.checked_mul(CHUNK_BYTES)?;
        // MAP_NORESERVE: the memory bound is ours to keep, not the kernel's swap's.
        let base = crate::io::aligned::map_aligned(len, HUGE_PAGE_BYTES, libc::MAP_NORESERVE)?;
        // Left out of core dumps: the range is tens of GB of address space (cached copies of
        // database pages, which a dump does not need), and writing it page by page made a
        // crashing process take a second or more to dump. A kernel that refuses the advice
        // only dumps more.
        // SAFETY: the range is the mapping just made; madvise only changes its dump flag.
        unsafe { libc::madvise(base.as_ptr().cast(), len, libc::MADV_DONTDUMP) };
        Some(Region { base, chunks })
    }

    /// Asks the kernel to back chunks `first..first + CHUNKS_PER_HUGE_PAGE` with one huge page
    /// (`MADV_COLLAPSE`: synchronous, so it runs on the collapser thread, never on a query's).
    /// Contents do not change. True when it is done or cannot be done (no huge page free, THP
    /// `never`: 4 KiB pages stay); false when it should be tried again, which the kernel says
    /// (`EAGAIN`) of pages faulted in so recently that they are not on its LRU lists yet.
    #[cfg(not(feature = "shuttle"))]
    fn collapse(&self, first: u32) -> bool {
        // SAFETY: the range lies inside the mapping (the caller checked first + 32 <= chunks)
        // and is huge-page aligned (the base is); MADV_COLLAPSE never changes what it holds.
        let rc = unsafe {
            libc::madvise(
                self.base.as_ptr().add(first as usize * CHUNK_BYTES).cast(),
                HUGE_PAGE_BYTES,
                libc::MADV_COLLAPSE,
            )
        };
        rc == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::EAGAIN)
    }

    /// Returns chunk `chunk`'s memory to the OS; the next touch reads zeros.
    fn release(&self, chunk: u32) {
        // SAFETY: the chunk lies inside the mapping, and the caller holds no slot in it (it is
        // free), so no live reference into it exists.
        unsafe {
            libc::madvise(
                self.base.as_ptr().add(chunk as usize * CHUNK_BYTES).cast(),
                CHUNK_BYTES,
                libc::MADV_DONTNEED,
            );
        }
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: the mapping made in reserve(), with its length; every slot holds an Arc to the
        // slab, so none outlives it.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.chunks * CHUNK_BYTES) };
    }
}

#[derive(Clone, Copy)]
struct Chunk {
    class: u8,
    live: u16,
    /// Bit i set: slot i is free (only the first CHUNK_BYTES / page size bits are used).
    free: u128,
}

struct State {
    /// Chunks that may be in use at once (from the memory setting).
    limit: u32,
    /// One entry per chunk ever handed out (the region's touched prefix).
    chunks: Vec<Chunk>,
    /// Free chunks below `chunks.len()`, lowest first.
    free_chunks: BTreeSet<u32>,
    /// Per class, chunks with at least one free slot, lowest first.
    partial: [BTreeSet<u32>; CLASSES],
    live_chunks: u32,
    live_bytes: u64,
}

pub struct SlabInner {
    region: Region,
    state: Mutex<State>,
    /// The process that made the slab. A forked child inherits the parent's pools but not its
    /// threads: a slab lock held by one of them at the fork is never released in the child.
    owner_pid: u32,
    /// Collapse each 2 MiB of chunks into a huge page once all of them were handed out.
    large_pages: bool,
}

/// The L1 page slab, shared by every frame (each slot keeps it alive).
#[derive(Clone)]
pub struct Slab(Arc<SlabInner>);

/// One page's bytes in the slab, freed when dropped.
pub struct Slot {
    slab: Arc<SlabInner>,
    chunk: u32,
    index: u8,
    class: u8,
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: a slot is the only handle to its bytes (see Slab::alloc), like a Box<[u8]>.
unsafe impl Send for Slot {}
// SAFETY: shared references only give out &[u8].
unsafe impl Sync for Slot {}

fn class_of(page_size: usize) -> u8 {
    debug_assert!(
        page_size.is_power_of_two() && (MIN_PAGE_SIZE..=MAX_PAGE_SIZE).contains(&page_size)
    );
    (page_size / MIN_PAGE_SIZE).trailing_zeros() as u8
}

fn slots_per_chunk(class: u8) -> usize {
    CHUNK_BYTES / (MIN_PAGE_SIZE << class)
}

/// Chunks needed to hold `bytes`.
pub fn chunks_for(bytes: u64) -> u32 {
    bytes.div_ceil(CHUNK_BYTES as u64).min(u32::MAX as u64) as u32
}

impl Slab {
    /// A slab that can grow to `reserve_bytes` and may use `limit_bytes` now, on huge pages if
    /// `large_pages` (see [`collapse_in_background`]). If the address space cannot be reserved,
    /// retries with `limit_bytes` (growth past it then caches nothing more, and says so).
    pub fn new(reserve_bytes: u64, limit_bytes: u64, large_pages: bool) -> Slab {
        let want = chunks_for(reserve_bytes.max(limit_bytes)) as usize;
        let region = Region::reserve(want)
            .or_else(|| {
                log::warn!(
                    "could not reserve {} MiB of address space for the buffer pool; reserving \
                     {} MiB",
                    (want * CHUNK_BYTES) >> 20,
                    limit_bytes >> 20
                );
                Region::reserve(chunks_for(limit_bytes).max(1) as usize)
            })
            .expect("reserve address space for the buffer pool");
        let limit = chunks_for(limit_bytes).min(region.chunks as u32);
        Slab(Arc::new(SlabInner {
            region,
            owner_pid: crate::io::pid::current(),
            large_pages,
            state: Mutex::new(
                Rank::Slab,
                State {
                    limit,
                    chunks: Vec::new(),
                    free_chunks: BTreeSet::new(),
                    partial: Default::default(),
                    live_chunks: 0,
                    live_bytes: 0,
                },
            ),
        }))
    }

    /// Changes how many bytes of chunks may be in use. Shrinking returns the free chunks above
    /// the new limit to the OS at once, and the others as soon as their last slot is freed.
    pub fn set_limit(&self, bytes: u64) {
        let inner = &self.0;
        let mut s = inner.state.lock();
        s.limit = chunks_for(bytes).min(inner.region.chunks as u32);
        let above: Vec<u32> = s.free_chunks.range(s.limit..).copied().collect();
        drop(s);
        for chunk in above {
            inner.region.release(chunk);
        }
    }

    /// A slot of `page_size` bytes (contents unspecified), or None when the limit is reached
    /// and no chunk of this page size has a free slot.
    pub fn alloc(&self, page_size: usize) -> Option<Slot> {
        let inner = &self.0;
        let class = class_of(page_size);
        let mut completes_huge_page = None;
        let mut s = inner.state.lock();
        let chunk = match s.partial[class as usize].first().copied() {
            Some(c) => c,
            None => {
                if s.live_chunks >= s.limit {
                    return None;
                }
                let c = match s.free_chunks.first().copied().filter(|&c| c < s.limit) {
                    Some(c) => {
                        s.free_chunks.remove(&c);
                        c
                    }
                    None if (s.chunks.len() as u32) < s.limit => {
                        s.chunks.push(Chunk {
                            class: NO_CLASS,
                            live: 0,
                            free: 0,
                        });
                        let c = s.chunks.len() as u32 - 1;
                        if inner.large_pages && (c + 1).is_multiple_of(CHUNKS_PER_HUGE_PAGE) {
                            completes_huge_page = Some(c + 1 - CHUNKS_PER_HUGE_PAGE);
                        }
                        c
                    }
                    None => return None,
                };
                let n = slots_per_chunk(class);
                s.chunks[c as usize] = Chunk {
                    class,
                    live: 0,
                    free: if n == 128 {
                        u128::MAX
                    } else {
                        (1u128 << n) - 1
                    },
                };
                s.live_chunks += 1;
                s.partial[class as usize].insert(c);
                c
            }
        };
        let meta = &mut s.chunks[chunk as usize];
        let index = meta.free.trailing_zeros() as u8;
        meta.free &= !(1u128 << index);
        meta.live += 1;
        if meta.free == 0 {
            s.partial[class as usize].remove(&chunk);
        }
        s.live_bytes += page_size as u64;
        drop(s);
        if let Some(first) = completes_huge_page {
            collapse_in_background(inner, first);
        }
        let offset = chunk as usize * CHUNK_BYTES + index as usize * page_size;
        // SAFETY: offset + page_size lies inside the region (chunk < region.chunks, the slot
        // inside its chunk).
        let ptr = unsafe { NonNull::new_unchecked(inner.region.base.as_ptr().add(offset)) };
        Some(Slot {
            slab: inner.clone(),
            chunk,
            index,
            class,
            ptr,
            len: page_size,
        })
    }

    /// Bytes of slots in use.
    pub fn live_bytes(&self) -> u64 {
        self.0.state.lock().live_bytes
    }

    #[cfg(any(test, feature = "testing"))]
    /// Bytes of chunks in use (what L1's pages keep resident, whole chunks counted).
    pub fn live_chunk_bytes(&self) -> u64 {
        self.0.state.lock().live_chunks as u64 * CHUNK_BYTES as u64
    }

    #[cfg(any(test, feature = "testing"))]
    /// Bytes of chunks that may be in use.
    pub fn limit_bytes(&self) -> u64 {
        self.0.state.lock().limit as u64 * CHUNK_BYTES as u64
    }
}

/// Hands 2 MiB of chunks, all handed out at least once, to the collapser thread (one per
/// process, started at the first request), which makes them one huge page once L1 stops
/// growing (see [`run_collapser`]). Why not `MADV_HUGEPAGE` on the region: its faults would
/// allocate, zero and (with the kernel's usual `defrag = madvise`) compact for 2 MiB on the
/// query's thread, which made speedtest1's insert-heavy tests noticeably slower. The hits gain
/// either way: a copy out of a huge page rarely misses the TLB.
/// Resident memory does not grow: every chunk of the range is below the limit (a shrink may
/// since have returned some, which the collapse brings back as zeros: at most 2 MiB).
fn collapse_in_background(slab: &Arc<SlabInner>, first: u32) {
    #[cfg(not(feature = "shuttle"))]
    {
        use std::sync::mpsc::{channel, Sender};
        type Request = (std::sync::Weak<SlabInner>, u32);
        /// The thread's sender, with the process it runs in: a forked child inherits the
        /// sender but not the thread, and starts its own.
        static COLLAPSER: std::sync::Mutex<Option<(u32, Sender<Request>)>> =
            std::sync::Mutex::new(None);
        let pid = crate::io::pid::current();
        if pid != slab.owner_pid {
            return;
        }
        // try_lock: a child forked while another thread held the lock would wait forever. A
        // range skipped (the lock busy) keeps its 4 KiB pages: slower hits, nothing else.
        let Ok(mut collapser) = COLLAPSER.try_lock() else {
            return;
        };
        if collapser.as_ref().is_none_or(|(owner, _)| *owner != pid) {
            let (tx, rx) = channel::<Request>();
            let started = std::thread::Builder::new()
                .name("bpe-huge-pages".into())
                .spawn(move || run_collapser(rx));
            if started.is_err() {
                return;
            }
            *collapser = Some((pid, tx));
        }
        if let Some((_, tx)) = collapser.as_ref() {
            let _ = tx.send((Arc::downgrade(slab), first));
        }
    }
    #[cfg(feature = "shuttle")]
    let _ = (slab, first); // Shuttle's threads cannot block on a real channel
}

/// The collapser thread. A collapse takes the process's memory-map lock and locks the pages of
/// its range while it copies them: done while L1 grows (a table being filled, an index being
/// built), it slowed speedtest1's insert tests. So the ranges wait until L1 has
/// stopped growing for a second (`QUIET`: no new range), or for at most 30 s (`LONGEST_WAIT`,
/// also while it keeps growing); then each is collapsed, and tried again 50 ms later while the
/// kernel finds its pages too fresh (`EAGAIN`), at most 20 times. Ranges are held weakly: a
/// pool dropped meanwhile is unmapped at once. Ends when the sender is gone.
#[cfg(not(feature = "shuttle"))]
fn run_collapser(rx: std::sync::mpsc::Receiver<(std::sync::Weak<SlabInner>, u32)>) {
    use std::sync::mpsc::RecvTimeoutError;
    use std::time::{Duration, Instant};
    const QUIET: Duration = Duration::from_secs(1);
    const LONGEST_WAIT: Duration = Duration::from_secs(30);
    const RETRY: Duration = Duration::from_millis(50);
    const TRIES: u32 = 20;
    struct Waiting {
        // Weak: a pool dropped meanwhile is unmapped at once, not kept for its collapse.
        slab: std::sync::Weak<SlabInner>,
        first: u32,
        tries: u32,
        came: Instant,
        due: Instant,
    }
    let mut waiting: Vec<Waiting> = Vec::new();
    loop {
        let next = match waiting.iter().map(|w| w.due).min() {
            None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
            Some(due) => rx.recv_timeout(due.saturating_duration_since(Instant::now())),
        };
        let now = Instant::now();
        match next {
            Ok((slab, first)) => {
                // L1 grew: everything waits for the next quiet second (or its longest wait).
                for w in waiting.iter_mut().filter(|w| w.tries == 0) {
                    w.due = (now + QUIET).min(w.came + LONGEST_WAIT);
                }
                waiting.push(Waiting {
                    slab,
                    first,
                    tries: 0,
                    came: now,
                    due: now + QUIET,
                });
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return,
        }
        waiting.retain_mut(|w| {
            if w.due > now {
                return true;
            }
            w.tries += 1;
            w.due = now + RETRY;
            // Gone (its pool was dropped), done, refused for good, or out of tries: forgotten.
            w.slab
                .upgrade()
                .is_some_and(|slab| !slab.region.collapse(w.first) && w.tries < TRIES)
        });
    }
}

impl SlabInner {
    fn free(&self, chunk: u32, index: u8, class: u8) {
        let mut s = self.state.lock();
        let limit = s.limit;
        let meta = &mut s.chunks[chunk as usize];
        debug_assert_eq!(meta.class, class);
        debug_assert_eq!(meta.free & (1u128 << index), 0, "slot freed twice");
        let was_full = meta.free == 0;
        meta.free |= 1u128 << index;
        meta.live -= 1;
        let empty = meta.live == 0;
        s.live_bytes -= (MIN_PAGE_SIZE << class) as u64;
        if empty {
            s.chunks[chunk as usize].class = NO_CLASS;
            s.partial[class as usize].remove(&chunk);
            s.live_chunks -= 1;
            s.free_chunks.insert(chunk);
        } else if was_full {
            s.partial[class as usize].insert(chunk);
        }
        drop(s);
        if empty && chunk >= limit {
            self.region.release(chunk);
        }
    }
}

impl Slot {
    /// Fills the slot; it is then read-only (frames never change).
    pub fn filled(mut self, data: &[u8]) -> Slot {
        self.as_mut().copy_from_slice(data);
        self
    }

    /// The slot's bytes, to be written before it is installed (a frame's bytes never change
    /// after that: a frame holds its slot behind a shared reference only).
    pub(super) fn as_mut(&mut self) -> &mut [u8] {
        // SAFETY: the slot's bytes lie in the region (see alloc) and belong to this slot alone
        // until it is dropped; &mut self excludes other references through it.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl std::ops::Deref for Slot {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: as in as_mut; only shared references exist while &self does. Never-written
        // bytes of an anonymous mapping read as zeros, so they are initialized.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

/// Where a slot's bytes are, kept beside the slot's owner so that a reader can reach the bytes
/// without first reading the owner (see `BufferPool::copy_if_resident`).
#[derive(Clone, Copy)]
pub struct SlotAddress {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: an address only; reading through it is `unsafe` and carries its own obligation.
unsafe impl Send for SlotAddress {}
// SAFETY: as above.
unsafe impl Sync for SlotAddress {}

impl Slot {
    pub fn address(&self) -> SlotAddress {
        SlotAddress {
            ptr: self.ptr,
            len: self.len,
        }
    }
}

impl SlotAddress {
    /// The slot's bytes.
    ///
    /// # Safety
    /// The slot this address was taken from must stay alive, and nothing may write it, for `'a`.
    pub unsafe fn bytes<'a>(&self) -> &'a [u8] {
        // SAFETY: the caller keeps the slot alive and unwritten; its bytes lie in the region
        // (see alloc) and are initialized (see Deref).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        // In a forked child the slot is left as it is (the child's copy of the parent's memory,
        // never reused): freeing it would take a lock a parent thread may have held at the fork.
        if crate::io::pid::current() != self.slab.owner_pid {
            return;
        }
        self.slab.free(self.chunk, self.index, self.class);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The VmFlags line of the mapping that starts at `base` in /proc/self/smaps.
    fn vm_flags_of_mapping_at(base: usize) -> String {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let mut in_mapping = false;
        for line in smaps.lines() {
            if let Some((range, _)) = line.split_once(' ') {
                if let Some((start, _)) = range.split_once('-') {
                    if let Ok(start) = usize::from_str_radix(start, 16) {
                        if !line.starts_with("VmFlags") {
                            in_mapping = start == base;
                            continue;
                        }
                    }
                }
            }
            if in_mapping {
                if let Some(flags) = line.strip_prefix("VmFlags:") {
                    return flags.to_string();
                }
            }
        }
        panic!("no mapping at {base:#x} in /proc/self/smaps")
    }

    /// A crash must not dump the reserved range: the kernel marks it `dd` (do not dump).
    #[test]
    fn the_reserved_range_is_left_out_of_core_dumps() {
        let slab = Slab::new(1 << 30, 1 << 20, false);
        let slot = slab.alloc(4096).unwrap();
        let base = slab.0.region.base.as_ptr() as usize;
        let flags = vm_flags_of_mapping_at(base);
        assert!(
            flags.split_whitespace().any(|f| f == "dd"),
            "VmFlags of the reserved range:{flags}"
        );
        drop(slot);
    }

    #[test]
    fn slots_of_one_size_fill_chunks_before_taking_new_ones() {
        let slab = Slab::new(1 << 20, 1 << 20, false);
        let slots: Vec<Slot> = (0..32).map(|_| slab.alloc(4096).unwrap()).collect();
        assert_eq!(slab.live_chunk_bytes(), 2 * CHUNK_BYTES as u64);
        assert_eq!(slab.live_bytes(), 32 * 4096);
        drop(slots);
        assert_eq!(slab.live_chunk_bytes(), 0);
        assert_eq!(slab.live_bytes(), 0);
    }

    #[test]
    fn the_limit_refuses_slots_beyond_it_and_a_freed_chunk_serves_another_size() {
        let slab = Slab::new(1 << 20, 2 * CHUNK_BYTES as u64, false);
        let big: Vec<Slot> = (0..2).map(|_| slab.alloc(65536).unwrap()).collect();
        assert!(slab.alloc(512).is_none(), "both chunks are taken");
        drop(big);
        let small = slab.alloc(512).unwrap();
        assert_eq!(slab.live_chunk_bytes(), CHUNK_BYTES as u64);
        drop(small);
    }

    #[test]
    fn slots_keep_their_bytes_and_never_overlap() {
        let slab = Slab::new(1 << 20, 1 << 20, false);
        let slots: Vec<Slot> = (0..40u8)
            .map(|i| {
                slab.alloc(1024 << (i % 3))
                    .unwrap()
                    .filled(&vec![i; 1024 << (i % 3)])
            })
            .collect();
        for (i, s) in slots.iter().enumerate() {
            assert!(s.iter().all(|&b| b == i as u8), "slot {i} was overwritten");
        }
    }

    #[test]
    fn shrinking_keeps_live_slots_and_refuses_new_chunks_until_they_go() {
        let slab = Slab::new(1 << 20, 4 * CHUNK_BYTES as u64, false);
        let slots: Vec<Slot> = (0..4)
            .map(|i| slab.alloc(65536).unwrap().filled(&[i; 65536]))
            .collect();
        slab.set_limit(CHUNK_BYTES as u64);
        assert!(slab.alloc(65536).is_none());
        assert!(
            slots[3].iter().all(|&b| b == 3),
            "live slots survive a shrink"
        );
        drop(slots);
        assert!(slab.alloc(65536).is_some());
    }
}
