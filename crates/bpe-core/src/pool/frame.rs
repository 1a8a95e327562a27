//! A cached page in RAM. Its bytes never change: a write replaces the frame.

use super::slab::Slot;
use crate::config::L1_FRAME_OVERHEAD;
use crate::page::{PageKey, SharedRead};
use std::sync::atomic::{
    AtomicBool, AtomicU32, AtomicU64, AtomicU8,
    Ordering::{AcqRel, Acquire, Relaxed},
};
use std::sync::{Arc, OnceLock};

pub struct Frame {
    pub key: PageKey,
    /// The page's bytes, in L1's slab (see `slab.rs`).
    pub data: Slot,
    /// Accesses since queued (saturates at 3); the replacer reads and decays it.
    pub freq: AtomicU8,
    /// In the replacer's main queue (set when it gets there): a write that replaces this frame
    /// puts the new one there too (see `Replacer::push_rewritten`).
    pub in_main: AtomicBool,
    /// Brought in by readahead and not yet read: its first read is not a re-reference.
    prefetched: AtomicBool,
    /// Read from the extension: its copy there has served a read (see `Extension::admit`).
    pub from_extension: bool,
    resident: AtomicBool,
    /// Written by the writer but not yet to the data file (write-behind, see `BufferPool`): the
    /// only copy of these bytes. Set only at install; cleared once they are in the file.
    dirty: AtomicBool,
    pub loaded_ms: u64,
    pub last_access_ms: AtomicU64,
    /// Microseconds the read that brought this page in took.
    pub read_micros: u32,
    /// The file's current key (see `page.rs`): once it differs from `key.file`, this frame is a
    /// dead copy that nothing can find, and it is not worth writing to the extension.
    current_key: Option<Arc<AtomicU32>>,
    /// For a shared extension: the page's shared name and write epoch before its bytes were
    /// read. Unset: not offered to a shared extension (it cannot tell the copy is current).
    /// Set once: at install for a page read or written through, at its write-back for a page
    /// written behind (whose bytes the file has only from then on).
    shared: OnceLock<SharedRead>,
}

/// A page about to be installed in L1, its bytes still in the caller's buffer: the pool copies
/// them into a slot only once it has made room (so that no slot is taken for a page it cannot
/// keep).
pub struct NewFrame<'a> {
    pub key: PageKey,
    pub data: &'a [u8],
    pub now_ms: u64,
    pub read_micros: u32,
    pub prefetched: bool,
    /// Set by the pool from the load's source (`BufferPool::finish_load`).
    pub from_extension: bool,
    pub current_key: Option<Arc<AtomicU32>>,
    pub shared: Option<SharedRead>,
    /// Not yet in the data file: see [`Frame::is_dirty`].
    pub dirty: bool,
}

impl NewFrame<'_> {
    /// Bytes the frame will count against max server memory.
    pub fn charge(&self) -> u64 {
        self.data.len() as u64 + L1_FRAME_OVERHEAD
    }
}

impl Frame {
    /// The frame of `new`, its bytes copied into `slot` (of the same length).
    pub(super) fn install(new: NewFrame<'_>, slot: Slot) -> Self {
        let data = slot.filled(new.data);
        Frame::holding(new, data)
    }

    /// The frame of `new` whose bytes were read straight into `data` (a load in place, see
    /// `BufferPool::reserve_load`); `new.data` is not looked at.
    pub(super) fn holding(new: NewFrame<'_>, data: Slot) -> Self {
        Frame {
            key: new.key,
            data,
            freq: AtomicU8::new(0),
            in_main: AtomicBool::new(false),
            prefetched: AtomicBool::new(new.prefetched),
            from_extension: new.from_extension,
            resident: AtomicBool::new(true),
            dirty: AtomicBool::new(new.dirty),
            loaded_ms: new.now_ms,
            last_access_ms: AtomicU64::new(new.now_ms),
            read_micros: new.read_micros,
            current_key: new.current_key,
            shared: new.shared.map_or_else(OnceLock::new, OnceLock::from),
        }
    }

    /// What a shared extension needs to show this copy current (see the field).
    pub fn shared(&self) -> Option<SharedRead> {
        self.shared.get().copied()
    }

    /// A page written behind is in the data file now, as of `read`: once the frame is clean,
    /// a shared extension may take it when it leaves L1, as it takes a page written through.
    /// Called after the write to the file and before the frame is marked clean (so no eviction
    /// comes between), and only once.
    pub(crate) fn written_back_under(&self, read: SharedRead) {
        let _ = self.shared.set(read);
    }

    /// Whether this is a page of the file whose key lives in `cell` (whatever its key now).
    pub fn is_of(&self, cell: &Arc<AtomicU32>) -> bool {
        self.current_key
            .as_ref()
            .is_some_and(|k| Arc::ptr_eq(k, cell))
    }

    /// False once the file's pages were forgotten as a whole (it has a new key).
    pub fn is_current(&self) -> bool {
        self.current_key
            .as_ref()
            .is_none_or(|k| k.load(Relaxed) == self.key.file)
    }

    /// Bytes this frame counts against max server memory.
    pub fn charge(&self) -> u64 {
        self.data.len() as u64 + L1_FRAME_OVERHEAD
    }

    pub fn touch(&self, now_ms: u64) {
        // Stored only when it moved (once a clock tick at most): a hot page read on every core
        // then keeps its line shared instead of each hit taking it exclusive.
        if self.last_access_ms.load(Relaxed) != now_ms {
            self.last_access_ms.store(now_ms, Relaxed);
        }
        // Looked at before it is swapped: a hit then writes the frame with plain stores only,
        // which do not wait for its line, where a locked swap would.
        if self.prefetched.load(Relaxed) && self.prefetched.swap(false, Relaxed) {
            return;
        }
        let f = self.freq.load(Relaxed);
        if f < 3 {
            self.freq.store(f + 1, Relaxed);
        }
    }

    pub fn is_resident(&self) -> bool {
        self.resident.load(Relaxed)
    }

    /// True while the frame holds bytes the data file does not have yet: it may leave L1 only
    /// by being written back, replaced by a newer write, or truncated away.
    pub fn is_dirty(&self) -> bool {
        self.dirty.load(Acquire)
    }

    /// Clears the dirty flag; true if it was set (exactly one caller sees true).
    pub(super) fn take_dirty(&self) -> bool {
        self.dirty.swap(false, AcqRel)
    }

    pub(super) fn set_evicted(&self) {
        self.resident.store(false, Relaxed);
    }
}
