//! Noticing that another process changed the database file, so this process never serves a
//! stale cached page. (Another process using bpe on the same file is refused outright by the
//! core's ownership claim; this is for plain SQLite processes.)
//!
//! - Rollback journal: every writer bumps the file change counter (header bytes 24..28). At the
//!   start of each read transaction we read it from disk; a value we did not write means another
//!   process wrote, and the file's cached pages are dropped.
//! - WAL: the database file only changes when a checkpoint copies frames into it (backfill).
//!   The wal-index records how far backfill got (nBackfill) and the WAL's salts, which change when
//!   a writer restarts the WAL. We account for every change of that token at the start of each read
//!   transaction and whenever one of our connections takes or releases the wal-index write or
//!   checkpoint lock. A change is ours when our connection held the lock that makes it (backfill:
//!   the checkpoint lock; restart: the write lock); our own checkpoints write through our cache, so
//!   they need no invalidation. Any other change means another process checkpointed (or restarted
//!   a WAL that someone backfilled unseen): the file's cached pages are dropped.
//!
//!   The token is accounted per database file for the whole process, not per connection, and the
//!   lock holders are per file too: at most one connection anywhere holds each of those locks.

use bpe_core::{Engine, FileHandle};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};

/// What this process knows of one database file, shared by all its connections to it.
#[derive(Default)]
pub struct InodeState {
    counter: Mutex<Option<[u8; 4]>>,
    wal: Mutex<WalView>,
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

    /// The wal-index token at the start of a read transaction.
    pub fn observe_wal(
        &self,
        engine: &Engine,
        file: &FileHandle,
        read_token: impl FnOnce() -> WalToken,
    ) {
        if self.account_wal(read_token, None) {
            engine.invalidate_file(file);
        }
    }

    /// One of our connections took (`held` = true) or is about to release the wal-index write
    /// and/or checkpoint lock. Called while the lock is held, so no change of the kind it guards
    /// can slip between the accounting and the flag.
    pub fn wal_lock(
        &self,
        engine: &Engine,
        file: &FileHandle,
        read_token: impl FnOnce() -> WalToken,
        lock: WalLocks,
        held: bool,
    ) {
        if self.account_wal(read_token, Some((lock, held))) {
            engine.invalidate_file(file);
        }
    }

    /// Accounts the current token and, if given, sets the lock flags; true when the file's
    /// cached pages must be dropped.
    ///
    /// The token is read *under* the view's mutex. Read before it, a token can go stale while
    /// the caller waits: another connection's checkpoint may take the checkpoint lock, backfill
    /// and account the newer token in between, and the stale one would then look like a
    /// backfill nobody here made (the two stray whole-file invalidations of the TPC-C run).
    fn account_wal(
        &self,
        read_token: impl FnOnce() -> WalToken,
        lock: Option<(WalLocks, bool)>,
    ) -> bool {
        let mut wal = self.wal.lock();
        let invalidate = wal.account(read_token());
        if let Some((lock, held)) = lock {
            if lock.write {
                wal.writing = held;
            }
            if lock.checkpoint {
                wal.checkpointing = held;
            }
        }
        invalidate
    }
}

/// (salt1, salt2, nBackfill) from the wal-index.
pub type WalToken = [u32; 3];

/// Which of the wal-index locks that change the token a lock call covers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WalLocks {
    pub write: bool,
    pub checkpoint: bool,
}

/// This process's view of one database's wal-index.
#[derive(Default, Debug)]
struct WalView {
    /// The token as last accounted for.
    known: Option<WalToken>,
    /// One of our connections holds the write lock (only a writer restarts the WAL).
    writing: bool,
    /// One of our connections holds the checkpoint lock (only a checkpointer backfills).
    checkpointing: bool,
}

