//! Corrupt and truncated database files behave through `bpe` as through the plain unix VFS: the
//! same results, or the same SQLite error, for every query, and never a panic across the FFI.
//! And a repaired file is read fresh: nothing of the corrupt copy stays cached.

mod common;
use common::*;
use rand::{Rng, SeedableRng};
use rusqlite::Connection;
use std::path::Path;

const PAGE: usize = 4096;

/// A database of a few dozen pages: a table with an index and overflow rows.
fn good_database(path: &Path) {
    let c = open_unix(path);
    c.execute_batch(
        "PRAGMA page_size = 4096; PRAGMA journal_mode = DELETE;
         CREATE TABLE t(id INTEGER PRIMARY KEY, k TEXT, v BLOB);
         CREATE INDEX t_k ON t(k);",
    )
    .unwrap();
    let tx = c.unchecked_transaction().unwrap();
    for id in 0..1500i64 {
        let len = if id % 50 == 0 { 6000 } else { 60 };
        tx.execute(
            "INSERT INTO t VALUES (?1, ?2, zeroblob(?3))",
            rusqlite::params![id, format!("key-{:05}", (id * 7919) % 1500), len],
        )
        .unwrap();
    }
    tx.commit().unwrap();
}

/// The ways a file goes bad: (name, transformation of the good bytes).
fn variants(good: &[u8]) -> Vec<(&'static str, Vec<u8>)> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let pages = good.len() / PAGE;
    let mut out = vec![
        ("truncated to 0 bytes", Vec::new()),
        ("truncated to 100 bytes", good[..100].to_vec()),
        ("truncated mid-page", good[..PAGE * 3 + 1000].to_vec()),
        (
            "truncated to half its pages",
            good[..PAGE * (pages / 2)].to_vec(),
        ),
        ("one byte short", good[..good.len() - 1].to_vec()),
        ("zero-filled", vec![0u8; good.len()]),
        (
            "random bytes",
            (0..good.len()).map(|_| rng.gen()).collect::<Vec<u8>>(),
        ),
    ];
    let mut magic = good.to_vec();
    magic[..16].copy_from_slice(b"SQLite formax 3\0");
    out.push(("header magic garbled", magic));
    let mut page_size = good.to_vec();
    page_size[16..18].copy_from_slice(&[0x03, 0x00]); // 768: not a power of two
    out.push(("page size field invalid", page_size));
    let mut count = good.to_vec();
    count[28..32].copy_from_slice(&10_000u32.to_be_bytes()); // in-header page count too large
    out.push(("page count field wrong", count));
    for round in 0..4 {
        let mut bytes = good.to_vec();
        for _ in 0..40 {
            let page = rng.gen_range(1..pages);
            let at = page * PAGE + rng.gen_range(0..PAGE);
            bytes[at] = rng.gen();
        }
        out.push((
            [
                "b-tree pages scribbled (1)",
                "b-tree pages scribbled (2)",
                "b-tree pages scribbled (3)",
                "b-tree pages scribbled (4)",
            ][round],
            bytes,
        ));
    }
    let mut leaf = good.to_vec();
    let victim = pages / 2;
    leaf[victim * PAGE..(victim + 1) * PAGE].fill(0xff);
    out.push(("one whole page overwritten", leaf));
    out
}

/// What one query gives: its rows, or the primary error code (and never a panic).
fn outcome(c: &Connection, sql: &str) -> String {
    let run = || -> rusqlite::Result<String> {
        let mut stmt = c.prepare(sql)?;
        let n = stmt.column_count();
        let rows = stmt.query_map([], |r| {
            (0..n)
                .map(|i| Ok(format!("{:?}", r.get_ref(i)?)))
                .collect::<rusqlite::Result<Vec<_>>>()
        })?;
        let mut all = Vec::new();
        for row in rows {
            all.push(row?.join("|"));
        }
        Ok(all.join("\n"))
    };
    match run() {
        Ok(rows) => format!("rows: {rows}"),
        Err(rusqlite::Error::SqliteFailure(e, _)) => format!("error: {:?}", e.code),
        Err(e) => format!("error: {e}"),
    }
}

const QUERIES: &[&str] = &[
    "PRAGMA quick_check",
    "PRAGMA integrity_check",
    "SELECT count(*) FROM t",
    "SELECT sum(length(v)), sum(id) FROM t",
    "SELECT id, k FROM t WHERE k BETWEEN 'key-00100' AND 'key-00140' ORDER BY k",
    "SELECT id, length(v) FROM t WHERE id IN (0, 50, 777, 1499)",
];

fn all_outcomes(c: &Connection) -> Vec<String> {
    QUERIES.iter().map(|q| outcome(c, q)).collect()
}

#[test]
fn corrupt_and_truncated_files_behave_as_with_the_unix_vfs() {
    let dir = tempdir();
    let good_path = dir.path().join("good.db");
    good_database(&good_path);
    let good = std::fs::read(&good_path).unwrap();
    let bpe_admin = open_bpe(&dir.path().join("admin.db"));
    exec(&bpe_admin, "EXEC sp_configure 'max server memory (MB)', 1");
    let mut errors_seen = 0;
    for (i, (name, bytes)) in variants(&good).into_iter().enumerate() {
        let unix_path = dir.path().join(format!("v{i}-unix.db"));
        let bpe_path = dir.path().join(format!("v{i}-bpe.db"));
        std::fs::write(&unix_path, &bytes).unwrap();
        std::fs::write(&bpe_path, &bytes).unwrap();
        let unix = all_outcomes(&open_unix(&unix_path));
        let bpe = all_outcomes(&open_bpe(&bpe_path));
        for (q, (u, b)) in QUERIES.iter().zip(unix.iter().zip(&bpe)) {
            assert_eq!(b, u, "{name}: {q} differs between bpe and unix");
        }
        errors_seen += unix.iter().filter(|o| o.starts_with("error")).count();
        // Neither VFS changed the file (a read-only workload on a damaged file).
        assert!(
            std::fs::read(&bpe_path).unwrap() == bytes,
            "{name}: bpe changed the file"
        );
    }
    assert!(errors_seen > 10, "the variants hardly damaged anything");
}

#[test]
fn a_repaired_file_is_read_fresh() {
    let dir = tempdir();
    let path = dir.path().join("repair.db");
    good_database(&path);
    let good = std::fs::read(&path).unwrap();
    let expected = all_outcomes(&open_unix(&path));
    // Damage every page past the header, read it through bpe (caching what it can), then put the
    // good file back while no connection is open: the next connection sees the good file.
    let mut bad = good.clone();
    for page in 1..good.len() / PAGE {
        bad[page * PAGE + 8..page * PAGE + 64].fill(0x5a);
    }
    std::fs::write(&path, &bad).unwrap();
    {
        let c = open_bpe(&path);
        let damaged = all_outcomes(&c);
        assert_ne!(damaged, expected, "the damage changed nothing");
    }
    std::fs::write(&path, &good).unwrap();
    let c = open_bpe(&path);
    assert_eq!(all_outcomes(&c), expected);
}
