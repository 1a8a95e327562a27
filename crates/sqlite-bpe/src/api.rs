//! The adapter's FFI edge: SQLite's API as reached through `shim.c`. Nothing else in the crate
//! calls SQLite. The wrappers take care of C strings and SQLite-owned memory.

use libsqlite3_sys::{
    sqlite3, sqlite3_api_routines, sqlite3_context, sqlite3_module, sqlite3_value, sqlite3_vfs,
};
use std::ffi::{c_char, c_int, c_void, CStr, CString};

pub type ScalarFn = unsafe extern "C" fn(*mut sqlite3_context, c_int, *mut *mut sqlite3_value);

extern "C" {
    fn bpe_shim_has_api() -> c_int;
    fn bpe_shim_bind(api: *const sqlite3_api_routines) -> *const sqlite3_api_routines;
    fn bpe_api_libversion(api: *const sqlite3_api_routines) -> *const c_char;
    fn bpe_api_function(api: *const sqlite3_api_routines) -> *mut c_void;
    fn bpe_api_malloc(api: *const sqlite3_api_routines, n: c_int) -> *mut c_void;
    fn bpe_vfs_find(name: *const c_char) -> *mut sqlite3_vfs;
    fn bpe_vfs_register(vfs: *mut sqlite3_vfs, make_default: c_int) -> c_int;
    fn bpe_auto_extension(entry: Option<unsafe extern "C" fn()>) -> c_int;
    fn bpe_log(code: c_int, msg: *const c_char);
    fn bpe_malloc(n: c_int) -> *mut c_void;
    fn bpe_free(p: *mut c_void);
    fn bpe_uri_parameter(name: *const c_char, param: *const c_char) -> *const c_char;
    fn bpe_uri_boolean(name: *const c_char, param: *const c_char, dflt: c_int) -> c_int;
    fn bpe_libversion_number() -> c_int;
    fn bpe_mutex_alloc(id: c_int) -> *mut c_void;
    fn bpe_mutex_try(m: *mut c_void) -> c_int;
    fn bpe_mutex_leave(m: *mut c_void);
    fn bpe_create_function(
        db: *mut sqlite3,
        name: *const c_char,
        nargs: c_int,
        flags: c_int,
        app: *mut c_void,
        f: Option<ScalarFn>,
    ) -> c_int;
    fn bpe_create_module(
        db: *mut sqlite3,
        name: *const c_char,
        m: *const sqlite3_module,
        aux: *mut c_void,
    ) -> c_int;
    fn bpe_declare_vtab(db: *mut sqlite3, sql: *const c_char) -> c_int;
    fn bpe_result_text(c: *mut sqlite3_context, s: *const c_char, n: c_int);
    fn bpe_result_int64(c: *mut sqlite3_context, v: i64);
    fn bpe_result_null(c: *mut sqlite3_context);
    fn bpe_result_error(c: *mut sqlite3_context, s: *const c_char, n: c_int);
    fn bpe_value_text(v: *mut sqlite3_value) -> *const u8;
    fn bpe_value_bytes(v: *mut sqlite3_value) -> c_int;
    fn bpe_value_type(v: *mut sqlite3_value) -> c_int;
    fn bpe_value_int64(v: *mut sqlite3_value) -> i64;
    fn bpe_context_db_handle(c: *mut sqlite3_context) -> *mut sqlite3;
    fn bpe_db_filename(db: *mut sqlite3, name: *const c_char) -> *const c_char;
}

