//! In-process emulation of a slow device, for benchmarks and tests on a machine whose only disk is
//! fast. Every result produced with it must say so (and which model it used).
//!
//! The model (see [`DeviceEmulation`]) is computed by [`Schedule`], a pure function of the
//! device's state and the time a request is issued, so that it can be tested without a clock;
//! [`Emulator`] runs it against the real clock and sleeps until the request's completion.

use crate::config::DeviceEmulation;
use crate::sync::{Mutex, Rank};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

/// One request to the emulated device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceOp {
    /// A read of this many bytes.
    Read(u64),
    /// A write of this many bytes.
    Write(u64),
    /// A flush of the device's write cache (fsync, fdatasync).
    Sync,
}

/// One direction's (reads' or writes') state, as offsets from the emulator's origin.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Lane {
    /// Earliest start of the next request (the IOPS cap: requests are at least 1/IOPS apart).
    next_slot: Duration,
    /// When the transfers already admitted are done (the bandwidth is shared, in order).
    transfer_free: Duration,
}

impl Lane {
    /// Admits a request of `bytes` issued at `now`; returns when it completes.
    fn admit(
        &mut self,
        now: Duration,
        bytes: u64,
        latency: Duration,
        bandwidth: u64,
        iops: u32,
    ) -> Duration {
        let start = if iops > 0 {
            let start = now.max(self.next_slot);
            self.next_slot = start + Duration::from_nanos(1_000_000_000 / iops as u64);
            start
        } else {
            now
        };
        let transfer = if bandwidth > 0 {
            let nanos = bytes as u128 * 1_000_000_000 / bandwidth as u128;
            Duration::from_nanos(nanos.min(u64::MAX as u128) as u64)
        } else {
            Duration::ZERO
        };
        // Transfers queue behind each other; latencies of parallel requests overlap.
        let transfer_start = start.max(self.transfer_free);
        self.transfer_free = transfer_start + transfer;
        self.transfer_free + latency
    }
}

/// The emulated device's state: when each direction is free again.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Schedule {
    read: Lane,
    write: Lane,
}

impl Schedule {
    /// When `op`, issued at `now` (time since the emulator's origin), completes on a device
    /// with costs `model`; records it in the device's state. Pure: no clock, no sleep.
    pub fn complete(&mut self, model: &DeviceEmulation, op: DeviceOp, now: Duration) -> Duration {
        match op {
            DeviceOp::Read(bytes) => self.read.admit(
                now,
                bytes,
                model.read_latency,
                model.read_bandwidth,
                model.read_iops,
            ),
            DeviceOp::Write(bytes) => self.write.admit(
                now,
                bytes,
                model.write_latency,
                model.write_bandwidth,
                model.write_iops,
            ),
            // The flush waits for the writes still being transferred.
            DeviceOp::Sync => now.max(self.write.transfer_free) + model.sync_latency,
        }
    }
}

pub struct Emulator {
    model: DeviceEmulation,
    origin: Instant,
    schedule: Mutex<Schedule>,
    charged: [AtomicU64; 5],
}

/// What an emulated device was charged so far (so that tests and reports can count it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceCharges {
    pub reads: u64,
    pub read_bytes: u64,
    pub writes: u64,
    pub written_bytes: u64,
    pub syncs: u64,
}

impl Emulator {
    pub fn new(model: DeviceEmulation) -> Self {
        Emulator {
            model,
            origin: Instant::now(),
            schedule: Mutex::new(Rank::Leaf, Schedule::default()),
            charged: Default::default(),
        }
    }

    /// The requests charged so far.
    pub fn charges(&self) -> DeviceCharges {
        let [reads, read_bytes, writes, written_bytes, syncs] =
            self.charged.each_ref().map(|c| c.load(Relaxed));
        DeviceCharges {
            reads,
            read_bytes,
            writes,
            written_bytes,
            syncs,
        }
    }

