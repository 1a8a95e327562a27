//! One connection's transaction on the main database file, from the lock that begins it to the
//! unlock that ends it: when to look for changes made by others, and what a look leaves for
//! SQLite's own calls that follow in the same transaction. `change_detect.rs` decides what
//! changed and forgets it; `file.rs` only forwards SQLite's lock calls here.
//!
//! - **begin**: a read transaction begins at SQLite's SHARED lock in rollback mode (`lock`, which
//!   reads the header bytes SQLite reads next), or at its read mark's lock in WAL mode
//!   (`shm_lock`, which reads the wal-index token). Either takes the file's stamp where it is
//!   needed, whose size then answers SQLite's own size query (`Opened::size_of`).
//! - **look**: the first read of the file in a WAL read transaction looks at the wal-index
//!   again (`first_read`): a checkpoint between the read mark's lock and SQLite's read of
//!   nBackfill put pages in the file that this transaction reads there.
//! - **end**: the unlock accounts what this lock period wrote (`unlock`), before the lock goes.
//!
//! Between them, the WAL write and checkpoint locks are accounted as they are taken and before
//! they are released (`Opened::wal_lock`), and on a LiteFS replica a lost wal-index header is
//! written again (`Opened::rewrite_lost_header`).

use super::change_detect::FileWatch;
use super::replica_pos::ReplicaPos;
use super::unix_file::{unix, unix_locking};
use super::wal_view::{self, WalLocks, WalToken};
use crate::api;
use bpe_core::{Engine, FileHandle, FileIdentity, FileStamp};
use libsqlite3_sys::*;
use std::ffi::{c_int, c_void};
use std::path::Path;

/// wal.c's lock slots: 0 write, 1 checkpoint, 2 recover, 3..8 read marks.
const WAL_WRITE_LOCK: c_int = 0;
const WAL_CKPT_LOCK: c_int = 1;
const WAL_READ_LOCK0: c_int = 3;

/// What a transaction looks at: the parts of one connection's open file (`file::Conn`) that
/// live as long as the open.
pub(super) struct Opened<'a> {
    pub engine: &'a Engine,
    pub handle: &'a FileHandle,
    pub watch: &'a FileWatch,
    pub path: &'a Path,
    /// The identity of SQLite's descriptor of the file, when the unix VFS lets us see it.
    pub identity: Option<FileIdentity>,
    /// LiteFS's position file, if the database is on a LiteFS mount (replica_pos.rs).
    pub replica_pos: Option<&'a ReplicaPos>,
    /// wal-index region 0 while mapped (WAL mode), else null.
    pub shm0: *const u8,
    /// SQLite's own file underneath ours, open.
    pub real: *mut sqlite3_file,
}

/// One connection's transaction state: the lock SQLite holds, what the look at the read
/// transaction's start read for SQLite's calls that follow, and what was written under the lock.
pub(super) struct ReadTxn {
    lock: c_int,
    /// Header bytes 24..40 read when the read transaction began, handed to SQLite's own read of
    /// the same bytes that follows, which then costs no second read.
    header: Option<[u8; 16]>,
    /// The file's size from the stamp taken when the read transaction began, handed to SQLite's
    /// own size query that follows (`pagerPagecount`), which then costs no second stat call:
    /// see `Opened::size_of`.
    size_at_lock: Option<i64>,
    /// A WAL read transaction began (a read mark was locked) and has not read the file yet:
    /// its first read looks at the wal-index again (see `ReadTxn::look`).
    wal_read_began: bool,
    /// The wal-index token the read transaction's look at its read mark read, if any.
    token_at_lock: Option<WalToken>,
    writes: WriteTxn,
}

/// What was written since the lock was last released.
#[derive(Default)]
struct WriteTxn {
    /// Written since the lock was last released: accept the stamp before releasing it.
    wrote: bool,
    /// This write transaction so far (rollback mode), for the bpe processes' commit log: the
    /// change counter when it began, the pages written, a truncation (in pages).
    before: Option<u32>,
    pages: Vec<u64>,
    truncated: Option<u64>,
    /// Something was written that the page list cannot describe (a write that is not a page, a
    /// page size change): the commit must not be logged, so that readers forget the whole file.
    unloggable: bool,
}

