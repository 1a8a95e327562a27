//! The extension's background writer: the only thread that writes the extension file.
//!
//! It fills the ring one region at a time. Entering a region, it forgets what the region held
//! (the oldest pages of the ring). It gathers staged pages into a batch, places them largest
//! first (so every page sits at an offset aligned to its own size, or to the 4 KiB I/O block
//! for larger pages), writes the batch with one O_DIRECT write, and only then indexes the pages
//! whose staging entry is still current (a write to a page in between has removed it). Queries
//! never wait for it.
//!
//! It also restores the last checkpoint when the file was taken over from a previous process,
//! adopts restored pages for files as they open, and checkpoints the index every few seconds
//! while it changes (see `private/persist.rs`).

use super::store::Written;
use super::{page_crc, Extension, Staged, ToWriter, REGION_BYTES};
use crate::config::DIRECT_IO_ALIGN;
use crate::counters::Counters;
use crate::io::aligned::round_up;
use crate::io::AlignedBuf;
use crate::sync::channel::{Receiver, RecvTimeoutError};
use crate::sync::Latch;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long the writer waits for more pages before writing a partial batch.
const GATHER: Duration = Duration::from_millis(2);
const POLL: Duration = Duration::from_millis(50);
/// How long a clean close may spend writing the pages still queued.
const DRAIN_LIMIT: Duration = Duration::from_secs(1);

/// Starts the writer (restoring the file's last checkpoint first if `restore`); it sets `done`
/// when it has stopped.
pub(super) fn spawn(ext: Arc<Extension>, rx: Receiver<ToWriter>, done: Arc<Latch>, restore: bool) {
    // Detached: shutdown waits for `done` (with a deadline) rather than joining, so that an
    // operator's OFF or resize can never hang on the thread's exit.
    crate::sync::spawn("bpe-extension-writer", move || {
        let mut writer = Writer::new(ext);
        if restore {
            let ext = writer.ext.clone();
            let started = Instant::now();
            writer.region = ext.restore();
            ext.writer_region.store(writer.region, Relaxed);
            ext.host.adopt_open_files(&ext);
            let took = started.elapsed();
            ext.restore_micros
                .store(took.as_micros().max(1) as u64, Relaxed);
            ext.restore_done.store(true, Relaxed);
            log::info!(
                "buffer pool extension {}: restored in {took:?}, {} pages adopted so far",
                ext.path().display(),
                ext.counters.ext_pages_restored.load(Relaxed)
            );
        }
        // Consumes the writer: its hold on the extension ends before `done` says it stopped.
        let ext = writer.ext.clone();
        writer.run(rx);
        ext.store.leave_region();
        // Adoptions asked for and never run: nothing will run them now.
        ext.drop_chores();
        drop(ext);
        done.set();
    })
    .expect("spawn extension writer");
}

struct Writer {
    ext: Arc<Extension>,
    /// The region being filled, and how many of its bytes are written.
    region: usize,
    fill: usize,
    /// Byte offset where the previous batch ended, to count sequential writes.
    last_end: Option<u64>,
    buf: AlignedBuf,
    last_checkpoint: Instant,
    checkpoint_interval: Duration,
}

impl Writer {
    fn new(ext: Arc<Extension>) -> Self {
        Writer {
            checkpoint_interval: ext.host.checkpoint_interval(),
            ext,
            region: 0,
            fill: 0,
            last_end: None,
            buf: AlignedBuf::new(REGION_BYTES as usize),
            last_checkpoint: Instant::now(),
        }
    }

    fn room(&self) -> usize {
        REGION_BYTES as usize - self.fill
    }

    /// Writes batches until told to stop.
    fn run(mut self, rx: Receiver<ToWriter>) {
        self.fill_batches(rx);
    }

