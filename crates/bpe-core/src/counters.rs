//! Buffer Manager counters, named and meant as SQL Server's where they apply.
//!
//! "/sec" counters are cumulative counts, as sys.dm_os_performance_counters reports them; a monitor
//! takes differences. Gauges are read at snapshot time from the tiers.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};

/// SQL Server's cntr_type values, so monitoring queries written for it read ours unchanged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CounterKind {
    /// PERF_COUNTER_LARGE_RAWCOUNT (65792): a current value.
    Gauge,
    /// PERF_COUNTER_BULK_COUNT (272696576): a cumulative count; rate = difference / seconds.
    Cumulative,
    /// PERF_LARGE_RAW_FRACTION (537003264): numerator of a ratio.
    Fraction,
    /// PERF_LARGE_RAW_BASE (1073939712): denominator of the ratio or average above it.
    Base,
    /// PERF_AVERAGE_BULK (1073874176): a cumulative sum; average = difference / the base's.
    Average,
}

impl CounterKind {
    pub fn cntr_type(self) -> i64 {
        match self {
            CounterKind::Gauge => 65792,
            CounterKind::Cumulative => 272696576,
            CounterKind::Fraction => 537003264,
            CounterKind::Base => 1073939712,
            CounterKind::Average => 1073874176,
        }
    }
}

/// A counter bumped on the hit path by every thread: split over cache lines so that threads do
/// not fight over one line, summed when read.
#[derive(Default)]
pub struct StripedCounter {
    stripes: [Padded; STRIPES],
}

const STRIPES: usize = 16;

#[derive(Default)]
#[repr(align(128))]
struct Padded(AtomicU64);

thread_local! {
    static STRIPE: usize = {
        use std::hash::{BuildHasher, RandomState};
        RandomState::new().hash_one(std::thread::current().id()) as usize % STRIPES
    };
}

impl StripedCounter {
    pub fn bump(&self) {
        let i = STRIPE.with(|s| *s);
        self.stripes[i].0.fetch_add(1, Relaxed);
    }
    pub fn get(&self) -> u64 {
        self.stripes.iter().map(|p| p.0.load(Relaxed)).sum()
    }
}

/// A latency histogram beside the counters (for the monitor): counts in buckets of powers of
/// two nanoseconds (bucket `i` holds durations in [2^i, 2^(i+1)) ns; bucket 0 also below), lock
/// free. Cumulative, as the "/sec" counters are: a monitor takes the difference of two
/// snapshots for an interval's distribution.
pub struct Histogram {
    buckets: [AtomicU64; HISTOGRAM_BUCKETS],
}

/// Up to 2^40 ns (18 minutes); longer lands in the last bucket.
pub const HISTOGRAM_BUCKETS: usize = 40;

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

impl Histogram {
    pub fn record(&self, took: std::time::Duration) {
        let ns = (took.as_nanos() as u64).max(1);
        let i = (63 - ns.leading_zeros() as usize).min(HISTOGRAM_BUCKETS - 1);
        self.buckets[i].fetch_add(1, Relaxed);
    }

    pub fn snapshot(&self, name: &str) -> HistogramSnapshot {
        HistogramSnapshot {
            name: name.to_string(),
            buckets: self.buckets.iter().map(|b| b.load(Relaxed)).collect(),
        }
    }
}

/// A histogram's counts at one moment, by bucket (see [`Histogram`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HistogramSnapshot {
    pub name: String,
    pub buckets: Vec<u64>,
}

impl HistogramSnapshot {
    pub fn count(&self) -> u64 {
        self.buckets.iter().sum()
    }

    /// What was recorded after `earlier` (a snapshot of the same histogram).
    pub fn since(&self, earlier: &HistogramSnapshot) -> HistogramSnapshot {
        HistogramSnapshot {
            name: self.name.clone(),
            buckets: self
                .buckets
                .iter()
                .enumerate()
                .map(|(i, &b)| b.saturating_sub(earlier.buckets.get(i).copied().unwrap_or(0)))
                .collect(),
        }
    }

