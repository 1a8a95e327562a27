//! SQL Server's operator surface through SQL: bpe_exec, the three tables, and the PRAGMAs.

mod common;
use common::*;

static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn config(c: &rusqlite::Connection) -> (Option<String>, i64, String, i64) {
    c.query_row(
        "SELECT path, state, state_description, current_size_in_kb FROM bpe_extension_configuration",
        [],
        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
    )
    .unwrap()
}

#[test]
fn statements_change_the_engine_and_bad_ones_are_sql_errors_that_change_nothing() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempdir();
    let c = open_bpe(&dir.path().join("op.db"));
    exec(
        &c,
        "exec SP_CONFIGURE 'max server memory (MB)',  64\n RECONFIGURE",
    );
    let mb: String = c
        .query_row("PRAGMA bpe_max_server_memory_mb", [], |r| r.get(0))
        .unwrap();
    assert_eq!(mb, "64");
    let ext = dir.path().join("op.bpe");
    let on = format!(
        "alter server configuration set buffer pool extension on (filename = '{}', size = 128 mb)",
        ext.display()
    );
    exec(&c, &on);
    assert_eq!(
        config(&c),
        (
            Some(ext.display().to_string()),
            5,
            "BUFFER POOL EXTENSION ENABLED".into(),
            128 * 1024
        )
    );
    for (bad, needle) in [
        (format!("ALTER SERVER CONFIGURATION SET BUFFER POOL EXTENSION ON (FILENAME = '{}', SIZE = 32 MB)", ext.display()), "868"),
        (format!("ALTER SERVER CONFIGURATION SET BUFFER POOL EXTENSION ON (FILENAME = '{}', SIZE = 256 MB)", dir.path().join("x.bpe").display()), "already enabled"),
        ("EXEC sp_configure 'max server memory (MB)', 0".to_string(), "memory"),
        ("DBCC DROPCLEANBUFFERS; THIS IS NOT SQL".to_string(), "102"),
        ("EXEC sp_configure 'max server mem', 5".to_string(), "15123"),
    ] {
        let err = c
            .query_row("SELECT bpe_exec(?1)", [&bad], |r| r.get::<_, String>(0))
            .unwrap_err()
            .to_string();
        assert!(err.contains(needle), "{bad:?}: '{err}' lacks '{needle}'");
        assert_eq!(config(&c).3, 128 * 1024, "{bad:?} changed the extension");
        let mb: String = c.query_row("PRAGMA bpe_max_server_memory_mb", [], |r| r.get(0)).unwrap();
        assert_eq!(mb, "64", "{bad:?} changed max server memory");
    }
    exec(
        &c,
        "ALTER SERVER CONFIGURATION SET BUFFER POOL EXTENSION OFF",
    );
    assert_eq!(config(&c).1, 0);
    assert!(!ext.exists());
}

/// `bpe_exec` changes the server, so a database's schema cannot call it: a file made elsewhere,
/// opened and queried, must not size the pool or turn the extension on at a path of its choosing
/// through a view or a trigger (`SQLITE_DIRECTONLY`). The application's own statements still can.
#[test]
fn a_database_schema_cannot_run_operator_statements() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempdir();
    let path = dir.path().join("untrusted.db");
    let planted = dir.path().join("planted.bpe");
    let on = extension_on(planted.display(), "128 MB").replace('\'', "''");
    open_unix(&path)
        .execute_batch(&format!(
            "CREATE TABLE t(x);
             CREATE VIEW v AS SELECT bpe_exec('EXEC sp_configure ''max server memory (MB)'', 3') AS r;
             CREATE TRIGGER tr AFTER INSERT ON t BEGIN SELECT bpe_exec('{on}'); END;"
        ))
        .unwrap();
    let c = open_bpe(&path);
    exec(&c, "EXEC sp_configure 'max server memory (MB)', 64");
    exec(
        &c,
        "ALTER SERVER CONFIGURATION SET BUFFER POOL EXTENSION OFF",
    );
    let before = config(&c);
    let through_view = c.query_row("SELECT r FROM v", [], |r| r.get::<_, String>(0));
    let through_trigger = c.execute("INSERT INTO t VALUES (1)", []);
    for err in [through_view.map(drop), through_trigger.map(drop)] {
        let err = format!("{err:?}");
        assert!(err.contains("unsafe use of bpe_exec"), "{err}");
    }
    let mb: String = c
        .query_row("PRAGMA bpe_max_server_memory_mb", [], |r| r.get(0))
        .unwrap();
    assert_eq!(mb, "64", "the view changed max server memory");
    assert_eq!(config(&c), before, "the trigger changed the extension");
    assert!(!planted.exists(), "the trigger made {planted:?}");
    exec(&c, "EXEC sp_configure 'max server memory (MB)', 65");
    let mb: String = c
        .query_row("PRAGMA bpe_max_server_memory_mb", [], |r| r.get(0))
        .unwrap();
    assert_eq!(mb, "65", "the application's own statement did not run");
}

