//! One extension for all the processes of a user on a machine: the ring stays one file, and
//! its index moves into shared memory, where every participating process finds what any of them
//! wrote. This module is the protocol; each process keeps its own writer, its own L1 and its
//! own change detection (see docs/DESIGN.md, "One extension for all processes").
//!
//! **Who is attached.** Each participant holds an exclusive open-file-description lock on its
//! own byte of the extension file (byte 1 + its slot); the kernel drops it when the process
//! dies, however it dies. Attaching and detaching hold the admin byte (65), so that the last
//! one to leave, and only it, deletes the file and the shared memory.
//!
//! **The lock.** Every change to the index, and every lookup, holds one robust process-shared
//! mutex for a few hundred nanoseconds (no I/O under it, bar a liveness probe when a claim
//! meets a region another process is filling). A holder that dies mid-change leaves the table
//! half changed; the next locker is told (`EOWNERDEAD`), empties the index and voids every
//! file's key (a file slot may be half given to another file): a cache flush, which costs hits,
//! never a stale page. L2 is behind an SSD read anyway, so one lock per
//! lookup is not what bounds it.
//!
//! **A holder that stops** (SIGSTOP, a debugger, a paused container) keeps the lock as long as
//! it is stopped. Nothing waits for it unbounded but the writer's thread: lookups and
//! invalidations wait [`LOCK_WAIT`] (a miss, a deferred removal); emptying, attaching and
//! detaching wait [`ADMIN_WAIT`] (emptied later; attaching refused with
//! `Error::SharedLockHeld`; detaching goes on without the lock); the writer waits until its
//! extension leaves ([`SharedIndex::interrupt_waits`], at OFF and at exit) or detaches.
//!
//! **Names.** Pages are named by a shared key per data file, handed out from one counter in
//! the segment and never reused: `(dev, ino)` maps to the file's current key. Forgetting all of
//! a file is giving it a new key, in O(1), for every process at once.
//!
//! **Whose segment.** The segment is named after the extension file's `(dev, ino)`, and carries
//! a random id its creator also writes on the file (an extended attribute): one found with
//! nobody attached is kept only if the ids match, so a new file that got a removed one's inode
//! number never adopts its index.
//!
//! **Never a stale page.** A process that has not watched a file (it opens it for the first
//! time, or its own change detection could not explain a change) binds it with the file's stamp:
//! the key is kept only if the stamp is the one the segment vouches for, i.e. the stamp left by
//! a participant's own write, every page of which it invalidated. Writes invalidate by page: a
//! write bumps the page's stripe of write epochs and removes its entry both before and after the
//! bytes go to the file. A page read from the data file is admitted only if its stripe is where
//! it was before the read, and its file's key has not moved: any write that overlapped or
//! followed the read voids the admission, and a write that follows the admission removes it.
//!
//! **Regions.** A writer claims the ring's next region under the lock (forgetting what it held,
//! bumping its epoch), writes a batch into it, and only then publishes the batch's entries, if
//! its claim still stands. A region left `FILLING` by a process that died is claimed by the next
//! writer that comes round to it. Reads check each page's crc32c (its number and bytes): a
//! region reused under a reader is a miss.

mod attached;
mod layout;
mod store;

pub use attached::{Attached, SharedRead};
pub use layout::{Geometry, MAX_PARTICIPANTS};
pub(crate) use store::SharedStore;

#[cfg(any(test, feature = "testing"))]
pub use super::index::page_crc;
use super::index::IndexStore;
pub use super::index::Location;
use crate::error::{Error, Result};
use crate::files::KnownStamp;
use crate::io::ofd;
use crate::io::own_file::{self, Access};
use crate::io::shared_memory::{Locked, SharedMemory};
use crate::io::FileIdentity;
use crate::page::{FileKey, PageKey};
use layout::{Header, Layout, Tables, FILLING, FREE, FULL, MAGIC};
use std::fs::File;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// The extension file's byte a participant in slot `i` locks.
const fn participant_byte(slot: usize) -> u64 {
    1 + slot as u64
}
/// Held while attaching and detaching.
const ADMIN_BYTE: u64 = 1 + MAX_PARTICIPANTS as u64;

/// The store a test's forked child dies after (0: none), counted from the child's start; see
/// [`stored`].
#[cfg(test)]
static CRASH_AT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
#[cfg(test)]
static STORES: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// A store to the shared tables is done (called after each one made under the lock, and
/// before each handing out of a table to write into). A test's forked child may die here, as
/// a SIGKILLed process would: the change half made, the lock held by a dead process.
#[inline(always)]
fn stored() {
    #[cfg(test)]
    {
        let at = CRASH_AT.load(Ordering::Relaxed);
        if at != 0 && STORES.fetch_add(1, Ordering::Relaxed) + 1 == at {
            // SAFETY: ends the forked (single-threaded) test child at once, running nothing else.
            unsafe { libc::_exit(0) };
        }
    }
}

pub use crate::page::SharedFile;

/// What a lookup found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Found {
    Hit(SharedHit),
    Miss,
    /// The file's key moved on (another process forgot the file): `follow` it.
    Moved,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SharedHit {
    pub location: Location,
    /// The process whose writer put the page there.
    pub loader_pid: u32,
    pub mine: bool,
}

/// A page written into a claimed region, to be published.
#[derive(Clone, Copy, Debug)]
pub struct Admission {
    pub file: SharedFile,
    pub page: u64,
    /// Byte offset within the region.
    pub offset: usize,
    pub len: usize,
    pub crc: u32,
    /// The page's write epoch read before its bytes were read from the data file.
    pub epoch: u64,
}

/// A region this process's writer may fill.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Claim {
    pub region: usize,
    epoch: u64,
    /// Pages the region held (the ring's oldest), now forgotten.
    pub evicted: usize,
}

