//! `sqlite-bpe bench ... --configs`: a name the benchmark does not have is an error naming it
//! and the valid ones, before anything runs (it used to run nothing and exit 0).

use std::process::Command;

#[test]
fn an_unknown_config_is_an_error_naming_the_valid_ones() {
    let dir = tempfile::tempdir().unwrap();
    for (bench, valid) in [
        ("lookup", "limited_memory_bpe"),
        ("scan", "limited_memory_bpe"),
        ("autocommit", "wal_autocommit"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_sqlite-bpe"))
            .current_dir(dir.path())
            .args(["bench", bench, "--quick", "--configs", "nosuch"])
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{bench}: exit 0\n{stdout}\n{stderr}");
        assert!(
            stderr.contains(&format!("{bench} has no configuration 'nosuch'"))
                && stderr.contains(valid),
            "{bench}: {stderr}"
        );
        assert!(
            std::fs::read_dir(dir.path()).unwrap().next().is_none(),
            "{bench} made files before refusing"
        );
    }
}
