//! The engine: one RAM buffer pool (L1), at most one extension (L2), and the data files under them.
//!
//! - `data_path.rs`: where a page goes on a read and on a write (the only place), but for
//! - `write_behind.rs`: a write held in L1 until its writer writes it back.
//! - `lifecycle.rs`: the extension's lifecycle (enable, disable, resize, retire), one state
//!   machine.
//! - `admin.rs`: the other operator settings (memory, drop clean buffers) and the checks; the
//!   memory budget (`MemoryBudget`: max server memory and L1's target under it).
//! - `observe.rs`: counters, buffer descriptors, extension configuration; the page trace
//!   (`PageTrace`).
//! - `warm.rs`: what a warm restart asks of the engine (vouching, adoption, prewarm).
//! - `prefetch.rs`: readahead in the background (`BackgroundReads`: its thread and its jobs).
//! - this file: the engine's parts, the file lifecycle (see `files.rs`), and what the extension
//!   asks of the engine (index memory, retiring it after faults).
//!
//! The parts with state of their own are types of the file that uses them (`MemoryBudget`,
//! `PageTrace`, `BackgroundReads`, `lifecycle::ExtensionFds`, and `files.rs`'s `FileRegistry`,
//! which also hands out the file keys), held by the engine in place; none refers back to it.
//!
//! Locks are taken in the order of `sync::Rank` (checked in debug builds); no getter changes
//! state.

mod admin;
mod data_path;
mod lifecycle;
mod observe;
mod prefetch;
mod warm;
mod write_behind;

pub use admin::{
    check_extension_size, check_max_memory, effective_extension_size, SettingChange, Settings,
};
pub use data_path::{PageRead, PinnedPage, Via};
pub use lifecycle::{ExtensionState, ExtensionStatus};
pub use observe::BufferDescriptor;
pub use write_behind::BehindLog;

use crate::config::Config;
use crate::counters::Counters;
use crate::error::Result;
use crate::extension::{Extension, ExtensionHost};
use crate::files::{FileHandle, FileRegistry, OpenKind, OpenRequest};
use crate::io::clock::CoarseClock;
use crate::io::{Emulator, FaultInjector, FileIdentity};
use crate::lineage::{Lineage, PageSet};
use crate::page::{FileKey, PageKey};
use crate::pool::{BufferPool, EvictionSink, Frame};
use crate::sync::{Mutex, Rank, RwLock};
use std::path::Path;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Weak};
use std::time::Instant;

pub struct Engine {
    config: Config,
    pool: BufferPool,
    /// The working extension, for readers; changed only by `lifecycle.rs`'s transitions.
    extension: RwLock<Option<Arc<Extension>>>,
    lifecycle: Mutex<lifecycle::Lifecycle>,
    /// Serializes operator actions (enable, disable, resize, memory changes).
    admin: Mutex<()>,
    files: Mutex<FileRegistry>,
    /// Max server memory and L1's target under it (see `admin.rs`).
    memory: admin::MemoryBudget,
    counters: Arc<Counters>,
    faults: Arc<FaultInjector>,
    emulator: Option<Arc<Emulator>>,
    /// The extension's descriptors, for a forked child to close (see `lifecycle.rs`).
    extension_fds: lifecycle::ExtensionFds,
    epoch: Instant,
    /// The hit path's clock (frames' last access), cheaper than `epoch`.
    clock: CoarseClock,
    /// Every page lookup, while on (see `observe.rs`).
    trace: observe::PageTrace,
    /// Readahead and prewarm in the background (see `prefetch.rs`).
    background: prefetch::BackgroundReads,
    me: Weak<Engine>,
}