impl ReadTxn {
    pub fn new() -> ReadTxn {
        ReadTxn {
            lock: SQLITE_LOCK_NONE,
            header: None,
            size_at_lock: None,
            wal_read_began: false,
            token_at_lock: None,
            writes: WriteTxn::default(),
        }
    }

    /// The lock SQLite holds on the file (`SQLITE_LOCK_*`).
    pub fn lock_level(&self) -> c_int {
        self.lock
    }

    /// The size the look at the transaction's start took, for SQLite's size query; given once.
    pub fn take_size(&mut self) -> Option<i64> {
        self.size_at_lock.take()
    }

    /// Drops the size the look took: every call that may change the size (a write, truncation,
    /// sync, file control, unlock, or another wal-index lock) makes it first.
    pub fn forget_size(&mut self) {
        self.size_at_lock = None;
    }

    /// SQLite's change-counter read at the start of a read transaction: we just read it.
    pub fn take_header(&mut self) -> Option<[u8; 16]> {
        self.header.take()
    }

    /// `xLock`: the lock, and at SHARED from none a read transaction begins (rollback mode, or
    /// WAL without a mapped wal-index).
    pub fn lock(&mut self, f: &Opened, level: c_int) -> c_int {
        let rc = unix_locking!(f.real, xLock, level);
        if rc == SQLITE_OK
            && level == SQLITE_LOCK_SHARED
            && self.lock == SQLITE_LOCK_NONE
            && f.shm0.is_null()
        {
            let read = self.begin(f);
            if read != SQLITE_OK {
                return read;
            }
        }
        if rc == SQLITE_OK {
            self.lock = self.lock.max(level);
        }
        rc
    }

    /// A read transaction begins (rollback mode, or WAL without a mapped wal-index), under the
    /// SHARED lock just granted: reads the header bytes SQLite reads next, and looks. On a
    /// failed read the lock is let go and SQLite gets the read's error.
    fn begin(&mut self, f: &Opened) -> c_int {
        let real = f.real;
        let mut header = [0u8; 16];
        let read = unix!(real, xRead, header.as_mut_ptr() as *mut c_void, 16, 24);
        if read != SQLITE_OK && read != SQLITE_IOERR_SHORT_READ {
            // The check could not be made: the read transaction cannot begin (as it could
            // not if SQLite's own read of these bytes failed).
            unix_locking!(real, xUnlock, SQLITE_LOCK_NONE);
            return read;
        }
        let header = (read == SQLITE_OK).then_some(header);
        let stamp = f.handle.stamp_now().ok();
        self.size_at_lock = f.size_of(stamp.as_ref());
        f.watch.begin_read(f.engine, f.handle, header, stamp);
        if let Some(pos) = f.replica_pos {
            // Rollback mode: LiteFS writes page 1, so the counter SQLite reads moves too;
            // a lost one is only forgotten (SQLite's readers see page 1 itself change).
            let seen = header.map_or(Vec::new(), |h| h.to_vec());
            f.watch.replica_position(f.engine, f.handle, pos, &seen);
        }
        self.header = header;
        SQLITE_OK
    }

    /// `xUnlock`, after the pages written behind were written back: our writes are accepted
    /// (and in rollback mode logged for the other bpe processes) while still under the lock
    /// they were made under; then the lock goes, and with none left the transaction ends.
    pub fn unlock(&mut self, f: &Opened, level: c_int) -> c_int {
        let w = &mut self.writes;
        if std::mem::take(&mut w.wrote) {
            let pages = std::mem::take(&mut w.pages);
            let truncated = w.truncated.take();
            let loggable = f.shm0.is_null() && !std::mem::take(&mut w.unloggable);
            let commit = w
                .before
                .take()
                .filter(|_| loggable)
                .map(|before| (before, pages.as_slice(), truncated));
            f.watch.wrote(f.handle, commit);
        }
        let rc = unix_locking!(f.real, xUnlock, level);
        if rc == SQLITE_OK {
            self.lock = level;
            if level == SQLITE_LOCK_NONE {
                self.header = None;
            }
        }
        rc
    }

