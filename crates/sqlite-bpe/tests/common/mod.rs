//! Helpers for the adapter's tests. Each test file is its own process with its own engine.
#![allow(dead_code)]

use rusqlite::{Connection, OpenFlags};
use std::path::{Path, PathBuf};

pub fn flags() -> OpenFlags {
    OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE | OpenFlags::SQLITE_OPEN_URI
}

/// Opens `path` through the bpe VFS (registering it first).
pub fn open_bpe(path: &Path) -> Connection {
    sqlite_bpe::register().expect("register");
    Connection::open_with_flags(format!("file:{}?vfs=bpe", path.display()), flags()).unwrap()
}

pub fn open_unix(path: &Path) -> Connection {
    Connection::open_with_flags(path, flags()).unwrap()
}

/// A temp dir on the project's disk (O_DIRECT works there; /tmp may be tmpfs).
pub fn tempdir() -> tempfile::TempDir {
    let base = Path::new(env!("CARGO_TARGET_TMPDIR"));
    std::fs::create_dir_all(base).unwrap();
    tempfile::tempdir_in(base).unwrap()
}

/// `caf\xE9.db` in `dir`, canonical: a database name that is not UTF-8.
pub fn not_utf8_name(dir: &Path) -> PathBuf {
    use std::os::unix::ffi::OsStrExt;
    dir.canonicalize()
        .unwrap()
        .join(std::ffi::OsStr::from_bytes(b"caf\xe9.db"))
}

/// Asserts that the engine caches a file under exactly `path` (bytes, not a lossy copy).
pub fn assert_cached_under(path: &Path) {
    let cached: Vec<_> = sqlite_bpe::engine()
        .files()
        .into_iter()
        .map(|f| f.path)
        .collect();
    assert!(
        cached.iter().any(|p| p == path),
        "{path:?} is not among {cached:?}"
    );
}

pub fn exec(conn: &Connection, statement: &str) -> String {
    conn.query_row("SELECT bpe_exec(?1)", [statement], |r| r.get(0))
        .unwrap()
}

/// Runs an operator statement; the error message if it fails.
pub fn try_exec(conn: &Connection, statement: &str) -> Result<String, String> {
    conn.query_row("SELECT bpe_exec(?1)", [statement], |r| r.get(0))
        .map_err(|e| e.to_string())
}

/// `ALTER SERVER CONFIGURATION SET BUFFER POOL EXTENSION ON` at `path` with `size` ("64 MB").
pub fn extension_on(path: impl std::fmt::Display, size: &str) -> String {
    format!(
        "ALTER SERVER CONFIGURATION SET BUFFER POOL EXTENSION ON (FILENAME = '{}', SIZE = {size})",
        path.to_string().replace('\'', "''")
    )
}

pub fn counter(conn: &Connection, name: &str) -> i64 {
    conn.query_row(
        "SELECT cntr_value FROM bpe_performance_counters WHERE counter_name = ?1",
        [name],
        |r| r.get(0),
    )
    .unwrap()
}

/// The release build of the loadable extension, brought up to date once per test binary (a
/// stale library from before a change would test the old code in the other process).
///
/// Under `cargo test --release` the cargo that built this test binary has just built the
/// library too, from the same sources, into the same directory (`<target>/release/deps`): it is
/// used as it is. Building it again there with `cargo build --release -p sqlite-bpe` would
/// resolve the dependencies' features for this package alone, and the files of a package with a
/// cdylib carry no hash in their names: the build would replace `deps/libsqlite_bpe.rlib`
/// under the running `cargo test`, whose later steps (the CLI's doctests) would then find the
/// crates built against the old one unusable ("can't find crate for `bpe_bench`").
/// Under a debug `cargo test` (the README's), the release build is another directory, and is
/// built here, to `<target>/release/libsqlite_bpe.so`.
pub fn extension_library() -> PathBuf {
    static BUILT: std::sync::Once = std::sync::Once::new();
    // This test binary is <target dir>/<profile>/deps/<name>: the same target dir, whatever
    // CARGO_TARGET_DIR says (the cargo run below inherits it).
    let exe = std::env::current_exe().unwrap();
    let deps = exe
        .parent()
        .expect("a test binary under <target>/<profile>/deps");
    if deps.parent().and_then(Path::file_name) == Some("release".as_ref()) {
        let library = deps.join("libsqlite_bpe.so");
        assert!(library.exists(), "no {}", library.display());
        return library;
    }
    let target = exe
        .ancestors()
        .nth(3)
        .expect("a test binary under <target>/<profile>/deps")
        .join("release");
    BUILT.call_once(|| {
        let status = std::process::Command::new(env!("CARGO"))
            .args(["build", "--release", "-p", "sqlite-bpe"])
            .status()
            .unwrap();
        assert!(status.success(), "cannot build the extension");
    });
    target.join("libsqlite_bpe.so")
}

