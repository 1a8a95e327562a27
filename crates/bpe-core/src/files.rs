//! Data files known to the engine, and their lifecycle:
//!
//! ```text
//!   (unknown) --open--> OPEN(n openers) --close (n > 1)--> OPEN(n-1)
//!   OPEN(1) --close--> RETAINED --open, stamp unchanged--> OPEN(1)   (cached pages kept)
//!                      RETAINED --open, stamp changed----> OPEN(1)   (new key: pages forgotten)
//!                      RETAINED --more than MAX_RETAINED--> (forgotten; its key is dead)
//! ```
//!
//! One entry per inode, shared by every opener, so that one database's cache survives its
//! connections closing and reopening (a connection pool does that constantly). The descriptors
//! are opened with the first opener and closed, synchronously and under the registry lock, with
//! the last: closing any descriptor of a file drops every POSIX lock this process holds on it, so
//! a descriptor must never outlive the connections or close while a new opener may already be
//! taking locks. A retained entry keeps the file's key and a stamp (size, times, identity); the
//! next open compares the stamp and forgets the pages if the file changed while nobody watched.
//!
//! Cached pages are named by the file's *key*, not by its entry: forgetting a file's pages is
//! giving it a new key (O(1), whatever the cache holds). Copies under the old key can never be
//! found again and leave both tiers as space is needed. Keys come from the registry's counter
//! (`FileRegistry::new_key`) and are never reused; before it would wrap (2^32 invalidations),
//! both tiers are emptied and every file numbered again (`Engine::renumber_if_keys_run_out`).

use crate::config::{check_page_size, Config};
use crate::error::{Error, Result};
use crate::io::{DataFile, FileIdentity, FileStamp};
use crate::lineage::Lineage;
use crate::page::{FileKey, PageCheck, PageKeyHash};
use crate::readahead::SequentialDetector;
use crate::sync::{Mutex, Rank, RwLock};
use std::any::Any;
use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::SystemTime;

/// Closed files whose cached pages are kept for a reopen, at most.
pub const MAX_RETAINED_FILES: usize = 256;

/// Closed files whose descriptors stay open for a reopen, at most (the most recently closed).
/// An application that opens a connection per request closes and reopens the same file each
/// time: opening its two descriptors and closing them (after reading `/proc/locks`, see
/// `close_parked`) cost about half of stock SQLite's whole lookup (docs/BENCHMARKS.md, "A
/// connection per lookup"). Few, since an open descriptor keeps a deleted file's blocks.
pub const PARKED_FILES: usize = 4;

/// A stamp and when it was taken. A stamp taken within the racy window of the file's last
/// modification is *racy*: another write in the same clock tick of the file's timestamps leaves
/// it unchanged, so it cannot vouch for the file alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KnownStamp {
    pub stamp: FileStamp,
    pub racy: bool,
}

/// Several clock ticks of the coarsest kernel timer (HZ=100): the racy window on a file system
/// with fine timestamps (on kernels before 6.13 they advance by a tick).
pub const RACY_WINDOW: std::time::Duration = std::time::Duration::from_millis(30);

/// How long after a change a stamp of this file stays racy: [`RACY_WINDOW`], or twice the
/// file system's timestamp granularity where the stamp shows a coarse one (ext4 with 128-byte
/// inodes, and others, keep whole seconds). The granularity is read off the stamp: a fine
/// clock's times end in whole seconds about once in 10^9 stamps, which then costs a warm
/// restart of that file, never a stale page. (FAT's even seconds read as whole seconds half the
/// time: twice one second still covers them.)
pub fn racy_window_ns(stamp: &FileStamp) -> i128 {
    const NS: i64 = 1_000_000_000;
    let coarse = |unit: i64| stamp.mtime_ns % unit == 0 && stamp.ctime_ns % unit == 0;
    let granularity = [NS, NS / 10, NS / 100]
        .into_iter()
        .find(|&unit| coarse(unit))
        .unwrap_or(0);
    (2 * granularity as i128).max(RACY_WINDOW.as_nanos() as i128)
}

