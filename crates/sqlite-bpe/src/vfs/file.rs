//! The main database file's methods: page reads and writes go through the core; everything else
//! (locks, size, sync, shared memory, the header) goes to the unix file underneath. SQLite's
//! lock calls are forwarded to the connection's transaction (`read_txn.rs`), which looks at
//! each read transaction's start for changes made by others (`change_detect.rs`).
//!
//! The core's descriptors are derived from SQLite's own (`/proc/self/fd/N`), so SQLite's locks
//! and syncs and our page I/O are on one file whatever happens to its name meanwhile. Page
//! writes go through SQLite's own write method; page reads on a miss through our O_DIRECT
//! descriptor, or SQLite's read method where O_DIRECT is not used.

use super::change_detect::FileWatch;
use super::read_txn::{Opened, ReadTxn};
use super::replica_pos::ReplicaPos;
use super::unix_file::{self, unix, unix_locking, UnixFile};
use crate::api;
use crate::ffi::guard;
use bpe_core::FileIdentity;
use bpe_core::{BehindLog, DeviceOp, Engine, Error, FileHandle, OpenRequest, PinnedPage, Via};
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
    /// The lock SQLite holds, what the look at the read transaction's start left for SQLite's
    /// calls that follow, and what was written under the lock (read_txn.rs).
    txn: ReadTxn,
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
            txn: ReadTxn::new(),
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

    /// The transaction, and the open file it looks at (`real` the unix file underneath).
    fn split(&mut self, real: *mut sqlite3_file) -> (&mut ReadTxn, Opened<'_>) {
        let opened = Opened {
            engine: &self.engine,
            handle: &self.handle,
            watch: &self.watch,
            path: &self.path,
            identity: self.identity,
            replica_pos: self.replica_pos.as_ref(),
            shm0: self.shm0,
            real,
        };
        (&mut self.txn, opened)
    }

    /// A read of the file (`xRead`, `xFetch`): the first of a WAL read transaction looks again
    /// (`ReadTxn::first_read`).
    #[inline]
    fn reading(&mut self, real: *mut sqlite3_file) {
        let (txn, opened) = self.split(real);
        txn.first_read(&opened);
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
        conn.reading(real);
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
            if let Some(h) = conn.txn.take_header() {
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
        conn.reading(real);
        let usable = conn.txn.lock_level() >= SQLITE_LOCK_SHARED
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
        conn.txn.forget_size();
        conn.txn.begin_writing(&conn.watch);
        let rc = if page_shaped(amt, off) {
            conn.write_page(real, data, amt, off)
        } else {
            conn.write_not_page(real, buf, amt, off)
        };
        if rc != SQLITE_OK {
            return rc;
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
        conn.txn.forget_size();
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
            conn.txn.begin_writing(&conn.watch);
            if shrinks(before, size) {
                let pages = (size as u64).div_ceil(conn.handle.page_size() as u64);
                conn.txn.truncated_to(pages);
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
        conn.txn.forget_size();
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
        if let Some(s) = conn.txn.take_size() {
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
        let (txn, opened) = conn.split(real);
        txn.lock(&opened, level)
    })
}

unsafe extern "C" fn unlock(f: *mut sqlite3_file, level: c_int) -> c_int {
    method!(f, SQLITE_IOERR_UNLOCK, "xUnlock", |conn, real| {
        conn.txn.forget_size();
        // Before the lock goes: from then on other connections may read the file. On a failure
        // the pages leave L1 (the file is what they are now); the lock still goes.
        let written_back = conn.write_back_or_discard(real);
        let (txn, opened) = conn.split(real);
        let rc = txn.unlock(&opened, level);
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
        conn.txn.forget_size();
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

unsafe extern "C" fn shm_lock(
    f: *mut sqlite3_file,
    offset: c_int,
    n: c_int,
    flags: c_int,
) -> c_int {
    method!(f, SQLITE_IOERR_SHMLOCK, "xShmLock", |conn, real| {
        let (txn, opened) = conn.split(real);
        txn.shm_lock(&opened, offset, n, flags)
    })
}

impl Conn {
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

    /// `xWrite` of a page: through the core, or held in L1 (`may_write_behind`).
    fn write_page(&mut self, real: *mut sqlite3_file, data: &[u8], amt: c_int, off: i64) -> c_int {
        match adopt_page_size(self, amt) {
            Err(()) => return SQLITE_IOERR_WRITE,
            Ok(true) => {
                // Peers cannot follow a page-size change page by page.
                self.txn.wrote_unloggable();
                // Pages of the old size go first, so that no later write of the file's
                // bytes is overwritten by an earlier one.
                let rc = self.write_back(real);
                if rc != SQLITE_OK {
                    return rc;
                }
            }
            Ok(false) => {}
        }
        let device = UnixFile(real);
        let page = off as u64 / amt as u64;
        let written = if self.may_write_behind() {
            self.engine.write_page_behind(
                &self.handle,
                page,
                data,
                Via(Some(&device)),
                &mut self.behind,
            )
        } else {
            self.engine
                .write_page_via(&self.handle, page, data, Via(Some(&device)))
        };
        if let Err(e) = written {
            return io_code(&e, SQLITE_IOERR_WRITE);
        }
        self.txn.wrote_page(page);
        SQLITE_OK
    }

    /// `xWrite` of anything but a page: written as SQLite asked, and what we cached of the file
    /// is forgotten.
    fn write_not_page(
        &mut self,
        real: *mut sqlite3_file,
        buf: *const c_void,
        amt: c_int,
        off: i64,
    ) -> c_int {
        let rc = self.write_back(real);
        if rc != SQLITE_OK {
            return rc;
        }
        self.txn.wrote_unloggable();
        self.engine
            .charge_data_device(DeviceOp::Write(amt.max(0) as u64));
        let rc = unix!(real, xWrite, buf, amt, off);
        if rc != SQLITE_OK {
            return rc;
        }
        self.engine.invalidate_file(&self.handle);
        SQLITE_OK
    }

    /// Whether a page write may be held in L1 until `write_back`: only under an EXCLUSIVE lock
    /// in rollback mode (no wal-index), which no reader in any process gets past before the
    /// unlock writes the pages back. A WAL checkpoint writes under a SHARED lock while readers
    /// read the file, so it writes through.
    fn may_write_behind(&self) -> bool {
        self.txn.lock_level() == SQLITE_LOCK_EXCLUSIVE && self.shm0.is_null()
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
