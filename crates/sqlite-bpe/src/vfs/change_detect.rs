//! Noticing that the database file changed under this process's cache, so that no connection
//! is ever served a stale page: at the start of every read transaction, with no device round
//! trip when nothing changed.
//!
//! Three signals, all in memory or one syscall away:
//!
//! - **Rollback journal**: every committing writer bumps the file change counter (header bytes
//!   24..40, as SQLite's pager compares them). The header is read through SQLite's own buffered
//!   descriptor: on a local file system the OS page cache is coherent with every writer, so the
//!   read costs no device I/O when nothing changed, and this process's O_DIRECT reads never
//!   evict it (after our syncs we drop the rest of the file from the page cache, not its first
//!   block). A counter we did not write means another process committed.
//! - **WAL**: the database file changes only at checkpoints (backfill). The wal-index records how
//!   far backfill got (nBackfill) and the WAL's salts, which change when a writer restarts the
//!   WAL. Every change of that token is accounted, at the start of each read transaction and
//!   whenever one of our connections takes or releases the wal-index write or checkpoint lock; a
//!   change is ours when our connection held the lock that makes it (backfill: the checkpoint
//!   lock; restart: the write lock). Our checkpoints write through the cache. Any other change
//!   means another process checkpointed.
//! - **The file's stamp** (identity, size, mtime and ctime to the nanosecond; one fstat): any
//!   write changes it, including writes outside SQLite's protocol (a backup restored with `cp`
//!   over the file, a patch with `dd`). We accept the new stamp after our own writes, before
//!   releasing the lock they were made under, so a changed stamp means another writer. In WAL
//!   mode a stamp change while frames wait for a checkpoint may be a checkpoint in progress in
//!   another process (it updates nBackfill only when done): we wait for the wal-index to say.
//!
//! Another process's checkpoint forgets just the pages it backfilled: the wal-index lists the
//! page of every frame. A change we cannot attribute empties the file's cache (a new key: O(1),
//! see bpe-core's page.rs). The per-file state lives with the core's file entry, across closes and reopens;
//! while no connection of ours has the file open, the registry compares the stamp at the reopen.
//!
//! What no check can catch (docs/SQLITE.md): a change outside SQLite's protocol made while one
//! of our connections is inside its own write transaction on the file, or that restores the
//! stamp (size and both times) exactly; on kernels before 6.13 (coarse timestamps), one made
//! within the same clock tick as our own last write; and on file systems whose page cache is not
//! coherent across clients (NFS), anything another machine writes.

use super::peer_log::{Explained, PeerLog};
use bpe_core::sync::{Mutex, Rank};
use bpe_core::FileStamp;
use bpe_core::{Engine, FileHandle, OpenKind};
use std::sync::atomic::{AtomicU32, Ordering};

/// What this process knows of one database file, shared by all its connections to it.
pub struct FileWatch {
    state: Mutex<Watch>,
}

impl Default for FileWatch {
    fn default() -> Self {
        FileWatch {
            state: Mutex::new(Rank::FileState, Watch::default()),
        }
    }
}

#[derive(Default)]
struct Watch {
    /// Header bytes 24..40 as last read or written by us.
    header: Option<[u8; 16]>,
    wal: WalView,
    /// Opened again after a time with no connection of ours on it, with a stamp that could not
    /// vouch for the WAL alone (see `opened`).
    reopened_racy: bool,
    /// The bpe processes' commit log (rollback mode), once mapped, and where we read it up to:
    /// (epoch, sequence number). See peer_log.rs.
    log: Option<PeerLog>,
    log_pos: Option<(u64, u64)>,
}

/// The change counter in header bytes 24..40.
fn counter(header: &[u8; 16]) -> u32 {
    u32::from_be_bytes(header[..4].try_into().expect("4 bytes"))
}

impl Watch {
    /// The commit log, mapped on first use (None where it cannot be).
    fn log(&mut self, file: &FileHandle) -> Option<&PeerLog> {
        if self.log.is_none() {
            self.log = PeerLog::open(file.identity());
        }
        self.log.as_ref()
    }