impl KnownStamp {
    pub fn taken_now(stamp: FileStamp) -> Self {
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as i128);
        let last_change = stamp.mtime_ns.max(stamp.ctime_ns) as i128;
        KnownStamp {
            stamp,
            racy: now - last_change < racy_window_ns(&stamp),
        }
    }
}

/// One data file as the cache knows it.
pub struct CachedFile {
    /// Stable for as long as the engine knows the file (buffer descriptors' database_id).
    pub id: u32,
    /// Shared with the frames cached under it, so that a frame can tell it is a dead copy.
    key: Arc<AtomicU32>,
    /// Held shared by every page write for its whole length, exclusively to change the key: a
    /// write that began under the old key must be done (its bytes in the file) before a load
    /// under the new key can start, or that load could read the bytes from before the write
    /// and cache them under the new key, where the write's pending entry does not reach.
    key_change: RwLock<()>,
    identity: FileIdentity,
    path: PathBuf,
    page_size: AtomicUsize,
    /// The descriptors, while the file has openers.
    data: RwLock<Option<Arc<DataFile>>>,
    known: Mutex<Option<KnownStamp>>,
    /// The first page's check as last taken, with the stamp it was taken under (for the
    /// extension's checkpoints: `Engine::first_page_check`).
    first_page: Mutex<Option<(FileStamp, PageCheck)>>,
    /// What the engine's client keeps per file (the SQLite adapter's change detection); it
    /// lives as long as this entry, across closes and reopens.
    client: Mutex<Option<Arc<dyn Any + Send + Sync>>>,
    /// Earlier snapshots whose cached pages this snapshot may take (see `lineage.rs`).
    lineage: Mutex<Lineage<CachedFile>>,
    /// How often another program rewrites the file (see [`RewriteWatch`]).
    pub(crate) rewrites: RewriteWatch,
    /// Sequential runs of data-file misses.
    pub readahead: SequentialDetector,
    /// Sequential runs of extension hits (pages admitted in scan order sit in consecutive places).
    pub extension_readahead: SequentialDetector,
}

/// Whether another program rewrites a file often enough that the OS page cache, not the
/// device, should serve its misses.
///
/// A plain SQLite writer in rollback mode says nothing about which pages it changed, so each of
/// its commits empties the file's cache here (`Engine::invalidate_file`) and the next reads go
/// to the device with O_DIRECT; stock SQLite refills from the OS page cache, where the writer's
/// pages are, far sooner than a device read: beside such a writer bpe's reads took several
/// times stock's. After [`REWRITE_STREAK`] whole-file invalidations each within
/// [`REWRITE_GAP_MS`] of the one before, the file's reads go through the OS page cache, until
/// none has come for [`REWRITE_QUIET_MS`]. Freshness does not change: the cache tiers are
/// emptied as before; only where a miss is read from does.
#[derive(Default)]
pub(crate) struct RewriteWatch {
    last_ms: AtomicU64,
    streak: AtomicU32,
    /// The time between the last two invalidations, stored one on (0: fewer than two).
    last_gap_ms: AtomicU64,
}

pub(crate) const REWRITE_STREAK: u32 = 3;
pub(crate) const REWRITE_GAP_MS: u64 = 1_000;
pub(crate) const REWRITE_QUIET_MS: u64 = 10_000;
/// Invalidations at most this far apart: a page cached now is forgotten before it is read
/// again (see [`RewriteWatch::churning`]).
pub(crate) const CHURN_GAP_MS: u64 = 100;

impl RewriteWatch {
    /// A whole-file invalidation at `now_ms`: whether the file's misses should now be read
    /// through the OS page cache.
    pub(crate) fn rewritten(&self, now_ms: u64) -> bool {
        // Stored one on (0 is "never"; an engine's clock starts at 0).
        let last = self.last_ms.swap(now_ms + 1, Relaxed).wrapping_sub(1);
        if last != u64::MAX {
            self.last_gap_ms
                .store(now_ms.saturating_sub(last) + 1, Relaxed);
        }
        let streak = if last != u64::MAX && now_ms.saturating_sub(last) <= REWRITE_GAP_MS {
            self.streak.fetch_add(1, Relaxed) + 1
        } else {
            self.streak.store(1, Relaxed);
            1
        };
        streak >= REWRITE_STREAK
    }

