//! `bpe_exec(text)`: SQL Server's operator statements, as an SQL function; and the metadata
//! functions SQL Server's DBA scripts call on the DMVs' ids: `DB_ID()`, `DB_NAME(database_id)`,
//! `FILE_NAME(file_id)`.
//!
//! A database here is a database file the engine caches: its `database_id` is the engine's id for
//! the file (the `database_id` of `sys.dm_os_buffer_descriptors`), its name the file's path. Each
//! has one file, `file_id` 1, named after the file.

use crate::api::{self, Context, ScalarFn};
use libsqlite3_sys::{sqlite3, sqlite3_context, sqlite3_value, SQLITE_DIRECTONLY};
use std::ffi::{c_int, CStr};
use std::path::Path;

/// Name, arguments, SQLite's function flags, the function. `bpe_exec` changes the server (the
/// pool's size, the extension file's path), so only the application's own statements may call
/// it: `SQLITE_DIRECTONLY` refuses it in a schema's views, triggers, CHECK constraints, defaults
/// and generated columns, which a database file made elsewhere brings along ("unsafe use of
/// bpe_exec()"). The others only read.
const FUNCTIONS: [(&CStr, c_int, c_int, ScalarFn); 4] = [
    (c"bpe_exec", 1, SQLITE_DIRECTONLY, bpe_exec),
    (c"db_id", 0, 0, db_id),
    (c"db_name", 1, 0, db_name),
    (c"file_name", 1, 0, file_name),
];

/// SQLite honours `SQLITE_DIRECTONLY` from 3.30.0; older versions drop the flag silently.
const DIRECTONLY_SINCE: c_int = 3_030_000;

/// Whether a function with `flags` is registered in a host running SQLite `version`: one that a
/// schema must not call is left out where the host could not refuse it to one. (`bpe_exec`'s
/// statements stay available there as `PRAGMA bpe_...`, which no schema can run.)
fn registrable(flags: c_int, version: c_int) -> bool {
    flags & SQLITE_DIRECTONLY == 0 || version >= DIRECTONLY_SINCE
}

pub fn register(db: *mut sqlite3) -> Result<(), String> {
    let version = api::libversion_number();
    for (name, nargs, flags, f) in FUNCTIONS {
        if !registrable(flags, version) {
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| {
                api::log(
                    libsqlite3_sys::SQLITE_WARNING,
                    &format!(
                        "bpe: {name:?} is not registered: SQLite {version} cannot keep a \
                         database's schema from calling it (3.30.0 can); use PRAGMA bpe_..."
                    ),
                )
            });
            continue;
        }
        // SAFETY: db is the live connection SQLite handed to the entry point; no app data.
        let rc = unsafe { api::create_function(db, name, nargs, flags, std::ptr::null_mut(), f) };
        // SQLITE_BUSY: the function is there already and a statement is running: the
        // connection was equipped by the auto-extension, and this is `SELECT load_extension()`
        // on it (SQLite refuses to replace a function under a running statement). Keep it.
        if rc == libsqlite3_sys::SQLITE_BUSY {
            continue;
        }
        if rc != 0 {
            return Err(format!("cannot create {name:?} (SQLite error {rc})"));
        }
    }
    Ok(())
}

/// The engine's id for the file at `path`, if it caches it.
fn database_id_of(path: &Path) -> Option<u32> {
    let files = crate::process::engine().files();
    let same = |p: &Path| p == path;
    files
        .iter()
        .find(|f| same(&f.path))
        .or_else(|| {
            let wanted = std::fs::canonicalize(path).ok()?;
            files
                .iter()
                .find(|f| std::fs::canonicalize(&f.path).ok().as_deref() == Some(&wanted))
        })
        .map(|f| f.id)
}

/// `DB_ID()`: the calling connection's main database, NULL if the engine does not cache it.
unsafe extern "C" fn db_id(
    ctx: *mut sqlite3_context,
    _argc: c_int,
    _argv: *mut *mut sqlite3_value,
) {
    crate::ffi::guard((), "db_id", || {
        let ctx = Context(ctx);
        match ctx.main_db_filename().and_then(|p| database_id_of(&p)) {
            Some(id) => ctx.int(id as i64),
            None => ctx.null(),
        }
    })
}

/// `DB_NAME(database_id)`: the path of that database's file, NULL for an unknown id.
unsafe extern "C" fn db_name(
    ctx: *mut sqlite3_context,
    _argc: c_int,
    argv: *mut *mut sqlite3_value,
) {
    crate::ffi::guard((), "db_name", || {
        let ctx = Context(ctx);
        // SAFETY: SQLite passes the one argument declared.
        let id = unsafe { api::value_int(*argv) };
        let path = id.and_then(|id| {
            crate::process::engine()
                .files()
                .into_iter()
                .find(|f| f.id as i64 == id)
                .map(|f| f.path.display().to_string())
        });
        ctx.text_or_null(path.as_deref());
    })
}

/// `FILE_NAME(file_id)`: in the calling connection's database, file 1 is its one file (named
/// after it); any other id is NULL.
unsafe extern "C" fn file_name(
    ctx: *mut sqlite3_context,
    _argc: c_int,
    argv: *mut *mut sqlite3_value,
) {
    crate::ffi::guard((), "file_name", || {
        let ctx = Context(ctx);
        // SAFETY: SQLite passes the one argument declared.
        let id = unsafe { api::value_int(*argv) };
        let name = ctx
            .main_db_filename()
            .filter(|_| id == Some(1))
            .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()));
        ctx.text_or_null(name.as_deref());
    })
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
    match bpe_tsql::run(&crate::process::engine(), &text) {
        Ok(status) => ctx.text(&status),
        Err(e) => ctx.error(&e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_function_a_schema_must_not_call_is_left_out_where_sqlite_cannot_refuse_it() {
        assert!(!registrable(SQLITE_DIRECTONLY, 3_029_000));
        assert!(registrable(SQLITE_DIRECTONLY, 3_030_000));
        assert!(registrable(0, 3_008_007));
        let exec = FUNCTIONS
            .iter()
            .find(|f| f.0 == c"bpe_exec")
            .expect("bpe_exec");
        assert_eq!(exec.2 & SQLITE_DIRECTONLY, SQLITE_DIRECTONLY);
    }
}
