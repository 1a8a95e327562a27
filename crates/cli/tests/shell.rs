//! `sqlite-bpe shell` run as a script: T-SQL statements, DMV names, GO n, dot-commands, errors.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};

/// A directory on the project's disk (the extension needs a file system with O_DIRECT).
fn tempdir() -> tempfile::TempDir {
    let base = Path::new(env!("CARGO_TARGET_TMPDIR"));
    std::fs::create_dir_all(base).unwrap();
    tempfile::tempdir_in(base).unwrap()
}

struct Run {
    stdout: String,
    stderr: String,
    code: Option<i32>,
}

fn shell(dir: &Path, script: &str) -> Run {
    let mut child = Command::new(env!("CARGO_BIN_EXE_sqlite-bpe"))
        .arg("shell")
        .arg(dir.join("test.db"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(script.as_bytes())
        .unwrap();
    let Output {
        status,
        stdout,
        stderr,
    } = child.wait_with_output().unwrap();
    Run {
        stdout: String::from_utf8_lossy(&stdout).into_owned(),
        stderr: String::from_utf8_lossy(&stderr).into_owned(),
        code: status.code(),
    }
}

fn assert_has(haystack: &str, needle: &str, what: &str) {
    assert!(
        haystack.contains(needle),
        "{what} lacks {needle:?}:\n{haystack}"
    );
}

#[test]
fn operator_statements_and_dmv_names_work() {
    let dir = tempdir();
    let ext = dir.path().join("test.bpe");
    let script = format!(
        "EXEC sp_configure 'max server memory (MB)', 32\n\
         RECONFIGURE\n\
         GO\n\
         CREATE TABLE t(x);\n\
         INSERT INTO t VALUES (1);\n\
         ALTER SERVER CONFIGURATION SET BUFFER POOL EXTENSION ON\n  (FILENAME = '{}', SIZE = 64 MB)\n\
         GO\n\
         SELECT * FROM sys.dm_os_buffer_pool_extension_configuration;\n\
         SELECT counter_name FROM SYS.DM_OS_PERFORMANCE_COUNTERS WHERE counter_name = 'Extension allocated pages';\n\
         SELECT count(*) > 0 AS has_pages FROM sys.dm_os_buffer_descriptors;\n\
         EXEC sp_configure 'max server memory (MB)'\n\
         GO\n\
         DBCC DROPCLEANBUFFERS;\n",
        ext.display()
    );
    let run = shell(dir.path(), &script);
    assert_eq!(run.stderr, "", "unexpected errors");
    assert_eq!(run.code, Some(0));
    assert_has(&run.stdout, "changed from 128 to 32", "sp_configure output");
    assert_has(&run.stdout, "ENABLED", "the extension configuration DMV");
    assert_has(
        &run.stdout,
        &ext.display().to_string(),
        "the extension configuration DMV",
    );
    assert_has(
        &run.stdout,
        "Extension allocated pages",
        "the performance counters DMV",
    );
    assert_has(
        &run.stdout,
        "has_pages\n---------\n        1",
        "the buffer descriptors DMV",
    );
    assert_has(
        &run.stdout,
        "max server memory (MB) = 32",
        "sp_configure without a value",
    );
    assert_has(&run.stdout, "DROPCLEANBUFFERS", "DBCC output");
}

#[test]
fn go_n_runs_the_batch_n_times() {
    let dir = tempdir();
    let run = shell(
        dir.path(),
        "CREATE TABLE t(x);\nGO\n\
         INSERT INTO t VALUES (1);\nGO 3\n\
         INSERT INTO t VALUES (2)\ngo 2\n\
         SELECT count(*) AS n, sum(x) AS s FROM t;\n",
    );
    assert_eq!(run.stderr, "", "CREATE TABLE must not be replayed by GO 3");
    assert_has(&run.stdout, "n  s\n-  -\n5  7\n", "the row count");
}

#[test]
fn errors_name_the_problem_and_the_script_goes_on_then_fails() {
    let dir = tempdir();
    let run = shell(
        dir.path(),
        "ALTER SERVER CONFIGURATION SET BUFFER POOL EXTENSION ON (FILENAME = 'relative.bpe', SIZE = 1 GB)\n\
         GO\n\
         EXEC sp_configure 'max server memory (MB)', 0;\n\
         SELECT * FROM no_such_table;\n\
         GO 0\n\
         SELECT 42 AS after_errors;\n",
    );
    assert_has(&run.stderr, "line 1", "the first error");
    assert_has(&run.stderr, "must be absolute", "the relative path error");
    assert_has(&run.stderr, "Msg 15129", "the memory error");
    assert_has(
        &run.stderr,
        "no such table: no_such_table",
        "the SQLite error",
    );
    assert_has(&run.stderr, "GO count must be at least 1", "the GO error");
    assert_has(
        &run.stdout,
        "after_errors\n------------\n          42",
        "the statement after the errors",
    );
    assert_eq!(run.code, Some(1), "a script with errors must exit non-zero");
}

#[test]
fn dot_commands() {
    let dir = tempdir();
    let run = shell(
        dir.path(),
        "CREATE TABLE alpha(x);\nCREATE VIEW beta AS SELECT 1;\n.tables\n.schema alpha\n.help\n.nonsense\n.quit\nSELECT 'after quit';\n",
    );
    assert_has(&run.stdout, "alpha\nbeta\n", ".tables");
    assert_has(&run.stdout, "CREATE TABLE alpha(x);", ".schema");
    assert_has(&run.stdout, "GO [n]", ".help");
    assert_has(
        &run.stderr,
        "unknown command '.nonsense'",
        "an unknown dot-command",
    );
    assert!(!run.stdout.contains("after quit"), ".quit did not stop");
}

/// T-SQL's exact numeric casts divide with fractions and round to their scale, as in SQL
/// Server (SQLite's NUMERIC cast alone keeps integers, so `/` divided integers).
#[test]
fn numeric_and_decimal_casts_divide_and_round_as_in_t_sql() {
    let dir = tempdir();
    let run = shell(
        dir.path(),
        "SELECT cast(50 as numeric)/1024 AS a;\nSELECT CAST(7 AS DECIMAL(10, 2))/2 AS b;\n\
         SELECT cast(2.345 as decimal(5,1)) AS c;\nSELECT cast(2.5 as numeric) AS d;\n",
    );
    assert_eq!(run.stderr, "");
    assert_eq!(
        run.stdout,
        "          a\n-----------\n0.048828125\n  b\n---\n3.5\n  c\n---\n2.3\n  d\n---\n3.0\n"
    );
}

#[test]
fn a_clean_script_exits_zero_and_the_last_batch_runs_without_go() {
    let dir = tempdir();
    let run = shell(dir.path(), "SELECT 'a' AS x\nUNION ALL SELECT 'b'");
    assert_eq!(run.stderr, "");
    assert_eq!(run.code, Some(0));
    assert_eq!(run.stdout, "x\n-\na\nb\n");
}

/// The DBA scripts of SQL Server's BPE write-ups, as written (the decoded report's trailing `|`,
/// a formatting slip in the paper, aside): the counters by object name, `SELECT *` of the
/// descriptors with `GO`, and the decoded report with DB_NAME, FILE_NAME, DB_ID, CASE, a
/// subquery on sys.allocation_units and a CAST; then T-SQL's `TOP n`.
#[test]
fn the_seed_dba_scripts_run_as_written() {
    let dir = tempdir();
    let script = r#"CREATE TABLE t(id INTEGER PRIMARY KEY, n TEXT);
WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < 300) INSERT INTO t SELECT i, printf('%.500c', 'A') FROM c;
SELECT * FROM sys.dm_os_performance_counters
WHERE object_name LIKE '%Buffer Manager%'
ORDER BY counter_name
GO
SELECT * FROM sys.dm_os_buffer_descriptors;
GO
select db_name(database_id) databaseName,
       file_name(file_id) fileName,
       CASE
         WHEN page_id = 0 THEN 'File Header Page m_type 15'
         WHEN page_id = 1 OR page_id % 8088 = 0 THEN 'PFS m_type 11'
         WHEN page_id = 2 OR page_id % 511232 = 0 THEN 'GAM m_type 8'
         WHEN page_id = 3 OR (page_id - 1) % 511232 = 0 THEN 'SGAM m_type 9'
         WHEN page_id = 6 OR (page_id - 6) % 511232 = 0 THEN 'DCM m_type 16'
         WHEN page_id = 7 OR (page_id - 7) % 511232 = 0 THEN 'BCM m_type 17'
         WHEN page_id = 9 AND file_id = 1 THEN 'Boot Page m_type 13'
         WHEN page_id = 10 AND DB_ID() = 1 THEN
           'config page &gt; sp_configure settings only present in master m_type 14'
         ELSE 'Other'
       END page_type,
       page_level,
       (select type_desc from sys.allocation_units where
        sys.allocation_units.allocation_unit_id =
          sys.dm_os_buffer_descriptors.allocation_unit_id) as allocation_type_desc,
       page_type,
       row_count,
       free_space_in_bytes,
       cast(free_space_in_bytes as numeric)/1024 as free_space_in_mega_bytes,
       is_modified,
       numa_node,
       read_microsec,
       is_in_bpool_extension
from sys.dm_os_buffer_descriptors;
SELECT 'fractions=' || (count(*) > 0) FROM sys.dm_os_buffer_descriptors
WHERE cast(free_space_in_bytes as numeric)/1024 <> free_space_in_bytes/1024;
SELECT 'ids=' || count(DISTINCT database_id) || ',' || (DB_ID() = max(database_id)) FROM sys.dm_os_buffer_descriptors;
SELECT 'file=' || FILE_NAME(1) || ',' || ifnull(FILE_NAME(2), 'null');
SELECT 'name_ends=' || (DB_NAME(DB_ID()) LIKE '%test.db') || ',' || ifnull(DB_NAME(999), 'null');
SELECT TOP 3 counter_name FROM sys.dm_os_performance_counters ORDER BY counter_name;
PRAGMA bpe_extension;
"#;
    let run = shell(dir.path(), script);
    assert_eq!(run.stderr, "", "unexpected errors");
    assert_eq!(run.code, Some(0));
    assert_has(&run.stdout, "Page lookups/sec", "the counters script");
    assert_has(&run.stdout, "TABLE_LEAF", "the descriptors");
    assert_has(&run.stdout, "test.db", "DB_NAME in the decoded report");
    assert_has(&run.stdout, "ids=1,1", "DB_ID against the descriptors");
    assert_has(&run.stdout, "file=test.db,null", "FILE_NAME");
    assert_has(&run.stdout, "name_ends=1,null", "DB_NAME");
    // The decoded report's `cast(free_space_in_bytes as numeric)/1024` divides as T-SQL's
    // decimal does (SQLite's NUMERIC cast once kept integers, and the division gave 0).
    assert_has(
        &run.stdout,
        "fractions=1",
        "CAST AS NUMERIC, then a division with a fraction",
    );
    // TOP 3: exactly three counter names after the previous line.
    // PRAGMA bpe_extension with named columns.
    assert_has(
        &run.stdout,
        "state_description",
        "PRAGMA bpe_extension's columns",
    );
    assert_has(
        &run.stdout,
        "BUFFER POOL EXTENSION DISABLED",
        "PRAGMA bpe_extension's state",
    );
    let after = run.stdout.split("name_ends=1,null").nth(1).unwrap();
    let after = after.split("path").next().unwrap();
    let rows = after
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with("counter_name") && !l.starts_with('-'))
        .count();
    assert_eq!(rows, 3, "{after}");
}