    /// Another program's commits empty this file's cache so often (the last two, and the last
    /// one, within [`CHURN_GAP_MS`] of `now_ms`) that a miss is not worth caching: its copy
    /// would be forgotten before a second read, and installing it costs an eviction and a
    /// copy. Misses are then served uncached (`Engine::load`), as stock SQLite's pager cache
    /// refills from the OS page cache after each such commit.
    pub(crate) fn churning(&self, now_ms: u64) -> bool {
        let gap = self.last_gap_ms.load(Relaxed);
        let last = self.last_ms.load(Relaxed);
        gap != 0 && gap - 1 <= CHURN_GAP_MS && (now_ms + 1).saturating_sub(last) <= CHURN_GAP_MS
    }

    /// No rewrite for [`REWRITE_QUIET_MS`] before `now_ms`: O_DIRECT again.
    pub(crate) fn quiet(&self, now_ms: u64) -> bool {
        (now_ms + 1).saturating_sub(self.last_ms.load(Relaxed)) > REWRITE_QUIET_MS
    }
}

/// A caller's reference to an open data file.
pub type FileHandle = Arc<CachedFile>;

impl CachedFile {
    /// The key the file's pages are cached under now.
    pub fn key(&self) -> FileKey {
        self.key.load(Relaxed)
    }
    pub(crate) fn set_key(&self, key: FileKey) {
        let _writes_done = self.key_change.write();
        self.key.store(key, Relaxed);
    }
    /// Keeps the key from changing while the guard lives (for a page write).
    pub(crate) fn key_stable(&self) -> crate::sync::ReadGuard<'_, ()> {
        self.key_change.read()
    }
    /// Holds off every page write (waiting for those in flight) while the guard lives.
    pub(crate) fn writes_held_off(&self) -> crate::sync::WriteGuard<'_, ()> {
        self.key_change.write()
    }
    /// Earlier snapshots whose cached pages this one may take (empty for a file).
    pub(crate) fn lineage(&self) -> Lineage<CachedFile> {
        self.lineage.lock().clone()
    }
    pub(crate) fn set_lineage(&self, lineage: Lineage<CachedFile>) {
        *self.lineage.lock() = lineage;
    }
    /// The cell holding the current key, for frames to compare their own key against.
    pub(crate) fn key_cell(&self) -> &Arc<AtomicU32> {
        &self.key
    }
    pub fn identity(&self) -> FileIdentity {
        self.identity
    }
    pub fn page_size(&self) -> usize {
        self.page_size.load(Relaxed)
    }
    pub(crate) fn store_page_size(&self, n: usize) {
        self.page_size.store(n, Relaxed);
    }
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The open descriptors (None once the last opener closed).
    pub fn data(&self) -> Option<Arc<DataFile>> {
        self.data.read().clone()
    }

    /// True when reads of this file bypass the OS page cache.
    pub fn is_direct(&self) -> bool {
        self.data.read().as_ref().is_some_and(|d| d.is_direct())
    }

    /// The file's stamp now: one fstat, no device round trip. A snapshot has none (its name
    /// may lead to an unrelated local file, whose stamp must never stand for it).
    pub fn stamp_now(&self) -> Result<FileStamp> {
        if self.identity.is_snapshot() {
            return Err(Error::DataIo {
                path: self.path.clone(),
                source: std::io::Error::other("a snapshot of another VFS's file has no stamp"),
            });
        }
        match self.data() {
            Some(d) => d.stamp(),
            None => FileStamp::of_path(&self.path).map_err(|source| Error::DataIo {
                path: self.path.clone(),
                source,
            }),
        }
    }

    /// The stamp last accepted as describing the cached pages.
    pub fn known_stamp(&self) -> Option<KnownStamp> {
        *self.known.lock()
    }

    /// The first page's check last taken under `stamp`, if any.
    pub(crate) fn first_page_under(&self, stamp: FileStamp) -> Option<PageCheck> {
        self.first_page
            .lock()
            .filter(|(s, _)| *s == stamp)
            .map(|(_, c)| c)
    }

    pub(crate) fn keep_first_page(&self, stamp: FileStamp, check: PageCheck) {
        *self.first_page.lock() = Some((stamp, check));
    }

    /// Accepts `stamp` as describing the cached pages (after the caller's own writes, or once
    /// it has dealt with a change).
    pub fn accept_stamp(&self, stamp: FileStamp) {
        *self.known.lock() = Some(KnownStamp::taken_now(stamp));
    }

    /// The client's state for this file, created by `init` on first use.
    pub fn client_state<T: Any + Send + Sync>(&self, init: impl FnOnce() -> T) -> Arc<T> {
        let mut slot = self.client.lock();
        if let Some(state) = slot.as_ref().and_then(|s| s.clone().downcast::<T>().ok()) {
            return state;
        }
        let state = Arc::new(init());
        *slot = Some(state.clone());
        state
    }
}

