//! Bad operator input, through SQL: every statement (`bpe_exec`) and PRAGMA with wrong values is
//! an SQL error whose message names the problem (with SQL Server's error number where there is
//! one), and changes nothing: not the extension, not max server memory, not the memory target, not
//! a file on disk.

mod common;
use common::*;
use rusqlite::Connection;
use std::path::{Path, PathBuf};

/// Everything a bad call could change.
#[derive(Debug, PartialEq)]
struct State {
    extension: (Option<String>, i64, i64),
    max_memory_mb: String,
    target_pages: i64,
    files: Vec<(PathBuf, u64)>,
}

fn state(c: &Connection, dir: &Path) -> State {
    let mut files: Vec<(PathBuf, u64)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| !e.file_name().to_string_lossy().contains("-journal"))
        .map(|e| (e.path(), e.metadata().map(|m| m.len()).unwrap_or(0)))
        .collect();
    files.sort();
    State {
        extension: c
            .query_row(
                "SELECT path, state, current_size_in_kb FROM bpe_extension_configuration",
                [],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .unwrap(),
        max_memory_mb: c
            .query_row("PRAGMA bpe_max_server_memory_mb", [], |r| r.get(0))
            .unwrap(),
        target_pages: counter(c, "Target pages"),
        files,
    }
}

fn exec_err(c: &Connection, statement: &str) -> String {
    match c.query_row("SELECT bpe_exec(?1)", [statement], |r| {
        r.get::<_, String>(0)
    }) {
        Ok(out) => panic!("{statement:?} was accepted: {out}"),
        Err(e) => e.to_string(),
    }
}

fn pragma_err(c: &Connection, pragma: &str) -> String {
    match c.execute_batch(pragma) {
        Ok(()) => panic!("{pragma:?} was accepted"),
        Err(e) => e.to_string(),
    }
}

fn on(path: &str, size: &str) -> String {
    extension_on(path, size)
}

/// Checks every case against `c`, with the state unchanged after each.
fn check(
    c: &Connection,
    dir: &Path,
    cases: &[(String, &[&str])],
    run: fn(&Connection, &str) -> String,
) {
    let before = state(c, dir);
    for (input, needles) in cases {
        let err = run(c, input).to_lowercase();
        for needle in *needles {
            assert!(
                err.contains(&needle.to_lowercase()),
                "{input:?}: the error '{err}' does not name '{needle}'"
            );
        }
        assert_eq!(state(c, dir), before, "{input:?} changed the state");
    }
}