    /// What the log says changed since our last look, with the counter going from `known` to
    /// `now`; and our position moves to its head.
    fn explain(&mut self, file: &FileHandle, known: u32, now: u32) -> Explained {
        let pos = self.log_pos;
        let Some(log) = self.log(file) else {
            return Explained::Unknown;
        };
        let (epoch, head) = (log.epoch(), log.head());
        let explained = match pos {
            Some((e, from)) if e == epoch => log.explain(from, head, known, now),
            _ => Explained::Unknown,
        };
        self.log_pos = Some((epoch, head));
        explained
    }
}

/// (salt1, salt2, nBackfill, mxFrame) from the wal-index.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WalToken {
    pub salts: [u32; 2],
    pub backfill: u32,
    pub max_frame: u32,
}

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
    /// Writes to the database file by our connections, and their count when we took the
    /// checkpoint lock: holding the lock is not writing (a superlock holds every lock while
    /// another tool replaces the files), so a stamp change is ours only if we wrote.
    own_writes: u64,
    writes_at_checkpoint: u64,
}

/// What changed in the wal-index since it was last accounted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum WalChange {
    /// Nothing, or only what our own connections did.
    None,
    /// Another process checkpointed frames (from, to] into the database file.
    Backfill { from: u32, to: u32 },
    /// Another process restarted the WAL: what was backfilled before is unknown.
    Restart,
}

impl WalView {
    /// Takes `token` as the current state and says what changed that was not ours (and so may
    /// have put pages in the database file that we have not seen).
    fn account(&mut self, token: WalToken) -> WalChange {
        let Some(known) = self.known.replace(token) else {
            return WalChange::None;
        };
        if known.salts != token.salts {
            // A restart. Ours needs the write lock, and our writer restarts only a WAL it saw
            // fully backfilled when its read transaction began (accounted then). Another
            // process's restart may follow a backfill we never saw, unless we saw the old WAL
            // fully backfilled and this is the very next WAL (a restart adds one to salt-1,
            // big-endian): then the file changed by exactly what the new WAL backfilled.
            let next = u32::from_be(token.salts[0]) == u32::from_be(known.salts[0]).wrapping_add(1);
            if self.writing {
                WalChange::None
            } else if known.backfill == known.max_frame && next {
                WalChange::Backfill {
                    from: 0,
                    to: token.backfill,
                }
            } else {
                WalChange::Restart
            }
        } else if known.backfill != token.backfill && !self.checkpointing {
            if token.backfill > known.backfill {
                WalChange::Backfill {
                    from: known.backfill,
                    to: token.backfill,
                }
            } else {
                WalChange::Restart
            }
        } else {
            WalChange::None
        }
    }
}

/// The pages of WAL frames (from, to], read from the wal-index, if they can be (see
/// `vfs::file::Conn::wal_frame_pages`); None means: forget the whole file.
pub type FramePages<'a> = &'a dyn Fn(u32, u32, [u32; 2]) -> Option<Vec<u64>>;

/// Forgets what another process's WAL change put in the database file: the backfilled pages
/// one by one where the wal-index still lists them, else the whole file.
fn forget(
    engine: &Engine,
    file: &FileHandle,
    change: WalChange,
    salts: [u32; 2],
    pages: FramePages<'_>,
) {
    match change {
        WalChange::None => {}
        WalChange::Backfill { from, to } if to <= from => {}
        WalChange::Backfill { from, to } => match pages(from, to, salts) {
            Some(pages) => engine.forget_pages(file, &pages),
            None => engine.invalidate_file(file),
        },
        WalChange::Restart => engine.invalidate_file(file),
    }
}

impl FileWatch {
    /// A connection opened the file: `kind` says what the registry found.
    pub fn opened(&self, kind: OpenKind) {
        let mut w = self.state.lock();
        match kind {
            OpenKind::New | OpenKind::Shared => {}
            OpenKind::Reopened { changed, racy } => {
                // While nobody here had it open, nothing was accounted: the WAL may have been
                // deleted and created anew (new salts, unrelated nBackfill). The registry
                // compared the stamp: if the file changed, its pages are gone already; if not,
                // the database file holds what we cached, and the next token starts afresh.
                w.wal.known = None;
                if changed {
                    w.header = None;
                }
                w.reopened_racy = racy && !changed;
            }
        }
    }