/// What an open found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpenKind {
    /// The engine did not know the file: nothing of it is cached.
    New,
    /// Another opener has it open now: everything is shared.
    Shared,
    /// Nobody had it open, but its pages were kept; `changed` when the stamp differed and the
    /// pages were forgotten.
    Reopened { changed: bool, racy: bool },
}

/// What descriptors and monitors show about a file.
#[derive(Clone, Debug)]
pub struct FileInfo {
    pub id: u32,
    pub key: FileKey,
    pub path: PathBuf,
    pub page_size: usize,
    pub direct_io: bool,
    pub openers: usize,
}

struct Entry {
    file: FileHandle,
    openers: usize,
}

/// The registry, under `Engine::files`.
pub struct FileRegistry {
    by_identity: HashMap<FileIdentity, Entry, PageKeyHash>,
    /// The next file key (see `page.rs`); 0 is never used.
    next_key: FileKey,
    /// Closed entries, oldest first (may hold identities reopened since: checked when popped).
    retained: VecDeque<FileIdentity>,
    next_id: u32,
    /// Descriptors of closed files, oldest first: the [`PARKED_FILES`] closed last, and any
    /// other while this process holds POSIX locks on the inode through another connection
    /// (see `io/posix_locks.rs`). Taken again by a reopen; the others closed once no lock is
    /// held.
    parked: Vec<(FileIdentity, Arc<DataFile>)>,
}

/// Where and how to open a file's descriptors.
pub struct OpenRequest<'a> {
    /// The file's name, for messages and monitors.
    pub path: &'a Path,
    /// What to open: the same as `path`, or a name that cannot be renamed away, such as
    /// `/proc/self/fd/N` of a descriptor the caller holds.
    pub open_from: &'a Path,
    /// The file the caller means (the identity of its own descriptor), if it has one: the open
    /// fails rather than cache another file under its name.
    pub expect: Option<FileIdentity>,
    /// The page size of a file new to the registry, asked only for one: a file already open,
    /// or closed and retained, keeps its own (an SQLite adapter reads it from the header, a
    /// system call an application opening a connection per request would make at each).
    pub page_size: &'a dyn Fn() -> usize,
}

/// Keys left when [`FileRegistry::keys_run_out`] says so: far from wrapping.
const KEY_HEADROOM: FileKey = 1 << 20;

impl Default for FileRegistry {
    fn default() -> FileRegistry {
        FileRegistry {
            by_identity: HashMap::default(),
            next_key: 1,
            retained: VecDeque::new(),
            next_id: 0,
            parked: Vec::new(),
        }
    }
}

impl FileRegistry {
    /// A key never used before. The engine calls `keys_run_out` first, which keeps the counter
    /// far from wrapping.
    pub(crate) fn new_key(&mut self) -> FileKey {
        let key = self.next_key;
        self.next_key = key.wrapping_add(1);
        key
    }

    /// Whether the keys near their end (after ~2^32 invalidations): every cached page must go
    /// before [`FileRegistry::renumber`] may give keys from 1 on again.
    pub(crate) fn keys_run_out(&self) -> bool {
        self.next_key >= FileKey::MAX - KEY_HEADROOM
    }

