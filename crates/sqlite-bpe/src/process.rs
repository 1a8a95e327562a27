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
//! At exit, the extension file is deleted, by the process that created it only: a child that
//! exits never deletes its parent's file.

use crate::env_config::EnvConfig;
use bpe_core::Engine;
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, Once, OnceLock};

/// The engine of the current generation, and the pid that created it.
static SLOT: parking_lot::Mutex<Option<(u64, i32, Arc<Engine>)>> = parking_lot::Mutex::new(None);
/// Bumped in every forked child.
static GENERATION: AtomicU64 = AtomicU64::new(0);
/// The extension file's descriptor of the engine at fork time (closed in the child).
static EXTENSION_FD: AtomicI32 = AtomicI32::new(-1);
static CONFIG: OnceLock<EnvConfig> = OnceLock::new();
static HOOKS: Once = Once::new();

/// The generation engines are created in now (changes in a forked child).
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
    engine
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
        // atomics and one descriptor.
        unsafe {
            libc::pthread_atfork(
                Some(before_fork),
                Some(after_fork_parent),
                Some(after_fork_child),
            );
            libc::atexit(remove_extension_at_exit);
        }
    });
}

extern "C" fn before_fork() {
    // Held across fork, so that no other thread holds it at that moment; the child then
    // starts with it unlocked (released in both handlers below).
    let slot = SLOT.lock();
    let fd = slot.as_ref().map_or(-1, |(_, _, e)| e.extension_raw_fd());
    EXTENSION_FD.store(fd, Ordering::Relaxed);
    std::mem::forget(slot);
}

extern "C" fn after_fork_parent() {
    // SAFETY: locked by before_fork on this very thread, its guard forgotten.
    unsafe { SLOT.force_unlock() };
}

extern "C" fn after_fork_child() {
    GENERATION.fetch_add(1, Ordering::AcqRel);
    let fd = EXTENSION_FD.swap(-1, Ordering::Relaxed);
    if fd >= 0 {
        // SAFETY: the child's copy of the parent's extension descriptor; nothing in the child
        // uses it (the parent's engine is never touched again here).
        unsafe { libc::close(fd) };
    }
    // SAFETY: locked by before_fork in the parent on this thread, which is the child's only one.
    unsafe { SLOT.force_unlock() };
}

extern "C" fn remove_extension_at_exit() {
    crate::vfs::remove_peer_logs_at_exit();
    let Some(slot) = SLOT.try_lock() else {
        return;
    };
    if let Some((gen, creator, engine)) = slot.as_ref() {
        if *gen == generation() && *creator == pid() {
            engine.remove_extension_file_at_exit();
        }
    }
}