#[test]
fn pragmas_mirror_the_statements() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempdir();
    let c = open_bpe(&dir.path().join("pr.db"));
    c.execute_batch("PRAGMA bpe_max_server_memory_mb = 32")
        .unwrap();
    let ext = dir.path().join("pr.bpe");
    c.execute_batch(&format!("PRAGMA bpe_extension = '{},64MB'", ext.display()))
        .unwrap();
    let status: String = c
        .query_row("PRAGMA bpe_extension", [], |r| r.get(0))
        .unwrap();
    assert!(
        status.starts_with("BUFFER POOL EXTENSION ENABLED") && status.contains("pr.bpe"),
        "{status}"
    );
    let err = c
        .execute_batch("PRAGMA bpe_max_server_memory_mb = lots")
        .unwrap_err()
        .to_string();
    assert!(err.contains("not a whole number"), "{err}");
    let err = c
        .execute_batch(&format!("PRAGMA bpe_extension = '{},64'", ext.display()))
        .unwrap_err()
        .to_string();
    assert!(err.contains("unit"), "{err}");
    c.execute_batch("PRAGMA bpe_drop_clean_buffers").unwrap();
    c.execute_batch("PRAGMA bpe_extension = off").unwrap();
    assert!(!ext.exists());
    // Ordinary pragmas still reach SQLite.
    let mode: String = c
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "delete");
}

#[test]
fn the_tables_exist_on_connections_opened_later_and_describe_the_pool() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempdir();
    let c = open_bpe(&dir.path().join("d.db"));
    c.execute_batch(
        "CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT); CREATE INDEX t_v ON t(v);
         WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM s WHERE i < 2000)
         INSERT INTO t SELECT i, printf('%08d', i) FROM s;",
    )
    .unwrap();
    // Any connection, even one not using bpe, sees the process's pool.
    let other = rusqlite::Connection::open_in_memory().unwrap();
    let types: Vec<(String, i64)> = other
        .prepare("SELECT page_type, count(*) FROM bpe_buffer_descriptors WHERE is_in_bpool_extension = 0 GROUP BY 1 ORDER BY 1")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let names: Vec<&str> = types.iter().map(|(t, _)| t.as_str()).collect();
    assert!(
        names.contains(&"TABLE_LEAF") && names.contains(&"INDEX_LEAF"),
        "{types:?}"
    );
    // This database's pages (the other tests' closed files may have some there too).
    let id: i64 = c.query_row("SELECT DB_ID()", [], |r| r.get(0)).unwrap();
    let rows: i64 = other
        .query_row("SELECT sum(row_count) FROM bpe_buffer_descriptors WHERE page_type = 'TABLE_LEAF' AND page_id > 1 AND database_id = ?1", [id], |r| r.get(0))
        .unwrap();
    // Page 1 is sqlite_schema's leaf (2 rows: the table and the index), hence page_id > 1.
    assert_eq!(
        rows, 2000,
        "row counts decoded from the leaves should add up to the table"
    );
    let (object, kind): (String, i64) = other
        .query_row(
            "SELECT object_name, cntr_type FROM bpe_performance_counters WHERE counter_name = 'Extension page reads/sec'",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert!(object.ends_with(":Buffer Manager"));
    assert_eq!(kind, 272696576);
}

/// The latency histograms beside the counters, as a table: one row per bucket that holds
/// anything, each twice as wide as the one below, the counts the engine's own.
#[test]
fn the_latency_histograms_are_a_table_of_their_buckets() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempdir();
    let c = open_bpe(&dir.path().join("hist.db"));
    let memory: String = c
        .query_row("PRAGMA bpe_max_server_memory_mb", [], |r| r.get(0))
        .unwrap();
    exec(&c, "EXEC sp_configure 'max server memory (MB)', 2");
    let ext = dir.path().join("hist.bpe");
    exec(&c, &extension_on(ext.display(), "64 MB"));
    c.execute_batch(
        "PRAGMA cache_size = 1;
         CREATE TABLE t(id INTEGER PRIMARY KEY, n TEXT);
         WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < 8000)
           INSERT INTO t SELECT i, printf('%.1000c', 'x') FROM c;",
    )
    .unwrap();
    // 8 MB through 2 MB of memory: the second scan reads most pages from the extension.
    for _ in 0..3 {
        assert!(sqlite_bpe::engine().wait_for_extension_writes(std::time::Duration::from_secs(30)));
        let n: i64 = c
            .query_row("SELECT count(n) FROM t", [], |r| r.get(0))
            .unwrap();
        assert_eq!(n, 8000);
    }
    let rows: Vec<(String, i64, i64, i64)> = c
        .prepare("SELECT name, low_ns, high_ns, count FROM bpe_latency_histograms")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let engine = sqlite_bpe::engine().histograms();
    let reads = engine
        .iter()
        .find(|h| h.name == "Extension read time")
        .unwrap();
    let k = sqlite_bpe::engine().counters();
    assert!(
        reads.count() > 0,
        "no extension reads were timed: {} L2 reads, {} writes, {} data reads, {:?}",
        k.ext_page_reads,
        k.ext_page_writes,
        k.page_reads,
        sqlite_bpe::engine().extension_status()
    );
    let in_table: i64 = rows
        .iter()
        .filter(|r| r.0 == "Extension read time")
        .map(|r| r.3)
        .sum();
    assert_eq!(in_table as u64, reads.count());
    for (name, low, high, count) in &rows {
        assert!(*count > 0, "{name}: an empty bucket listed");
        assert!(
            *high == 2 * *low || (*low == 0 && *high == 2),
            "{name}: [{low}, {high})"
        );
    }
    exec(
        &c,
        "ALTER SERVER CONFIGURATION SET BUFFER POOL EXTENSION OFF",
    );
    exec(
        &c,
        &format!("EXEC sp_configure 'max server memory (MB)', {memory}"),
    );
}
