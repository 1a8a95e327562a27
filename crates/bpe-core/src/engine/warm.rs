//! What the engine does for a warm restart (see `extension/private/persist.rs`): it says which
//! files' cached pages it can vouch for when the extension checkpoints (and which are in RAM),
//! hands each file that opens to the extension for adoption of the pages a previous process
//! left, and reads the ones that were in that process's RAM back into RAM (the prewarm), so that
//! both tiers restart warm.

use super::{Engine, Via};
use crate::counters::Counters;
use crate::extension::{page_crc, Extension, Location, PageCheck, Vouched, VouchedFile};
use crate::files::{FileHandle, OpenKind};
use crate::io::FileStamp;
use crate::page::PageKey;
use crate::pool::LoadSource;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicU64, AtomicUsize};
use std::sync::Arc;
use std::time::Instant;

/// The largest prewarm request. Smaller than a ring region so that the lookups running beside
/// prewarm do not queue behind half a megabyte each on the device.
const PREWARM_SPAN_BYTES: u64 = 128 * 1024;

/// Prewarm requests in flight at once, one thread each: an SSD serves a few requests in parallel,
/// and the restarted process's queries run on an L1 that is still filling until prewarm is done.
const PREWARM_THREADS: usize = 2;

/// What the previous process had in RAM, to read back: the adopted pages that were hot,
/// cut into requests of at most one aligned window each, newest region first, taken by the
/// prewarm threads in that order; and the L1 room they may fill.
struct PrewarmPlan {
    spans: Vec<Vec<(PageKey, Location)>>,
    next: AtomicUsize,
    budget_left: AtomicU64,
    started: Instant,
}

impl PrewarmPlan {
    /// Cuts `hot` (newest region first) into windows, each in ring order.
    fn new(hot: Vec<(PageKey, Location)>, budget: u64) -> PrewarmPlan {
        let region_of = |loc: &Location| loc.offset / crate::extension::REGION_BYTES;
        let mut spans = Vec::new();
        for region in hot.chunk_by(|(_, a), (_, b)| region_of(a) == region_of(b)) {
            let mut region = region.to_vec();
            region.sort_unstable_by_key(|(_, loc)| loc.offset);
            spans.extend(
                region
                    .chunk_by(|(_, a), (_, b)| {
                        a.offset / PREWARM_SPAN_BYTES == b.offset / PREWARM_SPAN_BYTES
                    })
                    .map(<[_]>::to_vec),
            );
        }
        PrewarmPlan {
            spans,
            next: AtomicUsize::new(0),
            budget_left: AtomicU64::new(budget),
            started: Instant::now(),
        }
    }

    fn next_span(&self) -> Option<&[(PageKey, Location)]> {
        if self.budget_left.load(Relaxed) == 0 {
            return None;
        }
        self.spans
            .get(self.next.fetch_add(1, Relaxed))
            .map(Vec::as_slice)
    }

    fn spend(&self, bytes: u64) {
        let _ = self
            .budget_left
            .fetch_update(Relaxed, Relaxed, |left| Some(left.saturating_sub(bytes)));
    }

    fn stop(&self) {
        self.budget_left.store(0, Relaxed);
    }
}

impl Engine {
    /// Files with a stamp their cached pages were verified against, and not within a clock tick
    /// of a change (a coarse timestamp could not tell a later write in the same tick): (key,
    /// stamp), each stamp read before its key.
    pub(crate) fn vouched_files(&self) -> Vouched {
        let files: Vec<FileHandle> = self.files.lock().all().cloned().collect();
        let files = files
            .iter()
            .filter_map(|f| {
                if f.identity().is_snapshot() {
                    return Some(VouchedFile {
                        key: f.key(),
                        stamp: FileStamp::of_snapshot(f.identity()),
                        first_page: None,
                    });
                }
                let known = f.known_stamp().filter(|k| !k.racy)?;
                Some(VouchedFile {
                    key: f.key(),
                    stamp: known.stamp,
                    first_page: self.first_page_check(f, known.stamp),
                })
            })
            .collect();
        Vouched { files }
    }

