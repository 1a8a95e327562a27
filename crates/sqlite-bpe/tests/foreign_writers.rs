//! Never a stale row, whoever writes: bpe readers beside writers that are not bpe connections
//! (a unix-VFS connection of this process, as rqlite's write connection is; plain `sqlite3`
//! processes), in both journal modes, every checkpoint mode and several page sizes. The oracle
//! is the writer's own record of every row's value: any row a bpe reader returns otherwise is
//! stale.

mod common;
use common::*;
use rand::{Rng, SeedableRng};
use rusqlite::{Connection, OpenFlags};
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};

const ROWS: i64 = 400;

/// A connection on SQLite's own unix VFS: to bpe, a foreign writer like any other process's.
fn open_plain(path: &Path) -> Connection {
    let c = Connection::open_with_flags_and_vfs(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE,
        "unix",
    )
    .unwrap();
    c.execute_batch("PRAGMA wal_autocheckpoint = 0").unwrap();
    // A RESTART or TRUNCATE checkpoint waits for readers as long as the busy handler lets it:
    // the one reader in the way is this thread's.
    c.busy_timeout(std::time::Duration::ZERO).unwrap();
    c
}

/// Rows whose value differs from what the writer committed last.
fn stale_rows(conn: &Connection, expected: &[i64]) -> usize {
    let mut stmt = conn
        .prepare_cached("SELECT id, v FROM t ORDER BY id")
        .unwrap();
    let rows = stmt
        .query_map([], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?)))
        .unwrap();
    let mut stale = 0;
    let mut seen = 0;
    for row in rows {
        let (id, v) = row.unwrap();
        seen += 1;
        if expected[id as usize] != v {
            stale += 1;
        }
    }
    assert_eq!(seen, expected.len(), "rows missing");
    stale
}

struct Run {
    stale: usize,
    rounds: usize,
}

/// `rounds` rounds of: a plain writer commits a few updates (sometimes two transactions), a
/// bpe reader sometimes looks between the commit and the checkpoint, a plain reader sometimes
/// holds a read transaction across rounds (so checkpoints stop short and restarts wait), the
/// checkpoint runs in `mode`; then a long-lived and a fresh bpe connection read every row.
fn run(journal: &str, page_size: u32, mode: Option<&str>, rounds: usize, seed: u64) -> Run {
    let dir = tempdir();
    let db = dir.path().join("f.db");
    let writer = open_plain(&db);
    writer
        .execute_batch(&format!(
            "PRAGMA page_size = {page_size}; PRAGMA journal_mode = {journal};
             CREATE TABLE t(id INTEGER PRIMARY KEY, v INTEGER, pad BLOB);"
        ))
        .unwrap();
    let mut expected = vec![0i64; ROWS as usize];
    {
        let tx = writer.unchecked_transaction().unwrap();
        for id in 0..ROWS {
            tx.execute("INSERT INTO t VALUES (?1, 0, randomblob(300))", [id])
                .unwrap();
        }
        tx.commit().unwrap();
    }
    let reader = open_bpe(&db);
    let mut holder: Option<(Connection, usize)> = None;
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut stale = stale_rows(&reader, &expected);
    for round in 0..rounds {
        let transactions = if rng.gen_ratio(1, 3) { 2 } else { 1 };
        for t in 0..transactions {
            let tx = writer.unchecked_transaction().unwrap();
            for k in 0..rng.gen_range(1..8) {
                let id = rng.gen_range(0..ROWS);
                let v = (round * 100 + t * 10 + k + 1) as i64;
                tx.execute("UPDATE t SET v = ?1 WHERE id = ?2", [v, id])
                    .unwrap();
                expected[id as usize] = v;
            }
            tx.commit().unwrap();
            if rng.gen_ratio(1, 2) {
                stale += stale_rows(&reader, &expected);
            }
        }
        // (In rollback mode a reader blocks the writer's commit: WAL only.)
        if mode.is_some() && holder.is_none() && rng.gen_ratio(1, 5) {
            let c = open_plain(&db);
            c.execute_batch("BEGIN; SELECT count(*) FROM t;").unwrap();
            holder = Some((c, round + rng.gen_range(1..4)));
        }
        if let Some(mode) = mode {
            // Busy (a reader in the way) is an answer, not an error.
            writer
                .query_row(&format!("PRAGMA wal_checkpoint({mode})"), [], |_| Ok(()))
                .unwrap();
        }
        if holder.as_ref().is_some_and(|(_, until)| *until <= round) {
            let (c, _) = holder.take().unwrap();
            c.execute_batch("COMMIT").unwrap();
        }
        stale += stale_rows(&reader, &expected);
        stale += stale_rows(&open_bpe(&db), &expected);
    }
    Run { stale, rounds }
}