    fn fill_batches(&mut self, rx: Receiver<ToWriter>) {
        let mut batch: Vec<Staged> = Vec::new();
        loop {
            if self.ext.stopping.load(Relaxed) {
                return self.drain_at_close(&rx, batch);
            }
            self.between_batches();
            if batch.is_empty() {
                match rx.recv_timeout(POLL) {
                    Ok(ToWriter::Page(s)) => batch.push(s),
                    Ok(ToWriter::Stop) | Err(RecvTimeoutError::Disconnected) => {
                        return self.drain_at_close(&rx, batch)
                    }
                    Ok(ToWriter::Chores) | Err(RecvTimeoutError::Timeout) => continue,
                }
            }
            let mut bytes: usize = batch.iter().map(|s| s.frame.data.len()).sum();
            while bytes < self.room() {
                match rx.recv_timeout(GATHER) {
                    Ok(ToWriter::Page(s)) => {
                        bytes += s.frame.data.len();
                        batch.push(s);
                    }
                    Ok(ToWriter::Stop) => return self.drain_at_close(&rx, batch),
                    Ok(ToWriter::Chores) | Err(_) => break,
                }
            }
            self.write_batch(&mut batch);
        }
    }

    /// At a clean close (`Extension::close`): writes the pages still queued, for at most
    /// [`DRAIN_LIMIT`], so that a short-lived process's last pages are there for the next one
    /// (the checkpoint that follows lists them). Otherwise (OFF, resize, failure) they are
    /// dropped.
    fn drain_at_close(&mut self, rx: &Receiver<ToWriter>, mut batch: Vec<Staged>) {
        if !self.ext.drain_at_close.load(Relaxed) || self.ext.failed.load(Relaxed) {
            return;
        }
        let deadline = Instant::now() + DRAIN_LIMIT;
        loop {
            while let Some(message) = rx.try_recv() {
                if let ToWriter::Page(s) = message {
                    batch.push(s);
                }
            }
            if batch.is_empty() || Instant::now() >= deadline || self.ext.failed.load(Relaxed) {
                return;
            }
            self.write_batch(&mut batch);
        }
    }

    /// Adoptions asked for, and a checkpoint when one is due.
    fn between_batches(&mut self) {
        self.ext.run_chores();
        if self.last_checkpoint.elapsed() >= self.checkpoint_interval {
            self.ext.persist(true);
            self.last_checkpoint = Instant::now();
        }
    }

    /// Writes the pages of `batch` that fit in the current region; the rest stay in `batch`.
    fn write_batch(&mut self, batch: &mut Vec<Staged>) {
        let ext = self.ext.clone();
        if self.fill == 0 && !self.enter_region() {
            for s in batch.iter() {
                ext.store.unstage(s.key, s.seq);
            }
            ext.drop_admission(batch.len() as u64, || {
                "every region of the shared extension is being filled by other processes".into()
            });
            batch.clear();
            return;
        }
        if self.fill > 0 && !ext.store.holds_region() {
            // The region was taken from this writer (a shared extension's recovery): the batch
            // waits for the next region.
            self.next_region();
            return;
        }
        // Largest first: each page then starts at a multiple of its own size (or of 4 KiB).
        batch.sort_by_key(|s| std::cmp::Reverse(s.frame.data.len()));
        let mut placed = 0;
        let mut used = 0;
        while placed < batch.len() && used + batch[placed].frame.data.len() <= self.room() {
            used += batch[placed].frame.data.len();
            placed += 1;
        }
        if placed == 0 {
            // Not even the smallest page fits what is left of this region: go on to the next.
            self.next_region();
            return;
        }
        let rest = batch.split_off(placed);
        let pages = std::mem::replace(batch, rest);
        let placed = self.reserve_index(pages);
        if placed.is_empty() {
            return;
        }
        let mut written = Vec::with_capacity(placed.len());
        let mut at = 0;
        for s in &placed {
            let page = &s.frame.data;
            self.buf[at..at + page.len()].copy_from_slice(page);
            written.push(Written {
                key: s.key,
                seq: s.seq,
                offset: self.fill + at,
                len: page.len(),
                crc: page_crc(s.key.page, page),
                read: s.shared,
            });
            at += page.len();
        }
        let bytes = round_up(at, DIRECT_IO_ALIGN);
        self.buf[at..bytes].fill(0);
        let offset = self.region as u64 * REGION_BYTES + self.fill as u64;
        // The batch lands inside the region, at an O_DIRECT boundary (a shared store asserts
        // that its writer held the region: `SharedStore::index_written`).
        strict_assert!(
            self.fill + bytes <= REGION_BYTES as usize,
            "a batch past its region"
        );
        strict_assert!(offset.is_multiple_of(DIRECT_IO_ALIGN as u64));
        ext.counters.ext_outstanding_io.fetch_add(1, Relaxed);
        let res = ext.file.write_at(offset, &self.buf[..bytes]);
        ext.counters.ext_outstanding_io.fetch_sub(1, Relaxed);
        self.fill += bytes;

        if let Err(e) = res {
            for w in &written {
                ext.store.unstage(w.key, w.seq);
            }
            Counters::bump(&ext.counters.ext_io_errors);
            ext.fault(format!("write error: {e}"));
            self.last_end = None;
        } else {
            // Indexed after the bytes are written: no entry points at bytes not there.
            if !ext.store.index_written(self.region, &written) {
                // The region was taken from this writer: never write into it again.
                self.fill = REGION_BYTES as usize;
            }
            // Faults must be consecutive to disable the extension: a good write ends a streak.
            ext.consecutive_faults.store(0, Relaxed);
            let c = &ext.counters;
            c.ext_page_writes.fetch_add(placed.len() as u64, Relaxed);
            c.ext_bytes_written.fetch_add(bytes as u64, Relaxed);
            if self.last_end.is_none_or(|end| end == offset) {
                c.ext_sequential_write_pages
                    .fetch_add(placed.len() as u64, Relaxed);
            }
            self.last_end = Some((offset + bytes as u64) % ext.ring_bytes());
        }
        if self.room() < crate::extension::UNIT {
            self.next_region();
        }
    }

