//! Background readahead, from the extension and from the data file: one thread per engine,
//! started on the first sequential run, that reads the next window of a scan while the reader
//! works through the window before it. A synchronous readahead makes a scan wait for every
//! window in turn (the device idles while the caller works, the CPU idles while the device
//! reads); this overlaps the two on a second core.
//!
//! The chain, per tier: a readahead (the reader's own, or this thread's) marks the window it
//! fetched; the first read that hits a page of the marked window queues the next window here.
//! A data-file window ends before the first page the extension holds, as the reader's own does
//! (see `Engine::prefetch_tickets`), so a scan moves to the cheaper tier where it can. Jobs are
//! best effort: a full queue drops one, and the scan's next miss reads ahead in the foreground
//! as before. Pages of a window in flight are pending in L1, so a reader that gets there first
//! waits for them instead of reading them again.

use super::Engine;
use crate::config::{READAHEAD_BYTES, READAHEAD_MEMORY_DIVISOR, READAHEAD_TRIGGER};
use crate::files::FileHandle;
use crate::page::PageKey;
use crate::pool::{BufferPool, Ticket};
use crate::sync::channel::{bounded, Receiver, RecvTimeoutError, Sender};
use crate::sync::{Mutex, Rank};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// Windows queued at most; more would be read after the reader needed them.
const QUEUE: usize = 4;

/// Read the window after `after` (the last page fetched so far) of `file`: the pages of the
/// window's tickets, taken by the reader that queued the job, so that it waits for them when it
/// gets there first instead of reading them itself. Every ticket is finished or aborted.
struct Job {
    file: FileHandle,
    after: PageKey,
    window: Window,
    queued: Instant,
}

/// Where a job reads its window from, and the tickets of its pages.
enum Window {
    /// The extension slots after `after`'s: one ticket per page, all of them to load.
    Extension(Vec<Ticket>),
    /// The data file after page `after`: one entry per page, None for a page cached already
    /// (read over to keep the request whole).
    DataFile(Vec<Option<Ticket>>),
}

impl Window {
    fn abort(self, pool: &BufferPool) {
        match self {
            Window::Extension(tickets) => tickets.into_iter().for_each(|t| pool.abort(t)),
            Window::DataFile(tickets) => tickets.into_iter().flatten().for_each(|t| pool.abort(t)),
        }
    }
}

/// The engine's reads in the background: the readahead thread's queue, and the jobs queued or
/// running (readahead windows, and the prewarm threads of `warm.rs`), which
/// [`Engine::wait_for_readahead`] waits out.
pub(super) struct BackgroundReads {
    /// The readahead thread's queue, once a scan started it.
    queue: Mutex<Option<Sender<Job>>>,
    /// Jobs queued or running. Shared with the threads that run the jobs, which count theirs
    /// done only after letting go of the engine: once this reads 0, no job keeps the engine
    /// alive.
    jobs: Arc<AtomicUsize>,
}

impl BackgroundReads {
    pub(super) fn new() -> BackgroundReads {
        BackgroundReads {
            queue: Mutex::new(Rank::Leaf, None),
            jobs: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// Queues `job` for the readahead thread, which the first job starts (holding `engine`
    /// weakly: it ends once the engine is gone). A job refused (a full queue, no thread) has
    /// its tickets aborted in `pool`.
    fn queue(&self, job: Job, engine: &Weak<Engine>, pool: &BufferPool) {
        let mut queue = self.queue.lock();
        if queue.is_none() {
            let (tx, rx) = bounded(QUEUE);
            let (engine, jobs) = (engine.clone(), self.jobs.clone());
            if crate::sync::spawn("bpe-readahead", move || run(engine, rx, jobs)).is_ok() {
                *queue = Some(tx);
            }
        }
        self.jobs.fetch_add(1, Relaxed);
        let refused = match queue.as_ref() {
            Some(tx) => tx.try_send(job).err().map(|(_, job)| job),
            None => Some(job), // no thread: the foreground readahead goes on serving scans
        };
        drop(queue);
        if let Some(job) = refused {
            job.window.abort(pool);
            self.jobs.fetch_sub(1, Relaxed);
        }
    }

    /// Counts a job that runs on a thread of its own (a prewarm thread) until the returned
    /// count drops, which the thread lets happen only after letting go of the engine.
    pub(super) fn count_job(&self) -> CountedJob {
        self.jobs.fetch_add(1, Relaxed);
        CountedJob(self.jobs.clone())
    }

    /// Waits until no job is queued or running. False on timeout.
    fn wait_idle(&self, timeout: Duration) -> bool {
        let deadline = std::time::Instant::now() + timeout;
        while self.jobs.load(Relaxed) > 0 {
            if std::time::Instant::now() >= deadline {
                return false;
            }
            crate::sync::yield_now();
        }
        true
    }
}

/// One background job counted as queued or running ([`BackgroundReads::count_job`]), until
/// this drops.
pub(super) struct CountedJob(Arc<AtomicUsize>);

impl Drop for CountedJob {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Relaxed);
    }
}

