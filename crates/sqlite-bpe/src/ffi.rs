//! Every entry point SQLite calls (VFS methods, SQL functions, virtual tables, the extension's
//! init) runs inside [`guard`]: a panic becomes an SQLite error code and a log line, never an
//! unwind into C (undefined behaviour) or an abort of the host.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Panics caught by [`guard`] in this process. Each one is a bug (every bad input has an error
/// of its own): tests read it through [`caught_panics`] and expect it to stay 0.
static CAUGHT_PANICS: AtomicU64 = AtomicU64::new(0);

/// Panics caught at the edge with SQLite since the process started (see [`guard`]).
pub fn caught_panics() -> u64 {
    CAUGHT_PANICS.load(Relaxed)
}

/// Runs `f`; if it panics, logs `what` and the panic's message, counts it ([`caught_panics`])
/// and returns `fallback`.
pub fn guard<T>(fallback: T, what: &str, f: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(payload) => {
            CAUGHT_PANICS.fetch_add(1, Relaxed);
            let msg = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            crate::api::log(
                libsqlite3_sys::SQLITE_INTERNAL,
                &format!("bpe: internal error in {what}: {msg}"),
            );
            fallback
        }
    }
}
