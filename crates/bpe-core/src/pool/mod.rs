//! L1: the RAM buffer pool, one per engine, shared by every file.
//!
//! The page table is split into shards, each behind its own lock, so a hit takes one shard's read
//! lock and never a global one. Misses and evictions go through the replacer's lock; they are
//! about to do I/O anyway. The memory bound is enforced in [`BufferPool::make_room`] and nowhere else.
//!
//! Write-behind: a write may install its page *dirty* ([`BufferPool::reserve_dirty`]), its bytes
//! not yet in the data file; the writer writes it back later ([`BufferPool::mark_clean`] once
//! the file has it). A dirty frame is L1's only copy of those bytes, so it never leaves L1 but by
//! a newer write of the page or a truncation: the replacer passes it over, dropping clean
//! buffers keeps it, and the extension never sees it (it is offered only when evicted). Dirty
//! frames take at most 1/[`WRITE_BEHIND_SHARE`] of the target.

mod frame;
mod pending;
mod replacer;
mod slab;

pub use frame::{Frame, NewFrame};
pub use pending::Pending;
#[cfg(any(test, feature = "testing"))]
pub use slab::CHUNK_BYTES;
pub use slab::{Slab, Slot, SlotAddress};

use crate::config::{physical_memory, L1_SLAB_SLACK, SLOT_EVICTIONS, WRITE_BEHIND_SHARE};
use crate::page::{FileKey, PageKey, PageKeyHash};
use crate::sync::{Mutex, Rank, RwLock};
use crossbeam_utils::CachePadded;
use replacer::{Replacer, Standing};
use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;

const SHARDS: usize = 64;

#[derive(Default)]
struct Shard {
    frames: HashMap<PageKey, Resident, PageKeyHash>,
    pending: HashMap<PageKey, Arc<Pending>, PageKeyHash>,
}

/// A page table entry: the frame, and where its bytes are. A hit copies the bytes straight from
/// the entry's address: reaching them through the frame would first read the frame's header,
/// a second DRAM miss that the copy waits for (the page table's bucket is the first).
struct Resident {
    frame: Arc<Frame>,
    bytes: SlotAddress,
}

impl Resident {
    fn new(frame: Arc<Frame>) -> Resident {
        let bytes = frame.data.address();
        Resident { frame, bytes }
    }
}

impl std::ops::Deref for Resident {
    type Target = Arc<Frame>;
    fn deref(&self) -> &Arc<Frame> {
        &self.frame
    }
}

/// Receives frames leaving L1, and frames just read from the data file, while the frame's shard
/// is still locked so that no write to the page can start until the sink has done its
/// bookkeeping (this is what keeps L2 free of stale pages).
pub trait EvictionSink {
    fn evicted(&self, frame: &Arc<Frame>);
    /// A page read from the data file was installed: what L1 now holds is the file's content.
    fn loaded_from_disk(&self, _frame: &Arc<Frame>) {}
}

/// Where the bytes of a finished load came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LoadSource {
    DataFile,
    Extension,
}

/// The outcome of looking a page up.
pub enum Lookup {
    Hit(Arc<Frame>),
    /// Another thread is reading or writing this page: wait for it, then look again.
    Wait(Arc<Pending>),
    /// The caller must fetch the page and hand it to [`BufferPool::finish_load`] or `abort`.
    Load(Ticket),
}

/// A slot reserved for one load, for its I/O to read the page straight into (no copy from a
/// buffer of its own): charged against the target like a resident frame, but in no page table,
/// so nothing can see its bytes until [`BufferPool::finish_load_in`] installs it, and only if
/// the load's ticket is still valid then. Dropped unused (the read failed, the page was past
/// end of file, the bytes are not to be cached), it gives its memory back.
pub struct LoadSlot<'a> {
    pool: &'a BufferPool,
    /// Taken by `finish_load_in`; a drop with it still here returns the charge.
    slot: Option<Slot>,
    charge: u64,
}

