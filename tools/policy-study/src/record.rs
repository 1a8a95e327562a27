//! Recording traces: SQLite workloads run through the bpe VFS with the engine's lookup trace on.

use bpe_core::{Engine, PageKey};
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Zipf};
use rusqlite::{params, Connection, OpenFlags};
use std::path::Path;

pub const PAGE_SIZE: usize = 4096;
const ROWS: i64 = 40_000; // ~45 MB: 1000-byte rows, about 3 per 4 KiB page
const LOOKUPS: usize = 30_000;

fn open(path: &Path) -> Connection {
    let uri = format!("file:{}?vfs=bpe", path.display());
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
        | OpenFlags::SQLITE_OPEN_CREATE
        | OpenFlags::SQLITE_OPEN_URI;
    let conn = Connection::open_with_flags(uri, flags).unwrap();
    // SQLite's own cache kept small, as recommended with bpe: the trace is what our pool sees.
    conn.execute_batch("PRAGMA journal_mode=WAL; PRAGMA cache_size=-256;")
        .unwrap();
    conn
}

fn build(path: &Path) -> Connection {
    let _ = std::fs::remove_file(path);
    let conn = open(path);
    conn.execute_batch("CREATE TABLE t(id INTEGER PRIMARY KEY, k INTEGER, n TEXT);")
        .unwrap();
    let tx = conn.unchecked_transaction().unwrap();
    {
        let mut ins = tx
            .prepare("INSERT INTO t(id, k, n) VALUES (?1, ?2, ?3)")
            .unwrap();
        let filler = "A".repeat(1000);
        for id in 1..=ROWS {
            ins.execute(params![id, (id * 7919) % ROWS, filler])
                .unwrap();
        }
    }
    tx.commit().unwrap();
    conn.execute_batch("CREATE INDEX t_k ON t(k); PRAGMA wal_checkpoint(TRUNCATE);")
        .unwrap();
    conn
}

fn traced(engine: &Engine, work: impl FnOnce()) -> Vec<PageKey> {
    engine.take_trace();
    engine.set_tracing(true);
    work();
    engine.set_tracing(false);
    engine.take_trace()
}

fn scan(conn: &Connection) {
    conn.query_row("SELECT sum(length(n)) FROM t", [], |r| r.get::<_, i64>(0))
        .unwrap();
}

fn lookup(conn: &Connection, id: i64) {
    let _: String = conn
        .query_row("SELECT n FROM t WHERE id = ?1", [id], |r| r.get(0))
        .unwrap();
}

/// Records the study's traces: (name, lookups).
pub fn record_all(dir: &Path) -> Vec<(String, Vec<PageKey>)> {
    sqlite_bpe::register().expect("register the bpe VFS");
    let engine = sqlite_bpe::existing_engine().expect("engine");
    let conn = build(&dir.join("study.db"));
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let zipf = Zipf::new(ROWS as u64, 1.0).unwrap();
    let mut out = Vec::new();

    out.push((
        "uniform lookups (seed 003)".to_string(),
        traced(&engine, || {
            for _ in 0..LOOKUPS {
                lookup(&conn, rng.gen_range(1..=ROWS));
            }
        }),
    ));
    out.push((
        "zipf lookups + full scans".to_string(),
        traced(&engine, || {
            for i in 0..LOOKUPS {
                if i % 10_000 == 5_000 {
                    scan(&conn);
                }
                lookup(&conn, zipf.sample(&mut rng) as i64);
            }
        }),
    ));
    out.push((
        "oltp: zipf lookups by index, updates, inserts".to_string(),
        traced(&engine, || {
            let mut next = ROWS + 1;
            for _ in 0..LOOKUPS {
                let id = zipf.sample(&mut rng) as i64;
                match rng.gen_range(0..10) {
                    0..=5 => {
                        let _: i64 = conn
                            .query_row("SELECT count(*) FROM t WHERE k = ?1", [id], |r| r.get(0))
                            .unwrap();
                    }
                    6..=8 => {
                        conn.execute(
                            "UPDATE t SET n = ?2 WHERE id = ?1",
                            params![id, "B".repeat(1000)],
                        )
                        .unwrap();
                    }
                    _ => {
                        conn.execute("INSERT INTO t(id, k, n) VALUES (?1, ?1, 'x')", [next])
                            .unwrap();
                        next += 1;
                    }
                }
            }
        }),
    ));
    out
}
