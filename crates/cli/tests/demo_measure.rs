//! The demo's measurement, through its JSON: where each configuration's pages come from.
//! (The demo runs each configuration in a process of its own, so it is run as the command.)

use std::path::Path;
use std::process::Command;

#[test]
fn each_configuration_reads_from_the_tier_it_names() {
    let base = Path::new(env!("CARGO_TARGET_TMPDIR"));
    std::fs::create_dir_all(base).unwrap();
    let dir = tempfile::tempdir_in(base).unwrap();
    let json = base.join(format!("demo-measure-{}.json", std::process::id()));
    let out = Command::new(env!("CARGO_BIN_EXE_sqlite-bpe"))
        .args(["demo", "--rows", "3000", "--lookups", "400"])
        .args(["--memory-mb", "1", "--latency-us", "0", "--dir"])
        .arg(dir.path())
        .arg("--json")
        .arg(&json)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "demo failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let _ = std::fs::remove_file(&json);
    let configs = report["configs"].as_array().unwrap();
    let names: Vec<&str> = configs
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["ram_resident", "limited_memory", "limited_memory_bpe"]
    );
    let reads = |i: usize, counter: &str| configs[i]["counters"][counter].as_u64().unwrap();
    let (ram, limited, bpe) = (0, 1, 2);
    assert_eq!(
        reads(ram, "page_reads"),
        0,
        "a warmed RAM-resident table read its file"
    );
    assert_eq!(
        reads(ram, "ext_page_reads") + reads(limited, "ext_page_reads"),
        0
    );
    assert!(
        reads(limited, "page_reads") > 0,
        "limited memory read nothing from the file"
    );
    assert!(
        reads(bpe, "ext_page_reads") > 0,
        "the extension served no page"
    );
    assert!(
        reads(bpe, "page_reads") < reads(limited, "page_reads"),
        "the extension did not spare file reads: {} vs {}",
        configs[bpe],
        configs[limited]
    );
    for c in configs {
        assert_eq!(c["operations"], 400, "{c}");
    }
    let table_bytes = report["parameters"]["database_bytes"].as_u64().unwrap();
    assert!(table_bytes > 2 << 20, "table of {table_bytes} bytes");
    assert_eq!(
        report["storage"]["data_device"]["emulated"], false,
        "latency 0 must not emulate a device"
    );
}
