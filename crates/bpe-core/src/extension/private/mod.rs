//! The private store: this process's own index of the extension, in RAM, checkpointed into the
//! file for the next process (`persist.rs`). One lock guards the index, the pages staged for
//! the writer and the checkpoint's pages waiting for adoption, so that each decision about a
//! page sees all three at once.

mod persist;
mod restored;

pub(super) use persist::void_checkpoints;

use super::store::{Entered, FirstPage, Hit, L2Store, Resident, Ring, Staging, StoreView, Written};
use super::{ExtensionIndex, IndexStore, Location, Vouched, REGION_BYTES};
use crate::config::Sharing;
use crate::counters::HistogramSnapshot;
use crate::files::FileHandle;
use crate::io::extension_file::ExtensionFile;
use crate::io::{FileIdentity, FileStamp};
use crate::page::{FileKey, PageKey, SharedRead};
use crate::pool::Frame;
use crate::sync::{Mutex, Rank, RwLock};
use restored::Restored;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};

pub(crate) struct PrivateStore {
    regions: usize,
    tables: RwLock<Tables>,
    /// Files whose restored pages wait for adoption (`Tables::restored`), readable without a
    /// lock: the miss path looks at it (see `Extension::await_restore`).
    waiting_files: AtomicUsize,
    /// Set when the index changed since the last checkpoint.
    index_changed: AtomicBool,
    /// The generation the next checkpoint gets (held while one is written).
    checkpoint_generation: Mutex<u64>,
    /// The vouched files' fingerprint at the last checkpoint.
    checkpointed_files: AtomicU64,
    /// The ring position (`next_region`) of the checkpoint in force in the file, `NO_CHECKPOINT`
    /// if none: the writer enters at most `checkpoint::unlisted_regions` regions from there
    /// before it writes another (see `Writer::enter_region`).
    checkpoint_next: AtomicUsize,
    /// The region the writer overwrites next: the one after the last it entered (see
    /// `Extension::nears_the_tail`).
    ring_tail: AtomicUsize,
}

struct Tables {
    pub index: ExtensionIndex,
    pub staged: Staging,
    /// The last checkpoint's pages not adopted yet.
    pub restored: Restored,
}

impl PrivateStore {
    pub fn new(regions: usize) -> PrivateStore {
        PrivateStore {
            regions,
            tables: RwLock::new(
                Rank::ExtensionTables,
                Tables {
                    index: ExtensionIndex::new(regions, REGION_BYTES),
                    staged: Staging::default(),
                    restored: Restored::default(),
                },
            ),
            waiting_files: AtomicUsize::new(0),
            index_changed: AtomicBool::new(false),
            checkpoint_generation: Mutex::new(Rank::Checkpoint, 0),
            checkpointed_files: AtomicU64::new(0),
            checkpoint_next: AtomicUsize::new(persist::NO_CHECKPOINT),
            ring_tail: AtomicUsize::new(0),
        }
    }
}

fn hit(location: Location) -> Hit {
    Hit {
        location,
        theirs: false,
    }
}

impl L2Store for PrivateStore {
    fn sharing(&self) -> Sharing {
        Sharing::Private
    }

    /// Nobody shares it: no participants, no shared lock, no shared memory.
    fn view(&self) -> StoreView {
        let t = self.tables.read();
        StoreView {
            pages: t.index.len(),
            bytes: t.index.live_bytes(),
            ..StoreView::default()
        }
    }

    /// 0: the file's lock is exclusive (`ExtensionFile::open`).
    fn others_attached(&self) -> usize {
        0
    }

    /// None: its lock is this process's alone.
    fn lock_wait(&self) -> Option<HistogramSnapshot> {
        None
    }

    fn locate(&self, key: PageKey) -> Option<Hit> {
        self.tables.read().index.lookup(key).map(hit)
    }

    /// Under one hold of the lock.
    fn locate_run(&self, after: PageKey, keys: &[PageKey], page_len: usize) -> Vec<Hit> {
        let t = self.tables.read();
        let Some(first) = t.index.lookup(after) else {
            return Vec::new();
        };
        let mut next = first.offset + first.len as u64;
        keys.iter()
            .map_while(|&k| {
                let loc = t
                    .index
                    .lookup(k)
                    .filter(|l| l.offset == next && l.len == page_len)?;
                next += page_len as u64;
                Some(hit(loc))
            })
            .collect()
    }

    fn drop_if(&self, key: PageKey, location: Location) -> bool {
        let mut t = self.tables.write();
        let current = t.index.lookup(key) == Some(location);
        if current {
            t.index.remove(key);
        }
        current
    }

    /// None: only this process writes the data files it caches, and it drops a page's copy
    /// before each write (`invalidate`).
    fn read_under(&self, _file: &FileHandle, _key: PageKey) -> Option<SharedRead> {
        None
    }

    fn stage(&self, frame: &Frame, seq: u64, keep: &dyn Fn(Location) -> bool) -> bool {
        let key = frame.key;
        let held = |t: &Tables| t.index.lookup(key).is_some_and(keep) || t.staged.contains(key);
        // Most offers at eviction are of pages admitted at load: a shared lock answers them.
        if held(&self.tables.read()) {
            return false;
        }
        let mut t = self.tables.write();
        if held(&t) {
            return false;
        }
        t.staged.insert(key, seq);
        true
    }

