//! The `sqlite-bpe` command as a library: the shell, the demo (the benchmarks' lookup
//! experiment at demo scale) and the live monitor. Both print their tables with the benchmarks' `bpe_bench::table`.
//!
//! Everything runs on SQLite through the adapter's `bpe` VFS, so the buffer pool and its
//! extension sit under every page SQLite reads.

pub mod demo;
pub mod monitor;
pub mod shell;
pub mod tsql;

use anyhow::{anyhow, Context};
use rusqlite::{Connection, OpenFlags};

/// Opens (or creates) the database at `path` through the `bpe` VFS, registering the adapter
/// first. `path` may also be a `file:` URI.
pub fn open(path: &str) -> anyhow::Result<Connection> {
    sqlite_bpe::register().map_err(|e| anyhow!("cannot register the bpe VFS: {e}"))?;
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
        | OpenFlags::SQLITE_OPEN_CREATE
        | OpenFlags::SQLITE_OPEN_URI
        | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    // Naming the VFS here rather than in a `file:PATH?vfs=bpe` URI spares escaping the path.
    Connection::open_with_flags_and_vfs(path, flags, "bpe")
        .with_context(|| format!("cannot open {path} with the bpe VFS"))
}

/// Runs operator statements (SQL Server syntax) through the adapter; returns their status text.
pub fn bpe_exec(conn: &Connection, statements: &str) -> rusqlite::Result<String> {
    let status: Option<String> =
        conn.query_row("SELECT bpe_exec(?1)", [statements], |row| row.get(0))?;
    Ok(status.unwrap_or_default())
}
