//! Sequential-access detection per file, from the stream of misses.
//!
//! A miss continues a run when it lands a little after the previous miss, or a little past the
//! end of the last readahead window (the pages in between were hits because readahead fetched
//! them). "A little" is `SLACK` pages: a b-tree scan in file order skips over interior pages that
//! are already cached, and must not lose its run (and pay single-page reads) at each of them.

use crate::config::READAHEAD_TRIGGER;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};

/// How far past the expected page a miss may land and still continue a run.
const SLACK: u64 = 16;

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
        let after = |start: u64| page >= start && page - start < SLACK;
        let continues = after(prev.wrapping_add(1)) || after(self.window_end.load(Relaxed));
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
