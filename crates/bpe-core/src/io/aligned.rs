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

pub fn round_up(n: usize, to: usize) -> usize {
    n.div_ceil(to) * to
}

pub fn round_down(n: u64, to: u64) -> u64 {
    n / to * to
}
