//! S3-FIFO replacement (Yang et al., SOSP'23): a small probationary FIFO, a main FIFO and a ghost
//! list of keys recently evicted from the small one.
//!
//! Why this policy: a hit only bumps a per-frame counter (no list surgery, so hits take no global
//! lock), and a page touched once (a scan) leaves through the small queue without displacing the
//! main queue's hot set. The comparison against LRU, CLOCK and 2Q on recorded traces is in
//! docs/REPLACEMENT.md.

use super::frame::Frame;
use crate::page::{PageKey, PageKeyHash};
use std::collections::{HashSet, VecDeque};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Weak};

/// A queued frame and the bytes it was charged when queued (kept here so that the queue's byte
/// count stays exact even after the frame itself is gone).
type Entry = (Weak<Frame>, u64);

#[derive(Default)]
pub struct Replacer {
    small: VecDeque<Entry>,
    main: VecDeque<Entry>,
    /// Bytes of the entries queued in `small` (dead ones included until popped).
    small_bytes: u64,
    /// Keyed with the pool's own hasher: SipHash here cost a third of an eviction.
    ghost: HashSet<PageKey, PageKeyHash>,
    ghost_fifo: VecDeque<PageKey>,
}

/// A frame's place in the replacer: its access count, and whether it reached the main queue.
#[derive(Clone, Copy)]
pub struct Standing {
    pub freq: u8,
    pub in_main: bool,
}

/// Share of the target kept for the probationary queue (1/N).
const SMALL_SHARE: u64 = 10;

impl Replacer {
    /// Queues a newly resident frame: into main if its key was evicted recently (a ghost hit).
    pub fn push(&mut self, frame: &Arc<Frame>) {
        let entry = (Arc::downgrade(frame), frame.charge());
        if self.ghost.remove(&frame.key) {
            self.enqueue_in_main(frame, entry);
        } else {
            self.small_bytes += entry.1;
            self.small.push_back(entry);
        }
    }

    /// Queues the frame a write installed in place of a resident one where the old frame stood:
    /// main if it was there, else the small queue; with the old frame's access count either way.
    /// Without this every rewrite entered the small queue with no accesses, however hot the
    /// page: in WAL mode SQLite then reads the page from the WAL, not from L1, so the new frame
    /// saw no hit before the small queue evicted it, and each page a checkpoint rewrote went
    /// round through L2 (TPC-C with a quarter of the database in memory read several L2 pages
    /// a transaction so). A page read once and then written (a large UPDATE) stays on probation,
    /// so a scan that writes flushes the hot set no more than a scan that reads.
    pub fn push_rewritten(&mut self, frame: &Arc<Frame>, old: Standing) {
        // fetch_max: the new frame is in the page table already and may have been hit since.
        frame.freq.fetch_max(old.freq, Relaxed);
        if old.in_main {
            self.ghost.remove(&frame.key);
            self.enqueue_in_main(frame, (Arc::downgrade(frame), frame.charge()));
        } else {
            self.push(frame);
        }
    }

    fn enqueue_in_main(&mut self, frame: &Frame, entry: Entry) {
        frame.in_main.store(true, Relaxed);
        self.main.push_back(entry);
    }

    /// Picks the next victim among live clean frames, or None when nothing is queued or every
    /// queued frame is dirty (a dirty frame goes back to main: its bytes are not in the data
    /// file yet, so it cannot leave L1).
    pub fn pick_victim(&mut self, target_bytes: u64, live_frames: usize) -> Option<Arc<Frame>> {
        let mut dirty_seen = 0;
        loop {
            if self.small.is_empty() && self.main.is_empty() {
                return None;
            }
            // Four passes bring every clean frame's counter (at most 3) to 0: past them, only
            // dirty frames are left.
            if dirty_seen > 4 * (self.small.len() + self.main.len()) {
                return None;
            }
            let from_small = !self.small.is_empty()
                && (self.small_bytes >= target_bytes / SMALL_SHARE || self.main.is_empty());
            if from_small {
                let entry = self.small.pop_front()?;
                self.small_bytes -= entry.1;
                let Some(frame) = entry.0.upgrade().filter(|f| f.is_resident()) else {
                    continue;
                };
                if frame.is_dirty() {
                    dirty_seen += 1;
                    self.enqueue_in_main(&frame, entry);
                    continue;
                }
                if frame.freq.load(Relaxed) > 0 {
                    frame.freq.store(0, Relaxed);
                    self.enqueue_in_main(&frame, entry);
                    continue;
                }
                self.remember_ghost(frame.key, live_frames);
                return Some(frame);
            } else {
                let entry = self.main.pop_front()?;
                let Some(frame) = entry.0.upgrade().filter(|f| f.is_resident()) else {
                    continue;
                };
                if frame.is_dirty() {
                    dirty_seen += 1;
                    self.main.push_back(entry);
                    continue;
                }
                let f = frame.freq.load(Relaxed);
                if f > 0 {
                    frame.freq.store(f - 1, Relaxed);
                    self.main.push_back(entry);
                    continue;
                }
                return Some(frame);
            }
        }
    }

    fn remember_ghost(&mut self, key: PageKey, live_frames: usize) {
        let cap = live_frames.max(64);
        if self.ghost.insert(key) {
            self.ghost_fifo.push_back(key);
        }
        while self.ghost_fifo.len() > cap {
            if let Some(old) = self.ghost_fifo.pop_front() {
                self.ghost.remove(&old);
            }
        }
    }

    /// Drops queue entries of frames no longer resident once they outnumber the live ones,
    /// so that a write-heavy workload without evictions cannot grow the queues without bound.
    pub fn compact_if_sparse(&mut self, live_frames: usize) {
        if self.small.len() + self.main.len() <= 2 * live_frames + 1024 {
            return;
        }
        let alive = |e: &Entry| e.0.upgrade().is_some_and(|f| f.is_resident());
        self.small.retain(alive);
        self.main.retain(alive);
        self.small_bytes = self.small.iter().map(|e| e.1).sum();
    }

    pub fn clear(&mut self) {
        *self = Replacer::default();
    }
}