/// The stock sqlite3 shell, if installed (CI installs it).
pub fn sqlite3_shell() -> Option<PathBuf> {
    let out = std::process::Command::new("sh")
        .args(["-c", "command -v sqlite3"])
        .output()
        .ok()?;
    let p = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (!p.is_empty()).then(|| PathBuf::from(p))
}

/// Runs `script` in the stock sqlite3 shell; returns (stdout, stderr, success).
pub fn run_shell(dir: &Path, script: &str) -> (String, String, bool) {
    run_shell_with_env(dir, script, &[])
}

/// [`run_shell`] with these environment variables set for the shell.
pub fn run_shell_with_env(
    dir: &Path,
    script: &str,
    env: &[(&str, &str)],
) -> (String, String, bool) {
    use std::io::Write;
    let shell =
        sqlite3_shell().expect("the sqlite3 shell is not installed (apt-get install sqlite3)");
    let mut child = std::process::Command::new(shell)
        .envs(env.iter().copied())
        .arg("-batch")
        .current_dir(dir)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(script.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        out.status.success(),
    )
}

/// What a child process did: its exit, its whole output, and whether it outlived its time.
pub struct Finished {
    pub status: std::process::ExitStatus,
    pub timed_out: bool,
    pub stdout: String,
    pub stderr: String,
}

impl Finished {
    /// Exited with success, by itself.
    pub fn success(&self) -> bool {
        self.status.success() && !self.timed_out
    }
}

/// Waits for `child` (spawned with piped stdout and stderr), reading both as it runs so that it
/// never blocks on a full pipe, and kills it once `limit` has passed.
pub fn wait_with_limit(mut child: std::process::Child, limit: std::time::Duration) -> Finished {
    use std::io::Read;
    let drain = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = r.read_to_string(&mut s);
            s
        })
    };
    let out = drain(Box::new(child.stdout.take().expect("stdout piped")));
    let err = drain(Box::new(child.stderr.take().expect("stderr piped")));
    let deadline = std::time::Instant::now() + limit;
    let mut timed_out = false;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() >= deadline {
            timed_out = true;
            let _ = child.kill();
            break child.wait().unwrap();
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    Finished {
        status,
        timed_out,
        stdout: out.join().unwrap(),
        stderr: err.join().unwrap(),
    }
}

/// The watchdog inside a child: when `progress` has not moved for `stall`, says "HUNG after N
/// `what`" on both streams and exits with code 3 (the parent looks for "HUNG").
pub fn exit_if_stalled(
    progress: std::sync::Arc<std::sync::atomic::AtomicU64>,
    stall: std::time::Duration,
    what: &'static str,
) {
    use std::sync::atomic::Ordering::Relaxed;
    use std::time::{Duration, Instant};
    std::thread::spawn(move || {
        let mut last = (progress.load(Relaxed), Instant::now());
        loop {
            std::thread::sleep(Duration::from_millis(100));
            let now = progress.load(Relaxed);
            if now != last.0 {
                last = (now, Instant::now());
            } else if last.1.elapsed() > stall {
                let message = format!("HUNG after {now} {what}: no progress for {stall:?}");
                println!("{message}");
                eprintln!("{message}");
                std::process::exit(3);
            }
        }
    });
}

