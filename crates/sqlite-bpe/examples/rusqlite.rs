//! Using sqlite-bpe from Rust with rusqlite:
//!
//!   cargo run --example rusqlite -p sqlite-bpe -- /path/on/ssd/app.bpe
//!
//! Registers the `bpe` VFS, opens a database through it, enables an extension file and prints
//! the extension counters.

use rusqlite::{Connection, OpenFlags};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let ext = std::env::args().nth(1).unwrap_or_else(|| {
        std::env::current_dir()
            .unwrap()
            .join("example.bpe")
            .display()
            .to_string()
    });
    sqlite_bpe::register()?;
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
        | OpenFlags::SQLITE_OPEN_CREATE
        | OpenFlags::SQLITE_OPEN_URI;
    let conn = Connection::open_with_flags("file:example.db?vfs=bpe", flags)?;
    conn.execute_batch("CREATE TABLE IF NOT EXISTS t(id INTEGER PRIMARY KEY, n TEXT)")?;
    conn.execute(
        "INSERT INTO t(n) SELECT printf('%.1000c', 'A') FROM (SELECT 1 UNION ALL SELECT 2)",
        [],
    )?;
    let status: String = conn.query_row(
        "SELECT bpe_exec(?1)",
        [format!("ALTER SERVER CONFIGURATION SET BUFFER POOL EXTENSION ON (FILENAME = '{ext}', SIZE = 256 MB)")],
        |r| r.get(0),
    )?;
    println!("{status}");
    let mut stmt = conn.prepare(
        "SELECT counter_name, cntr_value FROM bpe_performance_counters WHERE counter_name LIKE 'Extension%'",
    )?;
    for row in stmt.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))? {
        let (name, value) = row?;
        println!("{name:40} {value}");
    }
    Ok(())
}
