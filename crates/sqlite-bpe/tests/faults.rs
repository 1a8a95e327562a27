//! Faults, end to end through SQLite: a bpe database with 1 MB of max server memory (the smallest
//! value `sp_configure` accepts: whole megabytes above 0; the core's floor is 256 KiB) and a 4 MB
//! extension, holding a table about twice the size of RAM whose rows each carry the checksum of
//! their payload. Every scan verifies every row against its checksum and its expected bytes, so a
//! page served wrong from any tier fails the test.
//!
//! For each fault: the answers stay right, the fault is counted in `bpe_performance_counters`,
//! the engine keeps serving, and where the extension gives up (8 consecutive faults) it says so in
//! `bpe_extension_configuration` (state and the hidden `last_failure` column) and can be enabled
//! again. Corruption, deletion and truncation of the extension file are done by other processes
//! (`dd`, `rm`, `truncate`). The core's own fault tests (crates/bpe-core/tests/extension_admin.rs)
//! cover the same faults on raw pages; these cover what a SQLite user sees.
//!
//! All tests share the process's one engine: they run one at a time and start from a known state.

mod common;
mod rows;

use common::*;
use rusqlite::Connection;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

static SERIAL: Mutex<()> = Mutex::new(());

/// Rows of the test table; with payloads of 200..800 bytes that is about 560 pages of 4 KiB,
/// twice what 1 MB of RAM holds, and about half of the 4 MB extension's 1024 slots.
const ROWS: i64 = 4000;
const EXT_MB: u64 = 4;
const WAIT: Duration = Duration::from_secs(20);
const ENABLED: &str = "BUFFER POOL EXTENSION ENABLED";
const DISABLED: &str = "BUFFER POOL EXTENSION DISABLED";

fn engine() -> std::sync::Arc<bpe_core::Engine> {
    sqlite_bpe::engine()
}

/// Serializes the tests of this file and resets the shared engine: no faults pending, no extension.
fn serial() -> MutexGuard<'static, ()> {
    let guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    sqlite_bpe::register().expect("register");
    clear_faults();
    let _ = engine().disable_extension();
    guard
}

fn clear_faults() {
    let e = engine();
    let f = e.faults();
    f.fail_extension_reads(0);
    f.fail_extension_writes(0);
    f.corrupt_extension_reads(0);
    f.fail_data_reads(0);
}

fn expected_payload(id: i64) -> Vec<u8> {
    rows::payload(id as u64, 200 + (id as usize * 37) % 600)
}

fn on_statement(path: &Path, mb: u64) -> String {
    extension_on(path.display(), &format!("{mb} MB"))
}

/// (state_description, last_failure) as an operator reads them.
fn state(conn: &Connection) -> (String, Option<String>) {
    conn.query_row(
        "SELECT state_description, last_failure FROM bpe_extension_configuration",
        [],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )
    .unwrap()
}

/// The counters these tests look at, read through SQL.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Snap {
    ext_reads: i64,
    ext_writes: i64,
    checksum_failures: i64,
    io_errors: i64,
    page_reads: i64,
}

impl Snap {
    fn take(conn: &Connection) -> Snap {
        Snap {
            ext_reads: counter(conn, "Extension page reads/sec"),
            ext_writes: counter(conn, "Extension page writes/sec"),
            checksum_failures: counter(conn, "Extension page checksum failures"),
            io_errors: counter(conn, "Extension I/O errors"),
            page_reads: counter(conn, "Page reads/sec"),
        }
    }
    fn since(self, before: Snap) -> Snap {
        Snap {
            ext_reads: self.ext_reads - before.ext_reads,
            ext_writes: self.ext_writes - before.ext_writes,
            checksum_failures: self.checksum_failures - before.checksum_failures,
            io_errors: self.io_errors - before.io_errors,
            page_reads: self.page_reads - before.page_reads,
        }
    }
}

/// A bpe database with the checked table, 1 MB of memory and a 4 MB extension at `ext`.
struct Rig {
    // Fields drop in this order: the connection closes before its directory goes.
    conn: Connection,
    ext: PathBuf,
    dir: tempfile::TempDir,
}