/// The scan write-up's script as its author ran it (N'' strings, `sys.sp_configure`,
/// `RECONFIGURE WITH OVERRIDE`, `SET STATISTICS TIME ON`, a `WITH (INDEX=0)` hint, the
/// extension's ON over several lines ending in `;`), then the idioms of DBA scripts: `WITH
/// (NOLOCK)`, `OPTION (RECOMPILE)`, `@@VERSION`, `sys.configurations`.
#[test]
fn the_scan_write_up_and_dba_idioms_run_as_written() {
    let dir = tempdir();
    let ext = dir.path().join("BufferPoolExtensionFile.BPE");
    let script = format!(
        "CREATE TABLE bigTransactionHistory(id INTEGER PRIMARY KEY, ActualCost REAL, pad TEXT);\n\
         WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < 2000)\n\
           INSERT INTO bigTransactionHistory SELECT i, i % 10, printf('%.300c', 'x') FROM c;\n\
         SET STATISTICS TIME ON\n\
         \n\
         SELECT AVG(actualcost) \n\
         FROM bigTransactionHistory WITH (INDEX=0)\n\
         GO\n\
         EXEC sys.sp_configure N'max server memory (MB)', N'16'\n\
         GO\n\
         RECONFIGURE WITH OVERRIDE\n\
         GO\n\
         DBCC DROPCLEANBUFFERS\n\
         GO\n\
         ALTER SERVER CONFIGURATION \n\
         SET BUFFER POOL EXTENSION ON ( \n\
         \tFILENAME = '{}',\n\
         \tSIZE = 64 MB);\n\
         GO\n\
         SELECT AVG(actualcost) FROM bigTransactionHistory WITH (INDEX=0)\n\
         GO\n\
         SELECT cntr_value AS allocated FROM sys.dm_os_performance_counters WITH (NOLOCK)\n\
           WHERE counter_name = N'Extension allocated pages' OPTION (RECOMPILE);\n\
         SELECT @@VERSION AS version;\n\
         SELECT name, value, value_in_use FROM sys.configurations\n\
           WHERE name = N'max server memory (MB)';\n\
         ALTER SERVER CONFIGURATION \n\
         SET BUFFER POOL EXTENSION OFF\n\
         GO\n",
        ext.display()
    );
    let run = shell(dir.path(), &script);
    assert_eq!(run.code, Some(0), "stderr:\n{}", run.stderr);
    assert!(run.stderr.is_empty(), "stderr:\n{}", run.stderr);
    let out = &run.stdout;
    assert_eq!(
        out.matches("4.5").count(),
        2,
        "AVG(actualcost) twice:\n{out}"
    );
    assert_has(out, "changed from", "sp_configure's status");
    assert_has(out, "Buffer pool extension", "ON's status");
    assert_has(
        out,
        &format!("sqlite-bpe {} on SQLite 3.", env!("CARGO_PKG_VERSION")),
        "@@VERSION",
    );
    assert!(
        out.lines().any(|l| l.starts_with("max server memory (MB)")
            && l.split_whitespace().filter(|w| *w == "16").count() == 2),
        "sys.configurations shows max server memory 16 as value and value_in_use:\n{out}"
    );
    // The counter read through the hint and the N'' string (its value depends on the
    // background writer's progress, so only its presence is checked).
    let allocated = out
        .lines()
        .skip_while(|l| !l.starts_with("allocated"))
        .nth(2);
    assert!(
        allocated.is_some_and(|l| l.trim().parse::<u64>().is_ok()),
        "no Extension allocated pages value:\n{out}"
    );
}

