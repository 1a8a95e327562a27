//! Following one database's wal-index the way every SQLite writer keeps it: the token at
//! each look (salts, iChange, mxFrame, nBackfill, the header's other words), the pages of the
//! frames seen, and what another writer's commit, checkpoint or restart put in the database
//! file that our cache may hold older (`WalView::account`). The edges to the shared mapping
//! are here too: reading the token (`wal_token`), the frames' pages (`wal_frame_pages`), and
//! writing the header for a LiteFS replica's lost one (`bump_change`, under the WAL write lock). `change_detect.rs` decides when
//! to look and forgets what a look found.

use super::unix_file::unix_locking;
use crate::api;
use libsqlite3_sys::{sqlite3_file, SQLITE_OK};
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicU32, Ordering};

/// What the wal-index says of the WAL now: its generation (salts), its committed frames
/// (mxFrame), how far they were backfilled into the database file (nBackfill), and the number
/// of commits (iChange: every commit adds one, a restart keeps it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WalToken {
    pub salts: [u32; 2],
    pub change: u32,
    pub max_frame: u32,
    pub backfill: u32,
    /// The header's other words (version, flags and page size, nPage, the last frame's and
    /// the header's checksums): SQLite's own readers drop their cache when any byte of the
    /// header changes, so a change of these that no frame or commit explains forgets the file.
    pub rest: [u32; 7],
}

/// Offsets in a header copy of the words `WalToken::rest` holds.
const REST_WORDS: [usize; 7] = [0, 12, 20, 24, 28, 40, 44];

/// Which of the wal-index locks that change the token a lock call covers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WalLocks {
    pub write: bool,
    pub checkpoint: bool,
}

/// Beyond this many frames of one WAL, their pages are not kept: a restart by another process
/// then forgets the whole file.
pub(crate) const MAX_FRAMES_KEPT: usize = 1 << 18;

/// This process's view of one database's wal-index.
#[derive(Default, Debug)]
pub(super) struct WalView {
    /// The token as last accounted for.
    known: Option<WalToken>,
    /// The database page (0-based) of each frame 1..=known.max_frame of the current WAL, read
    /// at our looks: after a restart the wal-index no longer lists them, yet the frames we saw
    /// but had not seen backfilled were backfilled before it. None where they could not all be
    /// read.
    frames: Option<Vec<u32>>,
    /// The wal-index was seen unbuilt since `known` was accounted (a new `-shm` file, or one
    /// truncated when the first connection attached to it): the header recovery rebuilds it
    /// into starts iChange and nBackfill at 0 again (`rebuilt`).
    rebuilding: bool,
    /// The file is on a FUSE mount, a LiteFS replica's: LiteFS writes a replicated
    /// transaction into the file and bumps iChange with no frames, which a rebuild erases, so
    /// a rebuilt wal-index forgets the file there.
    pub(super) replicated: bool,
    /// One of our connections holds the write lock (only a writer restarts the WAL).
    pub(super) writing: bool,
    /// One of our connections holds the checkpoint lock (only a checkpointer backfills).
    pub(super) checkpointing: bool,
    /// Writes to the database file by our connections, and their count when we took the
    /// checkpoint lock: holding the lock is not writing (a superlock holds every lock while
    /// another tool replaces the files), so a stamp change is ours only if we wrote.
    pub(super) own_writes: u64,
    pub(super) writes_at_checkpoint: u64,
}

/// What another process's change put in the database file that our cache may hold older.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Forget {
    Nothing,
    Pages(Vec<u64>),
    /// The change cannot be attributed to pages: the whole file.
    File,
}

/// The pages of WAL frames (from, to] in frame order, read from the wal-index, if they can be
/// (see `wal_frame_pages`); None: not known for sure.
pub type FramePages<'a> = &'a dyn Fn(u32, u32, [u32; 2]) -> Option<Vec<u32>>;

impl WalView {
    /// Drops the token last accounted for: the next look takes its token as the first.
    pub(super) fn start_afresh(&mut self) {
        self.known = None;
        self.rebuilding = false;
    }

    /// The next token is one that the file's stamp must vouch for: the view's first, or the
    /// first of a rebuilt wal-index (which no longer says whether a checkpoint ran while no
    /// connection was attached, where the WAL is empty: see `rebuilt`).
    pub(super) fn stamp_must_vouch(&self) -> bool {
        self.known.is_none() || self.rebuilding
    }

    /// Accounts for the token read now; a token that could not be read says nothing, and what
    /// it may hide is forgotten (the view stays at the last token, to compare the next with).
    pub(super) fn look(&mut self, token: Option<WalToken>, pages: FramePages<'_>) -> Forget {
        match token {
            Some(token) => self.account(token, pages),
            None => Forget::File,
        }
    }

