//! /dev/shm after SIGKILL: a killed process leaves its published counters and the commit logs
//! of the databases it wrote; the next process that starts an engine removes both (what live
//! processes still use stays).

mod common;
use common::*;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

const CHILD_DB: &str = "BPE_SHM_LEFTOVERS_DB";

/// Not a test: a child that commits through bpe in rollback mode, waits until it has published
/// its counters, says so and sleeps until killed.
#[test]
#[ignore = "run by shm_leftovers.rs as a child process"]
fn child_entry() {
    let Ok(db) = std::env::var(CHILD_DB) else {
        return;
    };
    let c = open_bpe(Path::new(&db));
    c.execute_batch(
        "PRAGMA journal_mode = DELETE;
         INSERT INTO t VALUES (1);
         INSERT INTO t VALUES (2);",
    )
    .unwrap();
    let counters = counters_file(std::process::id());
    let deadline = Instant::now() + Duration::from_secs(20);
    while !counters.exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    println!("ready");
    std::thread::sleep(Duration::from_secs(120));
}

fn uid() -> u32 {
    std::fs::metadata("/proc/self").unwrap().uid()
}

fn counters_file(pid: u32) -> PathBuf {
    PathBuf::from(format!("/dev/shm/sqlite-bpe-{}/{pid}.counters", uid()))
}

fn peer_log(db: &Path) -> PathBuf {
    let m = std::fs::metadata(db).unwrap();
    PathBuf::from(format!(
        "/dev/shm/sqlite-bpe-{}-{}-{}",
        uid(),
        m.dev(),
        m.ino()
    ))
}

/// Starts a child on `db` and waits for its "ready".
fn start_child(db: &Path) -> std::process::Child {
    let mut child = child_command(CHILD_DB, &db.display().to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let out = BufReader::new(child.stdout.take().unwrap());
    // (The test harness's "test child_entry ... " may start the line.)
    let ready = out
        .lines()
        .map_while(Result::ok)
        .any(|l| l.ends_with("ready"));
    assert!(ready, "child {} never got ready", child.id());
    child
}

/// SIGKILLs the child; returns its pid.
fn kill(mut child: std::process::Child) -> u32 {
    child.kill().unwrap();
    child.wait().unwrap();
    child.id()
}

#[test]
fn what_killed_processes_leave_in_dev_shm_the_next_process_removes() {
    let dir = tempdir();
    let dbs: Vec<PathBuf> = (0..3)
        .map(|i| dir.path().join(format!("k{i}.db")))
        .collect();
    for db in &dbs {
        // A database with a header, so that the children's commits are logged.
        open_unix(db)
            .execute_batch("CREATE TABLE t(x); INSERT INTO t VALUES (0);")
            .unwrap();
    }
    // All alive at once (each sweeps at its start), then all killed.
    let children: Vec<_> = dbs.iter().map(|db| start_child(db)).collect();
    let pids: Vec<u32> = children.into_iter().map(kill).collect();
    for db in &dbs {
        assert!(peer_log(db).exists(), "no commit log for {}", db.display());
    }
    let left: Vec<u32> = pids
        .iter()
        .copied()
        .filter(|&p| counters_file(p).exists())
        .collect();
    assert!(
        !left.is_empty(),
        "the killed children published no counters: nothing to test"
    );

    // A live process keeps its own log: this one maps the first database's.
    let live = open_bpe(&dbs[0]);
    live.execute_batch("PRAGMA journal_mode = DELETE; INSERT INTO t VALUES (2);")
        .unwrap();

    // The next process with an engine: a child that starts and is killed in turn (its own
    // leftovers are for the one after it).
    let next = dir.path().join("next.db");
    open_unix(&next)
        .execute_batch("CREATE TABLE t(x);")
        .unwrap();
    kill(start_child(&next));
    for p in &left {
        assert!(
            !counters_file(*p).exists(),
            "the counters of killed process {p} stayed"
        );
    }
    for db in &dbs[1..] {
        assert!(
            !peer_log(db).exists(),
            "the commit log of {} (nobody maps it) stayed",
            db.display()
        );
    }
    assert!(
        peer_log(&dbs[0]).exists(),
        "a log this process maps was removed"
    );
    drop(live);
}
