//! The engine: one RAM buffer pool (L1), at most one extension (L2), and the data files under them.
//!
//! - `data_path.rs`: where a page goes on a read and on a write (the only place).
//! - `admin.rs`: the operator's controls (memory, extension on/off/resize, drop clean buffers).
//! - `observe.rs`: counters, buffer descriptors, extension configuration.

mod admin;
mod data_path;
mod observe;

pub use admin::{ExtensionState, ExtensionStatus};
pub use data_path::PageRead;
pub use observe::BufferDescriptor;

use crate::config::Config;
use crate::counters::Counters;
use crate::extension::Extension;
use crate::files::{FileHandle, FileRegistry};
use crate::io::{Emulator, FaultInjector};
use crate::page::PageKey;
use crate::pool::{BufferPool, EvictionSink, Frame};
use crate::Result;
use parking_lot::{Mutex, RwLock};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

pub struct Engine {
    config: Config,
    pool: BufferPool,
    extension: RwLock<Option<Arc<Extension>>>,
    status: Mutex<ExtensionStatus>,
    /// Serializes operator actions (enable, disable, resize, memory changes).
    admin: Mutex<()>,
    files: Mutex<FileRegistry>,
    max_memory: AtomicU64,
    counters: Arc<Counters>,
    faults: Arc<FaultInjector>,
    emulator: Option<Arc<Emulator>>,
    epoch: Instant,
    tracing: AtomicBool,
    trace: Mutex<Vec<PageKey>>,
}

static GLOBAL: OnceLock<Arc<Engine>> = OnceLock::new();

impl Engine {
    pub fn new(config: Config) -> Arc<Engine> {
        Arc::new(Engine {
            pool: BufferPool::new(config.max_memory),
            extension: RwLock::new(None),
            status: Mutex::new(ExtensionStatus::default()),
            admin: Mutex::new(()),
            files: Mutex::new(FileRegistry::default()),
            max_memory: AtomicU64::new(config.max_memory),
            counters: Arc::new(Counters::default()),
            faults: Arc::new(FaultInjector::default()),
            emulator: config.data_device.map(|m| Arc::new(Emulator::new(m))),
            epoch: Instant::now(),
            tracing: AtomicBool::new(false),
            trace: Mutex::new(Vec::new()),
            config,
        })
    }

    /// The process-wide engine, created on first use with `config()`.
    pub fn global_with(config: impl FnOnce() -> Config) -> &'static Arc<Engine> {
        GLOBAL.get_or_init(|| {
            let engine = Engine::new(config());
            // The extension file holds pages in the clear: remove it when the process exits.
            // SAFETY: atexit only stores the function pointer; remove_extension_at_exit is
            // extern "C", never unwinds, and touches only the global engine.
            unsafe { libc::atexit(remove_extension_at_exit) };
            engine
        })
    }

    /// The process-wide engine if one was created.
    pub fn global() -> Option<&'static Arc<Engine>> {
        GLOBAL.get()
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    pub fn faults(&self) -> &FaultInjector {
        &self.faults
    }

    pub(crate) fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// Opens (or shares) a data file whose pages are `page_size` bytes.
    pub fn open_file(&self, path: &Path, page_size: usize) -> Result<FileHandle> {
        self.files.lock().open(
            path,
            page_size,
            &self.config,
            self.emulator.clone(),
            self.faults.clone(),
        )
    }

    /// Releases a handle; after the last one, the file's cached pages are forgotten (nothing
    /// then watches the file for changes by other processes). The descriptors close when the
    /// last `FileHandle` clone is dropped.
    pub fn close_file(&self, file: &FileHandle) {
        if self.files.lock().close(file) {
            self.forget_pages(file.id, 0);
        }
    }

    /// Changes a file's page size (SQLite's VACUUM can). Its cached pages are dropped.
    pub fn set_page_size(&self, file: &FileHandle, page_size: usize) -> Result<()> {
        crate::config::check_page_size(page_size)?;
        if file.page_size() != page_size {
            file.store_page_size(page_size);
            self.forget_pages(file.id, 0);
        }
        Ok(())
    }

    /// Forgets every cached copy of `file`'s pages: for when another process may have changed it.
    pub fn invalidate_file(&self, file: &FileHandle) {
        Counters::bump(&self.counters.file_invalidations);
        self.forget_pages(file.id, 0);
    }

    fn forget_pages(&self, file: crate::page::FileId, first_page: u64) {
        if first_page == 0 {
            self.pool.invalidate(Some(file));
        } else {
            self.pool.invalidate_from(file, first_page);
        }
        if let Some(ext) = self.current_extension() {
            ext.invalidate_where(Some(file), first_page);
        }
    }

    pub(crate) fn current_extension(&self) -> Option<Arc<Extension>> {
        let ext = self.extension.read().clone()?;
        if let Some(reason) = ext.failure() {
            self.retire_failed_extension(&ext, reason);
            return None;
        }
        Some(ext)
    }

    /// Starts or stops recording every page lookup (for replacement-policy studies).
    pub fn set_tracing(&self, on: bool) {
        self.tracing.store(on, Relaxed);
    }

    pub fn take_trace(&self) -> Vec<PageKey> {
        std::mem::take(&mut self.trace.lock())
    }
}

/// L2's only inputs, both called under the page's L1 shard lock (see pool::EvictionSink).
///
/// A page is offered to L2 as soon as it is read from the data file, and again when it leaves
/// L1 (then only if it was rewritten since, as L2 skips a page it holds unchanged). Admitting at
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
    fn drop(&mut self) {
        if let Some(ext) = self.extension.get_mut().take() {
            ext.shutdown();
        }
    }
}

extern "C" fn remove_extension_at_exit() {
    if let Some(engine) = GLOBAL.get() {
        if let Some(ext) = engine.extension.try_read().and_then(|e| e.clone()) {
            ext.remove_file_only();
        }
    }
}
