//! Resident memory by thread count: a database larger than max server memory (32 MB), random
//! point reads from 1 and 16 threads (`BPE_MEMORY_THREADS=1,4,8,16` for more), each configuration in a fresh process, reporting the
//! peak RSS above the baseline taken once every connection is open (VmHWM, reset at the baseline
//! through /proc/self/clear_refs), through the bpe VFS and, beside it, the unix VFS.
//!
//! The test asserts the promise of docs/RELIABILITY.md: through the bpe VFS, the peak above the
//! baseline is at most max server memory + [`FIXED_OVERHEAD`], at every thread count, with each
//! connection's own SQLite page cache at 64 pages. SQLite's page cache is each connection's, not
//! the pool's: with SQLite's default (2000 KiB a connection) the second test holds bpe to the
//! same bound above what the unix VFS takes. The figures are memory, not time: the machine's
//! load does not move them.
//!
//!   BPE_MEMORY_THREADS=1,4,8,16 cargo test --release -p sqlite-bpe --test memory -- --nocapture

mod common;
use common::*;
use rand::{Rng, SeedableRng};
use rusqlite::Connection;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

const MAX_MEMORY_MB: u64 = 32;
/// Rows of ~3.9 KB (one 4 KiB leaf page each, overflow-free): ~1.5x max server memory.
const ROWS: i64 = 12_000;
const PAYLOAD: usize = 3_900;
/// Point reads per thread: enough for every thread to miss, evict and refill many times over.
const READS_PER_THREAD: usize = 16_000;
/// Each connection's own SQLite page cache (pages), the same in both VFSes.
const SQLITE_CACHE_PAGES: i64 = 64;
/// What the process may hold above the baseline besides max server memory: the fixed overhead
/// docs/RELIABILITY.md promises. At 16 threads more than half of it is SQLite's own (the unix
/// VFS's figure: 16 page caches of 64 pages, thread stacks), the rest the engine's (the slab's
/// slack, frame headers, per-read buffers); per-page mallocs took more than the bound
/// (docs/BENCHMARKS.md, "Figures moved from source comments").
const FIXED_OVERHEAD: u64 = 24 << 20;

const CHILD: &str = "BPE_MEMORY_CHILD";
const SQLITE_DEFAULT_CACHE: &str = "BPE_MEMORY_SQLITE_DEFAULT_CACHE";
const CHILD_DB: &str = "BPE_MEMORY_DB";

/// Not a test: the body of the child processes (does nothing unless BPE_MEMORY_CHILD is set).
#[test]
#[ignore = "run by the tests of memory.rs as a child process"]
fn child_entry() {
    let Ok(mode) = std::env::var(CHILD) else {
        return;
    };
    let (vfs, threads) = mode.split_once(':').expect("mode is VFS:THREADS");
    let threads: usize = threads.parse().unwrap();
    let db = PathBuf::from(std::env::var(CHILD_DB).unwrap());
    let open = |db: &Path| {
        let c = match vfs {
            "bpe" | "bpe+extension" => open_bpe(db),
            "unix" => open_unix(db),
            other => panic!("unknown VFS {other}"),
        };
        // SQLITE_DEFAULT_CACHE: SQLite's own default (-2000: 2000 KiB per connection).
        if std::env::var_os(SQLITE_DEFAULT_CACHE).is_none() {
            c.execute_batch(&format!("PRAGMA cache_size = {SQLITE_CACHE_PAGES}"))
                .unwrap();
        }
        c
    };
    let connections: Vec<Connection> = (0..threads).map(|_| open(&db)).collect();
    if vfs != "unix" {
        exec(
            &connections[0],
            &format!("EXEC sp_configure 'max server memory (MB)', {MAX_MEMORY_MB}"),
        );
    }
    if vfs == "bpe+extension" {
        let ext = db.with_extension("bpe");
        exec(&connections[0], &extension_on(ext.display(), "64 MB"));
    }
    let baseline = status_kib("VmRSS");
    // Resets VmHWM to the current RSS, so that the peak is this phase's.
    std::fs::write("/proc/self/clear_refs", "5").unwrap();
    std::thread::scope(|s| {
        for (t, c) in connections.into_iter().enumerate() {
            s.spawn(move || {
                let mut rng = rand::rngs::StdRng::seed_from_u64(t as u64);
                let mut stmt = c
                    .prepare("SELECT length(body) FROM r WHERE id = ?1")
                    .unwrap();
                for _ in 0..READS_PER_THREAD {
                    let id = rng.gen_range(0..ROWS);
                    let len: i64 = stmt.query_row([id], |r| r.get(0)).unwrap();
                    assert_eq!(len, PAYLOAD as i64);
                }
            });
        }
    });
    let peak = status_kib("VmHWM");
    println!("RESULT {vfs} {threads} {baseline} {peak}");
}

fn status_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/self/status"))
}

/// Peak RSS above the baseline, in KiB, of one configuration in a fresh process.
fn measure(db: &Path, vfs: &str, threads: usize) -> (u64, u64) {
    measure_with(db, vfs, threads, false)
}

