//! Sequential-access detection per file, from the stream of misses.
//!
//! A miss continues the stream when it lands a little after the stream's previous miss, or a
//! little past the end of the last readahead window (the pages in between were hits because
//! readahead fetched them). "A little" is `SLACK` pages: a b-tree scan in file order skips over
//! interior pages that are already cached, and must not lose its run at each of them.
//!
//! A miss elsewhere does not end the stream at once: it is remembered as an outlier. A scan
//! reads an interior page now and then (one outlier, then the leaves go on where they were), and
//! its leaves are not all in file order (the stream moves: the next miss follows the outlier). In
//! the first case the stream keeps its run; in the second it moves there, still armed if it was
//! long. Only misses that follow neither are random, and reset it.

use crate::config::READAHEAD_TRIGGER;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};

/// How far past the expected page a miss may land and still continue a run.
const SLACK: u64 = 16;

#[derive(Default)]
pub struct SequentialDetector {
    last_miss: AtomicU64,
    window_end: AtomicU64,
    /// The last miss that did not continue the stream (+1, 0 = none).
    outlier: AtomicU64,
    run: AtomicU32,
    /// First page (+1, 0 = none) of the last window read ahead: a read of a page in that window
    /// fetches the next one in the background (see [`SequentialDetector::async_trigger`]).
    mark: AtomicU64,
}

impl SequentialDetector {
    /// Records a miss at `page`; true when readahead should serve it.
    pub fn on_miss(&self, page: u64) -> bool {
        let after = |start: u64| page >= start && page - start < SLACK;
        let continues = after(self.last_miss.load(Relaxed).wrapping_add(1))
            || after(self.window_end.load(Relaxed));
        if continues {
            self.last_miss.store(page, Relaxed);
            self.outlier.store(0, Relaxed);
            return self.run.fetch_add(1, Relaxed) + 1 >= READAHEAD_TRIGGER;
        }
        let outlier = self.outlier.swap(page + 1, Relaxed);
        if outlier != 0 && after(outlier) {
            // The stream moved to where the outlier was: follow it, armed if it was running.
            self.last_miss.store(page, Relaxed);
            self.outlier.store(0, Relaxed);
            let run = if self.run.load(Relaxed) >= READAHEAD_TRIGGER {
                READAHEAD_TRIGGER
            } else {
                2
            };
            self.run.store(run, Relaxed);
            return run >= READAHEAD_TRIGGER;
        }
        if outlier != 0 {
            // Two misses in a row that follow nothing: random access.
            self.run.store(0, Relaxed);
        }
        false
    }

    /// Records that readahead fetched pages up to (not including) `end`.
    pub fn fetched_until(&self, end: u64) {
        self.window_end.store(end, Relaxed);
    }

    /// Records that readahead fetched a window starting at `first`: the first read of a page
    /// in it asks for the next window (as Linux's PG_readahead mark does), so that the next
    /// pages are read while the caller works through these.
    pub fn mark_window(&self, first: u64) {
        self.mark.store(first + 1, Relaxed);
    }

    /// Whether a window is marked (readahead is running): a hit can trigger nothing otherwise.
    pub fn armed(&self) -> bool {
        self.mark.load(Relaxed) != 0
    }

    /// Called on a hit of `page`: if it lies in the marked window of `window` pages, clears the
    /// mark (one trigger per window) and returns the last page fetched so far, after which the
    /// next window starts.
    pub fn async_trigger(&self, page: u64, window: u64) -> Option<u64> {
        let mark = self.mark.load(Relaxed);
        let first = mark.checked_sub(1)?;
        if page < first || page - first >= window {
            return None;
        }
        self.mark.compare_exchange(mark, 0, Relaxed, Relaxed).ok()?;
        self.window_end.load(Relaxed).checked_sub(1)
    }
}

#[cfg(test)]
mod tests {
    use super::SequentialDetector;

    fn misses(d: &SequentialDetector, pages: &[u64]) -> Vec<bool> {
        pages.iter().map(|&p| d.on_miss(p)).collect()
    }

    #[test]
    fn a_run_arms_at_its_third_miss_and_random_misses_never_do() {
        let d = SequentialDetector::default();
        assert_eq!(
            misses(&d, &[100, 101, 102, 103, 104]),
            [false, false, true, true, true]
        );
        let r = SequentialDetector::default();
        let random = [5000, 120, 9000, 40, 7000, 3000, 60000, 800];
        assert!(misses(&r, &random).iter().all(|&ra| !ra));
    }

    #[test]
    fn a_marked_window_triggers_once_on_a_read_inside_it() {
        let d = SequentialDetector::default();
        assert_eq!(d.async_trigger(10, 64), None, "nothing marked yet");
        d.fetched_until(74);
        d.mark_window(10);
        assert_eq!(d.async_trigger(9, 64), None, "before the window");
        assert_eq!(d.async_trigger(74, 64), None, "past the window");
        assert_eq!(
            d.async_trigger(11, 64),
            Some(73),
            "inside: the next window follows 73"
        );
        assert_eq!(d.async_trigger(12, 64), None, "one trigger per window");
    }

    #[test]
    fn one_outlier_keeps_the_run_and_a_moved_stream_stays_armed() {
        let d = SequentialDetector::default();
        misses(&d, &[10, 11, 12, 13]);
        d.fetched_until(77);
        // An interior page elsewhere, then the leaves go on past the window.
        assert_eq!(misses(&d, &[5000, 77]), [false, true]);
        d.fetched_until(141);
        // The leaves jump back: the first miss there is single, the next one reads ahead.
        assert_eq!(misses(&d, &[300, 301]), [false, true]);
        // After the scan, random misses: at most the first is read ahead, then nothing.
        assert_eq!(
            misses(&d, &[9000, 20, 40000, 7]),
            [false, false, false, false]
        );
    }
}
