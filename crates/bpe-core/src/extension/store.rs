//! The L2 store interface: where the extension's pages are indexed, and how a page gets there.
//!
//! Two stores implement it:
//! - `PrivateStore` (`private/`): this process's index, in RAM, written to
//!   checkpoints in the file for the next process to start warm from;
//! - `SharedStore` (`shared/store.rs`): one index in shared memory for every process
//!   that has the extension open, whose writers claim regions of the one ring.
//!
//! `Extension` (reads, admission, invalidation) and its writer talk to this interface only:
//! neither knows which store it has, and hands it plain values (a [`Ring`]), never itself. Every
//! method means something for both stores: where one has nothing to do, it says why. Both
//! stores keep the pages staged for the writer beside their index, so that "a write to the page
//! removes it from staging" and "the writer indexes a page only if it is still staged" decide
//! together (see [`Staging`]).

use super::{Location, Vouched};
use crate::config::Sharing;
use crate::counters::{Counters, HistogramSnapshot};
use crate::files::FileHandle;
use crate::io::extension_file::ExtensionFile;
use crate::io::{FaultyExtensionFile, FileIdentity, FileStamp};
use crate::page::{FileKey, PageKey, SharedRead};
use crate::pool::Frame;
use std::collections::HashMap;

/// Which of some pages are in RAM now (see `ExtensionHost::resident`).
pub type Resident<'a> = &'a dyn Fn(&[PageKey]) -> Vec<bool>;

/// What the first page of a file reads as now, for adoption: its checksum by length.
pub trait FirstPage {
    /// `page_crc(0, bytes)` of the file's first `len` bytes, or None if they cannot be read.
    fn crc(&mut self, len: usize) -> Option<u32>;
}

impl<F: FnMut(usize) -> Option<u32>> FirstPage for F {
    fn crc(&mut self, len: usize) -> Option<u32> {
        self(len)
    }
}

/// A cached page, found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hit {
    pub location: Location,
    /// Another process's writer put it there (a shared store).
    pub theirs: bool,
}

/// A region the writer has entered, its old pages forgotten.
#[derive(Clone, Copy, Debug)]
pub struct Entered {
    pub region: usize,
    /// Pages it held (the ring's oldest).
    pub evicted: usize,
}

/// A page written into the writer's region, to be indexed.
#[derive(Clone, Copy, Debug)]
pub struct Written {
    pub key: PageKey,
    /// Its staging sequence number: indexed only if still staged under it.
    pub seq: u64,
    /// Byte offset within the region.
    pub offset: usize,
    pub len: usize,
    pub crc: u32,
    /// What its read was made under (a shared store).
    pub read: Option<SharedRead>,
}

/// What a store holds and who shares it: the same fields for either store.
#[derive(Clone, Copy, Debug, Default)]
pub struct StoreView {
    /// Cached pages, and the bytes of the ring they take.
    pub pages: usize,
    pub bytes: u64,
    /// Processes that have the store open, this one included; 0 if it is not shared.
    pub participants: usize,
    /// Times the shared index was emptied after a participant died holding its lock.
    pub recoveries: u64,
    /// Times this process's bounded wait for the shared index's lock gave up.
    pub lock_timeouts: u64,
    /// RAM the shared memory takes, once for every process (0 if the store is not shared).
    pub shared_memory_bytes: u64,
}

/// What a store's persistence, restore and adoption use of the extension that holds it: its
/// ring (the file and the writer's place in it), its counters and its memory charge.
pub(crate) struct Ring<'a> {
    /// The extension's file: the ring, then the checkpoint slots.
    pub file: &'a FaultyExtensionFile,
    pub counters: &'a Counters,
    /// The region the writer is filling (the ring's newest).
    pub writer_region: usize,
    /// Charges `more` bytes of index memory on top of what the index takes now; false if the
    /// host cannot make room.
    pub charge_more: &'a dyn Fn(u64) -> bool,
}

pub(crate) trait L2Store: Send + Sync {
    fn sharing(&self) -> Sharing;

    /// What the store holds and who shares it (a shared store takes its lock, briefly).
    fn view(&self) -> StoreView;

    /// Other processes that have the store open now (a shared store probes their locks).
    fn others_attached(&self) -> usize;

    /// How long this process waited for a lock it shares with other processes, each time it
    /// took it; None if it shares none.
    fn lock_wait(&self) -> Option<HistogramSnapshot>;

    /// Where `key` is cached.
    fn locate(&self, key: PageKey) -> Option<Hit>;

    /// The pages of `keys` that sit right after `after`'s, each `page_len` long: the longest such
    /// run (a prefix of `keys`).
    fn locate_run(&self, after: PageKey, keys: &[PageKey], page_len: usize) -> Vec<Hit>;

    /// Removes the entry of `key` if it still is `location` (its read failed); whether it was.
    fn drop_if(&self, key: PageKey, location: Location) -> bool;

    /// What a read of `key` from the data file is made under, taken before the read (see
    /// `SharedRead`); None where other processes' writes need not be told apart.
    fn read_under(&self, file: &FileHandle, key: PageKey) -> Option<SharedRead>;

    /// Stages `frame`'s page for the writer under `seq`, unless a copy of it that `keep` accepts
    /// (by its location) is here, or one is staged already, or (a shared store) it cannot be
    /// shown current to other processes. Whether it was staged. A copy `keep` refuses stays
    /// until the new one is indexed, which replaces it.
    fn stage(&self, frame: &Frame, seq: u64, keep: &dyn Fn(Location) -> bool) -> bool;

    /// Takes `key` out of staging if it is still staged under `seq`.
    fn unstage(&self, key: PageKey, seq: u64);

    /// Pages staged and not yet indexed (or dropped).
    fn staged(&self) -> usize;