    /// Takes `token` as the current state and says what changed in the database file that was
    /// not written through our cache. Every SQLite writer follows one protocol, and this
    /// follows it, whoever the writer is (another process, another VFS of this one, a
    /// replication tool):
    /// - a commit appends at least one frame and adds one to iChange; a change of iChange that
    ///   appended frames do not explain wrote the database file some other way;
    /// - a checkpoint copies frames (nBackfill, mxSafe] into the file and then moves nBackfill;
    /// - a restart (new salts, salt-1 + 1, mxFrame and nBackfill back to 0) happens only after
    ///   every frame of the old WAL was backfilled, including frames appended after our last
    ///   look: those are known only if no commit happened since then in the old WAL.
    fn account(&mut self, token: WalToken, pages: FramePages<'_>) -> Forget {
        if token.rest[0] == 0 {
            // A wal-index whose header was never written (iVersion 0): the first connection
            // to open the WAL is about to build it. Nothing to compare; the next look is.
            self.rebuilding |= self.known.is_some();
            return Forget::Nothing;
        }
        if self.rebuilding {
            self.rebuilding = false;
            let known = self.known.expect("rebuilding only with a known token");
            return self.rebuilt(known, token, pages);
        }
        if self.known == Some(token) {
            // Nothing moved since the last look: the common case, met twice by every read
            // transaction (its lock, then its first read). The rules below say the same.
            return Forget::Nothing;
        }
        let Some(known) = self.known.replace(token) else {
            self.frames = pages(0, token.max_frame, token.salts).and_then(keepable);
            return Forget::Nothing;
        };
        if known.salts == token.salts {
            self.same_wal(known, token, pages)
        } else if self.writing {
            // Our writer restarted the WAL. It restarts only a WAL fully backfilled when its
            // read transaction began (accounted then), and no commit can come between (it would
            // have made our write transaction's snapshot stale).
            self.frames = pages(0, token.max_frame, token.salts).and_then(keepable);
            Forget::Nothing
        } else {
            self.restarted(known, token, pages)
        }
    }

    fn same_wal(&mut self, known: WalToken, token: WalToken, pages: FramePages<'_>) -> Forget {
        let commits = token.change.wrapping_sub(known.change);
        let appended = token.max_frame.wrapping_sub(known.max_frame);
        if token.max_frame < known.max_frame || token.backfill < known.backfill {
            // Only a recovery of the wal-index goes back within one WAL: nothing is known.
            self.frames = pages(0, token.max_frame, token.salts).and_then(keepable);
            return Forget::File;
        }
        self.keep_frames(known.max_frame, token, pages);
        if commits > appended
            || (commits == 0) != (appended == 0)
            || (appended == 0 && token.rest != known.rest)
        {
            // The change counter moved with no frames to show for it (LiteFS applies a
            // replicated transaction to the database file and bumps iChange so that readers
            // drop their caches), or frames appeared without a commit: another writer changed
            // the file outside the WAL.
            return Forget::File;
        }
        if token.backfill > known.backfill && !self.checkpointing {
            // Another process checkpointed frames (known.backfill, token.backfill].
            return self.pages_of(known.backfill, token.backfill, token.salts, pages);
        }
        Forget::Nothing
    }

    fn restarted(&mut self, known: WalToken, token: WalToken, pages: FramePages<'_>) -> Forget {
        let next = u32::from_be(token.salts[0]) == u32::from_be(known.salts[0]).wrapping_add(1);
        let commits = token.change.wrapping_sub(known.change);
        // The new WAL shows frames only once it has a commit; so if the only commit since our
        // look (if any) is the new WAL's, the old WAL ended at the frame we last saw.
        let old_wal_seen_whole = next && commits == u32::from(token.max_frame > 0);
        let old_tail = self
            .frames
            .as_ref()
            .filter(|_| old_wal_seen_whole)
            .and_then(|f| f.get(known.backfill as usize..known.max_frame as usize))
            .map(|tail| tail.iter().map(|&p| p as u64).collect::<Vec<_>>());
        self.frames = pages(0, token.max_frame, token.salts).and_then(keepable);
        let Some(mut forget) = old_tail else {
            return Forget::File;
        };
        match self.pages_of(0, token.backfill, token.salts, pages) {
            Forget::Nothing => {}
            Forget::Pages(new) => forget.extend(new),
            Forget::File => return Forget::File,
        }
        forget.sort_unstable();
        forget.dedup();
        Forget::Pages(forget)
    }