    /// Notes that this lock period writes the file (the counter it started from, once).
    pub fn begin_writing(&mut self, watch: &FileWatch) {
        watch.wrote_file();
        let w = &mut self.writes;
        if !std::mem::replace(&mut w.wrote, true) {
            w.before = watch.counter();
            w.pages.clear();
            w.truncated = None;
            w.unloggable = false;
        }
    }

    /// A page this write transaction wrote, for the commit log.
    pub fn wrote_page(&mut self, page: u64) {
        self.writes.pages.push(page);
    }

    /// Something was written that the page list cannot describe (see `WriteTxn::unloggable`).
    pub fn wrote_unloggable(&mut self) {
        self.writes.unloggable = true;
    }

    /// The file was truncated to `pages` pages.
    pub fn truncated_to(&mut self, pages: u64) {
        let t = &mut self.writes.truncated;
        *t = Some(t.map_or(pages, |t| t.min(pages)));
    }

    /// `xShmLock`: the WAL write and checkpoint locks are accounted while held (after taking,
    /// before releasing), and a read mark's shared lock begins a WAL read transaction.
    pub fn shm_lock(&mut self, f: &Opened, offset: c_int, n: c_int, flags: c_int) -> c_int {
        self.size_at_lock = None;
        let guarded = WalLocks {
            write: offset <= WAL_WRITE_LOCK && offset + n > WAL_WRITE_LOCK,
            checkpoint: offset <= WAL_CKPT_LOCK && offset + n > WAL_CKPT_LOCK,
        };
        let exclusive = flags & SQLITE_SHM_EXCLUSIVE != 0 && guarded != WalLocks::default();
        if exclusive && flags & SQLITE_SHM_UNLOCK != 0 {
            // Account for what we did under the lock before anyone else can take it.
            f.wal_lock(guarded, false);
        }
        let rc = unix_locking!(f.real, xShmLock, offset, n, flags);
        if rc != SQLITE_OK || flags & SQLITE_SHM_LOCK == 0 {
            return rc;
        }
        if exclusive {
            f.wal_lock(guarded, true);
        }
        if flags & SQLITE_SHM_SHARED != 0 && offset >= WAL_READ_LOCK0 {
            // A read transaction begins (WAL mode): has anyone else checkpointed?
            let mark0 = offset == WAL_READ_LOCK0;
            if f.shm0.is_null() {
                self.begin_without_wal_index(f, mark0);
            } else {
                self.begin_wal(f, mark0);
            }
        }
        rc
    }

    /// A WAL read transaction begins with no wal-index mapped (`readonly_shm`: SQLite reads the
    /// WAL file itself, and holds its database lock for the connection's life): the stamp is
    /// the signal.
    fn begin_without_wal_index(&mut self, f: &Opened, mark0: bool) {
        let stamp = f.handle.stamp_now().ok();
        if mark0 {
            // Read mark 0: no checkpoint writes the database file while the mark is
            // held (wal.c takes it exclusively to backfill). The snapshot is the file
            // alone, except under `readonly_shm` with a wal-index rebuilt in heap
            // memory, where SQLite reads WAL frames too; the file's size holds either
            // way.
            self.size_at_lock = f.size_of(stamp.as_ref());
        }
        f.watch.begin_read(f.engine, f.handle, None, stamp);
    }

