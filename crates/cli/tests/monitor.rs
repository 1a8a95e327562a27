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
    entry(pid).is_some()
}

/// The monitor's list entry of `pid`, if listed.
fn entry(pid: u32) -> Option<serde_json::Value> {
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
        .find(|p| p["pid"].as_u64() == Some(pid as u64))
        .cloned()
}

/// The shell is started as the benchmarks start their configurations' processes, through
/// `/proc/self/exe` as its argv[0] (they were once listed as `/proc/self/exe`): the list
/// names the executable.
#[test]
fn the_monitor_lists_a_live_engine_reads_its_rates_and_forgets_it_when_it_exits() {
    use std::os::unix::process::CommandExt;
    let dir = tempdir();
    let mut shell = Command::new(env!("CARGO_BIN_EXE_sqlite-bpe"))
        .arg0("/proc/self/exe")
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

    // A watchdog only: the shell publishes about once a second, later on a loaded machine.
    let deadline = Instant::now() + Duration::from_secs(60);
    while !listed(pid) {
        assert!(Instant::now() < deadline, "pid {pid} never listed");
        std::thread::sleep(Duration::from_millis(200));
    }
    let listed_as = entry(pid).unwrap();
    let command = listed_as["command"].as_str().unwrap();
    let exe = std::fs::canonicalize(env!("CARGO_BIN_EXE_sqlite-bpe")).unwrap();
    assert!(
        command.starts_with(&format!("{} shell ", exe.display())),
        "listed as {command:?}"
    );
    let table = monitor(&[]);
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(table.contains("memory MiB"), "{table}");
    assert!(!table.contains("/proc/self/exe"), "{table}");
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
    // The histograms beside the counters are published too.
    let histograms = sample["histograms"].as_array().expect("histograms");
    assert!(
        histograms.iter().any(|h| h["name"] == "Extension read time"
            && h["buckets_ns_log2"]
                .as_array()
                .is_some_and(|b| b.len() == 40)),
        "{sample}"
    );

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

/// A failing command prints its error alone, on one line, even where RUST_BACKTRACE
/// is set (it used to print anyhow's Debug form: the error and a 20-frame backtrace).
#[test]
fn an_error_is_printed_alone_even_with_rust_backtrace_set() {
    // No process has this pid (above the kernel's pid_max limit of 2^22).
    let out = Command::new(env!("CARGO_BIN_EXE_sqlite-bpe"))
        .args(["monitor", "--pid", "2000000000", "--once"])
        .env("RUST_BACKTRACE", "1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.starts_with("sqlite-bpe: process 2000000000 publishes no sqlite-bpe counters"),
        "{stderr}"
    );
    assert_eq!(stderr.lines().count(), 1, "more than the error: {stderr}");
    assert!(!stderr.to_lowercase().contains("backtrace"), "{stderr}");
}

/// Run by `sh -c` in a private mount namespace: a fresh tmpfs over /dev/shm, in it this user's
/// counters directory holding a sample that reads as live (the shell's own pid and start time,
/// which `exec` keeps for the monitor), the directory and sample then given to another user
/// (uid 65534) as if that user had made them first; then the monitor (`$0`, with its arguments)
/// in the shell's place.
const FORGE_THEN_MONITOR: &str = r#"mount -t tmpfs -o size=1m tmpfs /dev/shm || exit 97
d=/dev/shm/sqlite-bpe-$(id -u)
mkdir -m 0700 "$d" || exit 98
started=$(cut -d' ' -f22 /proc/$$/stat)
printf 'sqlite-bpe counters 1\npid\t%s\nstarted\t%s\ntime_ms\t1\nstate\tFORGED\n' $$ "$started" > "$d/$$.counters"
chown -R 65534:65534 "$d" || exit 98
exec "$0" "$@""#;

/// Whether this machine lets us mount a tmpfs in a private mount namespace and give a file to
/// another user (root, or a namespace-capable container).
fn namespaces_permitted() -> bool {
    Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c"])
        .arg("mount -t tmpfs -o size=1m tmpfs /dev/shm && touch /dev/shm/x && chown 65534 /dev/shm/x")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The monitor with `args`, run in a namespace prepared by [`FORGE_THEN_MONITOR`].
fn monitor_over_a_forged_directory(args: &[&str]) -> std::process::Output {
    let out = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c"])
        .arg(FORGE_THEN_MONITOR)
        .arg(env!("CARGO_BIN_EXE_sqlite-bpe"))
        .arg("monitor")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        !matches!(out.status.code(), Some(97 | 98)),
        "cannot prepare the namespace: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Another local user who makes `/dev/shm/sqlite-bpe-<uid>` before this user does
/// cannot show this user's monitor a forged sample (a sample that names a live process of
/// this user, with its start time): the monitor reads only from this user's own directory
/// (mode 0700, not a link), and says why it does not read that one. The real /dev/shm is not
/// touched: the test runs in a private mount namespace over a tmpfs of its own.
#[test]
fn the_monitor_shows_no_sample_from_a_directory_another_user_made() {
    if !namespaces_permitted() {
        println!("SKIPPED: no private mount namespace or chown here (needs root)");
        return;
    }
    let out = monitor_over_a_forged_directory(&["--json"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}\n{stdout}");
    let list: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(list, serde_json::json!([]), "a forged sample was listed");
    assert!(
        stderr.contains("/dev/shm/sqlite-bpe-") && stderr.contains("uid 65534"),
        "the monitor does not say why it reads nothing: {stderr}"
    );

    let out = monitor_over_a_forged_directory(&[]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stdout.contains("FORGED"), "{stdout}");
    assert!(stderr.contains("uid 65534"), "{stderr}\n{stdout}");
}