/// The shared index as one process sees it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SharedStats {
    pub pages: u64,
    pub bytes: u64,
    pub participants: usize,
    pub recoveries: u64,
    /// Times this process's bounded wait for the lock gave up (see [`LOCK_WAIT`]).
    pub lock_timeouts: u64,
    /// RAM the shared memory takes (once for all processes).
    pub resident_bytes: u64,
}

pub struct SharedIndex {
    mem: SharedMemory,
    layout: Layout,
    /// This process's own open description of the extension file: its participant lock.
    locks: File,
    me: usize,
    pid: u32,
    /// Set if the mutex can never be taken again; every call then misses or refuses.
    broken: AtomicBool,
    /// Invalidations made while another process held the lock too long (stopped, say): applied
    /// at this process's next lock, hidden from lookups until then (see `invalidate`).
    deferred: crate::sync::Mutex<Vec<(SharedFile, u64, FileIdentity)>>,
    /// Times a bounded wait for the lock gave up (a miss, or a deferred invalidation).
    lock_timeouts: AtomicU64,
    /// How long this process waited for the lock, each time it took it.
    lock_wait: crate::counters::Histogram,
    /// Until when (ms since `started`) a holder is taken to be stalled: bounded waits then
    /// only try the lock, so that a stopped holder costs each lookup nothing more.
    stalled_until_ms: AtomicU64,
    started: std::time::Instant,
    /// An `empty` that could not wait for a stopped holder: done by this process's next lock.
    empty_pending: std::sync::atomic::AtomicBool,
    /// Set by `detach` before it lets the segment go; no [`InUse`] is handed out after.
    detached: AtomicBool,
    /// Set when the extension stops its writer (OFF, exit): the writer's unbounded waits for
    /// the lock give up (see [`SharedIndex::interrupt_waits`]).
    leaving: AtomicBool,
    /// [`InUse`] tokens alive: threads touching the mapping now (`detach` waits for them).
    in_use: AtomicU64,
}

/// Held by a thread while it touches the shared mapping. Once a process detaches, its segment
/// may be laid out anew (truncated and zeroed) by the next process to attach, or swept: a late
/// touch from a thread of the detached process would then be a SIGBUS, or a write into another
/// layout's tables. `detach` marks the index detached and waits for every token to go before
/// it gives up its participant lock, so no touch comes after.
struct InUse<'a>(&'a SharedIndex);

impl Drop for InUse<'_> {
    fn drop(&mut self) {
        self.0.in_use.fetch_sub(1, Ordering::SeqCst);
    }
}

/// How long `detach` waits for threads still touching the mapping (a lookup waits at most
/// [`LOCK_WAIT`]); past it (counts copied into a forked child from threads it does not have)
/// it goes on, logged.
const DETACH_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// How long a lookup, a binding or an invalidation waits for the lock before it gives up: about
/// a slow-disk read, far more than anyone holds it (a few hundred nanoseconds), and more than a
/// holder preempted on a busy machine usually waits for a CPU (a give-up is a miss).
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_millis(5);
/// After a wait gave up, bounded waits only try the lock for this long.
const STALL_MS: u64 = 100;
/// How long DBCC DROPCLEANBUFFERS waits for the lock before it leaves the emptying to this
/// process's next lock: an operator's command, never stalled by a stopped participant.
const EMPTY_WAIT: std::time::Duration = std::time::Duration::from_secs(1);
/// How long attaching and detaching wait for the lock and for the admin byte: as long as
/// emptying does, an operator's command never stalled by a stopped participant. Past it,
/// attaching is refused and detaching goes on without them (see `detach`).
const ADMIN_WAIT: std::time::Duration = EMPTY_WAIT;
/// How often a wait without a bound looks whether it should give up (the extension leaves).
const LEAVING_POLL: std::time::Duration = std::time::Duration::from_millis(20);

/// Removes this user's shared memory of extension files that are gone (removed by hand, their
/// temporary directory cleaned, an older version's layout), once no process has it open: a
/// clean exit leaves the shared memory beside its file for the next process to start warm
/// from, and nothing else would ever remove it.
pub fn remove_orphaned_memory() {
    let Ok(dir) = crate::io::shm_dir::own_directory() else {
        return;
    };
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(identity) = name
            .to_str()
            .and_then(|n| n.strip_prefix("extension-")?.strip_suffix(".shared"))
            .and_then(|n| n.split_once('-'))
            .and_then(|(dev, ino)| Some((dev.parse::<u64>().ok()?, ino.parse::<u64>().ok()?)))
        else {
            continue;
        };
        let segment = entry.path();
        crate::io::shared_memory::remove_if_unused(&segment, |f| match file_of_segment(f) {
            Some(path) => {
                std::fs::symlink_metadata(path).map_or(true, |m| (m.dev(), m.ino()) != identity)
            }
            // Another layout version's: its processes may hold no lock on it (older ones did
            // not), so only a segment that no process maps is unused.
            None => !crate::io::shared_memory::mapped_by_any_process(&segment, f),
        });
    }
}

/// The extension file a segment was laid out for; None if it is not one of this version's.
fn file_of_segment(segment: &File) -> Option<PathBuf> {
    use std::os::unix::fs::FileExt;
    let mut header = vec![0u8; std::mem::size_of::<Header>()];
    segment.read_exact_at(&mut header, 0).ok()?;
    let u64_at = |at: usize| u64::from_ne_bytes(header[at..at + 8].try_into().expect("8 bytes"));
    if u64_at(std::mem::offset_of!(Header, magic)) != MAGIC {
        return None;
    }
    let len = (u64_at(std::mem::offset_of!(Header, path_len)) as usize).min(layout::PATH_BYTES);
    let at = std::mem::offset_of!(Header, path);
    let bytes = &header[at..at + len];
    Some(PathBuf::from(std::ffi::OsStr::from_bytes(bytes)))
}

fn no_memory(path: &Path, reason: String) -> Error {
    Error::SharedMemoryUnavailable {
        path: path.to_path_buf(),
        reason,
    }
}