    /// The last connection of this process to the file closed: the commit log is of no use
    /// until a reopen (which checks the stamp first), and is let go.
    pub fn closed(&self) {
        let mut w = self.state.lock();
        w.log = None;
        w.log_pos = None;
    }

    /// A read transaction begins in rollback mode (or in WAL mode without a wal-index mapped,
    /// as with `readonly_shm`): `header` is bytes 24..40 read just now, `stamp` the file's stamp.
    pub fn begin_read(
        &self,
        engine: &Engine,
        file: &FileHandle,
        header: Option<[u8; 16]>,
        stamp: Option<FileStamp>,
    ) {
        let mut w = self.state.lock();
        let counter_moved = matches!((w.header, header), (Some(a), Some(b)) if a != b);
        let stamp_moved = stamp.is_some_and(|s| file.known_stamp().is_none_or(|k| k.stamp != s));
        if let (true, Some(known), Some(now)) = (counter_moved, w.header, header) {
            // Another process committed: bpe peers say which pages in their shared log.
            match w.explain(file, counter(&known), counter(&now)) {
                Explained::Pages {
                    pages,
                    truncated_to,
                } => {
                    if let Some(t) = truncated_to {
                        engine.truncated(file, t * file.page_size() as u64);
                    }
                    engine.forget_pages(file, &pages);
                }
                Explained::Unknown => engine.invalidate_file(file),
            }
        } else if stamp_moved {
            engine.invalidate_file(file);
        }
        if header.is_some() {
            w.header = header;
            if w.log_pos.is_none() {
                // From now on, commits of other bpe processes are read from the log. (No
                // process can log a commit while we hold the shared lock: the head matches the
                // counter just read.)
                if let Some(log) = w.log(file) {
                    w.log_pos = Some((log.epoch(), log.head()));
                }
            }
        }
        if let Some(s) = stamp {
            file.accept_stamp(s);
        }
        w.reopened_racy = false;
    }

    /// A read transaction begins in WAL mode (a read mark was just locked): `read_token` reads
    /// the wal-index now, under our lock (read before it, a token can go stale while we wait,
    /// behind another connection's checkpoint that backfilled and accounted the newer one, and
    /// then look like a foreign backfill: the two stray invalidations of a TPC-C run).
    pub fn begin_read_wal(
        &self,
        engine: &Engine,
        file: &FileHandle,
        read_token: impl FnOnce() -> WalToken,
        pages: FramePages<'_>,
        stamp: Option<FileStamp>,
    ) {
        let mut w = self.state.lock();
        let token = read_token();
        let change = w.wal.account(token);
        let mut invalidate = false;
        if std::mem::take(&mut w.reopened_racy) {
            // The stamp compared at the reopen was taken within a clock tick of a write: on a
            // kernel with coarse timestamps a foreign checkpoint in that tick leaves it equal.
            invalidate = true;
        }
        let stamp_moved = stamp.is_some_and(|s| file.known_stamp().is_none_or(|k| k.stamp != s));
        let accept = if invalidate || change != WalChange::None {
            forget(engine, file, change, token.salts, pages);
            true
        } else if !stamp_moved || w.wal.checkpointing {
            // Our own checkpoint writes through the cache; it accepts the stamp when it ends.
            false
        } else if token.backfill < token.max_frame {
            // Frames wait for a checkpoint: the change may be one in progress elsewhere, which
            // says so in nBackfill when it is done. Pages it is writing are in the WAL for every
            // reader until then.
            false
        } else {
            // Nothing to checkpoint, yet the file changed: a write outside SQLite's protocol.
            invalidate = true;
            true
        };
        if invalidate {
            engine.invalidate_file(file);
        }
        if let (true, Some(s)) = (accept, stamp) {
            file.accept_stamp(s);
        }
    }

