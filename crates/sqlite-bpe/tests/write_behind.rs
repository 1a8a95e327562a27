//! Write-behind through SQLite (rollback mode): a transaction that outgrows SQLite's own cache
//! spills the same pages to the file again and again; bpe holds them in L1 under the EXCLUSIVE
//! lock and writes each once at the sync or the unlock. What must hold: a plain SQLite reader
//! (the unix VFS, which bpe does not serve) sees every committed row the moment the lock is
//! gone, with or without a sync; a rolled-back or killed transaction leaves the old rows.
//!
//! Write-behind is opt-in (`BPE_WRITE_BEHIND=1`): this test binary turns it on for its whole
//! process, and for its children. `raw_file.rs` covers the default, where the pages SQLite
//! writes are in the file at once.

mod common;
use common::*;
use rusqlite::Connection;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

const ROWS: i64 = 2000;
const CHILD: &str = "WRITE_BEHIND_CHILD";
const CHILD_DB: &str = "WRITE_BEHIND_DB";

/// The engine's counters are the process's: one test at a time. The first also turns
/// write-behind on, before the engine reads its settings (every test takes this lock before
/// it opens a connection, so no other thread reads the environment meanwhile).
fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    static OPT_IN: std::sync::Once = std::sync::Once::new();
    let guard = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    OPT_IN.call_once(|| std::env::set_var("BPE_WRITE_BEHIND", "1"));
    guard
}

fn value(id: i64, version: i64) -> Vec<u8> {
    let mut v = format!("row {id} version {version} ").into_bytes();
    v.resize(400, b'a' + (id % 26) as u8);
    v
}

/// A database of ROWS rows at version 0, in rollback (DELETE) mode, made by plain SQLite.
fn create(dir: &Path) -> PathBuf {
    create_with_page_size(dir, 4096)
}

fn create_with_page_size(dir: &Path, page_size: u32) -> PathBuf {
    let path = dir.join(format!("db{page_size}"));
    let c = open_unix(&path);
    c.execute_batch(&format!(
        "PRAGMA page_size = {page_size}; PRAGMA journal_mode = DELETE;
         CREATE TABLE t(id INTEGER PRIMARY KEY, v BLOB);"
    ))
    .unwrap();
    c.execute_batch("BEGIN").unwrap();
    for id in 1..=ROWS {
        c.execute(
            "INSERT INTO t VALUES (?1, ?2)",
            rusqlite::params![id, value(id, 0)],
        )
        .unwrap();
    }
    c.execute_batch("COMMIT").unwrap();
    path
}

/// A bpe writer whose own cache holds 10 pages of the table's ~250: it spills.
fn writer(path: &Path, synchronous: &str) -> Connection {
    let c = open_bpe(path);
    c.execute_batch(&format!(
        "PRAGMA cache_size = 10; PRAGMA synchronous = {synchronous};"
    ))
    .unwrap();
    c
}

/// Rewrites rows in a scattered order, `rounds` times over: the pages of the table are spilled
/// many times each. Returns each row's version afterwards.
fn rewrite(c: &Connection, rounds: i64) -> Vec<i64> {
    let mut versions = vec![0; ROWS as usize + 1];
    for round in 1..=rounds {
        for i in 0..ROWS {
            let id = (i * 769) % ROWS + 1;
            c.execute(
                "UPDATE t SET v = ?1 WHERE id = ?2",
                rusqlite::params![value(id, round), id],
            )
            .unwrap();
            versions[id as usize] = round;
        }
    }
    versions
}

/// Every row as a plain SQLite connection sees it, against the versions expected.
fn check_plain(path: &Path, versions: &[i64]) {
    let c = open_unix(path);
    let ok: String = c
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(ok, "ok");
    let mut stmt = c.prepare("SELECT id, v FROM t ORDER BY id").unwrap();
    let rows = stmt
        .query_map([], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, Vec<u8>>(1)?)))
        .unwrap();
    let mut n = 0;
    for row in rows {
        let (id, v) = row.unwrap();
        assert_eq!(
            v,
            value(id, versions[id as usize]),
            "row {id} (plain SQLite)"
        );
        n += 1;
    }
    assert_eq!(n, ROWS);
}

