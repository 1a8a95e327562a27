//! `BPE_CACHE_PATHS` with `bpe` as the default VFS: the databases under the listed directories
//! or matching the listed globs go through the pool; every other main database the host opens
//! (a backup, a snapshot, `VACUUM INTO`'s copy) is the unix VFS's file, untouched by the pool.

mod common;
use common::*;

fn counter(out: &str, key: &str) -> i64 {
    let line = out
        .lines()
        .find(|l| l.starts_with(key))
        .unwrap_or_else(|| panic!("no {key} in:\n{out}"));
    line[key.len()..].parse().unwrap()
}

#[test]
fn only_the_databases_in_bpe_cache_paths_go_through_the_pool() {
    let lib = extension_library();
    let dir = tempdir();
    let d = dir.path().canonicalize().unwrap();
    for sub in ["live", "backups"] {
        std::fs::create_dir(d.join(sub)).unwrap();
    }
    let scope = format!("{}/live:{}/*.cached.db", d.display(), d.display());
    let writes = "SELECT cntr_value FROM bpe_performance_counters \
                  WHERE counter_name = 'Page writes/sec'";
    let script = format!(
        r#".load {lib}
.open {d}/live/app.db
CREATE TABLE t(id INTEGER PRIMARY KEY, n TEXT);
WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < 2000)
  INSERT INTO t SELECT i, printf('%.500c', 'A') FROM c;
SELECT 'app_cached=' || (db_id() IS NOT NULL);
SELECT 'w0=' || ({writes});
VACUUM INTO '{d}/backups/app-copy.db';
SELECT 'w1=' || ({writes});
VACUUM INTO '{d}/copy.cached.db';
SELECT 'w2=' || ({writes});
.open {d}/backups/app-copy.db
SELECT 'copy_cached=' || (db_id() IS NOT NULL);
SELECT 'copy_rows=' || count(*) FROM t;
.open {d}/copy.cached.db
SELECT 'glob_cached=' || (db_id() IS NOT NULL);
"#,
        lib = lib.with_extension("").display(),
        d = d.display(),
    );
    let (out, err, ok) = run_shell_with_env(
        &d,
        &script,
        &[("BPE_DEFAULT_VFS", "1"), ("BPE_CACHE_PATHS", &scope)],
    );
    assert!(ok && err.is_empty(), "shell failed: {err}\n{out}");
    assert_eq!(counter(&out, "app_cached="), 1, "{out}");
    assert_eq!(
        counter(&out, "w1="),
        counter(&out, "w0="),
        "the backup outside BPE_CACHE_PATHS went through the pool:\n{out}"
    );
    assert!(
        counter(&out, "w2=") > counter(&out, "w1=") + 50,
        "the copy matching the glob did not go through the pool:\n{out}"
    );
    assert_eq!(counter(&out, "copy_cached="), 0, "{out}");
    assert_eq!(counter(&out, "copy_rows="), 2000, "{out}");
    assert_eq!(counter(&out, "glob_cached="), 1, "{out}");
}

#[test]
fn a_relative_entry_fails_the_load_and_leaves_no_vfs() {
    let lib = extension_library();
    let dir = tempdir();
    let script = format!(
        ".load {lib}\n.open file:x.db?vfs=bpe\n",
        lib = lib.with_extension("").display()
    );
    let (out, err, _) = run_shell_with_env(
        dir.path(),
        &script,
        &[("BPE_DEFAULT_VFS", "1"), ("BPE_CACHE_PATHS", "data/live")],
    );
    assert!(
        err.contains("BPE_CACHE_PATHS") && err.contains("\"data/live\" is not an absolute path"),
        "the load did not name the variable and the entry:\n{err}\n{out}"
    );
    assert!(err.contains("no such vfs: bpe"), "{err}\n{out}");
}
