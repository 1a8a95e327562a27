//! The main database file's methods: page reads and writes go through the core; everything else
//! (locks, size, sync, shared memory) goes to the unix file underneath, with a look at the locks
//! and the wal-index for changes made by other processes.

use super::change_detect::{self, InodeState, WalLocks};
use crate::api;
use bpe_core::{Error, FileHandle};
use libsqlite3_sys::*;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::Arc;

/// Our part of SQLite's file object; the unix file follows at REAL_OFFSET.
#[repr(C)]
struct BpeFile {
    base: sqlite3_file,
    conn: *mut Conn,
}

pub const REAL_OFFSET: usize = std::mem::size_of::<BpeFile>().next_multiple_of(16);

/// One connection's open main database file.
pub struct Conn {
    handle: FileHandle,
    inode: Arc<InodeState>,
    /// wal-index region 0 while mapped (WAL mode).
    shm0: *const u8,
    lock: c_int,
    /// Header bytes 24..40 read from disk when the read transaction began, handed to SQLite's
    /// own change-counter read so that it costs no second I/O.
    header: Option<[u8; 16]>,
}

impl Conn {
    pub fn open(path: &std::path::Path) -> Result<Conn, Error> {
        let handle = crate::engine().open_file(path, 4096)?;
        let inode = change_detect::attach(&handle);
        Ok(Conn {
            handle,
            inode,
            shm0: std::ptr::null(),
            lock: SQLITE_LOCK_NONE,
            header: None,
        })
    }
}

/// # Safety
/// `f` must be a file object of the bpe VFS (szOsFile bytes).
pub unsafe fn real(f: *mut sqlite3_file) -> *mut sqlite3_file {
    // SAFETY: forwarded contract: the unix file lives at this offset inside f.
    unsafe { (f as *mut u8).add(REAL_OFFSET) as *mut sqlite3_file }
}

/// # Safety
/// `f` is a bpe file object whose unix file at REAL_OFFSET is open.
pub unsafe fn install(f: *mut sqlite3_file, conn: Conn) {
    let bf = f as *mut BpeFile;
    // SAFETY: forwarded contract; close() takes conn back.
    unsafe {
        (*bf).conn = Box::into_raw(Box::new(conn));
        (*bf).base.pMethods = &METHODS;
    }
}

/// # Safety
/// `real` is an open unix file, closed exactly once.
pub unsafe fn close_real(real: *mut sqlite3_file) -> c_int {
    // SAFETY: forwarded contract.
    unsafe {
        match (*real).pMethods.as_ref().and_then(|m| m.xClose) {
            Some(close) => close(real),
            None => SQLITE_OK,
        }
    }
}

/// Version 2: no xFetch/xUnfetch, so SQLite never memory-maps the file past our cache
/// (PRAGMA mmap_size is then a no-op on bpe databases).
static METHODS: sqlite3_io_methods = sqlite3_io_methods {
    iVersion: 2,
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
    xShmMap: Some(shm_map),
    xShmLock: Some(shm_lock),
    xShmBarrier: Some(shm_barrier),
    xShmUnmap: Some(shm_unmap),
    xFetch: None,
    xUnfetch: None,
};

/// The connection and the unix file behind a bpe file object.
///
/// # Safety
/// `f` is an open bpe main-database file (install() ran); SQLite serializes calls per file.
unsafe fn parts<'a>(f: *mut sqlite3_file) -> (&'a mut Conn, *mut sqlite3_file) {
    // SAFETY: forwarded contract.
    unsafe { (&mut *(*(f as *mut BpeFile)).conn, real(f)) }
}

/// The unix file's method `$m`, called with `$args`.
macro_rules! unix {
    ($real:expr, $m:ident $(, $arg:expr)*) => {{
        let real = $real;
        // SAFETY: real is the open unix file; the unix VFS implements every method of version 3.
        unsafe { ((*(*real).pMethods).$m.expect(stringify!($m)))(real $(, $arg)*) }
    }};
}

fn page_shaped(amt: c_int, off: i64) -> bool {
    let amt = amt as i64;
    (512..=65536).contains(&amt) && (amt as u64).is_power_of_two() && off % amt == 0
}

fn io_code(e: &Error, default: c_int) -> c_int {
    match e {
        Error::DataIo { source, .. } if source.raw_os_error() == Some(libc::ENOSPC) => SQLITE_FULL,
        _ => default,
    }
}

unsafe extern "C" fn close(f: *mut sqlite3_file) -> c_int {
    let bf = f as *mut BpeFile;
    // SAFETY: f was installed; conn is taken back exactly once, and the unix file closed once.
    unsafe {
        let conn = Box::from_raw((*bf).conn);
        (*bf).conn = std::ptr::null_mut();
        let rc = close_real(real(f));
        change_detect::detach(&conn.handle, &conn.inode);
        crate::engine().close_file(&conn.handle);
        rc
    }
}

