//! Files opened through another VFS, named by `bpe_base=NAME` in the database's URI or by
//! `BPE_BASE_VFS`: bpe's tiers under a VFS whose file the engine cannot open itself. The first
//! is Litestream's read-replica VFS, which serves a database straight from object storage.
//!
//! Such a file has no descriptor, no inode and no stamp to watch, so freshness comes from what
//! the base VFS says about the snapshot a connection reads. Litestream names it: each of its
//! connections reads one replicated transaction (`PRAGMA litestream_txid`), holds it while a
//! SHARED lock is held, and moves on only between read transactions. Each snapshot is a file of
//! its own in the engine (`FileIdentity::snapshot`), so connections at different transactions
//! never see each other's pages, and a snapshot's pages, never changing, need no invalidation.
//!
//! The one rule, asserted in `Conn::begin_read`: a read transaction reads through the cache only
//! if the snapshot was named the same just before its SHARED lock and just after (a new
//! transaction arriving in between could otherwise be taken for the old one). Every other read
//! (no name, a name that moved, a connection that wrote, WAL mode) goes to the base VFS as if
//! bpe were not there. Pages of a new snapshot are read again from the base VFS: Litestream
//! says which transaction a connection sees, not which pages it changed.
//!
//! Journals and WAL files of such a database are the base VFS's too, behind plain forwarding.

use super::file::{close_real, page_shaped};
use super::replica_snapshots::Source;
use super::unix_file::UnixFile;
use crate::api;
use crate::ffi::guard;
use bpe_core::{Engine, FileHandle, Via};
use libsqlite3_sys::*;
use std::ffi::{c_char, c_int, c_void, CStr, OsStr};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

/// The pragmas through which a base VFS names the snapshot a connection reads.
const SNAPSHOT_PRAGMAS: &[&CStr] = &[c"litestream_txid"];

/// Read transactions that read around the cache because the base VFS named no snapshot, or
/// one that moved while the lock was taken (for tests and the docs' figures).
pub static UNPINNED_READ_TRANSACTIONS: AtomicU64 = AtomicU64::new(0);
/// Read transactions pinned to one named snapshot, read through the cache.
pub static PINNED_READ_TRANSACTIONS: AtomicU64 = AtomicU64::new(0);

/// Our part of SQLite's file object; the base VFS's file is on the heap (`Conn::real`).
#[repr(C)]
struct BaseFile {
    base: sqlite3_file,
    conn: *mut Conn,
}

/// The base VFS's file object, as large as its szOsFile, 8-byte aligned as SQLite's malloc.
struct RealFile(Box<[u64]>);

impl RealFile {
    fn ptr(&mut self) -> *mut sqlite3_file {
        self.0.as_mut_ptr() as *mut sqlite3_file
    }
}

/// One open file of a base VFS.
pub struct Conn {
    real: RealFile,
    /// Set for a main database in the cache's scope.
    cached: Option<Cached>,
}

/// A main database read through the cache, one snapshot at a time.
struct Cached {
    engine: Arc<Engine>,
    generation: u64,
    path: PathBuf,
    /// Names this file's snapshots and relates them (`replica_snapshots.rs`).
    source: Arc<Source>,
    page_size: usize,
    lock: c_int,
    /// The snapshot this connection last read, kept open between its read transactions.
    snapshot: Option<(u64, FileHandle)>,
    /// An earlier snapshot kept open while `snapshot` takes pages from it (after a restart).
    ancestor: Option<FileHandle>,
    /// The current read transaction reads `snapshot` through the cache.
    pinned: bool,
    /// Wrote, or opened the WAL: its reads go to the base VFS from now on (what a writing
    /// connection reads may differ from the snapshot of the same name).
    around: bool,
}

/// The base VFS named for the file SQLite opens as `name`: its URI's `bpe_base`, else
/// `BPE_BASE_VFS` (read once per process, as the rest of the environment: the lookup walks the
/// environment under a lock at every open of a database, its journal and its WAL). None: the
/// default (unix) VFS.
///
/// # Safety
/// `name` is NULL or a file name SQLite passed to xOpen.
pub unsafe fn base_for(name: *const c_char, flags: c_int) -> Option<String> {
    // Only the files SQLite names after a database follow it; temporary files stay local.
    let named = SQLITE_OPEN_MAIN_DB | SQLITE_OPEN_MAIN_JOURNAL | SQLITE_OPEN_WAL;
    if name.is_null() || flags & named == 0 {
        return None;
    }
    // SAFETY: forwarded contract.
    let from_uri = unsafe { api::uri_parameter(name, c"bpe_base") };
    static FROM_ENV: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    from_uri
        .or_else(|| {
            FROM_ENV
                .get_or_init(|| std::env::var("BPE_BASE_VFS").ok())
                .clone()
        })
        .filter(|v| !v.is_empty())
}

