//! Noticing that the database file changed under this process's cache, so that no connection
//! is ever served a stale page: at the start of every read transaction, with no device round
//! trip when nothing changed. When to look is the connection's transaction's to say
//! (`read_txn.rs`: at the lock that begins a read transaction, at a WAL read transaction's first
//! read, at the WAL write and checkpoint locks); what changed, and what to forget, is said here.
//!
//! Three signals, all in memory or one syscall away:
//!
//! - **Rollback journal**: every committing writer bumps the file change counter (header bytes
//!   24..40, as SQLite's pager compares them). The header is read through SQLite's own buffered
//!   descriptor: on a local file system the OS page cache is coherent with every writer, so the
//!   read costs no device I/O when nothing changed, and this process's O_DIRECT reads never
//!   evict it (after our syncs we drop the rest of the file from the page cache, not its first
//!   block). A counter we did not write means another process committed.
//! - **WAL**: the database file changes only at checkpoints (backfill), and every SQLite writer
//!   keeps the wal-index the same way, whoever it is (another process, a connection of this
//!   process on another VFS, a replication tool): a commit appends frames and adds one to
//!   iChange; a checkpoint copies frames into the file, then moves nBackfill; a restart (new
//!   salts) follows a full backfill. The token (salts, iChange, mxFrame, nBackfill) is
//!   accounted at the start of each read transaction and whenever one of our connections takes
//!   or releases the wal-index write or checkpoint lock, and the pages of the frames seen are
//!   kept (see `WalView::account` for the rules). A change is ours when our connection held
//!   the lock that makes it (backfill: the checkpoint lock; restart: the write lock); our
//!   checkpoints write through the cache.
//! - **The file's stamp** (identity, size, mtime and ctime to the nanosecond; one fstat): any
//!   write changes it, including writes outside SQLite's protocol (a backup restored with `cp`
//!   over the file, a patch with `dd`). We accept the new stamp after our own writes, before
//!   releasing the lock they were made under, so a changed stamp means another writer. In WAL
//!   mode a stamp change while frames wait for a checkpoint may be a checkpoint in progress in
//!   another process (it updates nBackfill only when done): we wait for the wal-index to say.
//!   Where nothing waits, a read transaction looks at the stamp at most once a millisecond
//!   (and at the first after an open): a system call at every one cost speedtest1's one-row
//!   SELECTs a fifth of their time, where stock SQLite makes none.
//!
//! Another writer's checkpoint forgets just the pages it backfilled: the wal-index lists the
//! page of every frame, and after a restart the pages we kept say what the old WAL held. A
//! change we cannot attribute (commits we never saw before a restart, an iChange bump with no
//! frames, as LiteFS makes when it writes a replicated transaction into the file) empties the
//! file's cache (a new key: O(1), see bpe-core's page.rs). The per-file state lives with the
//! core's file entry, across closes and reopens; while no connection of ours has the file open,
//! the registry compares the stamp at the reopen, and the wal-index view goes on from its last
//! token (an equal stamp alone does not vouch for the cache in WAL mode: `FileWatch::opened`).
//!
//! What no check can catch (docs/SQLITE.md): a change outside SQLite's protocol made while one
//! of our connections is inside its own write transaction on the file, or that restores the
//! stamp (size and both times) exactly; in WAL mode, one followed within
//! `OUTSIDE_WRITE_CHECK_INTERVAL` by another process's commit; on kernels before 6.13 (coarse
//! timestamps), one made within the same clock tick as our own last write; and on file systems
//! whose page cache is not coherent across clients (NFS), anything another machine writes.

use super::peer_log::{Explained, PeerLog};
use super::replica_pos::ReplicaPos;
use super::wal_view::{Forget, FramePages, WalLocks, WalToken, WalView};
use bpe_core::sync::{Mutex, Rank};
use bpe_core::{monotonic_ns, FileStamp};
use bpe_core::{Engine, FileHandle, OpenKind};
use std::collections::VecDeque;
use std::sync::{Arc, Weak};
use std::time::Duration;

/// Files closed by every connection of this process whose commit log stays mapped, at most.
/// An application that opens a connection per request closes and reopens the same file each
/// time; creating the 64 KiB log in /dev/shm, reserving and initializing it, and removing it at
/// the close cost four times stock SQLite's whole lookup (docs/BENCHMARKS.md, "A connection
/// per lookup"). The most recently closed few keep theirs; each holds a descriptor.
const LOGS_KEPT_CLOSED: usize = 4;

/// The watches of the files closed most recently, oldest first (see [`LOGS_KEPT_CLOSED`]).
/// Taken before a watch's state, never under it.
static CLOSED_WITH_LOG: std::sync::Mutex<VecDeque<Weak<FileWatch>>> =
    std::sync::Mutex::new(VecDeque::new());

