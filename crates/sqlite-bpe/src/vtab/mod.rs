//! Read-only eponymous virtual tables over snapshots of the engine's state. One generic module;
//! each table is a schema plus a function producing its rows when a query starts.

mod tables;

use crate::api::{self, Context};
use libsqlite3_sys::{
    sqlite3, sqlite3_context, sqlite3_index_info, sqlite3_int64, sqlite3_module, sqlite3_value,
    sqlite3_vtab, sqlite3_vtab_cursor, SQLITE_ERROR, SQLITE_OK,
};
use std::ffi::{c_char, c_int, c_void, CStr};

pub enum Value {
    Null,
    Int(i64),
    Text(String),
}

pub struct TableDef {
    pub name: &'static CStr,
    pub schema: &'static CStr,
    pub rows: fn() -> Vec<Vec<Value>>,
}

pub fn register(db: *mut sqlite3) -> Result<(), String> {
    for def in tables::ALL {
        // SAFETY: db is live; MODULE and def are statics.
        let rc = unsafe {
            api::create_module(
                db,
                def.name,
                &MODULE,
                *def as *const TableDef as *mut c_void,
            )
        };
        if rc != SQLITE_OK {
            return Err(format!(
                "cannot create virtual table {:?} (SQLite error {rc})",
                def.name
            ));
        }
    }
    Ok(())
}

#[repr(C)]
struct Table {
    base: sqlite3_vtab,
    def: &'static TableDef,
}

#[repr(C)]
struct Cursor {
    base: sqlite3_vtab_cursor,
    rows: Vec<Vec<Value>>,
    pos: usize,
}

static MODULE: sqlite3_module = sqlite3_module {
    iVersion: 0,
    // No xCreate: eponymous-only, the table exists under the module's name on every connection.
    xCreate: None,
    xConnect: Some(connect),
    xBestIndex: Some(best_index),
    xDisconnect: Some(disconnect),
    xDestroy: Some(disconnect),
    xOpen: Some(open),
    xClose: Some(close),
    xFilter: Some(filter),
    xNext: Some(next),
    xEof: Some(eof),
    xColumn: Some(column),
    xRowid: Some(rowid),
    // SAFETY: the remaining members are optional callbacks; all-zero bytes are None.
    ..unsafe { std::mem::zeroed() }
};

/// The `extern "C"` method SQLite calls, `$name`: runs `$inner` with a panic made SQLITE_ERROR.
macro_rules! guarded {
    ($name:ident => $inner:ident($($arg:ident: $ty:ty),*)) => {
        unsafe extern "C" fn $name($($arg: $ty),*) -> c_int {
            crate::ffi::guard(SQLITE_ERROR, concat!("virtual table x", stringify!($name)), || {
                // SAFETY: forwarded from SQLite's call; $inner has the method's contract.
                unsafe { $inner($($arg),*) }
            })
        }
    };
}

guarded!(connect => connect_inner(db: *mut sqlite3, aux: *mut c_void, _argc: c_int, _argv: *const *const c_char, out: *mut *mut sqlite3_vtab, _err: *mut *mut c_char));
guarded!(disconnect => disconnect_inner(vtab: *mut sqlite3_vtab));
guarded!(best_index => best_index_inner(_vtab: *mut sqlite3_vtab, info: *mut sqlite3_index_info));
guarded!(open => open_inner(_vtab: *mut sqlite3_vtab, out: *mut *mut sqlite3_vtab_cursor));
guarded!(close => close_inner(cur: *mut sqlite3_vtab_cursor));
guarded!(filter => filter_inner(cur: *mut sqlite3_vtab_cursor, _idx: c_int, _idx_str: *const c_char, _argc: c_int, _argv: *mut *mut sqlite3_value));
guarded!(next => next_inner(cur: *mut sqlite3_vtab_cursor));
guarded!(eof => eof_inner(cur: *mut sqlite3_vtab_cursor));
guarded!(column => column_inner(cur: *mut sqlite3_vtab_cursor, ctx: *mut sqlite3_context, i: c_int));
guarded!(rowid => rowid_inner(cur: *mut sqlite3_vtab_cursor, out: *mut sqlite3_int64));