impl LoadSlot<'_> {
    /// The slot's bytes, for the read. On a page size of at least `DIRECT_IO_ALIGN` they are
    /// aligned for O_DIRECT (a slot lies at a multiple of its page size, see `slab.rs`).
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        self.slot
            .as_mut()
            .expect("present until installed")
            .as_mut()
    }

    /// What was read into the slot.
    pub fn bytes(&self) -> &[u8] {
        self.slot.as_ref().expect("present until installed")
    }
}

impl Drop for LoadSlot<'_> {
    fn drop(&mut self) {
        if self.slot.take().is_some() {
            self.pool.used.fetch_sub(self.charge, Relaxed);
        }
    }
}

/// The right to install one page: held by the thread doing its I/O.
pub struct Ticket {
    pub key: PageKey,
    pending: Arc<Pending>,
    /// For a write that replaced a resident frame: where that frame stood. The new frame
    /// keeps it (see [`Replacer::push_rewritten`]).
    rewrites: Option<Standing>,
}

pub struct BufferPool {
    /// Each shard on cache lines of its own: a hit's read lock writes the lock's word, and two
    /// shards sharing a line would make threads hitting different shards take that line from
    /// each other's core (false sharing), a shared lock in all but name.
    shards: Vec<CachePadded<RwLock<Shard>>>,
    replacer: Mutex<Replacer>,
    /// Bytes charged by resident frames.
    used: AtomicU64,
    /// What L1 may use: max server memory less the extension index.
    target: AtomicU64,
    live_frames: AtomicUsize,
    /// Bytes charged by dirty frames (part of `used`).
    dirty_bytes: AtomicU64,
    /// Where the frames' bytes live: at most the target plus [`L1_SLAB_SLACK`] of it in use.
    slab: Slab,
}

impl BufferPool {
    /// A pool that may use `target_bytes`, its page bytes on huge pages if `large_pages`.
    pub fn new(target_bytes: u64, large_pages: bool) -> Self {
        // Address space for the largest max server memory accepted (the machine's memory), so
        // that raising it online never moves a frame.
        let reserve = physical_memory().unwrap_or(0).max(target_bytes) + L1_SLAB_SLACK;
        BufferPool {
            slab: Slab::new(reserve, target_bytes + L1_SLAB_SLACK, large_pages),
            shards: (0..SHARDS)
                .map(|_| CachePadded::new(RwLock::new(Rank::Shard, Shard::default())))
                .collect(),
            replacer: Mutex::new(Rank::Replacer, Replacer::default()),
            used: AtomicU64::new(0),
            target: AtomicU64::new(target_bytes),
            live_frames: AtomicUsize::new(0),
            dirty_bytes: AtomicU64::new(0),
        }
    }

    fn shard(&self, key: &PageKey) -> &RwLock<Shard> {
        &self.shards[shard_of(key)]
    }

    /// The hit path: one shard read lock. On a miss, registers the caller as the page's loader.
    pub fn lookup(&self, key: PageKey) -> Lookup {
        if let Some(r) = self.shard(&key).read().frames.get(&key) {
            return Lookup::Hit(r.frame.clone());
        }
        let mut shard = self.shard(&key).write();
        if let Some(r) = shard.frames.get(&key) {
            return Lookup::Hit(r.frame.clone());
        }
        if let Some(p) = shard.pending.get(&key) {
            return Lookup::Wait(p.clone());
        }
        let pending = Arc::new(Pending::new(false));
        shard.pending.insert(key, pending.clone());
        Lookup::Load(Ticket {
            key,
            pending,
            rewrites: None,
        })
    }