#[test]
fn a_spilling_transaction_writes_each_page_once_and_plain_sqlite_sees_the_commit() {
    let _serial = serial();
    for page_size in [4096, 8192, 16384] {
        spill_and_commit(page_size);
    }
}

fn spill_and_commit(page_size: u32) {
    let dir = tempdir();
    let path = create_with_page_size(dir.path(), page_size);
    let c = writer(&path, "FULL");
    let (behind0, writes0) = (
        counter(&c, "Write-behind pages/sec"),
        counter(&c, "Page writes/sec"),
    );
    c.execute_batch("BEGIN").unwrap();
    let versions = rewrite(&c, 3);
    c.execute_batch("COMMIT").unwrap();
    let behind = counter(&c, "Write-behind pages/sec") - behind0;
    let writes = counter(&c, "Page writes/sec") - writes0;
    // 60-250 pages, each spilled many times: written behind each time, to the file once each
    // at a sync (SQLite syncs once for the journal before its first spill, and at the commit).
    assert!(behind > 500, "{page_size}: {behind} pages written behind");
    assert!(
        writes < behind / 2,
        "{page_size}: {writes} page writes for {behind} written behind"
    );
    check_plain(&path, &versions);
    // And bpe's own readers, from L1.
    let n: i64 = c
        .query_row("SELECT count(*) FROM t WHERE v = ?1", [value(7, 3)], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!(n, 1);
}

#[test]
fn without_a_sync_the_commit_is_in_the_file_when_the_lock_goes() {
    let _serial = serial();
    let dir = tempdir();
    let path = create(dir.path());
    let c = writer(&path, "OFF");
    c.execute_batch("BEGIN").unwrap();
    let versions = rewrite(&c, 2);
    c.execute_batch("COMMIT").unwrap();
    check_plain(&path, &versions);
}

#[test]
fn a_rolled_back_spilling_transaction_leaves_the_old_rows() {
    let _serial = serial();
    let dir = tempdir();
    let path = create(dir.path());
    let c = writer(&path, "FULL");
    c.execute_batch("BEGIN").unwrap();
    rewrite(&c, 2);
    c.execute_batch("ROLLBACK").unwrap();
    let versions = vec![0; ROWS as usize + 1];
    check_plain(&path, &versions);
    let bad: i64 = c
        .query_row(
            "SELECT count(*) FROM t WHERE substr(v, 1, 20) NOT LIKE '%version 0 %'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(bad, 0, "bpe's reader sees rolled-back rows");
}

/// Not a test: the child of the kill and exit tests (does nothing unless WRITE_BEHIND_CHILD is
/// set). Spills a transaction's pages, says so, then waits to be killed ("kill") or exits in the
/// middle of it ("exit").
#[test]
#[ignore = "run by the kill and exit tests"]
fn child_entry() {
    let Some(mode) = child_mode(CHILD) else {
        return;
    };
    let path = PathBuf::from(std::env::var(CHILD_DB).unwrap());
    let c = writer(&path, "FULL");
    c.execute_batch("BEGIN").unwrap();
    rewrite(&c, 2);
    let behind = sqlite_bpe::engine().counters().pages_written_behind;
    println!("SPILLED {behind}");
    match mode.as_str() {
        "kill" => std::thread::sleep(Duration::from_secs(60)),
        // As SQLite's crash-test VFS ends a process: exit, the transaction open.
        "exit" => std::process::exit(0),
        other => panic!("unknown child mode {other}"),
    }
}

/// Runs the child in `mode` on `path` until it spilled; returns it and the pages it wrote behind.
fn spilling_child(mode: &str, path: &Path) -> (std::process::Child, u64) {
    let mut child = child_command(CHILD, mode)
        .env(CHILD_DB, path)
        .env("BPE_WRITE_BEHIND", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    loop {
        line.clear();
        let n = std::io::BufRead::read_line(&mut out, &mut line).unwrap();
        assert!(n > 0, "the child ended before it spilled");
        // The harness's "test child_entry ... " may precede it on the same line.
        if let Some(at) = line.find("SPILLED ") {
            line.drain(..at + "SPILLED ".len());
            break;
        }
    }
    let behind: u64 = line.trim().parse().unwrap();
    assert!(behind > 500, "the child wrote only {behind} pages behind");
    (child, behind)
}

/// How many rows at version 2 the file's bytes hold, read past SQLite (and its recovery).
fn rows_at_version_2_on_disk(path: &Path) -> usize {
    let bytes = std::fs::read(path).unwrap();
    let needle = b" version 2 ";
    bytes.windows(needle.len()).filter(|w| w == needle).count()
}

#[test]
fn a_writer_killed_with_pages_written_behind_leaves_the_old_rows() {
    let _serial = serial();
    let dir = tempdir();
    let path = create(dir.path());
    let (mut child, _) = spilling_child("kill", &path);
    child.kill().unwrap(); // SIGKILL, the transaction open and pages in its L1
    child.wait().unwrap();
    // The hot journal rolls the file back: plain SQLite and bpe both see version 0.
    check_plain(&path, &vec![0; ROWS as usize + 1]);
    let c = open_bpe(&path);
    let bad: i64 = c
        .query_row(
            "SELECT count(*) FROM t WHERE substr(v, 1, 20) NOT LIKE '%version 0 %'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(bad, 0);
}

/// An exit in the middle of a transaction leaves the file as stock SQLite's would: what was
/// handed to the VFS is in it (the pages written behind are written back at exit), and the hot
/// journal then rolls it back.
#[test]
fn a_writer_that_exits_with_pages_written_behind_writes_them_back_first() {
    let _serial = serial();
    let dir = tempdir();
    let path = create(dir.path());
    let (mut child, _) = spilling_child("exit", &path);
    assert!(child.wait().unwrap().success());
    let spilled = rows_at_version_2_on_disk(&path);
    assert!(
        spilled > 100,
        "only {spilled} spilled rows reached the file"
    );
    check_plain(&path, &vec![0; ROWS as usize + 1]);
}

/// Writers in several threads, each with a connection of its own opened for one spilling
/// transaction and closed after it (L1 is the process's: one connection's pages written behind
/// sit beside the others' reads), under a busy timeout: each commit rewrites every row, so the
/// file must end with every row at the version of one commit, the last.
#[test]
fn short_lived_writers_in_several_threads_leave_one_commit_whole() {
    let _serial = serial();
    let dir = tempdir();
    let path = create(dir.path());
    let threads: Vec<_> = (1..=3i64)
        .map(|t| {
            let path = path.clone();
            std::thread::spawn(move || {
                for round in 0..3i64 {
                    let version = t * 10 + round;
                    let c = writer(&path, "NORMAL");
                    c.busy_timeout(Duration::from_secs(30)).unwrap();
                    c.execute_batch("BEGIN IMMEDIATE").unwrap();
                    for id in 1..=ROWS {
                        c.execute(
                            "UPDATE t SET v = ?1 WHERE id = ?2",
                            rusqlite::params![value(id, version), id],
                        )
                        .unwrap();
                    }
                    c.execute_batch("COMMIT").unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let c = open_unix(&path);
    let last: Vec<u8> = c
        .query_row("SELECT v FROM t WHERE id = 1", [], |r| r.get(0))
        .unwrap();
    let text = String::from_utf8_lossy(&last[..30]).to_string();
    let version: i64 = text.split_whitespace().nth(3).unwrap().parse().unwrap();
    check_plain(&path, &vec![version; ROWS as usize + 1]);
}