    /// Drops any copy of page `key` of `file`, staged or indexed, before the data file is
    /// written: for every process if the store is shared.
    fn invalidate(&self, file: &FileHandle, key: PageKey);

    /// The page's bytes are in the data file now (see `Extension::written`).
    fn written(&self, file: &FileHandle, key: PageKey);

    /// Drops every copy of pages of `file` from `first_page` on (all files if None). False: a
    /// shared store whose lock a stopped process holds is emptied at this process's next lock.
    fn forget(&self, file: Option<FileKey>, first_page: u64) -> bool;

    /// Every cached page, with the time its region was last referenced (`last_ref`) and the pid
    /// of the other process that loaded it, if another did.
    fn entries(&self, last_ref: &dyn Fn(usize) -> u64) -> Vec<(PageKey, u64, Option<u32>)>;

    /// RAM the store's own tables take in this process, charged against max server memory.
    fn footprint(&self) -> u64;

    /// The region the ring overwrites next (see `Extension::nears_the_tail`); None if it cannot
    /// be told now.
    fn ring_tail(&self) -> Option<usize>;

    // The writer's side (one thread).

    /// Enters the region the writer fills next (`next` if the ring is this process's alone),
    /// forgetting what it held. None: no region can be written now (another process's writers
    /// fill every one).
    fn enter_region(&self, next: usize) -> Option<Entered>;

    /// Whether the writer may still write into the region it entered (a shared store's claim
    /// is voided by a recovery, and another process may have claimed the region since).
    fn holds_region(&self) -> bool;

    /// Index bytes this process's store needs with `pages` more in `region`; None if it never
    /// grows (the shared index is laid out in full).
    fn index_bytes_with(&self, region: usize, pages: usize) -> Option<u64>;

    /// Forgets `region` to make room in the index; returns the pages it held.
    fn release_region(&self, region: usize) -> usize;

    /// Indexes the pages written into `region` that are still staged under their sequence
    /// number. False: the region was taken from the writer meanwhile (nothing more goes into it).
    fn index_written(&self, region: usize, pages: &[Written]) -> bool;

    /// The writer is done with its region.
    fn leave_region(&self);

    /// Whether the writer, entering `region`, must persist first (a checkpoint in force lets a
    /// restore assume only so many regions were overwritten after it).
    fn persist_due_at(&self, region: usize) -> bool;

    /// The writer is being stopped: no wait of its may outlast another process's stop.
    fn stop_waiting(&self);

    // What outlives this process.

    /// Records what the next process may take on trust: a private store checkpoints its index
    /// and the `vouched` files into the file (only if something changed, when `if_changed`); a
    /// shared one vouches for the files' stamps in shared memory.
    fn persist(&self, ring: &Ring<'_>, vouched: Vouched, resident: Resident<'_>, if_changed: bool);

    /// The extension is switched off: the file goes (with the last process, if shared).
    fn shut_down(&self, file: &ExtensionFile);

    /// The process closes the extension, keeping the file for the next one.
    fn close(&self, file: &ExtensionFile);

    /// The descriptor of a lock the store holds besides the file's own, to be closed in a
    /// forked child (see `Engine::after_fork`).
    fn lock_fd(&self) -> Option<i32>;

    /// Takes the lock shared with other processes and stops this process holding it (tests:
    /// what a stopped participant costs the others); false, without stopping, if there is none.
    #[cfg(feature = "testing")]
    fn stop_holding_the_lock(&self) -> bool;

    // Warm restart: what the previous process left is taken over. A private store reads the
    // file's checkpoint and lists its pages per file until the file is opened; a shared index
    // outlived its processes in shared memory, and its files are bound (their stamps checked)
    // at their first read instead.

    /// Takes over what the previous process left, before the writer writes anything; returns
    /// the region the writer goes on from.
    fn restore(&self, ring: &Ring<'_>) -> usize;

    /// Indexes the pages the previous process left of a file under `key` if the file is provably
    /// unchanged (see `Extension::adopt`); returns those that were in the previous process's RAM.
    fn adopt(
        &self,
        ring: &Ring<'_>,
        key: FileKey,
        identity: FileIdentity,
        now: Option<FileStamp>,
        first_page: &mut dyn FirstPage,
    ) -> Vec<(PageKey, Location)>;

    /// Whether pages of some file still wait for adoption (an atomic load).
    fn has_waiting_files(&self) -> bool;

    /// Whether pages of `file` still wait (or are being adopted).
    fn has_restored(&self, file: FileIdentity) -> bool;

    /// The stamp recorded for a file whose pages wait.
    fn recorded_stamp(&self, file: FileIdentity) -> Option<FileStamp>;
}

/// Pages handed to the writer and not yet indexed, each under its staging sequence number. A
/// write to the page removes it here, and the writer then drops its copy.
#[derive(Default)]
pub(super) struct Staging(HashMap<PageKey, u64>);

impl Staging {
    pub fn contains(&self, key: PageKey) -> bool {
        self.0.contains_key(&key)
    }
    pub fn insert(&mut self, key: PageKey, seq: u64) {
        self.0.insert(key, seq);
    }
    pub fn remove(&mut self, key: PageKey) {
        self.0.remove(&key);
    }
    /// Takes `key` out if it is staged under `seq`; whether it was (its copy may be indexed).
    pub fn take(&mut self, key: PageKey, seq: u64) -> bool {
        let current = self.0.get(&key) == Some(&seq);
        if current {
            self.0.remove(&key);
        }
        current
    }
    pub fn retain(&mut self, keep: impl Fn(PageKey) -> bool) {
        self.0.retain(|k, _| keep(*k));
    }
    pub fn len(&self) -> usize {
        self.0.len()
    }
}
