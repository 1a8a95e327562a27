//! One random SQL workload through `bpe` and through the plain unix VFS, with tiny memory and a
//! tiny extension to force churn through both tiers, in both journal modes: every query result
//! and the final database bytes must be identical, and integrity_check ok.
//!
//! `BPE_DIFFERENTIAL_STEPS` sets the steps per journal mode (default 1000; the test's churn
//! check fails if too few steps leave both tiers without evictions and extension reads).

mod common;
use common::*;
use rand::{Rng, SeedableRng};
use rusqlite::{params, Connection};

/// One step of the workload; queries return a printable result to compare.
fn step(conn: &Connection, op: u32, a: i64, b: i64, len: usize) -> String {
    let blob =
        |seed: i64| -> Vec<u8> { (0..len).map(|i| (seed as usize * 31 + i) as u8).collect() };
    let q = |sql: &str, p: &[&dyn rusqlite::ToSql]| -> String {
        let mut stmt = conn.prepare_cached(sql).unwrap();
        let rows: Vec<String> = stmt
            .query_map(p, |r| {
                Ok(format!("{:?}/{:?}", r.get_ref(0)?, r.get_ref(1)?))
            })
            .unwrap()
            .map(Result::unwrap)
            .collect();
        rows.join(",")
    };
    match op {
        0..=29 => conn
            .execute(
                "INSERT OR REPLACE INTO kv(id, k, v) VALUES (?1, ?2, ?3)",
                params![a, b, blob(a + b)],
            )
            .unwrap()
            .to_string(),
        30..=44 => conn
            .execute(
                "UPDATE kv SET v = ?2, k = k + 1 WHERE id = ?1",
                params![a, blob(b)],
            )
            .unwrap()
            .to_string(),
        45..=52 => conn
            .execute(
                "DELETE FROM kv WHERE id BETWEEN ?1 AND ?1 + ?2",
                params![a, b % 20],
            )
            .unwrap()
            .to_string(),
        53..=74 => q(
            "SELECT id, hex(substr(v, 1, 16)) || length(v) FROM kv WHERE id = ?1",
            &[&a],
        ),
        75..=89 => q(
            "SELECT count(*), sum(length(v)) FROM kv WHERE k BETWEEN ?1 AND ?1 + ?2",
            &[&b, &(a % 500)],
        ),
        90..=94 => {
            conn.execute_batch("BEGIN").unwrap();
            for i in 0..20 {
                conn.execute(
                    "INSERT OR REPLACE INTO kv(id, k, v) VALUES (?1, ?2, ?3)",
                    params![a + i, b, blob(i)],
                )
                .unwrap();
            }
            let commit = b % 4 != 0;
            conn.execute_batch(if commit { "COMMIT" } else { "ROLLBACK" })
                .unwrap();
            commit.to_string()
        }
        95..=97 => q("SELECT count(*), total(k) FROM kv", &[]),
        _ => {
            conn.execute_batch("VACUUM").unwrap();
            "vacuum".into()
        }
    }
}

/// Steps per journal mode: enough for the database to outgrow both tiers several times over.
fn steps() -> usize {
    std::env::var("BPE_DIFFERENTIAL_STEPS").map_or(1000, |v| {
        v.parse()
            .expect("BPE_DIFFERENTIAL_STEPS: a whole number of steps")
    })
}

fn run(journal: &str, seed: u64) {
    let dir = tempdir();
    let (pa, pb) = (dir.path().join("bpe.db"), dir.path().join("unix.db"));
    let a = open_bpe(&pa);
    let b = open_unix(&pb);
    // Operator statements on their own connection, so both databases see the same SQL.
    let admin = rusqlite::Connection::open_in_memory().unwrap();
    exec(&admin, "EXEC sp_configure 'max server memory (MB)', 1");
    let ext = dir.path().join("ext.bpe");
    exec(&admin, &format!("ALTER SERVER CONFIGURATION SET BUFFER POOL EXTENSION ON (FILENAME = '{}', SIZE = 3 MB)", ext.display()));
    for c in [&a, &b] {
        c.execute_batch(&format!(
            "PRAGMA page_size = 1024; PRAGMA journal_mode = {journal}; PRAGMA cache_size = 10;
             CREATE TABLE kv(id INTEGER PRIMARY KEY, k INTEGER, v BLOB); CREATE INDEX kv_k ON kv(k);"
        ))
        .unwrap();
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    for i in 0..steps() {
        let (op, x, y) = (
            rng.gen_range(0..100),
            rng.gen_range(0..3000),
            rng.gen_range(0..1000),
        );
        let len = rng.gen_range(50..2500);
        let (ra, rb) = (step(&a, op, x, y, len), step(&b, op, x, y, len));
        assert_eq!(ra, rb, "{journal} step {i} (op {op}) differs");
    }
    let ext_reads = counter(&admin, "Extension page reads/sec");
    let evictions = counter(&admin, "Lazy writes/sec");
    println!("{journal}: {evictions} evictions, {ext_reads} extension page reads");
    for c in [&a, &b] {
        let ok: String = c
            .query_row("PRAGMA integrity_check", [], |r| r.get(0))
            .unwrap();
        assert_eq!(ok, "ok");
        if journal == "WAL" {
            c.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)").unwrap();
        }
    }
    exec(
        &admin,
        "ALTER SERVER CONFIGURATION SET BUFFER POOL EXTENSION OFF",
    );
    drop(a);
    drop(b);
    let (mut fa, mut fb) = (std::fs::read(&pa).unwrap(), std::fs::read(&pb).unwrap());
    if journal == "WAL" {
        // In WAL mode the header's change counter (24..28) and its version-valid-for copy
        // (92..96) depend on SQLite's cache-spill history: two plain unix-VFS databases given
        // this same SQL differ there too (checked while writing this test). Every other byte,
        // every page included, must match.
        for f in [&mut fa, &mut fb] {
            f[24..28].fill(0);
            f[92..96].fill(0);
        }
    }
    let diff: Vec<usize> = (0..fa.len().min(fb.len()))
        .filter(|&i| fa[i] != fb[i])
        .collect();
    assert!(
        fa.len() == fb.len() && diff.is_empty(),
        "{journal}: database files differ: lengths {} {}, {} bytes differ, first at {:?}",
        fa.len(),
        fb.len(),
        diff.len(),
        &diff[..diff.len().min(12)]
    );
    assert!(
        evictions > 0 && ext_reads > 0,
        "{journal}: no churn (evictions {evictions}, extension reads {ext_reads})"
    );
}

/// Both modes in one test: the engine (memory, extension) is process-wide, so they must not overlap.
#[test]
fn bpe_and_unix_agree_on_every_result_and_byte() {
    run("WAL", 2);
    run("DELETE", 1);
}