    /// Gives every file a fresh key from 1 on, once both tiers hold nothing under the old keys.
    /// A load still in flight under a key from before was voided by that purge, and keys from 1
    /// on were last used 2^32 keys ago.
    pub(crate) fn renumber(&mut self) {
        let mut next = 1;
        for f in self.all() {
            f.set_key(next);
            next += 1;
        }
        self.next_key = next;
    }

    /// Opens (or shares) one snapshot of a file only the caller can read (see
    /// [`FileIdentity::snapshot`]): no descriptors and no stamp, since a snapshot never changes;
    /// every miss is read through the caller's device. A retained snapshot reopens with its
    /// pages.
    pub(crate) fn open_snapshot(
        &mut self,
        path: &Path,
        identity: FileIdentity,
        page_size: usize,
    ) -> Result<(FileHandle, OpenKind)> {
        check_page_size(page_size)?;
        assert!(
            identity.is_snapshot(),
            "open_snapshot takes a snapshot identity"
        );
        if let Some(entry) = self.by_identity.get_mut(&identity) {
            entry.openers += 1;
            let kind = match entry.openers {
                1 => OpenKind::Reopened {
                    changed: false,
                    racy: false,
                },
                _ => OpenKind::Shared,
            };
            let file = entry.file.clone();
            self.retained.retain(|i| *i != identity);
            return Ok((file, kind));
        }
        let key = self.new_key();
        let file = self.insert_new(identity, path, page_size, key, None, None);
        Ok((file, OpenKind::New))
    }

    /// A file the registry did not know, with one opener.
    fn insert_new(
        &mut self,
        identity: FileIdentity,
        path: &Path,
        page_size: usize,
        key: FileKey,
        data: Option<Arc<DataFile>>,
        known: Option<KnownStamp>,
    ) -> FileHandle {
        self.next_id += 1;
        let file = Arc::new(CachedFile {
            id: self.next_id,
            key: Arc::new(AtomicU32::new(key)),
            key_change: RwLock::new(Rank::FileKey, ()),
            identity,
            path: path.to_path_buf(),
            page_size: AtomicUsize::new(page_size),
            data: RwLock::new(Rank::Leaf, data),
            known: Mutex::new(Rank::Leaf, known),
            first_page: Mutex::new(Rank::Leaf, None),
            client: Mutex::new(Rank::Leaf, None),
            lineage: Mutex::new(Rank::Leaf, Lineage::default()),
            rewrites: RewriteWatch::default(),
            readahead: SequentialDetector::default(),
            extension_readahead: SequentialDetector::default(),
        });
        self.by_identity.insert(
            identity,
            Entry {
                file: file.clone(),
                openers: 1,
            },
        );
        file
    }

    /// Opens (or shares) a file.
    pub(crate) fn open(
        &mut self,
        req: &OpenRequest<'_>,
        config: &Config,
    ) -> Result<(FileHandle, OpenKind)> {
        let open_err = |source| Error::OpenData {
            path: req.path.to_path_buf(),
            source,
        };
        // Which inode, without opening it: opening and closing a descriptor of a file this
        // process has locks on would drop those locks.
        let identity = match req.expect {
            Some(id) => id,
            None => FileIdentity::of_path(req.open_from).map_err(open_err)?,
        };
        // A closed file's entry under another name (renamed, or its inode reused by a new file
        // after a delete) is forgotten: descriptors and `DB_ID()` name files by path.
        if self
            .by_identity
            .get(&identity)
            .is_some_and(|e| e.openers == 0 && e.file.path != req.path)
        {
            self.by_identity.remove(&identity);
            self.retained.retain(|i| *i != identity);
        }
        if let Some(entry) = self.by_identity.get_mut(&identity) {
            if entry.openers > 0 {
                entry.openers += 1;
                return Ok((entry.file.clone(), OpenKind::Shared));
            }
            let file = entry.file.clone();
            let data = self.descriptors(req, identity, config)?;
            let stamp = data.stamp()?;
            let known = file.known_stamp();
            let changed = known.is_none_or(|k| k.stamp != stamp);
            if changed {
                file.set_key(self.new_key());
            }
            *file.data.write() = Some(data);
            file.accept_stamp(stamp);
            let entry = self.by_identity.get_mut(&identity).expect("present");
            entry.openers = 1;
            self.retained.retain(|i| *i != identity);
            return Ok((
                file,
                OpenKind::Reopened {
                    changed,
                    racy: known.is_some_and(|k| k.racy),
                },
            ));
        }
        let page_size = (req.page_size)();
        check_page_size(page_size)?;
        let data = self.descriptors(req, identity, config)?;
        let stamp = data.stamp()?;
        let known = Some(KnownStamp::taken_now(stamp));
        let key = self.new_key();
        let file = self.insert_new(identity, req.path, page_size, key, Some(data), known);
        Ok((file, OpenKind::New))
    }