/// Opens `name` through the base VFS `base_name` into `f` (a bpe file object); `cache` for a
/// main database in the cache's scope. Err carries the code and why.
///
/// # Safety
/// As xOpen: `f` has room for our szOsFile, `name` is a file name SQLite passed to xOpen.
pub unsafe fn open(
    base_name: &str,
    name: *const c_char,
    f: *mut sqlite3_file,
    flags: c_int,
    out_flags: *mut c_int,
    cache: bool,
) -> Result<(), (c_int, String)> {
    let cname = api::cstring(base_name);
    let base = api::vfs_find(Some(&cname));
    if base.is_null() {
        return Err((
            SQLITE_CANTOPEN,
            format!("the base VFS \"{base_name}\" is not registered (load its extension first)"),
        ));
    }
    if base == api::vfs_find(Some(c"bpe")) {
        return Err((SQLITE_CANTOPEN, "bpe cannot be its own base VFS".into()));
    }
    // SAFETY: base is a registered VFS, which lives for the process.
    let (size, xopen) = unsafe { ((*base).szOsFile, (*base).xOpen) };
    let xopen = xopen.ok_or((SQLITE_CANTOPEN, format!("the VFS {base_name} cannot open")))?;
    let mut real = RealFile(vec![0u64; (size.max(8) as usize).div_ceil(8)].into_boxed_slice());
    // SAFETY: f is ours; it stays closed (no methods) unless the open below succeeds.
    unsafe { (*f).pMethods = std::ptr::null() };
    // SAFETY: real has room for the base VFS's file object, zeroed; name is SQLite's.
    let rc = unsafe { xopen(base, name, real.ptr(), flags, out_flags) };
    if rc != SQLITE_OK {
        // SAFETY: a failed open may leave methods that must be closed (SQLite's rule for xOpen).
        unsafe { close_real(real.ptr()) };
        return Err((rc, format!("the VFS {base_name} could not open it")));
    }
    let cached = (cache && flags & SQLITE_OPEN_MAIN_DB != 0).then(|| {
        // SAFETY: name is a C string (checked non-null by base_for).
        let name = unsafe { CStr::from_ptr(name) };
        // The name's bytes as they are: a file name need not be UTF-8.
        let path = Path::new(OsStr::from_bytes(name.to_bytes()));
        Cached {
            engine: crate::process::engine(),
            generation: crate::process::generation(),
            // SAFETY: name is a file name SQLite passed to xOpen.
            source: Source::get(
                base_name,
                path,
                unsafe { replica_url(name.as_ptr()) }.as_deref(),
            ),
            path: path.to_path_buf(),
            page_size: 4096,
            lock: SQLITE_LOCK_NONE,
            snapshot: None,
            ancestor: None,
            pinned: false,
            around: false,
        }
    });
    // SAFETY: real was just opened by the base VFS: its methods live as long as the file.
    let methods = methods_for(unsafe { &*(*real.ptr()).pMethods });
    let conn = Box::new(Conn { real, cached });
    let bf = f as *mut BaseFile;
    // SAFETY: f is a bpe file object (at least as large as BaseFile); close() frees conn.
    unsafe {
        (*bf).conn = Box::into_raw(conn);
        (*bf).base.pMethods = methods;
    }
    Ok(())
}

/// The methods SQLite sees for a file whose base VFS's methods are `base`: the shared-memory
/// ones only if the base has them all. SQLite decides whether a file can be in WAL mode from
/// its methods (iVersion 2 or more and an xShmMap; or exclusive locking mode, where the
/// wal-index is on the heap), so a base without shared memory (`unix-none`, say) has WAL
/// refused through bpe exactly as without it: `journal_mode=wal` stays `delete`, and a WAL
/// database cannot be opened.
fn methods_for(base: &sqlite3_io_methods) -> &'static sqlite3_io_methods {
    let shm = base.iVersion >= 2
        && base.xShmMap.is_some()
        && base.xShmLock.is_some()
        && base.xShmBarrier.is_some()
        && base.xShmUnmap.is_some();
    if shm {
        &METHODS_V2
    } else {
        &METHODS_V1
    }
}