static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn bad_statements_and_pragmas_name_the_problem_and_change_nothing() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempdir();
    let d = dir.path();
    let db = d.join("app.db");
    let c = open_bpe(&db);
    c.execute_batch("CREATE TABLE t(x); INSERT INTO t VALUES (1);")
        .unwrap();
    exec(&c, "EXEC sp_configure 'max server memory (MB)', 64");
    let ok = |name: &str| d.join(name).display().to_string();

    // Things on disk that an extension must never take.
    let existing = d.join("existing.bpe");
    std::fs::write(&existing, b"someone's data").unwrap();
    std::fs::create_dir(d.join("a-directory")).unwrap();
    std::os::unix::fs::symlink(d.join("nowhere.bpe"), d.join("dangling.bpe")).unwrap();
    std::os::unix::fs::symlink(&existing, d.join("to-existing.bpe")).unwrap();

    let size_cases: Vec<(String, &[&str])> = vec![
        (on(&ok("s.bpe"), "0 MB"), &["size"]),
        (on(&ok("s.bpe"), "-5 GB"), &["size"]),
        (on(&ok("s.bpe"), "99999999999999999999 GB"), &["size"]),
        (on(&ok("s.bpe"), "17179869184 GB"), &["size"]),
        (on(&ok("s.bpe"), "1.5 GB"), &["size"]),
        (on(&ok("s.bpe"), "10 XB"), &["unit"]),
        (on(&ok("s.bpe"), "4096"), &["unit"]),
        (on(&ok("s.bpe"), "GB"), &["size"]),
        // SQL Server's rule: the extension must be larger than max server memory (64 MB here).
        (on(&ok("s.bpe"), "32 MB"), &["868"]),
        (on(&ok("s.bpe"), "64 MB"), &["868"]),
        // An index that would not fit its budget (half of max server memory).
        (on(&ok("s.bpe"), "900000 GB"), &["index memory"]),
    ];
    check(&c, d, &size_cases, exec_err);
    // Larger than the file system holds (with memory enough for its index): the file is
    // created, refused by fallocate, and removed.
    exec(&c, "EXEC sp_configure 'max server memory (MB)', 8192");
    let huge: Vec<(String, &[&str])> = vec![(on(&ok("s.bpe"), "600 GB"), &["s.bpe", "no space"])];
    check(&c, d, &huge, exec_err);
    exec(&c, "EXEC sp_configure 'max server memory (MB)', 64");

    let db_path = db.display().to_string();
    let path_cases: Vec<(String, &[&str])> = vec![
        (on("relative/ext.bpe", "1 GB"), &["absolute"]),
        (on("ext.bpe", "1 GB"), &["absolute"]),
        (on(&ok("missing-dir/ext.bpe"), "1 GB"), &["directory"]),
        (on(&ok("a-directory"), "1 GB"), &["directory"]),
        (on(&db_path, "1 GB"), &["exists"]),
        (on(&existing.display().to_string(), "1 GB"), &["exists"]),
        (on(&ok("dangling.bpe"), "1 GB"), &["symbolic link"]),
        (on(&ok("to-existing.bpe"), "1 GB"), &["symbolic link"]),
        (on("/dev/null", "1 GB"), &["/dev/null"]),
        (on("/", "1 GB"), &["/"]),
        (on("", "1 GB"), &["path"]),
    ];
    check(&c, d, &path_cases, exec_err);
    assert_eq!(std::fs::read(&existing).unwrap(), b"someone's data");

    let memory_cases: Vec<(String, &[&str])> = vec![
        (
            "EXEC sp_configure 'max server memory (MB)', 0".into(),
            &["memory"],
        ),
        (
            "EXEC sp_configure 'max server memory (MB)', -1".into(),
            &["memory"],
        ),
        (
            "EXEC sp_configure 'max server memory (MB)', 1.5".into(),
            &["memory"],
        ),
        (
            "EXEC sp_configure 'max server memory (MB)', 99999999999999999999".into(),
            &["memory"],
        ),
        // Above this machine's RAM.
        (
            "EXEC sp_configure 'max server memory (MB)', 1073741824".into(),
            &["memory"],
        ),
        (
            "EXEC sp_configure 'max server memory (MB)', 'lots'".into(),
            &["memory"],
        ),
        (
            "EXEC sp_configure 'min server memory (MB)', 64".into(),
            &["15123"],
        ),
    ];
    check(&c, d, &memory_cases, exec_err);

    let malformed: Vec<(String, &[&str])> = vec![
        ("".into(), &["statement"]),
        ("   ".into(), &["statement"]),
        (format!("ALTER SERVER CONFIGURATION SET BUFFER POOL EXTENSION ON (FILENAME = '{}', SIZE = 1 GB", ok("m.bpe")), &["102"]),
        (format!("ALTER SERVER CONFIGURATION SET BUFFER POOL EXTENSION ON (FILENAME = '{}')", ok("m.bpe")), &["size"]),
        ("ALTER SERVER CONFIGURATION SET BUFFER POOL EXTENSION ON (SIZE = 1 GB)".into(), &["filename"]),
        (format!("ALTER SERVER CONFIGURATION SET BUFFER POOL EXTENSION ON (FILENAME = '{}', SIZE = 1 GB, COLOR = 'red')", ok("m.bpe")), &["color"]),
        (format!("ALTER SERVER CONFIGURATION SET BUFFER POOL EXTENSION ON (FILENAME = '{}', SIZE = 1 GB) please", ok("m.bpe")), &["102"]),
        ("ALTER SERVER CONFIGURATION SET BUFFER POOL EXTENSION MAYBE".into(), &["102"]),
        ("DBCC DROPDIRTYBUFFERS".into(), &["dropdirtybuffers"]),
        ("SELECT 1".into(), &["select"]),
        ("EXEC sp_configure 'max server memory (MB)', 64; GARBAGE".into(), &["102"]),
    ];
    check(&c, d, &malformed, exec_err);

    // A NULL or a non-text argument.
    for (arg, needle) in [("NULL", "bpe_exec"), ("42", "'42'"), ("x'00ff'", "")] {
        let before = state(&c, d);
        let err = c
            .query_row(&format!("SELECT bpe_exec({arg})"), [], |r| {
                r.get::<_, String>(0)
            })
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(needle) && !err.is_empty(),
            "bpe_exec({arg}): {err}"
        );
        println!("bpe_exec({arg}): {err}");
        assert_eq!(state(&c, d), before);
    }

    let pragma_cases: Vec<(String, &[&str])> = vec![
        ("PRAGMA bpe_max_server_memory_mb = 0".into(), &["memory"]),
        (
            "PRAGMA bpe_max_server_memory_mb = -3".into(),
            &["not a whole number"],
        ),
        (
            "PRAGMA bpe_max_server_memory_mb = lots".into(),
            &["not a whole number"],
        ),
        (
            "PRAGMA bpe_max_server_memory_mb = '1.5'".into(),
            &["not a whole number"],
        ),
        (
            "PRAGMA bpe_max_server_memory_mb = 1073741824".into(),
            &["memory"],
        ),
        (
            format!("PRAGMA bpe_extension = '{},0GB'", ok("p.bpe")),
            &["size"],
        ),
        (
            format!("PRAGMA bpe_extension = '{},64'", ok("p.bpe")),
            &["unit"],
        ),
        (
            format!("PRAGMA bpe_extension = '{},1.5GB'", ok("p.bpe")),
            &["size"],
        ),
        (
            format!("PRAGMA bpe_extension = '{},32MB'", ok("p.bpe")),
            &["868"],
        ),
        (
            "PRAGMA bpe_extension = 'relative.bpe,1GB'".into(),
            &["absolute"],
        ),
        (
            format!("PRAGMA bpe_extension = '{},1GB'", existing.display()),
            &["exists"],
        ),
        (
            format!("PRAGMA bpe_extension = '{}'", ok("p.bpe")),
            &["path,size"],
        ),
        ("PRAGMA bpe_extension = ''".into(), &["path,size"]),
    ];
    check(&c, d, &pragma_cases, pragma_err);

    // And the same connection still works, and a good call still changes things.
    let n: i64 = c
        .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
        .unwrap();
    assert_eq!(n, 1);
    exec(&c, &on(&ok("good.bpe"), "128 MB"));
    assert!(d.join("good.bpe").exists());
    exec(
        &c,
        "ALTER SERVER CONFIGURATION SET BUFFER POOL EXTENSION OFF",
    );
    assert_no_caught_panic("bad statements and pragmas");
}

