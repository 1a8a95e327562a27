//! The process-wide engine, and what happens to it across fork().
//!
//! A forked child has only the thread that called fork(): every lock another thread of the
//! parent held stays held forever, and the parent's extension writer does not exist. So the child
//! never touches the parent's engine. At fork, a child handler (async-signal-safe: atomics and
//! close()) bumps the engine generation and closes the child's copy of the extension file's
//! descriptor (an open-file-description lock on it marks the file as a live process's). The
//! next use in the child creates a fresh engine from the same configuration; the parent's is
//! leaked, never dropped (dropping it would wait for its writer). Connections inherited from the
//! parent move to the new engine at their next call (`vfs::file`).
//!
//! At exit, the extension writes a last checkpoint of its index and its file stays, for the next
//! process to start warm from (`OFF` deletes it); only the process that created the engine does
//! this: a child that exits never touches its parent's file.

use crate::env_config::EnvConfig;
use bpe_core::{published, Engine};
use std::any::Any;
use std::cell::{RefCell, UnsafeCell};
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Once, OnceLock};

/// A spin lock that a fork handler can release with a store (see the module comment). Held only
/// for a few instructions, rarely (opens, operator statements), so spinning is cheap.
struct ForkSafeLock<T> {
    locked: AtomicBool,
    value: UnsafeCell<T>,
}

// SAFETY: the value is only reached through a guard, which one thread holds at a time.
unsafe impl<T: Send> Sync for ForkSafeLock<T> {}

struct Guard<'a, T>(&'a ForkSafeLock<T>);

impl<T> ForkSafeLock<T> {
    const fn new(value: T) -> Self {
        ForkSafeLock {
            locked: AtomicBool::new(false),
            value: UnsafeCell::new(value),
        }
    }

    fn try_lock(&self) -> Option<Guard<'_, T>> {
        self.locked
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .ok()
            .map(|_| Guard(self))
    }

    fn lock(&self) -> Guard<'_, T> {
        loop {
            if let Some(g) = self.try_lock() {
                return g;
            }
            std::thread::yield_now();
        }
    }

    /// Releases a lock whose guard was forgotten (the fork handlers).
    fn force_unlock(&self) {
        self.locked.store(false, Ordering::Release);
    }
}

impl<T> std::ops::Deref for Guard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: the guard holds the lock.
        unsafe { &*self.0.value.get() }
    }
}

impl<T> std::ops::DerefMut for Guard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: the guard holds the lock exclusively.
        unsafe { &mut *self.0.value.get() }
    }
}

impl<T> Drop for Guard<'_, T> {
    fn drop(&mut self) {
        self.0.force_unlock();
    }
}

/// The engine of the current generation, and the pid that created it.
static SLOT: ForkSafeLock<Option<(u64, i32, Arc<Engine>)>> = ForkSafeLock::new(None);
/// Bumped in every forked child.
static GENERATION: AtomicU64 = AtomicU64::new(0);
/// The extension file's descriptor of the engine at fork time (closed in the child).
static EXTENSION_FD: AtomicI32 = AtomicI32::new(-1);
/// A shared extension's participant lock descriptor at fork time (closed in the child).
static EXTENSION_LOCK_FD: AtomicI32 = AtomicI32::new(-1);
static CONFIG: OnceLock<EnvConfig> = OnceLock::new();
static HOOKS: Once = Once::new();
/// The threads inside a call into the base VFS that may take one of its own per-file mutexes
/// (see [`base_call`]), and [`FORKING`] while a fork waits for them to leave.
static BASE_CALLS: AtomicU64 = AtomicU64::new(0);
const FORKING: u64 = 1 << 63;

/// The generation engines are created in now (changes in a forked child).
#[inline]
pub fn generation() -> u64 {
    GENERATION.load(Ordering::Acquire)
}

/// Sets the configuration engines are created with (the first call wins).
pub fn configure(config: EnvConfig) {
    let _ = CONFIG.set(config);
}

fn pid() -> i32 {
    // SAFETY: getpid has no preconditions.
    unsafe { libc::getpid() }
}

/// The engine, created on first use (and anew in a forked child).
pub fn engine() -> Arc<Engine> {
    install_hooks();
    let mut slot = SLOT.lock();
    let gen = generation();
    if let Some((g, _, engine)) = slot.as_ref() {
        if *g == gen {
            return engine.clone();
        }
    }
    if let Some((_, _, old)) = slot.take() {
        // The parent's: never dropped in the child (see the module comment).
        std::mem::forget(old);
    }
    let config = CONFIG.get().cloned().unwrap_or_default();
    let engine = Engine::new(config.config.clone());
    config.apply(&engine);
    *slot = Some((gen, pid(), engine.clone()));
    start_publisher(&engine, gen);
    engine
}