/// The base file's method `$m`, called with `$args`; if the base VFS has no such method (SQLite
/// would call a null pointer), the error `$missing`, logged, rather than a panic.
macro_rules! base {
    ($real:expr, $m:ident, $missing:expr $(, $arg:expr)*) => {{
        let real: *mut sqlite3_file = $real;
        // SAFETY: real is an open file of the base VFS, whose methods live as long as it.
        match unsafe { (*(*real).pMethods).$m } {
            // SAFETY: the base VFS's own method, on its own open file, with SQLite's arguments.
            Some(m) => unsafe { m(real $(, $arg)*) },
            None => {
                api::log(
                    SQLITE_MISUSE,
                    concat!("bpe: the base VFS's file has no ", stringify!($m)),
                );
                $missing
            }
        }
    }};
}

/// The replica whose log says which pages each transaction changed: the database URI's
/// `bpe_replica`, else `LITESTREAM_REPLICA_URL` (read once per process).
///
/// # Safety
/// `name` is a file name SQLite passed to xOpen.
unsafe fn replica_url(name: *const c_char) -> Option<String> {
    // SAFETY: forwarded contract.
    let from_uri = unsafe { api::uri_parameter(name, c"bpe_replica") };
    static FROM_ENV: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    from_uri
        .or_else(|| {
            FROM_ENV
                .get_or_init(|| std::env::var("LITESTREAM_REPLICA_URL").ok())
                .clone()
        })
        .filter(|v| !v.is_empty())
}

/// The snapshot the base VFS says `real`'s connection reads now, if it names one.
fn snapshot_name(real: *mut sqlite3_file) -> Option<u64> {
    SNAPSHOT_PRAGMAS.iter().find_map(|pragma| {
        let mut args: [*mut c_char; 3] = [
            std::ptr::null_mut(),
            pragma.as_ptr() as *mut c_char,
            std::ptr::null_mut(),
        ];
        let rc = base!(
            real,
            xFileControl,
            SQLITE_NOTFOUND,
            SQLITE_FCNTL_PRAGMA,
            args.as_mut_ptr() as *mut c_void
        );
        // SAFETY: the base VFS put NULL or an sqlite3_malloc'd string in args[0].
        let text = unsafe { api::take_sqlite_string(args[0]) };
        if rc != SQLITE_OK {
            return None;
        }
        // Litestream's TXID: 16 hex digits.
        u64::from_str_radix(text?.trim(), 16).ok()
    })
}

impl Cached {
    /// Begins a read transaction: takes the SHARED lock, and pins the snapshot it reads if the
    /// base VFS named the same one before and after the lock was taken.
    fn begin_read(&mut self, real: *mut sqlite3_file) -> c_int {
        let before = (!self.around).then(|| snapshot_name(real)).flatten();
        let rc = base!(real, xLock, SQLITE_IOERR_LOCK, SQLITE_LOCK_SHARED);
        if rc != SQLITE_OK {
            return rc;
        }
        self.lock = SQLITE_LOCK_SHARED;
        let after = before.and_then(|_| snapshot_name(real));
        self.pinned = match (before, after) {
            (Some(b), Some(a)) if a == b => self.pin(a),
            _ => false,
        };
        if self.pinned {
            PINNED_READ_TRANSACTIONS.fetch_add(1, Relaxed);
        } else {
            UNPINNED_READ_TRANSACTIONS.fetch_add(1, Relaxed);
        }
        SQLITE_OK
    }

    /// Makes `version` this connection's snapshot. False if the engine cannot open it.
    fn pin(&mut self, version: u64) -> bool {
        if crate::process::generation() != self.generation {
            // A forked child: the parent's engine is not ours to touch (see file.rs).
            if let Some((_, old)) = self.snapshot.take() {
                std::mem::forget(old);
            }
            std::mem::forget(self.ancestor.take());
            std::mem::forget(std::mem::replace(
                &mut self.engine,
                crate::process::engine(),
            ));
            self.generation = crate::process::generation();
        }
        if self.snapshot.as_ref().is_some_and(|(v, _)| *v == version) {
            return true;
        }
        let previous = self.snapshot.take();
        let opened = self.source.open(
            &self.engine,
            &self.path,
            self.page_size,
            version,
            previous.as_ref().map(|(v, h)| (*v, h)),
        );
        for old in previous
            .map(|(_, h)| h)
            .into_iter()
            .chain(self.ancestor.take())
        {
            self.engine.close_file(&old);
        }
        match opened {
            Ok(o) => {
                self.snapshot = Some((version, o.handle));
                self.ancestor = o.ancestor;
                true
            }
            Err(_) => false,
        }
    }

