//! End to end: `bpe-bench lookup` at a tiny scale, checking the JSON it writes.

mod common;

/// Runs `bpe-bench lookup --quick` at a tiny scale on an emulated SSD with `extra` arguments;
/// returns the JSON it wrote.
fn lookup(extra: &[&str]) -> serde_json::Value {
    let mut args = vec![
        "lookup",
        "--quick",
        "--data-device",
        "emulated:ssd",
        "--rows",
        "4000",
        "--lookups",
        "300",
        "--memory-mb",
        "2",
        "--extension-mb",
        "64",
        "--reference-mib",
        "16",
    ];
    args.extend_from_slice(extra);
    common::run_bench(&args)
}

#[test]
fn lookup_runs_all_bpe_configurations() {
    // On an emulated device the stock SQLite configurations run only when asked for.
    let v = lookup(&[]);
    assert_eq!(v["benchmark"], "lookup");
    assert_eq!(v["storage"]["data_device"]["name"], "emulated:ssd");
    assert!(
        v["reference"]["rand_read_4k_qd1"]["mean_us"]
            .as_f64()
            .unwrap()
            > 0.0
    );
    let names: Vec<&str> = v["configs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "ram_resident",
            "cold_slow_disk",
            "limited_memory",
            "limited_memory_bpe",
            "ssd_cold",
            "limited_memory_bpe_half_ext",
            "limited_memory_bpe_zipf",
            "restart",
        ]
    );
    for c in v["configs"].as_array().unwrap() {
        assert_eq!(c["operations"], 300, "{c}");
        let s = c["seconds"].as_f64().unwrap();
        assert!(s > 0.0 && s < 60.0, "{c}");
        let counters = &c["counters"];
        assert!(counters["hit_ratio_percent"].as_f64().unwrap() <= 100.0);
        // Pages reached the engine (SQLite's own small cache answers some repeats).
        assert!(counters["engine"].as_bool().unwrap(), "{c}");
        assert!(counters["page_lookups"].as_u64().unwrap() > 100, "{c}");
    }
    let bpe = &v["configs"][3]["counters"];
    assert!(
        bpe["ext_page_reads"].as_u64().unwrap() > 0,
        "the warmed extension served no page: {bpe}"
    );
    // Half the database's size: the ring wrapped, evicting pages the warming scan wrote.
    let half = &v["configs"][5];
    assert_eq!(
        half["details"]["extension_mb"],
        v["parameters"]["half_extension_mb"]
    );
    assert!(
        half["counters"]["ext_page_evictions"].as_u64().unwrap() > 0
            || half["details"]["warm"]["ext_page_writes"].as_u64().unwrap()
                > half["details"]["extension_mb"].as_u64().unwrap() * 256,
        "the half-size extension never wrapped: {half}"
    );
    assert_eq!(
        v["configs"][6]["details"]["distribution"]["zipf"]["s"],
        0.99
    );
    let cold = &v["configs"][1]["counters"];
    assert!(
        cold["page_reads"].as_u64().unwrap() > 0,
        "a cold run read nothing from the data file: {cold}"
    );
    assert!(v["summary"]["limited_memory_over_bpe"].as_f64().is_some());
    // The restart: a new process took over the extension the warming one left (shared, the
    // default: from the shared memory left beside the file, with no checkpoint to restore),
    // and its lookups read the extension, not the data file.
    let restart = &v["configs"][7];
    let restore = &restart["details"]["restore"];
    assert_eq!(restore["settled"], true, "{restart}");
    assert_eq!(restore["pages_not_restored"], 0, "{restart}");
    assert!(
        restart["counters"]["ext_page_reads"].as_u64().unwrap()
            > 10 * restart["counters"]["page_reads"].as_u64().unwrap(),
        "{restart}"
    );
    assert!(v["summary"]["restart"]["over_warm"].as_f64().is_some());
}

#[test]
fn stock_sqlite_runs_beside_bpe_in_rollback_mode() {
    let v = lookup(&[
        "--configs",
        "limited_memory_bpe,stock_limited_memory",
        "--journal",
        "delete",
    ]);
    assert_eq!(v["parameters"]["journal"], "rollback");
    let configs = v["configs"].as_array().unwrap();
    let names: Vec<&str> = configs
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["limited_memory_bpe", "stock_limited_memory"]);
    for c in configs {
        let stock = c["name"] == "stock_limited_memory";
        let d = &c["details"];
        assert_eq!(c["operations"], 300, "{c}");
        assert_eq!(d["vfs"], if stock { "unix" } else { "bpe" }, "{c}");
        assert_eq!(d["journal"], "rollback", "{c}");
        // Only bpe has an engine counting pages.
        assert_eq!(c["counters"]["engine"].as_bool().unwrap(), !stock, "{c}");
    }
    // Limited by a memory cgroup where the machine has one, and saying why not where not.
    let cgroup = &configs[1]["details"]["memory_cgroup"];
    assert!(
        cgroup["applied"] == true || cgroup["reason"].is_string(),
        "{cgroup}"
    );
    assert!(v["summary"]["stock_over_bpe"].as_f64().is_some());
}