/// Every variable the engine reads at load (a child started without them gets no engine
/// settings from its parent): the engine's own, then the device emulation's.
#[allow(dead_code)]
pub fn bpe_vars() -> impl Iterator<Item = &'static str> {
    [
        "BPE_MAX_SERVER_MEMORY_MB",
        "BPE_EXTENSION_FILE",
        "BPE_EXTENSION_SIZE",
        "BPE_EXTENSION_SHARED",
        "BPE_DIRECT_IO",
        "BPE_READAHEAD",
        "BPE_WRITE_BEHIND",
        "BPE_SQL_SURFACE",
    ]
    .into_iter()
    .chain(sqlite_bpe::emulation_var_names())
}

/// The seed of a randomized crash test: `BPE_CRASH_SEED` to replay one, else the clock. The
/// caller prints it, so that a failure in CI can be replayed.
pub fn crash_seed() -> u64 {
    std::env::var("BPE_CRASH_SEED").ok().map_or_else(
        || {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        },
        |v| v.parse().expect("BPE_CRASH_SEED"),
    )
}

static SQLITE_LOG: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

/// Collects every sqlite3_log message ("code message") from now on, for [`sqlite_log`]. Call it
/// before anything in the process has used SQLite (a child process's first step).
pub fn collect_sqlite_log() {
    use std::ffi::{c_char, c_int, c_void, CStr};
    extern "C" fn collect(_: *mut c_void, code: c_int, msg: *const c_char) {
        // SAFETY: SQLite passes a NUL-terminated message valid for the call.
        let msg = unsafe { CStr::from_ptr(msg) }.to_string_lossy();
        SQLITE_LOG.lock().unwrap().push(format!("{code} {msg}"));
    }
    type Logger = extern "C" fn(*mut c_void, c_int, *const c_char);
    // SAFETY: before SQLite is initialized (nothing in this process has used it yet), with the
    // arguments SQLITE_CONFIG_LOG takes: a callback that lives for the program, and its argument.
    let rc = unsafe {
        libsqlite3_sys::sqlite3_config(
            libsqlite3_sys::SQLITE_CONFIG_LOG,
            collect as Logger,
            std::ptr::null_mut::<c_void>(),
        )
    };
    assert_eq!(
        rc,
        libsqlite3_sys::SQLITE_OK,
        "sqlite3_config(SQLITE_CONFIG_LOG)"
    );
}

/// What sqlite3_log said since [`collect_sqlite_log`].
pub fn sqlite_log() -> Vec<String> {
    SQLITE_LOG.lock().unwrap().clone()
}

/// What makes this test binary run only its `child_entry`: an ignored test that does nothing
/// unless the file's child variable is set. Every multi-process test starts its children so.
#[allow(dead_code)]
pub const CHILD_ARGS: [&str; 5] = [
    "child_entry",
    "--exact",
    "--ignored",
    "--nocapture",
    "--test-threads=1",
];

/// This test binary again, as a child in `mode` (`var` = `mode`), with none of the engine's
/// variables of this process: the child sets what it is given.
#[allow(dead_code)]
pub fn child_command(var: &str, mode: &str) -> std::process::Command {
    let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
    cmd.args(CHILD_ARGS).env(var, mode);
    for v in bpe_vars() {
        cmd.env_remove(v);
    }
    cmd
}

/// The child's side: its mode, if this process was started with `var` set. A panic in any
/// of its threads then ends it at once, "CHILD PANIC" and the message on stdout and stderr
/// (the parent sees it die by itself, and may look for the words).
#[allow(dead_code)]
pub fn child_mode(var: &str) -> Option<String> {
    let mode = std::env::var(var).ok()?;
    std::panic::set_hook(Box::new(|info| {
        println!("CHILD PANIC: {info}");
        eprintln!("CHILD PANIC: {info}");
        std::process::abort();
    }));
    Some(mode)
}

/// No panic was caught where SQLite calls into bpe in this process (each would be a bug: bad
/// input has errors of its own, and a caught panic is an `internal error` in sqlite3_log).
pub fn assert_no_caught_panic(after: &str) {
    assert_eq!(
        sqlite_bpe::caught_panics(),
        0,
        "{after}: a panic was caught at the edge with SQLite (see its `internal error` in \
         sqlite3_log)"
    );
}