/// sp_configure in the shell lasts for its process: the shell says so when it sets a value,
/// and not when it only shows one.
#[test]
fn sp_configure_says_the_setting_is_not_kept() {
    let dir = tempdir();
    let run = shell(
        dir.path(),
        "EXEC sp_configure 'max server memory (MB)', 24\nGO\n",
    );
    assert_eq!(run.code, Some(0), "stderr:\n{}", run.stderr);
    assert_has(&run.stdout, "changed from", "the status");
    assert_has(
        &run.stdout,
        "BPE_MAX_SERVER_MEMORY_MB",
        "the note on keeping it",
    );
    let run = shell(
        dir.path(),
        "EXEC sp_configure 'max server memory (MB)'\nGO\n",
    );
    assert_eq!(run.code, Some(0), "stderr:\n{}", run.stderr);
    assert!(
        !run.stdout.contains("BPE_MAX_SERVER_MEMORY_MB"),
        "no note when nothing was set:\n{}",
        run.stdout
    );
}

/// A max server memory above the machine's RAM is refused in MB, the unit it was given in.
#[test]
fn an_oversized_memory_is_refused_in_mb() {
    let dir = tempdir();
    let run = shell(
        dir.path(),
        "EXEC sp_configure 'max server memory (MB)', 1000000000\nGO\n",
    );
    assert_eq!(run.code, Some(1), "stdout:\n{}", run.stdout);
    assert_has(
        &run.stderr,
        "max server memory 1000000000 MB is above this machine's physical memory (",
        "the error",
    );
    assert!(!run.stderr.contains("bytes"), "{}", run.stderr);
}