    /// A hit's fast path: copies the page into `buf` and records the access, if L1 holds it
    /// with `buf`'s length. No reference to the frame is taken: the copy is made under the
    /// shard's read lock, which keeps the frame in the table. False otherwise (the caller then
    /// goes through [`BufferPool::lookup`]).
    pub fn copy_if_resident(&self, key: PageKey, buf: &mut [u8], now_ms: u64) -> bool {
        let shard = self.shard(&key).read();
        let Some(r) = shard.frames.get(&key) else {
            return false;
        };
        // SAFETY: the entry's frame owns the slot, and the entry cannot leave the table (that
        // takes the shard's write lock) while `shard` is held, which outlives `bytes`. A frame's
        // bytes are written once, before it is installed, and never again.
        let bytes = unsafe { r.bytes.bytes() };
        if bytes.len() != buf.len() {
            return false;
        }
        buf.copy_from_slice(bytes);
        r.frame.touch(now_ms);
        true
    }

    /// Whether the page is resident (no access is recorded: for checkpoints).
    pub fn contains(&self, key: PageKey) -> bool {
        self.shard(&key).read().frames.contains_key(&key)
    }

    /// The page's frame if resident, no access recorded (for checkpoints).
    pub fn peek(&self, key: PageKey) -> Option<Arc<Frame>> {
        self.shard(&key)
            .read()
            .frames
            .get(&key)
            .map(|r| r.frame.clone())
    }

    /// A loader ticket for readahead: only for pages neither cached nor in flight.
    pub fn try_prefetch(&self, key: PageKey) -> Option<Ticket> {
        let mut shard = self.shard(&key).write();
        if shard.frames.contains_key(&key) || shard.pending.contains_key(&key) {
            return None;
        }
        let pending = Arc::new(Pending::new(false));
        shard.pending.insert(key, pending.clone());
        Some(Ticket {
            key,
            pending,
            rewrites: None,
        })
    }

    /// Installs a loaded page unless a write to it started meanwhile (or memory is full of
    /// installs in flight: then it is served, not cached). Returns false when a write started:
    /// the caller's bytes may predate it and must be read again.
    pub fn finish_load(
        &self,
        ticket: Ticket,
        frame: NewFrame<'_>,
        source: LoadSource,
        sink: &dyn EvictionSink,
    ) -> bool {
        let frame = NewFrame {
            from_extension: source == LoadSource::Extension,
            ..frame
        };
        let frame = self.build(frame, sink);
        self.release(&ticket, frame, Some(source), sink)
    }

