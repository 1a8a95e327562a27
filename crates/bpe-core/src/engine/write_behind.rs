//! Write-behind: a page write held in L1 until its writer writes it back.
//!
//! Why: SQLite in rollback mode writes a page to the database file each time its own small cache
//! spills it, and a large transaction spills the same pages again and again (speedtest1 at size
//! 200: 855,951 page writes onto 53,228 distinct pages between syncs, 16 each). Written through,
//! each costs a `pwrite` and a frame replacement; written behind, each replaces the frame only,
//! and the file gets one write per page at the writer's sync or unlock.
//!
//! What keeps it safe: the caller holds the file's write lock from the first page written
//! behind until [`Engine::write_back`] returned (SQLite's EXCLUSIVE lock in rollback mode, which
//! no reader of any process gets past), and calls it before anything else may look at the file:
//! its sync, its unlock, a size query, a truncation, its close. Until then the dirty frame is
//! L1's only copy of the bytes, and the pool keeps it (see `pool/mod.rs`); the extension never
//! sees it. A crash before the write-back is a crash before the writes, which SQLite's journal
//! covers as it does any.

use super::data_path::Via;
use super::Engine;
use crate::config::L1_FRAME_OVERHEAD;
use crate::counters::Counters;
use crate::error::{Error, Result};
use crate::files::FileHandle;
use crate::page::PageKey;

/// The pages one writer wrote behind and has not written back yet. The writer owns it and must
/// hand it to [`Engine::write_back`] (or [`Engine::discard_behind`]) before it lets go of the
/// file's write lock.
#[derive(Default, Debug)]
pub struct BehindLog {
    /// The key each page was cached under when written (the write-back finds it there even if
    /// the file's key changed since).
    keys: Vec<PageKey>,
    /// At this length the keys are sorted and deduplicated, so that a transaction that spills
    /// the same pages millions of times keeps a log as long as its distinct pages, not its writes.
    compact_at: usize,
}

/// A log shorter than this is never compacted.
const LOG_COMPACT_MIN: usize = 1024;

impl BehindLog {
    fn push(&mut self, key: PageKey) {
        self.keys.push(key);
        if self.keys.len() >= self.compact_at.max(LOG_COMPACT_MIN) {
            sort_dedup(&mut self.keys);
            // Twice what is left: each compaction costs the pushes since the last one.
            self.compact_at = 2 * self.keys.len();
        }
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Pages (with repeats) written behind and not yet written back.
    pub fn len(&self) -> usize {
        self.keys.len()
    }
}

impl Engine {
    /// Writes page `page` of `file` behind: installs the bytes in L1 as a dirty frame, to reach
    /// the data file at [`Engine::write_back`]. Where write-behind is off (`Config::write_behind`),
    /// dirty frames already take their share of L1, or L1 has no room, the page is written
    /// through (as [`Engine::write_page_via`]).
    pub fn write_page_behind(
        &self,
        file: &FileHandle,
        page: u64,
        data: &[u8],
        via: Via<'_>,
        log: &mut BehindLog,
    ) -> Result<()> {
        let page_size = file.page_size();
        if data.len() != page_size {
            return Err(Error::BufferSize {
                got: data.len(),
                page_size,
            });
        }
        let charge = data.len() as u64 + L1_FRAME_OVERHEAD;
        let slot = match self.config.write_behind {
            true => self.pool.reserve_dirty(charge, page_size, self),
            false => None,
        };
        let Some(slot) = slot else {
            return self.write_page_via(file, page, data, via);
        };
        // The key stays until the write is done: see CachedFile::key_change.
        let _stable = file.key_stable();
        let key = PageKey::new(file.key(), page);
        let (ticket, _) = self.start_write(file, key);
        // No read epoch yet: until the write-back puts these bytes in the file, a shared
        // extension could not tell this copy from the file's.
        let frame = self.written_frame(file, key, data, None, true);
        self.pool.finish_write_dirty(ticket, frame, slot, self);
        Counters::bump(&self.counters.pages_written_behind);
        log.push(key);
        Ok(())
    }