unsafe extern "C" fn read(f: *mut sqlite3_file, buf: *mut c_void, amt: c_int, off: i64) -> c_int {
    // SAFETY: f is open; buf has amt writable bytes.
    let (conn, _) = unsafe { parts(f) };
    let out = unsafe { std::slice::from_raw_parts_mut(buf as *mut u8, amt as usize) };
    let engine = crate::engine();
    if page_shaped(amt, off) {
        if conn.handle.page_size() != amt as usize
            && engine.set_page_size(&conn.handle, amt as usize).is_err()
        {
            return SQLITE_IOERR_READ;
        }
        return match engine.read_page(&conn.handle, off as u64 / amt as u64, out) {
            Ok(r) if r.len == out.len() => SQLITE_OK,
            Ok(_) => SQLITE_IOERR_SHORT_READ,
            Err(e) => io_code(&e, SQLITE_IOERR_READ),
        };
    }
    // SQLite's change-counter read at the start of a read transaction: we just read it.
    if off == 24 && amt == 16 {
        if let Some(h) = conn.header.take() {
            out.copy_from_slice(&h);
            return SQLITE_OK;
        }
    }
    match engine.read_uncached(&conn.handle, off as u64, out) {
        Ok(n) => {
            if off <= 24 && off + n as i64 >= 28 {
                let at = (24 - off) as usize;
                let counter = out[at..at + 4].try_into().expect("4 bytes");
                conn.inode.observe_counter(engine, &conn.handle, counter);
            }
            if n == out.len() {
                SQLITE_OK
            } else {
                SQLITE_IOERR_SHORT_READ
            }
        }
        Err(e) => io_code(&e, SQLITE_IOERR_READ),
    }
}

unsafe extern "C" fn write(
    f: *mut sqlite3_file,
    buf: *const c_void,
    amt: c_int,
    off: i64,
) -> c_int {
    // SAFETY: f is open; buf has amt readable bytes.
    let (conn, real) = unsafe { parts(f) };
    let data = unsafe { std::slice::from_raw_parts(buf as *const u8, amt as usize) };
    let engine = crate::engine();
    if page_shaped(amt, off) {
        if conn.handle.page_size() != amt as usize
            && engine.set_page_size(&conn.handle, amt as usize).is_err()
        {
            return SQLITE_IOERR_WRITE;
        }
        if let Err(e) = engine.write_page(&conn.handle, off as u64 / amt as u64, data) {
            return io_code(&e, SQLITE_IOERR_WRITE);
        }
    } else {
        // Not a page: write it as SQLite asked and forget what we cached of the file.
        let rc = unix!(real, xWrite, buf, amt, off);
        if rc != SQLITE_OK {
            return rc;
        }
        engine.invalidate_file(&conn.handle);
    }
    if off <= 24 && off + amt as i64 >= 28 {
        let at = (24 - off) as usize;
        conn.inode
            .wrote_counter(data[at..at + 4].try_into().expect("4 bytes"));
    }
    SQLITE_OK
}

unsafe extern "C" fn truncate(f: *mut sqlite3_file, size: i64) -> c_int {
    // SAFETY: f is open.
    let (conn, real) = unsafe { parts(f) };
    let rc = unix!(real, xTruncate, size);
    if rc != SQLITE_OK {
        return rc;
    }
    match crate::engine().truncate(&conn.handle, size as u64) {
        Ok(()) => SQLITE_OK,
        Err(e) => io_code(&e, SQLITE_IOERR_TRUNCATE),
    }
}

unsafe extern "C" fn sync(f: *mut sqlite3_file, flags: c_int) -> c_int {
    // SAFETY: f is open.
    let (conn, real) = unsafe { parts(f) };
    // fsync through the unix descriptor flushes the inode, our writes included.
    let rc = unix!(real, xSync, flags);
    if rc == SQLITE_OK {
        crate::engine().release_os_cache(&conn.handle);
    }
    rc
}

unsafe extern "C" fn file_size(f: *mut sqlite3_file, size: *mut i64) -> c_int {
    unix!(unsafe { real(f) }, xFileSize, size)
}

unsafe extern "C" fn lock(f: *mut sqlite3_file, level: c_int) -> c_int {
    // SAFETY: f is open.
    let (conn, real) = unsafe { parts(f) };
    let rc = unix!(real, xLock, level);
    if rc == SQLITE_OK
        && level == SQLITE_LOCK_SHARED
        && conn.lock == SQLITE_LOCK_NONE
        && conn.shm0.is_null()
    {
        // A read transaction begins (rollback mode): look at the change counter on disk.
        let engine = crate::engine();
        let mut header = [0u8; 16];
        if let Ok(16) = engine.read_uncached(&conn.handle, 24, &mut header) {
            let counter = header[..4].try_into().expect("4 bytes");
            conn.inode.observe_counter(engine, &conn.handle, counter);
            conn.header = Some(header);
        }
    }
    if rc == SQLITE_OK {
        conn.lock = conn.lock.max(level);
    }
    rc
}

unsafe extern "C" fn unlock(f: *mut sqlite3_file, level: c_int) -> c_int {
    // SAFETY: f is open.
    let (conn, real) = unsafe { parts(f) };
    let rc = unix!(real, xUnlock, level);
    if rc == SQLITE_OK {
        conn.lock = level;
        if level == SQLITE_LOCK_NONE {
            conn.header = None;
        }
    }
    rc
}

