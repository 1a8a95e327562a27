//! Sequential-access detection per file, from the stream of misses.
//!
//! A miss continues a run when it is the page after the previous miss, or the first page past the
//! last readahead window (the pages in between were hits because readahead fetched them).

use crate::config::READAHEAD_TRIGGER;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};

#[derive(Default)]
pub struct SequentialDetector {
    last_miss: AtomicU64,
    window_end: AtomicU64,
    run: AtomicU32,
}

impl SequentialDetector {
    /// Records a miss at `page`; true when readahead should serve it.
    pub fn on_miss(&self, page: u64) -> bool {
        let prev = self.last_miss.swap(page, Relaxed);
        let continues = page == prev.wrapping_add(1) || page == self.window_end.load(Relaxed);
        let run = if continues {
            self.run.fetch_add(1, Relaxed) + 1
        } else {
            self.run.store(0, Relaxed);
            0
        };
        run >= READAHEAD_TRIGGER
    }

    /// Records that readahead fetched pages up to (not including) `end`.
    pub fn fetched_until(&self, end: u64) {
        self.window_end.store(end, Relaxed);
    }
}