/// # Safety
/// As the virtual-table method it implements.
unsafe fn connect_inner(
    db: *mut sqlite3,
    aux: *mut c_void,
    _argc: c_int,
    _argv: *const *const c_char,
    out: *mut *mut sqlite3_vtab,
    _err: *mut *mut c_char,
) -> c_int {
    // SAFETY: aux is the &'static TableDef given to create_module.
    let def: &'static TableDef = unsafe { &*(aux as *const TableDef) };
    // SAFETY: we are inside xConnect on db.
    let rc = unsafe { api::declare_vtab(db, def.schema) };
    if rc != SQLITE_OK {
        return rc;
    }
    let table = Box::new(Table {
        // SAFETY: sqlite3_vtab is plain data; SQLite fills it in.
        base: unsafe { std::mem::zeroed() },
        def,
    });
    // SAFETY: out is SQLite's out-pointer; disconnect frees the box.
    unsafe { *out = Box::into_raw(table) as *mut sqlite3_vtab };
    SQLITE_OK
}

/// # Safety
/// As the virtual-table method it implements.
unsafe fn disconnect_inner(vtab: *mut sqlite3_vtab) -> c_int {
    // SAFETY: vtab was made by connect from a Box<Table>.
    drop(unsafe { Box::from_raw(vtab as *mut Table) });
    SQLITE_OK
}

/// # Safety
/// As the virtual-table method it implements.
unsafe fn best_index_inner(_vtab: *mut sqlite3_vtab, info: *mut sqlite3_index_info) -> c_int {
    // Full scans only: the tables are small snapshots.
    // SAFETY: info is SQLite's, valid for this call.
    unsafe { (*info).estimatedCost = 1000.0 };
    SQLITE_OK
}

/// # Safety
/// As the virtual-table method it implements.
unsafe fn open_inner(_vtab: *mut sqlite3_vtab, out: *mut *mut sqlite3_vtab_cursor) -> c_int {
    let cursor = Box::new(Cursor {
        // SAFETY: plain data, filled in by SQLite.
        base: unsafe { std::mem::zeroed() },
        rows: Vec::new(),
        pos: 0,
    });
    // SAFETY: out is SQLite's out-pointer; close frees the box.
    unsafe { *out = Box::into_raw(cursor) as *mut sqlite3_vtab_cursor };
    SQLITE_OK
}

/// # Safety
/// As the virtual-table method it implements.
unsafe fn close_inner(cur: *mut sqlite3_vtab_cursor) -> c_int {
    // SAFETY: made by open from a Box<Cursor>.
    drop(unsafe { Box::from_raw(cur as *mut Cursor) });
    SQLITE_OK
}

/// # Safety
/// As the virtual-table method it implements.
unsafe fn filter_inner(
    cur: *mut sqlite3_vtab_cursor,
    _idx: c_int,
    _idx_str: *const c_char,
    _argc: c_int,
    _argv: *mut *mut sqlite3_value,
) -> c_int {
    // SAFETY: cur is our Cursor; its pVtab is our Table (set by SQLite from connect's result).
    let cursor = unsafe { &mut *(cur as *mut Cursor) };
    // SAFETY: SQLite set pVtab to the table connect() made, which outlives its cursors.
    let table = unsafe { &*(cursor.base.pVtab as *const Table) };
    cursor.rows = (table.def.rows)();
    cursor.pos = 0;
    SQLITE_OK
}

/// # Safety
/// As the virtual-table method it implements.
unsafe fn next_inner(cur: *mut sqlite3_vtab_cursor) -> c_int {
    // SAFETY: cur is our Cursor.
    unsafe { (*(cur as *mut Cursor)).pos += 1 };
    SQLITE_OK
}

/// # Safety
/// As the virtual-table method it implements.
unsafe fn eof_inner(cur: *mut sqlite3_vtab_cursor) -> c_int {
    // SAFETY: cur is our Cursor.
    let cursor = unsafe { &*(cur as *const Cursor) };
    (cursor.pos >= cursor.rows.len()) as c_int
}

/// # Safety
/// As the virtual-table method it implements.
unsafe fn column_inner(
    cur: *mut sqlite3_vtab_cursor,
    ctx: *mut sqlite3_context,
    i: c_int,
) -> c_int {
    // SAFETY: cur is our Cursor; SQLite only asks for columns of a row before eof.
    let cursor = unsafe { &*(cur as *const Cursor) };
    let ctx = Context(ctx);
    match cursor.rows.get(cursor.pos).and_then(|r| r.get(i as usize)) {
        Some(Value::Int(v)) => ctx.int(*v),
        Some(Value::Text(s)) => ctx.text(s),
        Some(Value::Null) | None => ctx.null(),
    }
    SQLITE_OK
}

/// # Safety
/// As the virtual-table method it implements.
unsafe fn rowid_inner(cur: *mut sqlite3_vtab_cursor, out: *mut sqlite3_int64) -> c_int {
    // SAFETY: cur is our Cursor, out SQLite's out-pointer.
    unsafe { *out = (*(cur as *const Cursor)).pos as sqlite3_int64 };
    SQLITE_OK
}