impl Engine {
    pub fn new(config: Config) -> Arc<Engine> {
        Arc::new_cyclic(|me| Engine {
            pool: BufferPool::new(config.max_memory, config.large_pages),
            extension: RwLock::new(Rank::ExtensionSlot, None),
            lifecycle: Mutex::new(Rank::Status, lifecycle::Lifecycle::default()),
            admin: Mutex::new(Rank::Admin, ()),
            files: Mutex::new(Rank::Files, FileRegistry::default()),
            memory: admin::MemoryBudget::new(config.max_memory),
            counters: Arc::new(Counters::default()),
            faults: Arc::new(FaultInjector::default()),
            emulator: config.data_device.map(|m| Arc::new(Emulator::new(m))),
            extension_fds: lifecycle::ExtensionFds::new(),
            epoch: Instant::now(),
            clock: CoarseClock::start(),
            trace: observe::PageTrace::new(),
            background: prefetch::BackgroundReads::new(),
            me: me.clone(),
            config,
        })
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    pub fn faults(&self) -> &FaultInjector {
        &self.faults
    }

    pub(crate) fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    /// Opens (or shares) a data file whose pages are `page_size` bytes, by name.
    pub fn open_file(&self, path: &Path, page_size: usize) -> Result<FileHandle> {
        crate::config::check_page_size(page_size)?;
        self.open_file_with(&OpenRequest {
            path,
            open_from: path,
            expect: None,
            page_size: &|| page_size,
        })
        .map(|(f, _)| f)
    }

    /// Opens (or shares, or reopens) a data file as `req` says; see `files.rs` for the lifecycle.
    pub fn open_file_with(&self, req: &OpenRequest<'_>) -> Result<(FileHandle, OpenKind)> {
        let mut files = self.files.lock();
        self.renumber_if_keys_run_out(&mut files);
        let opened = files.open(req, &self.config)?;
        drop(files);
        if let (_, OpenKind::Reopened { changed: true, .. }) = &opened {
            Counters::bump(&self.counters.file_invalidations);
        }
        if let Some(me) = self.me.upgrade() {
            me.offer_for_adoption(&opened.0, opened.1);
        }
        Ok(opened)
    }

    /// Opens (or shares, or reopens) one snapshot of a file only the caller can read; see
    /// `FileRegistry::open_snapshot`. Reads of it must pass the caller's device (`Via`).
    pub fn open_snapshot(
        &self,
        path: &Path,
        identity: FileIdentity,
        page_size: usize,
    ) -> Result<(FileHandle, OpenKind)> {
        let mut files = self.files.lock();
        self.renumber_if_keys_run_out(&mut files);
        let opened = files.open_snapshot(path, identity, page_size)?;
        drop(files);
        if let Some(me) = self.me.upgrade() {
            me.offer_for_adoption(&opened.0, opened.1);
        }
        Ok(opened)
    }

    /// Whether a restored checkpoint's pages still wait for their files to open.
    pub fn has_restored_pages_waiting(&self) -> bool {
        self.current_extension()
            .is_some_and(|e| e.has_waiting_files())
    }

    /// Whether this engine has cached pages of the file `identity` names: open or retained,
    /// or waiting in a restored checkpoint for the file to open.
    pub fn holds_pages_of(&self, identity: FileIdentity) -> bool {
        self.files.lock().knows(identity)
            || self
                .current_extension()
                .is_some_and(|e| e.has_restored(identity))
    }

    /// Records that snapshot `file` may take its pages from snapshot `parent`'s cache, except
    /// `changed` (every page that differs between them, or more; see `lineage.rs`). A
    /// snapshot that already has a lineage keeps it (any correct one serves).
    pub fn inherit(&self, file: &FileHandle, parent: &FileHandle, changed: PageSet) {
        let both_snapshots = file.identity().is_snapshot() && parent.identity().is_snapshot();
        if !both_snapshots
            || Arc::ptr_eq(file, parent)
            || file.page_size() != parent.page_size()
            || !file.lineage().is_empty()
        {
            return;
        }
        file.set_lineage(Lineage::after(parent, &parent.lineage(), changed));
    }

    /// Releases a handle; true if it was the file's last opener. After the last one the
    /// descriptors close; the cached pages stay for a reopen (which checks first that the file
    /// did not change meanwhile).
    pub fn close_file(&self, file: &FileHandle) -> bool {
        // The last look at the first page while the file is open, for the extension's
        // checkpoints (a closed file's header cannot be read then; see `first_page_check`).
        if self.current_extension().is_some() {
            if let Some(known) = file.known_stamp().filter(|k| !k.racy) {
                self.first_page_check(file, known.stamp);
            }
        }
        self.files.lock().close(file)
    }

    /// Changes a file's page size (SQLite's VACUUM can). Its cached pages are forgotten.
    pub fn set_page_size(&self, file: &FileHandle, page_size: usize) -> Result<()> {
        crate::config::check_page_size(page_size)?;
        if file.page_size() != page_size {
            let mut files = self.files.lock();
            self.renumber_if_keys_run_out(&mut files);
            file.store_page_size(page_size);
            file.set_key(files.new_key());
        }
        Ok(())
    }

    /// Forgets every cached copy of `file`'s pages (another process changed it): the file gets a
    /// new key, so nothing cached under the old one can be found again. O(1).
    pub fn invalidate_file(&self, file: &FileHandle) {
        Counters::bump(&self.counters.file_invalidations);
        let mut files = self.files.lock();
        self.renumber_if_keys_run_out(&mut files);
        file.set_key(files.new_key());
        drop(files);
        if file.rewrites.rewritten(self.now_ms()) {
            if let Some(d) = file.data() {
                if d.follow_os_cache(true) {
                    log::info!(
                        "{}: rewritten by another program several times a second; its misses \
                         are read through the OS page cache, where its writes are",
                        file.path().display()
                    );
                }
            }
        }
    }

    /// Forgets the cached copies of some of `file`'s pages (another process changed them), in
    /// both tiers. A load of one of them in flight installs nothing.
    pub fn forget_pages(&self, file: &FileHandle, pages: &[u64]) {
        let _stable = file.key_stable();
        let key = file.key();
        let ext = self.current_extension();
        for &page in pages {
            let k = PageKey::new(key, page);
            // L1 first: once the frame is gone, no eviction can offer the old bytes to L2.
            self.pool.forget_page(k);
            if let Some(ext) = &ext {
                ext.invalidate_page(file, k);
            }
        }
        self.counters
            .pages_forgotten
            .fetch_add(pages.len() as u64, Relaxed);
    }

    /// Near the end of the key space (after ~2^32 invalidations), empties both tiers and gives
    /// every file a fresh key from 1 on: no key is reused while a copy cached under it remains
    /// (see `FileRegistry::renumber`). Called under the registry lock before every new key.
    fn renumber_if_keys_run_out(&self, files: &mut FileRegistry) {
        if !files.keys_run_out() {
            return;
        }
        // Every cached page goes under its old key (a shared extension's names are its own).
        let _ = self.drop_clean_buffers();
        files.renumber();
    }

    /// Forgets cached pages of `file` from `first_page` on, in both tiers (after a truncate).
    fn forget_pages_from(&self, file: FileKey, first_page: u64) {
        self.pool.invalidate_from(file, first_page);
        if let Some(ext) = self.current_extension() {
            ext.invalidate_where(Some(file), first_page);
        }
    }

    /// The extension, if one is enabled and working. A pure read.
    pub(crate) fn current_extension(&self) -> Option<Arc<Extension>> {
        self.extension
            .read()
            .as_ref()
            .filter(|e| e.failure().is_none())
            .cloned()
    }

    /// Re-derives L1's target from max server memory and the extension's index charge. Every
    /// change of either goes through here, one at a time, so the two never disagree.
    fn refresh_memory_target(&self) {
        self.memory.retarget(&self.pool, self, || {
            self.extension
                .read()
                .as_ref()
                .map_or(0, |e| e.index_bytes())
        });
    }
}

/// What the extension asks of the engine.
struct Host(Weak<Engine>);

impl ExtensionHost for Host {
    fn charge_index(&self, bytes: u64) -> bool {
        let Some(engine) = self.0.upgrade() else {
            return false;
        };
        engine.memory.charge_index(bytes, &engine.pool, &*engine)
    }