    /// The snapshot the current read transaction reads through the cache, if any.
    fn pinned_snapshot(&self) -> Option<&FileHandle> {
        let pinned = self.pinned && !self.around && self.lock >= SQLITE_LOCK_SHARED;
        self.snapshot.as_ref().filter(|_| pinned).map(|(_, h)| h)
    }
}

/// # Safety
/// `f` is an open base file object (open() succeeded); SQLite serializes calls per file.
unsafe fn parts<'a>(f: *mut sqlite3_file) -> (&'a mut Conn, *mut sqlite3_file) {
    // SAFETY: forwarded contract.
    let conn = unsafe { &mut *(*(f as *mut BaseFile)).conn };
    let real = conn.real.ptr();
    (conn, real)
}

/// Runs a method body on the connection, with panics made errors.
macro_rules! method {
    ($f:expr, $fallback:expr, $name:expr, |$conn:ident, $real:ident| $body:expr) => {
        guard($fallback, $name, || {
            // SAFETY: SQLite calls these methods only on files open() installed them on.
            let ($conn, $real) = unsafe { parts($f) };
            $body
        })
    };
}

/// Forwards method `$m` to the base VFS's file.
macro_rules! forward {
    ($fname:ident, $m:ident, $fallback:expr $(, $arg:ident : $ty:ty)*) => {
        unsafe extern "C" fn $fname(f: *mut sqlite3_file $(, $arg: $ty)*) -> c_int {
            method!(f, $fallback, stringify!($m), |_conn, real| base!(real, $m, $fallback $(, $arg)*))
        }
    };
}

unsafe extern "C" fn close(f: *mut sqlite3_file) -> c_int {
    guard(SQLITE_IOERR_CLOSE, "xClose", || {
        let bf = f as *mut BaseFile;
        // SAFETY: f was installed by open(); conn is taken back exactly once.
        let mut conn = unsafe { Box::from_raw((*bf).conn) };
        // SAFETY: as above.
        unsafe { (*bf).conn = std::ptr::null_mut() };
        if let Some(c) = conn.cached.as_mut() {
            let handles = c.snapshot.take().map(|(_, h)| h).into_iter();
            for handle in handles.chain(c.ancestor.take()) {
                if c.generation == crate::process::generation() {
                    c.engine.close_file(&handle);
                }
            }
        }
        // SAFETY: the base file is open and closed exactly once here.
        unsafe { close_real(conn.real.ptr()) }
    })
}

unsafe extern "C" fn read(f: *mut sqlite3_file, buf: *mut c_void, amt: c_int, off: i64) -> c_int {
    method!(f, SQLITE_IOERR_READ, "xRead", |conn, real| {
        let Some(c) = conn.cached.as_mut() else {
            return base!(real, xRead, SQLITE_IOERR_READ, buf, amt, off);
        };
        if page_shaped(amt, off) && c.page_size != amt as usize {
            // SQLite reads whole pages: this is the file's page size (a new key for the
            // snapshot's pages, as for any file whose page size changes).
            c.page_size = amt as usize;
            if let Some((_, h)) = &c.snapshot {
                if c.engine.set_page_size(h, amt as usize).is_err() {
                    c.pinned = false;
                }
            }
        }
        let Some(handle) = c.pinned_snapshot().filter(|_| page_shaped(amt, off)) else {
            return base!(real, xRead, SQLITE_IOERR_READ, buf, amt, off);
        };
        // SAFETY: buf has amt writable bytes.
        let out = unsafe { std::slice::from_raw_parts_mut(buf as *mut u8, amt as usize) };
        let device = UnixFile(real);
        let page = off as u64 / amt as u64;
        match c
            .engine
            .read_page_via(handle, page, out, Via(Some(&device)))
        {
            Ok(r) if r.len == out.len() => SQLITE_OK,
            Ok(_) => SQLITE_IOERR_SHORT_READ,
            Err(_) => SQLITE_IOERR_READ,
        }
    })
}