    /// The first token of a wal-index rebuilt since `known`. Recovery builds it from the WAL
    /// file when a connection attaches with no process attached; since our last look any
    /// number of processes may have attached, committed, checkpointed and detached, and what
    /// they did shows only partly: iChange and nBackfill start again at 0 (and no reader reads
    /// the database file for a page in the WAL until a checkpoint moves nBackfill again). In
    /// the same WAL (the same salts: a restart or a new WAL changes them; no frame lost) the
    /// frames not seen backfilled may have been: their pages are forgotten. Any other WAL may
    /// have come after commits and checkpoints we never saw, and a LiteFS replica's changes
    /// outside frames leave nothing: the file is forgotten. An empty WAL (salts 0: no header
    /// written) names no generation, so the caller also checks the stamp (`stamp_must_vouch`),
    /// as for a first token.
    fn rebuilt(&mut self, known: WalToken, token: WalToken, pages: FramePages<'_>) -> Forget {
        self.known = Some(token);
        if self.replicated || known.salts != token.salts || token.max_frame < known.max_frame {
            self.frames = pages(0, token.max_frame, token.salts).and_then(keepable);
            return Forget::File;
        }
        self.keep_frames(known.max_frame, token, pages);
        self.pages_of(known.backfill, token.max_frame, token.salts, pages)
    }

    /// Adds the pages of frames (from, token.max_frame] of the same WAL to those kept.
    fn keep_frames(&mut self, from: u32, token: WalToken, pages: FramePages<'_>) {
        if let Some(frames) = &mut self.frames {
            match pages(from, token.max_frame, token.salts) {
                Some(new) if frames.len() + new.len() <= MAX_FRAMES_KEPT => frames.extend(new),
                _ => self.frames = None,
            }
        }
    }

    /// The pages of frames (from, to] of the current WAL.
    fn pages_of(&self, from: u32, to: u32, salts: [u32; 2], pages: FramePages<'_>) -> Forget {
        if to <= from {
            return Forget::Nothing;
        }
        let kept = self
            .frames
            .as_ref()
            .and_then(|f| f.get(from as usize..to as usize))
            .map(<[u32]>::to_vec);
        match kept.or_else(|| pages(from, to, salts)) {
            Some(list) => {
                let mut list: Vec<u64> = list.into_iter().map(u64::from).collect();
                list.sort_unstable();
                list.dedup();
                Forget::Pages(list)
            }
            None => Forget::File,
        }
    }
}

fn keepable(frames: Vec<u32>) -> Option<Vec<u32>> {
    (frames.len() <= MAX_FRAMES_KEPT).then_some(frames)
}

/// Reads the token from wal-index region 0: a header both of whose copies agree (a writer
/// writes the second copy first, so a reader that finds them equal read one whole header, as
/// wal.c's own readers check), and an nBackfill of that header's WAL (a restart writes the
/// header before it resets nBackfill). None if no consistent token could be read (a writer died
/// while writing the header, and no reader has recovered it yet).
///
/// # Safety
/// `region0` must be the mapping SQLite returned for region 0 (at least 136 bytes), still mapped.
pub unsafe fn wal_token(region0: *const u8) -> Option<WalToken> {
    // Other processes write these words concurrently: read each atomically.
    // SAFETY: offsets are within the 32 KiB region and 4-byte aligned; the mapping is live.
    let word =
        |off: usize| unsafe { (*(region0.add(off) as *const AtomicU32)).load(Ordering::Acquire) };
    // Every word of one copy of the header (48 bytes): iChange at 8, mxFrame at 16, the
    // salts at 32 and 36.
    let copy = |n: usize| std::array::from_fn::<u32, 12, _>(|i| word(n * 48 + i * 4));
    // Every read transaction runs this twice: an inline comparison, not a call to memcmp.
    let same = |a: &[u32; 12], b: &[u32; 12]| a.iter().zip(b).fold(0, |d, (x, y)| d | (x ^ y)) == 0;
    for attempt in 0..10_000 {
        if attempt > 100 {
            std::thread::yield_now();
        }
        // The reads below are ordered by their Acquire loads alone (a later load never moves
        // before an earlier Acquire load); no fence is needed between them, since this reader
        // writes nothing.
        let first = copy(0);
        let second = copy(1);
        if !same(&second, &first) {
            if truncated_at_attach(&first, &second) {
                return Some(NOT_BUILT);
            }
            continue;
        }
        let backfill = word(96);
        if !same(&copy(0), &first) || backfill > first[4] {
            continue;
        }
        return Some(WalToken {
            change: first[2],
            max_frame: first[4],
            salts: [first[8], first[9]],
            backfill,
            rest: REST_WORDS.map(|off| first[off / 4]),
        });
    }
    None
}