/// Pages in one readahead window of a file of `page_size` pages, with `max_memory`:
/// [`READAHEAD_BYTES`], at most 1/[`READAHEAD_MEMORY_DIVISOR`] of it, at least the trigger.
pub(super) fn window_pages(page_size: usize, max_memory: u64) -> u64 {
    let bytes = (READAHEAD_BYTES as u64).min(max_memory / READAHEAD_MEMORY_DIVISOR);
    (bytes / page_size as u64).max(READAHEAD_TRIGGER as u64)
}

impl Engine {
    /// On a hit of `key`: if it is in one of the file's marked windows (the extension's or the
    /// data file's), queues the next window of that tier. Every L1 hit comes here; most find no
    /// window marked (point lookups, no scan running) and leave after two loads, before the
    /// call that sizes a window.
    #[inline]
    pub(super) fn read_ahead_on_hit(&self, file: &FileHandle, key: PageKey) {
        if file.extension_readahead.armed() || file.readahead.armed() {
            self.read_ahead_in_background(file, key);
        }
    }

    // Kept out of `read_ahead_on_hit`, whose callers inline it: its frame is large.
    #[inline(never)]
    fn read_ahead_in_background(&self, file: &FileHandle, key: PageKey) {
        let pages = window_pages(file.page_size(), self.max_memory());
        let job = if let Some(last) = file.extension_readahead.async_trigger(key.page, pages) {
            let after = PageKey::new(key.file, last);
            let tickets = self.readahead_tickets(after, file.page_size());
            (!tickets.is_empty()).then_some((after, Window::Extension(tickets)))
        } else if let Some(last) = file.readahead.async_trigger(key.page, pages) {
            let after = PageKey::new(key.file, last);
            // A file that cannot say its size reads no further ahead: best effort.
            let tickets = self.prefetch_tickets(file, after, file.page_size());
            tickets
                .ok()
                .filter(|t| !t.is_empty())
                .map(|t| (after, Window::DataFile(t)))
        } else {
            None
        };
        let Some((after, window)) = job else {
            return;
        };
        let job = Job {
            file: file.clone(),
            after,
            window,
            queued: Instant::now(),
        };
        self.background.queue(job, &self.me, &self.pool);
    }

    /// Waits until no background readahead (or prewarm) is queued or running (for checks that
    /// need the engine still: invariants, tests). False on timeout.
    pub fn wait_for_readahead(&self, timeout: Duration) -> bool {
        self.background.wait_idle(timeout)
    }
}

/// The thread: until the engine is gone (its sender dropped with it). `jobs_left` is the
/// count of [`BackgroundReads`], each of this thread's jobs counted done once it let go of the
/// engine.
fn run(engine: Weak<Engine>, queue: Receiver<Job>, jobs_left: Arc<AtomicUsize>) {
    loop {
        let job = match queue.recv_timeout(Duration::from_secs(1)) {
            Ok(job) => job,
            Err(RecvTimeoutError::Timeout) => continue,
            Err(RecvTimeoutError::Disconnected) => return,
        };
        let Some(engine) = engine.upgrade() else {
            return;
        };
        match (job.window, engine.current_extension()) {
            (Window::Extension(tickets), Some(ext)) => {
                engine.fetch_run(&job.file, &ext, job.after, tickets, job.queued)
            }
            (Window::DataFile(tickets), _) => {
                engine.fetch_data_window(&job.file, job.after, tickets, job.queued)
            }
            (window, None) => window.abort(&engine.pool),
        }
        drop((engine, job.file));
        jobs_left.fetch_sub(1, Relaxed);
    }
}