    /// Room for a page of `page_size` that is about to be loaded, taken before its read so that
    /// the read lands in the slot it will be installed in (see [`LoadSlot`]). None when L1 has
    /// no room: the caller reads into its own buffer and `finish_load` decides again.
    pub fn reserve_load(&self, page_size: usize, sink: &dyn EvictionSink) -> Option<LoadSlot<'_>> {
        let charge = page_size as u64 + crate::config::L1_FRAME_OVERHEAD;
        let slot = self.make_room(Some((charge, page_size)), sink)?;
        Some(LoadSlot {
            pool: self,
            slot: Some(slot),
            charge,
        })
    }

    /// Installs a page read into `slot` unless a write to it started meanwhile: the same check,
    /// under the same lock, as [`BufferPool::finish_load`] (and false in the same case). The
    /// caller has checked the bytes (an extension copy against its checksum) before calling;
    /// `frame.data` is not looked at. An invalidated load frees the slot and its charge.
    pub fn finish_load_in(
        &self,
        ticket: Ticket,
        mut slot: LoadSlot<'_>,
        frame: NewFrame<'_>,
        source: LoadSource,
        sink: &dyn EvictionSink,
    ) -> bool {
        debug_assert!(std::ptr::eq(slot.pool, self), "a slot of another pool");
        let bytes = slot.slot.take().expect("present until installed");
        let frame = NewFrame {
            from_extension: source == LoadSource::Extension,
            ..frame
        };
        let frame = Arc::new(Frame::holding(frame, bytes));
        debug_assert_eq!(frame.charge(), slot.charge);
        self.release(&ticket, Some(frame), Some(source), sink)
    }

    /// Ends a load whose bytes are served but not cached. Returns false when a write started
    /// meanwhile, as [`BufferPool::finish_load`] does.
    pub fn finish_uncached(&self, ticket: Ticket, sink: &dyn EvictionSink) -> bool {
        self.release(&ticket, None, None, sink)
    }

    /// Gives up a load (the I/O failed): nothing is cached, waiters retry.
    pub fn abort(&self, ticket: Ticket) {
        let mut shard = self.shard(&ticket.key).write();
        remove_if_same(&mut shard.pending, &ticket.key, &ticket.pending);
        drop(shard);
        ticket.pending.complete();
    }

    /// Starts a write: drops the cached copy, invalidates loads in flight and makes new readers
    /// wait until [`BufferPool::finish_write`]. Waits for an earlier write to the same page.
    pub fn begin_write(&self, key: PageKey) -> Ticket {
        loop {
            let mut shard = self.shard(&key).write();
            if let Some(p) = shard.pending.get(&key) {
                if p.is_write {
                    let p = p.clone();
                    drop(shard);
                    p.wait();
                    continue;
                }
                // The loader finishes its I/O but will not install it (see finish_load).
                p.invalidate();
            }
            let rewrites = shard.frames.remove(&key).map(|old| {
                self.forget(&old);
                Standing {
                    freq: old.freq.load(Relaxed),
                    in_main: old.in_main.load(Relaxed),
                }
            });
            let pending = Arc::new(Pending::new(true));
            shard.pending.insert(key, pending.clone());
            return Ticket {
                key,
                pending,
                rewrites,
            };
        }
    }

    /// Ends a write: installs the new clean copy (if given) and wakes readers.
    pub fn finish_write(
        &self,
        ticket: Ticket,
        frame: Option<NewFrame<'_>>,
        sink: &dyn EvictionSink,
    ) {
        let frame = frame.and_then(|f| self.build(f, sink));
        self.release(&ticket, frame, None, sink);
    }

    /// Room for a dirty frame of `charge` bytes and `page_size`, taken before its write starts
    /// so that the frame is sure to be installed (its bytes are then nowhere else). None when
    /// dirty frames already take their share of the target, or L1 has no room: the caller then
    /// writes the page through.
    pub fn reserve_dirty(
        &self,
        charge: u64,
        page_size: usize,
        sink: &dyn EvictionSink,
    ) -> Option<Slot> {
        let share = self.target.load(Relaxed) / WRITE_BEHIND_SHARE;
        if self.dirty_bytes.load(Relaxed) + charge > share {
            return None;
        }
        self.make_room(Some((charge, page_size)), sink)
    }

    /// Ends a write by installing its page dirty in the slot [`BufferPool::reserve_dirty`] gave.
    pub fn finish_write_dirty(
        &self,
        ticket: Ticket,
        frame: NewFrame<'_>,
        slot: Slot,
        sink: &dyn EvictionSink,
    ) {
        debug_assert!(
            frame.dirty,
            "a frame installed through write-behind is dirty"
        );
        let frame = Arc::new(Frame::install(frame, slot));
        // A write's ticket is never invalidated (only loads are), so this installs it.
        let installed = self.release(&ticket, Some(frame), None, sink);
        debug_assert!(installed);
    }

    /// The page's bytes are in the data file now: the frame may leave L1 like any other.
    pub fn mark_clean(&self, frame: &Frame) {
        if frame.take_dirty() {
            self.dirty_bytes.fetch_sub(frame.charge(), Relaxed);
        }
    }

    /// Drops the page's frame if it is dirty: its write to the data file failed, so the file is
    /// what the page is now, as after a failed write through.
    pub fn discard_dirty(&self, key: PageKey) {
        let mut shard = self.shard(&key).write();
        if shard.frames.get(&key).is_some_and(|f| f.is_dirty()) {
            if let Some(old) = shard.frames.remove(&key) {
                self.forget(&old);
            }
        }
    }

    /// Bytes charged by dirty frames.
    pub fn dirty_bytes(&self) -> u64 {
        self.dirty_bytes.load(Relaxed)
    }

    /// The frame of `f`, its bytes copied into a slot reserved for it; None if it cannot fit
    /// (the page is then served but not cached).
    fn build(&self, f: NewFrame<'_>, sink: &dyn EvictionSink) -> Option<Arc<Frame>> {
        let slot = self.make_room(Some((f.charge(), f.data.len())), sink)?;
        Some(Arc::new(Frame::install(f, slot)))
    }

    /// Ends a ticket, installing `frame` unless the ticket was invalidated.
    /// Returns false when the ticket was invalidated: the caller's bytes may predate a write.
    fn release(
        &self,
        ticket: &Ticket,
        frame: Option<Arc<Frame>>,
        loaded_from: Option<LoadSource>,
        sink: &dyn EvictionSink,
    ) -> bool {
        let mut shard = self.shard(&ticket.key).write();
        remove_if_same(&mut shard.pending, &ticket.key, &ticket.pending);
        // Checked under the shard lock, the same lock begin_write invalidates under: a write that
        // started after this point will find the frame and replace it; one that started before
        // has invalidated the ticket. Checking earlier would let a stale load overwrite a write.
        let invalidated = ticket.pending.is_invalidated();
        let frame = match frame {
            Some(f) if invalidated => {
                self.used.fetch_sub(f.charge(), Relaxed);
                None
            }
            other => other,
        };
        if let Some(f) = &frame {
            self.live_frames.fetch_add(1, Relaxed);
            if f.is_dirty() {
                self.dirty_bytes.fetch_add(f.charge(), Relaxed);
            }
            if let Some(old) = shard.frames.insert(ticket.key, Resident::new(f.clone())) {
                self.forget(&old);
            }
            if loaded_from == Some(LoadSource::DataFile) {
                sink.loaded_from_disk(f);
            }
        }
        drop(shard);
        ticket.pending.complete();
        if let Some(f) = frame {
            let mut r = self.replacer.lock();
            match ticket.rewrites {
                Some(old) => r.push_rewritten(&f, old),
                None => r.push(&f),
            }
            r.compact_if_sparse(self.live_frames.load(Relaxed));
            drop(r);
            // The target may have shrunk while this frame's bytes were reserved.
            if self.used.load(Relaxed) > self.target.load(Relaxed) {
                self.make_room(None, sink);
            }
        }
        !invalidated
    }

    /// Evicts until the target holds what is used (and `incoming`'s bytes, if given), and
    /// reserves them with a slot of its page size. This is the memory bound's one place: bytes
    /// are charged here, under the replacer lock, before any frame is installed, so concurrent
    /// installs cannot overshoot; and the slot comes from the slab, whose limit bounds what the
    /// frames keep resident. None if they cannot fit: every evictable frame is gone and the rest
    /// is reserved by installs in flight, or evicting [`SLOT_EVICTIONS`] more frames freed no
    /// slot (frames that left L1 still hold theirs: staged for the extension, or being copied
    /// by a reader). The caller then does not cache the page.
    fn make_room(&self, incoming: Option<(u64, usize)>, sink: &dyn EvictionSink) -> Option<Slot> {
        let (bytes, page_size) = incoming.unwrap_or((0, 0));
        let mut replacer = self.replacer.lock();
        let mut slot_evictions = 0;
        loop {
            let target = self.target.load(Relaxed);
            if self.used.load(Relaxed) + bytes <= target {
                // Only room was asked for (a shrink), and there is.
                incoming?;
                if let Some(slot) = self.slab.alloc(page_size) {
                    self.used.fetch_add(bytes, Relaxed);
                    return Some(slot);
                }
                if slot_evictions == SLOT_EVICTIONS {
                    return None;
                }
                slot_evictions += 1;
            }
            let live = self.live_frames.load(Relaxed);
            let victim = replacer.pick_victim(target, live)?;
            let mut shard = self.shard(&victim.key).write();
            if shard
                .frames
                .get(&victim.key)
                .is_some_and(|f| Arc::ptr_eq(f, &victim))
            {
                shard.frames.remove(&victim.key);
                self.forget(&victim);
                sink.evicted(&victim);
            }
        }
    }

    /// Accounting for a frame leaving the page table (the caller holds its shard lock).
    fn forget(&self, frame: &Frame) {
        frame.set_evicted();
        self.mark_clean(frame);
        self.used.fetch_sub(frame.charge(), Relaxed);
        self.live_frames.fetch_sub(1, Relaxed);
    }

    /// Changes the memory target; shrinking evicts at once.
    pub fn set_target(&self, bytes: u64, sink: &dyn EvictionSink) {
        self.target.store(bytes, Relaxed);
        self.make_room(None, sink);
        self.slab.set_limit(bytes + L1_SLAB_SLACK);
    }

    /// Drops every clean cached page of `file` (or of every file), without offering them to L2.
    /// Dirty pages stay: they are not in the data file yet.
    pub fn invalidate(&self, file: Option<FileKey>) {
        for shard in &self.shards {
            let mut shard = shard.write();
            let keys: Vec<PageKey> = shard
                .frames
                .iter()
                .filter(|(k, f)| file.is_none_or(|f| k.file == f) && !f.is_dirty())
                .map(|(k, _)| *k)
                .collect();
            for k in keys {
                if let Some(old) = shard.frames.remove(&k) {
                    self.forget(&old);
                }
            }
            for (k, p) in shard.pending.iter() {
                if !p.is_write && file.is_none_or(|f| k.file == f) {
                    p.invalidate();
                }
            }
        }
        let mut r = self.replacer.lock();
        if file.is_none() {
            r.clear();
        } else {
            r.compact_if_sparse(self.live_frames.load(Relaxed));
        }
    }

    /// Forgets one page: its frame, and any load of it in flight (which then installs nothing).
    /// For pages another process changed; a write of ours in flight, or not yet written back
    /// (dirty), is left alone: no other process writes a page while ours is dirty (the writer
    /// holds the file's write lock until it wrote its pages back).
    pub fn forget_page(&self, key: PageKey) {
        let mut shard = self.shard(&key).write();
        if let Some(p) = shard.pending.get(&key) {
            if !p.is_write {
                p.invalidate();
            }
        }
        if shard.frames.get(&key).is_some_and(|f| !f.is_dirty()) {
            if let Some(old) = shard.frames.remove(&key) {
                self.forget(&old);
            }
        }
    }

    /// Drops cached pages of `file` at or beyond `first_page` (after a truncate).
    pub fn invalidate_from(&self, file: FileKey, first_page: u64) {
        for shard in &self.shards {
            let mut shard = shard.write();
            let keys: Vec<PageKey> = shard
                .frames
                .keys()
                .filter(|k| k.file == file && k.page >= first_page)
                .copied()
                .collect();
            for k in keys {
                if let Some(old) = shard.frames.remove(&k) {
                    self.forget(&old);
                }
            }
        }
    }

    pub fn used_bytes(&self) -> u64 {
        self.used.load(Relaxed)
    }

    pub fn target_bytes(&self) -> u64 {
        self.target.load(Relaxed)
    }

    pub fn resident_pages(&self) -> usize {
        self.live_frames.load(Relaxed)
    }

    /// Every resident frame (for buffer descriptors).
    pub fn frames(&self) -> Vec<Arc<Frame>> {
        let mut out = Vec::with_capacity(self.resident_pages());
        for shard in &self.shards {
            out.extend(shard.read().frames.values().map(|r| r.frame.clone()));
        }
        out
    }

    #[cfg(any(test, feature = "testing"))]
    /// The slab the frames' bytes live in.
    pub fn slab(&self) -> &Slab {
        &self.slab
    }

    /// Checks the memory invariant and the page table against the accounting (tests).
    pub fn check_invariants(&self) {
        let frames = self.frames();
        let charged: u64 = frames.iter().map(|f| f.charge()).sum();
        let data: u64 = frames.iter().map(|f| f.data.len() as u64).sum();
        assert!(
            self.slab.live_bytes() >= data,
            "L1 frames hold {data} bytes, the slab only {} in use",
            self.slab.live_bytes()
        );
        assert_eq!(charged, self.used_bytes(), "L1 accounting drifted");
        let dirty: u64 = frames
            .iter()
            .filter(|f| f.is_dirty())
            .map(|f| f.charge())
            .sum();
        assert_eq!(dirty, self.dirty_bytes(), "dirty accounting drifted");
        // Over the target only after it shrank below the dirty frames, which cannot leave before
        // their writer writes them back: then every clean frame has gone.
        assert!(
            charged <= self.target_bytes() || charged == dirty,
            "L1 holds {charged} bytes ({dirty} dirty), over its target {}",
            self.target_bytes()
        );
        assert!(frames.iter().all(|f| f.is_resident()));
    }
}