/// The token of a wal-index whose header was never written (`WalView::account`: nothing to
/// compare).
pub(super) const NOT_BUILT: WalToken = WalToken {
    salts: [0, 0],
    change: 0,
    max_frame: 0,
    backfill: 0,
    rest: [0; 7],
};

/// Whether the two header copies are what the unix VFS leaves when the first connection to
/// attach to an existing `-shm` file truncates it to 3 bytes (`unixLockSharedMemory`, "as a
/// system debugging aid"): the first copy's first 3 bytes kept, every other byte zero. The
/// wal-index is then as unbuilt as a new one, and the connection about to build it takes the
/// write lock, finds the copies unequal under it and runs recovery. Read first copy first and
/// written second copy first, a header that reads so was not written between the reads.
/// Treated as a torn header, it cost the whole file's cache at every such attach, as threads
/// opening a connection per lookup make at each first open after a last close (after 10,000
/// rereads of a header nobody could change: the reader holds the write lock).
fn truncated_at_attach(first: &[u32; 12], second: &[u32; 12]) -> bool {
    first[0].to_ne_bytes()[3] == 0
        && first[1..].iter().all(|&w| w == 0)
        && second.iter().all(|&w| w == 0)
}

/// nBackfill alone, for a look within a read transaction (see `ReadTxn::look` in read_txn.rs).
///
/// # Safety
/// As `wal_token`.
pub unsafe fn wal_backfill(region0: *const u8) -> u32 {
    // SAFETY: nBackfill's offset is within region 0 and 4-byte aligned; the mapping is live.
    unsafe { (*(region0.add(96) as *const AtomicU32)).load(Ordering::Acquire) }
}

/// wal.c's checksum of a wal-index header's first 40 bytes, in native byte order.
fn header_checksum(header: &[u32; 12]) -> [u32; 2] {
    let (mut s1, mut s2) = (0u32, 0u32);
    for pair in header[..10].chunks(2) {
        s1 = s1.wrapping_add(pair[0]).wrapping_add(s2);
        s2 = s2.wrapping_add(pair[1]).wrapping_add(s1);
    }
    [s1, s2]
}

/// The wal-index header's first copy (region 0's first 48 bytes), as it is now.
///
/// # Safety
/// As `wal_token`.
pub unsafe fn header_copy(region0: *const u8) -> [u8; 48] {
    // SAFETY: as in wal_token: the words are within region 0, 4-byte aligned, mapping live.
    let cell = |off: usize| unsafe { &*(region0.add(off) as *const AtomicU32) };
    let mut out = [0u8; 48];
    for (i, chunk) in out.chunks_exact_mut(4).enumerate() {
        chunk.copy_from_slice(&cell(i * 4).load(Ordering::Acquire).to_ne_bytes());
    }
    out
}

/// Writes the wal-index header anew with iChange + 1 and its checksum, the second copy first as
/// wal.c's writers do, so that every connection's SQLite sees a change at its next read
/// transaction and drops its own page cache. Only for LiteFS's lost header on a replica (see
/// `Opened::rewrite_lost_header` in read_txn.rs): this is the write LiteFS made and lost. A reader that looks
/// between the two copies finds them unequal and retries, as with any writer's header. False
/// (nothing written) if the header is no longer `expected` (someone wrote it since it was
/// read), the copies disagree, or the checksum is not in this machine's byte order.
///
/// # Safety
/// As `wal_token`; the caller holds the WAL write lock, as SQLite's writers do for this write.
pub unsafe fn bump_change(region0: *const u8, expected: &[u8; 48]) -> bool {
    // SAFETY: as in wal_token.
    let cell = |off: usize| unsafe { &*(region0.add(off) as *const AtomicU32) };
    let copy = |n: usize| {
        std::array::from_fn::<u32, 12, _>(|i| cell(n * 48 + i * 4).load(Ordering::Acquire))
    };
    let first = copy(0);
    let expected: [u32; 12] = std::array::from_fn(|i| {
        u32::from_ne_bytes(expected[i * 4..i * 4 + 4].try_into().expect("4 bytes"))
    });
    if first != expected || copy(1) != first {
        return false;
    }
    // Byte 13 is bigEndCksum: the checksum is native when it says this machine's order.
    let big_end = first[3].to_ne_bytes()[1] != 0;
    if big_end != cfg!(target_endian = "big") {
        return false;
    }
    let mut header = first;
    header[2] = header[2].wrapping_add(1);
    [header[10], header[11]] = header_checksum(&header);
    for (i, w) in header.iter().enumerate() {
        cell(48 + i * 4).store(*w, Ordering::Release);
    }
    std::sync::atomic::fence(Ordering::SeqCst);
    for (i, w) in header.iter().enumerate() {
        cell(i * 4).store(*w, Ordering::Release);
    }
    true
}

