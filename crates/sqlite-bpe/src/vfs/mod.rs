//! The `bpe` VFS: a shim over SQLite's default (unix) VFS. Journals, WAL, shared memory and temp
//! files are opened by the unix VFS in place and never see us; only the main database file gets
//! our methods (`file.rs`), which send its page reads and writes through the core.

mod change_detect;
mod file;

use crate::api;
use libsqlite3_sys::{
    sqlite3_file, sqlite3_vfs, SQLITE_BUSY, SQLITE_CANTOPEN, SQLITE_OK, SQLITE_OPEN_MAIN_DB,
};
use std::cell::RefCell;
use std::ffi::{c_char, c_int, CStr};
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

pub fn register() -> Result<(), String> {
    if !api::vfs_find(Some(c"bpe")).is_null() {
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
    match unsafe { api::vfs_register(vfs) } {
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
    let unix = unix();
    // SAFETY: unix is the registered VFS we wrap; it implements xOpen.
    let unix_open = unsafe { (*unix).xOpen.expect("unix VFS has xOpen") };
    if flags & SQLITE_OPEN_MAIN_DB == 0 || name.is_null() {
        // Not the main database: the unix VFS's file, in place, with its own methods.
        // SAFETY: f has room for szOsFile >= the unix file's size.
        return unsafe { unix_open(unix, name, f, flags, out_flags) };
    }
    // SAFETY: f has room for REAL_OFFSET + the unix file (szOsFile).
    let real = unsafe { file::real(f) };
    // SAFETY: SQLite zeroes nothing for us: mark the file closed until it is fully open.
    unsafe { (*f).pMethods = std::ptr::null() };
    // SAFETY: real is inside f's allocation and sized for the unix file.
    let rc = unsafe { unix_open(unix, name, real, flags, out_flags) };
    if rc != SQLITE_OK {
        return rc;
    }
    // SAFETY: name is the full path SQLite passes for the main database.
    let path = unsafe { CStr::from_ptr(name) }
        .to_string_lossy()
        .into_owned();
    match file::Conn::open(std::path::Path::new(&path)) {
        Ok(conn) => {
            // SAFETY: f is ours to fill; file.rs's close frees conn.
            unsafe { file::install(f, conn) };
            SQLITE_OK
        }
        Err(e) => {
            let msg = format!("bpe: cannot open {path}: {e}");
            api::log(SQLITE_CANTOPEN, &msg);
            LAST_OPEN_ERROR.with(|l| *l.borrow_mut() = Some(msg));
            // SAFETY: real was opened above and is closed exactly once here.
            unsafe { file::close_real(real) };
            match e {
                bpe_core::Error::OwnedByAnotherProcess { .. } => SQLITE_BUSY,
                _ => SQLITE_CANTOPEN,
            }
        }
    }
}