unsafe extern "C" fn write(
    f: *mut sqlite3_file,
    buf: *const c_void,
    amt: c_int,
    off: i64,
) -> c_int {
    method!(f, SQLITE_IOERR_WRITE, "xWrite", |conn, real| {
        if let Some(c) = conn.cached.as_mut() {
            c.around = true;
        }
        base!(real, xWrite, SQLITE_IOERR_WRITE, buf, amt, off)
    })
}

unsafe extern "C" fn truncate(f: *mut sqlite3_file, size: i64) -> c_int {
    method!(f, SQLITE_IOERR_TRUNCATE, "xTruncate", |conn, real| {
        if let Some(c) = conn.cached.as_mut() {
            c.around = true;
        }
        base!(real, xTruncate, SQLITE_IOERR_TRUNCATE, size)
    })
}

unsafe extern "C" fn lock(f: *mut sqlite3_file, level: c_int) -> c_int {
    method!(f, SQLITE_IOERR_LOCK, "xLock", |conn, real| {
        match conn.cached.as_mut() {
            Some(c) if c.lock == SQLITE_LOCK_NONE && level == SQLITE_LOCK_SHARED => {
                c.begin_read(real)
            }
            Some(c) => {
                let rc = base!(real, xLock, SQLITE_IOERR_LOCK, level);
                if rc == SQLITE_OK {
                    c.lock = c.lock.max(level);
                }
                rc
            }
            None => base!(real, xLock, SQLITE_IOERR_LOCK, level),
        }
    })
}

unsafe extern "C" fn unlock(f: *mut sqlite3_file, level: c_int) -> c_int {
    method!(f, SQLITE_IOERR_UNLOCK, "xUnlock", |conn, real| {
        let rc = base!(real, xUnlock, SQLITE_IOERR_UNLOCK, level);
        if let Some(c) = conn.cached.as_mut() {
            c.lock = c.lock.min(level);
            if level == SQLITE_LOCK_NONE {
                c.pinned = false;
            }
        }
        rc
    })
}

unsafe extern "C" fn file_control(f: *mut sqlite3_file, op: c_int, arg: *mut c_void) -> c_int {
    method!(f, SQLITE_ERROR, "xFileControl", |_conn, real| {
        if op == SQLITE_FCNTL_PRAGMA {
            if let Some(rc) = super::file::bpe_pragma(arg) {
                return rc;
            }
        }
        base!(real, xFileControl, SQLITE_NOTFOUND, op, arg)
    })
}

unsafe extern "C" fn shm_map(
    f: *mut sqlite3_file,
    region: c_int,
    size: c_int,
    extend: c_int,
    out: *mut *mut c_void,
) -> c_int {
    method!(f, SQLITE_IOERR_SHMMAP, "xShmMap", |conn, real| {
        // WAL mode: a snapshot name may not cover the WAL's frames; read around the cache.
        if let Some(c) = conn.cached.as_mut() {
            c.around = true;
        }
        base!(
            real,
            xShmMap,
            SQLITE_IOERR_SHMMAP,
            region,
            size,
            extend,
            out
        )
    })
}

forward!(sync, xSync, SQLITE_IOERR_FSYNC, flags: c_int);
forward!(file_size, xFileSize, SQLITE_IOERR_FSTAT, size: *mut i64);
forward!(check_reserved_lock, xCheckReservedLock, SQLITE_IOERR_CHECKRESERVEDLOCK, out: *mut c_int);
forward!(sector_size, xSectorSize, 4096);
forward!(device_characteristics, xDeviceCharacteristics, 0);
forward!(shm_lock, xShmLock, SQLITE_IOERR_SHMLOCK, offset: c_int, n: c_int, flags: c_int);
forward!(shm_unmap, xShmUnmap, SQLITE_IOERR_SHMMAP, delete: c_int);

unsafe extern "C" fn shm_barrier(f: *mut sqlite3_file) {
    guard((), "xShmBarrier", || {
        // SAFETY: SQLite calls this only on files open() installed.
        let (_, real) = unsafe { parts(f) };
        base!(real, xShmBarrier, ())
    })
}

/// Without xFetch: SQLite never memory-maps past the cache.
static METHODS_V1: sqlite3_io_methods = io_methods!(1);
static METHODS_V2: sqlite3_io_methods = io_methods!(2);
