//! SQLite's default busy handler, counted: a connection that finds the write lock taken sleeps
//! 1, 2, 5, 10, 15, 20, 25, 25, 25, 50, 50, then 100 ms at a time until its busy timeout is
//! spent (`sqliteDefaultBusyCallback` in SQLite's main.c), as with `busy_timeout`. The schedule
//! is the same; the handler also counts its waits and the milliseconds it slept, which SQLite's
//! own does not report, so the results can say what the lock cost without the writers' queue.
//!
//! One configuration runs per process, so process-wide counters are the configuration's.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// The busy timeout the terminals run with (the same as `db::open_with`'s).
pub const TIMEOUT_MS: u64 = 60_000;

const DELAYS_MS: [u64; 12] = [1, 2, 5, 10, 15, 20, 25, 25, 25, 50, 50, 100];

static WAITS: AtomicU64 = AtomicU64::new(0);
static SLEPT_MS: AtomicU64 = AtomicU64::new(0);

/// How long SQLite's default handler sleeps at its `count`-th call (from 0) for a lock still
/// taken, with `timeout_ms` in all; None once the timeout is spent (the statement then fails
/// with SQLITE_BUSY).
pub fn delay_ms(count: u64, timeout_ms: u64) -> Option<u64> {
    let last = DELAYS_MS.len() as u64 - 1;
    let before: u64 = match count.checked_sub(last) {
        None => DELAYS_MS[..count as usize].iter().sum(),
        Some(extra) => DELAYS_MS[..last as usize].iter().sum::<u64>() + DELAYS_MS[11] * extra,
    };
    let delay = DELAYS_MS[count.min(last) as usize];
    let delay = delay.min(timeout_ms.checked_sub(before)?);
    (delay > 0).then_some(delay)
}

/// The handler: sleeps as SQLite's default would, counting.
fn handler(count: i32) -> bool {
    match delay_ms(count.max(0) as u64, TIMEOUT_MS) {
        Some(ms) => {
            WAITS.fetch_add(1, Relaxed);
            SLEPT_MS.fetch_add(ms, Relaxed);
            std::thread::sleep(Duration::from_millis(ms));
            true
        }
        None => false,
    }
}

/// Gives `conn` the counted handler in place of its busy timeout.
pub fn install(conn: &rusqlite::Connection) -> rusqlite::Result<()> {
    conn.busy_handler(Some(handler))
}

/// Waits and milliseconds slept so far, by every connection of this process.
pub fn counts() -> (u64, u64) {
    (WAITS.load(Relaxed), SLEPT_MS.load(Relaxed))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn follows_sqlites_schedule() {
        let first: Vec<u64> = (0..14).map(|n| delay_ms(n, 60_000).unwrap()).collect();
        assert_eq!(
            first,
            [1, 2, 5, 10, 15, 20, 25, 25, 25, 50, 50, 100, 100, 100]
        );
    }

    #[test]
    fn stops_when_the_timeout_is_spent() {
        // 1 + 2 + 5 = 8 ms slept; 2 ms of a 10 ms timeout left, then none.
        assert_eq!(delay_ms(3, 10), Some(2));
        assert_eq!(delay_ms(4, 10), None);
        assert_eq!(delay_ms(0, 0), None);
        // 228 ms before the 12th call, then 100 ms each: the 600th call is past 60 s.
        let total: u64 = (0..).map_while(|n| delay_ms(n, 60_000)).sum();
        assert_eq!(total, 60_000);
    }

    #[test]
    fn handler_counts_its_waits() {
        let (waits, slept) = counts();
        assert!(handler(2));
        let (w, s) = counts();
        assert!(w > waits && s >= slept + 5);
    }
}
