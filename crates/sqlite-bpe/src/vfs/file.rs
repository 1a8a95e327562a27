//! The main database file's methods: page reads and writes go through the core; everything else
//! (locks, size, sync, shared memory, the header) goes to the unix file underneath, with a look
//! at each read transaction's start for changes made by others (`change_detect.rs`).
//!
//! The core's descriptors are derived from SQLite's own (`/proc/self/fd/N`), so SQLite's locks
//! and syncs and our page I/O are on one file whatever happens to its name meanwhile. Page
//! writes go through SQLite's own write method; page reads on a miss through our O_DIRECT
//! descriptor, or SQLite's read method where O_DIRECT is not used.

use super::change_detect::FileWatch;
use super::replica_pos::ReplicaPos;
use super::unix_file::{self, unix, unix_locking, UnixFile};
use super::wal_view::{self, WalLocks, WalToken};
use crate::api;
use crate::ffi::guard;
use bpe_core::{BehindLog, DeviceOp, Engine, Error, FileHandle, OpenRequest, PinnedPage, Via};
use bpe_core::{FileIdentity, FileStamp};
use libsqlite3_sys::*;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::path::{Path, PathBuf};
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
    engine: Arc<Engine>,
    /// The process generation `engine` belongs to (a forked child has a new one).
    generation: u64,
    handle: FileHandle,
    watch: Arc<FileWatch>,
    path: PathBuf,
    /// SQLite's descriptor of the file and its identity, when the unix VFS lets us see them.
    fd: Option<c_int>,
    identity: Option<FileIdentity>,
    /// wal-index region 0 while mapped (WAL mode).
    shm0: *const u8,
    lock: c_int,
    /// Written since the lock was last released: accept the stamp before releasing it.
    wrote: bool,
    /// This write transaction so far (rollback mode), for the bpe processes' commit log: the
    /// change counter when it began, the pages written, a truncation (in pages).
    txn_before: Option<u32>,
    txn_pages: Vec<u64>,
    txn_truncated: Option<u64>,
    /// Something was written that the page list cannot describe (a write that is not a page, a
    /// page size change): the commit must not be logged, so that readers forget the whole file.
    txn_unloggable: bool,
    /// Header bytes 24..40 read when the read transaction began, handed to SQLite's own read of
    /// the same bytes that follows, which then costs no second read.
    header: Option<[u8; 16]>,
    /// The file's size from the stamp taken when the read transaction began, handed to SQLite's
    /// own size query that follows (`pagerPagecount`), which then costs no second stat call:
    /// see `Conn::size_of`.
    size_at_lock: Option<i64>,
    /// A WAL read transaction began (a read mark was locked) and has not read the file yet:
    /// its first read looks at the wal-index again (see `Conn::wal_first_read`).
    wal_read_began: bool,
    /// The wal-index token the read transaction's look at its read mark read, if any.
    token_at_lock: Option<WalToken>,
    /// LiteFS's position file, if the database is on a LiteFS mount (replica_pos.rs).
    replica_pos: Option<ReplicaPos>,
    /// Pages SQLite holds in place through `xFetch`, until its `xUnfetch`.
    pins: Vec<PinnedPage>,
    /// SQLite's `mmap_size` for this file: `xFetch` serves pages below it.
    mmap_limit: i64,
    /// Pages written behind under this connection's EXCLUSIVE lock, written back before
    /// anything else may look at the file (see `Conn::write_back`).
    behind: BehindLog,
}

impl Conn {
    pub fn open(
        path: &Path,
        fd: Option<c_int>,
        identity: Option<FileIdentity>,
    ) -> Result<Conn, Error> {
        let engine = crate::process::engine();
        let (handle, watch) = attach(&engine, path, fd, identity)?;
        let replica_pos = ReplicaPos::find(path, |look| watch.on_fuse(look));
        Ok(Conn {
            engine,
            generation: crate::process::generation(),
            handle,
            watch,
            path: path.to_path_buf(),
            fd,
            identity,
            shm0: std::ptr::null(),
            lock: SQLITE_LOCK_NONE,
            wrote: false,
            txn_before: None,
            txn_pages: Vec::new(),
            txn_truncated: None,
            txn_unloggable: false,
            header: None,
            size_at_lock: None,
            wal_read_began: false,
            token_at_lock: None,
            replica_pos,
            pins: Vec::new(),
            mmap_limit: 0,
            behind: BehindLog::default(),
        })
    }

    /// After a fork, moves this connection to the child's engine (the parent's is never
    /// touched in the child: its locks may be held by threads that do not exist here).
    /// Inlined: every method call asks, and the answer is nearly always "no fork".
    #[inline]
    fn follow_fork(&mut self) -> Result<(), Error> {
        let generation = crate::process::generation();
        if generation == self.generation {
            return Ok(());
        }
        self.move_to_child_engine(generation)
    }

    #[cold]
    fn move_to_child_engine(&mut self, generation: u64) -> Result<(), Error> {
        let engine = crate::process::engine();
        let (handle, watch) = attach(&engine, &self.path, self.fd, self.identity)?;
        std::mem::forget(std::mem::replace(&mut self.engine, engine));
        std::mem::forget(std::mem::replace(&mut self.handle, handle));
        std::mem::forget(std::mem::replace(&mut self.watch, watch));
        self.generation = generation;
        Ok(())
    }
}

