//! Fault injection at the I/O layer: tests make the extension file or a data file fail or lie.
//! Unused, it costs one relaxed atomic load per I/O.

use std::sync::atomic::{AtomicU32, Ordering};

#[derive(Default)]
pub struct FaultInjector {
    extension_read_errors: AtomicU32,
    extension_write_errors: AtomicU32,
    extension_corrupt_reads: AtomicU32,
    data_read_errors: AtomicU32,
    unmoved_stamps: AtomicU32,
}

fn take(counter: &AtomicU32) -> bool {
    counter
        .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |n| n.checked_sub(1))
        .is_ok()
}

fn injected() -> std::io::Error {
    std::io::Error::other("injected fault")
}

impl FaultInjector {
    /// The next `n` reads of the extension file fail with an I/O error.
    pub fn fail_extension_reads(&self, n: u32) {
        self.extension_read_errors.store(n, Ordering::Release);
    }
    /// The next `n` batch writes to the extension file fail with an I/O error.
    pub fn fail_extension_writes(&self, n: u32) {
        self.extension_write_errors.store(n, Ordering::Release);
    }
    /// The next `n` reads of the extension file return flipped bytes.
    pub fn corrupt_extension_reads(&self, n: u32) {
        self.extension_corrupt_reads.store(n, Ordering::Release);
    }
    /// The next `n` reads of any data file fail with an I/O error.
    pub fn fail_data_reads(&self, n: u32) {
        self.data_read_errors.store(n, Ordering::Release);
    }

    /// The next `n` adoptions of a restored file find its stamp as the checkpoint recorded it,
    /// whatever changed: a file system whose clock did not move (coarse timestamps, a file
    /// server's clock) shows a file written since that way.
    pub fn unmoved_stamps_at_adoption(&self, n: u32) {
        self.unmoved_stamps.store(n, Ordering::Release);
    }

    pub(crate) fn take_unmoved_stamp(&self) -> bool {
        take(&self.unmoved_stamps)
    }
    pub(crate) fn take_extension_read_error(&self) -> Option<std::io::Error> {
        take(&self.extension_read_errors).then(injected)
    }
    pub(crate) fn take_extension_write_error(&self) -> Option<std::io::Error> {
        take(&self.extension_write_errors).then(injected)
    }
    pub(crate) fn take_extension_corruption(&self) -> bool {
        take(&self.extension_corrupt_reads)
    }
    pub(crate) fn take_data_read_error(&self) -> Option<std::io::Error> {
        take(&self.data_read_errors).then(injected)
    }
}
