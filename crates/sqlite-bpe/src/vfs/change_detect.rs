//! Noticing that another process changed the database file, so this process never serves a
//! stale cached page. (Another process using bpe on the same file is refused outright by the
//! core's ownership claim; this is for plain SQLite processes.)
//!
//! - Rollback journal: every writer bumps the file change counter (header bytes 24..28). At the
//!   start of each read transaction we read it from disk; a value we did not write means another
//!   process wrote, and the file's cached pages are dropped.
//! - WAL: the database file only changes when a checkpoint copies frames into it. The wal-index
//!   records how far checkpoints got (nBackfill) and the WAL's salts, which change when the WAL
//!   restarts. When they moved at the start of a read transaction and this process held neither
//!   the checkpoint nor the write lock since, someone else checkpointed: drop the cached pages.

use bpe_core::{Engine, FileHandle};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};

/// What this process knows of one database file, shared by all its connections to it.
#[derive(Default)]
pub struct InodeState {
    counter: Mutex<Option<[u8; 4]>>,
    wal_token: Mutex<Option<[u32; 3]>>,
    touched_wal: AtomicBool,
    openers: Mutex<usize>,
}

static INODES: OnceLock<Mutex<HashMap<bpe_core::FileId, Arc<InodeState>>>> = OnceLock::new();

fn inodes() -> &'static Mutex<HashMap<bpe_core::FileId, Arc<InodeState>>> {
    INODES.get_or_init(Default::default)
}

pub fn attach(file: &FileHandle) -> Arc<InodeState> {
    let mut map = inodes().lock();
    let state = map.entry(file.id).or_default().clone();
    *state.openers.lock() += 1;
    state
}

pub fn detach(file: &FileHandle, state: &InodeState) {
    let mut openers = state.openers.lock();
    *openers -= 1;
    if *openers == 0 {
        inodes().lock().remove(&file.id);
    }
}

impl InodeState {
    /// The change counter as read from disk: drops the cache if someone else changed it.
    pub fn observe_counter(&self, engine: &Engine, file: &FileHandle, counter: [u8; 4]) {
        let mut known = self.counter.lock();
        if known.is_some_and(|k| k != counter) {
            engine.invalidate_file(file);
        }
        *known = Some(counter);
    }

    /// We wrote the header: the counter in it is ours.
    pub fn wrote_counter(&self, counter: [u8; 4]) {
        *self.counter.lock() = Some(counter);
    }

    /// This process took the WAL write or checkpoint lock.
    pub fn touched_wal(&self) {
        self.touched_wal.store(true, Ordering::Release);
    }

    /// The wal-index at the start of a read transaction.
    pub fn observe_wal(&self, engine: &Engine, file: &FileHandle, token: [u32; 3]) {
        let ours = self.touched_wal.swap(false, Ordering::AcqRel);
        let mut known = self.wal_token.lock();
        if known.is_some_and(|k| k != token) && !ours {
            engine.invalidate_file(file);
        }
        *known = Some(token);
    }
}

/// Reads (salt1, salt2, nBackfill) from wal-index region 0.
///
/// # Safety
/// `region0` must be the mapping SQLite returned for region 0 (at least 136 bytes), still mapped.
pub unsafe fn wal_token(region0: *const u8) -> [u32; 3] {
    // Other processes write these words concurrently: read each atomically.
    // SAFETY: offsets are within the 32 KiB region and 4-byte aligned; the mapping is live.
    let word =
        |off: usize| unsafe { (*(region0.add(off) as *const AtomicU32)).load(Ordering::Acquire) };
    [word(32), word(36), word(96)]
}