/// The shard of `key`: bits 32-37 of its hash. Not the top bits: the map inside a shard keeps
/// the top 7 bits of the same hash as each entry's tag (and its low bits pick the bucket). With
/// the shard taken from the top bits, every key of a shard had one of two tags, and each lookup
/// compared the keys of half its probe group.
fn shard_of(key: &PageKey) -> usize {
    let h = PageKeyHash::default().hash_one(key);
    (h >> 32) as usize % SHARDS
}

fn remove_if_same(
    map: &mut HashMap<PageKey, Arc<Pending>, PageKeyHash>,
    key: &PageKey,
    p: &Arc<Pending>,
) {
    if map.get(key).is_some_and(|q| Arc::ptr_eq(q, p)) {
        map.remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::L1_FRAME_OVERHEAD;
    use std::collections::HashSet;

    struct NoSink;
    impl EvictionSink for NoSink {
        fn evicted(&self, _frame: &Arc<Frame>) {}
    }

    const PAGE: usize = 4096;
    const CHARGE: u64 = PAGE as u64 + L1_FRAME_OVERHEAD;

    fn loaded(key: PageKey) -> NewFrame<'static> {
        NewFrame {
            key,
            data: &[],
            now_ms: 0,
            read_micros: 0,
            prefetched: false,
            from_extension: false,
            current_key: None,
            shared: None,
            dirty: false,
        }
    }

    fn ticket(pool: &BufferPool, key: PageKey) -> Ticket {
        match pool.lookup(key) {
            Lookup::Load(t) => t,
            _ => panic!("{key:?} should be a miss with no load in flight"),
        }
    }

    /// A load reads into its reserved slot where no reader can see it: the page is neither
    /// resident nor readable until the load finishes, and then it is the slot's bytes.
    #[test]
    fn a_reserved_load_slot_is_invisible_until_finished() {
        let pool = BufferPool::new(1 << 20, false);
        let key = PageKey::new(1, 7);
        let t = ticket(&pool, key);
        let mut slot = pool.reserve_load(PAGE, &NoSink).unwrap();
        slot.bytes_mut().fill(0xab);
        assert!(!pool.contains(key) && pool.peek(key).is_none());
        let mut buf = vec![0u8; PAGE];
        assert!(!pool.copy_if_resident(key, &mut buf, 0));
        assert!(matches!(pool.lookup(key), Lookup::Wait(_)), "readers wait");
        assert_eq!(pool.resident_pages(), 0);
        assert!(pool.finish_load_in(t, slot, loaded(key), LoadSource::DataFile, &NoSink));
        assert!(pool.copy_if_resident(key, &mut buf, 0));
        assert!(
            buf.iter().all(|&b| b == 0xab),
            "the frame holds the slot's bytes"
        );
        assert_eq!(pool.used_bytes(), CHARGE);
        pool.check_invariants();
    }

    /// A slot reserved and dropped unused (the read failed) gives back its charge and its slab
    /// slot; one whose load was voided by a write installs nothing and gives them back too.
    #[test]
    fn an_abandoned_or_voided_load_slot_returns_its_memory() {
        let pool = BufferPool::new(1 << 20, false);
        let key = PageKey::new(1, 7);
        let t = ticket(&pool, key);
        let slot = pool.reserve_load(PAGE, &NoSink).unwrap();
        assert_eq!(pool.used_bytes(), CHARGE, "a reserved slot is charged");
        assert_eq!(pool.slab().live_bytes(), PAGE as u64);
        drop(slot);
        pool.abort(t);
        assert_eq!(pool.used_bytes(), 0);
        assert_eq!(pool.slab().live_bytes(), 0);

        let t = ticket(&pool, key);
        let mut slot = pool.reserve_load(PAGE, &NoSink).unwrap();
        slot.bytes_mut().fill(1);
        let write = pool.begin_write(key);
        assert!(
            !pool.finish_load_in(t, slot, loaded(key), LoadSource::Extension, &NoSink),
            "a write started during the read: the load must not install"
        );
        assert!(!pool.contains(key));
        assert_eq!(pool.used_bytes(), 0);
        assert_eq!(pool.slab().live_bytes(), 0);
        pool.finish_write(write, None, &NoSink);
        pool.check_invariants();
    }

    /// Reserved slots count against the target: reserving evicts resident frames to make room,
    /// and once every byte is reserved there is no slot to be had.
    #[test]
    fn reserved_load_slots_count_against_the_memory_bound() {
        let target = 2 * CHARGE;
        let pool = BufferPool::new(target, false);
        for page in 0..2 {
            let key = PageKey::new(1, page);
            let t = ticket(&pool, key);
            let slot = pool.reserve_load(PAGE, &NoSink).unwrap();
            assert!(pool.finish_load_in(t, slot, loaded(key), LoadSource::DataFile, &NoSink));
        }
        assert_eq!(pool.resident_pages(), 2);
        let first = pool.reserve_load(PAGE, &NoSink).unwrap();
        assert_eq!(
            pool.resident_pages(),
            1,
            "room was made by evicting a frame"
        );
        assert!(pool.used_bytes() <= target);
        let second = pool.reserve_load(PAGE, &NoSink).unwrap();
        assert_eq!(pool.resident_pages(), 0);
        assert!(pool.used_bytes() <= target);
        assert!(
            pool.reserve_load(PAGE, &NoSink).is_none(),
            "every byte of the target is reserved"
        );
        assert_eq!(pool.used_bytes(), target);
        drop((first, second));
        assert_eq!(pool.used_bytes(), 0);
        pool.check_invariants();
    }

    /// The keys of one shard must not share their map tags (the hash's top 7 bits): a shard
    /// whose keys have few tags makes every probe compare many keys.
    #[test]
    fn keys_of_one_shard_spread_over_the_map_tags() {
        let mut tags: Vec<HashSet<u64>> = vec![HashSet::new(); SHARDS];
        for file in 1..=4 {
            for page in 0..20_000 {
                let key = PageKey::new(file, page);
                let tag = PageKeyHash::default().hash_one(key) >> 57;
                tags[shard_of(&key)].insert(tag);
            }
        }
        // 1,250 keys a shard, 128 possible tags: every shard sees nearly all of them.
        let fewest = tags.iter().map(HashSet::len).min().unwrap();
        assert!(
            fewest >= 100,
            "a shard's keys have only {fewest} distinct tags"
        );
    }
}
