//! Every entry point SQLite calls (VFS methods, SQL functions, virtual tables, the extension's
//! init) runs inside [`guard`]: a panic becomes an SQLite error code and a log line, never an
//! unwind into C (undefined behaviour) or an abort of the host.

use std::panic::{catch_unwind, AssertUnwindSafe};

/// Runs `f`; if it panics, logs `what` and the panic's message and returns `fallback`.
pub fn guard<T>(fallback: T, what: &str, f: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(payload) => {
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
