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

/// Largest buffer a thread keeps for reuse: one page of the largest size SQLite has.
const SCRATCH_KEEP: usize = crate::config::MAX_PAGE_SIZE;

thread_local! {
    static SCRATCH: std::cell::Cell<Option<AlignedBuf>> = const { std::cell::Cell::new(None) };
}

/// Size of a buffer for large reads (readahead windows, up to [`crate::config::READAHEAD_BYTES`]
/// and the alignment around them): one transparent huge page.
pub const LARGE_BYTES: usize = 2 << 20;

/// Large buffers kept for reuse, process-wide (a scan's reader and the background readahead
/// thread each hold one during a read): at most this many. More readers at once allocate and
/// free their own.
const LARGE_KEEP: usize = 2;

/// Memory the kept readahead buffers may hold once the first scans ran: a fixed overhead,
/// reached at the first concurrent readaheads and not growing after.
pub const READAHEAD_BUFFERS_KEPT_BYTES: usize = LARGE_KEEP * LARGE_BYTES;

static LARGE_SPARES: std::sync::Mutex<Vec<LargeBuf>> = std::sync::Mutex::new(Vec::new());

/// The kept large buffers' lock, taken: a fork handler holds it across `fork` so that a child
/// never starts with it held by a thread it does not have (its reads would wait for it forever).
/// Also how a test holds it.
pub fn hold_large_spares() -> Box<dyn std::any::Any> {
    Box::new(LARGE_SPARES.lock().unwrap_or_else(|e| e.into_inner()))
}

/// A [`LARGE_BYTES`] buffer, aligned to its size and asked to be backed by a huge page.
///
/// Why: an O_DIRECT read into scattered 4 KiB pages needs one segment per page, and a block
/// device takes at most `max_segments` per request (128 on a loop device and many others), so
/// a 1 MiB read went out as two 512 KiB requests, and a device that caps IOPS (a cloud volume,
/// the blkio throttle) gave half its bandwidth. Physically contiguous memory needs one segment
/// per `max_segment_size` (64 KiB and up). Keeping the buffer also spares each readahead the
/// 256 page faults and the zeroing of a fresh megabyte. Without huge pages it is still a kept,
/// aligned buffer.
struct LargeBuf {
    ptr: std::ptr::NonNull<u8>,
}

// SAFETY: LargeBuf owns its mapping exclusively, like a Vec<u8>.
unsafe impl Send for LargeBuf {}

impl LargeBuf {
    fn new() -> Option<LargeBuf> {
        let ptr = map_aligned(LARGE_BYTES, LARGE_BYTES, 0)?;
        // SAFETY: the range is the mapping just made; madvise only advises on it.
        unsafe { libc::madvise(ptr.as_ptr().cast(), LARGE_BYTES, libc::MADV_HUGEPAGE) };
        Some(LargeBuf { ptr })
    }

    fn take() -> Option<LargeBuf> {
        let spare = LARGE_SPARES.lock().unwrap_or_else(|e| e.into_inner()).pop();
        spare.or_else(LargeBuf::new)
    }

    fn give_back(self) {
        let mut spares = LARGE_SPARES.lock().unwrap_or_else(|e| e.into_inner());
        if spares.len() < LARGE_KEEP {
            spares.push(self);
        }
    }
}

impl std::ops::Deref for LargeBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: the mapping is LARGE_BYTES long, readable and initialized (anonymous
        // mappings are zero-filled) until drop.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), LARGE_BYTES) }
    }
}

impl std::ops::DerefMut for LargeBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, and &mut self guarantees exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), LARGE_BYTES) }
    }
}

impl Drop for LargeBuf {
    fn drop(&mut self) {
        // SAFETY: the range is the mapping's kept part, unmapped once, here.
        unsafe { libc::munmap(self.ptr.as_ptr() as *mut libc::c_void, LARGE_BYTES) };
    }
}

enum ScratchBuf {
    Small(AlignedBuf),
    Large(LargeBuf),
}

impl ScratchBuf {
    fn bytes(&self) -> &[u8] {
        match self {
            ScratchBuf::Small(b) => b,
            ScratchBuf::Large(b) => b,
        }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        match self {
            ScratchBuf::Small(b) => b,
            ScratchBuf::Large(b) => b,
        }
    }
}

/// An aligned buffer for one read. Up to a page of the largest size: the calling thread's spare
/// one when it is large enough, handed back to it on drop, so a single-page read costs no
/// allocation, no zeroing and no page fault (at most [`SCRATCH_KEEP`] bytes per thread).
/// Larger, up to [`LARGE_BYTES`]: a kept huge-page buffer (see [`LargeBuf`]). Its bytes are
/// whatever the last read left: callers read into it before they look at it. Re-entrant use
/// (the spare already taken) just allocates.
pub struct Scratch {
    buf: Option<ScratchBuf>,
    len: usize,
}