fn lock_held(path: &Path) -> Error {
    Error::SharedLockHeld {
        path: path.to_path_buf(),
        waited_ms: ADMIN_WAIT.as_millis() as u64,
    }
}

fn bad(path: &Path, reason: impl Into<String>) -> Error {
    Error::BadExtensionPath {
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

/// The shared memory of the extension file (dev, ino); refused, naming the directory and why,
/// if this user's directory for it is not this user's alone.
pub fn memory_path(identity: FileIdentity) -> std::io::Result<PathBuf> {
    crate::io::shm_dir::extension_memory_path(identity)
}

struct Guard<'a> {
    index: &'a SharedIndex,
    tables: Tables<'a>,
    // Dropped after `drop` below unlocked.
    _in_use: InUse<'a>,
}

impl Drop for Guard<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // A change may be half done: leave an empty index rather than a broken one.
            self.tables.recover();
        }
        self.index.header().mutex.unlock();
    }
}

impl SharedIndex {
    /// Joins the shared extension whose file is at `path` (created by the caller), creating its
    /// shared memory if this is the first participant. Refused with a reason if the file is not
    /// there, the shared memory is not this user's, the processes attached use another
    /// geometry, or 64 processes are attached.
    pub fn attach(path: &Path, geometry: Geometry) -> Result<SharedIndex> {
        remove_orphaned_memory();
        let locks = own_file::open(path, Access::Update)
            .map_err(|e| bad(path, format!("cannot open it to attach: {e}")))?;
        // Held by a process attaching or detaching: for an instant, unless it is stopped.
        if !ofd::exclusive_within(&locks, ADMIN_BYTE, ADMIN_WAIT) {
            return Err(lock_held(path));
        }
        let attached = Self::attach_locked(path, geometry, locks);
        if let Ok(index) = &attached {
            ofd::release(&index.locks, ADMIN_BYTE);
        }
        attached
    }

    fn attach_locked(path: &Path, geometry: Geometry, locks: File) -> Result<SharedIndex> {
        let meta = locks.metadata().map_err(|e| bad(path, e.to_string()))?;
        let now = std::fs::symlink_metadata(path).map_err(|e| bad(path, e.to_string()))?;
        if (now.dev(), now.ino()) != (meta.dev(), meta.ino()) {
            return Err(bad(path, "it was replaced while attaching"));
        }
        let identity = FileIdentity {
            dev: meta.dev(),
            ino: meta.ino(),
        };
        let shm = memory_path(identity)
            .map_err(|e| no_memory(path, format!("no shared memory for it: {e}")))?;
        let others = (0..MAX_PARTICIPANTS)
            .filter(|&i| ofd::held_elsewhere(&locks, participant_byte(i)))
            .count();
        let layout = Layout::new(geometry);
        // Never resized under processes attached to it: a segment of another length is theirs,
        // of another size or version, and is refused below.
        let mem = SharedMemory::open(&shm, layout.len, others == 0)
            .map_err(|e| no_memory(path, format!("its shared memory {e}")))?;
        let me = (0..MAX_PARTICIPANTS)
            .find(|&i| ofd::try_exclusive(&locks, participant_byte(i)))
            .ok_or_else(|| {
                bad(
                    path,
                    format!("{MAX_PARTICIPANTS} processes share it already"),
                )
            })?;
        let index = SharedIndex {
            mem,
            layout,
            locks,
            me,
            pid: crate::io::pid::current(),
            broken: AtomicBool::new(false),
            deferred: crate::sync::Mutex::new(crate::sync::Rank::Leaf, Vec::new()),
            lock_timeouts: AtomicU64::new(0),
            lock_wait: Default::default(),
            stalled_until_ms: AtomicU64::new(0),
            empty_pending: std::sync::atomic::AtomicBool::new(false),
            detached: AtomicBool::new(false),
            leaving: AtomicBool::new(false),
            in_use: AtomicU64::new(0),
            started: std::time::Instant::now(),
        };
        let header = index.header();
        let mut valid =
            header.magic.load(Ordering::Acquire) == MAGIC && header.geometry == geometry;
        // Left by processes that are all gone, and by this very file (not by a removed one whose
        // inode number this file got): its index is kept (bindings check stamps), its list of
        // who is attached is not. Processes attached now hold this file: it is theirs.
        if valid && others == 0 && file_id(&index.locks) != Some(header.file_id) {
            valid = false;
        }
        if valid && others == 0 {
            if let Some(g) = index.lock_with(Some(ADMIN_WAIT)) {
                g.tables
                    .participants
                    .iter_mut()
                    .for_each(|p| p.attached = 0);
            }
        }
        if !valid {
            if others > 0 {
                return Err(bad(
                    path,
                    format!(
                        "the {others} processes attached to it use another extension size or \
                         version; detach them first"
                    ),
                ));
            }
            index.initialize(path)?;
        }
        let Some(g) = index.lock_with(Some(ADMIN_WAIT)) else {
            if index.broken.load(Ordering::Relaxed) {
                return Err(bad(path, "its shared memory's lock is unusable"));
            }
            return Err(lock_held(path));
        };
        g.tables.participants[me].pid = index.pid;
        g.tables.participants[me].attached = 1;
        drop(g);
        Ok(index)
    }