/// The list's lock, taken (held across a fork: see `process::hold_process_locks`).
pub fn hold_closed_list() -> Box<dyn std::any::Any> {
    Box::new(CLOSED_WITH_LOG.lock().unwrap_or_else(|e| e.into_inner()))
}

/// What this process knows of one database file, shared by all its connections to it.
pub struct FileWatch {
    state: Mutex<Watch>,
    /// How often a WAL read transaction with nothing waiting for a checkpoint takes the file's
    /// stamp, the one signal of a write outside SQLite's protocol there: see
    /// [`OUTSIDE_WRITE_CHECK_INTERVAL`].
    outside_check_interval: Duration,
}

/// A WAL read transaction with nothing to checkpoint takes the file's stamp if the last one is
/// this old, and at the first after any connection of ours opens the file. The stamp is a
/// system call, a sizeable part of what a one-row read transaction costs: taken at each, it
/// made speedtest1's one-row SELECTs markedly slower, where stock SQLite makes no call at all. A write outside SQLite's protocol is so seen by every read transaction
/// that begins this long after it ends, and by every connection opened after it, unless
/// another process commits within that time (frames then wait, and a changed stamp can be a
/// checkpoint); a write transaction of ours after a skipped look looks first. SQLite's own page
/// cache, which trusts the wal-index alone, gives no more.
pub const OUTSIDE_WRITE_CHECK_INTERVAL: Duration = Duration::from_millis(1);

impl Default for FileWatch {
    fn default() -> Self {
        FileWatch::checking_outside_writes_every(OUTSIDE_WRITE_CHECK_INTERVAL)
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
    /// Every connection of ours closed the file, none has opened it since.
    closed: bool,
    /// On a LiteFS mount: the position file and the header as the last read transaction saw
    /// them (see `replica_position`).
    replica: Option<(Vec<u8>, Vec<u8>)>,
    /// When (`monotonic_ns`) a WAL read transaction last took the stamp for a write outside
    /// SQLite's protocol; None after an open, so that the next one takes it.
    outside_checked_at: Option<u64>,
    /// A read transaction skipped that look (within the interval): our next write transaction
    /// looks before its commit, whose checkpoint would otherwise accept a changed stamp unseen.
    outside_look_skipped: bool,
    /// Whether the file is on a FUSE mount, once an open could tell (`FileWatch::on_fuse`). A
    /// `statfs` at every open cost a connection per request a system call; the file is one
    /// inode of one device while its entry lives, but a device number can be reused after an
    /// unmount, so a reopen that finds the file changed asks again.
    on_fuse: Option<bool>,
}

/// The change counter in header bytes 24..40.
fn counter(header: &[u8; 16]) -> u32 {
    u32::from_be_bytes(header[..4].try_into().expect("4 bytes"))
}

impl Watch {
    /// Compares the file's stamp (`stamp`) with the one last accepted, with nothing waiting
    /// for a checkpoint: a change is a write outside SQLite's protocol, and the file is
    /// forgotten. A stamp that cannot be taken leaves the next look due.
    fn look_outside(
        &mut self,
        engine: &Engine,
        file: &FileHandle,
        stamp: impl FnOnce() -> Option<FileStamp>,
    ) {
        let Some(s) = stamp() else {
            return;
        };
        self.outside_checked_at = Some(monotonic_ns());
        self.outside_look_skipped = false;
        if file.known_stamp().is_none_or(|k| k.stamp != s) {
            engine.invalidate_file(file);
            file.accept_stamp(s);
        }
    }

    /// The view just took its first token: after the process's first open of the file, after an
    /// open that found it changed, or after our connection deleted the WAL; or the first of a
    /// wal-index rebuilt meanwhile (`WalView::rebuilt`). A checkpoint by
    /// another process since the stamp was last accepted is in the file but in no token the
    /// view will compare with; only the stamp shows it. Taken after the token, it must be the
    /// one accepted last, and neither may be racy (`reopened_racy`, `KnownStamp::racy`: within
    /// a clock tick of a change, which a coarse clock can hide); otherwise the whole file is
    /// forgotten. It is a look for writes outside SQLite's protocol too.
    fn check_first_token(
        &mut self,
        engine: &Engine,
        file: &FileHandle,
        stamp: Option<FileStamp>,
        racy: bool,
    ) {
        let known = file.known_stamp();
        let vouched =
            !racy && stamp.is_some_and(|s| known.is_some_and(|k| k.stamp == s && !k.racy));
        if !vouched {
            engine.invalidate_file(file);
        }
        if let Some(s) = stamp {
            file.accept_stamp(s);
            self.outside_checked_at = Some(monotonic_ns());
            self.outside_look_skipped = false;
        }
    }

