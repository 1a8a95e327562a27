//! SQLite's own file underneath ours: calling its methods, reaching its descriptor, and using it
//! as the engine's device for page writes (and for reads where O_DIRECT is not used), so that
//! SQLite's I/O hooks (chunk sizes, simulated I/O errors in its test builds, system-call
//! overrides) see our page I/O as they see their own.

use bpe_core::{DataDevice, FileIdentity};
use libsqlite3_sys::{sqlite3_file, sqlite3_vfs, SQLITE_IOERR_SHORT_READ, SQLITE_OK};
use std::ffi::{c_int, c_void};

/// The unix file's method `$m`, called with `$args`.
macro_rules! unix {
    ($real:expr, $m:ident $(, $arg:expr)*) => {{
        let real: *mut libsqlite3_sys::sqlite3_file = $real;
        // SAFETY: real is an open unix file; the unix VFS implements every method of version 3.
        unsafe { ((*(*real).pMethods).$m.expect(stringify!($m)))(real $(, $arg)*) }
    }};
}
pub(crate) use unix;

/// As [`unix!`], for the methods that may take one of the unix VFS's per-file mutexes (locks,
/// shared memory, close): the call is one a fork waits for (`process::base_call`).
macro_rules! unix_locking {
    ($real:expr, $m:ident $(, $arg:expr)*) => {{
        let _call = crate::process::base_call();
        $crate::vfs::unix_file::unix!($real, $m $(, $arg)*)
    }};
}
pub(crate) use unix_locking;

/// An SQLite result code carried through an `io::Error`, so that the code SQLite's own method
/// returned reaches the application unchanged.
#[derive(Debug)]
pub struct SqliteCode(pub c_int);

impl std::fmt::Display for SqliteCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SQLite I/O error {}", self.0)
    }
}

impl std::error::Error for SqliteCode {}

/// The SQLite code an I/O error stands for, if it carries one.
pub fn sqlite_code(e: &std::io::Error) -> Option<c_int> {
    e.get_ref()
        .and_then(|inner| inner.downcast_ref::<SqliteCode>())
        .map(|c| c.0)
}

/// An SQLite result code as an I/O result, the code carried in the error.
fn as_io(rc: c_int) -> std::io::Result<()> {
    match rc {
        SQLITE_OK => Ok(()),
        rc => Err(std::io::Error::other(SqliteCode(rc))),
    }
}

/// The unix file of one connection, as a device.
pub struct UnixFile(pub *mut sqlite3_file);

impl DataDevice for UnixFile {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<usize> {
        let (ptr, len) = (buf.as_mut_ptr() as *mut c_void, buf.len() as c_int);
        let rc = unix!(self.0, xRead, ptr, len, offset as i64);
        if rc != SQLITE_IOERR_SHORT_READ {
            return as_io(rc).map(|()| buf.len());
        }
        // SQLite zero-filled the rest; how much was there is the file's size.
        let mut size = 0i64;
        as_io(unix!(self.0, xFileSize, &mut size))?;
        Ok((size.max(0) as u64)
            .saturating_sub(offset)
            .min(buf.len() as u64) as usize)
    }

    fn write_at(&self, offset: u64, data: &[u8]) -> std::io::Result<()> {
        let (ptr, len) = (data.as_ptr() as *const c_void, data.len() as c_int);
        as_io(unix!(self.0, xWrite, ptr, len, offset as i64))
    }
}

/// The first fields of os_unix.c's `struct unixFile`, unchanged since SQLite 3.6 (2008).
#[repr(C)]
struct UnixFileHead {
    methods: *const c_void,
    vfs: *mut sqlite3_vfs,
    inode: *mut c_void,
    h: c_int,
}

/// The descriptor of a file opened by the unix VFS `vfs`, if `file` is one: its second field
/// must be that VFS (which confirms the layout) and the descriptor must be open.
///
/// # Safety
/// `file` must be an open file of SQLite's VFS, at least as large as its szOsFile.
pub unsafe fn descriptor(file: *mut sqlite3_file, vfs: *mut sqlite3_vfs) -> Option<c_int> {
    // SAFETY: every unix-family file begins with these four fields; we read them only if the
    // VFS pointer in the second confirms that this is such a file.
    let head = unsafe { &*(file as *const UnixFileHead) };
    if vfs.is_null() || head.vfs != vfs || head.h < 0 {
        return None;
    }
    // SAFETY: F_GETFD only asks whether the descriptor is open.
    (unsafe { libc::fcntl(head.h, libc::F_GETFD) } >= 0).then_some(head.h)
}

/// The identity of the file an open descriptor refers to.
pub fn identity_of(fd: c_int) -> Option<FileIdentity> {
    // SAFETY: stat is plain data; fstat fills it for an open descriptor.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: st is valid for writes.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return None;
    }
    Some(FileIdentity {
        dev: st.st_dev,
        ino: st.st_ino,
    })
}
