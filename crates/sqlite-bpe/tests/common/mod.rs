//! Helpers for the adapter's tests. Each test file is its own process with its own engine.
#![allow(dead_code)]

use rusqlite::{Connection, OpenFlags};
use std::path::{Path, PathBuf};

pub fn flags() -> OpenFlags {
    OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE | OpenFlags::SQLITE_OPEN_URI
}

/// Opens `path` through the bpe VFS (registering it first).
pub fn open_bpe(path: &Path) -> Connection {
    sqlite_bpe::register().expect("register");
    Connection::open_with_flags(format!("file:{}?vfs=bpe", path.display()), flags()).unwrap()
}

pub fn open_unix(path: &Path) -> Connection {
    Connection::open_with_flags(path, flags()).unwrap()
}

/// A temp dir on the project's disk (O_DIRECT works there; /tmp may be tmpfs).
pub fn tempdir() -> tempfile::TempDir {
    let base = Path::new(env!("CARGO_TARGET_TMPDIR"));
    std::fs::create_dir_all(base).unwrap();
    tempfile::tempdir_in(base).unwrap()
}

pub fn exec(conn: &Connection, statement: &str) -> String {
    conn.query_row("SELECT bpe_exec(?1)", [statement], |r| r.get(0))
        .unwrap()
}

/// Runs an operator statement; the error message if it fails.
pub fn try_exec(conn: &Connection, statement: &str) -> Result<String, String> {
    conn.query_row("SELECT bpe_exec(?1)", [statement], |r| r.get(0))
        .map_err(|e| e.to_string())
}

/// `ALTER SERVER CONFIGURATION SET BUFFER POOL EXTENSION ON` at `path` with `size` ("64 MB").
pub fn extension_on(path: impl std::fmt::Display, size: &str) -> String {
    format!(
        "ALTER SERVER CONFIGURATION SET BUFFER POOL EXTENSION ON (FILENAME = '{}', SIZE = {size})",
        path.to_string().replace('\'', "''")
    )
}

pub fn counter(conn: &Connection, name: &str) -> i64 {
    conn.query_row(
        "SELECT cntr_value FROM bpe_performance_counters WHERE counter_name = ?1",
        [name],
        |r| r.get(0),
    )
    .unwrap()
}

/// The release build of the loadable extension, brought up to date once per test binary (a
/// stale library from before a change would test the old code in the other process).
pub fn extension_library() -> PathBuf {
    static BUILT: std::sync::Once = std::sync::Once::new();
    let target = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/release");
    BUILT.call_once(|| {
        let status = std::process::Command::new(env!("CARGO"))
            .args(["build", "--release", "-p", "sqlite-bpe"])
            .status()
            .unwrap();
        assert!(status.success(), "cannot build the extension");
    });
    target.join("libsqlite_bpe.so")
}

/// The stock sqlite3 shell, if installed (CI installs it).
pub fn sqlite3_shell() -> Option<PathBuf> {
    let out = std::process::Command::new("sh")
        .args(["-c", "command -v sqlite3"])
        .output()
        .ok()?;
    let p = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (!p.is_empty()).then(|| PathBuf::from(p))
}

/// Runs `script` in the stock sqlite3 shell; returns (stdout, stderr, success).
pub fn run_shell(dir: &Path, script: &str) -> (String, String, bool) {
    use std::io::Write;
    let shell =
        sqlite3_shell().expect("the sqlite3 shell is not installed (apt-get install sqlite3)");
    let mut child = std::process::Command::new(shell)
        .arg("-batch")
        .current_dir(dir)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(script.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        out.status.success(),
    )
}