    /// Drops one opener (true if it was the last); after the last, parks the descriptors for a
    /// reopen (closing those of older closed files: `close_parked`) and keeps the entry. The
    /// known stamp stays what the client last accepted: a change nobody looked at before the
    /// close must still be caught at the reopen.
    pub(crate) fn close(&mut self, handle: &FileHandle) -> bool {
        let Some(entry) = self.by_identity.get_mut(&handle.identity) else {
            return false;
        };
        if !Arc::ptr_eq(&entry.file, handle) || entry.openers == 0 {
            return false;
        }
        entry.openers -= 1;
        if entry.openers > 0 {
            return false;
        }
        // The last opener's calls have all returned: its descriptors wait for a reopen.
        if let Some(data) = handle.data.write().take() {
            self.parked.push((handle.identity, data));
        }
        self.close_parked(PARKED_FILES);
        self.retained.retain(|i| *i != handle.identity);
        self.retained.push_back(handle.identity);
        while self.retained.len() > MAX_RETAINED_FILES {
            let Some(oldest) = self.retained.pop_front() else {
                break;
            };
            // Forgotten: its key is dead, its copies leave both tiers as space is needed.
            self.by_identity.remove(&oldest);
        }
        true
    }

    /// Closes the parked descriptors of all but the `keep` files closed last, where this
    /// process holds no POSIX lock on the file now (closing a descriptor would drop them).
    fn close_parked(&mut self, keep: usize) {
        let mut excess = self.parked.len().saturating_sub(keep);
        // Oldest first; `/proc/locks` is read only for a file that is due.
        self.parked.retain(|(identity, _)| {
            let close = excess > 0 && !crate::io::posix_locks::held_by_this_process(*identity);
            excess -= close as usize;
            !close
        });
    }

    /// The file's descriptors: the parked ones if it has some, else newly opened.
    fn descriptors(
        &mut self,
        req: &OpenRequest<'_>,
        identity: FileIdentity,
        config: &Config,
    ) -> Result<Arc<DataFile>> {
        match self.take_parked(identity) {
            Some(data) => Ok(data),
            None => open_data(req, identity, config).map(Arc::new),
        }
    }

    /// A parked descriptor pair of the file, if any, for a reopen.
    fn take_parked(&mut self, identity: FileIdentity) -> Option<Arc<DataFile>> {
        let at = self.parked.iter().position(|(i, _)| *i == identity)?;
        Some(self.parked.remove(at).1)
    }

    /// The files open now.
    pub(crate) fn open_files(&self) -> impl Iterator<Item = &FileHandle> {
        self.by_identity
            .values()
            .filter(|e| e.openers > 0)
            .map(|e| &e.file)
    }

    /// Every known file (open or retained).
    pub(crate) fn all(&self) -> impl Iterator<Item = &FileHandle> {
        self.by_identity.values().map(|e| &e.file)
    }

    /// Every file the registry holds (open, and closed but retained).
    pub(crate) fn handles(&self) -> Vec<FileHandle> {
        self.by_identity.values().map(|e| e.file.clone()).collect()
    }