    /// A WAL read transaction begins (its read mark was just locked; `mark0`: read mark 0):
    /// has anyone else checkpointed?
    fn begin_wal(&mut self, f: &Opened, mark0: bool) {
        let (shm0, real) = (f.shm0, f.real);
        let token_at_lock = std::cell::Cell::new(None);
        let read_token = || {
            // SAFETY: shm0 is region 0 as mapped by the unix VFS; the closures run
            // within this call, before anything can unmap it.
            let token = unsafe { wal_view::wal_token(shm0) };
            token_at_lock.set(token);
            token
        };
        // SAFETY: as above, and real is this connection's open unix file.
        let pages =
            |from, to, salts| unsafe { wal_view::wal_frame_pages(real, shm0, from, to, salts) };
        // The stamp, only if the wal-index look needs it (a system call saved per read
        // transaction otherwise).
        let taken = std::cell::Cell::new(None);
        let handle = f.handle;
        let stamp = || {
            let s = handle.stamp_now().ok();
            taken.set(s);
            s
        };
        f.watch
            .begin_read_wal(f.engine, f.handle, read_token, &pages, stamp);
        if mark0 {
            // As in `begin_without_wal_index`; taken after the mark was granted, it answers
            // SQLite's size query too. Not taken, SQLite's own stat call answers it, as in stock.
            self.size_at_lock = f.size_of(taken.get().as_ref());
        }
        if let Some(pos) = f.replica_pos {
            // SAFETY: as above.
            let seen = unsafe { wal_view::header_copy(shm0) };
            if f.watch.replica_position(f.engine, f.handle, pos, &seen) {
                f.rewrite_lost_header(&seen);
            }
        }
        self.token_at_lock = token_at_lock.get();
        self.wal_read_began = true;
        // Between this look and SQLite's read of nBackfill: where another process's checkpoint
        // leaves the first read's look something to find (tests/wal_backfill_race.rs).
        bpe_core::pause::point(bpe_core::pause::WAL_READ_MARK_LOCKED);
    }

    /// A read (`xRead`, `xFetch`): the first of a WAL read transaction looks again.
    #[inline]
    pub fn first_read(&mut self, f: &Opened) {
        if std::mem::take(&mut self.wal_read_began) {
            self.look(f);
        }
    }

    /// The first read of the file in a WAL read transaction. SQLite reads nBackfill, which says
    /// which pages it reads from the file rather than the WAL (those of frames up to it), after
    /// it locked its read mark, so after `begin_read_wal` looked in xShmLock. A checkpoint by
    /// another process in between copied pages into the file that this transaction now reads
    /// there, and that our cache may hold older: look again before serving any (walthread-4:
    /// "row N missing from index" under a writer process's PASSIVE checkpoints). Looking here
    /// is enough: a backfill after SQLite's read of nBackfill covers only frames SQLite reads
    /// from the WAL in this transaction, and is accounted at the next look.
    ///
    /// Only a backfill writes the file while this transaction holds its read mark (mark 0 bars
    /// any backfill; another mark bars a restart, the only reset of nBackfill), and a backfill
    /// moves nBackfill forward. So an nBackfill equal to the one the lock's look read means the
    /// file holds what that look saw, and there is nothing to account here: one load, not the
    /// watch's lock and a whole token (the common case, once in every read transaction). What
    /// else moved meanwhile (a commit) is accounted at the next look, as any later change is.
    fn look(&self, f: &Opened) {
        if f.shm0.is_null() {
            return;
        }
        let (shm0, real) = (f.shm0, f.real);
        let unmoved = self.token_at_lock.is_some_and(|at_lock| {
            // SAFETY: as in wal_lock.
            let backfill = unsafe { wal_view::wal_backfill(shm0) };
            backfill == at_lock.backfill
        });
        if unmoved {
            return;
        }
        // SAFETY: as in wal_lock.
        let read_token = || unsafe { wal_view::wal_token(shm0) };
        // SAFETY: as in wal_lock.
        let pages =
            |from, to, salts| unsafe { wal_view::wal_frame_pages(real, shm0, from, to, salts) };
        f.watch.look_wal(f.engine, f.handle, read_token, &pages);
    }
}