#[test]
fn an_extension_on_a_file_system_without_o_direct_is_refused_and_leaves_nothing() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempdir();
    let mnt = dir.path().join("ramfs");
    std::fs::create_dir(&mnt).unwrap();
    let mounted = std::process::Command::new("mount")
        .args(["-t", "ramfs", "ramfs"])
        .arg(&mnt)
        .status()
        .is_ok_and(|s| s.success());
    if !mounted {
        println!("SKIPPED: cannot mount a ramfs here (needs root)");
        return;
    }
    let c = open_bpe(&dir.path().join("app.db"));
    exec(&c, "EXEC sp_configure 'max server memory (MB)', 64");
    let before = state(&c, &mnt);
    let err = exec_err(&c, &on(&mnt.join("x.bpe").display().to_string(), "256 MB"));
    let _ = std::process::Command::new("umount").arg(&mnt).status();
    assert!(err.contains("O_DIRECT"), "{err}");
    assert_eq!(before.files, Vec::new());
    assert_eq!(
        state(&c, dir.path()).extension,
        before.extension,
        "the refused extension changed the state"
    );
}

#[test]
fn bad_environment_settings_fail_the_load_naming_the_variable() {
    if sqlite3_shell().is_none() {
        println!("SKIPPED: no sqlite3 shell (CI installs it)");
        return;
    }
    let lib = extension_library();
    let lib = lib.with_extension("");
    let dir = tempdir();
    for (var, value, needle) in [
        (
            "BPE_MAX_SERVER_MEMORY_MB",
            "abc",
            "BPE_MAX_SERVER_MEMORY_MB",
        ),
        ("BPE_MAX_SERVER_MEMORY_MB", "0", "BPE_MAX_SERVER_MEMORY_MB"),
        // In MB, the variable's unit, not in bytes.
        (
            "BPE_MAX_SERVER_MEMORY_MB",
            "1000000000",
            "BPE_MAX_SERVER_MEMORY_MB=1000000000: max server memory 1000000000 MB is above this machine's physical memory (",
        ),
        ("BPE_EXTENSION_SIZE", "12 parsecs", "BPE_EXTENSION_SIZE"),
        ("BPE_DIRECT_IO", "maybe", "BPE_DIRECT_IO"),
        ("BPE_READAHEAD", "2", "BPE_READAHEAD"),
        ("BPE_WRITE_BEHIND", "later", "BPE_WRITE_BEHIND"),
        ("BPE_LARGE_PAGES", "huge", "BPE_LARGE_PAGES"),
        ("BPE_DATA_IOPS", "-4", "BPE_DATA_IOPS"),
    ] {
        let out = std::process::Command::new(sqlite3_shell().unwrap())
            .arg("-batch")
            .current_dir(dir.path())
            .env(var, value)
            .env(
                "BPE_EXTENSION_FILE",
                if var == "BPE_EXTENSION_SIZE" {
                    "/nonexistent/x.bpe"
                } else {
                    ""
                },
            )
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .and_then(|mut child| {
                use std::io::Write;
                child
                    .stdin
                    .take()
                    .unwrap()
                    .write_all(format!(".load {}\n", lib.display()).as_bytes())?;
                child.wait_with_output()
            })
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains(needle),
            "{var}={value}: the load error does not name the variable: {stderr}"
        );
    }
}