/// How often the counters are published for `sqlite-bpe monitor`.
const PUBLISH_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// Publishes the engine's counters about once a second, off the query path, for other
/// processes of this user (`bpe_core::published`); stops with the engine, or for good if the
/// counters directory is not this user's alone (said through sqlite3_log, with why).
fn start_publisher(engine: &Arc<Engine>, gen: u64) {
    let engine = Arc::downgrade(engine);
    let _ = std::thread::Builder::new()
        .name("bpe-publisher".into())
        .spawn(move || {
            // What processes of this user that died without an exit (SIGKILL) left in
            // /dev/shm: their counters (the VFS sweeps its commit logs itself).
            published::remove_leftovers();
            publish_every_second(engine, gen)
        });
}

fn publish_every_second(engine: std::sync::Weak<Engine>, gen: u64) {
    loop {
        let Some(e) = engine.upgrade().filter(|_| generation() == gen) else {
            return;
        };
        let sample = published::Sample::now(
            &e.counters().rows(),
            e.extension_status().state.description(),
        )
        .with_histograms(e.histograms());
        drop(e);
        if let Err(e) = published::publish(&sample) {
            if e.kind() == std::io::ErrorKind::PermissionDenied {
                crate::api::log(
                    libsqlite3_sys::SQLITE_WARNING,
                    &format!("bpe: counters not published for sqlite-bpe monitor: {e}"),
                );
                return;
            }
        }
        std::thread::sleep(PUBLISH_EVERY);
    }
}

/// The engine if this generation has one already.
pub fn existing() -> Option<Arc<Engine>> {
    let slot = SLOT.lock();
    slot.as_ref()
        .filter(|(g, _, _)| *g == generation())
        .map(|(_, _, e)| e.clone())
}

fn install_hooks() {
    HOOKS.call_once(|| {
        // SAFETY: the handlers are extern "C", never unwind, and only lock, unlock and touch
        // atomics and descriptors.
        unsafe {
            libc::pthread_atfork(
                Some(before_fork),
                Some(after_fork_parent),
                Some(after_fork_child),
            );
            libc::atexit(at_exit);
        }
    });
}

/// A call into the base VFS that may take one of its per-file mutexes: the unix VFS's lock,
/// unlock, reserved-lock check, file control, close, open and shared-memory methods take the
/// file's inode mutex (`unixInodeInfo.pLockMutex`) or its shared-memory mutex around `fcntl`
/// calls. These mutexes are SQLite's, one per file, out of reach of a fork handler; a child that
/// opens the same file finds the same inode record, and its first lock waits forever for a
/// mutex a parent thread held at the fork. So a fork waits for the threads inside such a call
/// to leave it (`before_fork`), and no thread enters one until the fork is done. Held only
/// around the base VFS's own method: never nested, nothing else is taken under it.
pub struct BaseCall(());

#[inline]
pub fn base_call() -> BaseCall {
    loop {
        let now = BASE_CALLS.load(Ordering::Relaxed);
        if now & FORKING == 0
            && BASE_CALLS
                .compare_exchange_weak(now, now + 1, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
        {
            return BaseCall(());
        }
        if now & FORKING != 0 {
            std::thread::yield_now();
        }
    }
}

impl Drop for BaseCall {
    #[inline]
    fn drop(&mut self) {
        BASE_CALLS.fetch_sub(1, Ordering::Release);
    }
}

/// The process-wide locks a fork holds across `fork`, in order (`PROCESS_LOCKS` in lib.rs: the
/// crate root names them, so that this module needs none of their owners). Unset: none.
static PROCESS_LOCKS: OnceLock<&'static [(&'static str, HoldLock)]> = OnceLock::new();

/// Names the process-wide locks a fork holds (once; later calls change nothing).
pub fn set_process_locks(locks: &'static [(&'static str, HoldLock)]) {
    let _ = PROCESS_LOCKS.set(locks);
}

fn process_locks() -> &'static [(&'static str, HoldLock)] {
    PROCESS_LOCKS.get().copied().unwrap_or(&[])
}

/// Takes one of the process locks; the lock is held until the box is dropped.
pub type HoldLock = fn() -> Box<dyn Any>;

/// 1 + the index in the process locks of the lock a fork is waiting for, 0 if none.
static FORK_WAITS_FOR: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// The process locks the forking thread holds across its fork (from the prepare handler
    /// to the parent's or the child's).
    static HELD_ACROSS_FORK: RefCell<Vec<Box<dyn Any>>> = const { RefCell::new(Vec::new()) };
}

fn hold_process_locks() {
    for (i, (_, hold)) in process_locks().iter().enumerate() {
        FORK_WAITS_FOR.store(i + 1, Ordering::Release);
        let held = hold();
        HELD_ACROSS_FORK.with(|h| h.borrow_mut().push(held));
    }
    FORK_WAITS_FOR.store(0, Ordering::Release);
}

fn release_process_locks() {
    let held = HELD_ACROSS_FORK.with(|h| std::mem::take(&mut *h.borrow_mut()));
    drop(held);
}

/// Whether a fork is waiting for the lock `name` (one of the process locks, or "base calls":
/// calls into the base VFS's locking). Tests: a thread holding one lets it go when a fork waits
/// for it.
#[doc(hidden)]
pub fn fork_waits_for(name: &str) -> bool {
    if name == "base calls" {
        return BASE_CALLS.load(Ordering::Relaxed) & FORKING != 0;
    }
    let i = FORK_WAITS_FOR.load(Ordering::Acquire);
    i > 0 && process_locks()[i - 1].0 == name
}

