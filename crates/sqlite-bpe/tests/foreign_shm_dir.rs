//! Another local user who makes this user's directory under /dev/shm
//! (`/dev/shm/sqlite-bpe-<uid>`, where a shared extension's index and the counters for
//! `sqlite-bpe monitor` live) before this user does. Nothing of ours goes there then (refusing
//! is right), but the refusal must be visible: the extension's `private_because` and
//! sqlite3_log name the directory and why it is not ours, and sqlite3_log says the counters are
//! not published.
//!
//! The real /dev/shm is shared by the machine (and by the tests running at the same time): the
//! process runs in a private mount namespace over a tmpfs of its own, where the directory is
//! made and given to uid 65534. Needs `unshare --mount` and `chown` (root, or a
//! namespace-capable container): skipped with a message where they are refused.

mod common;
use common::*;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Run by `sh -c` inside the namespace: a tmpfs over /dev/shm holding this user's directory,
/// mode 0700 but another user's, then the program (`$0`, with its arguments) in its place.
const FOREIGN_DIR_THEN_PROGRAM: &str = r#"mount -t tmpfs -o size=64m tmpfs /dev/shm || exit 97
d=/dev/shm/sqlite-bpe-$(id -u)
mkdir -m 0700 "$d" && chown 65534:65534 "$d" || exit 98
exec "$0" "$@""#;

/// Whether this machine lets us mount a tmpfs in a private mount namespace and give a file to
/// another user.
fn permitted() -> bool {
    Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c"])
        .arg("mount -t tmpfs -o size=1m tmpfs /dev/shm && touch /dev/shm/x && chown 65534 /dev/shm/x")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Set in the child that [`child_entry`] runs in.
const CHILD: &str = "BPE_FOREIGN_SHM_TEST_CHILD";

/// Not a test: the body of the child process of
/// `a_directory_another_user_made_is_refused_visibly` (does nothing unless
/// BPE_FOREIGN_SHM_TEST_CHILD is set). Collects what sqlite3_log says while the engine starts
/// with the shared extension of its environment and runs its first second (the counters are
/// published at once, then every second), and prints it, one message a line, after `LOG `; and
/// the extension's state, last failure and why it is private after `state=`, `failure=` and
/// `private_because=`.
#[test]
#[ignore]
fn child_entry() {
    if std::env::var(CHILD).is_err() {
        return;
    }
    collect_sqlite_log();
    let conn = open_bpe(&std::env::current_dir().unwrap().join("app.db"));
    conn.execute_batch("CREATE TABLE t(x); INSERT INTO t VALUES (1);")
        .unwrap();
    let (state, failure, why): (String, Option<String>, Option<String>) = conn
        .query_row(
            "SELECT state_description, last_failure, private_because \
             FROM bpe_extension_configuration",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .unwrap();
    println!("state={state}");
    println!("failure={}", failure.unwrap_or_default());
    println!("private_because={}", why.unwrap_or_default());
    // The publisher tries at once; waits for what it says, for a while.
    let deadline = Instant::now() + Duration::from_secs(3);
    while Instant::now() < deadline && !sqlite_log().iter().any(|s| s.contains("counters")) {
        std::thread::sleep(Duration::from_millis(50));
    }
    for said in sqlite_log().iter() {
        println!("LOG {said}");
    }
}

#[test]
fn a_directory_another_user_made_is_refused_visibly() {
    if !permitted() {
        println!("SKIPPED: `unshare --mount` with a tmpfs mount and chown are not permitted here");
        return;
    }
    let dir = tempdir();
    let ext = dir.path().join("shared.bpe");
    let mut cmd = Command::new("unshare");
    for v in bpe_vars() {
        cmd.env_remove(v);
    }
    let child = cmd
        .args(["--mount", "--propagation", "private", "sh", "-c"])
        .arg(FOREIGN_DIR_THEN_PROGRAM)
        .arg(std::env::current_exe().unwrap())
        .args(CHILD_ARGS)
        .env(CHILD, "1")
        .env("BPE_MAX_SERVER_MEMORY_MB", "1")
        .env("BPE_EXTENSION_FILE", &ext)
        .env("BPE_EXTENSION_SIZE", "16MB")
        .env("BPE_EXTENSION_SHARED", "1")
        .current_dir(dir.path())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let done = wait_with_limit(child, Duration::from_secs(120));
    let what = format!(
        "{} (timed out: {})\nstdout:\n{}\nstderr:\n{}",
        done.status, done.timed_out, done.stdout, done.stderr
    );
    assert!(done.success(), "the child failed: {what}");
    let out = &done.stdout;
    // (The test harness's "test child_entry ... " may start the first line.)
    let value = |key: &str| {
        out.lines()
            .find_map(|l| l.split_once(key).map(|(_, v)| v))
            .unwrap_or_else(|| panic!("no {key} in: {what}"))
    };
    // No shared memory in another user's directory: the extension, shared by default, is this
    // process's own instead, and says why.
    assert_eq!(value("state="), "BUFFER POOL EXTENSION ENABLED", "{what}");
    assert_eq!(value("failure="), "", "not a failure: {what}");
    let why = value("private_because=");
    assert!(why.contains("cannot be shared"), "{what}");
    assert!(why.contains("/dev/shm/sqlite-bpe-"), "{what}");
    assert!(why.contains("uid 65534"), "{what}");
    assert!(why.contains("this process's own instead"), "{what}");
    let logs: Vec<&str> = out.lines().filter(|l| l.starts_with("LOG ")).collect();
    assert!(
        logs.iter()
            .any(|l| l.contains("BPE_EXTENSION_FILE") && l.contains("uid 65534")),
        "the refused extension is not in sqlite3_log: {what}"
    );
    // The counters are not published, and sqlite3_log says so once, with the reason.
    let counters: Vec<&&str> = logs.iter().filter(|l| l.contains("counters")).collect();
    assert_eq!(counters.len(), 1, "{what}");
    assert!(counters[0].contains("/dev/shm/sqlite-bpe-"), "{what}");
    assert!(counters[0].contains("uid 65534"), "{what}");
}