/// wal.c's wal-index geometry (verified in SQLite 3.40 and 3.50): 32 KiB regions, each with the
/// page numbers of 4096 frames, the first after the 136-byte header (so only 4062 there).
const WALINDEX_PGSZ: c_int = 32768;
const WALINDEX_HDR_SIZE: usize = 136;
const HASHTABLE_NPAGE: u32 = 4096;
const HASHTABLE_NPAGE_ONE: u32 = HASHTABLE_NPAGE - (WALINDEX_HDR_SIZE / 4) as u32;

/// The database pages (0-based) of WAL frames (from, to] in frame order, read from the
/// wal-index; None when they cannot be known for sure (an older SQLite, a region not mapped,
/// too many frames, or the WAL restarted meanwhile, which may have overwritten the entries).
///
/// # Safety
/// `real` is the connection's open unix file and `shm0` its mapped wal-index region 0.
pub(super) unsafe fn wal_frame_pages(
    real: *mut sqlite3_file,
    shm0: *const u8,
    from: u32,
    to: u32,
    salts: [u32; 2],
) -> Option<Vec<u32>> {
    use std::sync::atomic::fence;
    if to <= from {
        return Some(Vec::new());
    }
    if api::libversion_number() < 3_040_000 || (to - from) as usize > MAX_FRAMES_KEPT {
        return None;
    }
    let mut pages = Vec::with_capacity((to - from) as usize);
    let mut mapped: Option<(u32, *const u8)> = None;
    for frame in from + 1..=to {
        let region = (frame + HASHTABLE_NPAGE - HASHTABLE_NPAGE_ONE - 1) / HASHTABLE_NPAGE;
        let base = match mapped {
            Some((r, p)) if r == region => p,
            _ => {
                let mut p: *mut c_void = std::ptr::null_mut();
                let rc = unix_locking!(real, xShmMap, region as c_int, WALINDEX_PGSZ, 0, &mut p);
                if rc != SQLITE_OK || p.is_null() {
                    return None;
                }
                mapped = Some((region, p as *const u8));
                p as *const u8
            }
        };
        let (array, zero) = if region == 0 {
            // SAFETY: region 0 is WALINDEX_PGSZ bytes; the array starts after the header.
            (unsafe { base.add(WALINDEX_HDR_SIZE) }, 0)
        } else {
            (base, HASHTABLE_NPAGE_ONE + (region - 1) * HASHTABLE_NPAGE)
        };
        let index = (frame - zero - 1) as usize;
        // SAFETY: index < 4096 entries of the region's page-number array (4062 in region 0),
        // 4-byte aligned, in a live mapping; other processes write it, so read atomically.
        let pgno = unsafe { (*(array.add(index * 4) as *const AtomicU32)).load(Ordering::Acquire) };
        if pgno == 0 {
            return None;
        }
        pages.push(pgno - 1);
    }
    // The entries are only those frames' if the WAL was not restarted while we read them (a
    // restart changes the salts before any frame is written again).
    fence(Ordering::SeqCst);
    // SAFETY: as above.
    if unsafe { wal_token(shm0) }.is_none_or(|t| t.salts != salts) {
        return None;
    }
    Some(pages)
}

#[cfg(test)]
mod tests {
    use super::{Forget, WalToken, WalView};

    /// The header SQLite itself wrote checks with our checksum, and a bumped one differs from
    /// it only in iChange (+1) and the checksum (so SQLite takes it as a writer's header).
    #[test]
    fn a_bumped_wal_index_header_is_sqlites_header_with_the_next_change() {
        let mut region = written_region0();
        let words = |b: &[u8]| -> [u32; 12] {
            std::array::from_fn(|i| u32::from_ne_bytes(b[i * 4..i * 4 + 4].try_into().unwrap()))
        };
        let written: [u32; 12] = region[..12].try_into().unwrap();
        assert_eq!(super::header_checksum(&written), [written[10], written[11]]);
        let region0 = region.as_mut_ptr() as *const u8;
        // SAFETY: region is 136 bytes of u32 (aligned), written only through this pointer.
        let seen = unsafe { super::header_copy(region0) };
        let mut other = seen;
        other[8] ^= 1;
        // SAFETY: as above.
        let stale = unsafe { super::bump_change(region0, &other) };
        assert!(
            !stale,
            "a header that is no longer the one read is left as it is"
        );
        assert_eq!(region[..12], written[..]);
        // SAFETY: as above.
        assert!(unsafe { super::bump_change(region0, &seen) });
        let bytes: Vec<u8> = region.iter().flat_map(|w| w.to_ne_bytes()).collect();
        let (first, second) = (words(&bytes[..48]), words(&bytes[48..96]));
        assert_eq!(first, second);
        assert_eq!(first[2], written[2] + 1);
        assert_eq!(super::header_checksum(&first), [first[10], first[11]]);
        assert_eq!(first[..2], written[..2]);
        assert_eq!(first[3..10], written[3..10]);
    }

