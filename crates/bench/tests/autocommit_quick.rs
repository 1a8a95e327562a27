//! End to end: `bpe-bench autocommit` at a tiny scale, checking the JSON it writes (no timing).

mod common;

#[test]
fn autocommit_runs_every_configuration_and_the_writer_is_noticed() {
    let v = common::run_bench(&[
        "autocommit",
        "--quick",
        "--data-device",
        "emulated:ssd",
        "--rows",
        "1000",
        "--seconds",
        "0.3",
        "--reference-mib",
        "16",
    ]);
    assert_eq!(v["benchmark"], "autocommit");
    assert_eq!(v["storage"]["data_device"]["name"], "emulated:ssd");
    let configs = v["configs"].as_array().unwrap();
    let names: Vec<&str> = configs
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "rollback_txn",
            "rollback_autocommit",
            "wal_txn",
            "wal_autocommit",
            "stock_rollback_txn",
            "stock_rollback_autocommit",
            "stock_wal_txn",
            "stock_wal_autocommit",
            "beside_writer_rollback",
            "stock_beside_writer_rollback",
            "beside_writer_wal",
            "stock_beside_writer_wal",
            "rollback_defaults",
            "stock_rollback_defaults",
            "wal_defaults",
            "stock_wal_defaults",
            "rollback_per_connection",
            "stock_rollback_per_connection",
            "wal_per_connection",
            "stock_wal_per_connection",
            "rollback_per_connection_sql_on_demand",
            "wal_per_connection_sql_on_demand",
            "rollback_per_connection_threads",
            "stock_rollback_per_connection_threads",
            "wal_per_connection_threads",
            "stock_wal_per_connection_threads",
        ]
    );
    let memory_kib = v["parameters"]["memory_mb"].as_i64().unwrap() * 1024;
    for c in configs {
        let name = c["name"].as_str().unwrap();
        let stock = name.starts_with("stock_");
        let d = &c["details"];
        assert!(c["operations"].as_u64().unwrap() > 0, "{c}");
        assert_eq!(d["vfs"], if stock { "unix" } else { "bpe" }, "{name}");
        assert_eq!(
            d["journal"],
            if name.contains("rollback") {
                "rollback"
            } else {
                "wal"
            },
            "{name}"
        );
        // Only the bpe configurations have an engine counting pages.
        assert_eq!(c["counters"]["engine"].as_bool().unwrap(), !stock, "{name}");
        assert!(d["latency_us"]["p50"].as_f64().unwrap() > 0.0, "{name}");
        // A new connection for each lookup in the *_per_connection pairs (on 4 threads in
        // *_threads), with SQLite's defaults; SQLite's page cache: its default on both sides
        // there and in the *_defaults pair, else the memory budget for stock and bpe's small
        // pager cache.
        let per_connection = name.contains("_per_connection");
        let threads = if name.ends_with("_threads") { 4 } else { 1 };
        assert_eq!(d["threads"], threads, "{name}");
        let connection = if per_connection {
            "one per lookup"
        } else {
            "one"
        };
        assert_eq!(d["connection"], connection, "{name}");
        // bpe's SQL functions on a request's connection: on every bpe one but where the
        // configuration asks for them on demand.
        if per_connection {
            let surface = !stock && !name.ends_with("_sql_on_demand");
            assert_eq!(d["request_sql_surface"], surface, "{name}");
        }
        let pager_kib = match (name.ends_with("_defaults") || per_connection, stock) {
            (true, _) => 2000,
            (false, true) => memory_kib,
            (false, false) => v["parameters"]["bpe_pager_cache_kib"].as_i64().unwrap(),
        };
        assert_eq!(d["pager_cache_kib"], pager_kib, "{name}");
        if name.contains("beside_writer") {
            let commits = d["writer"]["commits"].as_u64().unwrap();
            assert!(commits > 0, "the writer committed nothing: {c}");
            assert_eq!(d["stale_reads"], 0, "{name}");
            if name == "beside_writer_rollback" {
                // Every foreign commit changes the header: the reader must have noticed.
                let seen = d["file_cache_invalidations"].as_u64().unwrap();
                assert!(seen > 0, "{commits} foreign commits went unnoticed: {c}");
            }
        } else {
            assert!(d.get("writer").is_none(), "{name}");
        }
    }
}