    /// The upper bound, in nanoseconds, of the bucket that holds quantile `q` (0..=1); None if
    /// nothing was recorded. Within a factor of two of the true value, by construction.
    pub fn quantile_ns(&self, q: f64) -> Option<u64> {
        let total = self.count();
        if total == 0 {
            return None;
        }
        let rank = ((q.clamp(0.0, 1.0) * total as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, &b) in self.buckets.iter().enumerate() {
            seen += b;
            if seen >= rank {
                return Some(1u64 << (i + 1));
            }
        }
        Some(1u64 << self.buckets.len())
    }
}

/// Event counts, bumped on the I/O paths.
#[derive(Default)]
pub struct Counters {
    pub page_lookups: StripedCounter,
    pub l1_hits: StripedCounter,
    /// Misses of a snapshot served from an earlier snapshot's cached copy (`lineage.rs`).
    pub pages_carried: AtomicU64,
    pub page_reads: AtomicU64,
    pub page_writes: AtomicU64,
    /// Page writes held in L1 until their writer wrote them back (`engine/write_behind.rs`).
    pub pages_written_behind: AtomicU64,
    pub readahead_pages: AtomicU64,
    pub lazy_writes: AtomicU64,
    pub ext_page_reads: AtomicU64,
    /// Of those, pages another process loaded (a shared extension).
    pub ext_shared_page_reads: AtomicU64,
    pub ext_page_writes: AtomicU64,
    pub ext_page_evictions: AtomicU64,
    pub ext_checksum_failures: AtomicU64,
    pub ext_io_errors: AtomicU64,
    pub ext_bytes_written: AtomicU64,
    pub ext_sequential_write_pages: AtomicU64,
    pub ext_admissions_dropped: AtomicU64,
    pub ext_outstanding_io: AtomicI64,
    /// Index checkpoints written, and pages a restart took over from one or had to drop.
    pub ext_checkpoints: AtomicU64,
    pub ext_pages_restored: AtomicU64,
    pub ext_pages_not_restored: AtomicU64,
    /// Restored pages read back into RAM because they were in the previous process's RAM.
    pub ext_pages_prewarmed: AtomicU64,
    /// Read requests to the extension file and the microseconds they took, the request alone
    /// (the device and the syscall, as a QD1 reference measures them): what an L2 hit costs
    /// beyond them is the engine's.
    pub ext_read_requests: AtomicU64,
    pub ext_read_micros: AtomicU64,
    /// The same requests' times, as a distribution.
    pub ext_read_latency: Histogram,
    /// The same for read requests to the data files (a readahead window is one request).
    pub page_read_requests: AtomicU64,
    pub page_read_micros: AtomicU64,
    /// Times every cached page of a file was dropped because the file changed under us.
    pub file_invalidations: AtomicU64,
    /// Pages dropped one by one because another process changed them (WAL checkpoints).
    pub pages_forgotten: AtomicU64,
    /// Moving average, in milliseconds, of how long evicted L1 pages had been resident.
    pub l1_residence_ms: AtomicU64,
    /// Moving average, in milliseconds, of how long evicted L2 pages had gone unreferenced.
    pub ext_unreferenced_ms: AtomicU64,
}

impl Counters {
    pub fn bump(c: &AtomicU64) {
        c.fetch_add(1, Relaxed);
    }

    pub fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Relaxed);
    }

    /// Folds one sample into a moving average (weight 1/16), lock-free and approximate.
    pub fn average_in(avg: &AtomicU64, sample_ms: u64) {
        let old = avg.load(Relaxed);
        let new = if old == 0 {
            sample_ms
        } else {
            (old * 15 + sample_ms) / 16
        };
        avg.store(new, Relaxed);
    }
}

