//! Which connections get bpe's SQL functions and virtual tables: `BPE_SQL_SURFACE` (read once,
//! at the first load) sets the default, `every-connection` or `on-demand`; a connection's
//! `bpe_sql` URI parameter overrides it either way, and `register_sql` installs them on one
//! connection. The VFS serves every connection alike. The variable is process-wide, so each
//! case runs in a child process of its own, started with it.

mod common;
use common::*;
use rusqlite::Connection;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

const CHILD: &str = "BPE_TEST_SQL_SURFACE_CHILD";
const CHILD_DB: &str = "BPE_TEST_SQL_SURFACE_DB";

/// Whether `conn` has the function `bpe_exec` and the virtual table
/// `bpe_performance_counters`; both or neither, or the test fails.
fn has_surface(conn: &Connection) -> bool {
    let function = conn.prepare("SELECT bpe_exec('DBCC DROPCLEANBUFFERS')");
    let table = conn.prepare("SELECT count(*) FROM bpe_performance_counters");
    match (&function, &table) {
        (Ok(_), Ok(_)) => true,
        (Err(f), Err(t)) => {
            assert!(f.to_string().contains("no such function: bpe_exec"), "{f}");
            assert!(
                t.to_string()
                    .contains("no such table: bpe_performance_counters"),
                "{t}"
            );
            false
        }
        _ => panic!(
            "one of the surface without the other: {:?} / {:?}",
            function.err(),
            table.err()
        ),
    }
}

/// `db` through the bpe VFS, with `params` added to its URI (`&bpe_sql=1`...).
fn open_with(db: &Path, params: &str) -> Connection {
    sqlite_bpe::register().expect("register");
    Connection::open_with_flags(format!("file:{}?vfs=bpe{params}", db.display()), flags()).unwrap()
}

/// The pages of `db` the pool holds, counted through a connection that has the surface: the
/// connections without it went through the VFS too.
fn cached_pages(db: &Path) -> i64 {
    open_with(db, "&bpe_sql=1")
        .query_row("SELECT count(*) FROM bpe_buffer_descriptors", [], |r| {
            r.get(0)
        })
        .unwrap()
}

#[test]
#[ignore = "run by sql_surface's tests as a child process"]
fn child_entry() {
    let Some(mode) = child_mode(CHILD) else {
        return;
    };
    let db = PathBuf::from(std::env::var(CHILD_DB).unwrap());
    match mode.as_str() {
        "on-demand" => {
            let plain = open_with(&db, "");
            assert!(!has_surface(&plain), "a plain connection has the surface");
            plain
                .execute_batch("CREATE TABLE t(x); INSERT INTO t VALUES (1)")
                .unwrap();
            assert!(
                cached_pages(&db) > 0,
                "the plain connection bypassed the pool"
            );
            assert!(!has_surface(&open_with(&db, "&bpe_sql=0")));
            let asked = open_with(&db, "&bpe_sql=1");
            assert!(has_surface(&asked), "bpe_sql=1 did not get the surface");
            let answer: String = asked
                .query_row("SELECT bpe_exec('DBCC DROPCLEANBUFFERS')", [], |r| r.get(0))
                .unwrap();
            assert!(!answer.is_empty());
            // On demand from Rust: the plain connection gets it, and again changes nothing.
            // SAFETY: the connection is open, of the linked SQLite, and used by this thread.
            unsafe { sqlite_bpe::register_sql(plain.handle()) }.unwrap();
            assert!(
                has_surface(&plain),
                "register_sql did not install the surface"
            );
            // SAFETY: as above.
            unsafe { sqlite_bpe::register_sql(plain.handle()) }.unwrap();
            assert!(has_surface(&plain));
            assert!(!has_surface(&open_with(&db, "")), "register_sql leaked");
        }
        "every-connection" => {
            let plain = open_with(&db, "");
            assert!(has_surface(&plain), "the default lost the surface");
            plain
                .execute_batch("CREATE TABLE t(x); INSERT INTO t VALUES (1)")
                .unwrap();
            assert!(has_surface(&open_with(&db, "&bpe_sql=1")));
            let skipped = open_with(&db, "&bpe_sql=0");
            assert!(!has_surface(&skipped), "bpe_sql=0 still got the surface");
            let n: i64 = skipped
                .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
                .unwrap();
            assert_eq!(n, 1);
            // A plain file name (no URI) keeps the default.
            let unix = Connection::open(db.with_extension("unix.db")).unwrap();
            assert!(has_surface(&unix));
        }
        "bad" => {
            let err = sqlite_bpe::register().unwrap_err();
            println!("REFUSED {err}");
            // Nothing was registered: no bpe VFS to open a database with.
            let opened =
                Connection::open_with_flags(format!("file:{}?vfs=bpe", db.display()), flags());
            assert!(opened.is_err(), "a refused load left the bpe VFS behind");
        }
        other => panic!("unknown mode {other}"),
    }
    assert_no_caught_panic(&mode);
    println!("CHILD OK");
}