#[test]
fn bpe_readers_beside_a_plain_writer_never_see_a_stale_row() {
    let probe = open_bpe(&tempdir().path().join("probe.db"));
    let hits_before = counter(&probe, "Buffer cache hit ratio");
    let forgotten_before = counter(&probe, "Pages invalidated by other processes");
    let seed = crash_seed();
    let mut failures = Vec::new();
    let mut total_rounds = 0;
    for page_size in [4096, 8192] {
        let mut cases: Vec<(&str, Option<&str>)> = ["PASSIVE", "FULL", "RESTART", "TRUNCATE"]
            .into_iter()
            .map(|m| ("WAL", Some(m)))
            .collect();
        cases.push(("DELETE", None));
        for (i, (journal, mode)) in cases.into_iter().enumerate() {
            let r = run(journal, page_size, mode, 100, seed + i as u64);
            total_rounds += r.rounds;
            if r.stale > 0 {
                failures.push(format!(
                    "{journal} {mode:?} page size {page_size}: {} stale rows in {} rounds",
                    r.stale, r.rounds
                ));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "seed {seed}: stale rows served:\n{}",
        failures.join("\n")
    );
    // The oracle tested a cache: rows were served from it, and foreign checkpoints forgot
    // pages one by one rather than always the whole file.
    assert!(counter(&probe, "Buffer cache hit ratio") - hits_before > 1000);
    assert!(
        counter(&probe, "Pages invalidated by other processes") > forgotten_before,
        "no checkpoint was followed page by page in {total_rounds} rounds"
    );
}

/// A missed commit, step by step, every step but A a separate plain `sqlite3` process: frames
/// appended to a WAL after A last looked, backfilled, then the WAL restarted by another writer.
#[test]
fn a_wal_restart_after_frames_backfilled_unseen_serves_no_stale_row() {
    let Some(shell) = sqlite3_shell() else {
        panic!("the sqlite3 shell is not installed (apt-get install sqlite3)");
    };
    for trial in 0..3 {
        let dir = tempdir();
        let db = dir.path().join("r.db");
        let plain = |sql: &str| {
            let (out, err, ok) = run_shell(dir.path(), &format!(".open r.db\n{sql}\n"));
            assert!(ok, "plain sqlite3 failed on {sql}: {err}");
            out
        };
        plain(
            "PRAGMA journal_mode=WAL; CREATE TABLE t(id INTEGER PRIMARY KEY, v INTEGER, pad BLOB);
             WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < 99)
             INSERT INTO t SELECT i, 0, randomblob(600) FROM n;
             PRAGMA wal_checkpoint(TRUNCATE);",
        );
        let a = open_bpe(&db);
        let read = |id: i64| -> i64 {
            a.query_row("SELECT v FROM t WHERE id = ?1", [id], |r| r.get(0))
                .unwrap()
        };
        let read_all = || {
            let n: i64 = a
                .query_row("SELECT sum(length(pad)) FROM t", [], |r| r.get(0))
                .unwrap();
            assert_eq!(n, 60_000);
        };
        read_all(); // 1
        plain("UPDATE t SET v = 1 WHERE id = 99;"); // 2: W0
        let mut r = Command::new(&shell) // 3: R holds a read mark
            .arg("-batch")
            .arg(&db)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut r_in = r.stdin.take().unwrap();
        let mut r_out = BufReader::new(r.stdout.take().unwrap());
        writeln!(r_in, "BEGIN; SELECT count(*) FROM t;").unwrap();
        let mut line = String::new();
        r_out.read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "100");
        plain("PRAGMA wal_checkpoint(PASSIVE);"); // 4: C
        read_all(); // 5: A caches every page
        plain("UPDATE t SET v = 2 WHERE id = 50;"); // 6: W, appended to the old WAL
        writeln!(r_in, "COMMIT;").unwrap(); // 7: R ends, C backfills
        drop(r_in);
        assert!(r.wait().unwrap().success());
        plain("PRAGMA wal_checkpoint(PASSIVE);");
        plain("UPDATE t SET v = 3 WHERE id = 10;"); // 8: W2 restarts the WAL
        assert_eq!(
            read(50),
            2,
            "trial {trial}: row 50 stale after the WAL restart"
        ); // 9
        assert_eq!((read(10), read(99)), (3, 1));
    }
}