impl WalView {
    /// Takes `token` as the current state; true when the change since the last one was not ours
    /// and the database file may hold pages we have not seen.
    fn account(&mut self, token: WalToken) -> bool {
        let Some(known) = self.known.replace(token) else {
            return false;
        };
        if known[..2] != token[..2] {
            // A restart. Ours needs the write lock, and our writer restarts only a WAL it saw
            // fully backfilled when its read transaction began (accounted then). Another
            // process's restart may follow a backfill we never saw.
            !self.writing
        } else if known[2] != token[2] {
            !self.checkpointing
        } else {
            false
        }
    }
}

/// Reads (salt1, salt2, nBackfill) from wal-index region 0.
///
/// # Safety
/// `region0` must be the mapping SQLite returned for region 0 (at least 136 bytes), still mapped.
pub unsafe fn wal_token(region0: *const u8) -> WalToken {
    // Other processes write these words concurrently: read each atomically.
    // SAFETY: offsets are within the 32 KiB region and 4-byte aligned; the mapping is live.
    let word =
        |off: usize| unsafe { (*(region0.add(off) as *const AtomicU32)).load(Ordering::Acquire) };
    [word(32), word(36), word(96)]
}

#[cfg(test)]
mod tests {
    use super::{InodeState, WalLocks, WalView};
    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering::SeqCst};

    const SALTS: [u32; 2] = [7, 9];

    fn token(salts: [u32; 2], backfill: u32) -> [u32; 3] {
        [salts[0], salts[1], backfill]
    }

    #[test]
    fn the_first_token_and_unchanged_tokens_are_not_changes() {
        let mut wal = WalView::default();
        assert!(!wal.account(token(SALTS, 3)));
        assert!(!wal.account(token(SALTS, 3)));
    }

    #[test]
    fn backfill_is_ours_only_under_our_checkpoint_lock() {
        let mut wal = WalView::default();
        wal.account(token(SALTS, 0));
        wal.checkpointing = true;
        assert!(!wal.account(token(SALTS, 40)), "our own checkpoint");
        wal.checkpointing = false;
        wal.writing = true;
        assert!(
            wal.account(token(SALTS, 80)),
            "another process checkpointed while we held only the write lock"
        );
    }

    #[test]
    fn a_restart_is_ours_only_under_our_write_lock() {
        let mut wal = WalView::default();
        wal.account(token(SALTS, 80));
        wal.writing = true;
        assert!(
            !wal.account(token([8, 10], 0)),
            "our writer restarted the WAL"
        );
        wal.writing = false;
        assert!(
            wal.account(token([9, 11], 0)),
            "another process restarted a WAL that may have been backfilled unseen"
        );
    }

    /// One connection checkpoints in a loop (checkpoint lock, backfill, release) while two others
    /// begin read transactions: every change is ours, so none may count as another process's.
    /// Reading the token before taking the view's mutex fails this within a few thousand rounds.
    #[test]
    fn our_own_checkpoints_racing_our_readers_never_invalidate() {
        let state = InodeState::default();
        let backfill = AtomicU32::new(0);
        let read = || [7, 9, backfill.load(SeqCst)];
        let done = AtomicBool::new(false);
        let ckpt = WalLocks {
            write: false,
            checkpoint: true,
        };
        let stray = std::thread::scope(|s| {
            let readers: Vec<_> = (0..2)
                .map(|_| {
                    s.spawn(|| {
                        let mut stray = 0;
                        while !done.load(SeqCst) {
                            stray += usize::from(state.account_wal(read, None));
                        }
                        stray
                    })
                })
                .collect();
            let mut stray = 0;
            for _ in 0..200_000 {
                stray += usize::from(state.account_wal(read, Some((ckpt, true))));
                backfill.fetch_add(1, SeqCst);
                stray += usize::from(state.account_wal(read, Some((ckpt, false))));
            }
            done.store(true, SeqCst);
            stray
                + readers
                    .into_iter()
                    .map(|r| r.join().unwrap())
                    .sum::<usize>()
        });
        assert_eq!(stray, 0, "own checkpoints taken for another process's");
    }
}
