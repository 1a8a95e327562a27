//! Defaults and limits, in one place so that the docs can cite them.

use std::time::Duration;

/// Default `max server memory`: sized for an embedded library that shares the machine with its host.
pub const DEFAULT_MAX_MEMORY: u64 = 128 << 20;
/// Smallest accepted `max server memory`: one largest page plus headroom.
pub const MIN_MAX_MEMORY: u64 = 256 << 10;
/// Bytes charged per cached L1 page on top of its data (frame, map entry, queue entry).
pub const L1_FRAME_OVERHEAD: u64 = 96;
/// L1's slab may keep this much more than L1's target in use: room for frames that left L1 and
/// are still held (staged for the extension writer, being copied by a reader), and for chunks
/// split between page sizes. Part of the fixed overhead of docs/RELIABILITY.md.
pub const L1_SLAB_SLACK: u64 = 4 << 20;
/// When the bytes fit but the slab has no free slot, L1 evicts at most this many more frames
/// before it serves the page without caching it.
pub const SLOT_EVICTIONS: usize = 8;
/// Page sizes accepted (SQLite's range).
pub const MIN_PAGE_SIZE: usize = 512;
pub const MAX_PAGE_SIZE: usize = 65536;
/// Alignment of O_DIRECT buffers, offsets and lengths. 4096 is safe on every Linux block device.
pub const DIRECT_IO_ALIGN: usize = 4096;
/// The extension writes in batches of this many bytes (the ring's write unit).
pub const EXTENSION_BATCH_BYTES: usize = 512 << 10;
/// Pages evicted from L1 waiting for the background writer. A full queue drops admissions, never blocks.
pub const EXTENSION_STAGING_PAGES: usize = 1024;
/// Consecutive extension faults after which the extension disables itself.
pub const EXTENSION_FAULT_LIMIT: u32 = 8;
/// The extension index may take at most this fraction (1/N) of max server memory.
pub const INDEX_BUDGET_DIVISOR: u64 = 2;
/// Bytes of the largest single data-file read issued by readahead.
pub const READAHEAD_BYTES: usize = 256 << 10;
/// Consecutive sequential page reads of a file after which readahead starts.
pub const READAHEAD_TRIGGER: u32 = 3;

/// Emulated latency of a device: for benchmarks and tests only, never on by default.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct DeviceEmulation {
    /// Added to every read request.
    pub latency: Duration,
    /// At most this many requests per second (0: unlimited), enforced across threads.
    pub iops: u32,
}

/// The slowest emulated device accepted: a second per request is slower than any real one.
pub const MAX_EMULATED_LATENCY: Duration = Duration::from_secs(1);

impl DeviceEmulation {
    /// Checks the emulation's bounds (one rule for every way it is configured).
    pub fn validate(&self) -> Result<(), String> {
        if self.latency > MAX_EMULATED_LATENCY {
            return Err(format!(
                "emulated latency {} us is above the maximum of {} us",
                self.latency.as_micros(),
                MAX_EMULATED_LATENCY.as_micros()
            ));
        }
        Ok(())
    }
}

/// Configuration of an [`crate::Engine`].
#[derive(Clone, Debug)]
pub struct Config {
    pub max_memory: u64,
    /// Try O_DIRECT on data files (falls back to buffered I/O where refused).
    pub direct_io: bool,
    /// Readahead on sequential access.
    pub readahead: bool,
    /// Emulated data-device latency (benchmarks); `None` for the real device.
    pub data_device: Option<DeviceEmulation>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            max_memory: DEFAULT_MAX_MEMORY,
            direct_io: true,
            readahead: true,
            data_device: None,
        }
    }
}

/// Physical memory of this machine in bytes (from /proc/meminfo), if it can be read.
pub fn physical_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

pub fn check_page_size(page_size: usize) -> crate::Result<()> {
    if page_size.is_power_of_two() && (MIN_PAGE_SIZE..=MAX_PAGE_SIZE).contains(&page_size) {
        Ok(())
    } else {
        Err(crate::Error::BadPageSize(page_size))
    }
}