/// Takes the process lock `name` (tests: a thread holding one while another forks).
#[doc(hidden)]
pub fn hold_process_lock(name: &str) -> Box<dyn Any> {
    let (_, hold) = process_locks()
        .iter()
        .find(|(n, _)| *n == name)
        .unwrap_or_else(|| panic!("no process lock named {name:?}"));
    hold()
}

/// Stops new calls into the base VFS's locking and waits (until the deadline) for those under
/// way to end.
fn hold_base_calls() {
    BASE_CALLS.fetch_or(FORKING, Ordering::AcqRel);
    let deadline = std::time::Instant::now() + MUTEX_DEADLINE;
    while BASE_CALLS.load(Ordering::Acquire) & !FORKING != 0 {
        if std::time::Instant::now() >= deadline {
            return; // forked anyway: as before this gate (a child may hang, as plain SQLite's)
        }
        std::thread::yield_now();
    }
}

/// SQLite's static mutexes held across a fork, in the order they are taken: SQLite nests its
/// allocator's innermost, so it comes last (`SQLITE_MUTEX_STATIC_*`: OPEN, PRNG, MAIN, VFS1-3,
/// LRU, PMEM, MEM).
const SQLITE_STATIC_MUTEXES: [i32; 9] = [4, 5, 2, 11, 12, 13, 6, 7, 3];
static HELD: [AtomicPtr<c_void>; 9] = [const { AtomicPtr::new(std::ptr::null_mut()) }; 9];
/// How long the prepare handler tries for SQLite's mutexes before forking without them.
const MUTEX_DEADLINE: std::time::Duration = std::time::Duration::from_secs(2);

/// Takes SQLite's static mutexes (try-lock, until the deadline); on failure none is held.
fn hold_sqlite_mutexes() {
    let deadline = std::time::Instant::now() + MUTEX_DEADLINE;
    for (i, &id) in SQLITE_STATIC_MUTEXES.iter().enumerate() {
        let m = crate::api::static_mutex::get(id);
        if m.is_null() {
            continue;
        }
        // SAFETY: a static mutex of the SQLite we serve.
        while !unsafe { crate::api::static_mutex::try_enter(m) } {
            if std::time::Instant::now() >= deadline {
                release_sqlite_mutexes();
                return;
            }
            std::thread::yield_now();
        }
        HELD[i].store(m, Ordering::Relaxed);
    }
}

fn release_sqlite_mutexes() {
    for held in HELD.iter().rev() {
        let m = held.swap(std::ptr::null_mut(), Ordering::Relaxed);
        if !m.is_null() {
            // SAFETY: entered by hold_sqlite_mutexes on this thread (in a child: the thread that
            // forked, its only one).
            unsafe { crate::api::static_mutex::leave(m) };
        }
    }
}

extern "C" fn before_fork() {
    // Held across fork, so that no other thread holds them at that moment; the child then
    // starts with them free (released in both handlers below).
    let slot = SLOT.lock();
    let fds = slot
        .as_ref()
        .map_or([-1, -1], |(_, _, e)| e.extension_raw_fds());
    EXTENSION_FD.store(fds[0], Ordering::Relaxed);
    EXTENSION_LOCK_FD.store(fds[1], Ordering::Relaxed);
    std::mem::forget(slot);
    hold_process_locks();
    // Before SQLite's mutexes: a thread inside a base call may be waiting for one of them.
    hold_base_calls();
    hold_sqlite_mutexes();
}

extern "C" fn after_fork_parent() {
    release_sqlite_mutexes();
    BASE_CALLS.fetch_and(!FORKING, Ordering::AcqRel);
    release_process_locks();
    SLOT.force_unlock();
}

extern "C" fn after_fork_child() {
    release_sqlite_mutexes();
    // The threads that were inside a base call (if the wait gave up) do not exist here.
    BASE_CALLS.store(0, Ordering::Release);
    release_process_locks();
    GENERATION.fetch_add(1, Ordering::AcqRel);
    for fd in [
        EXTENSION_FD.swap(-1, Ordering::Relaxed),
        EXTENSION_LOCK_FD.swap(-1, Ordering::Relaxed),
    ] {
        if fd >= 0 {
            // SAFETY: the child's copy of one of the parent's extension descriptors; nothing
            // in the child uses it (the parent's engine is never touched again here).
            unsafe { libc::close(fd) };
        }
    }
    SLOT.force_unlock();
}

/// At exit: the pages still written behind go to their files (see `Engine::write_back_at_exit`),
/// then the extension's last checkpoint.
extern "C" fn at_exit() {
    let Some(slot) = SLOT.try_lock() else {
        return;
    };
    if let Some((gen, creator, engine)) = slot.as_ref() {
        if *gen == generation() && *creator == pid() {
            engine.write_back_at_exit();
            engine.close_extension_at_exit();
        }
    }
    if slot.is_some() {
        published::unpublish(pid());
    }
}
