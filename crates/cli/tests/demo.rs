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
