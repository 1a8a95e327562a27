//! `bpe_exec(text)`: SQL Server's operator statements, as an SQL function.

use crate::api::{self, Context};
use libsqlite3_sys::{sqlite3, sqlite3_context, sqlite3_value};
use std::ffi::c_int;

pub fn register(db: *mut sqlite3) -> Result<(), String> {
    // SAFETY: db is the live connection SQLite handed to the entry point; no app data.
    let rc = unsafe { api::create_function(db, c"bpe_exec", 1, std::ptr::null_mut(), bpe_exec) };
    if rc == 0 {
        Ok(())
    } else {
        Err(format!("cannot create bpe_exec (SQLite error {rc})"))
    }
}

unsafe extern "C" fn bpe_exec(
    ctx: *mut sqlite3_context,
    argc: c_int,
    argv: *mut *mut sqlite3_value,
) {
    crate::ffi::guard((), "bpe_exec", || {
        // SAFETY: forwarded from SQLite's call.
        unsafe { bpe_exec_inner(ctx, argc, argv) }
    })
}

/// # Safety
/// As an SQL function: `argv` holds `argc` values.
unsafe fn bpe_exec_inner(ctx: *mut sqlite3_context, argc: c_int, argv: *mut *mut sqlite3_value) {
    let ctx = Context(ctx);
    if argc != 1 {
        return ctx.error("bpe_exec takes one argument: the statement text");
    }
    // SAFETY: argv holds argc values for this call.
    let text = unsafe { api::value_text(*argv) };
    let Some(text) = text else {
        return ctx.error("bpe_exec: the statement is NULL or not text");
    };
    match bpe_tsql::run(&crate::engine(), &text) {
        Ok(status) => ctx.text(&status),
        Err(e) => ctx.error(&e.to_string()),
    }
}
