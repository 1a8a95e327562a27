//! In-process emulation of a slow device (latency per request plus an IOPS cap), for benchmarks
//! and tests on a machine whose only disk is fast. Every result produced with it must say so.

use crate::config::DeviceEmulation;
use crate::sync::{Mutex, Rank};
use std::time::{Duration, Instant};

pub struct Emulator {
    model: DeviceEmulation,
    /// Earliest time the next request may start, for the IOPS cap.
    next_slot: Mutex<Instant>,
}

impl Emulator {
    pub fn new(model: DeviceEmulation) -> Self {
        Emulator {
            model,
            next_slot: Mutex::new(Rank::Leaf, Instant::now()),
        }
    }

    /// Blocks the calling thread as the device would before the request completes.
    pub fn before_io(&self) {
        let mut wait_until = Instant::now() + self.model.latency;
        if self.model.iops > 0 {
            let interval = Duration::from_secs_f64(1.0 / self.model.iops as f64);
            let mut next = self.next_slot.lock();
            let start = (*next).max(Instant::now());
            *next = start + interval;
            wait_until = wait_until.max(start + interval);
        }
        let now = Instant::now();
        if wait_until > now {
            std::thread::sleep(wait_until - now);
        }
    }
}
