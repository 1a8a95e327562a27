//! The process's id, without a system call each time it is asked.
//!
//! glibc's `getpid` is a system call on every call (it stopped caching the id in 2.25), and the
//! core asks on hot paths: every frame that leaves L1 checks it was not inherited by a forked
//! child (`pool::slab`), and so does every lock of a shared extension's tables. The id is read
//! once, and again in every forked child by a handler that `fork` runs in the child before it
//! returns there.

use std::sync::atomic::{
    AtomicU32, AtomicU8,
    Ordering::{AcqRel, Acquire, Relaxed, Release},
};

/// The id, once known (0: not yet cached in this process).
static PID: AtomicU32 = AtomicU32::new(0);
/// The fork handler: not registered, being registered, registered.
static HANDLER: AtomicU8 = AtomicU8::new(NONE);
const NONE: u8 = 0;
const REGISTERING: u8 = 1;
const REGISTERED: u8 = 2;

extern "C" fn in_forked_child() {
    PID.store(std::process::id(), Relaxed);
}

/// This process's id.
pub fn current() -> u32 {
    let known = PID.load(Relaxed);
    if known != 0 {
        return known;
    }
    let id = std::process::id();
    // The id is cached only once the handler is in place: a fork after that gives the child its
    // own id; a fork before it leaves the child at 0, and the child asks for itself. A child
    // never keeps its parent's id. (No `Once`: a fork while another thread is inside one would
    // leave the child's copy running forever.)
    match HANDLER.compare_exchange(NONE, REGISTERING, AcqRel, Acquire) {
        Ok(_) => {
            // SAFETY: pthread_atfork only records the handler; the handler makes one
            // async-signal-safe call (getpid) and one atomic store, as a child handler must.
            unsafe { libc::pthread_atfork(None, None, Some(in_forked_child)) };
            HANDLER.store(REGISTERED, Release);
            PID.store(id, Relaxed);
        }
        Err(REGISTERED) => PID.store(id, Relaxed),
        Err(_) => {} // another thread is registering it: not cached yet
    }
    id
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn is_the_process_id() {
        assert_eq!(current(), std::process::id());
        assert_eq!(current(), std::process::id(), "asked again");
    }

    /// A child forked after the id was known gets its own, not its parent's copy.
    #[test]
    fn a_forked_child_has_its_own_id() {
        let parent = current();
        // SAFETY: the child only reads two ids, compares them and exits at once (no allocation,
        // no lock another thread of the parent may have held).
        let child = unsafe { libc::fork() };
        assert!(child >= 0, "fork failed");
        if child == 0 {
            let ok = current() == std::process::id() && current() != parent;
            // SAFETY: ends the child at once, without running the test harness's exit handlers.
            unsafe { libc::_exit(if ok { 0 } else { 1 }) };
        }
        let mut status = 0;
        // SAFETY: waits for the child just forked, into a local.
        let waited = unsafe { libc::waitpid(child, &mut status, 0) };
        assert_eq!(waited, child);
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "the child saw its parent's id (status {status})"
        );
        assert_eq!(current(), parent, "the parent keeps its own");
    }
}
