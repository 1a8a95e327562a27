//! sqlite-bpe's SQLite adapter: the `bpe` VFS over the core's buffer pool and extension, SQL
//! Server's operator surface (`bpe_exec`, `bpe_performance_counters`, `bpe_buffer_descriptors`,
//! `bpe_extension_configuration`, PRAGMAs), and the loadable-extension entry point.
//!
//! Every SQLite call goes through `api` (the C shim), so the same code serves a host that loads
//! the extension (its own SQLite) and Rust programs that call [`register`] (the bundled SQLite).

#![deny(clippy::undocumented_unsafe_blocks)]

mod api;
mod env_config;
mod ffi;
mod functions;
mod page_decode;
mod pragmas;
mod process;
mod vfs;
mod vtab;

pub use env_config::{emulation_env, emulation_var_names, EnvConfig, SqlSurface};

use bpe_core::Engine;
use libsqlite3_sys::{sqlite3, sqlite3_api_routines, SQLITE_ERROR, SQLITE_OK};
use std::ffi::{c_char, c_int};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

/// The name of the VFS: open databases with `file:app.db?vfs=bpe`.
pub const VFS_NAME: &str = "bpe";

/// SQLite's code for "loaded, never unload me" (the VFS must outlive every connection).
const SQLITE_OK_LOAD_PERMANENTLY: c_int = 256;

/// The process-wide locks (std mutexes, not the engine's) that a forked child's connections
/// may take: the files closed with their commit log kept, the commit logs mapped, the base
/// VFS sources, the core's kept readahead buffers. A fork holds each across `fork`
/// (`process.rs`'s `before_fork`), in this order, so that none is held by another thread at
/// that moment: the child would wait for it forever (as for SQLite's own mutexes). Each is
/// held briefly and none is taken under another, nor under the engine slot or a base call.
pub const PROCESS_LOCKS: [(&str, process::HoldLock); 4] = [
    ("closed files", vfs::hold_closed_list),
    ("commit logs", vfs::hold_open_list),
    ("base sources", vfs::hold_sources),
    ("readahead buffers", bpe_core::hold_large_spares),
];

/// The process-wide engine, created on first use from the configuration read at load (and
/// anew in a forked child: see `process.rs`).
pub fn engine() -> Arc<Engine> {
    process::set_process_locks(&PROCESS_LOCKS);
    process::engine()
}

/// The process-wide engine if it was created already.
pub fn existing_engine() -> Option<Arc<Engine>> {
    process::existing()
}

static INSTALLED: OnceLock<Result<(), String>> = OnceLock::new();

/// `BPE_SQL_SURFACE=on-demand` at the load: a new connection gets the SQL functions and virtual
/// tables only when it asks (see [`connection_init`]).
static SQL_ON_DEMAND: AtomicBool = AtomicBool::new(false);

/// The URI parameter of a connection's main database that overrides `BPE_SQL_SURFACE` for it.
const SQL_URI_PARAMETER: &std::ffi::CStr = c"bpe_sql";

/// Reads the configuration, creates the engine and registers the VFS and the auto-extension,
/// once per process; makes `bpe` the default VFS whenever `BPE_DEFAULT_VFS=1` at the call. The
/// whole environment is checked before anything is registered: a load that fails leaves no
/// `bpe` VFS behind.
fn install_process_wide() -> Result<(), String> {
    let make_default = env_config::default_vfs_from_env()?;
    INSTALLED
        .get_or_init(|| {
            process::set_process_locks(&PROCESS_LOCKS);
            let config = EnvConfig::from_env()?;
            SQL_ON_DEMAND.store(
                config.sql_surface == SqlSurface::OnDemand,
                Ordering::Relaxed,
            );
            process::configure(config);
            // Created now, so that an extension configured in the environment starts at load.
            engine();
            vfs::register(false)?;
            if api::auto_extension(connection_init) != SQLITE_OK {
                return Err("cannot register the bpe auto-extension".into());
            }
            Ok(())
        })
        .clone()?;
    if make_default {
        vfs::register(true)?;
    }
    Ok(())
}

/// Registers the functions and virtual tables on one connection.
fn install_on(db: *mut sqlite3) -> Result<(), String> {
    functions::register(db)?;
    vtab::register(db)
}

/// Whether a connection opened now gets the SQL functions and virtual tables: its main
/// database's `bpe_sql` URI parameter if it gives one, else `BPE_SQL_SURFACE`.
///
/// # Safety
/// `db` is a connection whose main database is open (as in an auto-extension).
unsafe fn wants_sql(db: *mut sqlite3) -> bool {
    let default = !SQL_ON_DEMAND.load(Ordering::Relaxed);
    // SAFETY: forwarded contract.
    unsafe { api::main_db_uri_boolean(db, SQL_URI_PARAMETER, default) }
}