    /// The wal-index region 0 of a WAL database SQLite just wrote one commit into, as words.
    fn written_region0() -> Vec<u32> {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("w.db");
        let c = rusqlite::Connection::open(&db).unwrap();
        c.pragma_update(None, "journal_mode", "wal").unwrap();
        c.execute_batch("CREATE TABLE t(x); INSERT INTO t VALUES (1);")
            .unwrap();
        let shm = std::fs::read(dir.path().join("w.db-shm")).unwrap();
        shm[..136]
            .chunks(4)
            .map(|b| u32::from_ne_bytes(b.try_into().unwrap()))
            .collect()
    }

    /// The unix VFS truncates an existing `-shm` file to 3 bytes when the first connection
    /// attaches: a wal-index as unbuilt as a new one, not a torn header; a header whose copies
    /// differ otherwise is still no token.
    #[test]
    fn a_wal_index_truncated_at_attach_reads_as_never_written() {
        let mut region = written_region0();
        // SAFETY: region is 136 bytes of u32 (aligned), not written while read.
        let token = unsafe { super::wal_token(region.as_ptr() as *const u8) }.unwrap();
        assert_eq!(token.rest[0], 3_007_000, "a header SQLite wrote");
        let mut bytes: Vec<u8> = region.iter().flat_map(|w| w.to_ne_bytes()).collect();
        bytes[3..].fill(0);
        let truncated: Vec<u32> = bytes
            .chunks(4)
            .map(|b| u32::from_ne_bytes(b.try_into().unwrap()))
            .collect();
        // SAFETY: as above.
        let token = unsafe { super::wal_token(truncated.as_ptr() as *const u8) };
        assert_eq!(token, Some(super::NOT_BUILT));
        // The second copy written and the first not yet: a header being written, or a writer
        // that died while writing it.
        region[..12].copy_from_slice(&truncated[..12]);
        // SAFETY: as above.
        let token = unsafe { super::wal_token(region.as_ptr() as *const u8) };
        assert_eq!(token, None);
    }

    /// A model of one database's wal-index as SQLite's writers keep it: the frames' pages of
    /// the current WAL, the salts, iChange, nBackfill.
    struct WalIndex {
        salt1: u32,
        frames: Vec<u32>,
        change: u32,
        backfill: u32,
        /// The header's database size in pages (one of `WalToken::rest`).
        n_page: u32,
    }