    pub fn infos(&self) -> Vec<FileInfo> {
        let mut v: Vec<FileInfo> = self
            .by_identity
            .values()
            .map(|e| FileInfo {
                id: e.file.id,
                key: e.file.key(),
                path: e.file.path().to_path_buf(),
                page_size: e.file.page_size(),
                direct_io: e.file.is_direct(),
                openers: e.openers,
            })
            .collect();
        v.sort_by_key(|f| f.id);
        v
    }

    /// Whether the registry knows a file with this identity (open or retained).
    pub fn knows(&self, identity: FileIdentity) -> bool {
        self.by_identity.contains_key(&identity)
    }

    /// Current key -> the file's stable id, for every known file.
    pub(crate) fn ids_by_key(&self) -> HashMap<FileKey, u32> {
        self.all().map(|f| (f.key(), f.id)).collect()
    }
}

fn open_data(req: &OpenRequest<'_>, identity: FileIdentity, config: &Config) -> Result<DataFile> {
    let data = DataFile::open(req.path, req.open_from, config.direct_io)?;
    if data.identity() != identity {
        // The name now leads to another file (renamed in between): never cache one file's
        // pages under another's name. The descriptors are leaked, not closed: the other file
        // may be one this process holds POSIX locks on, and a close would drop them.
        std::mem::forget(data);
        return Err(Error::OpenData {
            path: req.path.to_path_buf(),
            source: std::io::Error::other(
                "the file was replaced while it was being opened (renamed in between); try again",
            ),
        });
    }
    Ok(data)
}

#[cfg(test)]
mod tests {
    use super::{
        KnownStamp, RewriteWatch, CHURN_GAP_MS, PARKED_FILES, REWRITE_GAP_MS, REWRITE_QUIET_MS,
        REWRITE_STREAK,
    };
    use crate::io::DataFile;
    use crate::{Config, Engine, FileHandle};
    use std::sync::{Arc, Weak};