impl Rig {
    fn new(journal: &str) -> Rig {
        let dir = tempdir();
        let conn = open_bpe(&dir.path().join("faults.db"));
        conn.execute_batch(&format!(
            "PRAGMA journal_mode = {journal};
             CREATE TABLE t(id INTEGER PRIMARY KEY, payload BLOB NOT NULL, crc INTEGER NOT NULL);"
        ))
        .unwrap();
        let tx = conn.unchecked_transaction().unwrap();
        {
            let mut ins = tx
                .prepare("INSERT INTO t(id, payload, crc) VALUES (?1, ?2, ?3)")
                .unwrap();
            for id in 1..=ROWS {
                let p = expected_payload(id);
                ins.execute(rusqlite::params![id, p, rows::crc32(&p)])
                    .unwrap();
            }
        }
        tx.commit().unwrap();
        if journal == "WAL" {
            // Move the pages into the database file: reads of pages still in the WAL never
            // reach the buffer pool.
            conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)")
                .unwrap();
        }
        // SQLite's own cache is kept tiny, so reads come from the buffer pool.
        conn.execute_batch("PRAGMA cache_size = 1").unwrap();
        exec(&conn, "EXEC sp_configure 'max server memory (MB)', 1");
        let ext = dir.path().join("ext.bpe");
        let rig = Rig { dir, conn, ext };
        rig.enable();
        rig
    }

    fn enable(&self) {
        let out = try_exec(&self.conn, &on_statement(&self.ext, EXT_MB)).unwrap();
        assert!(out.contains("enabled"), "{out}");
        let (st, failure) = state(&self.conn);
        assert_eq!(st, ENABLED);
        assert_eq!(failure, None, "enabling again must clear the last failure");
    }

    /// Reads every row and checks it: ids 1..=ROWS in order, payload as written, checksum right.
    fn verify(&self) {
        verify(&self.conn);
    }

    /// Scans until pages have gone through the extension (written to it, then read back).
    fn warm(&self) {
        let before = Snap::take(&self.conn);
        for _ in 0..2 {
            self.verify();
            assert!(engine().wait_for_extension_writes(WAIT));
        }
        self.verify();
        let d = Snap::take(&self.conn).since(before);
        assert!(
            d.ext_writes > 0 && d.ext_reads > 0,
            "the workload did not go through the extension: {d:?}"
        );
    }

    /// After the extension disabled itself: its file goes (removed by a background thread),
    /// and enabling it again at the same path works and serves.
    fn reenable_after_self_disable(&self) {
        for _ in 0..2000 {
            if !self.ext.exists() {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(
            !self.ext.exists(),
            "the self-disabled extension left its file"
        );
        self.enable();
        self.warm();
    }

    /// Slots of the ring written since the extension was enabled (it fills from slot 0).
    fn occupied_slots(&self, since_enable: Snap) -> u64 {
        let written = Snap::take(&self.conn).since(since_enable).ext_writes as u64;
        written.min(EXT_MB * 256)
    }
}

fn verify(conn: &Connection) {
    let mut stmt = conn
        .prepare_cached("SELECT id, payload, crc FROM t ORDER BY id")
        .unwrap();
    let mut rows = stmt.query([]).unwrap();
    let mut expect = 1;
    while let Some(r) = rows.next().unwrap() {
        let id: i64 = r.get(0).unwrap();
        let payload = r.get_ref(1).unwrap().as_blob().unwrap();
        let crc: i64 = r.get(2).unwrap();
        assert_eq!(id, expect, "row {expect} missing (found {id})");
        assert_eq!(
            rows::crc32(payload),
            crc,
            "row {id}: payload does not match its checksum"
        );
        assert!(payload == expected_payload(id), "row {id}: wrong payload");
        expect += 1;
    }
    assert_eq!(expect - 1, ROWS, "rows missing at the end");
}

fn lookup(conn: &Connection, id: i64) -> rusqlite::Result<()> {
    let (payload, crc): (Vec<u8>, i64) =
        conn.query_row("SELECT payload, crc FROM t WHERE id = ?1", [id], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })?;
    assert_eq!(rows::crc32(&payload), crc, "row {id}: bad checksum");
    assert!(payload == expected_payload(id), "row {id}: wrong payload");
    Ok(())
}

