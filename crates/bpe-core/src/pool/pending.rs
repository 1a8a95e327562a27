//! An I/O in flight on one page: a load (miss or readahead) or a write. Other readers of the page
//! wait for it instead of issuing their own I/O; a write that starts during a load invalidates the
//! load so that its (possibly older) bytes are never cached.

use crate::sync::Latch;
use std::sync::atomic::{AtomicBool, Ordering};

pub struct Pending {
    pub is_write: bool,
    invalidated: AtomicBool,
    done: Latch,
}

impl Pending {
    pub fn new(is_write: bool) -> Self {
        Pending {
            is_write,
            invalidated: AtomicBool::new(false),
            done: Latch::default(),
        }
    }

    pub fn invalidate(&self) {
        self.invalidated.store(true, Ordering::Release);
    }

    pub fn is_invalidated(&self) -> bool {
        self.invalidated.load(Ordering::Acquire)
    }

    pub fn wait(&self) {
        // Waiting under a lock could wait for a thread that waits for that lock.
        crate::sync::assert_no_locks_held("waiting for another thread's page I/O");
        self.done.wait();
    }

    pub fn complete(&self) {
        self.done.set();
    }
}
