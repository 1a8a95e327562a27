//! What the engine does for a warm restart (see `extension/persist.rs`): it says which files'
//! cached pages it can vouch for when the extension checkpoints (and which of them are in RAM),
//! hands each file that opens to the extension for adoption of the pages a previous process
//! left, and reads the ones that were in that process's RAM back into RAM (the prewarm), so that
//! both tiers restart warm.

use super::{Engine, Via};
use crate::counters::Counters;
use crate::extension::{page_crc, Extension, Location, Vouched};
use crate::files::{FileHandle, OpenKind};
use crate::page::PageKey;
use crate::pool::LoadSource;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Instant;

/// The largest prewarm request. Smaller than a ring region so that the lookups running beside
/// prewarm do not queue behind half a megabyte each on the device.
const PREWARM_SPAN_BYTES: u64 = 128 * 1024;

impl Engine {
    /// Files with a stamp their cached pages were verified against, and not within a clock tick
    /// of a change (a coarse timestamp could not tell a later write in the same tick): (key,
    /// stamp), each stamp read before its key.
    pub(crate) fn vouched_files(&self) -> Vouched {
        let files: Vec<FileHandle> = self.files.lock().all().cloned().collect();
        let files = files
            .iter()
            .filter_map(|f| {
                let known = f.known_stamp().filter(|k| !k.racy)?;
                Some((f.key(), known.stamp))
            })
            .collect();
        Vouched { files }
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
            return;
        };
        if !ext.has_restored(file.identity()) {
            return;
        }
        let (engine, file, target) = (Arc::downgrade(self), file.clone(), ext.clone());
        ext.request_adoption(move || {
            if let Some(engine) = engine.upgrade() {
                engine.adopt(&target, &file);
            }
        });
    }

    /// Every file open now is offered to a freshly restored extension (on its writer's thread).
    pub(super) fn adopt_open_files(&self, ext: &Arc<Extension>) {
        let open: Vec<FileHandle> = self.files.lock().open_files().cloned().collect();
        for file in &open {
            self.adopt(ext, file);
        }
    }

    /// Adoption proper, with every write to the file held off: a write in flight has reached
    /// the file (and its stamp) before the check, and one that starts after finds the adopted
    /// copies to invalidate.
    fn adopt(&self, ext: &Arc<Extension>, file: &FileHandle) {
        if !ext.has_restored(file.identity()) {
            return;
        }
        let hot = {
            let _writes = file.writes_held_off();
            let now = file.stamp_now().ok();
            ext.adopt(file.key(), now, |len: usize| {
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
        // Counted as a readahead job: `wait_for_readahead` (and the invariant checks) wait for it.
        self.readahead_jobs.fetch_add(1, Relaxed);
        let (engine, ext, file) = (self.me.clone(), ext.clone(), file.clone());
        let spawned = crate::sync::spawn("bpe-prewarm", move || {
            if let Some(engine) = engine.upgrade() {
                let jobs_left = engine.readahead_jobs.clone();
                engine.prewarm(&ext, &file, hot);
                drop((engine, ext, file));
                jobs_left.fetch_sub(1, Relaxed);
            }
        });
        if let Err(e) = spawned {
            self.readahead_jobs.fetch_sub(1, Relaxed);
            log::warn!("buffer pool extension: no prewarm thread: {e}");
        }
    }

    /// Reads the adopted pages that were in the previous process's RAM (`hot`, newest region
    /// first) back into RAM, as readahead does: one request per 128 KiB window of a region, installed as
    /// prefetched frames (their first read is not a re-reference), up to nine tenths of what
    /// L1 has free, so that the queries running meanwhile keep room. Best effort: a page cached
    /// or in flight already, of another size now, or whose copy fails its check, is skipped.
    fn prewarm(&self, ext: &Extension, file: &FileHandle, hot: Vec<(PageKey, Location)>) {
        let started = Instant::now();
        let page_size = file.page_size();
        let budget = (self.pool.target_bytes() / 10 * 9).saturating_sub(self.pool.used_bytes());
        let region_of = |loc: &Location| loc.offset / crate::extension::REGION_BYTES;
        let (mut spent, mut fetched) = (0u64, 0u64);
        let mut rest = &hot[..];
        while let Some((_, first)) = rest.first() {
            let n = rest
                .iter()
                .take_while(|(_, l)| region_of(l) == region_of(first))
                .count();
            let (region, tail) = rest.split_at(n);
            rest = tail;
            let mut region = region.to_vec();
            region.sort_unstable_by_key(|(_, loc)| loc.offset);
            for chunk in region.chunk_by(|(_, a), (_, b)| {
                b.offset / PREWARM_SPAN_BYTES == a.offset / PREWARM_SPAN_BYTES
            }) {
                if spent >= budget {
                    break;
                }
                let Some(got) = self.prewarm_span(ext, file, chunk, page_size, started) else {
                    break;
                };
                fetched += got.0;
                spent += got.1;
            }
            if spent >= budget {
                break;
            }
        }
        Counters::add(&self.counters.readahead_pages, fetched);
        self.counters
            .ext_pages_prewarmed
            .fetch_add(fetched, Relaxed);
        log::info!(
            "buffer pool extension: {fetched} pages read back into RAM in {:?}",
            started.elapsed()
        );
    }

    /// One prewarm request: the pages of `span` (one aligned window of the ring) not yet in
    /// RAM, read with one request and installed. Returns (pages, bytes) installed, or None
    /// when the extension cannot be read (prewarm stops).
    fn prewarm_span(
        &self,
        ext: &Extension,
        file: &FileHandle,
        span: &[(PageKey, Location)],
        page_size: usize,
        started: Instant,
    ) -> Option<(u64, u64)> {
        let (mut fetched, mut spent) = (0u64, 0u64);
        {
            let tickets: Vec<_> = span
                .iter()
                .filter(|(_, loc)| loc.len == page_size)
                .filter_map(|&(key, loc)| self.pool.try_prefetch(key).map(|t| (t, loc)))
                .collect();
            let Some(lo) = tickets.iter().map(|(_, l)| l.offset).min() else {
                return Some((0, 0));
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
            for (ticket, loc) in tickets {
                let at = skip + (loc.offset - lo) as usize;
                let bytes = &block[at..at + loc.len];
                if ext.verified(ticket.key, loc, bytes) {
                    let frame = self.frame(file, ticket.key, bytes, started, true);
                    self.pool
                        .finish_load(ticket, frame, LoadSource::Extension, self);
                    fetched += 1;
                    spent += loc.len as u64;
                } else {
                    self.pool.abort(ticket);
                }
            }
        }
        Some((fetched, spent))
    }

    /// At process exit: a last checkpoint, and the file stays for the next process. Skipped if
    /// an operator action holds the extension at that moment.
    pub fn close_extension_at_exit(&self) {
        if let Some(ext) = self.extension.try_read().and_then(|e| e.clone()) {
            ext.close(self.vouched_files(), &|keys| self.resident(keys));
        }
    }
}
