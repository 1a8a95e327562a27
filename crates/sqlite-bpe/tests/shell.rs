//! The stock Debian `sqlite3` shell (its own SQLite, 3.40 here) loads the extension, opens a
//! database with vfs=bpe, enables an extension file and reads counters showing extension reads.

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
    assert!(
        !ext.exists(),
        "the extension file outlived the shell process"
    );
}