    fn next_region(&mut self) {
        self.ext.store.leave_region();
        self.region = (self.region + 1) % self.ext.regions;
        self.fill = 0;
        self.ext.writer_region.store(self.region, Relaxed);
    }

    /// Enters the next region, forgetting what it holds (the ring's oldest pages); false if
    /// there is none to write now.
    fn enter_region(&mut self) -> bool {
        let ext = &self.ext;
        let now = ext.now_ms();
        let Some(entered) = ext.store.enter_region(self.region) else {
            return false;
        };
        self.region = entered.region;
        ext.writer_region.store(entered.region, Relaxed);
        if entered.evicted > 0 {
            ext.counters
                .ext_page_evictions
                .fetch_add(entered.evicted as u64, Relaxed);
            let last = ext.region_last_ref[entered.region].load(Relaxed);
            Counters::average_in(&ext.counters.ext_unreferenced_ms, now.saturating_sub(last));
        }
        // A fresh region: its pages have not been referenced since they were written.
        ext.region_last_ref[entered.region].store(now, Relaxed);
        if ext.store.persist_due_at(entered.region) {
            // Listed nothing of this region (just forgotten); bounds what a restore must void.
            ext.persist(false);
            self.last_checkpoint = Instant::now();
        }
        true
    }

    /// Makes room in the index for `pages` in the current region, within the memory budget:
    /// more memory is charged if the host allows it; otherwise the oldest regions ahead of
    /// this one make way, and what still does not fit is dropped (counted and explained).
    /// Returns the pages that may be written.
    fn reserve_index(&mut self, mut pages: Vec<Staged>) -> Vec<Staged> {
        let ext = self.ext.clone();
        let regions_overhead = ext.regions as u64 * 8;
        let mut ahead = 1;
        loop {
            let Some(index_bytes) = ext.store.index_bytes_with(self.region, pages.len()) else {
                return pages; // a shared index is laid out in full, in shared memory
            };
            if ext.charge(index_bytes + regions_overhead) {
                return pages;
            }
            if ahead < ext.regions {
                // The oldest pages go first, as they would when the ring comes round.
                let r = (self.region + ahead) % ext.regions;
                let evicted = ext.store.release_region(r);
                ext.counters
                    .ext_page_evictions
                    .fetch_add(evicted as u64, Relaxed);
                ahead += 1;
                continue;
            }
            let keep = pages.len() / 2;
            let dropped = pages.split_off(keep);
            for s in &dropped {
                ext.store.unstage(s.key, s.seq);
            }
            ext.drop_admission(dropped.len() as u64, || {
                "the extension's index reached its budget (half of max server memory): pages \
                 smaller than 4 KiB need more index memory per byte cached; raise max server \
                 memory or use a smaller extension"
                    .into()
            });
            if pages.is_empty() {
                return pages;
            }
        }
    }
}