    /// A connection per request closes and reopens the same file: the reopen takes the
    /// descriptors the close left (no open through /proc/self/fd, no /proc/locks read), for
    /// the files closed last; an older closed file's are closed.
    #[test]
    fn the_files_closed_last_keep_their_descriptors_for_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let engine = Engine::new(Config::default());
        let descriptors =
            |h: &FileHandle| Arc::downgrade(h.data.read().as_ref().expect("open descriptors"));
        let paths: Vec<_> = (0..=PARKED_FILES)
            .map(|i| {
                let p = dir.path().join(format!("{i}.db"));
                std::fs::write(&p, vec![0u8; 4096]).unwrap();
                p
            })
            .collect();
        let closed: Vec<Weak<DataFile>> = paths
            .iter()
            .map(|p| {
                let h = engine.open_file(p, 4096).unwrap();
                let d = descriptors(&h);
                assert!(engine.close_file(&h), "the only opener");
                d
            })
            .collect();
        assert!(
            closed[0].upgrade().is_none(),
            "the oldest closed file kept its descriptors"
        );
        for (p, d) in paths.iter().zip(&closed).skip(1) {
            let h = engine.open_file(p, 4096).unwrap();
            let reopened = descriptors(&h);
            assert!(
                d.upgrade().is_some() && Weak::ptr_eq(&reopened, d),
                "{}: opened again at the reopen",
                p.display()
            );
            engine.close_file(&h);
        }
    }

    /// The page size is asked only for a file new to the registry (the SQLite adapter reads it
    /// from the header, a system call): a second opener and a reopen keep the file's own.
    #[test]
    fn only_a_file_new_to_the_registry_asks_its_page_size() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.db");
        std::fs::write(&path, vec![0u8; 4 * 8192]).unwrap();
        let engine = Engine::new(Config::default());
        let asked = std::cell::Cell::new(0);
        let open = |size: usize| {
            let page_size = || {
                asked.set(asked.get() + 1);
                size
            };
            let req = super::OpenRequest {
                path: &path,
                open_from: &path,
                expect: None,
                page_size: &page_size,
            };
            engine.open_file_with(&req).unwrap()
        };
        let (first, _) = open(8192);
        assert_eq!((asked.get(), first.page_size()), (1, 8192), "a new file");
        assert!(
            engine.open_file(&path, 1000).is_err(),
            "open_file refuses a bad size, even for a file open already"
        );
        let (second, kind) = open(4096);
        assert!(matches!(kind, super::OpenKind::Shared));
        assert_eq!(
            (asked.get(), second.page_size()),
            (1, 8192),
            "a second opener"
        );
        engine.close_file(&second);
        engine.close_file(&first);
        let (reopened, kind) = open(4096);
        assert!(matches!(kind, super::OpenKind::Reopened { .. }));
        assert_eq!((asked.get(), reopened.page_size()), (1, 8192), "a reopen");
        engine.close_file(&reopened);
        let other = dir.path().join("b.db");
        std::fs::write(&other, vec![0u8; 4096]).unwrap();
        let bad = super::OpenRequest {
            path: &other,
            open_from: &other,
            expect: None,
            page_size: &|| 1000,
        };
        assert!(
            engine.open_file_with(&bad).is_err(),
            "a new file's page size is still checked"
        );
    }

    #[test]
    fn two_invalidations_within_the_churn_gap_make_the_file_churning_until_a_gap_passes() {
        let w = RewriteWatch::default();
        let now = 1_000_000;
        assert!(!w.churning(now));
        w.rewritten(now);
        assert!(
            !w.churning(now),
            "one invalidation says nothing of the next"
        );
        w.rewritten(now + CHURN_GAP_MS);
        assert!(w.churning(now + CHURN_GAP_MS));
        assert!(w.churning(now + 2 * CHURN_GAP_MS));
        assert!(
            !w.churning(now + 2 * CHURN_GAP_MS + 1),
            "quiet for longer than the gap: cached again"
        );
        w.rewritten(now + 10 * CHURN_GAP_MS);
        assert!(
            !w.churning(now + 10 * CHURN_GAP_MS),
            "the last two invalidations were far apart"
        );
    }

    #[test]
    fn a_file_rewritten_several_times_a_second_is_read_through_the_os_cache_until_it_goes_quiet() {
        let w = RewriteWatch::default();
        let mut now = 1_000_000;
        for i in 1..REWRITE_STREAK {
            assert!(!w.rewritten(now), "rewrite {i} of a streak");
            now += REWRITE_GAP_MS;
        }
        assert!(w.rewritten(now), "the streak's last rewrite");
        assert!(!w.quiet(now + REWRITE_QUIET_MS));
        assert!(w.quiet(now + REWRITE_QUIET_MS + 1));
        // Rewrites further apart than the gap start the streak again.
        now += REWRITE_GAP_MS + 1;
        assert!(!w.rewritten(now));
        now += REWRITE_GAP_MS + 1;
        assert!(!w.rewritten(now));
    }

    use crate::io::{FileIdentity, FileStamp};
    use std::time::{Duration, SystemTime, UNIX_EPOCH};

    /// A stamp whose times are `ago` before now, cut to whole seconds when `coarse`.
    fn stamp(ago: Duration, coarse: bool) -> FileStamp {
        let t = SystemTime::now().duration_since(UNIX_EPOCH).unwrap() - ago;
        let ns = if coarse {
            t.as_secs() as i64 * 1_000_000_000
        } else {
            t.as_nanos() as i64 | 1
        };
        FileStamp {
            identity: FileIdentity { dev: 1, ino: 2 },
            size: 4096,
            mtime_ns: ns,
            ctime_ns: ns,
        }
    }

    /// On a file system that keeps whole seconds, a stamp taken half a second after
    /// the change it shows cannot vouch for the file: a write later in that second keeps it.
    #[test]
    fn a_stamp_is_racy_for_twice_the_granularity_its_times_show() {
        assert!(!KnownStamp::taken_now(stamp(Duration::from_millis(500), false)).racy);
        assert!(KnownStamp::taken_now(stamp(Duration::from_millis(5), false)).racy);
        // Cut to the second, the change happened 0.5-1.5 s ago: still racy.
        assert!(KnownStamp::taken_now(stamp(Duration::from_millis(500), true)).racy);
        assert!(!KnownStamp::taken_now(stamp(Duration::from_millis(2_100), true)).racy);
    }
}
