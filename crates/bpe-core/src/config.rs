//! Defaults and limits, in one place so that the docs can cite them.

use std::time::Duration;

/// Dirty frames (write-behind) take at most 1/N of L1's target: the rest stays for clean pages,
/// and a writer that outgrows it writes through.
pub const WRITE_BEHIND_SHARE: u64 = 4;

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
/// How often the extension's writer checkpoints its index while it changes (what a process
/// killed without warning loses of the next start's warmth is at most this much of changes).
pub const CHECKPOINT_INTERVAL: std::time::Duration = std::time::Duration::from_secs(5);
/// Consecutive extension faults after which the extension disables itself.
pub const EXTENSION_FAULT_LIMIT: u32 = 8;
/// The extension index may take at most this fraction (1/N) of max server memory.
pub const INDEX_BUDGET_DIVISOR: u64 = 2;
/// Bytes of the largest single read issued by readahead (data file or extension). 1 MiB: a
/// device that caps requests per second (a throttled volume, a cloud disk's IOPS limit) gives a
/// sequential reader IOPS x request size, and 1 MiB is about the largest request Linux block
/// devices take whole (max_sectors_kb 1280 on loop and virtio); the kernel's own readahead for
/// buffered readers makes requests that size too.
pub const READAHEAD_BYTES: usize = 1 << 20;
/// A readahead window takes at most this fraction (1/N) of max server memory, so that a small
/// pool is not asked to hold more than it can. (1/8 was tried: with 1 MB of memory, scans in
/// debug builds (tests/faults.rs) then never read from the extension; the cause is not found.)
pub const READAHEAD_MEMORY_DIVISOR: u64 = 1;
/// Consecutive sequential page reads of a file after which readahead starts.
pub const READAHEAD_TRIGGER: u32 = 3;

/// An emulated device's costs (after foyer's device throttle): for benchmarks and tests only,
/// never on by default. A request of `n` bytes takes its direction's latency plus `n` / bandwidth;
/// latencies of parallel requests overlap, their transfers share the bandwidth, and each
/// direction admits at most its IOPS cap of requests a second, across all threads. A sync waits
/// for the writes being transferred, then takes the sync latency (the device's cache flush).
/// Zero means free: no latency, unlimited bandwidth, no IOPS cap.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct DeviceEmulation {
    pub read_latency: Duration,
    pub write_latency: Duration,
    pub sync_latency: Duration,
    /// Bytes per second (0: unlimited).
    pub read_bandwidth: u64,
    pub write_bandwidth: u64,
    /// Requests per second (0: unlimited).
    pub read_iops: u32,
    pub write_iops: u32,
}

/// The slowest emulated device accepted: a second per request is slower than any real one.
pub const MAX_EMULATED_LATENCY: Duration = Duration::from_secs(1);
/// The lowest emulated bandwidth accepted, in bytes per second (1 MB/s: a 256 KiB readahead
/// then takes a quarter of a second; below that runs would not finish).
pub const MIN_EMULATED_BANDWIDTH: u64 = 1_000_000;

impl DeviceEmulation {
    /// Checks the emulation's bounds (one rule for every way it is configured); the error names
    /// the setting at fault.
    pub fn validate(&self) -> Result<(), String> {
        for (what, latency) in [
            ("read", self.read_latency),
            ("write", self.write_latency),
            ("sync", self.sync_latency),
        ] {
            if latency > MAX_EMULATED_LATENCY {
                return Err(format!(
                    "emulated {what} latency {} us is above the maximum of {} us",
                    latency.as_micros(),
                    MAX_EMULATED_LATENCY.as_micros()
                ));
            }
        }
        for (what, bandwidth) in [
            ("read", self.read_bandwidth),
            ("write", self.write_bandwidth),
        ] {
            if bandwidth != 0 && bandwidth < MIN_EMULATED_BANDWIDTH {
                return Err(format!(
                    "emulated {what} bandwidth {bandwidth} bytes/s is below the minimum of \
                     {MIN_EMULATED_BANDWIDTH} bytes/s (1 MB/s); use 0 for unlimited"
                ));
            }
        }
        Ok(())
    }

