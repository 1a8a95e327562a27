//! A thread that samples the engine's Buffer Manager counters every ~250 ms during a run, like
//! the perfmon charts in the published experiments.

use crate::db;
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Rates over one interval, and gauges at its end.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Sample {
    /// Seconds since the run started (end of the interval).
    pub t: f64,
    pub page_lookups_per_s: f64,
    pub page_reads_per_s: f64,
    pub readahead_pages_per_s: f64,
    pub ext_page_reads_per_s: f64,
    pub ext_page_writes_per_s: f64,
    /// L1 hits over lookups in this interval (100 when there were none).
    pub hit_ratio_percent: f64,
    /// Operations (lookups, transactions, queries) per second, as the workload counts them.
    pub ops_per_s: f64,
    pub database_pages: u64,
    pub ext_allocated_pages: u64,
    /// Files' caches dropped since the run started (another process changed them).
    #[serde(default)]
    pub file_invalidations: u64,
}

pub struct Sampler {
    stop: Arc<AtomicBool>,
    handle: std::thread::JoinHandle<Vec<Sample>>,
}

impl Sampler {
    /// Starts sampling; `ops` is the workload's own count of completed operations.
    pub fn start(interval: Duration, ops: Arc<AtomicU64>) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let handle = std::thread::spawn(move || {
            let start = Instant::now();
            let mut prev = (Instant::now(), db::snapshot(), ops.load(Relaxed));
            let invalidations0 = prev.1.file_invalidations;
            let mut out = Vec::new();
            loop {
                let done = flag.load(Relaxed);
                let now = Instant::now();
                let next = prev.0 + interval;
                if !done && now < next {
                    std::thread::sleep((next - now).min(Duration::from_millis(20)));
                    continue;
                }
                let snap = db::snapshot();
                let n = ops.load(Relaxed);
                let dt = now.duration_since(prev.0).as_secs_f64().max(1e-6);
                let rate = |a: u64, b: u64| a.saturating_sub(b) as f64 / dt;
                let lookups = snap.page_lookups.saturating_sub(prev.1.page_lookups);
                let hits = snap.l1_hits.saturating_sub(prev.1.l1_hits);
                out.push(Sample {
                    t: now.duration_since(start).as_secs_f64(),
                    page_lookups_per_s: lookups as f64 / dt,
                    page_reads_per_s: rate(snap.page_reads, prev.1.page_reads),
                    readahead_pages_per_s: rate(snap.readahead_pages, prev.1.readahead_pages),
                    ext_page_reads_per_s: rate(snap.ext_page_reads, prev.1.ext_page_reads),
                    ext_page_writes_per_s: rate(snap.ext_page_writes, prev.1.ext_page_writes),
                    hit_ratio_percent: if lookups == 0 {
                        100.0
                    } else {
                        hits as f64 * 100.0 / lookups as f64
                    },
                    ops_per_s: rate(n, prev.2),
                    database_pages: snap.database_pages,
                    ext_allocated_pages: snap.ext_allocated_pages,
                    file_invalidations: snap.file_invalidations.saturating_sub(invalidations0),
                });
                prev = (now, snap, n);
                if done {
                    return out;
                }
            }
        });
        Sampler { stop, handle }
    }

    pub fn finish(self) -> Vec<Sample> {
        self.stop.store(true, Relaxed);
        self.handle.join().unwrap_or_default()
    }
}
