//! The `bpe` VFS: a shim over SQLite's default (unix) VFS. Journals, WAL, shared memory and temp
//! files are opened by the unix VFS in place and keep its methods; only the main database file
//! gets our methods (`file.rs`), which send its page reads and writes through the core. With
//! device emulation on (benchmarks), journals and WAL files get methods that charge their I/O to
//! the emulated device (`charged_file.rs`).
//!
//! Every file opened through this VFS, of any kind, is checked against the extension file: no
//! file SQLite opens may ever be it (a WAL or a database at the extension's path would be
//! overwritten by the extension's writer, and the other way round).

/// The `sqlite3_io_methods` table of a bpe file kind, made of the functions the calling module
/// names `close`, `read`, `write`, ... (every kind names its methods alike, so the table is
/// written once): version 1 without shared memory or mapped reads (journals, WAL files), 2 with
/// the shared-memory methods, 3 with `fetch` and `unfetch` too.
macro_rules! io_methods {
    (1) => {
        io_methods!(@ 1, None, None, None, None, None, None)
    };
    (2) => {
        io_methods!(@ 2, Some(shm_map), Some(shm_lock), Some(shm_barrier), Some(shm_unmap), None, None)
    };
    (3) => {
        io_methods!(@ 3, Some(shm_map), Some(shm_lock), Some(shm_barrier), Some(shm_unmap),
            Some(fetch), Some(unfetch))
    };
    (@ $version:expr, $map:expr, $lock:expr, $barrier:expr, $unmap:expr, $fetch:expr,
        $unfetch:expr) => {
        libsqlite3_sys::sqlite3_io_methods {
            iVersion: $version,
            xClose: Some(close),
            xRead: Some(read),
            xWrite: Some(write),
            xTruncate: Some(truncate),
            xSync: Some(sync),
            xFileSize: Some(file_size),
            xLock: Some(lock),
            xUnlock: Some(unlock),
            xCheckReservedLock: Some(check_reserved_lock),
            xFileControl: Some(file_control),
            xSectorSize: Some(sector_size),
            xDeviceCharacteristics: Some(device_characteristics),
            xShmMap: $map,
            xShmLock: $lock,
            xShmBarrier: $barrier,
            xShmUnmap: $unmap,
            xFetch: $fetch,
            xUnfetch: $unfetch,
        }
    };
}

mod base_file;
mod change_detect;
mod charged_file;
mod file;
mod peer_log;
mod read_txn;
mod replica_log;
mod replica_pos;
mod replica_snapshots;
mod scope;
mod unix_file;
mod wal_view;

pub use change_detect::hold_closed_list;
pub use peer_log::hold_open_list;
pub use replica_snapshots::hold_sources;

use crate::api;
use libsqlite3_sys::{
    sqlite3_file, sqlite3_vfs, SQLITE_CANTOPEN, SQLITE_IOERR, SQLITE_OK, SQLITE_OPEN_MAIN_DB,
};
use std::cell::RefCell;
use std::ffi::{c_char, c_int, CStr, OsStr};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicPtr, Ordering};

/// The VFS we wrap (SQLite's default at registration time).
static UNIX: AtomicPtr<sqlite3_vfs> = AtomicPtr::new(std::ptr::null_mut());

fn unix() -> *mut sqlite3_vfs {
    UNIX.load(Ordering::Acquire)
}