/// Gauges read from the tiers at snapshot time.
#[derive(Clone, Debug, Default)]
pub struct Gauges {
    pub database_pages: u64,
    pub target_pages: u64,
    pub free_pages: u64,
    pub memory_bytes: u64,
    pub max_memory: u64,
    pub uptime_ms: u64,
    pub ext_allocated_pages: u64,
    /// Free bytes of the extension in 4 KiB units (pages of any size share it).
    pub ext_free_pages: u64,
    pub ext_in_use_percent: u64,
    pub ext_index_bytes: u64,
    /// Processes sharing the extension, this one included (0: not shared).
    pub ext_shared_processes: u64,
    /// RAM the shared index takes, once for all the processes that share it.
    pub ext_shared_index_bytes: u64,
    /// Times a participant found the shared index's lock left by a dead holder and emptied the
    /// index (since the shared memory was made).
    pub ext_shared_recoveries: u64,
    /// Times this process's bounded wait for the shared index's lock gave up (its holder was
    /// stopped or descheduled): a miss, or an invalidation whose removal waited.
    pub ext_shared_lock_timeouts: u64,
    pub buffered_data_files: u64,
}

/// One counter as sys.dm_os_performance_counters shows it.
#[derive(Clone, Debug, PartialEq)]
pub struct CounterRow {
    pub name: &'static str,
    pub value: i64,
    pub kind: CounterKind,
}

/// A consistent-enough copy of every counter at one moment.
#[derive(Clone, Debug, Default)]
pub struct CounterSnapshot {
    pub page_lookups: u64,
    pub l1_hits: u64,
    pub pages_carried: u64,
    pub page_reads: u64,
    pub page_writes: u64,
    pub pages_written_behind: u64,
    pub readahead_pages: u64,
    pub lazy_writes: u64,
    pub page_life_expectancy_s: u64,
    pub database_pages: u64,
    pub target_pages: u64,
    pub free_pages: u64,
    pub memory_bytes: u64,
    pub max_memory: u64,
    pub ext_allocated_pages: u64,
    pub ext_free_pages: u64,
    pub ext_in_use_percent: u64,
    pub ext_outstanding_io: i64,
    pub ext_read_requests: u64,
    pub ext_read_micros: u64,
    pub page_read_requests: u64,
    pub page_read_micros: u64,
    pub ext_page_evictions: u64,
    pub ext_page_reads: u64,
    pub ext_shared_page_reads: u64,
    pub ext_page_writes: u64,
    pub ext_unreferenced_s: u64,
    pub ext_checksum_failures: u64,
    pub ext_io_errors: u64,
    pub ext_index_bytes: u64,
    pub ext_shared_processes: u64,
    pub ext_shared_index_bytes: u64,
    pub ext_shared_recoveries: u64,
    pub ext_shared_lock_timeouts: u64,
    pub ext_bytes_written: u64,
    pub ext_sequential_write_percent: u64,
    pub ext_admissions_dropped: u64,
    pub ext_checkpoints: u64,
    pub ext_pages_restored: u64,
    pub ext_pages_not_restored: u64,
    pub ext_pages_prewarmed: u64,
    /// Open data files the file system would not let us read with O_DIRECT.
    pub buffered_data_files: u64,
    pub file_invalidations: u64,
    pub pages_forgotten: u64,
}