    /// One of our connections took (`held` = true) or is about to release the wal-index write
    /// and/or checkpoint lock. Called while the lock is held, so no change of the kind it guards
    /// can slip between the accounting and the flag. Releasing the checkpoint lock accepts the
    /// file's stamp (our checkpoint's writes).
    pub fn wal_lock(
        &self,
        engine: &Engine,
        file: &FileHandle,
        read_token: impl FnOnce() -> WalToken,
        pages: FramePages<'_>,
        lock: WalLocks,
        held: bool,
    ) {
        let mut w = self.state.lock();
        let token = read_token();
        let change = w.wal.account(token);
        forget(engine, file, change, token.salts, pages);
        if lock.write {
            w.wal.writing = held;
        }
        if lock.checkpoint {
            w.wal.checkpointing = held;
            if held {
                w.wal.writes_at_checkpoint = w.wal.own_writes;
            } else if let Ok(s) = file.stamp_now() {
                let moved = file.known_stamp().is_none_or(|k| k.stamp != s);
                if moved && w.wal.own_writes == w.wal.writes_at_checkpoint {
                    // The file changed while we held the lock, but not by our writes.
                    engine.invalidate_file(file);
                }
                file.accept_stamp(s);
            }
        }
    }

    /// One of our connections wrote the database file (a page, or a truncation).
    pub fn wrote_file(&self) {
        self.state.lock().wal.own_writes += 1;
    }

    /// We wrote the header: the counter in it is ours.
    pub fn wrote_header(&self, header: [u8; 16]) {
        self.state.lock().header = Some(header);
    }

    /// The change counter as we know it (the start of a write transaction).
    pub fn counter(&self) -> Option<u32> {
        self.state.lock().header.as_ref().map(counter)
    }

    /// Our write transaction ends: its writes are ours, accept the file's stamp before the lock
    /// they were made under is released. In rollback mode a commit (the counter moved from
    /// `before`) is logged for the other bpe processes: the pages it wrote, and a truncation.
    pub fn wrote(&self, file: &FileHandle, rollback_commit: Option<(u32, &[u64], Option<u64>)>) {
        let mut w = self.state.lock();
        if let Ok(s) = file.stamp_now() {
            file.accept_stamp(s);
        }
        let Some((before, pages, truncated_to)) = rollback_commit else {
            return;
        };
        let Some(after) = w.header.as_ref().map(counter) else {
            return;
        };
        if after == before {
            return; // rolled back, or no commit: the file holds what it held
        }
        let pos = w.log_pos;
        let Some(log) = w.log(file) else {
            return;
        };
        let (epoch, head) = (log.epoch(), log.head());
        let new_head = log.append(before, after, pages, truncated_to);
        // Our own record needs no reading back: we were current, so we stay current.
        if pos.is_none_or(|p| p == (epoch, head)) {
            w.log_pos = Some((epoch, new_head));
        }
    }
}

/// Reads (salt1, salt2, nBackfill, mxFrame) from wal-index region 0.
///
/// # Safety
/// `region0` must be the mapping SQLite returned for region 0 (at least 136 bytes), still mapped.
pub unsafe fn wal_token(region0: *const u8) -> WalToken {
    // Other processes write these words concurrently: read each atomically.
    // SAFETY: offsets are within the 32 KiB region and 4-byte aligned; the mapping is live.
    let word =
        |off: usize| unsafe { (*(region0.add(off) as *const AtomicU32)).load(Ordering::Acquire) };
    WalToken {
        salts: [word(32), word(36)],
        backfill: word(96),
        max_frame: word(16),
    }
}