    /// Blocks the calling thread until `op` would complete on the emulated device (the caller
    /// then does the real I/O, which on a fast disk adds little).
    pub fn charge(&self, op: DeviceOp) {
        let (count, bytes) = match op {
            DeviceOp::Read(n) => (0, Some((1, n))),
            DeviceOp::Write(n) => (2, Some((3, n))),
            DeviceOp::Sync => (4, None),
        };
        self.charged[count].fetch_add(1, Relaxed);
        if let Some((at, n)) = bytes {
            self.charged[at].fetch_add(n, Relaxed);
        }
        let done = {
            let mut schedule = self.schedule.lock();
            // Read under the lock, so that requests enter the schedule in time order.
            let now = self.origin.elapsed();
            schedule.complete(&self.model, op, now)
        };
        let now = self.origin.elapsed();
        if done > now {
            std::thread::sleep(done - now);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn hdd() -> DeviceEmulation {
        DeviceEmulation {
            read_latency: 8 * MS,
            write_latency: 8 * MS,
            sync_latency: 5 * MS,
            read_bandwidth: 100_000_000,
            write_bandwidth: 50_000_000,
            read_iops: 100,
            write_iops: 50,
        }
    }

    fn at(ms: u64) -> Duration {
        Duration::from_millis(ms)
    }

    #[test]
    fn a_request_takes_latency_plus_size_over_bandwidth() {
        let model = DeviceEmulation {
            read_iops: 0,
            write_iops: 0,
            ..hdd()
        };
        let mut s = Schedule::default();
        // 1 MB at 100 MB/s: 10 ms of transfer after 8 ms of latency.
        assert_eq!(s.complete(&model, DeviceOp::Read(1_000_000), at(0)), at(18));
        // Writes at 50 MB/s: 20 ms of transfer, on their own lane (not behind the read).
        assert_eq!(
            s.complete(&model, DeviceOp::Write(1_000_000), at(0)),
            at(28)
        );
        // A 256 KiB request costs more than a 4 KiB one.
        let mut s = Schedule::default();
        let small = s.complete(&model, DeviceOp::Read(4096), at(1000));
        let mut s = Schedule::default();
        let large = s.complete(&model, DeviceOp::Read(256 << 10), at(1000));
        assert!(large - small >= Duration::from_secs_f64((252 << 10) as f64 / 1e8));
    }

    #[test]
    fn parallel_requests_share_the_bandwidth_and_overlap_their_latency() {
        let model = DeviceEmulation {
            read_iops: 0,
            ..hdd()
        };
        let mut s = Schedule::default();
        let done: Vec<_> = (0..4)
            .map(|_| s.complete(&model, DeviceOp::Read(1_000_000), at(0)))
            .collect();
        // Four 10 ms transfers back to back, each followed by the 8 ms latency: 40 MB/s would
        // be 4x the device's bandwidth, so the last one cannot finish before 4 x 10 ms.
        assert_eq!(done, vec![at(18), at(28), at(38), at(48)]);
    }

    #[test]
    fn the_iops_cap_spaces_requests_across_callers() {
        let model = DeviceEmulation {
            read_latency: Duration::ZERO,
            read_bandwidth: 0,
            ..hdd()
        };
        let mut s = Schedule::default();
        // 100 IOPS: 10 requests issued together complete 10 ms apart.
        let done: Vec<_> = (0..10)
            .map(|_| s.complete(&model, DeviceOp::Read(4096), at(0)))
            .collect();
        let expected: Vec<_> = (0..10).map(|i| at(10 * i)).collect();
        assert_eq!(done, expected);
        // An idle device does not bank unused slots: after a pause, one slot per 10 ms again.
        assert_eq!(s.complete(&model, DeviceOp::Read(4096), at(500)), at(500));
        assert_eq!(s.complete(&model, DeviceOp::Read(4096), at(500)), at(510));
        // Writes have their own cap (50 IOPS: 20 ms apart).
        let w1 = s.complete(&model, DeviceOp::Write(0), at(500));
        let w2 = s.complete(&model, DeviceOp::Write(0), at(500));
        assert_eq!(w2 - w1, at(20));
    }

    #[test]
    fn syncs_are_charged_and_wait_for_the_writes_in_flight() {
        let model = hdd();
        let mut s = Schedule::default();
        assert_eq!(s.complete(&model, DeviceOp::Sync, at(100)), at(105));
        // 1 MB at 50 MB/s is on the wire until 120 ms: the flush follows it.
        s.complete(&model, DeviceOp::Write(1_000_000), at(100));
        assert_eq!(s.complete(&model, DeviceOp::Sync, at(101)), at(125));
        // Reads do not delay a flush.
        s.complete(&model, DeviceOp::Read(10_000_000), at(200));
        assert_eq!(s.complete(&model, DeviceOp::Sync, at(200)), at(205));
    }

    #[test]
    fn a_free_model_charges_nothing() {
        let model = DeviceEmulation::default();
        let mut s = Schedule::default();
        for op in [
            DeviceOp::Read(1 << 20),
            DeviceOp::Write(1 << 20),
            DeviceOp::Sync,
        ] {
            assert_eq!(s.complete(&model, op, at(7)), at(7));
        }
    }

    #[test]
    fn the_model_validates_and_describes_itself() {
        assert_eq!(hdd().validate(), Ok(()));
        let slow_sync = DeviceEmulation {
            sync_latency: Duration::from_secs(2),
            ..hdd()
        };
        assert!(slow_sync.validate().unwrap_err().contains("sync latency"));
        let trickle = DeviceEmulation {
            write_bandwidth: 1000,
            ..hdd()
        };
        assert!(trickle.validate().unwrap_err().contains("write bandwidth"));
        assert_eq!(
            hdd().to_string(),
            "read 8000 us + 100 MB/s, at most 100 IOPS; write 8000 us + 50 MB/s, at most 50 IOPS; sync 5000 us"
        );
    }
}
