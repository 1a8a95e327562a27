//! `sqlite-bpe monitor` against a live process: a `sqlite-bpe shell` kept open on a pipe, its
//! engine publishing its counters, read by the monitor from another process.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn tempdir() -> tempfile::TempDir {
    let base = Path::new(env!("CARGO_TARGET_TMPDIR"));
    std::fs::create_dir_all(base).unwrap();
    tempfile::tempdir_in(base).unwrap()
}

fn monitor(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_sqlite-bpe"))
        .arg("monitor")
        .args(args)
        .output()
        .unwrap()
}

fn listed(pid: u32) -> bool {
    let out = monitor(&["--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    list.as_array()
        .unwrap()
        .iter()
        .any(|p| p["pid"].as_u64() == Some(pid as u64))
}

#[test]
fn the_monitor_lists_a_live_engine_reads_its_rates_and_forgets_it_when_it_exits() {
    let dir = tempdir();
    let mut shell = Command::new(env!("CARGO_BIN_EXE_sqlite-bpe"))
        .arg("shell")
        .arg(dir.path().join("m.db"))
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = shell.id();
    let mut stdin = shell.stdin.take().unwrap();
    stdin
        .write_all(
            b"CREATE TABLE t(id INTEGER PRIMARY KEY, n TEXT);\n\
              WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < 3000) \
              INSERT INTO t SELECT i, printf('%.500c', 'A') FROM c;\n\
              SELECT sum(length(n)) FROM t;\n",
        )
        .unwrap();
    stdin.flush().unwrap();

    let deadline = Instant::now() + Duration::from_secs(20);
    while !listed(pid) {
        assert!(Instant::now() < deadline, "pid {pid} never listed");
        std::thread::sleep(Duration::from_millis(200));
    }
    let out = monitor(&["--pid", &pid.to_string(), "--once", "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let sample: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(sample["pid"].as_u64(), Some(pid as u64));
    assert!(sample["interval_s"].as_f64().unwrap() > 0.0, "{sample}");
    assert!(sample["state"]
        .as_str()
        .unwrap()
        .starts_with("BUFFER POOL EXTENSION"));
    let counter = |name: &str| {
        sample["counters"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == name)
            .unwrap_or_else(|| panic!("no {name} in {sample}"))
            .clone()
    };
    // The shell's reads went through the pool: lookups counted, a rate and a hit ratio given.
    assert!(counter("Page lookups/sec")["value"].as_i64().unwrap() > 0);
    assert!(counter("Page lookups/sec")["per_second"].as_f64().is_some());
    let hit = counter("Buffer cache hit ratio")["ratio"].as_f64().unwrap();
    assert!((0.0..=100.0).contains(&hit), "{hit}");

    drop(stdin); // end of script: the shell exits
    assert!(shell.wait().unwrap().success());
    assert!(!listed(pid), "pid {pid} still listed after it exited");
    let gone = monitor(&["--pid", &pid.to_string(), "--once"]);
    assert!(!gone.status.success());
    assert!(
        String::from_utf8_lossy(&gone.stderr).contains(&format!("process {pid}")),
        "{}",
        String::from_utf8_lossy(&gone.stderr)
    );
}
