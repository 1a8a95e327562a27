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
//! while it changes (see `persist.rs`).

use super::shared::{Admission, Claim};
use super::{page_crc, Extension, IndexStore, Staged, ToWriter, REGION_BYTES};
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
        let claim = writer.run(rx);
        if let (Some(s), Some(c)) = (ext.shared(), claim) {
            s.seal(c);
        }
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
    /// The region claimed in a shared extension (the ring is everyone's: see `shared`).
    claim: Option<Claim>,
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
            claim: None,
        }
    }

    fn room(&self) -> usize {
        REGION_BYTES as usize - self.fill
    }

    /// Writes batches until told to stop; returns the shared region it still holds.
    fn run(mut self, rx: Receiver<ToWriter>) -> Option<Claim> {
        self.fill_batches(rx);
        self.claim
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
            if self.ext.is_shared() {
                // Its index lives on in shared memory; what a checkpoint's file list does
                // for a private one, vouching does for it.
                self.ext.vouch_shared(&self.ext.host.vouched_files());
            } else {
                self.ext.checkpoint_if_changed();
            }
            self.last_checkpoint = Instant::now();
        }
    }

    /// Writes the pages of `batch` that fit in the current region; the rest stay in `batch`.
    fn write_batch(&mut self, batch: &mut Vec<Staged>) {
        let ext = self.ext.clone();
        if self.fill == 0 {
            self.enter_region();
        }
        if ext.is_shared() && self.claim.is_none() {
            let mut t = ext.tables.write();
            for s in batch.iter() {
                if t.staged.get(&s.key) == Some(&s.seq) {
                    t.staged.remove(&s.key);
                }
            }
            drop(t);
            ext.drop_admission(batch.len() as u64, || {
                "every region of the shared extension is being filled by other processes".into()
            });
            batch.clear();
            return;
        }
        if let (Some(index), Some(claim), true) = (ext.shared(), self.claim, self.fill > 0) {
            // A recovery since the last batch voided the claim, and another process may have
            // claimed the region and filled it since: never write into it again (issue 27,
            // item 6). The batch waits for the next region. (A recovery between this check and
            // the write is still possible: the reads' crc check makes that a miss.)
            if !index.holds_claim(claim) {
                self.claim = None;
                self.next_region();
                return;
            }
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
        let mut offsets = Vec::with_capacity(placed.len());
        let mut crcs = Vec::with_capacity(placed.len());
        let mut at = 0;
        for s in &placed {
            let page = &s.frame.data;
            self.buf[at..at + page.len()].copy_from_slice(page);
            crcs.push(page_crc(s.key.page, page));
            offsets.push(self.fill + at);
            at += page.len();
        }
        let bytes = round_up(at, DIRECT_IO_ALIGN);
        self.buf[at..bytes].fill(0);
        let offset = self.region as u64 * REGION_BYTES + self.fill as u64;
        // The batch lands inside the region, at an O_DIRECT boundary, and a shared extension's
        // writer writes only into a region it holds (issue 27, item 6).
        strict_assert!(
            self.fill + bytes <= REGION_BYTES as usize,
            "a batch past its region"
        );
        strict_assert!(offset.is_multiple_of(DIRECT_IO_ALIGN as u64));
        strict_assert!(
            !ext.is_shared() || self.claim.is_some(),
            "a write without a claim"
        );
        ext.counters.ext_outstanding_io.fetch_add(1, Relaxed);
        let res = ext.file.write_at(offset, &self.buf[..bytes]);
        ext.counters.ext_outstanding_io.fetch_sub(1, Relaxed);
        self.fill += bytes;

        let mut t = ext.tables.write();
        if let Err(e) = res {
            for s in &placed {
                if t.staged.get(&s.key) == Some(&s.seq) {
                    t.staged.remove(&s.key);
                }
            }
            drop(t);
            Counters::bump(&ext.counters.ext_io_errors);
            ext.fault(format!("write error: {e}"));
            self.last_end = None;
        } else {
            let mut shared = Vec::new();
            if !ext.is_shared() {
                t.index.prepare(self.region, placed.len());
            }
            for (i, s) in placed.iter().enumerate() {
                if t.staged.get(&s.key) == Some(&s.seq) {
                    t.staged.remove(&s.key);
                    let len = s.frame.data.len();
                    match s.shared {
                        Some(read) => shared.push(Admission {
                            file: read.file,
                            page: s.key.page,
                            offset: offsets[i],
                            len,
                            crc: crcs[i],
                            epoch: read.epoch,
                        }),
                        None => t.index.insert(s.key, self.region, offsets[i], len, crcs[i]),
                    }
                }
            }
            drop(t);
            if let (Some(index), Some(claim)) = (ext.shared(), self.claim) {
                // Published after the bytes are written: no entry points at bytes not there.
                if index.publish(claim, &shared).is_none() {
                    // The claim was voided (a recovery): never write into the region again.
                    self.claim = None;
                    self.fill = REGION_BYTES as usize;
                }
            }
            ext.index_changed.store(true, Relaxed);
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
        if let (Some(s), Some(c)) = (self.ext.shared(), self.claim.take()) {
            s.seal(c);
        }
        self.region = (self.region + 1) % self.ext.regions;
        self.fill = 0;
        self.ext.writer_region.store(self.region, Relaxed);
    }

    /// Forgets what the region about to be overwritten holds (the ring's oldest pages).
    fn enter_region(&mut self) {
        let ext = &self.ext;
        let now = ext.now_ms();
        if let Some(s) = ext.shared() {
            // The ring is everyone's: the next region free of other live writers.
            self.claim = s.claim_region();
            if let Some(c) = self.claim {
                self.region = c.region;
                ext.writer_region.store(c.region, Relaxed);
                ext.counters
                    .ext_page_evictions
                    .fetch_add(c.evicted as u64, Relaxed);
                ext.region_last_ref[c.region].store(now, Relaxed);
            }
            return;
        }
        let evicted = {
            let mut t = ext.tables.write();
            t.restored.overwrite(self.region);
            ext.waiting_files.store(t.restored.files_waiting(), Relaxed);
            t.index.clear_region(self.region)
        };
        if evicted > 0 {
            ext.counters
                .ext_page_evictions
                .fetch_add(evicted as u64, Relaxed);
            let last = ext.region_last_ref[self.region].load(Relaxed);
            Counters::average_in(&ext.counters.ext_unreferenced_ms, now.saturating_sub(last));
        }
        // A fresh region: its pages have not been referenced since they were written.
        ext.region_last_ref[self.region].store(now, Relaxed);
        if ext.checkpoint_due_at(self.region) {
            // Listed nothing of this region (just forgotten); bounds what a restore must void.
            ext.checkpoint_files(ext.host.vouched_files(), &|keys| ext.host.resident(keys));
            self.last_checkpoint = Instant::now();
        }
    }

    /// Makes room in the index for `pages` in the current region, within the memory budget:
    /// more memory is charged if the host allows it; otherwise the oldest regions ahead of
    /// this one make way, and what still does not fit is dropped (counted and explained).
    /// Returns the pages that may be written.
    fn reserve_index(&mut self, mut pages: Vec<Staged>) -> Vec<Staged> {
        let ext = self.ext.clone();
        if ext.is_shared() {
            return pages; // the shared index is laid out in full, in shared memory
        }
        let regions_overhead = ext.regions as u64 * 8;
        let mut ahead = 1;
        loop {
            let needed = {
                let t = ext.tables.read();
                t.index.bytes_after_prepare(self.region, pages.len())
                    + regions_overhead
                    + t.restored.bytes()
            };
            if ext.charge(needed) {
                return pages;
            }
            if ahead < ext.regions {
                // The oldest pages go first, as they would when the ring comes round.
                let r = (self.region + ahead) % ext.regions;
                let evicted = ext.tables.write().index.release_region(r);
                ext.counters
                    .ext_page_evictions
                    .fetch_add(evicted as u64, Relaxed);
                ahead += 1;
                continue;
            }
            let keep = pages.len() / 2;
            let dropped = pages.split_off(keep);
            let mut t = ext.tables.write();
            for s in &dropped {
                if t.staged.get(&s.key) == Some(&s.seq) {
                    t.staged.remove(&s.key);
                }
            }
            drop(t);
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