/// Point lookups of random rows until the extension has disabled itself (or 2000 lookups).
/// Random, so that misses are not sequential: a sequential run of misses is widened into
/// readahead, which may read the pages after a faulty one from the data file instead.
fn until_disabled(conn: &Connection) {
    for i in 0..2000 {
        lookup(conn, 1 + rand::random::<i64>().rem_euclid(ROWS)).unwrap();
        if i % 16 == 15 && state(conn).0 == DISABLED {
            return;
        }
    }
}

fn run(cmd: &mut Command) {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A `dd` overwriting `len` bytes at `offset` of `file` with random bytes, in place.
fn dd_random(file: &Path, offset: u64, len: u64) -> String {
    format!(
        "dd if=/dev/urandom of='{}' bs=1 seek={offset} count={len} conv=notrunc status=none",
        file.display()
    )
}

#[test]
fn extension_read_errors_are_counted_served_from_the_data_file_and_repeated_ones_disable_it() {
    let _s = serial();
    let r = Rig::new("DELETE");
    r.warm();

    // A few errors among successful reads: counted, answered from the data file, still on.
    let before = Snap::take(&r.conn);
    engine().faults().fail_extension_reads(3);
    r.verify();
    r.verify();
    let d = Snap::take(&r.conn).since(before);
    assert_eq!(d.io_errors, 3, "{d:?}");
    assert!(d.ext_reads > 0, "{d:?}");
    assert_eq!(state(&r.conn), (ENABLED.into(), None));

    // Every read fails: after 8 in a row the extension disables itself and says why.
    engine().faults().fail_extension_reads(u32::MAX);
    until_disabled(&r.conn);
    r.verify();
    let (st, failure) = state(&r.conn);
    assert_eq!(st, DISABLED);
    let failure = failure.expect("no last_failure recorded");
    assert!(
        failure.contains("8 consecutive faults") && failure.contains("read error"),
        "{failure}"
    );
    let path: Option<String> = r
        .conn
        .query_row("SELECT path FROM bpe_extension_configuration", [], |x| {
            x.get(0)
        })
        .unwrap();
    assert_eq!(path, None);

    // The engine keeps serving from RAM and the data file.
    let before = Snap::take(&r.conn);
    r.verify();
    let d = Snap::take(&r.conn).since(before);
    assert_eq!((d.ext_reads, d.io_errors), (0, 0), "{d:?}");
    assert!(d.page_reads > 0);

    engine().faults().fail_extension_reads(0);
    r.reenable_after_self_disable();
}

#[test]
fn extension_write_errors_are_counted_and_repeated_ones_disable_it() {
    let _s = serial();
    let r = Rig::new("DELETE");
    r.warm();

    // Two failed batch writes: counted, their pages simply not cached, still on.
    exec(&r.conn, "DBCC DROPCLEANBUFFERS");
    let before = Snap::take(&r.conn);
    engine().faults().fail_extension_writes(2);
    r.warm();
    let d = Snap::take(&r.conn).since(before);
    assert_eq!(d.io_errors, 2, "{d:?}");
    assert_eq!(d.checksum_failures, 0, "{d:?}");
    assert_eq!(state(&r.conn), (ENABLED.into(), None));

    // Every write fails: the extension gives up, says why, and the answers stay right.
    exec(&r.conn, "DBCC DROPCLEANBUFFERS");
    engine().faults().fail_extension_writes(u32::MAX);
    for _ in 0..50 {
        r.verify();
        assert!(engine().wait_for_extension_writes(WAIT));
        if state(&r.conn).0 == DISABLED {
            break;
        }
    }
    let (st, failure) = state(&r.conn);
    assert_eq!(st, DISABLED, "repeated write errors did not disable it");
    let failure = failure.expect("no last_failure recorded");
    assert!(failure.contains("write error"), "{failure}");
    r.verify();

    engine().faults().fail_extension_writes(0);
    r.reenable_after_self_disable();
}

/// The limit is on *consecutive* faults: write errors that each are followed by successful
/// writes are isolated, and must not add up to disabling the extension.
#[test]
fn isolated_write_errors_between_successful_writes_do_not_disable_the_extension() {
    let _s = serial();
    let r = Rig::new("DELETE");
    r.warm();
    for round in 1..=10 {
        // Empty caches: this round's scan reads nothing from the extension (each page once,
        // from the data file), so only its writes happen there.
        exec(&r.conn, "DBCC DROPCLEANBUFFERS");
        let before = Snap::take(&r.conn);
        engine().faults().fail_extension_writes(1);
        r.verify();
        assert!(engine().wait_for_extension_writes(WAIT));
        assert_eq!(
            state(&r.conn),
            (ENABLED.into(), None),
            "{round} write errors, each followed by successful writes, disabled the extension"
        );
        let d = Snap::take(&r.conn).since(before);
        assert_eq!(d.io_errors, 1, "round {round}: {d:?}");
        assert!(
            d.ext_writes > 0,
            "round {round}: no successful write: {d:?}"
        );
    }
    // Still on, and serving.
    let before = Snap::take(&r.conn);
    r.verify();
    let d = Snap::take(&r.conn).since(before);
    assert!(d.ext_reads > 0, "{d:?}");
}

#[test]
fn corruption_by_another_process_is_detected_and_never_served() {
    let _s = serial();
    let r = Rig::new("DELETE");
    let at_enable = Snap::take(&r.conn);
    r.warm();
    let slots = r.occupied_slots(at_enable);
    assert!(slots > 64, "only {slots} slots written");

    // Another process overwrites 16 random bytes in every 8th written slot, while this one keeps
    // reading. Every 8th: the extension sees corrupt slots among good ones, never 8 in a row.
    let before = Snap::take(&r.conn);
    let first = rand::random::<u64>() % 8;
    let script: Vec<String> = (first..slots)
        .step_by(8)
        .map(|slot| dd_random(&r.ext, slot * 4096 + rand::random::<u64>() % 4080, 16))
        .collect();
    let corrupted = script.len() as i64;
    let mut scribbler = Command::new("sh")
        .args(["-c", &script.join("\n")])
        .spawn()
        .unwrap();
    loop {
        r.verify();
        if let Some(status) = scribbler.try_wait().unwrap() {
            assert!(status.success(), "dd failed");
            break;
        }
    }
    for _ in 0..3 {
        r.verify();
    }
    let d = Snap::take(&r.conn).since(before);
    assert!(
        (1..=corrupted).contains(&d.checksum_failures),
        "{corrupted} slots corrupted, {d:?}"
    );
    assert_eq!(d.io_errors, 0, "{d:?}");
    assert_eq!(state(&r.conn), (ENABLED.into(), None));

    // Now the whole written part of the file is garbage: the extension gives up.
    let slots = r.occupied_slots(at_enable);
    run(Command::new("dd").args([
        "if=/dev/urandom".to_string(),
        format!("of={}", r.ext.display()),
        "bs=4096".into(),
        format!("count={slots}"),
        "conv=notrunc".into(),
        "iflag=fullblock".into(),
        "status=none".into(),
    ]));
    let before = Snap::take(&r.conn);
    until_disabled(&r.conn);
    let d = Snap::take(&r.conn).since(before);
    // (Fewer than 8 here when the last faults of the first part had no success after them.)
    assert!(d.checksum_failures >= 1, "{d:?}");
    assert_eq!(d.io_errors, 0, "{d:?}");
    let (st, failure) = state(&r.conn);
    assert_eq!(st, DISABLED, "{d:?}");
    let failure = failure.expect("no last_failure recorded");
    assert!(
        failure.contains("8 consecutive faults") && failure.contains("checksum mismatch"),
        "{failure}"
    );
    r.verify();
    r.reenable_after_self_disable();
}

#[test]
fn a_deleted_extension_file_keeps_serving_and_the_path_is_never_clobbered() {
    let _s = serial();
    let r = Rig::new("WAL");
    r.warm();

    // Another process unlinks the file. Our descriptor still names the inode, so the extension
    // keeps working (the space is freed when it is disabled); nothing is counted as a fault.
    run(Command::new("rm").arg(&r.ext));
    assert!(!r.ext.exists());
    let before = Snap::take(&r.conn);
    r.verify();
    let d = Snap::take(&r.conn).since(before);
    assert!(
        d.ext_reads > 0,
        "the unlinked extension stopped serving: {d:?}"
    );
    // It also keeps taking new pages (written to the unlinked inode) and serving them.
    exec(&r.conn, "DBCC DROPCLEANBUFFERS");
    r.warm();
    let d = Snap::take(&r.conn).since(before);
    assert_eq!((d.io_errors, d.checksum_failures), (0, 0), "{d:?}");
    assert_eq!(state(&r.conn), (ENABLED.into(), None));
    let path: String = r
        .conn
        .query_row("SELECT path FROM bpe_extension_configuration", [], |x| {
            x.get(0)
        })
        .unwrap();
    assert_eq!(Path::new(&path), r.ext);

    // Someone else creates a file at that path: disabling must not delete it (it is not ours),
    // and enabling must not overwrite it.
    run(Command::new("sh").args(["-c", &format!("printf foreign > '{}'", r.ext.display())]));
    exec(
        &r.conn,
        "ALTER SERVER CONFIGURATION SET BUFFER POOL EXTENSION OFF",
    );
    assert_eq!(state(&r.conn).0, DISABLED);
    assert_eq!(std::fs::read(&r.ext).unwrap(), b"foreign");
    let err = try_exec(&r.conn, &on_statement(&r.ext, EXT_MB)).unwrap_err();
    assert!(err.contains("already exists"), "{err}");
    assert_eq!(std::fs::read(&r.ext).unwrap(), b"foreign");
    assert_eq!(state(&r.conn).0, DISABLED);
    r.verify();

    std::fs::remove_file(&r.ext).unwrap();
    r.enable();
    r.warm();
}

#[test]
fn a_truncated_extension_file_gives_short_reads_that_are_misses_and_disable_it() {
    let _s = serial();
    let r = Rig::new("DELETE");
    r.warm();

    // Another process truncates the file to 0 bytes: every read of it is short, which must be
    // a miss (served from the data file) and an I/O error, never a page of zeros.
    run(Command::new("truncate").args(["-s", "0"]).arg(&r.ext));
    let before = Snap::take(&r.conn);
    until_disabled(&r.conn);
    let d = Snap::take(&r.conn).since(before);
    assert!(d.io_errors >= 1, "short reads not counted: {d:?}");
    assert!(d.io_errors + d.checksum_failures >= 8, "{d:?}");
    let (st, failure) = state(&r.conn);
    assert_eq!(st, DISABLED, "{d:?}");
    // The 8th fault is a short read; or, if the writer has meanwhile written a batch at the
    // ring's head (extending the file again, with a hole below), a slot that reads back as
    // zeros: a checksum mismatch. Both are misses.
    let failure = failure.expect("no last_failure recorded");
    assert!(
        failure.contains("shorter than expected (truncated?)")
            || failure.contains("checksum mismatch"),
        "{failure}"
    );
    r.verify();
    for id in [1, ROWS / 2, ROWS] {
        lookup(&r.conn, id).unwrap();
    }
    r.reenable_after_self_disable();
}

#[test]
fn a_data_file_read_error_reaches_sqlite_as_an_io_error_and_nothing_wrong_is_cached() {
    let _s = serial();
    for journal in ["DELETE", "WAL"] {
        clear_faults();
        let _ = engine().disable_extension();
        let r = Rig::new(journal);
        r.warm();

        // One failed page read inside a read transaction (its lock-time reads are done).
        r.conn.execute_batch("BEGIN").unwrap();
        lookup(&r.conn, 1).unwrap();
        exec(&r.conn, "DBCC DROPCLEANBUFFERS");
        engine().faults().fail_data_reads(1);
        let err = lookup(&r.conn, ROWS).unwrap_err();
        match &err {
            rusqlite::Error::SqliteFailure(e, _) => {
                assert_eq!(
                    e.code,
                    rusqlite::ErrorCode::SystemIoFailure,
                    "{journal}: {err}"
                );
                assert_eq!(
                    e.extended_code,
                    rusqlite::ffi::SQLITE_IOERR_READ,
                    "{journal}: {err}"
                );
            }
            other => panic!("{journal}: not an SQLite I/O error: {other:?}"),
        }
        let _ = r.conn.execute_batch("ROLLBACK");
        assert!(r.conn.is_autocommit());
        // The fault is gone: the same query answers right, and so does everything else.
        lookup(&r.conn, ROWS).unwrap();
        r.verify();

        // Every data-file read fails for a while, for every connection; then it heals.
        let other = open_bpe(&r.dir.path().join("faults.db"));
        other.execute_batch("PRAGMA cache_size = 1").unwrap();
        exec(&r.conn, "DBCC DROPCLEANBUFFERS");
        engine().faults().fail_data_reads(u32::MAX);
        for c in [&r.conn, &other] {
            match lookup(c, ROWS / 2) {
                Err(rusqlite::Error::SqliteFailure(e, _)) => {
                    assert_eq!(e.code, rusqlite::ErrorCode::SystemIoFailure, "{journal}")
                }
                other => panic!("{journal}: expected an I/O error, got {other:?}"),
            }
        }
        engine().faults().fail_data_reads(0);
        r.verify();
        verify(&other);
        assert_eq!(state(&r.conn), (ENABLED.into(), None));
    }
}

/// A small file system mounted inside a temp dir, unmounted on drop: tmpfs where it supports
/// O_DIRECT (Linux 6.6 on), else a loop-mounted ext4 image.
struct SmallFs {
    dir: PathBuf,
}

impl SmallFs {
    fn mount(parent: &Path, bytes: u64) -> Result<SmallFs, String> {
        let dir = parent.join("small");
        std::fs::create_dir(&dir).unwrap();
        let tmpfs = Command::new("mount")
            .args(["-t", "tmpfs", "-o"])
            .arg(format!("size={}k,mode=0700", bytes >> 10))
            .arg("bpe-faults")
            .arg(&dir)
            .output();
        let tmpfs_err = match tmpfs {
            Ok(o) if o.status.success() => {
                let fs = SmallFs { dir: dir.clone() };
                if direct_io_works(&dir) {
                    return Ok(fs);
                }
                drop(fs);
                "tmpfs has no O_DIRECT on this kernel".to_string()
            }
            Ok(o) => String::from_utf8_lossy(&o.stderr).into_owned(),
            Err(e) => e.to_string(),
        };
        let img = parent.join("small.img");
        std::fs::File::create(&img).unwrap().set_len(bytes).unwrap();
        let mkfs = Command::new("mkfs.ext4")
            .args(["-q", "-F", "-m", "0"])
            .arg(&img)
            .output();
        match mkfs {
            Ok(o) if o.status.success() => {}
            other => return Err(format!("tmpfs: {tmpfs_err}; mkfs.ext4: {other:?}")),
        }
        let ext4 = Command::new("mount")
            .args(["-o", "loop"])
            .arg(&img)
            .arg(&dir)
            .output();
        match ext4 {
            Ok(o) if o.status.success() => Ok(SmallFs { dir }),
            other => Err(format!("tmpfs: {tmpfs_err}; loop ext4: {other:?}")),
        }
    }

    fn available(&self) -> u64 {
        let c = std::ffi::CString::new(self.dir.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: statvfs is plain data; zeroed is a valid value for it to fill in.
        let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
        // SAFETY: c is a valid C string, st a valid out-pointer.
        assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut st) }, 0);
        st.f_bavail as u64 * st.f_frsize as u64
    }

    /// Fills the file system up with a file of its own; returns its path.
    fn fill(&self) -> PathBuf {
        use std::io::Write;
        let path = self.dir.join("filler");
        let mut f = std::fs::File::create(&path).unwrap();
        let chunk = vec![0xabu8; 4096];
        loop {
            if let Err(e) = f.write_all(&chunk).and_then(|_| f.sync_all()) {
                assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{e}");
                break;
            }
        }
        path
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        // An extension still open on it (a failed test) would keep it busy.
        let on_it = engine()
            .extension_status()
            .path
            .is_some_and(|p| p.starts_with(&self.dir));
        if on_it {
            let _ = engine().disable_extension();
        }
        let ok = Command::new("umount")
            .arg(&self.dir)
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
        }
    }
}