    /// Lays out a new segment for the extension file at `path` (nobody else is attached; the
    /// admin byte is held).
    fn initialize(&self, path: &Path) -> Result<()> {
        let failed = |e: std::io::Error| {
            no_memory(path, format!("its shared memory cannot be laid out: {e}"))
        };
        self.mem.zero().map_err(failed)?;
        let base = self.mem.base().as_ptr();
        let id = random_id();
        // SAFETY: the mapping is at least a Header long and page-aligned; nobody else maps it
        // while the admin byte is held and no participant is attached, so the plain writes to
        // the geometry, the id and the mutex's init race with nothing. The magic, written last
        // with Release, publishes them.
        unsafe {
            let header = &mut *(base as *mut Header);
            header.geometry = self.layout.geometry;
            header.file_id = id;
            let bytes = path.as_os_str().as_encoded_bytes();
            let kept = bytes.len().min(layout::PATH_BYTES);
            header.path[..kept].copy_from_slice(&bytes[..kept]);
            header.path_len = kept as u64;
            header.mutex.init().map_err(failed)?;
            let t = Tables::of(base, &self.layout);
            t.totals.next_key = 1;
            // Without it (extended attributes unsupported) the segment serves while it is
            // attached, and the next process that finds it unattached lays it out anew.
            set_file_id(&self.locks, id);
            header.magic.store(MAGIC, Ordering::Release);
        }
        Ok(())
    }