unsafe extern "C" fn check_reserved_lock(f: *mut sqlite3_file, out: *mut c_int) -> c_int {
    unix!(unsafe { real(f) }, xCheckReservedLock, out)
}

unsafe extern "C" fn file_control(f: *mut sqlite3_file, op: c_int, arg: *mut c_void) -> c_int {
    if op == SQLITE_FCNTL_PRAGMA {
        // SAFETY: for this op, arg is char*[3]: out message, pragma name, value or NULL.
        let args = arg as *mut *mut c_char;
        let (name, value) = unsafe {
            let name = CStr::from_ptr(*args.add(1)).to_string_lossy().into_owned();
            let v = *args.add(2);
            (
                name,
                (!v.is_null()).then(|| CStr::from_ptr(v).to_string_lossy().into_owned()),
            )
        };
        if let Some(result) = crate::pragmas::run(&name, value.as_deref()) {
            let (rc, text) = match result {
                Ok(t) => (SQLITE_OK, t),
                Err(t) => (SQLITE_ERROR, t),
            };
            // SAFETY: SQLite frees *args[0] with sqlite3_free; sqlite_string allocates with sqlite3_malloc.
            unsafe { *args = api::sqlite_string(&text) };
            return rc;
        }
    }
    unix!(unsafe { real(f) }, xFileControl, op, arg)
}

unsafe extern "C" fn sector_size(f: *mut sqlite3_file) -> c_int {
    unix!(unsafe { real(f) }, xSectorSize)
}

unsafe extern "C" fn device_characteristics(f: *mut sqlite3_file) -> c_int {
    unix!(unsafe { real(f) }, xDeviceCharacteristics)
}

unsafe extern "C" fn shm_map(
    f: *mut sqlite3_file,
    region: c_int,
    size: c_int,
    extend: c_int,
    out: *mut *mut c_void,
) -> c_int {
    // SAFETY: f is open.
    let (conn, real) = unsafe { parts(f) };
    let rc = unix!(real, xShmMap, region, size, extend, out);
    // SAFETY: on success *out is the mapping (or NULL if not extended).
    if rc == SQLITE_OK && region == 0 && unsafe { !(*out).is_null() } {
        conn.shm0 = unsafe { *out } as *const u8;
    }
    rc
}

/// wal.c's lock slots: 0 write, 1 checkpoint, 2 recover, 3..8 read marks.
const WAL_WRITE_LOCK: c_int = 0;
const WAL_CKPT_LOCK: c_int = 1;
const WAL_READ_LOCK0: c_int = 3;

unsafe extern "C" fn shm_lock(
    f: *mut sqlite3_file,
    offset: c_int,
    n: c_int,
    flags: c_int,
) -> c_int {
    // SAFETY: f is open.
    let (conn, real) = unsafe { parts(f) };
    let guarded = WalLocks {
        write: offset <= WAL_WRITE_LOCK && offset + n > WAL_WRITE_LOCK,
        checkpoint: offset <= WAL_CKPT_LOCK && offset + n > WAL_CKPT_LOCK,
    };
    let exclusive = flags & SQLITE_SHM_EXCLUSIVE != 0 && guarded != WalLocks::default();
    if exclusive && flags & SQLITE_SHM_UNLOCK != 0 {
        // Account for what we did under the lock before anyone else can take it.
        conn.wal_lock(guarded, false);
    }
    let rc = unix!(real, xShmLock, offset, n, flags);
    if rc != SQLITE_OK || flags & SQLITE_SHM_LOCK == 0 {
        return rc;
    }
    if exclusive {
        conn.wal_lock(guarded, true);
    }
    if flags & SQLITE_SHM_SHARED != 0 && offset >= WAL_READ_LOCK0 && !conn.shm0.is_null() {
        // A read transaction begins (WAL mode): has anyone else checkpointed?
        let shm0 = conn.shm0;
        // SAFETY: shm0 is region 0 as mapped by the unix VFS; the closure runs within this call,
        // before anything can unmap it.
        let read_token = || unsafe { change_detect::wal_token(shm0) };
        conn.inode
            .observe_wal(crate::engine(), &conn.handle, read_token);
    }
    rc
}

impl Conn {
    fn wal_lock(&self, locks: WalLocks, held: bool) {
        if self.shm0.is_null() {
            return;
        }
        let shm0 = self.shm0;
        // SAFETY: shm0 is region 0 as mapped by the unix VFS; the closure runs within this call,
        // before anything can unmap it.
        let read_token = || unsafe { change_detect::wal_token(shm0) };
        self.inode
            .wal_lock(crate::engine(), &self.handle, read_token, locks, held);
    }
}

unsafe extern "C" fn shm_barrier(f: *mut sqlite3_file) {
    unix!(unsafe { real(f) }, xShmBarrier)
}

unsafe extern "C" fn shm_unmap(f: *mut sqlite3_file, delete: c_int) -> c_int {
    // SAFETY: f is open.
    let (conn, real) = unsafe { parts(f) };
    conn.shm0 = std::ptr::null();
    unix!(real, xShmUnmap, delete)
}
