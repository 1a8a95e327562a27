//! What the end-to-end benchmark tests share: running `bpe-bench` in a scratch directory.

use std::process::Command;

/// Runs `bpe-bench <args> --json FILE` in a fresh directory under the target's temporary
/// directory; fails the test with its output if it fails, else returns the JSON it wrote.
#[allow(dead_code)] // not every test file that declares `mod common` calls both
pub fn run_bench(args: &[&str]) -> serde_json::Value {
    run_bench_printing(args).1
}

/// As [`run_bench`], with what the run printed.
#[allow(dead_code)]
pub fn run_bench_printing(args: &[&str]) -> (String, serde_json::Value) {
    let dir = tempfile::Builder::new()
        .prefix("bench-test")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .unwrap();
    let json = dir.path().join("result.json");
    let out = Command::new(env!("CARGO_BIN_EXE_bpe-bench"))
        .current_dir(dir.path())
        .args(args)
        .arg("--json")
        .arg(&json)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "bench failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    (stdout, v)
}
