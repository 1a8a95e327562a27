//! The stock Debian `sqlite3` shell (its own SQLite, 3.40 here) loads the extension, opens a
//! database with vfs=bpe, enables an extension file and reads counters showing extension reads;
//! the next shell that enables an extension at that path starts warm from it.

mod common;
use common::*;

#[test]
fn the_stock_sqlite3_shell_loads_the_extension_and_reads_through_it() {
    let lib = extension_library();
    let dir = tempdir();
    let ext = dir.path().join("shell.bpe");
    let script = format!(
        r#".load {lib}
.load {lib}
.open file:shell.db?vfs=bpe
CREATE TABLE t(id INTEGER PRIMARY KEY, n TEXT);
WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < 4000)
  INSERT INTO t SELECT i, printf('%.1000c', 'A') FROM c;
SELECT bpe_exec('EXEC sp_configure ''max server memory (MB)'', 1');
SELECT bpe_exec('ALTER SERVER CONFIGURATION SET BUFFER POOL EXTENSION ON (FILENAME = ''{ext}'', SIZE = 64 MB)');
SELECT sum(length(n)) FROM t;
SELECT sum(length(n)) FROM t;
SELECT 'ext_reads=' || cntr_value FROM bpe_performance_counters WHERE counter_name = 'Extension page reads/sec';
SELECT 'state=' || state_description FROM bpe_extension_configuration;
SELECT 'in_ext=' || count(*) FROM bpe_buffer_descriptors WHERE is_in_bpool_extension = 1;
PRAGMA integrity_check;
"#,
        lib = lib.with_extension("").display(),
        ext = ext.display()
    );
    let (out, err, ok) = run_shell(dir.path(), &script);
    assert!(ok && err.is_empty(), "shell failed: {err}\n{out}");
    let value = |key: &str| -> i64 {
        let line = out
            .lines()
            .find(|l| l.starts_with(key))
            .unwrap_or_else(|| panic!("no {key} in:\n{out}"));
        line[key.len()..].parse().unwrap()
    };
    assert!(value("ext_reads=") > 500, "{out}");
    assert!(value("in_ext=") > 500, "{out}");
    assert!(out.contains("state=BUFFER POOL EXTENSION ENABLED"), "{out}");
    assert!(out.contains("4000000\n4000000"), "{out}");
    assert!(out.trim_end().ends_with("ok"), "{out}");
    // The file stays for the next process (and its shared memory beside it), readable by this
    // user alone.
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::metadata(&ext).expect("the extension file went with the shell");
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);

    // A second shell takes it over: its pages are read from it, and OFF deletes it.
    let warm = format!(
        r#".load {lib}
.open file:shell.db?vfs=bpe
SELECT bpe_exec('EXEC sp_configure ''max server memory (MB)'', 1');
SELECT bpe_exec('ALTER SERVER CONFIGURATION SET BUFFER POOL EXTENSION ON (FILENAME = ''{ext}'', SIZE = 64 MB)');
SELECT sum(length(n)) FROM t;
SELECT sum(length(n)) FROM t;
SELECT 'ext_reads=' || cntr_value FROM bpe_performance_counters WHERE counter_name = 'Extension page reads/sec';
SELECT bpe_exec('ALTER SERVER CONFIGURATION SET BUFFER POOL EXTENSION OFF');
"#,
        lib = lib.with_extension("").display(),
        ext = ext.display()
    );
    let (out, err, ok) = run_shell(dir.path(), &warm);
    assert!(ok && err.is_empty(), "shell failed: {err}\n{out}");
    let value = |key: &str| -> i64 {
        let line = out
            .lines()
            .find(|l| l.starts_with(key))
            .unwrap_or_else(|| panic!("no {key} in:\n{out}"));
        line[key.len()..].parse().unwrap()
    };
    assert!(value("ext_reads=") > 500, "{out}");
    assert_eq!(out.matches("4000000\n").count(), 2, "{out}");
    assert!(!ext.exists(), "OFF left the extension file");
}

/// `BPE_DEFAULT_VFS=1` at load makes a plain file name go through the pool (for hosts and ORMs
/// that cannot pass `?vfs=bpe`); unset, the shell's databases stay on SQLite's own VFS; a value
/// other than 0 or 1 fails the load with a message that names the variable.
#[test]
fn bpe_default_vfs_serves_plain_file_names_through_the_pool() {
    let lib = extension_library();
    let lib = lib.with_extension("");
    let dir = tempdir();
    let script = format!(
        r#".load {lib}
.open plain.db
CREATE TABLE t(id INTEGER PRIMARY KEY, n TEXT);
WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < 500)
  INSERT INTO t SELECT i, printf('%.500c', 'A') FROM c;
SELECT sum(length(n)) FROM t;
SELECT 'cached=' || count(*) FROM bpe_buffer_descriptors;
"#,
        lib = lib.display()
    );
    let (out, err, ok) = run_shell_with_env(dir.path(), &script, &[("BPE_DEFAULT_VFS", "1")]);
    assert!(ok && err.is_empty(), "shell failed: {err}\n{out}");
    assert!(out.contains("250000"), "{out}");
    let cached: i64 = out
        .lines()
        .find_map(|l| l.strip_prefix("cached="))
        .unwrap_or_else(|| panic!("no cached= in:\n{out}"))
        .parse()
        .unwrap();
    assert!(cached > 0, "{out}");

    let (out, err, ok) =
        run_shell_with_env(dir.path(), &script.replace("plain.db", "other.db"), &[]);
    assert!(ok && err.is_empty(), "shell failed: {err}\n{out}");
    assert!(out.contains("cached=0"), "{out}");

    let (out, err, _) = run_shell_with_env(
        dir.path(),
        &format!(".load {}\n", lib.display()),
        &[("BPE_DEFAULT_VFS", "yes")],
    );
    assert!(err.contains("BPE_DEFAULT_VFS"), "{err}\n{out}");
}

/// Hosts that can load only through SQL (sqlite-jdbc, some ORMs) call `load_extension()` on
/// connections the auto-extension already equipped: the load succeeds and changes nothing.
#[test]
fn load_extension_in_sql_on_a_connection_opened_after_the_first_load_succeeds() {
    let lib = extension_library();
    let dir = tempdir();
    let script = format!(
        r#".load {lib}
.open file:later.db?vfs=bpe
SELECT 'loaded=' || (load_extension('{lib}') IS NULL);
SELECT 'loaded_again=' || (load_extension('{lib}') IS NULL);
CREATE TABLE t(x);
INSERT INTO t VALUES (42);
SELECT 'db_id=' || (db_id() IS NOT NULL);
SELECT 'sum=' || sum(x) FROM t;
"#,
        lib = lib.with_extension("").display(),
    );
    let (out, err, ok) = run_shell(dir.path(), &script);
    assert!(ok && err.is_empty(), "shell failed: {err}\n{out}");
    for line in ["loaded=1", "loaded_again=1", "db_id=1", "sum=42"] {
        assert!(out.lines().any(|l| l == line), "no {line} in:\n{out}");
    }
}