    fn failed(&self, ext: &Arc<Extension>) {
        if let Some(engine) = self.0.upgrade() {
            engine.extension_failed(ext);
        }
    }

    fn vouched_files(&self) -> crate::extension::Vouched {
        self.0
            .upgrade()
            .map_or_else(Default::default, |engine| engine.vouched_files())
    }

    fn adopt_open_files(&self, ext: &Arc<Extension>) {
        if let Some(engine) = self.0.upgrade() {
            engine.adopt_open_files(ext);
        }
    }

    fn resident(&self, keys: &[PageKey]) -> Vec<bool> {
        match self.0.upgrade() {
            Some(engine) => engine.resident(keys),
            None => vec![false; keys.len()],
        }
    }

    fn checkpoint_interval(&self) -> std::time::Duration {
        self.0
            .upgrade()
            .map_or(crate::config::CHECKPOINT_INTERVAL, |e| {
                e.config.checkpoint_interval
            })
    }
}

/// L2's only inputs, both called under the page's L1 shard lock (see pool::EvictionSink).
///
/// A page is offered to L2 as soon as it is read from the data file, and again when it leaves
/// L1 (then only if it was rewritten since, as L2 skips a page it holds unchanged, or if its copy
/// is about to be overwritten: `Extension::nears_the_tail`). Admitting at
/// load puts the L2 write where the query already paid a slow-disk read, and spares the hot
/// phase that follows: L2 hits then evict L1 pages that L2 already holds, and its reads do not
/// share the SSD with a burst of first admissions.
impl EvictionSink for Engine {
    fn evicted(&self, frame: &Arc<Frame>) {
        Counters::bump(&self.counters.lazy_writes);
        Counters::average_in(
            &self.counters.l1_residence_ms,
            self.now_ms().saturating_sub(frame.loaded_ms),
        );
        if let Some(ext) = self.extension.read().as_ref() {
            ext.admit(frame);
        }
    }

    fn loaded_from_disk(&self, frame: &Arc<Frame>) {
        if let Some(ext) = self.extension.read().as_ref() {
            ext.admit(frame);
        }
    }
}

impl Drop for Engine {
    /// The extension is closed, not removed: its file stays for the next engine to start warm.
    fn drop(&mut self) {
        let vouched = self.vouched_files();
        if let Some(ext) = self.extension.get_mut().take() {
            ext.close(vouched, &|keys| self.resident(keys));
        }
    }
}
