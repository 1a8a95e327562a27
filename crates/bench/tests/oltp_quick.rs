//! End to end: `bpe-bench oltp` at a tiny scale in each journal mode, checking the JSON it
//! writes (no timing): the terminals ran in the journal mode and `synchronous` asked for, bpe
//! and stock alike, and TPC-C's consistency conditions held after the run.

mod common;

fn run_oltp(journal: &str, synchronous: &str) -> serde_json::Value {
    common::run_bench(&[
        "oltp",
        "--quick",
        "--data-device",
        "emulated:ssd",
        "--items",
        "2000",
        "--seconds",
        "1",
        "--reference-mib",
        "0",
        "--configs",
        "memory_25_no_queue,memory_25_bpe,memory_25_bpe_no_queue,stock_memory_25",
        "--journal",
        journal,
        "--synchronous",
        synchronous,
    ])
}

fn check(v: &serde_json::Value, journal_mode: &str, synchronous: i64) {
    let configs = v["configs"].as_array().unwrap();
    assert_eq!(configs.len(), 4, "{v}");
    for c in configs {
        let d = &c["details"];
        assert_eq!(d["journal_mode"], journal_mode, "{c}");
        assert_eq!(d["synchronous"], synchronous, "{c}");
        assert!(c["operations"].as_u64().unwrap() > 0, "{c}");
        let conditions = d["consistency"].as_array().unwrap();
        assert_eq!(conditions.len(), 4, "{c}");
        assert!(conditions.iter().all(|x| x["passed"] == true), "{c}");
    }
}

// `normal` in both: SQLite's default is `full` (2), so only another level shows the option
// reached the terminals.
#[test]
fn oltp_runs_in_rollback_mode_when_asked() {
    let v = run_oltp("delete", "normal");
    assert_eq!(v["parameters"]["journal"], "rollback");
    assert_eq!(v["parameters"]["synchronous"], "NORMAL");
    check(&v, "delete", 1);
}

#[test]
fn oltp_runs_in_wal_mode_with_normal_sync_when_asked() {
    let v = run_oltp("wal", "normal");
    assert_eq!(v["parameters"]["journal"], "wal");
    check(&v, "wal", 1);
}
