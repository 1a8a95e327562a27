//! What operators see: counters, buffer descriptors, the extension's configuration, and the
//! page trace ([`PageTrace`]). Every function here only reads, but for the trace's switch and
//! its taking.

use super::Engine;
use crate::counters::{CounterSnapshot, Gauges};
use crate::files::FileInfo;
use crate::page::{PageKey, Tier};
use crate::pool::Frame;
use crate::sync::{Mutex, Rank};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;

/// Pages of the extension are reported in units of this many bytes (SQLite's default page).
const REPORT_PAGE: u64 = 4096;

/// One cached copy of a page (sys.dm_os_buffer_descriptors). A page cached in both tiers
/// appears twice, once per tier.
#[derive(Clone)]
pub struct BufferDescriptor {
    /// The file's stable id (`FileInfo::id`).
    pub file: u32,
    pub page: u64,
    pub tier: Tier,
    /// Microseconds the read that brought the page into RAM took (0 for extension copies).
    pub read_micros: u32,
    /// Milliseconds since the engine started, at the last access (per region for the extension).
    pub last_access_ms: u64,
    /// The bytes, for RAM copies (to decode page headers).
    pub frame: Option<Arc<Frame>>,
    /// For a copy in a shared extension that another process loaded, that process's pid.
    pub loaded_by: Option<u32>,
}

/// Every page lookup, in order, while it is on (for replacement-policy studies:
/// `tools/policy-study`). Off, a lookup costs it one load.
pub(super) struct PageTrace {
    on: AtomicBool,
    keys: Mutex<Vec<PageKey>>,
}

impl PageTrace {
    pub(super) fn new() -> PageTrace {
        PageTrace {
            on: AtomicBool::new(false),
            keys: Mutex::new(Rank::Leaf, Vec::new()),
        }
    }

    /// Records a lookup of `key`, if the trace is on (every lookup comes here).
    #[inline]
    pub(super) fn record(&self, key: PageKey) {
        if self.on.load(Relaxed) {
            self.keys.lock().push(key);
        }
    }

    fn set(&self, on: bool) {
        self.on.store(on, Relaxed);
    }

    fn take(&self) -> Vec<PageKey> {
        std::mem::take(&mut self.keys.lock())
    }
}

impl Engine {
    /// Starts or stops recording every page lookup (for replacement-policy studies).
    pub fn set_tracing(&self, on: bool) {
        self.trace.set(on);
    }

    /// The lookups recorded since the last take.
    pub fn take_trace(&self) -> Vec<PageKey> {
        self.trace.take()
    }

    pub fn counters(&self) -> CounterSnapshot {
        let ext = self.current_extension();
        let files = self.files();
        let page_size = files.first().map_or(REPORT_PAGE, |f| f.page_size as u64);
        let max_memory = self.max_memory();
        let index = ext.as_ref().map_or(0, |e| e.index_bytes());
        let view = ext.as_ref().map(|e| e.view()).unwrap_or_default();
        let target_bytes = self.pool.target_bytes();
        let used = self.pool.used_bytes();
        let charge = page_size + crate::config::L1_FRAME_OVERHEAD;
        let gauges = Gauges {
            database_pages: self.pool.resident_pages() as u64,
            target_pages: target_bytes / charge,
            free_pages: target_bytes.saturating_sub(used) / charge,
            memory_bytes: used + index,
            max_memory,
            uptime_ms: self.now_ms(),
            ext_allocated_pages: view.pages as u64,
            ext_free_pages: ext.as_ref().map_or(0, |e| {
                e.ring_bytes().saturating_sub(view.bytes) / REPORT_PAGE
            }),
            ext_in_use_percent: ext.as_ref().map_or(0, |e| {
                (view.bytes * 100).checked_div(e.ring_bytes()).unwrap_or(0)
            }),
            ext_index_bytes: index,
            ext_shared_processes: view.participants as u64,
            ext_shared_index_bytes: view.shared_memory_bytes,
            ext_shared_recoveries: view.recoveries,
            ext_shared_lock_timeouts: view.lock_timeouts,
            buffered_data_files: files
                .iter()
                .filter(|f| f.openers > 0 && !f.direct_io)
                .count() as u64,
        };
        CounterSnapshot::take(&self.counters, &gauges)
    }