/// Points the shim at `api` if it points at no SQLite yet, or at this one already. Otherwise
/// another SQLite library of this process loaded the extension first: the shim stays bound to
/// it, and the error says which library is bound and which one asked.
///
/// One library per process, because everything registered lives in the library it was
/// registered with: the `bpe` VFS, the auto-extension, the functions and virtual tables, and
/// the shim's one routines table, which every callback (a VFS method, a function result) calls
/// back through.
///
/// # Safety
/// `api` must be a routines table SQLite handed us (extension entry point or auto-extension) and
/// stays valid for the life of the process.
pub unsafe fn bind(api: *const sqlite3_api_routines) -> Result<(), String> {
    if api.is_null() {
        return Err("the host passed no SQLite routines table".into());
    }
    // SAFETY: a compare-and-swap of the shim's pointer.
    let bound = unsafe { bpe_shim_bind(api) };
    if bound == api {
        return Ok(());
    }
    // SAFETY: both are routines tables SQLite handed the extension (the bound one stays valid
    // for the life of the process).
    let (first, this) = unsafe { (describe(bound), describe(api)) };
    Err(format!(
        "sqlite-bpe is already bound to another SQLite library in this process ({first}); \
         this one is {this}: load it into one SQLite library per process (its `bpe` VFS, pool \
         and functions are registered with the first, and this library does not know them)"
    ))
}

/// `SQLite 3.40.1 in /usr/lib/x86_64-linux-gnu/libsqlite3.so.0`: the library behind a routines
/// table, and the file it was loaded from (a shared library, or the program or module that
/// links SQLite in).
///
/// # Safety
/// `api` must be a routines table SQLite handed us.
unsafe fn describe(api: *const sqlite3_api_routines) -> String {
    // SAFETY: forwarded contract; sqlite3_libversion returns a static string.
    let version = unsafe { CStr::from_ptr(bpe_api_libversion(api)) }.to_string_lossy();
    // SAFETY: Dl_info is plain data (pointers and integers): all zeroes is a valid value.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: dladdr only reads the address and fills `info`.
    let found = unsafe { libc::dladdr(bpe_api_function(api), &mut info) } != 0;
    if !found || info.dli_fname.is_null() {
        return format!("SQLite {version}");
    }
    // SAFETY: dladdr's file name is a C string owned by the loader.
    let file = unsafe { CStr::from_ptr(info.dli_fname) }.to_string_lossy();
    format!("SQLite {version} in {file}")
}

/// A copy of `s` in memory from the sqlite3_malloc of the library behind `api`, for an
/// out-parameter that library will sqlite3_free.
///
/// # Safety
/// `api` must be a routines table SQLite handed us.
pub unsafe fn sqlite_string_for(api: *const sqlite3_api_routines, s: &str) -> *mut c_char {
    let bytes = s.as_bytes();
    // SAFETY: we write len+1 bytes into a block of that size (or return NULL on OOM).
    unsafe {
        let p = bpe_api_malloc(api, bytes.len() as c_int + 1) as *mut u8;
        if !p.is_null() {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), p, bytes.len());
            *p.add(bytes.len()) = 0;
        }
        p as *mut c_char
    }
}

pub fn has_api() -> bool {
    // SAFETY: reads a pointer the shim owns.
    unsafe { bpe_shim_has_api() != 0 }
}

pub fn vfs_find(name: Option<&CStr>) -> *mut sqlite3_vfs {
    // SAFETY: name is a valid C string or NULL (the default VFS).
    unsafe { bpe_vfs_find(name.map_or(std::ptr::null(), CStr::as_ptr)) }
}

/// # Safety
/// `vfs` must stay valid and unmoved for the life of the process.
pub unsafe fn vfs_register(vfs: *mut sqlite3_vfs, make_default: bool) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { bpe_vfs_register(vfs, c_int::from(make_default)) }
}

pub fn auto_extension(
    entry: unsafe extern "C" fn(
        *mut sqlite3,
        *mut *mut c_char,
        *const sqlite3_api_routines,
    ) -> c_int,
) -> c_int {
    // SAFETY: SQLite calls the entry point with exactly this signature; its prototype in the C API
    // is declared as void(*)(void) for historical reasons, hence the cast.
    unsafe {
        let f: unsafe extern "C" fn() = std::mem::transmute(entry as *const ());
        bpe_auto_extension(Some(f))
    }
}

/// The SQLite library's version as a number (3040001 for 3.40.1).
pub fn libversion_number() -> c_int {
    // SAFETY: a plain query of the library.
    unsafe { bpe_libversion_number() }
}

/// SQLite's static mutexes (`SQLITE_MUTEX_STATIC_*`), taken with try-lock only: for the fork
/// handlers, which must never block for good.
pub mod static_mutex {
    use super::*;

