//! A database's other files on the emulated data device: with device emulation on (benchmarks
//! and tests only), a database's rollback journal, super-journal and WAL get these methods,
//! which charge each read, write and sync to the engine's emulated device before SQLite's own
//! method does it. Without emulation they keep the unix VFS's methods, untouched.
//!
//! Not charged: temporary files (temp databases, statement journals, sort spills), which SQLite
//! puts in the temp directory, not beside the database; the shared-memory file (`-shm`, memory
//! mapped, never read or written through methods); and the main file's header reads, which
//! the OS page cache serves on a real device too (the core keeps that block cached).

use super::file::{close_real, real, REAL_OFFSET};
use super::unix_file::unix;
use crate::ffi::guard;
use bpe_core::{DeviceOp, Engine};
use libsqlite3_sys::*;
use std::ffi::{c_int, c_void};
use std::sync::Arc;

/// Files opened with these flags are charged (they live beside the database).
pub const CHARGED_KINDS: c_int =
    SQLITE_OPEN_MAIN_JOURNAL | SQLITE_OPEN_SUPER_JOURNAL | SQLITE_OPEN_WAL;

/// Our part of SQLite's file object; the unix file follows at `file::REAL_OFFSET` (this struct
/// is no larger than the main file's, so it fits there too).
#[repr(C)]
struct ChargedFile {
    base: sqlite3_file,
    device: *mut Device,
}

const _: () = assert!(std::mem::size_of::<ChargedFile>() <= REAL_OFFSET);

/// The engine whose emulated device is charged, and the process generation it belongs to.
struct Device {
    engine: Arc<Engine>,
    generation: u64,
}

impl Device {
    /// Charges `op`, on this process's engine (a forked child has its own: the parent's may
    /// hold locks of threads that do not exist in the child, so it is never touched there).
    fn charge(&mut self, op: DeviceOp) {
        let generation = crate::process::generation();
        if generation != self.generation {
            let engine = crate::process::engine();
            std::mem::forget(std::mem::replace(&mut self.engine, engine));
            self.generation = generation;
        }
        self.engine.charge_data_device(op);
    }
}

/// The engine to charge the I/O of a file opened with `flags`, if it is charged.
pub fn charged_engine(flags: c_int) -> Option<Arc<Engine>> {
    if flags & CHARGED_KINDS == 0 {
        return None;
    }
    crate::process::existing().filter(|e| e.emulates_data_device())
}

/// # Safety
/// `f` is a bpe file object whose unix file at REAL_OFFSET is open.
pub unsafe fn install(f: *mut sqlite3_file, engine: Arc<Engine>) {
    let device = Box::new(Device {
        engine,
        generation: crate::process::generation(),
    });
    let cf = f as *mut ChargedFile;
    // SAFETY: forwarded contract; close() takes the device back.
    unsafe {
        (*cf).device = Box::into_raw(device);
        (*cf).base.pMethods = &METHODS;
    }
}

/// Version 1: journals and WAL files are neither memory-mapped nor shared-memory files.
static METHODS: sqlite3_io_methods = io_methods!(1);

/// Charges `op` to the file's device, then returns the unix file to do it on.
///
/// # Safety
/// `f` is an open charged file (install() ran); SQLite serializes calls per file.
unsafe fn charge(f: *mut sqlite3_file, op: DeviceOp) -> *mut sqlite3_file {
    // SAFETY: forwarded contract.
    unsafe { (*(*(f as *mut ChargedFile)).device).charge(op) };
    // SAFETY: as above.
    unsafe { real(f) }
}

/// The unix file behind a charged file, for the methods that cost no device time. Only computes
/// the address (safe); SQLite calls our methods only on files we installed, so it is the open
/// unix file at REAL_OFFSET.
fn uncharged(f: *mut sqlite3_file) -> *mut sqlite3_file {
    (f as *mut u8).wrapping_add(REAL_OFFSET).cast()
}

unsafe extern "C" fn close(f: *mut sqlite3_file) -> c_int {
    guard(SQLITE_IOERR_CLOSE, "xClose", || {
        let cf = f as *mut ChargedFile;
        // SAFETY: f was installed; the device is taken back and the unix file closed once.
        unsafe {
            drop(Box::from_raw((*cf).device));
            (*cf).device = std::ptr::null_mut();
            close_real(real(f))
        }
    })
}

unsafe extern "C" fn read(f: *mut sqlite3_file, buf: *mut c_void, amt: c_int, off: i64) -> c_int {
    guard(SQLITE_IOERR_READ, "xRead", || {
        // SAFETY: SQLite calls our methods only on files we installed.
        let real = unsafe { charge(f, DeviceOp::Read(amt.max(0) as u64)) };
        unix!(real, xRead, buf, amt, off)
    })
}

unsafe extern "C" fn write(
    f: *mut sqlite3_file,
    buf: *const c_void,
    amt: c_int,
    off: i64,
) -> c_int {
    guard(SQLITE_IOERR_WRITE, "xWrite", || {
        // SAFETY: as in read().
        let real = unsafe { charge(f, DeviceOp::Write(amt.max(0) as u64)) };
        unix!(real, xWrite, buf, amt, off)
    })
}

unsafe extern "C" fn sync(f: *mut sqlite3_file, flags: c_int) -> c_int {
    guard(SQLITE_IOERR_FSYNC, "xSync", || {
        // SAFETY: as in read().
        let real = unsafe { charge(f, DeviceOp::Sync) };
        unix!(real, xSync, flags)
    })
}

unsafe extern "C" fn truncate(f: *mut sqlite3_file, size: i64) -> c_int {
    guard(SQLITE_IOERR_TRUNCATE, "xTruncate", || {
        unix!(uncharged(f), xTruncate, size)
    })
}

unsafe extern "C" fn file_size(f: *mut sqlite3_file, size: *mut i64) -> c_int {
    guard(SQLITE_IOERR_FSTAT, "xFileSize", || {
        unix!(uncharged(f), xFileSize, size)
    })
}

unsafe extern "C" fn lock(f: *mut sqlite3_file, level: c_int) -> c_int {
    guard(SQLITE_IOERR_LOCK, "xLock", || {
        unix!(uncharged(f), xLock, level)
    })
}

unsafe extern "C" fn unlock(f: *mut sqlite3_file, level: c_int) -> c_int {
    guard(SQLITE_IOERR_UNLOCK, "xUnlock", || {
        unix!(uncharged(f), xUnlock, level)
    })
}

unsafe extern "C" fn check_reserved_lock(f: *mut sqlite3_file, out: *mut c_int) -> c_int {
    guard(SQLITE_IOERR_CHECKRESERVEDLOCK, "xCheckReservedLock", || {
        unix!(uncharged(f), xCheckReservedLock, out)
    })
}

unsafe extern "C" fn file_control(f: *mut sqlite3_file, op: c_int, arg: *mut c_void) -> c_int {
    guard(SQLITE_ERROR, "xFileControl", || {
        unix!(uncharged(f), xFileControl, op, arg)
    })
}

unsafe extern "C" fn sector_size(f: *mut sqlite3_file) -> c_int {
    guard(4096, "xSectorSize", || unix!(uncharged(f), xSectorSize))
}

unsafe extern "C" fn device_characteristics(f: *mut sqlite3_file) -> c_int {
    guard(0, "xDeviceCharacteristics", || {
        unix!(uncharged(f), xDeviceCharacteristics)
    })
}