/// Called by SQLite for every connection opened after the extension was loaded, once its
/// main database is open (so that its URI parameters can be read).
unsafe extern "C" fn connection_init(
    db: *mut sqlite3,
    _err: *mut *mut c_char,
    _api: *const sqlite3_api_routines,
) -> c_int {
    ffi::guard(SQLITE_ERROR, "connection init", || {
        // SAFETY: SQLite runs auto-extensions on a live connection after opening its main
        // database.
        if !unsafe { wants_sql(db) } {
            return SQLITE_OK;
        }
        match install_on(db) {
            Ok(()) => SQLITE_OK,
            Err(_) => SQLITE_ERROR,
        }
    })
}

/// Installs bpe's SQL functions and virtual tables (`bpe_exec`, `bpe_performance_counters`,
/// ...) on one connection of the SQLite linked into this program, registering the VFS first
/// if [`register`] has not run. For hosts that run with `BPE_SQL_SURFACE=on-demand` and want
/// the surface on some connections only; on a connection that has it already it changes
/// nothing. With rusqlite: `unsafe { sqlite_bpe::register_sql(conn.handle()) }`.
///
/// # Safety
/// `db` is an open connection of the SQLite library bpe is bound to (the linked one after
/// [`register`]), used by no other thread during the call.
pub unsafe fn register_sql(db: *mut sqlite3) -> Result<(), String> {
    if db.is_null() {
        return Err("register_sql: no connection (a NULL handle)".into());
    }
    register()?;
    install_on(db)
}

/// The loadable-extension entry point, found by SQLite from the library's file name
/// (`.load target/release/libsqlite_bpe`).
///
/// # Safety
/// Called by SQLite with a live connection, an error out-pointer and its routines table.
#[no_mangle]
pub unsafe extern "C" fn sqlite3_sqlitebpe_init(
    db: *mut sqlite3,
    err: *mut *mut c_char,
    api: *const sqlite3_api_routines,
) -> c_int {
    let result = ffi::guard(Err("internal error while loading".into()), "load", || {
        // SAFETY: api is the host's routines table, valid for the life of the process. A
        // second SQLite library of the process is refused here, before anything is registered.
        unsafe { api::bind(api) }?;
        install_process_wide().and_then(|_| install_on(db))
    });
    match result {
        Ok(()) => SQLITE_OK_LOAD_PERMANENTLY,
        Err(msg) => {
            if !err.is_null() && !api.is_null() {
                // SAFETY: SQLite hands us a valid out-pointer and frees what we put there with
                // its own allocator (that of `api`, which need not be the bound library's).
                unsafe { *err = api::sqlite_string_for(api, &msg) };
            }
            SQLITE_ERROR
        }
    }
}

/// Registers the `bpe` VFS, `bpe_exec` and the virtual tables with the SQLite linked into this
/// program (rusqlite's), for every connection opened afterwards. Idempotent.
pub fn register() -> Result<(), String> {
    if !api::has_api() {
        let routines = linked::routines().ok_or("cannot reach the linked SQLite's routines")?;
        // SAFETY: the routines table of the statically linked SQLite lives as long as the program.
        unsafe { api::bind(routines) }?;
    }
    install_process_wide()
}

/// Getting the linked SQLite's routines table: SQLite passes it to every auto-extension, so we
/// register one, open an in-memory database to have it called, and remove it again.
mod linked {
    use libsqlite3_sys as ffi;
    use std::ffi::{c_char, c_int};
    use std::sync::atomic::{AtomicPtr, Ordering};

    static CAPTURED: AtomicPtr<ffi::sqlite3_api_routines> = AtomicPtr::new(std::ptr::null_mut());

    unsafe extern "C" fn capture(
        _db: *mut ffi::sqlite3,
        _err: *mut *mut c_char,
        api: *const ffi::sqlite3_api_routines,
    ) -> c_int {
        CAPTURED.store(api as *mut _, Ordering::Release);
        ffi::SQLITE_OK
    }

    pub fn routines() -> Option<*const ffi::sqlite3_api_routines> {
        // SAFETY: the linked library's own functions, called as documented; the connection is
        // closed again and the auto-extension removed.
        unsafe {
            ffi::sqlite3_auto_extension(Some(capture));
            let mut db = std::ptr::null_mut();
            ffi::sqlite3_open(c":memory:".as_ptr(), &mut db);
            ffi::sqlite3_close(db);
            ffi::sqlite3_cancel_auto_extension(Some(capture));
        }
        let p = CAPTURED.load(Ordering::Acquire);
        (!p.is_null()).then_some(p as *const _)
    }
}
#[doc(hidden)]
pub use process::{fork_waits_for, hold_process_lock};
pub use vfs::last_open_error;

/// Panics caught where SQLite calls into bpe (a VFS method, an SQL function, a virtual table)
/// since the process started: each became an SQLite error and an `internal error` line in
/// sqlite3_log. Every one is a bug; tests check it stays 0 on the paths they exercise.
pub fn caught_panics() -> u64 {
    ffi::caught_panics()
}
