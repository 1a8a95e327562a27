//! Pause points: named places between a read of state that other processes share and what
//! depends on what was read (a write of ours, or SQLite's own next read). A test stops the
//! process there, lets another process commit or checkpoint, and resumes it, to show that what
//! follows rechecks what was read (or is not done at all).
//!
//! Armed from the environment: `BPE_PAUSE_AT=name[,name...]` makes the process stop itself
//! (`SIGSTOP`, as a debugger would) each time it reaches a named point; the test sees the stop
//! (`waitpid` with `WUNTRACED`), does its work and sends `SIGCONT`. In-process tests can set a
//! hook instead (`set_hook`). Unarmed, a point costs one relaxed atomic load.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Mutex, OnceLock};

/// A LiteFS replica's wal-index header was seen lost (its position moved, its header did not):
/// the header copy is read, the WAL write lock not yet asked for.
pub const LOST_HEADER_SEEN: &str = "lost_header_seen";
/// The same, with the WAL write lock held and the header rechecked, before it is written.
pub const LOST_HEADER_LOCKED: &str = "lost_header_locked";

/// A WAL read transaction's read mark is locked and bpe looked at the wal-index
/// (`begin_wal`); SQLite has not yet read nBackfill, which says which pages it reads from the
/// file. Another process's checkpoint here writes pages that this transaction reads there.
pub const WAL_READ_MARK_LOCKED: &str = "wal_read_mark_locked";

/// Every point there is, for the environment's names to be checked against.
pub const POINTS: [&str; 3] = [LOST_HEADER_SEEN, LOST_HEADER_LOCKED, WAL_READ_MARK_LOCKED];

const UNKNOWN: u8 = 0;
const UNARMED: u8 = 1;
const ARMED: u8 = 2;

static STATE: AtomicU8 = AtomicU8::new(UNKNOWN);
static NAMES: OnceLock<Vec<String>> = OnceLock::new();
type Hook = Box<dyn Fn(&str) + Send + Sync>;
static HOOK: Mutex<Option<Hook>> = Mutex::new(None);

/// Reaching the point `name`: pauses here if a test armed it.
#[inline]
pub fn point(name: &'static str) {
    debug_assert!(
        POINTS.contains(&name),
        "pause point {name} is not listed in POINTS"
    );
    if STATE.load(Ordering::Relaxed) == UNARMED {
        return;
    }
    reached(name);
}

#[cold]
fn reached(name: &'static str) {
    let names = NAMES.get_or_init(|| {
        let names: Vec<String> = std::env::var("BPE_PAUSE_AT")
            .unwrap_or_default()
            .split(',')
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .map(str::to_owned)
            .collect();
        for n in &names {
            if !POINTS.contains(&n.as_str()) {
                log::warn!(
                    "BPE_PAUSE_AT names {n:?}, which is no pause point (there are: {})",
                    POINTS.join(", ")
                );
            }
        }
        names
    });
    let hook = HOOK.lock().unwrap_or_else(|e| e.into_inner());
    if names.is_empty() && hook.is_none() {
        STATE.store(UNARMED, Ordering::Relaxed);
        return;
    }
    STATE.store(ARMED, Ordering::Relaxed);
    if let Some(hook) = hook.as_ref() {
        hook(name);
    }
    drop(hook);
    if names.iter().any(|n| n == name) {
        // SAFETY: raise has no memory preconditions; SIGSTOP stops the whole process until a
        // SIGCONT, which is the point of it.
        unsafe { libc::raise(libc::SIGSTOP) };
    }
}

/// Calls `hook` with the name of every point reached from now on (None: no more), for tests in
/// one process: the hook may block the thread that reached the point.
pub fn set_hook(hook: Option<Hook>) {
    let armed = hook.is_some();
    *HOOK.lock().unwrap_or_else(|e| e.into_inner()) = hook;
    if armed {
        STATE.store(ARMED, Ordering::Relaxed);
    } else {
        STATE.store(UNKNOWN, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn a_hook_sees_each_point_reached_and_none_after_it_is_removed() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        set_hook(Some(Box::new(move |n| {
            log.lock().unwrap().push(n.to_owned())
        })));
        point(LOST_HEADER_SEEN);
        point(LOST_HEADER_LOCKED);
        set_hook(None);
        point(LOST_HEADER_SEEN);
        assert_eq!(
            *seen.lock().unwrap(),
            vec![LOST_HEADER_SEEN.to_owned(), LOST_HEADER_LOCKED.to_owned()]
        );
    }
}
