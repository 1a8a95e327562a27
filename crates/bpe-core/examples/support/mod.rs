//! What the cost examples share: the calling thread's CPU time, and a timed walk over pages.

use std::time::{Duration, Instant};

/// CPU time of the calling thread so far.
pub fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid timespec for the call to fill in.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// (wall µs, CPU µs) per call of `op` over the pages `page_at(i)`, i in `start..start + n`.
pub fn measure(
    n: u64,
    start: u64,
    page_at: impl Fn(u64) -> u64,
    mut op: impl FnMut(u64),
) -> (f64, f64) {
    let (t, c) = (Instant::now(), thread_cpu());
    for i in start..start + n {
        op(page_at(i));
    }
    let per = |d: Duration| d.as_secs_f64() * 1e6 / n as f64;
    (per(t.elapsed()), per(thread_cpu() - c))
}