/// `measure`, with SQLite's default page cache in every connection if `default_cache`.
fn measure_with(db: &Path, vfs: &str, threads: usize, default_cache: bool) -> (u64, u64) {
    let mut child = child_command(CHILD, &format!("{vfs}:{threads}"));
    if default_cache {
        child.env(SQLITE_DEFAULT_CACHE, "1");
    }
    let child = child
        .env(CHILD_DB, db)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let run = wait_with_limit(child, Duration::from_secs(300));
    assert!(
        run.success(),
        "child {vfs}:{threads} failed (timed out: {})\n{}\n{}",
        run.timed_out,
        run.stdout,
        run.stderr
    );
    let line = run
        .stdout
        .lines()
        .find_map(|l| l.split_once("RESULT ").map(|(_, r)| r.to_string()))
        .expect("the child reports its RESULT");
    let fields: Vec<u64> = line
        .split_whitespace()
        .skip(2)
        .map(|f| f.parse().unwrap())
        .collect();
    (fields[0], fields[1].saturating_sub(fields[0]))
}

fn create_database(db: &Path) {
    let c = open_unix(db);
    c.execute_batch("CREATE TABLE r(id INTEGER PRIMARY KEY, body BLOB);")
        .unwrap();
    let tx = c.unchecked_transaction().unwrap();
    {
        let mut insert = tx
            .prepare("INSERT INTO r VALUES (?1, randomblob(?2))")
            .unwrap();
        for id in 0..ROWS {
            insert.execute([id, PAYLOAD as i64]).unwrap();
        }
    }
    tx.commit().unwrap();
}

#[test]
fn peak_rss_above_the_baseline_stays_within_max_server_memory_at_every_thread_count() {
    let dir = tempdir();
    let db = dir.path().join("memory.db");
    create_database(&db);
    let size_mb = std::fs::metadata(&db).unwrap().len() >> 20;
    assert!(
        size_mb > MAX_MEMORY_MB,
        "the database must not fit in memory"
    );
    println!(
        "database {size_mb} MiB, max server memory {MAX_MEMORY_MB} MB, {READS_PER_THREAD} random \
         reads per thread, SQLite cache {SQLITE_CACHE_PAGES} pages per connection"
    );
    println!("peak RSS above the baseline (MiB):");
    println!("threads | bpe VFS | bpe VFS + 64 MB extension | unix VFS");
    let mut over = Vec::new();
    let counts = std::env::var("BPE_MEMORY_THREADS").unwrap_or_else(|_| "1,16".into());
    for threads in counts
        .split(',')
        .map(|t| t.trim().parse::<usize>().unwrap())
    {
        let (_, bpe) = measure(&db, "bpe", threads);
        let (_, extension) = measure(&db, "bpe+extension", threads);
        let (_, unix) = measure(&db, "unix", threads);
        let mib = |kib: u64| kib as f64 / 1024.0;
        println!(
            "{threads:>7} | {:>7.1} | {:>25.1} | {:>8.1}",
            mib(bpe),
            mib(extension),
            mib(unix)
        );
        for (arm, kib) in [("bpe", bpe), ("bpe+extension", extension)] {
            if (kib << 10) > (MAX_MEMORY_MB << 20) + FIXED_OVERHEAD {
                over.push((arm, threads, kib >> 10));
            }
        }
    }
    assert!(
        over.is_empty(),
        "peak RSS above the baseline exceeded max server memory ({MAX_MEMORY_MB} MB) + {} MiB \
         (arm, threads, MiB): {over:?}",
        FIXED_OVERHEAD >> 20
    );
}

/// SQLite's own page cache (2000 KiB per connection by default) is each connection's memory,
/// outside max server memory, the same through either VFS: 16 connections with the default take
/// ~44 MiB through the unix VFS. What bpe adds on top of it stays within max server memory and
/// the fixed overhead.
#[test]
fn with_sqlites_default_page_cache_bpe_adds_at_most_max_server_memory_and_the_overhead() {
    const THREADS: usize = 16;
    let dir = tempdir();
    let db = dir.path().join("memory.db");
    create_database(&db);
    let (_, bpe) = measure_with(&db, "bpe", THREADS, true);
    let (_, unix) = measure_with(&db, "unix", THREADS, true);
    println!(
        "{THREADS} threads, SQLite's default page cache: peak RSS above the baseline {:.1} MiB \
         through bpe, {:.1} MiB through unix",
        bpe as f64 / 1024.0,
        unix as f64 / 1024.0
    );
    assert!(
        unix > 8 << 10,
        "the unix arm took {unix} KiB: SQLite's default page caches did not fill, the \
         comparison says nothing"
    );
    let added = (bpe << 10).saturating_sub(unix << 10);
    assert!(
        added <= (MAX_MEMORY_MB << 20) + FIXED_OVERHEAD,
        "bpe added {} MiB to SQLite's own memory: more than max server memory ({MAX_MEMORY_MB} \
         MB) + {} MiB",
        added >> 20,
        FIXED_OVERHEAD >> 20
    );
}