    /// Writes the pages of `log` that are still dirty to the data file through `via`, in page
    /// order, one write per page however often it was written behind; each frame is clean once
    /// the file has its bytes. On an error the pages not written stay dirty and in `log`, for
    /// the next call to retry: the caller may be one whose error SQLite ignores (a file-control
    /// hint), and a later one it does not ignore (its sync, a truncation) must not find them
    /// gone. A caller that lets go of the file calls [`Engine::discard_behind`] after an error.
    pub fn write_back(&self, file: &FileHandle, log: &mut BehindLog, via: Via<'_>) -> Result<()> {
        if log.keys.is_empty() {
            return Ok(());
        }
        let mut keys = std::mem::take(&mut log.keys);
        log.compact_at = 0;
        sort_dedup(&mut keys);
        let ext = self.extension.read().clone();
        for (i, &key) in keys.iter().enumerate() {
            let Some(frame) = self.pool.peek(key).filter(|f| f.is_dirty()) else {
                continue; // truncated away, or discarded
            };
            if let Err(source) = self.write_to_file(file, key.page, &frame.data, via) {
                log.keys.extend_from_slice(&keys[i..]);
                return Err(Error::DataIo {
                    path: file.path().to_path_buf(),
                    source,
                });
            }
            Counters::bump(&self.counters.page_writes);
            // As after a write through: a shared extension is told once the file has the bytes,
            // and the frame, clean from now on, carries the epoch of its bytes, so that it is
            // offered to the extension when it leaves L1 (without it, every page a rollback-mode
            // transaction wrote would be read from the data file again after its eviction).
            if let Some(read) = ext.as_ref().and_then(|e| e.now_written(file, key)) {
                frame.written_back_under(read);
            }
            self.pool.mark_clean(&frame);
        }
        Ok(())
    }

    /// Drops the pages of `log` from L1 without writing them (the writer could not write them
    /// back, and lets go of the file): the next reads see the file as it is, as after a failed
    /// write through (SQLite's journal, still hot, rolls it back).
    pub fn discard_behind(&self, log: &mut BehindLog) {
        for key in log.keys.drain(..) {
            self.pool.discard_dirty(key);
        }
    }

    /// At process exit: writes every page still written behind through its file's own
    /// descriptor. An exit then leaves the files as stock SQLite's would, everything handed to
    /// the VFS in the file: SQLite's own protocol writes back before it relies on a page being
    /// there (its sync, its unlock), but a VFS stacked above bpe may not pass those on (SQLite's
    /// crash-test VFS simulates the disk itself and exits to crash). A SIGKILL runs no handler:
    /// there the journal covers what was not written back. Skipped if the registry is busy.
    pub fn write_back_at_exit(&self) {
        if self.pool.dirty_bytes() == 0 {
            return;
        }
        let Some(files) = self.files.try_lock().map(|f| f.handles()) else {
            return;
        };
        let mut dirty: Vec<_> = self
            .pool
            .frames()
            .into_iter()
            .filter(|f| f.is_dirty())
            .collect();
        dirty.sort_by_key(|f| (f.key.file, f.key.page));
        for frame in dirty {
            let Some(file) = files.iter().find(|f| frame.is_of(f.key_cell())) else {
                continue;
            };
            if self
                .write_to_file(file, frame.key.page, &frame.data, Via(None))
                .is_ok()
            {
                self.pool.mark_clean(&frame);
            }
        }
    }

    /// Bytes of L1 held by pages written behind and not yet written back.
    pub fn dirty_bytes(&self) -> u64 {
        self.pool.dirty_bytes()
    }
}

/// In file then page order (the write-back's order), each key once.
fn sort_dedup(keys: &mut Vec<PageKey>) {
    keys.sort_unstable_by_key(|k| (k.file, k.page));
    keys.dedup();
}