    /// Leave to touch the mapping (None once detached): both SeqCst, so that either `detach`
    /// sees this token or this sees `detached` (a store-load pair on each side).
    fn enter(&self) -> Option<InUse<'_>> {
        self.in_use.fetch_add(1, Ordering::SeqCst);
        let token = InUse(self);
        (!self.detached.load(Ordering::SeqCst)).then_some(token)
    }

    fn header(&self) -> &Header {
        // SAFETY: the mapping starts with a Header (page-aligned); after initialization its
        // geometry is never written again, its magic is atomic, and its mutex is only used
        // through pthread calls.
        unsafe { &*(self.mem.base().as_ptr() as *const Header) }
    }

    /// One of the segment's arrays of `geometry.stripes` atomics, at byte `offset`.
    fn atomics(&self, offset: usize) -> &[AtomicU64] {
        // SAFETY: the layout places `geometry.stripes` atomics at this offset (`stripes` or
        // `pending`), inside the mapping; atomics may be shared with any thread of any process.
        unsafe {
            std::slice::from_raw_parts(
                self.mem.base().as_ptr().add(offset) as *const AtomicU64,
                self.layout.geometry.stripes as usize,
            )
        }
    }

    /// The page's stripe: named by the file's identity, not its slot or key, so that a write
    /// can void copies of the page without the lock (see `invalidate`).
    fn stripe_of(&self, id: FileIdentity, page: u64) -> usize {
        let stripes = self.layout.geometry.stripes;
        debug_assert!(stripes.is_power_of_two());
        let h = (id.dev.rotate_left(17) ^ id.ino).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ page;
        // The product's top bits, as many as the stripes need (the low bits mix poorly).
        let top = h.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - stripes.trailing_zeros());
        (top % stripes) as usize
    }

    /// Takes the lock, however long its holder keeps it (the writer's thread, forgetting a
    /// file: nothing a query waits for), unless this process detaches meanwhile, or its
    /// extension leaves (see [`interrupt_waits`](Self::interrupt_waits)).
    fn lock(&self) -> Option<Guard<'_>> {
        self.lock_with(None)
    }

    /// The extension is going (OFF, a resize, exit): from now on, waits without a bound (the
    /// writer's claims, publications and seals, forgetting a file) give up within
    /// [`LEAVING_POLL`] when the lock is not free, so that the writer stops and the extension
    /// detaches while another participant is stopped holding the lock. A give-up writes or
    /// forgets nothing: a region left `FILLING` is taken by the next writer once this process
    /// is gone, as a dead process's.
    pub fn interrupt_waits(&self) {
        self.leaving.store(true, Ordering::SeqCst);
    }

    /// Takes the lock if that takes at most [`LOCK_WAIT`] (nothing more while a holder is
    /// stalled): what queries use, so that a holder stopped by SIGSTOP, a debugger or a paused
    /// container costs them a miss, never a stall.
    fn lock_briefly(&self) -> Option<Guard<'_>> {
        if let Some(g) = self.lock_if_free() {
            return Some(g);
        }
        let now_ms = self.started.elapsed().as_millis() as u64;
        let stalled = now_ms < self.stalled_until_ms.load(Ordering::Relaxed);
        let wait = if stalled {
            std::time::Duration::ZERO
        } else {
            LOCK_WAIT
        };
        let g = self.lock_with(Some(wait));
        if g.is_none() && !self.broken.load(Ordering::Relaxed) {
            self.lock_timeouts.fetch_add(1, Ordering::Relaxed);
            if !stalled {
                self.stalled_until_ms
                    .store(now_ms + STALL_MS, Ordering::Relaxed);
            }
        }
        g
    }

    /// The lock if it is free now: a waitless acquisition, counted in the wait histogram's
    /// first bucket without reading a clock (four clock reads per lookup cost more than the
    /// lock itself).
    fn lock_if_free(&self) -> Option<Guard<'_>> {
        if self.broken.load(Ordering::Relaxed) {
            return None;
        }
        let in_use = self.enter()?;
        match self.header().mutex.try_lock() {
            Ok(Some(found)) => {
                self.lock_wait.record(std::time::Duration::ZERO);
                Some(self.guard(found, in_use))
            }
            Ok(None) => None,
            Err(e) => self.unusable(e),
        }
    }

    fn unusable<T>(&self, e: std::io::Error) -> Option<T> {
        log::error!("shared buffer pool extension: its lock is unusable ({e}); missing");
        self.broken.store(true, Ordering::Relaxed);
        None
    }

    fn lock_with(&self, wait: Option<std::time::Duration>) -> Option<Guard<'_>> {
        if self.broken.load(Ordering::Relaxed) {
            return None;
        }
        let in_use = self.enter()?;
        let mutex = &self.header().mutex;
        let started = std::time::Instant::now();
        let found = loop {
            match mutex.lock_within(wait.unwrap_or(LEAVING_POLL)) {
                Ok(Some(found)) => break found,
                // No bound: wait on, unless told to give up (`detach` waits for this thread).
                Ok(None)
                    if wait.is_none()
                        && !self.leaving.load(Ordering::SeqCst)
                        && !self.detached.load(Ordering::SeqCst) => {}
                Ok(None) => return None,
                Err(e) => return self.unusable(e),
            }
        };
        self.lock_wait.record(started.elapsed());
        Some(self.guard(found, in_use))
    }

    /// The guard of the lock this thread just took (`found`: how).
    fn guard<'a>(&'a self, found: Locked, in_use: InUse<'a>) -> Guard<'a> {
        // SAFETY: the mapping is laid out by self.layout and this thread now holds its mutex;
        // the guard is the only Tables made from it until it unlocks.
        let tables = unsafe { Tables::of(self.mem.base().as_ptr(), &self.layout) };
        let mut g = Guard {
            index: self,
            tables,
            _in_use: in_use,
        };
        if found == Locked::OwnerDied {
            // Its holder died mid-change: the tables may be half changed (a file slot too).
            // Start afresh: no entry, and no file name from before is found again.
            g.tables.recover();
            g.tables.totals.recoveries += 1;
            log::warn!(
                "shared buffer pool extension: a process died holding its lock; index emptied"
            );
        }
        if self.empty_pending.load(Ordering::Relaxed)
            && self.empty_pending.swap(false, Ordering::AcqRel)
        {
            g.tables.recover();
        }
        self.apply_deferred(&mut g.tables);
        g
    }

    /// Removes the copies that invalidations made without the lock left in place.
    fn apply_deferred(&self, t: &mut Tables<'_>) {
        let mut list = self.deferred.lock();
        // A forked child has a copy of the list: only the process that made it applies it
        // (applied twice, a count would go below what other processes' writes still need).
        if list.is_empty() || crate::io::pid::current() != self.pid {
            return;
        }
        let deferred = std::mem::take(&mut *list);
        drop(list);
        for (file, page, id) in deferred {
            self.remove_copy(t, file, page, id);
        }
    }

    /// Removes the copy of page `page` of file `id` and takes back its pending invalidation.
    fn remove_copy(&self, t: &mut Tables<'_>, file: SharedFile, page: u64, id: FileIdentity) {
        if let Some(slot) = self.slot_of(t, file, id) {
            t.remove(PageKey::new(t.files[slot as usize].key, page));
        }
        let before = self.atomics(self.layout.pending)[self.stripe_of(id, page)]
            .fetch_sub(1, Ordering::SeqCst);
        strict_assert!(before > 0, "a pending invalidation taken back twice");
    }

    #[cfg(any(test, feature = "testing"))]
    /// This process's participant slot.
    pub fn slot(&self) -> usize {
        self.me
    }

    #[cfg(any(test, feature = "testing"))]
    /// Takes the lock as this participant and stops the whole process (SIGSTOP) holding it,
    /// as a debugger or a paused container would stop it; lets go once continued (SIGCONT).
    /// Tests: what a stopped participant costs the others.
    pub fn stop_holding_the_lock(&self) {
        let g = self.lock();
        // SAFETY: raise only sends a signal to this process; the default action of SIGSTOP
        // stops it until SIGCONT, and the call then returns.
        unsafe { libc::raise(libc::SIGSTOP) };
        drop(g);
    }

    /// Other processes attached now.
    pub fn others_attached(&self) -> usize {
        (0..MAX_PARTICIPANTS)
            .filter(|&i| i != self.me && ofd::held_elsewhere(&self.locks, participant_byte(i)))
            .count()
    }

    /// Leaves the shared extension; every later call misses or refuses. The last participant
    /// to leave runs `on_last` (which deletes the extension file) and removes the shared memory,
    /// unless `keep` (a clean exit: the next process to share the file starts warm from it),
    /// before anyone can attach again. Returns whether this was the last.
    ///
    /// Bounded while another participant is stopped holding the lock or the admin byte: without
    /// the admin byte this process is never the last (the file and the memory stay, for the
    /// others or the next to attach); without the lock its slot and its regions are not marked
    /// free (a region left `FILLING` is taken by the next writer once this process's
    /// participant byte is released, as a dead process's).
    pub fn detach(&self, keep: bool, on_last: impl FnOnce()) -> bool {
        self.interrupt_waits();
        let admin = ofd::exclusive_within(&self.locks, ADMIN_BYTE, ADMIN_WAIT);
        if let Some(g) = self.lock_with(Some(ADMIN_WAIT)) {
            g.tables.participants[self.me].attached = 0;
            for r in g.tables.regions.iter_mut() {
                if r.state == FILLING && r.owner as usize == self.me {
                    r.state = FREE;
                }
            }
        }
        self.broken.store(true, Ordering::Relaxed);
        self.detached.store(true, Ordering::SeqCst);
        let started = std::time::Instant::now();
        while self.in_use.load(Ordering::SeqCst) > 0 {
            if started.elapsed() > DETACH_WAIT {
                log::warn!(
                    "shared buffer pool extension: detaching with {} uses of its memory \
                     outstanding (a forked process's copies of its parent's threads?)",
                    self.in_use.load(Ordering::SeqCst)
                );
                break;
            }
            std::thread::yield_now();
        }
        // From here on, this process never touches the segment: it may be laid out anew.
        ofd::release(&self.locks, participant_byte(self.me));
        // Last: no participant left, and nobody between opening the file and attaching (they
        // hold byte 0 shared, as every participant's file does; the caller released its own).
        let last = admin
            && !(0..MAX_PARTICIPANTS)
                .any(|i| ofd::held_elsewhere(&self.locks, participant_byte(i)))
            && ofd::try_exclusive(&self.locks, 0);
        if last && !keep {
            self.mem.unlink();
            on_last();
        }
        // Every later call misses or refuses (`broken`): the segment may be swept from now on.
        self.mem.release_use();
        ofd::release(&self.locks, 0);
        if admin {
            ofd::release(&self.locks, ADMIN_BYTE);
        }
        last
    }

    /// Binds a file this process has not been watching: the key its pages are shared under.
    /// The current key is kept only if `stamp` is the one the segment vouches for; otherwise
    /// the file gets a new key (nothing cached for it is served) and, if the stamp can vouch
    /// (not racy), it is recorded. None only if the lock is unusable.
    pub fn bind(&self, stamp: KnownStamp) -> Option<SharedFile> {
        let id = stamp.stamp.identity;
        let mut g = self.lock_briefly()?;
        let t = &mut g.tables;
        let found = t
            .files
            .iter()
            .position(|f| f.key != 0 && (f.dev, f.ino) == (id.dev, id.ino));
        let slot = match found {
            Some(slot) => {
                let f = &t.files[slot];
                let same = f.vouched == 1
                    && (f.size, f.mtime_ns, f.ctime_ns)
                        == (stamp.stamp.size, stamp.stamp.mtime_ns, stamp.stamp.ctime_ns);
                if same && !stamp.racy {
                    return Some(SharedFile {
                        slot: slot as u32,
                        key: f.key,
                    });
                }
                slot
            }
            None => {
                // A free slot, else the one with the oldest key (its pages become unreachable).
                let free = t.files.iter().position(|f| f.key == 0);
                free.unwrap_or_else(|| {
                    (0..t.files.len())
                        .min_by_key(|&i| t.files[i].key)
                        .expect("files")
                })
            }
        };
        let key = new_key(t);
        let f = &mut t.files[slot];
        // Separate stores, any of which a process may die after (see `Tables::recover`).
        f.dev = id.dev;
        stored();
        f.ino = id.ino;
        stored();
        f.key = key;
        stored();
        record_stamp(f, stamp);
        Some(SharedFile {
            slot: slot as u32,
            key,
        })
    }

    /// The file's current key, for a process that has been watching it (its own change
    /// detection vouches for its reads) after another process moved the key on. None if the
    /// slot now holds another file: bind it afresh.
    pub fn follow(&self, file: SharedFile, id: FileIdentity) -> Option<SharedFile> {
        let g = self.lock_briefly()?;
        let f = &g.tables.files[file.slot as usize];
        ((f.dev, f.ino) == (id.dev, id.ino) && f.key != 0).then_some(SharedFile {
            slot: file.slot,
            key: f.key,
        })
    }

    #[cfg(any(test, feature = "testing"))]
    /// The data file a shared name is for, if its slot still holds it.
    pub fn identity_of(&self, file: SharedFile) -> Option<FileIdentity> {
        let g = self.lock_briefly()?;
        let f = &g.tables.files[file.slot as usize];
        (f.key != 0).then_some(FileIdentity {
            dev: f.dev,
            ino: f.ino,
        })
    }

    /// Every cached page: (shared key, page, the pid of the process that loaded it, whether
    /// this participant did).
    pub fn entries(&self) -> Vec<(FileKey, u64, u32, bool)> {
        let Some(g) = self.lock_briefly() else {
            return Vec::new();
        };
        let t = &g.tables;
        (0..t.regions.len())
            .flat_map(|r| {
                let slot = &t.regions[r];
                let (pid, mine) = (
                    slot.owner_pid,
                    slot.owner as usize == self.me && slot.owner_pid == self.pid,
                );
                t.region_entries(r)
                    .map(move |(k, _)| (k.file, k.page, pid, mine))
            })
            .collect()
    }

    #[cfg(any(test, feature = "testing"))]
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The descriptor holding this participant's lock, for a forked child to close (else the
    /// child would keep the parent's slot alive after the parent died).
    pub fn raw_fd(&self) -> i32 {
        use std::os::unix::io::AsRawFd;
        self.locks.as_raw_fd()
    }

    /// Records the stamp this process's own writes left (under the database lock they were made
    /// under): it vouches for the file's entries to the next process that binds it.
    pub fn vouch(&self, file: SharedFile, stamp: KnownStamp) {
        if let Some(g) = self.lock_briefly() {
            let f = &mut g.tables.files[file.slot as usize];
            if f.key == file.key {
                record_stamp(f, stamp);
            }
        }
    }

    /// Forgets every page of the file `id` (named `file` when this process bound it), for every
    /// process (a truncation, a change nobody can attribute). Returns its new name. The file is
    /// found by identity, as `invalidate` finds it: another process may have moved the key on
    /// since this one bound it, and the change must reach the current key (the simulation in
    /// sim.rs served a stale page when a forget under an old name did nothing).
    pub fn forget_file(&self, file: SharedFile, id: FileIdentity) -> Option<SharedFile> {
        let mut g = self.lock()?;
        let t = &mut g.tables;
        let slot = self.slot_of(t, file, id)?;
        let key = new_key(t);
        let f = &mut t.files[slot as usize];
        f.key = key;
        stored();
        f.vouched = 0;
        stored();
        Some(SharedFile { slot, key })
    }

    /// Empties the index for every process (DBCC DROPCLEANBUFFERS: one extension per machine, as
    /// SQL Server has one buffer pool per instance): every entry goes and every file's key is
    /// voided, exactly as a recovery does, so claims and reads in flight miss. False when the
    /// lock's holder kept it past [`EMPTY_WAIT`] (stopped): this process's next lock empties it
    /// then, and until then no process can look anything up either.
    pub fn empty(&self) -> bool {
        self.empty_pending.store(true, Ordering::Release);
        // The guard empties it (see `guard`), whoever takes the lock first in this process.
        let emptied = self.lock_with(Some(EMPTY_WAIT)).is_some();
        if !emptied && !self.broken.load(Ordering::Relaxed) {
            log::warn!(
                "shared buffer pool extension: its lock is held by a stopped process; emptied \
                 when it lets go"
            );
        }
        emptied
    }

    /// The slot that holds file `id`: the one `file` names if it still does, else any.
    fn slot_of(&self, t: &Tables<'_>, file: SharedFile, id: FileIdentity) -> Option<u32> {
        let holds = |f: &layout::FileSlot| f.key != 0 && (f.dev, f.ino) == (id.dev, id.ino);
        match holds(&t.files[file.slot as usize]) {
            true => Some(file.slot),
            false => t.files.iter().position(holds).map(|s| s as u32),
        }
    }

    /// The page's write epoch: read it before reading the page from the data file, and admit
    /// the page with it.
    pub fn epoch(&self, id: FileIdentity, page: u64) -> u64 {
        // Detached: nothing read now can be published any more.
        let Some(_in_use) = self.enter() else {
            return 0;
        };
        self.atomics(self.layout.stripes)[self.stripe_of(id, page)].load(Ordering::SeqCst)
    }

    /// The write epoch of a page of the file a name's slot holds (tests, which name files by
    /// their bindings).
    #[cfg(test)]
    pub(crate) fn epoch_of(&self, file: SharedFile, page: u64) -> u64 {
        let id = {
            let g = self.lock().expect("lock");
            let f = &g.tables.files[file.slot as usize];
            FileIdentity {
                dev: f.dev,
                ino: f.ino,
            }
        };
        self.epoch(id, page)
    }

    /// Invalidates page `page` of the file `id` (named `file` when this process bound it, a
    /// hint: its slot may have gone to another file since) for every process: called before
    /// its bytes go to the data file and again after (a read that overlapped the write cannot
    /// be admitted either way).
    ///
    /// Without the lock, first: the page's write epoch moves (an admission read before it is
    /// refused at publication) and its stripe counts one pending invalidation (a lookup finds
    /// no copy in a stripe with one). Then, under the lock, the copy is removed and the pending
    /// count taken back. If the lock is not free within [`LOCK_WAIT`] (its holder is stopped),
    /// the removal waits for this process's next lock, and the write goes ahead at once.
    ///
    /// Detached, it does nothing: the segment is no longer this process's to touch, and its
    /// writes are then a foreign writer's, which every process's change detection catches (the
    /// WAL index, the header's change counter) as it catches plain SQLite's.
    pub fn invalidate(&self, file: SharedFile, page: u64, id: FileIdentity) {
        let Some(_in_use) = self.enter() else {
            return;
        };
        let stripe = self.stripe_of(id, page);
        self.atomics(self.layout.stripes)[stripe].fetch_add(1, Ordering::SeqCst);
        self.atomics(self.layout.pending)[stripe].fetch_add(1, Ordering::SeqCst);
        stored();
        match self.lock_briefly() {
            Some(mut g) => self.remove_copy(&mut g.tables, file, page, id),
            // The lock unusable: nobody can look anything up either; the count stays.
            None if self.broken.load(Ordering::Relaxed) => {}
            None => self.deferred.lock().push((file, page, id)),
        }
    }

    /// Where the page is cached, if it is. The caller reads it and checks it against the crc.
    /// A miss if the lock is not free within [`LOCK_WAIT`].
    pub fn lookup(&self, file: SharedFile, page: u64) -> Found {
        let Some(g) = self.lock_briefly() else {
            return Found::Miss;
        };
        let t = &g.tables;
        let f = &t.files[file.slot as usize];
        if f.key != file.key {
            return Found::Moved;
        }
        let Some(location) = t.lookup(PageKey::new(file.key, page)) else {
            return Found::Miss;
        };
        let id = FileIdentity {
            dev: f.dev,
            ino: f.ino,
        };
        if self.atomics(self.layout.pending)[self.stripe_of(id, page)].load(Ordering::SeqCst) > 0 {
            return Found::Miss; // a write's removal waits for its process's next lock
        }
        let region = &t.regions[(location.offset / t.region_bytes()) as usize];
        Found::Hit(SharedHit {
            location,
            loader_pid: region.owner_pid,
            mine: region.owner as usize == self.me && region.owner_pid == self.pid,
        })
    }

    /// The region the ring overwrites next (the next claim starts its search there); None if
    /// the index cannot be locked now.
    pub fn ring_head(&self) -> Option<usize> {
        let g = self.lock_briefly()?;
        Some(g.tables.totals.ring_head as usize)
    }

    /// Removes the page's entry if it still is `location` (its read failed its checksum).
    pub fn drop_if(&self, file: SharedFile, page: u64, location: Location) -> bool {
        let Some(mut g) = self.lock_briefly() else {
            return false;
        };
        let key = PageKey::new(file.key, page);
        if g.tables.lookup(key) == Some(location) {
            g.tables.remove(key);
            true
        } else {
            false
        }
    }

    /// Claims the ring's next region for this process's writer, forgetting what it held. A
    /// region another live process is filling is passed over; one left filling by a dead
    /// process is taken. None if every region is being filled (or the lock is unusable).
    pub fn claim_region(&self) -> Option<Claim> {
        let mut g = self.lock()?;
        let regions = g.tables.regions.len();
        let head = g.tables.totals.ring_head as usize;
        for step in 0..regions {
            let r = (head + step) % regions;
            let slot = &g.tables.regions[r];
            if slot.state == FILLING
                && slot.owner as usize != self.me
                && ofd::held_elsewhere(&self.locks, participant_byte(slot.owner as usize))
            {
                continue;
            }
            let evicted = g.tables.clear_region(r);
            let slot = &mut g.tables.regions[r];
            slot.state = FILLING;
            stored();
            slot.owner = self.me as u32;
            stored();
            slot.owner_pid = self.pid;
            stored();
            slot.epoch += 1;
            stored();
            let epoch = slot.epoch;
            g.tables.totals.ring_head = ((r + 1) % regions) as u64;
            stored();
            strict_assert!(
                g.tables.region(r).is_empty(),
                "a claimed region still lists pages"
            );
            return Some(Claim {
                region: r,
                epoch,
                evicted,
            });
        }
        None
    }

    /// Publishes pages written into the claimed region: each one whose file key and write epoch
    /// are unchanged since its read is indexed. Returns how many were; None if the claim no
    /// longer stands (a recovery emptied the index meanwhile): the writer must claim anew.
    pub fn publish(&self, claim: Claim, pages: &[Admission]) -> Option<usize> {
        let mut g = self.lock()?;
        if !self.holds(&g.tables, claim) {
            return None;
        }
        let mut indexed = 0;
        for a in pages {
            // Entries point only at bytes inside the region the writer holds (rule 4).
            strict_assert!(a.offset + a.len <= g.tables.region_bytes() as usize);
            let f = &g.tables.files[a.file.slot as usize];
            let id = FileIdentity {
                dev: f.dev,
                ino: f.ino,
            };
            let current = f.key == a.file.key && self.epoch(id, a.page) == a.epoch;
            if current
                && g.tables.insert_entry(
                    PageKey::new(a.file.key, a.page),
                    claim.region,
                    a.offset,
                    a.len,
                    a.crc,
                    false,
                )
            {
                indexed += 1;
            }
        }
        Some(indexed)
    }

    /// The claim still stands: no recovery voided it (checked before each write into its
    /// region after the first).
    pub fn holds_claim(&self, claim: Claim) -> bool {
        self.lock().is_some_and(|g| self.holds(&g.tables, claim))
    }

    fn holds(&self, t: &Tables<'_>, claim: Claim) -> bool {
        let r = &t.regions[claim.region];
        r.state == FILLING && r.owner as usize == self.me && r.epoch == claim.epoch
    }

    /// The writer is done with the region (it is full, or the writer stops).
    pub fn seal(&self, claim: Claim) {
        if let Some(g) = self.lock() {
            if self.holds(&g.tables, claim) {
                g.tables.regions[claim.region].state = FULL;
                stored();
            }
        }
    }

    pub fn stats(&self) -> SharedStats {
        let resident_bytes = self.mem.resident_bytes();
        // Before the lock, not under it: the probes are one fcntl per participant slot (63),
        // and every other process's L2 waits for the lock (the counters, sampled each second,
        // once held it across all of them).
        let participants = 1 + self.others_attached();
        let lock_timeouts = self.lock_timeouts.load(Ordering::Relaxed);
        let Some(g) = self.lock_briefly() else {
            return SharedStats {
                participants,
                lock_timeouts,
                resident_bytes,
                ..SharedStats::default()
            };
        };
        let t = &g.tables;
        SharedStats {
            pages: t.totals.len,
            bytes: t.totals.live_bytes,
            participants,
            recoveries: t.totals.recoveries,
            lock_timeouts,
            resident_bytes,
        }
    }

    /// How long this process waited for the lock, each time it took it.
    pub fn lock_wait(&self) -> crate::counters::HistogramSnapshot {
        self.lock_wait.snapshot("Extension shared lock wait")
    }

    #[cfg(any(test, feature = "testing"))]
    /// Checks the index is sound (tests, and survivors in the crash tests).
    pub fn check(&self) -> std::result::Result<(), String> {
        match self.lock() {
            Some(g) => g.tables.check(),
            None => Err("the lock is unusable".into()),
        }
    }
}

