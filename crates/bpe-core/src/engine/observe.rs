//! What operators see: counters, buffer descriptors, the extension's configuration.

use super::{Engine, ExtensionStatus};
use crate::counters::{CounterSnapshot, Gauges};
use crate::files::FileInfo;
use crate::page::{FileId, Tier};
use crate::pool::Frame;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

/// One cached copy of a page (sys.dm_os_buffer_descriptors). A page cached in both tiers
/// appears twice, once per tier.
#[derive(Clone)]
pub struct BufferDescriptor {
    pub file: FileId,
    pub page: u64,
    pub tier: Tier,
    /// Microseconds the read that brought the page into RAM took (0 for extension copies).
    pub read_micros: u32,
    /// Milliseconds since the engine started, at the last access (per region for the extension).
    pub last_access_ms: u64,
    /// The bytes, for RAM copies (to decode page headers).
    pub frame: Option<Arc<Frame>>,
}

impl Engine {
    pub fn counters(&self) -> CounterSnapshot {
        let ext = self.current_extension();
        let files = self.files();
        let page_size = files
            .first()
            .map_or(crate::config::DEFAULT_SLOT_SIZE, |f| f.page_size)
            as u64;
        let max_memory = self.max_memory();
        let index = ext.as_ref().map_or(0, |e| e.index_bytes());
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
            ext_allocated_pages: ext.as_ref().map_or(0, |e| e.cached_pages() as u64),
            ext_total_pages: ext.as_ref().map_or(0, |e| e.slots() as u64),
            ext_index_bytes: index,
            buffered_data_files: files.iter().filter(|f| !f.direct_io).count() as u64,
        };
        CounterSnapshot::take(&self.counters, &gauges)
    }

    pub fn descriptors(&self) -> Vec<BufferDescriptor> {
        let mut out: Vec<BufferDescriptor> = self
            .pool
            .frames()
            .into_iter()
            .map(|f| BufferDescriptor {
                file: f.key.file,
                page: f.key.page,
                tier: Tier::Memory,
                read_micros: f.read_micros,
                last_access_ms: f.last_access_ms.load(Relaxed),
                frame: Some(f),
            })
            .collect();
        if let Some(ext) = self.current_extension() {
            out.extend(
                ext.entries()
                    .into_iter()
                    .map(|(key, last)| BufferDescriptor {
                        file: key.file,
                        page: key.page,
                        tier: Tier::Extension,
                        read_micros: 0,
                        last_access_ms: last,
                        frame: None,
                    }),
            );
        }
        out.sort_by_key(|d| (d.file, d.page, d.tier != Tier::Memory));
        out
    }

    pub fn extension_status(&self) -> ExtensionStatus {
        // Reading the extension first lets a pending self-disable show up in the status.
        let _ = self.current_extension();
        self.status.lock().clone()
    }

    pub fn files(&self) -> Vec<FileInfo> {
        self.files.lock().infos()
    }

    /// Asserts the engine's invariants (tests and soak runs): the memory bound and the accounting.
    pub fn check_invariants(&self) {
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
    }
}

impl Engine {
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
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }
}