fn direct_io_works(dir: &Path) -> bool {
    use std::os::unix::fs::OpenOptionsExt;
    let probe = dir.join("probe");
    let ok = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_DIRECT)
        .open(&probe)
        .is_ok();
    let _ = std::fs::remove_file(&probe);
    ok
}

/// The small file system, or None (with the reason printed) where this process cannot mount.
fn small_fs(parent: &Path) -> Option<SmallFs> {
    match SmallFs::mount(parent, 6 << 20) {
        Ok(fs) => Some(fs),
        Err(reason) => {
            println!("SKIPPED: cannot mount a small file system here: {reason}");
            None
        }
    }
}

#[test]
fn disk_full_when_enabling_fails_clearly_and_changes_nothing_and_preallocation_prevents_it_later() {
    let _s = serial();
    let r = Rig::new("DELETE");
    exec(
        &r.conn,
        "ALTER SERVER CONFIGURATION SET BUFFER POOL EXTENSION OFF",
    );
    let Some(fs) = small_fs(r.dir.path()) else {
        return;
    };
    let ext = fs.dir.join("ext.bpe");
    let free = fs.available();
    assert!(free >= 4 << 20, "{free} bytes free");

    // Too big for the free space: fallocate says ENOSPC, and nothing changes.
    let target_pages = counter(&r.conn, "Target pages");
    let big = (free >> 20) + 4;
    let err = try_exec(&r.conn, &on_statement(&ext, big)).unwrap_err();
    assert!(
        err.contains("cannot create buffer pool extension file")
            && err.contains("No space left on device")
            && err.contains(&*ext.to_string_lossy()),
        "unclear error: {err}"
    );
    assert_eq!(state(&r.conn), (DISABLED.into(), None));
    assert!(!ext.exists(), "a refused enable left its file");
    assert_eq!(fs.available(), free, "a refused enable kept space");
    assert_eq!(counter(&r.conn, "Target pages"), target_pages);
    assert_eq!(counter(&r.conn, "Extension index bytes"), 0);
    r.verify();

    // Disk full while filling cannot happen: the extension's blocks are all allocated when it is
    // enabled (fallocate, not a sparse file). Enable it, then fill the file system up.
    let out = try_exec(&r.conn, &on_statement(&ext, 2)).unwrap();
    assert!(out.contains("enabled"), "{out}");
    let meta = std::fs::metadata(&ext).unwrap();
    assert_eq!(meta.len(), 2 << 20);
    assert!(
        meta.blocks() * 512 >= 2 << 20,
        "the extension file is sparse: {} blocks",
        meta.blocks()
    );
    let filler = fs.fill();
    // The file system really is full for anything not preallocated: a sparse file cannot
    // take one page.
    {
        use std::os::unix::fs::FileExt;
        let sparse = std::fs::File::create(fs.dir.join("sparse")).unwrap();
        sparse.set_len(1 << 20).unwrap();
        let e = sparse
            .write_all_at(&[1u8; 4096], 0)
            .and_then(|_| sparse.sync_all())
            .unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{e}");
    }
    // The extension keeps writing, and serving, on the full file system.
    exec(&r.conn, "DBCC DROPCLEANBUFFERS");
    let before = Snap::take(&r.conn);
    r.warm();
    r.warm();
    let d = Snap::take(&r.conn).since(before);
    assert!(d.ext_writes > 512, "the ring did not go round: {d:?}");
    assert_eq!((d.io_errors, d.checksum_failures), (0, 0), "{d:?}");
    assert_eq!(state(&r.conn), (ENABLED.into(), None));

    exec(
        &r.conn,
        "ALTER SERVER CONFIGURATION SET BUFFER POOL EXTENSION OFF",
    );
    assert!(!ext.exists());
    std::fs::remove_file(filler).unwrap();
    drop(fs);
}