impl Scratch {
    pub fn new(len: usize) -> Scratch {
        let buf = if len <= SCRATCH_KEEP {
            let spare = SCRATCH.with(|s| s.take()).filter(|b| b.len() >= len);
            ScratchBuf::Small(spare.unwrap_or_else(|| AlignedBuf::new(len)))
        } else {
            let large = if len <= LARGE_BYTES {
                LargeBuf::take()
            } else {
                None
            };
            match large {
                Some(large) => ScratchBuf::Large(large),
                None => ScratchBuf::Small(AlignedBuf::new(len)),
            }
        };
        Scratch {
            buf: Some(buf),
            len,
        }
    }

    /// Whether the buffer is one of the kept huge-page ones.
    #[cfg(test)]
    fn is_large(&self) -> bool {
        matches!(self.buf, Some(ScratchBuf::Large(_)))
    }
}

impl std::ops::Deref for Scratch {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.buf.as_ref().expect("present until drop").bytes()[..self.len]
    }
}

impl std::ops::DerefMut for Scratch {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.buf.as_mut().expect("present until drop").bytes_mut()[..self.len]
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        match self.buf.take() {
            Some(ScratchBuf::Small(buf)) if buf.len() <= SCRATCH_KEEP => {
                // try_with: a thread that is exiting has no spare to keep.
                let _ = SCRATCH.try_with(|s| s.set(Some(buf)));
            }
            Some(ScratchBuf::Large(buf)) => buf.give_back(),
            _ => {}
        }
    }
}

/// A private anonymous mapping of `len` bytes starting on a multiple of `align` (a power of two,
/// a multiple of the page size), with `extra_flags` (e.g. `MAP_NORESERVE`). The caller owns it
/// and unmaps `len` bytes from the start.
pub(crate) fn map_aligned(
    len: usize,
    align: usize,
    extra_flags: libc::c_int,
) -> Option<std::ptr::NonNull<u8>> {
    let span = len.checked_add(align)?;
    // SAFETY: a private anonymous mapping (no descriptor) at an address of the kernel's
    // choosing; it aliases nothing, and the result is checked.
    let raw = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            span,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | extra_flags,
            -1,
            0,
        )
    };
    if raw == libc::MAP_FAILED {
        return None;
    }
    let addr = raw as usize;
    let start = round_up(addr, align);
    let (head, tail) = (start - addr, addr + span - (start + len));
    // SAFETY: [addr, start) and [start + len, addr + span) lie in the mapping made above,
    // outside the range kept; nothing refers to them.
    unsafe {
        if head > 0 {
            libc::munmap(raw, head);
        }
        if tail > 0 {
            libc::munmap((start + len) as *mut libc::c_void, tail);
        }
    }
    std::ptr::NonNull::new(start as *mut u8)
}

/// Whether a read of `buf` at `offset` can be made with O_DIRECT as it is: the offset, the
/// buffer's address and its length all on whole blocks of [`DIRECT_IO_ALIGN`].
pub fn is_block_aligned(offset: u64, buf: &[u8]) -> bool {
    let align = DIRECT_IO_ALIGN;
    !buf.is_empty()
        && offset.is_multiple_of(align as u64)
        && (buf.as_ptr() as usize).is_multiple_of(align)
        && buf.len().is_multiple_of(align)
}

pub fn round_up(n: usize, to: usize) -> usize {
    n.div_ceil(to) * to
}

pub fn round_down(n: u64, to: u64) -> u64 {
    n / to * to
}

/// pread until `buf` is full or end of file; returns the bytes read.
pub fn read_full(file: &std::fs::File, offset: u64, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match std::os::unix::fs::FileExt::read_at(file, &mut buf[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::{Scratch, LARGE_BYTES};

    #[test]
    fn a_readahead_sized_buffer_is_a_huge_page_aligned_one_on_every_thread() {
        for _ in 0..3 {
            let (addr, len, large) = std::thread::spawn(|| {
                let mut b = Scratch::new(3 << 19);
                b.fill(7);
                (b.as_ptr() as usize, b.len(), b.is_large())
            })
            .join()
            .unwrap();
            assert!(large);
            assert_eq!(addr % LARGE_BYTES, 0, "aligned to a huge page");
            assert_eq!(len, 3 << 19);
        }
    }

    #[test]
    fn a_page_sized_buffer_is_not_a_large_one_and_an_oversized_one_still_works() {
        assert!(!Scratch::new(4096).is_large());
        let mut big = Scratch::new(LARGE_BYTES + 4096);
        assert!(!big.is_large());
        assert_eq!(big.len(), LARGE_BYTES + 4096);
        big.fill(1);
    }
}