impl CounterSnapshot {
    pub fn take(c: &Counters, g: &Gauges) -> Self {
        let l = |a: &AtomicU64| a.load(Relaxed);
        let residence = l(&c.l1_residence_ms);
        let ext_writes = l(&c.ext_page_writes);
        CounterSnapshot {
            page_lookups: c.page_lookups.get(),
            l1_hits: c.l1_hits.get(),
            pages_carried: l(&c.pages_carried),
            page_reads: l(&c.page_reads),
            page_writes: l(&c.page_writes),
            pages_written_behind: l(&c.pages_written_behind),
            readahead_pages: l(&c.readahead_pages),
            lazy_writes: l(&c.lazy_writes),
            // Until something is evicted, pages have lived as long as the pool.
            page_life_expectancy_s: if residence == 0 {
                g.uptime_ms
            } else {
                residence
            } / 1000,
            database_pages: g.database_pages,
            target_pages: g.target_pages,
            free_pages: g.free_pages,
            memory_bytes: g.memory_bytes,
            max_memory: g.max_memory,
            ext_allocated_pages: g.ext_allocated_pages,
            ext_free_pages: g.ext_free_pages,
            ext_in_use_percent: g.ext_in_use_percent,
            ext_outstanding_io: c.ext_outstanding_io.load(Relaxed),
            ext_read_requests: l(&c.ext_read_requests),
            ext_read_micros: l(&c.ext_read_micros),
            page_read_requests: l(&c.page_read_requests),
            page_read_micros: l(&c.page_read_micros),
            ext_page_evictions: l(&c.ext_page_evictions),
            ext_page_reads: l(&c.ext_page_reads),
            ext_shared_page_reads: l(&c.ext_shared_page_reads),
            ext_page_writes: ext_writes,
            ext_unreferenced_s: l(&c.ext_unreferenced_ms) / 1000,
            ext_checksum_failures: l(&c.ext_checksum_failures),
            ext_io_errors: l(&c.ext_io_errors),
            ext_index_bytes: g.ext_index_bytes,
            ext_shared_processes: g.ext_shared_processes,
            ext_shared_index_bytes: g.ext_shared_index_bytes,
            ext_shared_recoveries: g.ext_shared_recoveries,
            ext_shared_lock_timeouts: g.ext_shared_lock_timeouts,
            ext_bytes_written: l(&c.ext_bytes_written),
            ext_sequential_write_percent: (l(&c.ext_sequential_write_pages) * 100)
                .checked_div(ext_writes)
                .unwrap_or(100),
            ext_admissions_dropped: l(&c.ext_admissions_dropped),
            ext_checkpoints: l(&c.ext_checkpoints),
            ext_pages_restored: l(&c.ext_pages_restored),
            ext_pages_not_restored: l(&c.ext_pages_not_restored),
            ext_pages_prewarmed: l(&c.ext_pages_prewarmed),
            buffered_data_files: g.buffered_data_files,
            file_invalidations: l(&c.file_invalidations),
            pages_forgotten: l(&c.pages_forgotten),
        }
    }

    /// L1 hits over lookups, in percent (what perfmon shows for Buffer cache hit ratio).
    pub fn hit_ratio_percent(&self) -> f64 {
        if self.page_lookups == 0 {
            100.0
        } else {
            self.l1_hits as f64 * 100.0 / self.page_lookups as f64
        }
    }