    /// True when no request costs anything (every setting zero).
    pub fn is_free(&self) -> bool {
        *self == DeviceEmulation::default()
    }
}

/// The whole model in one line, e.g. "read 8000 us + 150 MB/s, at most 150 IOPS; write 8000 us
/// + 150 MB/s, at most 150 IOPS; sync 8000 us" (MB = 10^6 bytes).
impl std::fmt::Display for DeviceEmulation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        fn lane(latency: Duration, bandwidth: u64, iops: u32) -> String {
            let mut s = format!("{} us", latency.as_micros());
            if bandwidth > 0 {
                let mb = bandwidth as f64 / 1e6;
                s.push_str(&format!(" + {} MB/s", trim_number(mb)));
            }
            if iops > 0 {
                s.push_str(&format!(", at most {iops} IOPS"));
            }
            s
        }
        write!(
            f,
            "read {}; write {}; sync {} us",
            lane(self.read_latency, self.read_bandwidth, self.read_iops),
            lane(self.write_latency, self.write_bandwidth, self.write_iops),
            self.sync_latency.as_micros()
        )
    }
}

/// 150 for 150.0, 0.5 for 0.5: whole numbers without a fraction.
fn trim_number(x: f64) -> String {
    if x.fract() == 0.0 {
        format!("{x:.0}")
    } else {
        format!("{x:.3}").trim_end_matches('0').to_string()
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
    /// How often the extension checkpoints its index while it changes.
    pub checkpoint_interval: std::time::Duration,
    /// How an extension enabled without saying is used: shared (the default) with the other
    /// processes of this user that enable one at the same path (see `extension/shared`), or,
    /// off, this process's own (`Sharing::Private`: its warm restart survives a reboot).
    pub shared_extension: bool,
    /// Let a writer that holds its file's write lock keep page writes in L1 until it writes
    /// them back (`engine/write_behind.rs`); off, every page write goes to the file at once.
    pub write_behind: bool,
    /// Ask the kernel for transparent huge pages (2 MiB) under L1's page bytes, as SQL Server's
    /// buffer pool uses large pages (trace flag 834): a hit's copy then rarely misses the TLB,
    /// which a 4 KiB mapping of a pool many times the TLB's reach does on nearly every page.
    pub large_pages: bool,
}

/// Whether an extension is shared with the other processes of this user that enable one at
/// the same path, or is this process's own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sharing {
    /// One ring and one index in shared memory for every process at the path (the default).
    Shared,
    /// This process's own: refused while another process uses the path. Its index is
    /// checkpointed into the file, so a restart, even after a reboot, starts warm.
    Private,
}

impl Sharing {
    pub fn is_shared(self) -> bool {
        self == Sharing::Shared
    }

    /// The lower-case word the status and the statements use.
    pub fn word(self) -> &'static str {
        match self {
            Sharing::Shared => "shared",
            Sharing::Private => "private",
        }
    }
}

impl Config {
    /// The sharing of an extension enabled without saying.
    pub fn default_sharing(&self) -> Sharing {
        if self.shared_extension {
            Sharing::Shared
        } else {
            Sharing::Private
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            max_memory: DEFAULT_MAX_MEMORY,
            direct_io: true,
            readahead: true,
            data_device: None,
            checkpoint_interval: CHECKPOINT_INTERVAL,
            shared_extension: true,
            write_behind: true,
            large_pages: true,
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

pub fn check_page_size(page_size: usize) -> crate::error::Result<()> {
    if page_size.is_power_of_two() && (MIN_PAGE_SIZE..=MAX_PAGE_SIZE).contains(&page_size) {
        Ok(())
    } else {
        Err(crate::error::Error::BadPageSize(page_size))
    }
}
