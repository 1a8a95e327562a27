//! The demo's measurement as a library call: where each configuration's pages come from.
//! (Its own test binary: a process has one engine.)

use sqlite_bpe_cli::demo::{measure, DemoOptions};
use std::path::Path;

#[test]
fn each_configuration_reads_from_the_tier_it_names() {
    let base = Path::new(env!("CARGO_TARGET_TMPDIR"));
    std::fs::create_dir_all(base).unwrap();
    let dir = tempfile::tempdir_in(base).unwrap();
    let report = measure(&DemoOptions {
        rows: 3000,
        lookups: 400,
        memory_mb: 1,
        latency_us: 0,
        dir: Some(dir.path().to_path_buf()),
        quiet: true,
        ..DemoOptions::default()
    })
    .unwrap();
    let names: Vec<&str> = report.results.iter().map(|r| r.name).collect();
    assert_eq!(
        names,
        ["ram_resident", "limited_memory", "limited_memory_bpe"]
    );
    let [ram, limited, bpe] = &report.results[..] else {
        unreachable!()
    };
    assert_eq!(
        ram.data_page_reads, 0,
        "a warmed RAM-resident table read its file"
    );
    assert_eq!(ram.extension_page_reads + limited.extension_page_reads, 0);
    assert!(
        limited.data_page_reads > 0,
        "limited memory read nothing from the file"
    );
    assert!(bpe.extension_page_reads > 0, "the extension served no page");
    assert!(
        bpe.data_page_reads < limited.data_page_reads,
        "the extension did not spare file reads: {bpe:?} vs {limited:?}"
    );
    assert!(
        report.table_bytes > 2 << 20,
        "table of {} bytes",
        report.table_bytes
    );
    assert!(
        report.emulation.is_none(),
        "latency 0 must not emulate a device"
    );
}
