//! Heap buffers aligned for O_DIRECT.

use crate::config::DIRECT_IO_ALIGN;
use std::alloc::{alloc_zeroed, dealloc, Layout};

/// A zeroed heap buffer whose address and length are multiples of [`DIRECT_IO_ALIGN`].
pub struct AlignedBuf {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
}

// SAFETY: AlignedBuf owns its allocation exclusively, like a Vec<u8>.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared references only give out &[u8].
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// A buffer of at least `len` bytes, rounded up to the alignment.
    pub fn new(len: usize) -> Self {
        let len = round_up(len.max(1), DIRECT_IO_ALIGN);
        let layout = Layout::from_size_align(len, DIRECT_IO_ALIGN).expect("valid layout");
        // SAFETY: layout has a non-zero size.
        let raw = unsafe { alloc_zeroed(layout) };
        let ptr =
            std::ptr::NonNull::new(raw).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        AlignedBuf { ptr, len }
    }
}

impl std::ops::Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: ptr is valid for len initialized (zeroed) bytes for the life of self.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl std::ops::DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, and &mut self guarantees exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        let layout = Layout::from_size_align(self.len, DIRECT_IO_ALIGN).expect("valid layout");
        // SAFETY: allocated in new() with this exact layout.
        unsafe { dealloc(self.ptr.as_ptr(), layout) }
    }
}

/// Largest buffer a thread keeps for reuse: one page of the largest size SQLite has. Larger
/// requests (readahead runs) allocate; they are rare and amortized over many pages.
const SCRATCH_KEEP: usize = crate::config::MAX_PAGE_SIZE;

thread_local! {
    static SCRATCH: std::cell::Cell<Option<AlignedBuf>> = const { std::cell::Cell::new(None) };
}

/// An aligned buffer for one read, taken from the calling thread's spare one when it is large
/// enough, and handed back to it on drop. A single-page read then costs no allocation, no
/// zeroing and no page fault (the spare stays mapped). Its bytes are whatever the last read
/// left: callers read into it before they look at it. At most [`SCRATCH_KEEP`] bytes per thread
/// are kept. Re-entrant use (the spare already taken) just allocates.
pub struct Scratch {
    buf: Option<AlignedBuf>,
    len: usize,
}

impl Scratch {
    pub fn new(len: usize) -> Scratch {
        let spare = SCRATCH.with(|s| s.take()).filter(|b| b.len() >= len);
        Scratch {
            buf: Some(spare.unwrap_or_else(|| AlignedBuf::new(len))),
            len,
        }
    }
}

impl std::ops::Deref for Scratch {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.buf.as_ref().expect("present until drop")[..self.len]
    }
}

impl std::ops::DerefMut for Scratch {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.buf.as_mut().expect("present until drop")[..self.len]
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if let Some(buf) = self.buf.take().filter(|b| b.len() <= SCRATCH_KEEP) {
            // try_with: a thread that is exiting has no spare to keep.
            let _ = SCRATCH.try_with(|s| s.set(Some(buf)));
        }
    }
}

pub fn round_up(n: usize, to: usize) -> usize {
    n.div_ceil(to) * to
}

pub fn round_down(n: u64, to: u64) -> u64 {
    n / to * to
}