thread_local! {
    static LAST_OPEN_ERROR: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Why the last `bpe` open on this thread failed, if our side refused it (SQLite only reports
/// "unable to open database file"). Also sent to sqlite3_log.
pub fn last_open_error() -> Option<String> {
    LAST_OPEN_ERROR.with(|e| e.borrow().clone())
}

fn refuse_open(msg: String) {
    api::log(SQLITE_CANTOPEN, &msg);
    LAST_OPEN_ERROR.with(|l| *l.borrow_mut() = Some(msg));
}

/// Registers the VFS; with `make_default`, it also becomes the process's default VFS.
pub fn register(make_default: bool) -> Result<(), String> {
    scope::configure_from_env()?;
    peer_log::tidy_dev_shm();
    let existing = api::vfs_find(Some(c"bpe"));
    if !existing.is_null() {
        if make_default {
            // SAFETY: a registered VFS, which lives for the process.
            unsafe { api::vfs_register(existing, true) };
        }
        return Ok(());
    }
    let unix = api::vfs_find(None);
    if unix.is_null() {
        return Err("SQLite has no default VFS to wrap".into());
    }
    UNIX.store(unix, Ordering::Release);
    // SAFETY: unix points at a registered VFS, which lives for the process. Copying it keeps
    // every method but xOpen (they ignore which VFS object they are called through).
    let mut vfs: sqlite3_vfs = unsafe { std::ptr::read(unix) };
    vfs.pNext = std::ptr::null_mut();
    vfs.zName = c"bpe".as_ptr();
    // SAFETY: as above.
    vfs.szOsFile = (file::REAL_OFFSET + unsafe { (*unix).szOsFile } as usize) as c_int;
    vfs.xOpen = Some(open);
    let vfs = Box::leak(Box::new(vfs));
    // SAFETY: the VFS object is leaked, so it outlives every connection.
    match unsafe { api::vfs_register(vfs, make_default) } {
        SQLITE_OK => Ok(()),
        rc => Err(format!("cannot register the bpe VFS (SQLite error {rc})")),
    }
}

unsafe extern "C" fn open(
    _vfs: *mut sqlite3_vfs,
    name: *const c_char,
    f: *mut sqlite3_file,
    flags: c_int,
    out_flags: *mut c_int,
) -> c_int {
    crate::ffi::guard(SQLITE_IOERR, "xOpen", || {
        // SAFETY: forwarded from SQLite's call.
        unsafe { open_inner(name, f, flags, out_flags) }
    })
}

/// # Safety
/// As xOpen: `f` has room for our szOsFile, `name` is NULL or a C string.
unsafe fn open_inner(
    name: *const c_char,
    f: *mut sqlite3_file,
    flags: c_int,
    out_flags: *mut c_int,
) -> c_int {
    let unix = unix();
    // SAFETY: unix is the registered VFS we wrap; it implements xOpen.
    let unix_open = unsafe { (*unix).xOpen.expect("unix VFS has xOpen") };
    // The name's bytes as they are (a file name need not be UTF-8), borrowed: no copy at an
    // open, which an application opening a connection per request makes at every request.
    let path = if name.is_null() {
        Path::new("")
    } else {
        // SAFETY: name is the full path SQLite passes, alive for this call.
        Path::new(OsStr::from_bytes(
            unsafe { CStr::from_ptr(name) }.to_bytes(),
        ))
    };
    // A main database outside BPE_CACHE_PATHS is the unix VFS's file, in place.
    let main_db = flags & SQLITE_OPEN_MAIN_DB != 0 && !name.is_null() && scope::covers(path);
    // SAFETY: name is SQLite's, for this open.
    let base = unsafe { base_file::base_for(name, flags) };
    // SAFETY: unix is a registered VFS; its name is a C string.
    let unix_name = unsafe { CStr::from_ptr((*unix).zName) }.to_bytes();
    if let Some(base) = base.filter(|b| b.as_bytes() != unix_name) {
        // SAFETY: forwarded from xOpen.
        return match unsafe { base_file::open(&base, name, f, flags, out_flags, main_db) } {
            Ok(()) => SQLITE_OK,
            Err((rc, why)) => {
                refuse_open(format!("bpe: cannot open {}: {why}", path.display()));
                rc
            }
        };
    }
    let charged = if main_db {
        None
    } else {
        charged_file::charged_engine(flags)
    };
    let real = if main_db || charged.is_some() {
        // SAFETY: f has room for REAL_OFFSET + the unix file (szOsFile).
        let real = unsafe { file::real(f) };
        // SAFETY: SQLite zeroes nothing for us: mark the file closed until it is fully open.
        unsafe { (*f).pMethods = std::ptr::null() };
        real
    } else {
        f
    };
    let rc = {
        // The unix VFS's open may take the inode's mutex (a descriptor to reuse).
        let _call = crate::process::base_call();
        // SAFETY: real has room for the unix file; the unix VFS fills it.
        unsafe { unix_open(unix, name, real, flags, out_flags) }
    };
    if rc != SQLITE_OK {
        return rc;
    }
    // SAFETY: real was just opened by the unix VFS.
    let fd = unsafe { unix_file::descriptor(real, unix) };
    let identity = fd.and_then(unix_file::identity_of);
    if let Some(id) = identity {
        if crate::process::existing().is_some_and(|e| e.is_extension_file(id)) {
            refuse_open(format!(
                "bpe: cannot open {}: it is the buffer pool extension's file",
                path.display()
            ));
            // SAFETY: real was opened above and is closed exactly once here.
            unsafe { file::close_real(real) };
            return SQLITE_CANTOPEN;
        }
    }
    if let Some(engine) = charged {
        // A journal or WAL on the emulated device: the unix file behind our charging methods.
        // SAFETY: f has room for REAL_OFFSET + the unix file, which is open; close() frees it.
        unsafe { charged_file::install(f, engine) };
        return SQLITE_OK;
    }
    if !main_db {
        // Not the main database: the unix VFS's file, in place, with its own methods.
        return SQLITE_OK;
    }
    match file::Conn::open(path, fd, identity) {
        Ok(conn) => {
            // SAFETY: f is ours to fill; file.rs's close frees conn.
            unsafe { file::install(f, conn) };
            SQLITE_OK
        }
        Err(e) => {
            refuse_open(format!("bpe: cannot open {}: {e}", path.display()));
            // SAFETY: real was opened above and is closed exactly once here.
            unsafe { file::close_real(real) };
            SQLITE_CANTOPEN
        }
    }
}