/// The extension file's attribute naming the segment made for it.
const FILE_ID_NAME: &std::ffi::CStr = c"user.sqlite-bpe.shared";

/// The id of the segment made for the extension file `file`, if it has one.
fn file_id(file: &File) -> Option<u64> {
    use std::os::unix::io::AsRawFd;
    let mut value = [0u8; 8];
    // SAFETY: the descriptor is open for the call; name and buffer are valid for their lengths.
    let n = unsafe {
        libc::fgetxattr(
            file.as_raw_fd(),
            FILE_ID_NAME.as_ptr(),
            value.as_mut_ptr() as *mut libc::c_void,
            value.len(),
        )
    };
    (n == value.len() as isize).then(|| u64::from_le_bytes(value))
}

fn set_file_id(file: &File, id: u64) {
    use std::os::unix::io::AsRawFd;
    let value = id.to_le_bytes();
    // SAFETY: the descriptor is open for the call; name and value are valid for their lengths.
    let rc = unsafe {
        libc::fsetxattr(
            file.as_raw_fd(),
            FILE_ID_NAME.as_ptr(),
            value.as_ptr() as *const libc::c_void,
            value.len(),
            0,
        )
    };
    if rc != 0 {
        log::debug!(
            "shared buffer pool extension: cannot tag its file ({}); its shared memory will \
             not outlive the processes attached",
            std::io::Error::last_os_error()
        );
    }
}