/// Runs the child in `mode` with `BPE_SQL_SURFACE` set to `surface` (unset: None); returns its
/// stdout once it succeeded.
fn run_child(mode: &str, surface: Option<&str>) -> String {
    let dir = tempdir();
    let mut cmd = child_command(CHILD, mode);
    cmd.env(CHILD_DB, dir.path().join("surface.db"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(v) = surface {
        cmd.env("BPE_SQL_SURFACE", v);
    }
    let done = wait_with_limit(cmd.spawn().unwrap(), Duration::from_secs(120));
    assert!(
        done.success() && done.stdout.contains("CHILD OK"),
        "child {mode} failed:\n{}\n{}",
        done.stdout,
        done.stderr
    );
    done.stdout
}

#[test]
fn on_demand_gives_the_surface_only_to_connections_that_ask() {
    run_child("on-demand", Some("on-demand"));
}

#[test]
fn every_connection_is_the_default_and_bpe_sql_0_leaves_a_connection_without() {
    run_child("every-connection", None);
    run_child("every-connection", Some("every-connection"));
}

#[test]
fn a_bad_bpe_sql_surface_fails_the_load_naming_the_variable_and_its_values() {
    let out = run_child("bad", Some("lazy"));
    let line = out
        .lines()
        .find_map(|l| l.split_once("REFUSED ").map(|(_, rest)| rest))
        .unwrap_or_else(|| panic!("no refusal in:\n{out}"));
    assert!(
        line.contains("BPE_SQL_SURFACE=\"lazy\"")
            && line.contains("every-connection")
            && line.contains("on-demand"),
        "{line}"
    );
}

/// The stock `sqlite3` shell: with on-demand, the connection `.load` ran on has the functions
/// (whoever typed `.load` expects them there), a database opened later has them only with
/// `bpe_sql=1`.
#[test]
fn in_the_stock_shell_load_installs_on_its_connection_and_bpe_sql_on_later_ones() {
    let lib = extension_library();
    let dir = tempdir();
    let script = format!(
        r#".load {lib}
SELECT 'loaded=' || count(*) FROM bpe_performance_counters WHERE counter_name = 'Page reads/sec';
.open file:later.db?vfs=bpe
SELECT 'later=' || bpe_exec('DBCC DROPCLEANBUFFERS');
.open file:asked.db?vfs=bpe&bpe_sql=1
SELECT 'asked=' || count(*) FROM bpe_performance_counters WHERE counter_name = 'Page reads/sec';
"#,
        lib = lib.with_extension("").display(),
    );
    let (out, err, _) =
        run_shell_with_env(dir.path(), &script, &[("BPE_SQL_SURFACE", "on-demand")]);
    assert!(out.lines().any(|l| l == "loaded=1"), "{out}\n{err}");
    assert!(!out.contains("later="), "{out}");
    assert!(err.contains("no such function: bpe_exec"), "{err}");
    assert!(out.lines().any(|l| l == "asked=1"), "{out}\n{err}");
}