    /// The commit log, mapped on first use (None where it cannot be).
    fn log(&mut self, file: &FileHandle) -> Option<&PeerLog> {
        if self.log.is_none() {
            self.log = PeerLog::open(file.identity());
        }
        self.log.as_ref()
    }

    /// Breaks the rollback-mode readers' chains in the commit log, if the database has one.
    fn break_peer_chains(&mut self, file: &FileHandle) {
        if self.log.is_none() && !PeerLog::exists(file.identity()) {
            return; // no log, so no reader holds a position in one
        }
        if let Some(log) = self.log(file) {
            log.break_chains();
        }
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

fn forget(engine: &Engine, file: &FileHandle, forget: Forget) {
    match forget {
        Forget::Nothing => {}
        Forget::Pages(pages) => engine.forget_pages(file, &pages),
        Forget::File => engine.invalidate_file(file),
    }
}

impl FileWatch {
    /// A watch whose WAL read transactions look for writes outside SQLite's protocol at most
    /// once per `interval` (see [`OUTSIDE_WRITE_CHECK_INTERVAL`]).
    pub fn checking_outside_writes_every(interval: Duration) -> Self {
        FileWatch {
            state: Mutex::new(Rank::FileState, Watch::default()),
            outside_check_interval: interval,
        }
    }

    /// Whether the file is on a FUSE mount (LiteFS: replica_pos.rs): `look` asks (None: it
    /// could not tell, and the next open asks again), unless an earlier open of the file did.
    pub fn on_fuse(&self, look: &dyn Fn() -> Option<bool>) -> bool {
        if let Some(known) = self.state.lock().on_fuse {
            return known;
        }
        let Some(answer) = look() else {
            return false;
        };
        let mut w = self.state.lock();
        w.on_fuse = Some(answer);
        w.wal.replicated = answer;
        answer
    }

    /// A connection opened the file: `kind` says what the registry found.
    pub fn opened(&self, kind: OpenKind) {
        let mut w = self.state.lock();
        w.closed = false;
        // A connection's first read transaction sees every write made before it opened.
        w.outside_checked_at = None;
        match kind {
            OpenKind::New | OpenKind::Shared => {}
            OpenKind::Reopened { changed, racy } => {
                // While nobody here had it open, nothing was accounted. If the registry found
                // the stamp changed, the file's pages are gone already and the next token is
                // the view's first. If not, the view goes on from the token it last accounted,
                // as for a connection left idle: an equal stamp does not say that the file
                // holds what we cached. It was accepted as a read transaction began, which may
                // be while another process's checkpoint had written its pages and not yet
                // moved nBackfill; that move shows only to a view that remembers nBackfill
                // before it (walthread-2-processes: four processes opening, writing and
                // closing a database switched between WAL and DELETE, "row N missing from
                // index" in most unloaded runs while the next token started afresh). A WAL
                // deleted and created anew meanwhile has new salts, and the file is forgotten.
                if changed {
                    w.wal.start_afresh();
                    w.header = None;
                    w.on_fuse = None;
                }
                w.reopened_racy = racy && !changed;
            }
        }
    }

    /// One of our connections is deleting the WAL (`xShmUnmap` with its delete flag). SQLite
    /// does that only in `sqlite3WalClose`, after a complete checkpoint under an EXCLUSIVE lock
    /// on the database file: no other connection anywhere had it open, the checkpoint was ours,
    /// accounted, and its stamp accepted. The next WAL has new salts that say nothing of this
    /// one, so its first token starts the view afresh, checked against that stamp.
    pub fn wal_deleted(&self) {
        self.state.lock().wal.start_afresh();
    }

    /// The last connection of this process to the file closed. Our position in the commit log
    /// is let go: a reopen checks the stamp first, and its first read transaction takes the
    /// position anew. The log stays mapped for a reopen if the file is among the
    /// [`LOGS_KEPT_CLOSED`] closed last; the oldest other closed file lets go of its own.
    pub fn closed(self: &Arc<Self>) {
        {
            let mut w = self.state.lock();
            w.closed = true;
            w.log_pos = None;
        }
        let mut kept = CLOSED_WITH_LOG.lock().unwrap_or_else(|e| e.into_inner());
        let me = Arc::downgrade(self);
        kept.retain(|k| k.strong_count() > 0 && !k.ptr_eq(&me));
        kept.push_back(me);
        while kept.len() > LOGS_KEPT_CLOSED {
            let Some(oldest) = kept.pop_front().and_then(|k| k.upgrade()) else {
                continue;
            };
            let mut w = oldest.state.lock();
            if w.closed {
                w.log = None;
            }
        }
    }

    /// Whether the commit log is mapped (tests).
    #[cfg(test)]
    fn has_log(&self) -> bool {
        self.state.lock().log.is_some()
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
        let known = file.known_stamp();
        let stamp_moved = stamp.is_some_and(|s| known.is_none_or(|k| k.stamp != s));
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
        // Accepting the stamp already known changes nothing unless it was taken racily (within
        // a clock tick of the file's last change), which time since may have cleared: most read
        // transactions skip it, and the wall-clock read it takes.
        let settled = !counter_moved && !stamp_moved && known.is_some_and(|k| !k.racy);
        if let Some(s) = stamp.filter(|_| !settled) {
            file.accept_stamp(s);
        }
        w.reopened_racy = false;
    }

    /// A read transaction begins in WAL mode (a read mark was just locked): `read_token` reads
    /// the wal-index now, under our lock (read before it, a token can go stale while we wait,
    /// behind another connection's checkpoint that backfilled and accounted the newer one, and
    /// then look like a foreign backfill: the two stray invalidations of a TPC-C run).
    ///
    /// `stamp` takes the file's stamp, and is called only where the answer matters: to accept a
    /// change the wal-index accounted for, and where nothing waits for a checkpoint (a change
    /// to the file then can only be a write outside SQLite's protocol), there at most once per
    /// `OUTSIDE_WRITE_CHECK_INTERVAL` and at the first after an open. While frames wait, the
    /// stamp could say nothing the wal-index does not (below), and stock SQLite makes no stat
    /// call at a WAL read transaction either: a system call per transaction saved
    /// (speedtest1's one-row SELECT tests, each its own transaction, in WAL mode).
    pub fn begin_read_wal(
        &self,
        engine: &Engine,
        file: &FileHandle,
        read_token: impl FnOnce() -> Option<WalToken>,
        pages: FramePages<'_>,
        stamp: impl FnOnce() -> Option<FileStamp>,
    ) {
        let mut w = self.state.lock();
        // The database is in WAL mode now: commits the rollback-mode log cannot record may have
        // happened or follow (a plain process's too, which a bpe process may switch back).
        w.break_peer_chains(file);
        let token = read_token();
        let first = w.wal.stamp_must_vouch();
        let change = w.wal.look(token, pages);
        // The stamp compared at the reopen was taken within a clock tick of a write: on a
        // kernel with coarse timestamps a foreign checkpoint in that tick leaves it equal.
        let reopened_racy = std::mem::take(&mut w.reopened_racy);
        if first && !w.wal.stamp_must_vouch() {
            forget(engine, file, change);
            w.check_first_token(engine, file, stamp(), reopened_racy);
        } else if reopened_racy || change != Forget::Nothing {
            forget(engine, file, change);
            if reopened_racy {
                engine.invalidate_file(file);
            }
            if let Some(s) = stamp() {
                file.accept_stamp(s);
            }
        } else if w.wal.checkpointing {
            // Our own checkpoint writes through the cache; it accepts the stamp when it ends.
        } else if token.is_some_and(|t| t.backfill < t.max_frame) {
            // Frames wait for a checkpoint: a change to the file may be one in progress
            // elsewhere, which says so in nBackfill when it is done. Pages it is writing are in
            // the WAL for every reader until then. No stamp is needed to know that.
        } else {
            // Nothing to checkpoint: a changed stamp can only be a write outside SQLite's
            // protocol.
            let interval = self.outside_check_interval.as_nanos() as u64;
            let due = w
                .outside_checked_at
                .is_none_or(|at| monotonic_ns().saturating_sub(at) >= interval);
            if due {
                w.look_outside(engine, file, stamp);
            } else {
                w.outside_look_skipped = true;
            }
        }
    }

    /// A read transaction began on a LiteFS mount, under its read lock (see replica_pos.rs):
    /// `pos` is the position file, `header` what the transaction's look saw (rollback: bytes
    /// 24..40; WAL: the wal-index header). On a replica, a position that moved while the header
    /// did not is a replicated transaction the header failed to show: the whole file is
    /// forgotten, as for any change nothing names the pages of, and true is returned (in WAL
    /// mode the caller then writes the header LiteFS lost: `read_txn::Opened::rewrite_lost_header`). On the
    /// primary the same sight is only a commit LiteFS has not yet moved the position for:
    /// nothing is forgotten.
    pub fn replica_position(
        &self,
        engine: &Engine,
        file: &FileHandle,
        pos: &ReplicaPos,
        header: &[u8],
    ) -> bool {
        let Some(now) = pos.read() else {
            return false;
        };
        let mut w = self.state.lock();
        let moved_alone = w
            .replica
            .as_ref()
            .is_some_and(|(last_pos, last_header)| *last_pos != now && last_header == header);
        // Forgotten under the state lock, before another connection can see the new pair
        // recorded and read the file's old pages.
        let lost = moved_alone && pos.is_replica();
        if lost {
            engine.invalidate_file(file);
        }
        w.replica = Some((now, header.to_vec()));
        lost
    }

    /// Looks at the wal-index again within a read transaction (its first read of the file: see
    /// `read_txn::ReadTxn::look`) and forgets what another process's change put in the
    /// file meanwhile.
    pub fn look_wal(
        &self,
        engine: &Engine,
        file: &FileHandle,
        read_token: impl FnOnce() -> Option<WalToken>,
        pages: FramePages<'_>,
    ) {
        let mut w = self.state.lock();
        let first = w.wal.stamp_must_vouch();
        let change = w.wal.look(read_token(), pages);
        let accounted = change != Forget::Nothing;
        forget(engine, file, change);
        if first && !w.wal.stamp_must_vouch() {
            w.check_first_token(engine, file, file.stamp_now().ok(), false);
        } else if accounted {
            // As at the lock (`begin_read_wal`): the backfill just accounted moved the file's
            // stamp; left unaccepted, the next look for a write outside SQLite's protocol would
            // take it for one and forget the whole file.
            if let Ok(s) = file.stamp_now() {
                file.accept_stamp(s);
            }
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
        read_token: impl FnOnce() -> Option<WalToken>,
        pages: FramePages<'_>,
        lock: WalLocks,
        held: bool,
    ) {
        let mut w = self.state.lock();
        let token = read_token();
        let first = w.wal.stamp_must_vouch();
        let change = w.wal.look(token, pages);
        let accounted = change != Forget::Nothing;
        forget(engine, file, change);
        if first && !w.wal.stamp_must_vouch() {
            w.check_first_token(engine, file, file.stamp_now().ok(), false);
        }
        if lock.write {
            w.wal.writing = held;
            if held {
                // A WAL commit may follow, which the rollback-mode log cannot record.
                w.break_peer_chains(file);
                let nothing_waits = token.is_some_and(|t| t.backfill == t.max_frame);
                if w.outside_look_skipped && nothing_waits && !accounted && !w.wal.checkpointing {
                    // The last look for a write outside SQLite's protocol was skipped: once
                    // frames wait, no look can tell such a write from a checkpoint, and the
                    // checkpoint after our commit accepts the file's stamp.
                    w.look_outside(engine, file, || file.stamp_now().ok());
                }
            }
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

#[cfg(test)]
mod tests {
    use super::super::wal_view::{WalLocks, WalToken};
    use super::{FileWatch, OUTSIDE_WRITE_CHECK_INTERVAL};
    use bpe_core::OpenKind;
    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering::SeqCst};
    use std::time::Duration;

    fn one_page_file() -> (
        tempfile::TempDir,
        std::path::PathBuf,
        std::sync::Arc<bpe_core::Engine>,
        bpe_core::FileHandle,
    ) {
        let base = concat!(env!("CARGO_MANIFEST_DIR"), "/../../target/tmp");
        std::fs::create_dir_all(base).unwrap();
        let dir = tempfile::tempdir_in(base).unwrap();
        let path = dir.path().join("db");
        std::fs::write(&path, vec![0u8; 4096]).unwrap();
        // Past the racy window, so that the stamp the open accepts can vouch for the file (a
        // racy one forgets it at the first token: see `check_first_token`).
        std::thread::sleep(bpe_core::RACY_WINDOW * 2);
        let engine = bpe_core::Engine::new(bpe_core::Config::default());
        let file = engine.open_file(&path, 4096).unwrap();
        (dir, path, engine, file)
    }

    /// A connection per request closes and reopens the same file: its commit log stays mapped
    /// across the close (creating and removing it cost four times a lookup), for the files
    /// closed last; an older closed file lets go of its own, a reopened one never.
    #[test]
    fn the_files_closed_last_keep_their_commit_log_mapped() {
        let files: Vec<_> = (0..=super::LOGS_KEPT_CLOSED + 1)
            .map(|_| one_page_file())
            .collect();
        let watches: Vec<_> = files
            .iter()
            .map(|(_, _, engine, file)| {
                let w = file.client_state(FileWatch::default);
                w.opened(OpenKind::New);
                w.begin_read(engine, file, Some([0; 16]), None);
                assert!(w.has_log(), "a rollback-mode read transaction maps the log");
                w
            })
            .collect();
        let (last, watches) = watches.split_last().unwrap();
        for w in watches {
            w.closed();
        }
        assert!(!watches[0].has_log(), "the oldest closed file kept its log");
        assert!(watches[1..].iter().all(|w| w.has_log()));
        // Closed again after a reopen: it moves to the back, pushing nobody out.
        let reopened = OpenKind::Reopened {
            changed: false,
            racy: false,
        };
        watches[2].opened(reopened);
        watches[2].closed();
        assert!(watches[1..].iter().all(|w| w.has_log()));
        // Reopened and open: the oldest entry now, it keeps its log when pushed out.
        watches[1].opened(reopened);
        last.closed();
        assert!(watches[1].has_log(), "an open file let go of its log");
        assert!(watches[3..].iter().all(|w| w.has_log()) && last.has_log());
    }

    /// A wal-index of ten frames, `backfill` of them checkpointed.
    fn ten_frames_backfilled_to(backfill: u32) -> Option<WalToken> {
        Some(WalToken {
            salts: [7, 9],
            change: 1,
            backfill,
            max_frame: 10,
            rest: [3_007_000, 0, 0, 0, 0, 0, 0],
        })
    }

    /// The file's stamp costs a system call, so a WAL read transaction takes it only where it
    /// can say what the wal-index cannot: not while frames wait for a checkpoint (a change to
    /// the file may be one in progress, which nBackfill will show; stock SQLite makes no stat
    /// call there either), but where nothing waits, so that a write outside SQLite's protocol
    /// still forgets the file, and to accept a change the wal-index accounted for.
    #[test]
    fn a_wal_read_takes_the_stamp_only_where_the_wal_index_cannot_tell() {
        let (_dir, path, engine, file) = one_page_file();
        // Every transaction with nothing to checkpoint is due a look (the interval has its own
        // test below).
        let watch = FileWatch::checking_outside_writes_every(Duration::ZERO);
        let token = |backfill| move || ten_frames_backfilled_to(backfill);
        let pages = |_: u32, _: u32, _: [u32; 2]| -> Option<Vec<u32>> { Some(vec![2, 3]) };
        let stamps = std::cell::Cell::new(0);
        let stamp = || {
            stamps.set(stamps.get() + 1);
            file.stamp_now().ok()
        };
        let write_outside_sqlite = |len: usize| std::fs::write(&path, vec![1u8; len]).unwrap();
        let invalidations = || engine.counters().file_invalidations;

        // The first token is checked against the stamp (its own test below); the count starts
        // after it.
        watch.begin_read_wal(&engine, &file, token(4), &pages, stamp);
        assert_eq!((stamps.get(), invalidations()), (1, 0));
        stamps.set(0);
        watch.begin_read_wal(&engine, &file, token(4), &pages, stamp);
        write_outside_sqlite(8192);
        watch.begin_read_wal(&engine, &file, token(4), &pages, stamp);
        assert_eq!(stamps.get(), 0, "stamp taken while frames wait");
        assert_eq!(
            invalidations(),
            0,
            "a change while frames wait forgot the file"
        );

        // Another process backfills the rest: its pages are forgotten, and the stamp accepted.
        watch.begin_read_wal(&engine, &file, token(10), &pages, stamp);
        assert_eq!(
            stamps.get(),
            1,
            "the accounted change's stamp was not taken"
        );
        assert_eq!(invalidations(), 0);

        watch.begin_read_wal(&engine, &file, token(10), &pages, stamp);
        assert_eq!(invalidations(), 0, "an unchanged stamp forgot the file");
        write_outside_sqlite(12288);
        watch.begin_read_wal(&engine, &file, token(10), &pages, stamp);
        assert_eq!(stamps.get(), 3);
        assert_eq!(
            invalidations(),
            1,
            "a write outside SQLite's protocol was missed"
        );
        watch.begin_read_wal(&engine, &file, token(10), &pages, stamp);
        assert_eq!(invalidations(), 1, "the new stamp was not accepted");
    }

    /// Where nothing waits for a checkpoint, the stamp is taken at most once per interval, and
    /// at the first read transaction after an open: a write outside SQLite's protocol is seen
    /// by a connection opened after it, and by every read transaction one interval after it.
    #[test]
    fn a_wal_read_looks_for_writes_outside_sqlite_once_per_interval_and_after_an_open() {
        let (_dir, path, engine, file) = one_page_file();
        let nothing_waits = || ten_frames_backfilled_to(10);
        let pages = |_: u32, _: u32, _: [u32; 2]| -> Option<Vec<u32>> { None };
        let stamps = std::cell::Cell::new(0);
        let stamp = || {
            stamps.set(stamps.get() + 1);
            file.stamp_now().ok()
        };
        let write_outside_sqlite = |len: usize| std::fs::write(&path, vec![1u8; len]).unwrap();
        let invalidations = || engine.counters().file_invalidations;

        // An interval no test outlasts: only opens make a look due.
        let watch = FileWatch::checking_outside_writes_every(Duration::from_secs(3600));
        watch.begin_read_wal(&engine, &file, nothing_waits, &pages, stamp);
        assert_eq!(stamps.get(), 1, "the first read transaction took no stamp");
        for _ in 0..100 {
            watch.begin_read_wal(&engine, &file, nothing_waits, &pages, stamp);
        }
        assert_eq!(stamps.get(), 1, "a stamp taken within the interval");
        write_outside_sqlite(8192);
        watch.begin_read_wal(&engine, &file, nothing_waits, &pages, stamp);
        assert_eq!(invalidations(), 0);
        watch.opened(OpenKind::Shared);
        watch.begin_read_wal(&engine, &file, nothing_waits, &pages, stamp);
        assert_eq!(stamps.get(), 2, "no stamp at the first read after an open");
        assert_eq!(
            invalidations(),
            1,
            "a connection opened after a write outside SQLite's protocol missed it"
        );

        // A read within the interval skipped its look; a write outside SQLite's protocol then,
        // and a write transaction of ours before the next look: it looks before it commits
        // (after its commit the checkpoint accepts whatever stamp the file has).
        watch.begin_read_wal(&engine, &file, nothing_waits, &pages, stamp);
        write_outside_sqlite(4096);
        let write = WalLocks {
            write: true,
            checkpoint: false,
        };
        watch.wal_lock(&engine, &file, nothing_waits, &pages, write, true);
        assert_eq!(
            invalidations(),
            2,
            "a write transaction after a skipped look missed a write outside SQLite's protocol"
        );
        watch.wal_lock(&engine, &file, nothing_waits, &pages, write, false);

        // The default interval: a read transaction begun that long after a write sees it.
        // (A new watch: its first token, checked against a stamp accepted just after a write,
        // forgets the file by itself.)
        let watch = FileWatch::default();
        watch.begin_read_wal(&engine, &file, nothing_waits, &pages, stamp);
        let before = invalidations();
        write_outside_sqlite(12288);
        std::thread::sleep(OUTSIDE_WRITE_CHECK_INTERVAL * 2);
        watch.begin_read_wal(&engine, &file, nothing_waits, &pages, stamp);
        assert_eq!(
            invalidations(),
            before + 1,
            "a write outside SQLite's protocol was missed one interval after it"
        );
    }

    /// One connection checkpoints in a loop (checkpoint lock, backfill, release) while two others
    /// begin read transactions: every change is ours, so none may count as another process's.
    /// Reading the token before taking the watch's lock fails this within a few thousand rounds.
    #[test]
    fn our_own_checkpoints_racing_our_readers_never_invalidate() {
        let (_dir, _path, engine, file) = one_page_file();
        let watch = FileWatch::default();
        let backfill = AtomicU32::new(0);
        let read = || {
            Some(WalToken {
                salts: [7, 9],
                change: 1,
                backfill: backfill.load(SeqCst),
                max_frame: 1 << 20,
                rest: [3_007_000, 0, 0, 0, 0, 0, 0],
            })
        };
        let done = AtomicBool::new(false);
        let ckpt = WalLocks {
            write: false,
            checkpoint: true,
        };
        let pages = |_: u32, _: u32, _: [u32; 2]| -> Option<Vec<u32>> { None };
        // The first token, checked against the stamp before the race begins.
        watch.begin_read_wal(&engine, &file, read, &pages, || file.stamp_now().ok());
        std::thread::scope(|s| {
            for _ in 0..2 {
                s.spawn(|| {
                    while !done.load(SeqCst) {
                        watch.begin_read_wal(&engine, &file, read, &pages, || None);
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

    /// A wal-index of ten frames under `salts`, frame n holding page 100 + n, `backfill` of
    /// them checkpointed.
    fn frames_of(salts: [u32; 2], backfill: u32) -> impl Fn() -> Option<WalToken> {
        move || {
            Some(WalToken {
                salts,
                ..ten_frames_backfilled_to(backfill).unwrap()
            })
        }
    }

    fn frame_pages(from: u32, to: u32, _: [u32; 2]) -> Option<Vec<u32>> {
        Some((from + 1..=to).map(|frame| 100 + frame).collect())
    }

    /// A reopen goes on from the token last accounted, whatever the stamp says. Here the stamp
    /// was accepted while another process's checkpoint had written its pages and not yet moved
    /// nBackfill (a read transaction of ours accounted the checkpoint before it then), so the
    /// registry finds it equal at the reopen, and only nBackfill's move shows those pages.
    /// Starting afresh at the reopen kept them stale (walthread-2-processes; the processes test
    /// in tests/mode_switching.rs).
    #[test]
    fn a_reopen_accounts_the_checkpoint_an_equal_stamp_hides() {
        let (_dir, path, engine, file) = one_page_file();
        let watch = FileWatch::default();
        let stamp = || file.stamp_now().ok();
        let token = |backfill| frames_of([7, 9], backfill);
        watch.begin_read_wal(&engine, &file, token(3), &frame_pages, stamp);
        // Another process's checkpoint of frames 4..=10 has written their pages, and one of our
        // read transactions sees the checkpoint before it (frames 4 and 5) and accepts the
        // stamp, the new pages in it.
        std::fs::write(&path, vec![1u8; 4096]).unwrap();
        watch.begin_read_wal(&engine, &file, token(5), &frame_pages, stamp);
        let before = engine.counters().pages_forgotten;
        assert_eq!(before, 2);
        // Our last connection closes; the process opens the file again and the registry finds
        // the stamp it accepted. Then the checkpoint ends.
        watch.opened(OpenKind::Reopened {
            changed: false,
            racy: false,
        });
        watch.begin_read_wal(&engine, &file, token(10), &frame_pages, stamp);
        let c = engine.counters();
        assert_eq!(
            (c.pages_forgotten - before, c.file_invalidations),
            (5, 0),
            "the pages of frames 6..=10 were kept after the reopen"
        );
    }

    /// The view's first token (after the process's first open of the file, after an open that
    /// found it changed, after our connection deleted the WAL) shows nothing from before it: a
    /// checkpoint by another process since the stamp was accepted shows only in the stamp, which
    /// is taken after the token and must be the one accepted.
    #[test]
    fn the_first_token_is_checked_against_the_stamp() {
        let (_dir, path, engine, file) = one_page_file();
        let watch = FileWatch::default();
        let stamp = || file.stamp_now().ok();
        let invalidations = || engine.counters().file_invalidations;
        watch.begin_read_wal(&engine, &file, frames_of([7, 9], 10), &frame_pages, stamp);
        assert_eq!(invalidations(), 0, "the stamp of the open forgot the file");
        // Our connection checkpoints and deletes the WAL; the next has new salts.
        watch.wal_deleted();
        watch.begin_read_wal(&engine, &file, frames_of([3, 4], 0), &frame_pages, stamp);
        assert_eq!(
            invalidations(),
            0,
            "the WAL after our own deletion forgot the file"
        );
        // Again, but another process commits and checkpoints before our next read transaction.
        watch.wal_deleted();
        std::fs::write(&path, vec![1u8; 4096]).unwrap();
        watch.begin_read_wal(&engine, &file, frames_of([5, 6], 10), &frame_pages, stamp);
        assert_eq!(
            invalidations(),
            1,
            "a checkpoint before the first token was missed"
        );
        // The same through the other looks: a write or checkpoint lock, a transaction's first read.
        let write = WalLocks {
            write: true,
            checkpoint: false,
        };
        watch.wal_deleted();
        std::fs::write(&path, vec![2u8; 4096]).unwrap();
        watch.wal_lock(
            &engine,
            &file,
            frames_of([8, 9], 10),
            &frame_pages,
            write,
            true,
        );
        assert_eq!(invalidations(), 2, "missed at the write lock");
        watch.wal_lock(
            &engine,
            &file,
            frames_of([8, 9], 10),
            &frame_pages,
            write,
            false,
        );
        watch.wal_deleted();
        std::fs::write(&path, vec![3u8; 4096]).unwrap();
        watch.look_wal(&engine, &file, frames_of([1, 2], 10), &frame_pages);
        assert_eq!(invalidations(), 3, "missed at the first read");
    }

    /// A wal-index rebuilt while no connection of ours was attached, over an empty WAL (salts
    /// 0, as before): what happened meanwhile shows only in the stamp. Threads opening a
    /// connection per lookup rebuild it at many first opens after a last close; an unchanged
    /// stamp must not cost the file, a changed one must.
    #[test]
    fn a_rebuilt_wal_index_over_an_empty_wal_is_vouched_for_by_the_stamp() {
        let (_dir, path, engine, file) = one_page_file();
        let watch = FileWatch::default();
        let stamp = || file.stamp_now().ok();
        let invalidations = || engine.counters().file_invalidations;
        let empty = || {
            Some(WalToken {
                salts: [0, 0],
                change: 0,
                max_frame: 0,
                backfill: 0,
                rest: [3_007_000, 1, 0, 0, 0, 5, 6],
            })
        };
        let unbuilt = || Some(super::super::wal_view::NOT_BUILT);
        let write = WalLocks {
            write: true,
            checkpoint: false,
        };
        watch.begin_read_wal(&engine, &file, empty, &frame_pages, stamp);
        // The recovering connection takes the write lock, finds the header unbuilt, rebuilds it
        // and releases the lock.
        let rebuild = |then: &dyn Fn()| {
            watch.wal_lock(&engine, &file, unbuilt, &frame_pages, write, true);
            then();
            watch.wal_lock(&engine, &file, empty, &frame_pages, write, false);
            watch.begin_read_wal(&engine, &file, empty, &frame_pages, stamp);
        };
        rebuild(&|| {});
        assert_eq!(
            invalidations(),
            0,
            "a rebuild nobody wrote around forgot the file"
        );
        rebuild(&|| std::fs::write(&path, vec![1u8; 4096]).unwrap());
        assert_eq!(
            invalidations(),
            1,
            "a checkpoint before the rebuild was missed"
        );
    }
}