    /// The first page's check for a checkpoint that vouches for `file` at `stamp`: from RAM if
    /// L1 holds it (after the stamp, as the key: a copy newer than the stamp can only make the
    /// adoption refuse), else as last read under that stamp, else read from the file now if it
    /// is open and still at that stamp. None: the checkpoint cannot vouch for the file's pages
    /// (see `extension/private/persist.rs`: a stamp alone never does). SQLite's own page cache
    /// often holds the header while L1 does not, so the read is needed; it happens at most once
    /// per stamp.
    pub(crate) fn first_page_check(
        &self,
        file: &FileHandle,
        stamp: FileStamp,
    ) -> Option<PageCheck> {
        let resident = self.pool.peek(PageKey::new(file.key(), 0));
        if let Some(frame) = resident.filter(|frame| frame.is_current()) {
            return Some(PageCheck {
                len: frame.data.len() as u32,
                crc: page_crc(0, &frame.data),
            });
        }
        if let Some(check) = file.first_page_under(stamp) {
            return Some(check);
        }
        file.data()?;
        let mut buf = vec![0u8; file.page_size()];
        let read = self.device_read(file, Via(None), 0, &mut buf).ok()?;
        // The bytes are the file's at `stamp` only if the stamp did not move meanwhile.
        if read != buf.len() || file.stamp_now().ok()? != stamp {
            return None;
        }
        let check = PageCheck {
            len: buf.len() as u32,
            crc: page_crc(0, &buf),
        };
        file.keep_first_page(stamp, check);
        Some(check)
    }

    /// Which of `keys` are in L1 now (no access recorded).
    pub(crate) fn resident(&self, keys: &[PageKey]) -> Vec<bool> {
        keys.iter().map(|&k| self.pool.contains(k)).collect()
    }

    /// A file was opened: if the extension has restored pages of it, adoption is queued for
    /// the extension's writer (the open does not wait for the check's read of the first page).
    pub(super) fn offer_for_adoption(self: &Arc<Self>, file: &FileHandle, kind: OpenKind) {
        if kind == OpenKind::Shared {
            return;
        }
        let Some(ext) = self.current_extension() else {
            return; // an extension being enabled offers every open file once it is in place
        };
        if !ext.has_restored(file.identity()) {
            return;
        }
        self.queue_adoption(&ext, vec![file.clone()]);
    }

    /// Queues the adoption of `files` on `ext`'s writer. The chore holds neither strongly: it
    /// lives in the extension's own queue, and a strong hold would keep both alive for good.
    fn queue_adoption(&self, ext: &Arc<Extension>, files: Vec<FileHandle>) {
        let (engine, target) = (self.me.clone(), Arc::downgrade(ext));
        ext.request_adoption(move || {
            if let (Some(engine), Some(target)) = (engine.upgrade(), target.upgrade()) {
                files.iter().for_each(|f| engine.adopt(&target, f));
            }
        });
    }

    /// Once a restoring extension is in place: every file open now is offered to it (again).
    /// A file opened after the writer listed the open files and before the extension was in
    /// place would otherwise wait for an adoption nobody asked for.
    pub(super) fn offer_open_files(&self, ext: &Arc<Extension>) {
        if ext.restore_settled() && !ext.has_waiting_files() {
            return;
        }
        self.queue_adoption(ext, self.open_files_now());
    }

    fn open_files_now(&self) -> Vec<FileHandle> {
        self.files.lock().open_files().cloned().collect()
    }

    /// Every file open now is offered to a freshly restored extension (on its writer's thread).
    pub(super) fn adopt_open_files(&self, ext: &Arc<Extension>) {
        for file in &self.open_files_now() {
            self.adopt(ext, file);
        }
    }