    /// The latency histograms beside the counters (cumulative, as the counters are): the
    /// extension's read requests, and, for a shared extension, this process's waits for the
    /// shared index's lock.
    pub fn histograms(&self) -> Vec<crate::counters::HistogramSnapshot> {
        let mut h = vec![self
            .counters
            .ext_read_latency
            .snapshot("Extension read time")];
        if let Some(s) = self.extension.read().as_ref().and_then(|e| e.lock_wait()) {
            h.push(s);
        }
        h
    }

    /// Every cached copy of every page, by file and page. Copies of a file's pages from before
    /// it got a new key are not cached pages any more and are not listed.
    pub fn descriptors(&self) -> Vec<BufferDescriptor> {
        let ids = self.files.lock().ids_by_key();
        let mut out: Vec<BufferDescriptor> = self
            .pool
            .frames()
            .into_iter()
            .filter_map(|f| {
                Some(BufferDescriptor {
                    file: *ids.get(&f.key.file)?,
                    page: f.key.page,
                    tier: Tier::Memory,
                    read_micros: f.read_micros,
                    last_access_ms: f.last_access_ms.load(Relaxed),
                    frame: Some(f),
                    loaded_by: None,
                })
            })
            .collect();
        if let Some(ext) = self.current_extension() {
            out.extend(ext.entries().into_iter().filter_map(|(key, last, by)| {
                Some(BufferDescriptor {
                    file: *ids.get(&key.file)?,
                    page: key.page,
                    tier: Tier::Extension,
                    read_micros: 0,
                    last_access_ms: last,
                    frame: None,
                    loaded_by: by,
                })
            }));
        }
        out.sort_by_key(|d| (d.file, d.page, d.tier != Tier::Memory));
        out
    }

    pub fn files(&self) -> Vec<FileInfo> {
        self.files.lock().infos()
    }

    /// Asserts the engine's invariants (tests and soak runs): the memory bound and the accounting.
    /// The caller's threads are quiet; the background readahead is waited for here.
    pub fn check_invariants(&self) {
        assert!(
            self.wait_for_readahead(std::time::Duration::from_secs(10)),
            "background readahead did not finish within 10 s"
        );
        self.pool.check_invariants();
        let index = self
            .extension
            .read()
            .as_ref()
            .map_or(0, |e| e.index_bytes());
        assert!(
            self.pool.target_bytes() + index <= self.max_memory(),
            "L1 target plus extension index exceed max server memory"
        );
        if let Some(ext) = self.extension.read().as_ref() {
            ext.check_invariants();
        }
    }

    /// Waits until the extension's writer has written every staged page (for benchmarks that
    /// warm the extension, and tests). False on timeout.
    pub fn wait_for_extension_writes(&self, timeout: std::time::Duration) -> bool {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            match self.current_extension() {
                Some(ext) if ext.pending_writes() > 0 => {}
                _ => return true,
            }
            if std::time::Instant::now() >= deadline {
                return false;
            }
            crate::sync::pause();
        }
    }

    /// How long the extension's restore took (checkpoint read, files open then adopted), once
    /// done; None without a restored extension.
    pub fn extension_restore_time(&self) -> Option<std::time::Duration> {
        self.current_extension().and_then(|e| e.restore_time())
    }

    /// Waits until the extension has restored its checkpoint and run the adoptions asked for
    /// (tests and benchmarks); false on timeout.
    pub fn wait_for_extension_restore(&self, timeout: std::time::Duration) -> bool {
        let deadline = std::time::Instant::now() + timeout;
        while self
            .current_extension()
            .is_some_and(|e| !e.restore_settled())
        {
            if std::time::Instant::now() >= deadline {
                return false;
            }
            crate::sync::pause();
        }
        true
    }
}
