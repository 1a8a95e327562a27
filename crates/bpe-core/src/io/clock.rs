//! A millisecond clock for the hit path. Every L1 hit stamps its frame's last access; the
//! precise monotonic clock (`Instant`) costs a vDSO call there, a share of a cached lookup's
//! time that shows under perf. The coarse clock reads the kernel's tick (1-10 ms resolution)
//! for far less, and last-access times are in milliseconds anyway.

/// Milliseconds since the clock was made, from the kernel's coarse monotonic clock.
#[derive(Clone, Copy, Debug)]
pub struct CoarseClock {
    start_ms: u64,
}

impl CoarseClock {
    pub fn start() -> Self {
        CoarseClock {
            start_ms: coarse_monotonic_ms(),
        }
    }

    pub fn now_ms(&self) -> u64 {
        coarse_monotonic_ms().saturating_sub(self.start_ms)
    }
}

/// Nanoseconds of the kernel's precise monotonic clock (`Instant`'s), as a plain number: a
/// read transaction compares it with a deadline, where `Instant::elapsed` costs about 80
/// instructions more (its checked subtraction and `Duration`).
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: as in coarse_monotonic_ms, with CLOCK_MONOTONIC.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn coarse_monotonic_ms() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC_COARSE exists on every Linux
    // this builds for (2.6.32+), so the call cannot fail and only writes `ts`.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
    ts.tv_sec as u64 * 1000 + ts.tv_nsec as u64 / 1_000_000
}

#[cfg(test)]
mod tests {
    use super::CoarseClock;
    use std::time::Duration;

    #[test]
    fn coarse_clock_advances_with_time() {
        let clock = CoarseClock::start();
        let before = clock.now_ms();
        std::thread::sleep(Duration::from_millis(30));
        let after = clock.now_ms();
        // A reading lags by at most one tick (10 ms at HZ = 100): 30 ms of sleep moves it by
        // at least 20.
        assert!(after >= before + 20, "{before} -> {after}");
    }
}