/// Opens the file in the engine from SQLite's descriptor and finds its change detection.
fn attach(
    engine: &Engine,
    path: &Path,
    fd: Option<c_int>,
    identity: Option<FileIdentity>,
) -> Result<(FileHandle, Arc<FileWatch>), Error> {
    let proc_fd = fd
        .filter(|_| proc_fd_mounted())
        .map(|fd| PathBuf::from(format!("/proc/self/fd/{fd}")));
    let page_size = || fd.and_then(header_page_size).unwrap_or(4096);
    let open_from = |from: &Path| {
        engine.open_file_with(&OpenRequest {
            path,
            open_from: from,
            expect: identity,
            page_size: &page_size,
        })
    };
    // Through procfs if it was there when first asked, by name if it is not now (a chroot);
    // `expect` keeps either to the file SQLite opened.
    let (handle, kind) = match proc_fd.as_deref() {
        Some(proc) => open_from(proc).or_else(|_| open_from(path))?,
        None => open_from(path)?,
    };
    let watch = handle.client_state(FileWatch::default);
    watch.opened(kind);
    Ok((handle, watch))
}

/// Whether `/proc/self/fd` lists this process's descriptors (procfs mounted), asked once: an
/// open descriptor's entry is then there, and a stat of it at every open cost a path walk
/// through procfs where a connection per request opens the file at each.
fn proc_fd_mounted() -> bool {
    static MOUNTED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *MOUNTED.get_or_init(|| Path::new("/proc/self/fd").is_dir())
}

/// The page size the database header records (bytes 16-17, big-endian, 1 for 65536), read
/// through SQLite's descriptor; None for a new or short file. Only a first guess: SQLite's first
/// page-shaped read sets the size (`adopt_page_size`). A right guess keeps the file's key from
/// changing then, which would drop what the extension adopted for it at a warm restart.
fn header_page_size(fd: c_int) -> Option<usize> {
    let mut b = [0u8; 2];
    // SAFETY: fd is SQLite's open descriptor of the file for the call; b is writable for 2 bytes.
    let n = unsafe { libc::pread(fd, b.as_mut_ptr() as *mut c_void, 2, 16) };
    let size = match (n, u16::from_be_bytes(b)) {
        (2, 1) => 65536,
        (2, v) => v as usize,
        _ => return None,
    };
    (size.is_power_of_two() && (512..=65536).contains(&size)).then_some(size)
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

/// Closes the file underneath ours (the unix VFS's, or a base VFS's: `base_file.rs`); one
/// whose open failed and left no methods is nothing to close.
///
/// # Safety
/// `real` is such a file, closed exactly once.
pub unsafe fn close_real(real: *mut sqlite3_file) -> c_int {
    // SAFETY: forwarded contract.
    unsafe {
        match (*real).pMethods.as_ref().and_then(|m| m.xClose) {
            Some(close) => {
                let _call = crate::process::base_call();
                close(real)
            }
            None => SQLITE_OK,
        }
    }
}

/// Version 3: SQLite's memory-mapped reads (`PRAGMA mmap_size` > 0) are served from L1 in place
/// (`fetch`); the file itself is never mapped.
static METHODS: sqlite3_io_methods = io_methods!(3);

/// The connection and the unix file behind a bpe file object, on this process's engine.
///
/// # Safety
/// `f` is an open bpe main-database file (install() ran); SQLite serializes calls per file.
unsafe fn parts<'a>(f: *mut sqlite3_file) -> Result<(&'a mut Conn, *mut sqlite3_file), c_int> {
    // SAFETY: forwarded contract.
    let conn = unsafe { &mut *(*(f as *mut BpeFile)).conn };
    conn.follow_fork().map_err(|_| SQLITE_IOERR)?;
    // SAFETY: forwarded contract.
    Ok((conn, unsafe { real(f) }))
}

/// Runs a method body on the connection, with panics and a failed fork move made errors.
macro_rules! method {
    ($f:expr, $fallback:expr, $name:literal, |$conn:ident, $real:ident| $body:expr) => {
        guard($fallback, $name, || {
            // SAFETY: SQLite calls our methods only on files we installed.
            match unsafe { parts($f) } {
                Ok(($conn, $real)) => $body,
                Err(rc) => rc,
            }
        })
    };
}

pub(super) fn page_shaped(amt: c_int, off: i64) -> bool {
    let amt = amt as i64;
    (512..=65536).contains(&amt) && (amt as u64).is_power_of_two() && off % amt == 0
}

/// SQLite reads and writes whole pages: a page-shaped request of another size than the file's
/// is the file's page size from now on. Ok(true) when it changed.
fn adopt_page_size(conn: &Conn, amt: c_int) -> Result<bool, ()> {
    if conn.handle.page_size() == amt as usize {
        return Ok(false);
    }
    conn.engine
        .set_page_size(&conn.handle, amt as usize)
        .map(|()| true)
        .map_err(|_| ())
}

/// The SQLite code for a core error: SQLite's own code where its method failed, else `default`.
fn io_code(e: &Error, default: c_int) -> c_int {
    match e {
        Error::DataIo { source, .. } => match unix_file::sqlite_code(source) {
            Some(rc) => rc,
            None if source.raw_os_error() == Some(libc::ENOSPC) => SQLITE_FULL,
            None => default,
        },
        _ => default,
    }
}

