//! `sqlite-bpe demo` with tiny flags: it runs and prints every configuration.

use std::path::Path;
use std::process::Command;

#[test]
fn the_demo_prints_all_three_configurations() {
    let base = Path::new(env!("CARGO_TARGET_TMPDIR"));
    std::fs::create_dir_all(base).unwrap();
    let dir = tempfile::tempdir_in(base).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_sqlite-bpe"))
        .args([
            "demo",
            "--rows",
            "2000",
            "--lookups",
            "300",
            "--memory-mb",
            "1",
        ])
        .args(["--latency-us", "200", "--dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "demo failed:\n{stdout}\n{stderr}");
    for needle in [
        "ram_resident",
        "limited_memory ",
        "limited_memory_bpe",
        "lookups/s",
        "EMULATED slow device, read 200 us",
        "Extension page reads/sec",
        "Extension allocated pages",
        "Extension sequential write percentage",
    ] {
        assert!(
            stdout.contains(needle),
            "demo output lacks {needle:?}:\n{stdout}"
        );
    }
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "the demo left its work directory behind"
    );
}

fn demo(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_sqlite-bpe"))
        .arg("demo")
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Bad options are refused before the banner, naming the option.
#[test]
fn a_zero_is_refused_before_the_banner() {
    for flag in ["--rows", "--lookups", "--memory-mb"] {
        let (ok, stdout, stderr) = demo(&[flag, "0"]);
        assert!(!ok, "{flag} 0 ran:\n{stdout}");
        assert!(
            stderr.contains(&format!("{flag} 0")),
            "the error names {flag}:\n{stderr}"
        );
        assert!(
            !stderr.contains("random lookups"),
            "the banner came before the error:\n{stderr}"
        );
    }
}

/// A --dir on tmpfs is refused at once, saying why and what to give instead (not --ext-dir,
/// which the demo does not have), before anything is made there.
#[test]
fn a_dir_on_tmpfs_is_refused_with_what_to_do() {
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    if !mounts
        .lines()
        .any(|l| l.split_whitespace().nth(1) == Some("/dev/shm") && l.contains(" tmpfs "))
    {
        eprintln!("skipped: /dev/shm is not a tmpfs mount here");
        return;
    }
    let (ok, stdout, stderr) = demo(&["--dir", "/dev/shm"]);
    assert!(!ok, "the demo ran on tmpfs:\n{stdout}");
    assert!(
        stderr.contains("--dir /dev/shm is on tmpfs")
            && stderr.contains("give --dir a directory on a disk"),
        "{stderr}"
    );
    assert!(!stderr.contains("--ext-dir"), "{stderr}");
    assert!(!stderr.contains("random lookups"), "{stderr}");
}