    impl WalIndex {
        fn new() -> WalIndex {
            WalIndex {
                salt1: 41,
                frames: Vec::new(),
                change: 7,
                backfill: 0,
                n_page: 2,
            }
        }
        /// A WAL no commit wrote a header into: salts 0.
        fn empty() -> WalIndex {
            WalIndex {
                salt1: 0,
                change: 0,
                ..WalIndex::new()
            }
        }
        fn token(&self) -> WalToken {
            WalToken {
                salts: [self.salt1.to_be(), if self.salt1 == 0 { 0 } else { 99 }],
                change: self.change,
                max_frame: self.frames.len() as u32,
                backfill: self.backfill,
                rest: [3_007_000, 0, self.n_page, 0, 0, 0, 0],
            }
        }
        fn commit(&mut self, pages: &[u32]) {
            self.frames.extend_from_slice(pages);
            self.change += 1;
        }
        fn checkpoint(&mut self) {
            self.backfill = self.frames.len() as u32;
        }
        /// A restart (a writer's, or a RESTART/TRUNCATE checkpoint's): only after a full
        /// backfill.
        fn restart(&mut self) {
            assert_eq!(self.backfill as usize, self.frames.len());
            self.salt1 += 1;
            self.frames.clear();
            self.backfill = 0;
        }
        fn pages(&self) -> impl Fn(u32, u32, [u32; 2]) -> Option<Vec<u32>> + '_ {
            move |from, to, salts| {
                (salts == self.token().salts && to as usize <= self.frames.len())
                    .then(|| self.frames[from as usize..to as usize].to_vec())
            }
        }
        fn look(&self, view: &mut WalView) -> Forget {
            view.look(Some(self.token()), &self.pages())
        }
    }

    fn pages(list: &[u64]) -> Forget {
        Forget::Pages(list.to_vec())
    }

    #[test]
    fn the_first_token_and_unchanged_tokens_are_not_changes() {
        let (mut wal, mut view) = (WalIndex::new(), WalView::default());
        wal.commit(&[3]);
        assert_eq!(wal.look(&mut view), Forget::Nothing);
        assert_eq!(wal.look(&mut view), Forget::Nothing);
        wal.commit(&[4, 5]);
        assert_eq!(
            wal.look(&mut view),
            Forget::Nothing,
            "frames only: the file is as it was"
        );
    }

    #[test]
    fn a_backfill_forgets_its_frames_pages_and_is_ours_only_under_our_checkpoint_lock() {
        let (mut wal, mut view) = (WalIndex::new(), WalView::default());
        wal.look(&mut view);
        wal.commit(&[3, 9]);
        wal.commit(&[3]);
        view.checkpointing = true;
        wal.checkpoint();
        assert_eq!(wal.look(&mut view), Forget::Nothing, "ours");
        view.checkpointing = false;
        view.writing = true;
        wal.commit(&[12, 2]);
        wal.checkpoint();
        assert_eq!(
            wal.look(&mut view),
            pages(&[2, 12]),
            "another process checkpointed while we held only the write lock"
        );
    }

    /// We saw the WAL fully backfilled; then a commit we did not see went into the
    /// same WAL, was backfilled, and the WAL restarted. Its page changed the file.
    #[test]
    fn frames_appended_after_our_last_look_and_backfilled_before_a_restart_are_not_missed() {
        let (mut wal, mut view) = (WalIndex::new(), WalView::default());
        wal.commit(&[99]);
        wal.checkpoint();
        assert_eq!(wal.look(&mut view), Forget::Nothing);
        wal.commit(&[50]); // unseen
        wal.checkpoint();
        wal.restart();
        wal.commit(&[10]);
        assert_eq!(wal.look(&mut view), Forget::File);
    }

    /// rqlite's pattern: commits, then a TRUNCATE checkpoint by another connection. Seen to
    /// the last commit, exactly the pages not yet seen backfilled are forgotten.
    #[test]
    fn a_restart_after_a_wal_we_saw_to_its_end_forgets_just_its_unbackfilled_pages() {
        let (mut wal, mut view) = (WalIndex::new(), WalView::default());
        wal.commit(&[1, 2]);
        wal.checkpoint();
        wal.commit(&[3]);
        wal.commit(&[4, 3]);
        assert_eq!(wal.look(&mut view), Forget::Nothing);
        wal.checkpoint();
        wal.restart();
        assert_eq!(
            wal.look(&mut view),
            pages(&[3, 4]),
            "TRUNCATE, no commit since"
        );
        // A writer's restart: the one commit since our look is the new WAL's, partly
        // checkpointed already.
        wal.commit(&[6]);
        assert_eq!(wal.look(&mut view), Forget::Nothing);
        wal.checkpoint();
        wal.restart();
        wal.commit(&[7, 8]);
        wal.backfill = 1;
        assert_eq!(wal.look(&mut view), pages(&[6, 7]));
        // Unseen commits before a restart, or two restarts: nothing is known.
        wal.commit(&[9]);
        wal.checkpoint();
        wal.restart();
        wal.restart();
        assert_eq!(wal.look(&mut view), Forget::File, "two restarts");
        wal.commit(&[9]);
        wal.checkpoint();
        wal.restart();
        wal.commit(&[1]);
        wal.commit(&[1]);
        assert_eq!(
            wal.look(&mut view),
            Forget::File,
            "which WAL the commits went to"
        );
    }

    /// LiteFS applies a replicated transaction to the database file and bumps iChange with no
    /// frames: nothing says which pages changed.
    #[test]
    fn a_change_counter_bump_that_no_frames_explain_forgets_the_file() {
        let (mut wal, mut view) = (WalIndex::new(), WalView::default());
        wal.commit(&[1]);
        wal.look(&mut view);
        wal.change += 1;
        assert_eq!(wal.look(&mut view), Forget::File);
        wal.commit(&[2]);
        wal.change += 1;
        assert_eq!(wal.look(&mut view), Forget::File, "two commits, one frame");
        wal.frames.push(3);
        assert_eq!(wal.look(&mut view), Forget::File, "a frame, no commit");
    }

    /// A wal-index never written yet (the first connection to the WAL builds it next) is no
    /// look: before the view's first token, what it is built into is the first token.
    #[test]
    fn a_header_never_written_is_not_a_look() {
        let (mut wal, mut view) = (WalIndex::new(), WalView::default());
        wal.commit(&[1]);
        assert_eq!(
            view.look(Some(super::NOT_BUILT), &|_, _, _| None),
            Forget::Nothing
        );
        assert!(view.stamp_must_vouch());
        assert_eq!(wal.look(&mut view), Forget::Nothing, "the first look");
        assert!(!view.stamp_must_vouch());
        wal.commit(&[2]);
        assert_eq!(wal.look(&mut view), Forget::Nothing, "compared with it");
    }

    /// The wal-index rebuilt (a new `-shm` file, or one truncated at attach, then recovery)
    /// after our last look: iChange and nBackfill start at 0 again, and say nothing of the
    /// checkpoints run meanwhile. In the same WAL the frames we did not see backfilled are
    /// forgotten; another WAL forgets the file, even under our write lock (the connection that
    /// recovers holds it); an empty WAL is left to the stamp.
    #[test]
    fn a_rebuilt_wal_index_forgets_the_frames_not_seen_backfilled() {
        let (mut wal, mut view) = (WalIndex::new(), WalView::default());
        wal.commit(&[1]);
        wal.commit(&[2]);
        wal.checkpoint();
        wal.commit(&[3]);
        wal.look(&mut view);
        // Another process commits and checkpoints, every process detaches; the next to attach
        // finds the wal-index unbuilt and recovers it from the WAL file.
        wal.commit(&[4]);
        wal.checkpoint();
        assert_eq!(
            view.look(Some(super::NOT_BUILT), &|_, _, _| None),
            Forget::Nothing
        );
        assert!(view.stamp_must_vouch());
        wal.change = 0;
        wal.backfill = 0;
        view.writing = true;
        assert_eq!(wal.look(&mut view), pages(&[3, 4]));
        assert!(!view.stamp_must_vouch());
        assert_eq!(wal.look(&mut view), Forget::Nothing);
        view.writing = false;

        wal.checkpoint();
        wal.restart();
        wal.commit(&[5]);
        view.look(Some(super::NOT_BUILT), &|_, _, _| None);
        wal.change = 0;
        view.writing = true;
        assert_eq!(wal.look(&mut view), Forget::File, "another WAL");
        view.writing = false;

        // On a LiteFS replica: a transaction written into the file with no frames.
        let mut replica = WalView {
            replicated: true,
            ..WalView::default()
        };
        wal.look(&mut replica);
        replica.look(Some(super::NOT_BUILT), &|_, _, _| None);
        wal.change = 0;
        assert_eq!(wal.look(&mut replica), Forget::File, "a replica");

        // An empty WAL, no header written: salts 0, before and after.
        let (empty, mut view) = (WalIndex::empty(), WalView::default());
        empty.look(&mut view);
        view.look(Some(super::NOT_BUILT), &|_, _, _| None);
        assert_eq!(empty.look(&mut view), Forget::Nothing);
        assert!(!view.stamp_must_vouch(), "the caller took the stamp");
    }

    /// A header rewritten by a writer outside SQLite (LiteFS's replica) whose change counter
    /// did not move (an update lost, or written as it was): SQLite's own readers compare every
    /// byte of the header, and so do we.
    #[test]
    fn any_header_change_that_no_frames_explain_forgets_the_file() {
        let (mut wal, mut view) = (WalIndex::new(), WalView::default());
        wal.commit(&[1]);
        wal.look(&mut view);
        assert_eq!(wal.look(&mut view), Forget::Nothing);
        wal.n_page += 1;
        assert_eq!(wal.look(&mut view), Forget::File);
        assert_eq!(wal.look(&mut view), Forget::Nothing);
        wal.commit(&[2]);
        wal.n_page += 1;
        assert_eq!(
            wal.look(&mut view),
            Forget::Nothing,
            "a commit's frames explain its header"
        );
    }

    #[test]
    fn a_restart_is_ours_only_under_our_write_lock() {
        let (mut wal, mut view) = (WalIndex::new(), WalView::default());
        wal.commit(&[1]);
        wal.commit(&[2]);
        wal.look(&mut view);
        wal.checkpoint();
        wal.commit(&[4]);
        wal.checkpoint();
        wal.restart();
        view.writing = true;
        assert_eq!(
            wal.look(&mut view),
            Forget::Nothing,
            "our writer restarted it"
        );
        view.writing = false;
        wal.commit(&[5]);
        assert_eq!(wal.look(&mut view), Forget::Nothing);
        wal.checkpoint();
        wal.restart();
        wal.commit(&[6]);
        assert_eq!(
            wal.look(&mut view),
            pages(&[5]),
            "another process's restart"
        );
    }

    #[test]
    fn an_unreadable_token_forgets_the_file_and_keeps_the_last_one_to_compare_with() {
        let (mut wal, mut view) = (WalIndex::new(), WalView::default());
        wal.commit(&[1]);
        wal.look(&mut view);
        assert_eq!(view.look(None, &wal.pages()), Forget::File);
        wal.checkpoint();
        assert_eq!(wal.look(&mut view), pages(&[1]));
    }
}