unsafe extern "C" fn close(f: *mut sqlite3_file) -> c_int {
    guard(SQLITE_IOERR_CLOSE, "xClose", || {
        let bf = f as *mut BpeFile;
        // SAFETY: f was installed; conn is taken back exactly once, and the unix file closed once.
        unsafe {
            let mut conn = Box::from_raw((*bf).conn);
            (*bf).conn = std::ptr::null_mut();
            let moved = conn.follow_fork();
            if moved.is_ok() && conn.write_back_or_discard(real(f)) != SQLITE_OK {
                // Nothing is left to retry it: the file is what the pages are.
                let why = format!(
                    "{}: pages written behind could not be written back at close",
                    conn.path.display()
                );
                crate::api::log(SQLITE_IOERR_WRITE, &why);
            }
            let rc = close_real(real(f));
            if moved.is_ok() && conn.engine.close_file(&conn.handle) {
                conn.watch.closed();
            }
            rc
        }
    })
}

unsafe extern "C" fn read(f: *mut sqlite3_file, buf: *mut c_void, amt: c_int, off: i64) -> c_int {
    method!(f, SQLITE_IOERR_READ, "xRead", |conn, real| {
        if std::mem::take(&mut conn.wal_read_began) {
            conn.wal_first_read(real);
        }
        // SAFETY: buf has amt writable bytes.
        let out = unsafe { std::slice::from_raw_parts_mut(buf as *mut u8, amt as usize) };
        if page_shaped(amt, off) {
            if adopt_page_size(conn, amt).is_err() {
                return SQLITE_IOERR_READ;
            }
            let device = UnixFile(real);
            let page = off as u64 / amt as u64;
            return match conn
                .engine
                .read_page_via(&conn.handle, page, out, Via(Some(&device)))
            {
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
        // Not a page (the header): SQLite's own buffered read, coherent with every writer.
        let rc = conn.write_back(real);
        if rc != SQLITE_OK {
            return rc;
        }
        unix!(real, xRead, buf, amt, off)
    })
}

/// SQLite's memory-mapped read of a page (`PRAGMA mmap_size` > 0; only pages other than the
/// first, in a read transaction, and in WAL mode only pages the WAL does not hold): a pointer to
/// the page's bytes in L1, held until `unfetch`. The bytes never change while held (a frame's
/// bytes are never written; see `Engine::pin_cached`). A page L1 does not hold gets NULL, and
/// SQLite reads it with `xRead`, which loads it. No copy, and SQLite's own page cache does not
/// hold a second copy of the page.
unsafe extern "C" fn fetch(
    f: *mut sqlite3_file,
    off: i64,
    amt: c_int,
    pp: *mut *mut c_void,
) -> c_int {
    // SAFETY: SQLite passes a writable out-pointer.
    unsafe { *pp = std::ptr::null_mut() };
    method!(f, SQLITE_OK, "xFetch", |conn, real| {
        if std::mem::take(&mut conn.wal_read_began) {
            conn.wal_first_read(real);
        }
        let usable = conn.lock >= SQLITE_LOCK_SHARED
            && page_shaped(amt, off)
            && off + amt as i64 <= conn.mmap_limit
            && amt as usize == conn.handle.page_size();
        if !usable {
            return SQLITE_OK;
        }
        if let Some(pin) = conn
            .engine
            .pin_cached(&conn.handle, off as u64 / amt as u64)
        {
            // SAFETY: as above; the bytes live as long as the pin, which unfetch drops.
            unsafe { *pp = pin.bytes().as_ptr() as *mut c_void };
            conn.pins.push(pin);
        }
        SQLITE_OK
    })
}

/// Releases a page `fetch` handed out (`p` is its pointer; NULL, "unmap everything", comes
/// only when none is held).
unsafe extern "C" fn unfetch(f: *mut sqlite3_file, _off: i64, p: *mut c_void) -> c_int {
    method!(f, SQLITE_OK, "xUnfetch", |conn, _real| {
        if let Some(at) = conn
            .pins
            .iter()
            .position(|pin| pin.bytes().as_ptr() == p as *const u8)
        {
            conn.pins.swap_remove(at);
        }
        SQLITE_OK
    })
}

unsafe extern "C" fn write(
    f: *mut sqlite3_file,
    buf: *const c_void,
    amt: c_int,
    off: i64,
) -> c_int {
    method!(f, SQLITE_IOERR_WRITE, "xWrite", |conn, real| {
        // SAFETY: buf has amt readable bytes.
        let data = unsafe { std::slice::from_raw_parts(buf as *const u8, amt as usize) };
        conn.size_at_lock = None;
        conn.begin_writing();
        if page_shaped(amt, off) {
            match adopt_page_size(conn, amt) {
                Err(()) => return SQLITE_IOERR_WRITE,
                Ok(true) => {
                    // Peers cannot follow a page-size change page by page.
                    conn.txn_unloggable = true;
                    // Pages of the old size go first, so that no later write of the file's
                    // bytes is overwritten by an earlier one.
                    let rc = conn.write_back(real);
                    if rc != SQLITE_OK {
                        return rc;
                    }
                }
                Ok(false) => {}
            }
            let device = UnixFile(real);
            let page = off as u64 / amt as u64;
            let written = if conn.may_write_behind() {
                conn.engine.write_page_behind(
                    &conn.handle,
                    page,
                    data,
                    Via(Some(&device)),
                    &mut conn.behind,
                )
            } else {
                conn.engine
                    .write_page_via(&conn.handle, page, data, Via(Some(&device)))
            };
            if let Err(e) = written {
                return io_code(&e, SQLITE_IOERR_WRITE);
            }
            conn.txn_pages.push(page);
        } else {
            // Not a page: write it as SQLite asked and forget what we cached of the file.
            let rc = conn.write_back(real);
            if rc != SQLITE_OK {
                return rc;
            }
            conn.txn_unloggable = true;
            conn.engine
                .charge_data_device(DeviceOp::Write(amt.max(0) as u64));
            let rc = unix!(real, xWrite, buf, amt, off);
            if rc != SQLITE_OK {
                return rc;
            }
            conn.engine.invalidate_file(&conn.handle);
        }
        if off <= 24 && off + amt as i64 >= 40 {
            let at = (24 - off) as usize;
            conn.watch
                .wrote_header(data[at..at + 16].try_into().expect("16 bytes"));
        }
        SQLITE_OK
    })
}

unsafe extern "C" fn truncate(f: *mut sqlite3_file, size: i64) -> c_int {
    method!(f, SQLITE_IOERR_TRUNCATE, "xTruncate", |conn, real| {
        // The unix VFS rounds the size up to the chunk size (SQLITE_FCNTL_CHUNK_SIZE): the file
        // is SQLite's to size. Pages past the size SQLite asked for are forgotten.
        //
        // The size before, through SQLite's own method as every other size: its I/O hooks
        // (simulated errors in its test builds, system-call overrides) see the probe as one of
        // its calls. If it fails, so does the truncation, with SQLite's code: a failure SQLite
        // was told of (its test builds count an injected error as hit) must not end in a
        // success (SQLite's ioerr2.test 7.215.3 once committed after an injected fstat error).
        conn.size_at_lock = None;
        let rc = conn.write_back(real);
        if rc != SQLITE_OK {
            return rc;
        }
        let mut before: i64 = 0;
        let probe = unix!(real, xFileSize, &mut before);
        if probe != SQLITE_OK {
            return probe;
        }
        let rc = unix!(real, xTruncate, size);
        if rc == SQLITE_OK {
            conn.begin_writing();
            if shrinks(before, size) {
                let pages = (size as u64).div_ceil(conn.handle.page_size() as u64);
                conn.txn_truncated = Some(conn.txn_truncated.map_or(pages, |t| t.min(pages)));
                conn.engine.truncated(&conn.handle, size as u64);
            }
        }
        rc
    })
}

/// Whether truncating a file of `before` bytes to `size` can drop cached pages.
/// Nothing is cached past a file's end (a read there caches nothing), so a truncation that does
/// not shrink the file has nothing to forget. SQLite truncates the database to its own size at
/// the end of every complete WAL checkpoint, and forgetting walks all of L1 and the extension's
/// index: with SQLite's autocheckpoint in the committing connection, that walk was most of a
/// TPC-C transaction's time (docs/BENCHMARKS.md, oltp without the writers' queue).
fn shrinks(before: i64, size: i64) -> bool {
    size < before
}

unsafe extern "C" fn sync(f: *mut sqlite3_file, flags: c_int) -> c_int {
    method!(f, SQLITE_IOERR_FSYNC, "xSync", |conn, real| {
        // fsync through the unix descriptor flushes the inode, our writes included.
        conn.size_at_lock = None;
        let rc = conn.write_back(real);
        if rc != SQLITE_OK {
            return rc;
        }
        conn.engine.charge_data_device(DeviceOp::Sync);
        let rc = unix!(real, xSync, flags);
        if rc == SQLITE_OK {
            conn.engine.release_os_cache(&conn.handle);
        }
        rc
    })
}

unsafe extern "C" fn file_size(f: *mut sqlite3_file, size: *mut i64) -> c_int {
    method!(f, SQLITE_IOERR_FSTAT, "xFileSize", |conn, real| {
        if let Some(s) = conn.size_at_lock.take() {
            // SAFETY: SQLite passes a writable i64.
            unsafe { *size = s };
            return SQLITE_OK;
        }
        // Pages written behind past the end make the file longer.
        let rc = conn.write_back(real);
        if rc != SQLITE_OK {
            return rc;
        }
        unix!(real, xFileSize, size)
    })
}

unsafe extern "C" fn lock(f: *mut sqlite3_file, level: c_int) -> c_int {
    method!(f, SQLITE_IOERR_LOCK, "xLock", |conn, real| {
        let rc = unix_locking!(real, xLock, level);
        if rc == SQLITE_OK
            && level == SQLITE_LOCK_SHARED
            && conn.lock == SQLITE_LOCK_NONE
            && conn.shm0.is_null()
        {
            // A read transaction begins (rollback mode, or WAL without a mapped wal-index).
            let mut header = [0u8; 16];
            let read = unix!(real, xRead, header.as_mut_ptr() as *mut c_void, 16, 24);
            if read != SQLITE_OK && read != SQLITE_IOERR_SHORT_READ {
                // The check could not be made: the read transaction cannot begin (as it could
                // not if SQLite's own read of these bytes failed).
                unix_locking!(real, xUnlock, SQLITE_LOCK_NONE);
                return read;
            }
            let header = (read == SQLITE_OK).then_some(header);
            let stamp = conn.handle.stamp_now().ok();
            conn.size_at_lock = conn.size_of(stamp.as_ref());
            conn.watch
                .begin_read(&conn.engine, &conn.handle, header, stamp);
            if let Some(pos) = &conn.replica_pos {
                // Rollback mode: LiteFS writes page 1, so the counter SQLite reads moves too;
                // a lost one is only forgotten (SQLite's readers see page 1 itself change).
                let seen = header.map_or(Vec::new(), |h| h.to_vec());
                conn.watch
                    .replica_position(&conn.engine, &conn.handle, pos, &seen);
            }
            conn.header = header;
        }
        if rc == SQLITE_OK {
            conn.lock = conn.lock.max(level);
        }
        rc
    })
}

unsafe extern "C" fn unlock(f: *mut sqlite3_file, level: c_int) -> c_int {
    method!(f, SQLITE_IOERR_UNLOCK, "xUnlock", |conn, real| {
        conn.size_at_lock = None;
        // Before the lock goes: from then on other connections may read the file. On a failure
        // the pages leave L1 (the file is what they are now); the lock still goes.
        let written_back = conn.write_back_or_discard(real);
        if std::mem::take(&mut conn.wrote) {
            // Our writes, accepted (and in rollback mode logged for the other bpe processes)
            // while still under the lock they were made under.
            let pages = std::mem::take(&mut conn.txn_pages);
            let truncated = conn.txn_truncated.take();
            let loggable = conn.shm0.is_null() && !std::mem::take(&mut conn.txn_unloggable);
            let commit = conn
                .txn_before
                .take()
                .filter(|_| loggable)
                .map(|before| (before, pages.as_slice(), truncated));
            conn.watch.wrote(&conn.handle, commit);
        }
        let rc = unix_locking!(real, xUnlock, level);
        if rc == SQLITE_OK {
            conn.lock = level;
            if level == SQLITE_LOCK_NONE {
                conn.header = None;
            }
        }
        if rc == SQLITE_OK {
            written_back
        } else {
            rc
        }
    })
}

unsafe extern "C" fn check_reserved_lock(f: *mut sqlite3_file, out: *mut c_int) -> c_int {
    method!(
        f,
        SQLITE_IOERR_CHECKRESERVEDLOCK,
        "xCheckReservedLock",
        |_conn, real| { unix_locking!(real, xCheckReservedLock, out) }
    )
}

unsafe extern "C" fn file_control(f: *mut sqlite3_file, op: c_int, arg: *mut c_void) -> c_int {
    method!(f, SQLITE_ERROR, "xFileControl", |conn, real| {
        // A size hint may grow the file.
        conn.size_at_lock = None;
        // Any other operation may look at the file's bytes (a size hint only grows it, and
        // SQLite gives one while it spills pages, which write-behind is for).
        if op != SQLITE_FCNTL_SIZE_HINT {
            let rc = conn.write_back(real);
            if rc != SQLITE_OK {
                return rc;
            }
        }
        if op == SQLITE_FCNTL_PRAGMA {
            if let Some(rc) = bpe_pragma(arg) {
                return rc;
            }
        }
        if op == SQLITE_FCNTL_MMAP_SIZE {
            return conn.set_mmap_limit(real, arg as *mut i64);
        }
        unix_locking!(real, xFileControl, op, arg)
    })
}

/// Runs one of bpe's pragmas (`SQLITE_FCNTL_PRAGMA`'s `arg`); None if the pragma is not ours.
pub(super) fn bpe_pragma(arg: *mut c_void) -> Option<c_int> {
    let args = arg as *mut *mut c_char;
    // SAFETY: for this op, arg is char*[3]: out message, pragma name, value or NULL.
    let (name, value) = unsafe {
        let name = CStr::from_ptr(*args.add(1)).to_string_lossy().into_owned();
        let v = *args.add(2);
        (
            name,
            (!v.is_null()).then(|| CStr::from_ptr(v).to_string_lossy().into_owned()),
        )
    };
    let result = crate::pragmas::run(&name, value.as_deref())?;
    let (rc, text) = match result {
        Ok(t) => (SQLITE_OK, t),
        Err(t) => (SQLITE_ERROR, t),
    };
    // SAFETY: SQLite frees *args[0] with sqlite3_free; sqlite_string allocates with
    // sqlite3_malloc.
    unsafe { *args = api::sqlite_string(&text) };
    Some(rc)
}

unsafe extern "C" fn sector_size(f: *mut sqlite3_file) -> c_int {
    method!(f, 4096, "xSectorSize", |_conn, real| unix!(
        real,
        xSectorSize
    ))
}

unsafe extern "C" fn device_characteristics(f: *mut sqlite3_file) -> c_int {
    method!(f, 0, "xDeviceCharacteristics", |_conn, real| unix!(
        real,
        xDeviceCharacteristics
    ))
}

unsafe extern "C" fn shm_map(
    f: *mut sqlite3_file,
    region: c_int,
    size: c_int,
    extend: c_int,
    out: *mut *mut c_void,
) -> c_int {
    method!(f, SQLITE_IOERR_SHMMAP, "xShmMap", |conn, real| {
        if region == 0 && conn.shm0.is_null() && shm_is_the_extension(conn) {
            return SQLITE_IOERR_SHMOPEN;
        }
        let rc = unix_locking!(real, xShmMap, region, size, extend, out);
        // SAFETY: on success *out is the mapping (or NULL if not extended).
        if rc == SQLITE_OK && region == 0 && unsafe { !(*out).is_null() } {
            // SAFETY: as above: *out was just set by the unix VFS.
            conn.shm0 = unsafe { *out } as *const u8;
        }
        rc
    })
}

/// The unix VFS opens `<db>-shm` itself, past our xOpen: check it against the extension here.
/// (It opens the name with O_NOFOLLOW, and an extension's path cannot end in "-shm": only a
/// hard link made to the extension file could be it.) Without an extension file there is
/// nothing to look for, and a connection's first read saves the `stat`.
fn shm_is_the_extension(conn: &Conn) -> bool {
    if !conn.engine.has_extension_file() {
        return false;
    }
    let mut shm = conn.path.clone().into_os_string();
    shm.push("-shm");
    match FileIdentity::of_path(Path::new(&shm)) {
        Ok(id) if conn.engine.is_extension_file(id) => {
            api::log(
                SQLITE_IOERR_SHMOPEN,
                &format!(
                    "bpe: {} is the buffer pool extension's file; refusing to map it",
                    Path::new(&shm).display()
                ),
            );
            true
        }
        _ => false,
    }
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
    method!(f, SQLITE_IOERR_SHMLOCK, "xShmLock", |conn, real| {
        conn.size_at_lock = None;
        let guarded = WalLocks {
            write: offset <= WAL_WRITE_LOCK && offset + n > WAL_WRITE_LOCK,
            checkpoint: offset <= WAL_CKPT_LOCK && offset + n > WAL_CKPT_LOCK,
        };
        let exclusive = flags & SQLITE_SHM_EXCLUSIVE != 0 && guarded != WalLocks::default();
        if exclusive && flags & SQLITE_SHM_UNLOCK != 0 {
            // Account for what we did under the lock before anyone else can take it.
            conn.wal_lock(real, guarded, false);
        }
        let rc = unix_locking!(real, xShmLock, offset, n, flags);
        if rc != SQLITE_OK || flags & SQLITE_SHM_LOCK == 0 {
            return rc;
        }
        if exclusive {
            conn.wal_lock(real, guarded, true);
        }
        if flags & SQLITE_SHM_SHARED != 0 && offset >= WAL_READ_LOCK0 {
            // A read transaction begins (WAL mode): has anyone else checkpointed?
            let mark0 = offset == WAL_READ_LOCK0;
            if conn.shm0.is_null() {
                // No wal-index mapped (`readonly_shm`: SQLite reads the WAL file itself, and
                // holds its database lock for the connection's life): the stamp is the signal.
                let stamp = conn.handle.stamp_now().ok();
                if mark0 {
                    // Read mark 0: no checkpoint writes the database file while the mark is
                    // held (wal.c takes it exclusively to backfill). The snapshot is the file
                    // alone, except under `readonly_shm` with a wal-index rebuilt in heap
                    // memory, where SQLite reads WAL frames too; the file's size holds either
                    // way.
                    conn.size_at_lock = conn.size_of(stamp.as_ref());
                }
                conn.watch
                    .begin_read(&conn.engine, &conn.handle, None, stamp);
            } else {
                let shm0 = conn.shm0;
                let token_at_lock = std::cell::Cell::new(None);
                let read_token = || {
                    // SAFETY: shm0 is region 0 as mapped by the unix VFS; the closures run
                    // within this call, before anything can unmap it.
                    let token = unsafe { wal_view::wal_token(shm0) };
                    token_at_lock.set(token);
                    token
                };
                // SAFETY: as above, and real is this connection's open unix file.
                let pages = |from, to, salts| unsafe {
                    wal_view::wal_frame_pages(real, shm0, from, to, salts)
                };
                // The stamp, only if the wal-index look needs it (a system call saved per read
                // transaction otherwise).
                let taken = std::cell::Cell::new(None);
                let handle = &conn.handle;
                let stamp = || {
                    let s = handle.stamp_now().ok();
                    taken.set(s);
                    s
                };
                conn.watch
                    .begin_read_wal(&conn.engine, &conn.handle, read_token, &pages, stamp);
                if mark0 {
                    // As above; taken after the mark was granted, it answers SQLite's size
                    // query too. Not taken, SQLite's own stat call answers it, as in stock.
                    conn.size_at_lock = conn.size_of(taken.get().as_ref());
                }
                if let Some(pos) = &conn.replica_pos {
                    // SAFETY: as above.
                    let seen = unsafe { wal_view::header_copy(shm0) };
                    if conn
                        .watch
                        .replica_position(&conn.engine, &conn.handle, pos, &seen)
                    {
                        conn.rewrite_lost_header(real, &seen);
                    }
                }
                conn.token_at_lock = token_at_lock.get();
                conn.wal_read_began = true;
            }
        }
        rc
    })
}

impl Conn {
    /// On a LiteFS replica whose wal-index header was lost (`FileWatch::replica_position`):
    /// writes it as LiteFS would have, with iChange + 1, so that every connection's SQLite sees
    /// a change and drops its own page cache, and none keeps serving pages the transaction
    /// replaced. This is the only write bpe makes to state SQLite owns, and it is made as
    /// SQLite's own writer makes its header write: under the WAL write lock (asked without
    /// waiting: whoever holds it, LiteFS applying a transaction, writes a header of its own),
    /// and only if the header is still the one `seen` before the lock (`bump_change` checks).
    /// Anything else, and nothing is written.
    fn rewrite_lost_header(&mut self, real: *mut sqlite3_file, seen: &[u8; 48]) {
        bpe_core::pause::point(bpe_core::pause::LOST_HEADER_SEEN);
        let exclusive = SQLITE_SHM_LOCK | SQLITE_SHM_EXCLUSIVE;
        if unix_locking!(real, xShmLock, WAL_WRITE_LOCK, 1, exclusive) != SQLITE_OK {
            return;
        }
        bpe_core::pause::point(bpe_core::pause::LOST_HEADER_LOCKED);
        // SAFETY: shm0 is region 0 as mapped by the unix VFS, mapped while the connection holds
        // its read mark; we hold the WAL write lock, so no SQLite writer writes the header.
        let written = unsafe { wal_view::bump_change(self.shm0, seen) };
        let unlock = SQLITE_SHM_UNLOCK | SQLITE_SHM_EXCLUSIVE;
        unix_locking!(real, xShmLock, WAL_WRITE_LOCK, 1, unlock);
        if written {
            api::log(
                SQLITE_NOTICE,
                &format!(
                    "bpe: {}: LiteFS's wal-index header was lost; rewritten with the next change counter",
                    self.path.display()
                ),
            );
        }
    }

    /// The size SQLite's next `xFileSize` is answered with, from the stamp just taken as a read
    /// transaction began (in WAL mode, where `begin_read_wal` took one). Stock SQLite makes a stat call there (`pagerPagecount`: in rollback
    /// mode at each read transaction, in WAL mode only when the wal-index knows no page count,
    /// as after it is rebuilt from an empty WAL), and ours then stands in for it. Unused, it
    /// waits under the lock and goes with the next call that may change the size.
    ///
    /// Why it is the answer a fresh fstat would give: the stamp was taken after the lock was
    /// granted, so it is a size SQLite's own fstat could have returned had it run a moment
    /// earlier; only a change by this connection in between would be ordered before SQLite's
    /// call, and every call that may make one (a write, truncation, sync, file control, unlock,
    /// or another wal-index lock) drops the answer first. It is given once. Under the usual
    /// locks no other SQLite writer can change the size at all (rollback: the SHARED lock, which
    /// a writer's EXCLUSIVE waits for; WAL: read mark 0, which a checkpoint must take
    /// exclusively before it backfills); before a wal-index is mapped (WAL mode's first look,
    /// `readonly_shm`) another process's checkpoint may, exactly as it may just after an fstat.
    /// Only a stamp of this connection's own file counts (a stamp by path may name another);
    /// when the file's identity is unknown (its descriptor could not be stat'ed), none does.
    fn size_of(&self, stamp: Option<&FileStamp>) -> Option<i64> {
        let stamp = stamp?;
        if self.identity != Some(stamp.identity) {
            return None;
        }
        // unixFileSize reports a 1-byte file as empty (its ticket #3260 workaround).
        match stamp.size {
            1 => Some(0),
            s => i64::try_from(s).ok(),
        }
    }

    /// `SQLITE_FCNTL_MMAP_SIZE`: answers the limit in force and sets the new one (`*arg` >= 0),
    /// as the unix VFS does: clamped to SQLite's maximum (the unix file, which never maps the
    /// file since our `fetch` stands in for its own, keeps and clamps it), and left as it is
    /// while SQLite holds fetched pages.
    fn set_mmap_limit(&mut self, real: *mut sqlite3_file, arg: *mut i64) -> c_int {
        // SAFETY: for this op, arg points at an i64 SQLite owns for the call.
        let wanted = unsafe { *arg };
        if !self.pins.is_empty() {
            // SAFETY: as above.
            unsafe { *arg = self.mmap_limit };
            return SQLITE_OK;
        }
        let rc = unix!(
            real,
            xFileControl,
            SQLITE_FCNTL_MMAP_SIZE,
            arg as *mut c_void
        );
        if rc == SQLITE_OK && wanted >= 0 {
            let mut now = -1i64;
            let q = &mut now as *mut i64 as *mut c_void;
            if unix!(real, xFileControl, SQLITE_FCNTL_MMAP_SIZE, q) == SQLITE_OK {
                self.mmap_limit = now;
            }
        }
        rc
    }

    /// Whether a page write may be held in L1 until `write_back`: only under an EXCLUSIVE lock
    /// in rollback mode (no wal-index), which no reader in any process gets past before the
    /// unlock writes the pages back. A WAL checkpoint writes under a SHARED lock while readers
    /// read the file, so it writes through.
    fn may_write_behind(&self) -> bool {
        self.lock == SQLITE_LOCK_EXCLUSIVE && self.shm0.is_null()
    }

    /// Writes the pages written behind to the file (SQLite's own write method), before anything
    /// else may look at it. On a failure SQLite gets the write's error (at xSync it then rolls
    /// the transaction back from its journal, as after a failed xWrite) and the pages stay, for
    /// the next call: SQLite ignores the result of some file controls (a WAL checkpoint's
    /// `SQLITE_FCNTL_CKPT_DONE`), and the truncation or sync that follows must not find them
    /// gone (walfault.test 13.2 with transient I/O errors).
    fn write_back(&mut self, real: *mut sqlite3_file) -> c_int {
        if self.behind.is_empty() {
            return SQLITE_OK;
        }
        let device = UnixFile(real);
        match self
            .engine
            .write_back(&self.handle, &mut self.behind, Via(Some(&device)))
        {
            Ok(()) => SQLITE_OK,
            Err(e) => io_code(&e, SQLITE_IOERR_WRITE),
        }
    }

    /// `write_back` where the connection lets go of the file (its unlock, its close): on a
    /// failure the pages leave L1, so that every reader sees the file as it is (with SQLite's
    /// journal still hot: the next connection rolls it back).
    fn write_back_or_discard(&mut self, real: *mut sqlite3_file) -> c_int {
        let rc = self.write_back(real);
        if rc != SQLITE_OK {
            self.engine.discard_behind(&mut self.behind);
        }
        rc
    }

    /// Notes that this lock period writes the file (the counter it started from, once).
    fn begin_writing(&mut self) {
        self.watch.wrote_file();
        if !std::mem::replace(&mut self.wrote, true) {
            self.txn_before = self.watch.counter();
            self.txn_pages.clear();
            self.txn_truncated = None;
            self.txn_unloggable = false;
        }
    }

    /// The first read of the file in a WAL read transaction. SQLite reads nBackfill, which says
    /// which pages it reads from the file rather than the WAL (those of frames up to it), after
    /// it locked its read mark, so after `begin_read_wal` looked in xShmLock. A checkpoint by
    /// another process in between copied pages into the file that this transaction now reads
    /// there, and that our cache may hold older: look again before serving any (walthread-4:
    /// "row N missing from index" under a writer process's PASSIVE checkpoints). Looking here
    /// is enough: a backfill after SQLite's read of nBackfill covers only frames SQLite reads
    /// from the WAL in this transaction, and is accounted at the next look.
    ///
    /// Only a backfill writes the file while this transaction holds its read mark (mark 0 bars
    /// any backfill; another mark bars a restart, the only reset of nBackfill), and a backfill
    /// moves nBackfill forward. So an nBackfill equal to the one the lock's look read means the
    /// file holds what that look saw, and there is nothing to account here: one load, not the
    /// watch's lock and a whole token (the common case, once in every read transaction). What
    /// else moved meanwhile (a commit) is accounted at the next look, as any later change is.
    fn wal_first_read(&self, real: *mut sqlite3_file) {
        if self.shm0.is_null() {
            return;
        }
        let shm0 = self.shm0;
        let unmoved = self.token_at_lock.is_some_and(|at_lock| {
            // SAFETY: as in wal_lock.
            let backfill = unsafe { wal_view::wal_backfill(shm0) };
            backfill == at_lock.backfill
        });
        if unmoved {
            return;
        }
        // SAFETY: as in wal_lock.
        let read_token = || unsafe { wal_view::wal_token(shm0) };
        // SAFETY: as in wal_lock.
        let pages =
            |from, to, salts| unsafe { wal_view::wal_frame_pages(real, shm0, from, to, salts) };
        self.watch
            .look_wal(&self.engine, &self.handle, read_token, &pages);
    }

    fn wal_lock(&self, real: *mut sqlite3_file, locks: WalLocks, held: bool) {
        if self.shm0.is_null() {
            return;
        }
        let shm0 = self.shm0;
        // SAFETY: shm0 is region 0 as mapped by the unix VFS; the closures run within this call,
        // before anything can unmap it.
        let read_token = || unsafe { wal_view::wal_token(shm0) };
        // SAFETY: as above, and real is this connection's open unix file.
        let pages =
            |from, to, salts| unsafe { wal_view::wal_frame_pages(real, shm0, from, to, salts) };
        self.watch
            .wal_lock(&self.engine, &self.handle, read_token, &pages, locks, held);
    }
}

unsafe extern "C" fn shm_barrier(f: *mut sqlite3_file) {
    guard((), "xShmBarrier", || {
        // SAFETY: f is open; the barrier needs no connection state.
        unix!(unsafe { real(f) }, xShmBarrier)
    })
}

unsafe extern "C" fn shm_unmap(f: *mut sqlite3_file, delete: c_int) -> c_int {
    method!(f, SQLITE_IOERR_SHMMAP, "xShmUnmap", |conn, real| {
        conn.shm0 = std::ptr::null();
        if delete != 0 {
            conn.watch.wal_deleted();
        }
        unix_locking!(real, xShmUnmap, delete)
    })
}

#[cfg(test)]
mod tests {
    use super::shrinks;

    #[test]
    fn only_a_truncation_below_the_old_size_forgets_pages() {
        assert!(!shrinks(8192, 8192), "same size: a checkpoint's truncate");
        assert!(!shrinks(8192, 16384), "growing");
        assert!(shrinks(16384, 8192));
    }
}
