//! Background readahead from the extension: one thread per engine, started on the first
//! sequential run, that reads the next window of a scan while the reader works through the
//! window before it. A synchronous readahead makes a scan wait for every window in turn (the
//! device idles while the caller works, the CPU idles while the device reads); this overlaps
//! the two on a second core.
//!
//! The chain: a readahead (the reader's own, or this thread's) marks the window it fetched;
//! the first read that hits a page of the marked window queues the next window here. Jobs are
//! best effort: a full queue drops one, and the scan's next miss reads ahead in the foreground
//! as before. Pages of a window in flight are pending in L1, so a reader that gets there first
//! waits for them instead of reading them again.

use super::Engine;
use crate::config::{READAHEAD_BYTES, READAHEAD_MEMORY_DIVISOR, READAHEAD_TRIGGER};
use crate::files::FileHandle;
use crate::page::PageKey;
use crate::pool::Ticket;
use crate::sync::channel::{bounded, Receiver, RecvTimeoutError};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Weak;
use std::time::{Duration, Instant};

/// Windows queued at most; more would be read after the reader needed them.
const QUEUE: usize = 4;

/// Read the window after `after` (the last page fetched so far) of `file`: the pages of
/// `tickets`, taken by the reader that queued the job, so that it waits for them when it gets
/// there first instead of reading them itself. Every ticket is finished or aborted.
pub(super) struct Job {
    file: FileHandle,
    after: PageKey,
    tickets: Vec<Ticket>,
    queued: Instant,
}

/// Pages in one readahead window of a file of `page_size` pages, with `max_memory`:
/// [`READAHEAD_BYTES`], at most 1/[`READAHEAD_MEMORY_DIVISOR`] of it, at least the trigger.
pub(super) fn window_pages(page_size: usize, max_memory: u64) -> u64 {
    let bytes = (READAHEAD_BYTES as u64).min(max_memory / READAHEAD_MEMORY_DIVISOR);
    (bytes / page_size as u64).max(READAHEAD_TRIGGER as u64)
}

impl Engine {
    /// On a hit of `key`: if it is in the file's marked window, queues the next window.
    pub(super) fn read_ahead_in_background(&self, file: &FileHandle, key: PageKey) {
        let window = window_pages(file.page_size(), self.max_memory());
        let Some(last) = file.extension_readahead.async_trigger(key.page, window) else {
            return;
        };
        let after = PageKey::new(key.file, last);
        let tickets = self.readahead_tickets(after, file.page_size());
        if tickets.is_empty() {
            return;
        }
        let job = Job {
            file: file.clone(),
            after,
            tickets,
            queued: Instant::now(),
        };
        let mut queue = self.prefetcher.lock();
        if queue.is_none() {
            let (tx, rx) = bounded(QUEUE);
            let engine = self.me.clone();
            if crate::sync::spawn("bpe-readahead", move || run(engine, rx)).is_ok() {
                *queue = Some(tx);
            }
        }
        self.readahead_jobs.fetch_add(1, Relaxed);
        let refused = match queue.as_ref() {
            Some(tx) => tx.try_send(job).err().map(|(_, job)| job),
            None => Some(job), // no thread: the foreground readahead goes on serving scans
        };
        drop(queue);
        if let Some(job) = refused {
            job.tickets.into_iter().for_each(|t| self.pool.abort(t));
            self.readahead_jobs.fetch_sub(1, Relaxed);
        }
    }

    /// Waits until no background readahead is queued or running (for checks that need the
    /// engine still: invariants, tests). False on timeout.
    pub fn wait_for_readahead(&self, timeout: Duration) -> bool {
        let deadline = std::time::Instant::now() + timeout;
        while self.readahead_jobs.load(Relaxed) > 0 {
            if std::time::Instant::now() >= deadline {
                return false;
            }
            crate::sync::yield_now();
        }
        true
    }
}

/// The thread: until the engine is gone (its sender dropped with it).
fn run(engine: Weak<Engine>, jobs: Receiver<Job>) {
    loop {
        let job = match jobs.recv_timeout(Duration::from_secs(1)) {
            Ok(job) => job,
            Err(RecvTimeoutError::Timeout) => continue,
            Err(RecvTimeoutError::Disconnected) => return,
        };
        let Some(engine) = engine.upgrade() else {
            return;
        };
        match engine.current_extension() {
            Some(ext) => engine.fetch_run(&job.file, &ext, job.after, job.tickets, job.queued),
            None => job.tickets.into_iter().for_each(|t| engine.pool.abort(t)),
        }
        engine.readahead_jobs.fetch_sub(1, Relaxed);
    }
}