    /// The static mutex `id`, or NULL where SQLite has no mutexes (single-threaded builds).
    pub fn get(id: c_int) -> *mut c_void {
        if !has_api() {
            return std::ptr::null_mut();
        }
        // SAFETY: static mutexes are allocated once by SQLite and never freed.
        unsafe { bpe_mutex_alloc(id) }
    }

    /// # Safety
    /// `m` is a mutex from `get`.
    pub unsafe fn try_enter(m: *mut c_void) -> bool {
        // SAFETY: forwarded contract.
        unsafe { bpe_mutex_try(m) == 0 }
    }

    /// # Safety
    /// `m` was entered by this thread (or, in a forked child, by the thread that forked).
    pub unsafe fn leave(m: *mut c_void) {
        // SAFETY: forwarded contract.
        unsafe { bpe_mutex_leave(m) }
    }
}

pub fn log(code: c_int, msg: &str) {
    let msg = cstring(msg);
    // SAFETY: msg is a valid C string for the call.
    unsafe { bpe_log(code, msg.as_ptr()) }
}

/// A copy of `s` in memory from sqlite3_malloc, for out-parameters SQLite will sqlite3_free.
pub fn sqlite_string(s: &str) -> *mut c_char {
    let bytes = s.as_bytes();
    // SAFETY: we write len+1 bytes into a block of that size (or return NULL on OOM).
    unsafe {
        let p = bpe_malloc(bytes.len() as c_int + 1) as *mut u8;
        if !p.is_null() {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), p, bytes.len());
            *p.add(bytes.len()) = 0;
        }
        p as *mut c_char
    }
}

/// Takes a string SQLite allocated (an out-parameter of a VFS method), freeing it.
///
/// # Safety
/// `p` is NULL or a NUL-terminated string from sqlite3_malloc, not used after this call.
pub unsafe fn take_sqlite_string(p: *mut c_char) -> Option<String> {
    if p.is_null() {
        return None;
    }
    // SAFETY: forwarded contract.
    let s = unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned();
    // SAFETY: p came from sqlite3_malloc and is freed once.
    unsafe { bpe_free(p as *mut c_void) };
    Some(s)
}

/// The value of URI parameter `param` of a file name SQLite passed to xOpen (a database's,
/// or its journal's or WAL's: SQLite finds the database's parameters from either).
///
/// # Safety
/// `name` is a file name SQLite passed to xOpen, for the duration of that open.
pub unsafe fn uri_parameter(name: *const c_char, param: &CStr) -> Option<String> {
    if name.is_null() {
        return None;
    }
    // SAFETY: forwarded contract; param is a C string.
    let v = unsafe { bpe_uri_parameter(name, param.as_ptr()) };
    // SAFETY: SQLite returns NULL or a string that lives as long as the file name.
    (!v.is_null()).then(|| unsafe { CStr::from_ptr(v) }.to_string_lossy().into_owned())
}

/// URI parameter `param` of connection `db`'s main database read as SQLite reads its own
/// booleans (`1`/`0`, `yes`/`no`, `on`/`off`, `true`/`false`); `default` where the parameter is
/// absent or not a boolean, and for a temporary or in-memory main database.
///
/// # Safety
/// `db` is an open connection whose main database is attached (from the end of its open on,
/// e.g. in an auto-extension).
pub unsafe fn main_db_uri_boolean(db: *mut sqlite3, param: &CStr, default: bool) -> bool {
    // SAFETY: forwarded contract: sqlite3_db_filename returns NULL or the main database's name
    // as SQLite keeps it, with its URI parameters after it, valid while we read them here.
    unsafe {
        let name = bpe_db_filename(db, c"main".as_ptr());
        if name.is_null() {
            return default;
        }
        bpe_uri_boolean(name, param.as_ptr(), c_int::from(default)) != 0
    }
}

/// A C string of `s`, with any interior NUL cut off there.
pub fn cstring(s: &str) -> CString {
    let end = s.find('\0').unwrap_or(s.len());
    CString::new(&s[..end]).expect("no interior NUL")
}