    /// Adoption proper, with every write to the file held off: a write in flight has reached
    /// the file (and its stamp) before the check, and one that starts after finds the adopted
    /// copies to invalidate.
    fn adopt(&self, ext: &Arc<Extension>, file: &FileHandle) {
        let snapshot = file.identity().is_snapshot();
        if !ext.has_restored(file.identity()) || (file.data().is_none() && !snapshot) {
            return; // a closed file's pages wait: its next open offers it again
        }
        let hot = {
            let _writes = file.writes_held_off();
            let now = match self.faults.take_unmoved_stamp() {
                true => ext.recorded_stamp(file.identity()),
                false if snapshot => Some(FileStamp::of_snapshot(file.identity())),
                false => file.stamp_now().ok(),
            };
            ext.adopt(file.key(), file.identity(), now, |len: usize| {
                let mut buf = vec![0u8; len];
                match self.device_read(file, Via(None), 0, &mut buf) {
                    Ok(n) if n == len => Some(page_crc(0, &buf)),
                    _ => None,
                }
            })
        };
        if hot.is_empty() {
            return;
        }
        let budget = (self.pool.target_bytes() / 10 * 9).saturating_sub(self.pool.used_bytes());
        let plan = Arc::new(PrewarmPlan::new(hot, budget));
        for _ in 0..PREWARM_THREADS {
            // Counted as a background read: `wait_for_readahead` (and the invariant checks)
            // wait for it. Counted done once it let go of the engine (or was never spawned).
            let counted = self.background.count_job();
            let (engine, ext, file, plan) =
                (self.me.clone(), ext.clone(), file.clone(), plan.clone());
            let spawned = crate::sync::spawn("bpe-prewarm", move || {
                if let Some(engine) = engine.upgrade() {
                    engine.prewarm(&ext, &file, &plan);
                    drop((engine, ext, file, plan));
                    drop(counted);
                }
            });
            if let Err(e) = spawned {
                log::warn!("buffer pool extension: no prewarm thread: {e}");
            }
        }
    }

    /// One prewarm thread: takes the plan's next window until none is left, the budget is
    /// spent or the extension cannot be read. Best effort: a page cached or in flight already,
    /// of another size now, or whose copy fails its check, is skipped.
    fn prewarm(&self, ext: &Extension, file: &FileHandle, plan: &PrewarmPlan) {
        let page_size = file.page_size();
        let mut fetched = 0;
        while let Some(span) = plan.next_span() {
            let Some(pages) = self.prewarm_span(ext, file, span, page_size, plan.started) else {
                plan.stop();
                break;
            };
            fetched += pages;
            plan.spend(pages * page_size as u64);
        }
        Counters::add(&self.counters.readahead_pages, fetched);
        self.counters
            .ext_pages_prewarmed
            .fetch_add(fetched, Relaxed);
        log::info!(
            "buffer pool extension: {fetched} pages read back into RAM by one prewarm thread in {:?}",
            plan.started.elapsed()
        );
    }

    /// One prewarm request: the pages of `span` (one aligned window of the ring) not yet in
    /// RAM, read with one request and installed. Returns the pages installed, or None when the
    /// extension cannot be read or is no longer in place (prewarm stops).
    fn prewarm_span(
        &self,
        ext: &Extension,
        file: &FileHandle,
        span: &[(PageKey, Location)],
        page_size: usize,
        started: Instant,
    ) -> Option<u64> {
        let tickets: Vec<_> = span
            .iter()
            .filter(|(_, loc)| loc.len == page_size)
            .filter_map(|&(key, loc)| self.pool.try_prefetch(key).map(|t| (t, loc)))
            .collect();
        // Only from the extension in place: once it is unplugged, writes no longer void its
        // entries. Checked after the tickets are taken, as a miss does (`load`): a write that
        // went past this extension happened before, and its page is not ours.
        if !self
            .current_extension()
            .is_some_and(|c| std::ptr::eq(Arc::as_ptr(&c), ext))
        {
            tickets.into_iter().for_each(|(t, _)| self.pool.abort(t));
            return None;
        }
        let Some(lo) = tickets.iter().map(|(_, l)| l.offset).min() else {
            return Some(0);
        };
        let hi = tickets
            .iter()
            .map(|(_, l)| l.offset + l.len as u64)
            .max()
            .unwrap_or(lo);
        let Some((block, skip)) = ext.read_span(lo, (hi - lo) as usize) else {
            tickets.into_iter().for_each(|(t, _)| self.pool.abort(t));
            return None;
        };
        let mut fetched = 0;
        for (ticket, loc) in tickets {
            let at = skip + (loc.offset - lo) as usize;
            let bytes = &block[at..at + loc.len];
            if ext.verified(ticket.key, loc, bytes) {
                let frame = self.frame(file, ticket.key, bytes, started, true, None);
                self.pool
                    .finish_load(ticket, frame, LoadSource::Extension, self);
                fetched += 1;
            } else {
                self.pool.abort(ticket);
            }
        }
        Some(fetched)
    }

    /// At process exit: a last checkpoint, and the file stays for the next process. Skipped if
    /// an operator action holds the extension at that moment.
    pub fn close_extension_at_exit(&self) {
        if let Some(ext) = self.extension.try_read().and_then(|e| e.clone()) {
            ext.close(self.vouched_files(), &|keys| self.resident(keys));
        }
    }
}