    /// Every counter under SQL Server's name (ours after theirs), as the DMV lists them.
    pub fn rows(&self) -> Vec<CounterRow> {
        use CounterKind::*;
        let r = |name, value: u64, kind| CounterRow {
            name,
            value: value as i64,
            kind,
        };
        vec![
            r("Buffer cache hit ratio", self.l1_hits, Fraction),
            r("Buffer cache hit ratio base", self.page_lookups, Base),
            r("Page lookups/sec", self.page_lookups, Cumulative),
            r("Page reads/sec", self.page_reads, Cumulative),
            r(
                "Pages carried across snapshots/sec",
                self.pages_carried,
                Cumulative,
            ),
            r("Page avg read time (us)", self.page_read_micros, Average),
            r(
                "Page avg read time (us) base",
                self.page_read_requests,
                Base,
            ),
            r("Page writes/sec", self.page_writes, Cumulative),
            r(
                "Write-behind pages/sec",
                self.pages_written_behind,
                Cumulative,
            ),
            r("Readahead pages/sec", self.readahead_pages, Cumulative),
            r("Lazy writes/sec", self.lazy_writes, Cumulative),
            r("Page life expectancy", self.page_life_expectancy_s, Gauge),
            r("Database pages", self.database_pages, Gauge),
            r("Target pages", self.target_pages, Gauge),
            r("Free pages", self.free_pages, Gauge),
            r("Extension allocated pages", self.ext_allocated_pages, Gauge),
            r("Extension free pages", self.ext_free_pages, Gauge),
            r(
                "Extension in use as percentage",
                self.ext_in_use_percent,
                Gauge,
            ),
            CounterRow {
                name: "Extension outstanding IO counter",
                value: self.ext_outstanding_io,
                kind: Gauge,
            },
            r(
                "Extension page evictions/sec",
                self.ext_page_evictions,
                Cumulative,
            ),
            r("Extension page reads/sec", self.ext_page_reads, Cumulative),
            r(
                "Extension page reads of other processes' pages/sec",
                self.ext_shared_page_reads,
                Cumulative,
            ),
            r(
                "Extension avg read time (us)",
                self.ext_read_micros,
                Average,
            ),
            r(
                "Extension avg read time (us) base",
                self.ext_read_requests,
                Base,
            ),
            r(
                "Extension page writes/sec",
                self.ext_page_writes,
                Cumulative,
            ),
            r(
                "Extension page unreferenced time",
                self.ext_unreferenced_s,
                Gauge,
            ),
            r(
                "Extension page checksum failures",
                self.ext_checksum_failures,
                Cumulative,
            ),
            r("Extension I/O errors", self.ext_io_errors, Cumulative),
            r("Extension index bytes", self.ext_index_bytes, Gauge),
            r(
                "Extension shared processes",
                self.ext_shared_processes,
                Gauge,
            ),
            r(
                "Extension shared index bytes",
                self.ext_shared_index_bytes,
                Gauge,
            ),
            r(
                "Extension shared recoveries",
                self.ext_shared_recoveries,
                Gauge,
            ),
            r(
                "Extension shared lock timeouts",
                self.ext_shared_lock_timeouts,
                Cumulative,
            ),
            r(
                "Extension bytes written",
                self.ext_bytes_written,
                Cumulative,
            ),
            r(
                "Extension sequential write percentage",
                self.ext_sequential_write_percent,
                Gauge,
            ),
            r(
                "Extension admissions dropped",
                self.ext_admissions_dropped,
                Cumulative,
            ),
            r("Extension checkpoints", self.ext_checkpoints, Cumulative),
            r(
                "Extension pages restored",
                self.ext_pages_restored,
                Cumulative,
            ),
            r(
                "Extension pages not restored",
                self.ext_pages_not_restored,
                Cumulative,
            ),
            r(
                "Extension pages prewarmed",
                self.ext_pages_prewarmed,
                Cumulative,
            ),
            r("Memory used bytes", self.memory_bytes, Gauge),
            r("Max server memory bytes", self.max_memory, Gauge),
            r(
                "Data files without O_DIRECT",
                self.buffered_data_files,
                Gauge,
            ),
            r(
                "File cache invalidations",
                self.file_invalidations,
                Cumulative,
            ),
            r(
                "Pages invalidated by other processes",
                self.pages_forgotten,
                Cumulative,
            ),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::{Histogram, HistogramSnapshot};
    use std::time::Duration;

    #[test]
    fn a_histogram_places_durations_in_powers_of_two_and_answers_quantiles_within_them() {
        let h = Histogram::default();
        for _ in 0..90 {
            h.record(Duration::from_micros(20)); // 20,000 ns: bucket [16384, 32768)
        }
        for _ in 0..10 {
            h.record(Duration::from_millis(3)); // 3,000,000 ns: [2^21, 2^22)
        }
        let before = h.snapshot("t");
        assert_eq!(before.count(), 100);
        assert_eq!(before.quantile_ns(0.5), Some(32768));
        assert_eq!(before.quantile_ns(0.9), Some(32768));
        assert_eq!(before.quantile_ns(0.99), Some(1 << 22));
        h.record(Duration::from_nanos(0));
        let interval = h.snapshot("t").since(&before);
        assert_eq!(interval.count(), 1);
        assert_eq!(
            interval.quantile_ns(0.5),
            Some(2),
            "below 1 ns counts in the first bucket"
        );
        let empty = HistogramSnapshot {
            name: "t".into(),
            buckets: vec![0; 40],
        };
        assert_eq!(empty.quantile_ns(0.5), None);
    }
}