impl Opened<'_> {
    /// Our connection took (`held`) or is about to release the WAL write and/or checkpoint lock.
    fn wal_lock(&self, locks: WalLocks, held: bool) {
        if self.shm0.is_null() {
            return;
        }
        let (shm0, real) = (self.shm0, self.real);
        // SAFETY: shm0 is region 0 as mapped by the unix VFS; the closures run within this call,
        // before anything can unmap it.
        let read_token = || unsafe { wal_view::wal_token(shm0) };
        // SAFETY: as above, and real is this connection's open unix file.
        let pages =
            |from, to, salts| unsafe { wal_view::wal_frame_pages(real, shm0, from, to, salts) };
        self.watch
            .wal_lock(self.engine, self.handle, read_token, &pages, locks, held);
    }

    /// On a LiteFS replica whose wal-index header was lost (`FileWatch::replica_position`):
    /// writes it as LiteFS would have, with iChange + 1, so that every connection's SQLite sees
    /// a change and drops its own page cache, and none keeps serving pages the transaction
    /// replaced. This is the only write bpe makes to state SQLite owns, and it is made as
    /// SQLite's own writer makes its header write: under the WAL write lock (asked without
    /// waiting: whoever holds it, LiteFS applying a transaction, writes a header of its own),
    /// and only if the header is still the one `seen` before the lock (`bump_change` checks).
    /// Anything else, and nothing is written.
    fn rewrite_lost_header(&self, seen: &[u8; 48]) {
        let real = self.real;
        bpe_core::pause::point(bpe_core::pause::LOST_HEADER_SEEN);
        let exclusive = SQLITE_SHM_LOCK | SQLITE_SHM_EXCLUSIVE;
        if unix_locking!(real, xShmLock, WAL_WRITE_LOCK, 1, exclusive) != SQLITE_OK {
            return;
        }
        bpe_core::pause::point(bpe_core::pause::LOST_HEADER_LOCKED);
        // SAFETY: shm0 is region 0 as mapped by the unix VFS, mapped while the connection holds
        // its read mark; we hold the WAL write lock, so no SQLite writer writes the header.
        let written = unsafe { wal_view::bump_change(self.shm0, seen) };
        let unlock = SQLITE_SHM_UNLOCK | SQLITE_SHM_EXCLUSIVE;
        unix_locking!(real, xShmLock, WAL_WRITE_LOCK, 1, unlock);
        if written {
            api::log(
                SQLITE_NOTICE,
                &format!(
                    "bpe: {}: LiteFS's wal-index header was lost; rewritten with the next change counter",
                    self.path.display()
                ),
            );
        }
    }

    /// The size SQLite's next `xFileSize` is answered with, from the stamp just taken as a read
    /// transaction began (in WAL mode, where `begin_read_wal` took one). Stock SQLite makes a
    /// stat call there (`pagerPagecount`: in rollback mode at each read transaction, in WAL mode
    /// only when the wal-index knows no page count, as after it is rebuilt from an empty WAL),
    /// and ours then stands in for it. Unused, it waits under the lock and goes with the next
    /// call that may change the size.
    ///
    /// Why it is the answer a fresh fstat would give: the stamp was taken after the lock was
    /// granted, so it is a size SQLite's own fstat could have returned had it run a moment
    /// earlier; only a change by this connection in between would be ordered before SQLite's
    /// call, and every call that may make one (a write, truncation, sync, file control, unlock,
    /// or another wal-index lock) drops the answer first. It is given once. Under the usual
    /// locks no other SQLite writer can change the size at all (rollback: the SHARED lock, which
    /// a writer's EXCLUSIVE waits for; WAL: read mark 0, which a checkpoint must take
    /// exclusively before it backfills); before a wal-index is mapped (WAL mode's first look,
    /// `readonly_shm`) another process's checkpoint may, exactly as it may just after an fstat.
    /// Only a stamp of this connection's own file counts (a stamp by path may name another);
    /// when the file's identity is unknown (its descriptor could not be stat'ed), none does.
    fn size_of(&self, stamp: Option<&FileStamp>) -> Option<i64> {
        let stamp = stamp?;
        if self.identity != Some(stamp.identity) {
            return None;
        }
        // unixFileSize reports a 1-byte file as empty (its ticket #3260 workaround).
        match stamp.size {
            1 => Some(0),
            s => i64::try_from(s).ok(),
        }
    }
}