/// A load that fails registers nothing. `BPE_DEFAULT_VFS` with a value other than 0
/// or 1 fails the load naming the variable, and the `bpe` VFS does not exist afterwards (it
/// used to be registered before the variable was read, and stayed usable).
#[test]
fn a_failed_load_registers_no_vfs() {
    if sqlite3_shell().is_none() {
        println!("SKIPPED: no sqlite3 shell (CI installs it)");
        return;
    }
    let lib = extension_library();
    let lib = lib.with_extension("");
    let dir = tempdir();
    let script = format!(".load {}\n.open file:x.db?vfs=bpe\n", lib.display());
    for value in ["2", "yes", "-1"] {
        let (out, err, _) = run_shell_with_env(dir.path(), &script, &[("BPE_DEFAULT_VFS", value)]);
        let what = format!("BPE_DEFAULT_VFS={value}:\nstdout:\n{out}\nstderr:\n{err}");
        assert!(
            err.contains("BPE_DEFAULT_VFS"),
            "the load error does not name the variable: {what}"
        );
        assert!(
            err.contains("no such vfs: bpe"),
            "the failed load left the VFS registered: {what}"
        );
        assert!(!dir.path().join("x.db").exists(), "{what}");
    }
}

/// The environment follows the rules SQL follows and says so in the same words. A
/// relative `BPE_EXTENSION_FILE` fails the load (it used to leave the VFS working without an
/// extension, a warning in sqlite3_log), registering nothing and creating no file; an extension
/// not larger than max server memory is refused with SQL's `Msg 868` and its sizes in MB (the
/// environment said "error 868" in bytes).
#[test]
fn the_environment_refuses_what_sql_refuses_in_the_same_words() {
    if sqlite3_shell().is_none() {
        println!("SKIPPED: no sqlite3 shell (CI installs it)");
        return;
    }
    let lib = extension_library();
    let lib = lib.with_extension("");
    let dir = tempdir();
    let d = dir.path();
    let load_and_open = format!(".load {}\n.open file:x.db?vfs=bpe\n", lib.display());

    let relative = [
        ("BPE_EXTENSION_FILE", "rel.bpe"),
        ("BPE_EXTENSION_SIZE", "1 GB"),
    ];
    let (out, err, _) = run_shell_with_env(d, &load_and_open, &relative);
    let what = format!("stdout:\n{out}\nstderr:\n{err}");
    assert!(
        err.contains(r#"BPE_EXTENSION_FILE="rel.bpe": the path must be absolute"#),
        "{what}"
    );
    assert!(
        err.contains("no such vfs: bpe"),
        "the VFS was registered: {what}"
    );
    assert!(
        !d.join("rel.bpe").exists() && !d.join("x.db").exists(),
        "{what}"
    );
    // SQL, for the same path: the same reason.
    let sql = format!(
        ".load {}\nSELECT bpe_exec('{}');\n",
        lib.display(),
        extension_on("rel.bpe", "1 GB").replace('\'', "''")
    );
    let (_, sql_err, _) = run_shell_with_env(d, &sql, &[]);
    assert!(sql_err.contains("the path must be absolute"), "{sql_err}");

    let msg_868 =
        "Msg 868: buffer pool extension size (32 MB) must be larger than max server memory (64 MB)";
    let ext = d.join("e.bpe").display().to_string();
    let small = [
        ("BPE_MAX_SERVER_MEMORY_MB", "64"),
        ("BPE_EXTENSION_FILE", ext.as_str()),
        ("BPE_EXTENSION_SIZE", "32MB"),
    ];
    let (out, err, _) = run_shell_with_env(d, &load_and_open, &small);
    assert!(
        err.contains(&format!("BPE_EXTENSION_SIZE=32MB: {msg_868}")),
        "stdout:\n{out}\nstderr:\n{err}"
    );
    let sql = format!(
        ".load {}\nSELECT bpe_exec('EXEC sp_configure ''max server memory (MB)'', 64');\n\
         SELECT bpe_exec('{}');\n",
        lib.display(),
        extension_on(&ext, "32 MB").replace('\'', "''")
    );
    let (_, sql_err, _) = run_shell_with_env(d, &sql, &[]);
    assert!(sql_err.contains(msg_868), "{sql_err}");
    assert!(!d.join("e.bpe").exists());
}

/// The commit log bpe processes share for the database at `db` (see vfs/peer_log.rs).
fn peer_log_of(db: &Path) -> PathBuf {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(db).unwrap();
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    PathBuf::from(format!("/dev/shm/sqlite-bpe-{uid}-{}-{}", m.dev(), m.ino()))
}

/// The commit log's size: 64 KiB of entries and its header (vfs/peer_log.rs SIZE).
const PEER_LOG_BYTES: u64 = 64 + 4096 * 16;

/// Our own files in /dev/shm (`sqlite-bpe-*`: a database's commit log, the per-user
/// directory of shared memory and published counters) are never an extension. The commit log
/// of an open database used to be taken when it was not there yet (and then cut to the log's
/// size by the next commit), and refused only as "a file" when it was; now both are refused
/// with a message that names the problem, and the log is left as it was.
#[test]
fn an_extension_at_our_own_files_in_dev_shm_is_refused_and_leaves_them_as_they_were() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempdir();
    let d = dir.path();
    let db = d.join("app.db");
    let c = open_bpe(&db);
    // A commit in rollback mode maps (and makes) the database's commit log.
    c.execute_batch("CREATE TABLE t(x); INSERT INTO t VALUES (1);")
        .unwrap();
    exec(&c, "EXEC sp_configure 'max server memory (MB)', 8");
    let log = peer_log_of(&db);
    let before = std::fs::read(&log).unwrap_or_else(|e| panic!("{}: {e}", log.display()));
    assert_eq!(before.len() as u64, PEER_LOG_BYTES);
    let extension = |c: &Connection| state(c, d).extension;
    let off = extension(&c);

    // A database open whose log is not made yet (nothing read or written through bpe yet).
    let other = d.join("other.db");
    open_unix(&other)
        .execute_batch("CREATE TABLE u(y);")
        .unwrap();
    let c2 = open_bpe(&other);
    let unmade = peer_log_of(&other);
    let unmade_existed = unmade.exists();

    let mine = PathBuf::from("/dev/shm").join(format!(
        "sqlite-bpe-{}",
        // SAFETY: getuid has no preconditions.
        unsafe { libc::getuid() }
    ));
    for path in [unmade.clone(), log.clone(), mine.join("x.bpe")] {
        let err = exec_err(&c, &on(&path.display().to_string(), "16 MB"));
        assert!(
            err.contains(&path.display().to_string()) && err.contains("sqlite-bpe's own"),
            "{}: the error does not name the problem: {err}",
            path.display()
        );
        assert_eq!(extension(&c), off, "{}", path.display());
    }
    assert_eq!(
        std::fs::read(&log).unwrap(),
        before,
        "the commit log changed"
    );
    // The other database's first commit through bpe makes its log, which is then a log.
    c2.execute_batch("INSERT INTO u VALUES (2);").unwrap();
    if !unmade_existed {
        assert_eq!(std::fs::metadata(&unmade).unwrap().len(), PEER_LOG_BYTES);
    }
    assert!(!mine.join("x.bpe").exists());
    exec(&c, "EXEC sp_configure 'max server memory (MB)', 64");
    assert_no_caught_panic("extensions at our own files");
}

/// A base VFS that is not registered, or bpe named as its own base, fails the open
/// with the reason, and creates no file.
#[test]
fn a_base_vfs_that_cannot_be_used_fails_the_open_naming_it() {
    let _ = open_bpe(&tempdir().path().join("boot.db")); // registers bpe
    let dir = tempdir();
    let db = dir.path().join("x.db");
    for (base, why) in [
        ("nosuchvfs", "the base VFS \"nosuchvfs\" is not registered"),
        ("bpe", "bpe cannot be its own base VFS"),
    ] {
        let uri = format!("file:{}?vfs=bpe&bpe_base={base}", db.display());
        let opened =
            Connection::open_with_flags(&uri, flags() | rusqlite::OpenFlags::SQLITE_OPEN_URI);
        assert!(opened.is_err(), "bpe_base={base} opened");
        let said = sqlite_bpe::last_open_error().unwrap_or_default();
        assert!(said.contains(why), "bpe_base={base}: {said:?}");
        assert!(!db.exists(), "bpe_base={base} created the file");
    }
    assert_no_caught_panic("unusable base VFSes");
}