/// A UTF-8 function; `flags` adds SQLite's function flags (`SQLITE_DIRECTONLY`...).
///
/// # Safety
/// `db` must be an open connection; `app` must outlive it.
pub unsafe fn create_function(
    db: *mut sqlite3,
    name: &CStr,
    nargs: c_int,
    flags: c_int,
    app: *mut c_void,
    f: ScalarFn,
) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { bpe_create_function(db, name.as_ptr(), nargs, flags, app, Some(f)) }
}

/// # Safety
/// `db` must be an open connection; `module` and `aux` must be 'static.
pub unsafe fn create_module(
    db: *mut sqlite3,
    name: &CStr,
    module: &'static sqlite3_module,
    aux: *mut c_void,
) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { bpe_create_module(db, name.as_ptr(), module, aux) }
}

/// # Safety
/// Only from within xConnect of a virtual table on `db`.
pub unsafe fn declare_vtab(db: *mut sqlite3, sql: &CStr) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { bpe_declare_vtab(db, sql.as_ptr()) }
}

/// A function or virtual-table column result. `ctx` must be the context SQLite passed in.
pub struct Context(pub *mut sqlite3_context);

impl Context {
    pub fn text(&self, s: &str) {
        // SAFETY: ctx is live for this callback; SQLite copies the bytes (SQLITE_TRANSIENT).
        unsafe { bpe_result_text(self.0, s.as_ptr() as *const c_char, s.len() as c_int) }
    }
    pub fn int(&self, v: i64) {
        // SAFETY: ctx is live for this callback.
        unsafe { bpe_result_int64(self.0, v) }
    }
    /// The text, or NULL.
    pub fn text_or_null(&self, s: Option<&str>) {
        match s {
            Some(s) => self.text(s),
            None => self.null(),
        }
    }
    pub fn null(&self) {
        // SAFETY: ctx is live for this callback.
        unsafe { bpe_result_null(self.0) }
    }
    /// The calling connection's main database file, its name's bytes as they are (a file name
    /// need not be UTF-8; the VFS keeps it so too). None for a temporary or in-memory one.
    pub fn main_db_filename(&self) -> Option<std::path::PathBuf> {
        use std::os::unix::ffi::OsStrExt;
        // SAFETY: ctx is live for this callback, so is its connection; SQLite owns the returned
        // string for as long as the database stays attached, and we copy it at once.
        unsafe {
            let db = bpe_context_db_handle(self.0);
            let p = bpe_db_filename(db, c"main".as_ptr());
            if p.is_null() {
                return None;
            }
            let name = CStr::from_ptr(p).to_bytes();
            (!name.is_empty()).then(|| std::ffi::OsStr::from_bytes(name).into())
        }
    }
    pub fn error(&self, msg: &str) {
        // SAFETY: ctx is live for this callback; SQLite copies the message.
        unsafe { bpe_result_error(self.0, msg.as_ptr() as *const c_char, msg.len() as c_int) }
    }
}

/// The text of an argument value (None for NULL or invalid UTF-8).
///
/// # Safety
/// `v` must be an argument SQLite passed to the current callback.
pub unsafe fn value_text(v: *mut sqlite3_value) -> Option<String> {
    // SAFETY: forwarded contract; the text pointer is valid for value_bytes bytes until the
    // callback returns, and we copy it at once.
    unsafe {
        let p = bpe_value_text(v);
        if p.is_null() {
            return None;
        }
        let n = bpe_value_bytes(v) as usize;
        std::str::from_utf8(std::slice::from_raw_parts(p, n))
            .ok()
            .map(str::to_owned)
    }
}

/// An integer argument (None for NULL).
///
/// # Safety
/// `v` must be an argument SQLite passed to the current callback.
pub unsafe fn value_int(v: *mut sqlite3_value) -> Option<i64> {
    const SQLITE_NULL: c_int = 5;
    // SAFETY: forwarded contract.
    unsafe { (bpe_value_type(v) != SQLITE_NULL).then(|| bpe_value_int64(v)) }
}