/// A segment's id: random (the clock and pid if the kernel has no getrandom), never 0.
fn random_id() -> u64 {
    let mut value = [0u8; 8];
    // SAFETY: the buffer is valid for its length.
    let n = unsafe { libc::getrandom(value.as_mut_ptr() as *mut libc::c_void, value.len(), 0) };
    let id = if n == value.len() as isize {
        u64::from_le_bytes(value)
    } else {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        t ^ (u64::from(std::process::id()) << 32)
    };
    id.max(1)
}

fn record_stamp(f: &mut layout::FileSlot, stamp: KnownStamp) {
    let s = stamp.stamp;
    f.size = s.size;
    stored();
    f.mtime_ns = s.mtime_ns;
    stored();
    f.ctime_ns = s.ctime_ns;
    stored();
    f.vouched = u32::from(!stamp.racy);
    stored();
}

/// A key never used in this segment. Near the end of the key space the index is emptied and
/// every file renamed from 1 on, as `Engine::renumber_if_keys_run_out` does for its own keys.
fn new_key(t: &mut Tables<'_>) -> FileKey {
    if t.totals.next_key >= u32::MAX as u64 - 1 {
        t.clear_index();
        for f in t.files.iter_mut() {
            f.key = 0;
        }
        t.totals.next_key = 1;
    }
    let key = t.totals.next_key as FileKey;
    t.totals.next_key += 1;
    stored();
    key
}

#[cfg(test)]
mod sim;
#[cfg(test)]
mod tests;