    fn unstage(&self, key: PageKey, seq: u64) {
        self.tables.write().staged.take(key, seq);
    }

    fn staged(&self) -> usize {
        self.tables.read().staged.len()
    }

    fn invalidate(&self, _file: &FileHandle, key: PageKey) {
        let mut t = self.tables.write();
        t.staged.remove(key);
        if t.index.remove(key).is_some() {
            self.index_changed.store(true, Relaxed);
        }
    }

    /// Nothing more: the copy went at `invalidate`, before the write, and no other process's
    /// read can have staged the old bytes since.
    fn written(&self, _file: &FileHandle, _key: PageKey) {}

    fn forget(&self, file: Option<FileKey>, first_page: u64) -> bool {
        let hit = |k: PageKey| file.is_none_or(|f| k.file == f) && k.page >= first_page;
        let mut t = self.tables.write();
        t.staged.retain(|k| !hit(k));
        t.index.remove_where(hit);
        if file.is_none() {
            t.restored.clear();
            self.waiting_files.store(0, Relaxed);
        }
        self.index_changed.store(true, Relaxed);
        true
    }

    fn entries(&self, last_ref: &dyn Fn(usize) -> u64) -> Vec<(PageKey, u64, Option<u32>)> {
        let t = self.tables.read();
        t.index
            .entries()
            .map(|(region, key)| (key, last_ref(region), None))
            .collect()
    }

    fn footprint(&self) -> u64 {
        let t = self.tables.read();
        t.index.bytes() + t.restored.bytes()
    }

    fn ring_tail(&self) -> Option<usize> {
        Some(self.ring_tail.load(Relaxed))
    }

    fn enter_region(&self, next: usize) -> Option<Entered> {
        let evicted = {
            let mut t = self.tables.write();
            t.restored.overwrite(next);
            self.waiting_files
                .store(t.restored.files_waiting(), Relaxed);
            t.index.clear_region(next)
        };
        self.ring_tail.store((next + 1) % self.regions, Relaxed);
        Some(Entered {
            region: next,
            evicted,
        })
    }

    /// Always: the ring is this process's alone.
    fn holds_region(&self) -> bool {
        true
    }

    fn index_bytes_with(&self, region: usize, pages: usize) -> Option<u64> {
        let t = self.tables.read();
        Some(t.index.bytes_after_prepare(region, pages) + t.restored.bytes())
    }

    fn release_region(&self, region: usize) -> usize {
        self.tables.write().index.release_region(region)
    }

    fn index_written(&self, region: usize, pages: &[Written]) -> bool {
        let mut t = self.tables.write();
        t.index.prepare(region, pages.len());
        for p in pages {
            if t.staged.take(p.key, p.seq) {
                t.index.insert(p.key, region, p.offset, p.len, p.crc, false);
            }
        }
        self.index_changed.store(true, Relaxed);
        true
    }

    /// Nothing to give back: the next region is the ring's next one, whoever asks.
    fn leave_region(&self) {}

    fn persist_due_at(&self, region: usize) -> bool {
        self.checkpoint_due_at(region)
    }

    /// Nothing: the writer waits for no other process.
    fn stop_waiting(&self) {}

    fn persist(&self, ring: &Ring<'_>, vouched: Vouched, resident: Resident<'_>, if_changed: bool) {
        if !if_changed
            || self.index_changed.load(Relaxed)
            || vouched.fingerprint() != self.checkpointed_files.load(Relaxed)
        {
            self.checkpoint_files(ring, vouched, resident);
        }
    }

    fn shut_down(&self, file: &ExtensionFile) {
        file.remove();
    }

    fn close(&self, file: &ExtensionFile) {
        // Done with the file: the next owner may take it over at once, even while a reader in
        // flight still holds this extension (its reads verify, and miss, like any other).
        file.unlock();
    }

    /// None: the file's own descriptor holds its lock.
    fn lock_fd(&self) -> Option<i32> {
        None
    }

    #[cfg(feature = "testing")]
    fn stop_holding_the_lock(&self) -> bool {
        false
    }

    /// Reads the file's newest checkpoint and lists its pages for adoption (see `persist.rs`).
    fn restore(&self, ring: &Ring<'_>) -> usize {
        let next = self.restore_checkpoint(ring);
        self.ring_tail.store(next, Relaxed);
        next
    }

    fn adopt(
        &self,
        ring: &Ring<'_>,
        key: FileKey,
        identity: FileIdentity,
        now: Option<FileStamp>,
        first_page: &mut dyn FirstPage,
    ) -> Vec<(PageKey, Location)> {
        self.adopt_file(ring, key, identity, now, first_page)
    }

    fn has_waiting_files(&self) -> bool {
        self.waiting_files.load(Relaxed) > 0
    }

    fn has_restored(&self, file: FileIdentity) -> bool {
        let t = self.tables.read();
        t.restored.files.contains_key(&file) || t.restored.adopting == Some(file)
    }

    fn recorded_stamp(&self, file: FileIdentity) -> Option<FileStamp> {
        self.tables
            .read()
            .restored
            .files
            .get(&file)
            .map(|r| r.stamp)
    }
}