#[cfg(test)]
mod tests {
    use super::{FileWatch, WalChange, WalLocks, WalToken, WalView};
    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering::SeqCst};

    const SALTS: [u32; 2] = [7, 9];

    fn token(salts: [u32; 2], backfill: u32) -> WalToken {
        WalToken {
            salts,
            backfill,
            max_frame: backfill,
        }
    }

    #[test]
    fn the_first_token_and_unchanged_tokens_are_not_changes() {
        let mut wal = WalView::default();
        assert_eq!(wal.account(token(SALTS, 3)), WalChange::None);
        assert_eq!(wal.account(token(SALTS, 3)), WalChange::None);
    }

    #[test]
    fn backfill_is_ours_only_under_our_checkpoint_lock() {
        let mut wal = WalView::default();
        wal.account(token(SALTS, 0));
        wal.checkpointing = true;
        assert_eq!(wal.account(token(SALTS, 40)), WalChange::None, "ours");
        wal.checkpointing = false;
        wal.writing = true;
        assert_eq!(
            wal.account(token(SALTS, 80)),
            WalChange::Backfill { from: 40, to: 80 },
            "another process checkpointed while we held only the write lock"
        );
    }

    /// A restart after a WAL we saw fully backfilled, into the very next WAL: the file changed
    /// by what the new WAL backfilled. After any other restart nothing is known.
    #[test]
    fn the_next_wal_after_a_full_backfill_is_followed_page_by_page() {
        let be = |n: u32| n.to_be();
        let mut wal = WalView::default();
        wal.account(token([be(41), 5], 30));
        assert_eq!(
            wal.account(token([be(42), 9], 12)),
            WalChange::Backfill { from: 0, to: 12 }
        );
        // Two restarts since: frames of the one between are unknown.
        assert_eq!(wal.account(token([be(44), 3], 2)), WalChange::Restart);
        // The old WAL was not fully backfilled when last seen.
        wal.account(WalToken {
            salts: [be(50), 1],
            backfill: 4,
            max_frame: 9,
        });
        assert_eq!(wal.account(token([be(51), 2], 1)), WalChange::Restart);
    }

    #[test]
    fn a_restart_is_ours_only_under_our_write_lock() {
        let mut wal = WalView::default();
        wal.account(token(SALTS, 80));
        wal.writing = true;
        assert_eq!(
            wal.account(token([8, 10], 0)),
            WalChange::None,
            "our writer restarted the WAL"
        );
        wal.writing = false;
        assert_eq!(
            wal.account(token([9, 11], 0)),
            WalChange::Restart,
            "another process restarted a WAL that may have been backfilled unseen"
        );
    }

    /// One connection checkpoints in a loop (checkpoint lock, backfill, release) while two others
    /// begin read transactions: every change is ours, so none may count as another process's.
    /// Reading the token before taking the watch's lock fails this within a few thousand rounds.
    #[test]
    fn our_own_checkpoints_racing_our_readers_never_invalidate() {
        // On the project's disk: /tmp may be tmpfs.
        let base = concat!(env!("CARGO_MANIFEST_DIR"), "/../../target/tmp");
        std::fs::create_dir_all(base).unwrap();
        let dir = tempfile::tempdir_in(base).unwrap();
        let path = dir.path().join("db");
        std::fs::write(&path, vec![0u8; 4096]).unwrap();
        let engine = bpe_core::Engine::new(bpe_core::Config::default());
        let file = engine.open_file(&path, 4096).unwrap();
        let watch = FileWatch::default();
        let backfill = AtomicU32::new(0);
        let read = || WalToken {
            salts: SALTS,
            backfill: backfill.load(SeqCst),
            max_frame: 1 << 20,
        };
        let done = AtomicBool::new(false);
        let ckpt = WalLocks {
            write: false,
            checkpoint: true,
        };
        let pages = |_: u32, _: u32, _: [u32; 2]| -> Option<Vec<u64>> { None };
        std::thread::scope(|s| {
            for _ in 0..2 {
                s.spawn(|| {
                    while !done.load(SeqCst) {
                        watch.begin_read_wal(&engine, &file, read, &pages, None);
                    }
                });
            }
            for _ in 0..50_000 {
                watch.wal_lock(&engine, &file, read, &pages, ckpt, true);
                backfill.fetch_add(1, SeqCst);
                watch.wal_lock(&engine, &file, read, &pages, ckpt, false);
            }
            done.store(true, SeqCst);
        });
        let c = engine.counters();
        assert_eq!(
            (c.file_invalidations, c.pages_forgotten),
            (0, 0),
            "own checkpoints taken for another process's"
        );
    }
}