/// Growing the extension online (`ON` again at the same path with a larger SIZE) when the larger
/// size does not fit must fail and leave the extension as it was, like every other refused
/// request.
#[test]
fn disk_full_when_resizing_leaves_the_extension_enabled() {
    let _s = serial();
    let r = Rig::new("DELETE");
    exec(
        &r.conn,
        "ALTER SERVER CONFIGURATION SET BUFFER POOL EXTENSION OFF",
    );
    let Some(fs) = small_fs(r.dir.path()) else {
        return;
    };
    let ext = fs.dir.join("ext.bpe");
    try_exec(&r.conn, &on_statement(&ext, 2)).unwrap();
    let big = (fs.available() >> 20) + 8;
    let err = try_exec(&r.conn, &on_statement(&ext, big)).unwrap_err();
    assert!(err.contains("No space left on device"), "{err}");
    let size_kb: Option<i64> = r
        .conn
        .query_row(
            "SELECT current_size_in_kb FROM bpe_extension_configuration",
            [],
            |x| x.get(0),
        )
        .unwrap();
    let st = state(&r.conn).0;
    // Leave the mount free before asserting.
    let _ = engine().disable_extension();
    drop(fs);
    assert_eq!(
        (st.as_str(), size_kb),
        (ENABLED, Some(2048)),
        "a resize refused for lack of space turned the extension off"
    );
}
