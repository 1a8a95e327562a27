//! Warm restart through SQLite, the way applications restart: a process using bpe exits (or is
//! SIGKILLed) with its extension on, and the next process configured with the same extension
//! path starts warm from what it left, in WAL and rollback mode, with 4, 8 and 16 KiB pages;
//! and a database changed by plain SQLite between two bpe processes is never served stale. Both
//! sharings: a shared extension (the default) starts warm from the shared memory the last
//! process left beside the file, a private one from the checkpoint in the file (its restore
//! counters say how many pages it took back and refused).
//!
//! The children are this test binary re-executed (`child_entry`), configured by the environment
//! as an application would be (`BPE_EXTENSION_FILE`, 1 MB of max server memory). Each one checks
//! every row's checksum and the table's total against what the parent expects, and reports its
//! counters on a line `COUNTERS restored not_restored ext_reads data_reads`.

mod common;
mod rows;

use common::*;
use rand::{rngs::StdRng, Rng, SeedableRng};
use rusqlite::Connection;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

const CHILD: &str = "BPE_RESTART_CHILD";
const DB: &str = "BPE_RESTART_DB";
/// "sum count" of the rows table as the parent last wrote it.
const EXPECT: &str = "BPE_RESTART_EXPECT";
const EXT_SIZE: &str = "16MB";

#[test]
#[ignore = "run by the restart tests as a child process"]
fn child_entry() {
    let Some(mode) = child_mode(CHILD) else {
        return;
    };
    sqlite_bpe::register().expect("register");
    let db = PathBuf::from(std::env::var(DB).unwrap());
    let expect = std::env::var(EXPECT).unwrap();
    match mode.as_str() {
        // Reads everything once, then exits cleanly (a last checkpoint is written at exit).
        "read" => {
            check_rows(&db, &expect);
            report();
        }
        // Reads everything, then early in the next second writes a page through bpe (a
        // row rewritten as it was) and exits: the stamp it vouches for at exit is within a
        // tick of a one-second clock of its own write.
        "read-write" => {
            check_rows(&db, &expect);
            // Past the fine-clock racy window into the second, with most of it left.
            next_second();
            std::thread::sleep(Duration::from_millis(100));
            let c = open_bpe(&db);
            c.execute_batch("UPDATE rows SET crc = crc WHERE id = 1")
                .unwrap();
            drop(c);
            report();
        }
        // Reads over and over, resizing the extension now and then, until killed.
        "loop" => {
            let ext = std::env::var("BPE_EXTENSION_FILE").unwrap();
            std::thread::spawn(move || {
                let c = Connection::open_in_memory().unwrap();
                for size in ["20MB", "16MB"].iter().cycle() {
                    std::thread::sleep(Duration::from_millis(150));
                    let _ = try_exec(&c, &extension_on(&ext, size));
                }
            });
            loop {
                check_rows(&db, &expect);
                report();
            }
        }
        other => panic!("unknown child mode {other}"),
    }
}

/// Every row's checksum, and the table's total, through a fresh bpe connection (autocommit
/// statements, as an application's pool hands them out).
fn check_rows(db: &Path, expect: &str) {
    let c = open_bpe(db);
    c.busy_timeout(Duration::from_secs(30)).unwrap();
    c.execute_batch("PRAGMA cache_size = 1").unwrap();
    assert!(sqlite_bpe::engine().wait_for_extension_restore(Duration::from_secs(30)));
    let mut stmt = c.prepare("SELECT id, payload, crc FROM rows").unwrap();
    let mut rows = stmt.query([]).unwrap();
    let (mut sum, mut count) = (0i64, 0i64);
    while let Some(r) = rows.next().unwrap() {
        let id: i64 = r.get(0).unwrap();
        let crc: i64 = r.get(2).unwrap();
        let payload = r.get_ref(1).unwrap().as_blob().unwrap();
        assert_eq!(rows::crc32(payload), crc, "row {id}: bad checksum");
        sum = sum.wrapping_add(crc);
        count += 1;
    }
    assert_eq!(format!("{sum} {count}"), expect, "a stale or lost row");
}

fn report() {
    let k = sqlite_bpe::engine().counters();
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "COUNTERS {} {} {} {}",
        k.ext_pages_restored, k.ext_pages_not_restored, k.ext_page_reads, k.page_reads
    )
    .unwrap();
    out.flush().unwrap();
}

/// (restored, not restored, extension reads, data-file reads) from a child's last report.
fn counters(stdout: &str) -> [u64; 4] {
    let line = stdout
        .lines()
        .rev()
        .find_map(|l| l.split_once("COUNTERS ").map(|(_, v)| v))
        .unwrap_or_else(|| panic!("no counters in {stdout:?}"));
    let n: Vec<u64> = line.split(' ').map(|x| x.parse().unwrap()).collect();
    [n[0], n[1], n[2], n[3]]
}

use bpe_core::Sharing::{self, *};

fn child(mode: &str, db: &Path, ext: &Path, expect: &str, sharing: Sharing) -> Command {
    let mut cmd = child_command(CHILD, mode);
    cmd.env(
        "BPE_EXTENSION_SHARED",
        if sharing == Shared { "1" } else { "0" },
    )
    .env(DB, db)
    .env(EXPECT, expect)
    .env("BPE_MAX_SERVER_MEMORY_MB", "1")
    .env("BPE_EXTENSION_FILE", ext)
    .env("BPE_EXTENSION_SIZE", EXT_SIZE)
    .env("BPE_EXTENSION_CHECKPOINT_MS", "30")
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    cmd
}

/// Runs a "read" child to its end; its counters.
fn run_reader(db: &Path, ext: &Path, expect: &str, sharing: Sharing) -> [u64; 4] {
    let out = child("read", db, ext, expect, sharing).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}:\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    counters(&stdout)
}

/// A database of about 1.5 MB of rows with checksums, made with plain SQLite; "sum count".
fn create_db(path: &Path, journal: &str, page_size: usize) -> String {
    let c = open_unix(path);
    c.execute_batch(&format!(
        "PRAGMA page_size = {page_size}; PRAGMA journal_mode = {journal};
         CREATE TABLE rows(id INTEGER PRIMARY KEY, payload BLOB NOT NULL, crc INTEGER NOT NULL);
         BEGIN;"
    ))
    .unwrap();
    for id in 1..=2000u64 {
        let p = rows::payload(id, 300 + (id as usize * 53) % 900);
        c.execute(
            "INSERT INTO rows(id, payload, crc) VALUES (?1, ?2, ?3)",
            rusqlite::params![id, p, rows::crc32(&p)],
        )
        .unwrap();
    }
    c.execute_batch("COMMIT").unwrap();
    drop(c);
    settle();
    expected(path)
}

/// "sum count" of the rows, read with plain SQLite (the sum wraps, as the child's does).
fn expected(path: &Path) -> String {
    let c = open_unix(path);
    let mut stmt = c.prepare("SELECT crc FROM rows").unwrap();
    let (mut sum, mut count) = (0i64, 0i64);
    for crc in stmt.query_map([], |r| r.get::<_, i64>(0)).unwrap() {
        sum = sum.wrapping_add(crc.unwrap());
        count += 1;
    }
    format!("{sum} {count}")
}

/// Rewrites every `step`-th row with plain SQLite, as another program would.
fn rewrite(c: &Connection, step: i64, seed: u64) {
    c.execute_batch("BEGIN").unwrap();
    let mut id = 1 + (seed % step as u64) as i64;
    while id <= 2000 {
        let p = rows::payload(seed ^ id as u64, 200 + (id as usize * 31) % 800);
        c.execute(
            "UPDATE rows SET payload = ?1, crc = ?2 WHERE id = ?3",
            rusqlite::params![p, rows::crc32(&p), id],
        )
        .unwrap();
        id += step;
    }
    c.execute_batch("COMMIT").unwrap();
}

/// Lets the file's timestamps age past the window in which a coarse clock could not tell two
/// writes apart (the engine vouches only for older stamps).
fn settle() {
    std::thread::sleep(Duration::from_millis(80));
}

#[test]
fn a_restarted_process_starts_warm_in_both_journal_modes_and_every_page_size() {
    let dir = tempdir();
    let cases = [
        ("WAL", 4096, Shared),
        ("DELETE", 8192, Shared),
        ("WAL", 4096, Private),
        ("DELETE", 8192, Private),
        ("DELETE", 16384, Private),
    ];
    for (journal, page_size, sharing) in cases {
        let db = dir
            .path()
            .join(format!("{journal}-{page_size}-{sharing:?}.db"));
        let ext = dir
            .path()
            .join(format!("{journal}-{page_size}-{sharing:?}.bpe"));
        let expect = create_db(&db, journal, page_size);
        let cold = run_reader(&db, &ext, &expect, sharing);
        assert!(ext.exists(), "a clean exit removed the extension file");
        let warm = run_reader(&db, &ext, &expect, sharing);
        println!("{journal} {page_size} {sharing:?}: cold {cold:?}, warm {warm:?}");
        assert_eq!(cold[0], 0, "nothing to restore the first time");
        if sharing == Private {
            assert!(
                warm[0] > 0 && warm[1] == 0,
                "{journal} {page_size}: restored {} pages, refused {}",
                warm[0],
                warm[1]
            );
        }
        // The warm process reads from the extension what the cold one read from the disk.
        assert!(
            warm[2] > 0 && warm[3] * 4 < cold[3],
            "{journal} {page_size} {sharing:?}: data-file reads cold {}, warm {}",
            cold[3],
            warm[3]
        );
    }
}

#[test]
fn a_database_changed_by_plain_sqlite_between_bpe_processes_is_never_served_stale() {
    let dir = tempdir();
    let cases = [
        ("DELETE", 4096, Private),
        ("WAL", 8192, Private),
        ("DELETE", 4096, Shared),
        ("WAL", 8192, Shared),
    ];
    for (journal, page_size, sharing) in cases {
        let name = format!("{journal}-{page_size}-{sharing:?}");
        let db = dir.path().join(format!("{name}.db"));
        let ext = dir.path().join(format!("{name}.bpe"));
        let expect = create_db(&db, journal, page_size);
        let cold = run_reader(&db, &ext, &expect, sharing);

        // Plain SQLite changes some rows and closes (WAL: its close checkpoints into the file).
        rewrite(&open_unix(&db), 7, 1);
        settle();
        let expect = expected(&db);
        // The oracle: the child checks every row against what plain SQLite wrote.
        let after = run_reader(&db, &ext, &expect, sharing);
        println!("{name}: cold {cold:?}, after a change {after:?}");
        match sharing {
            Private => {
                assert_eq!(after[0], 0, "{name}: pages of a changed file were restored");
                assert!(after[1] > 0, "{name}: nothing said the pages were refused");
            }
            // The file's stamp is not the one vouched for: it gets a new key, and every page
            // is read from the data file again.
            Shared => assert!(
                after[3] * 10 >= cold[3] * 9,
                "{name}: data-file reads cold {}, after the change {}",
                cold[3],
                after[3]
            ),
        }

        if journal == "WAL" {
            // A change that waits in the WAL leaves the database file as it was: its pages are
            // served from the extension, and SQLite reads the changed ones from the WAL.
            run_reader(&db, &ext, &expect, sharing);
            let plain = open_unix(&db);
            plain
                .execute_batch("PRAGMA wal_autocheckpoint = 0")
                .unwrap();
            // One row in 40: most pages stay in the database file only.
            rewrite(&plain, 40, 2);
            settle();
            let expect = expected(&db);
            let with_wal = run_reader(&db, &ext, &expect, sharing);
            println!("{name}: with frames in the WAL {with_wal:?}");
            let warm = match sharing {
                Private => with_wal[0] > 0,
                Shared => with_wal[2] > 0 && with_wal[3] * 4 < cold[3],
            };
            assert!(warm, "{name}: the unchanged database file started cold");
            drop(plain);
        }
    }
}

/// A loop-mounted ext4 made with 128-byte inodes: its timestamps keep whole seconds.
struct CoarseVolume {
    mount: PathBuf,
}

impl CoarseVolume {
    /// None (said) where this machine cannot make one (not root, no mkfs.ext4 or loop devices).
    fn new(dir: &Path) -> Option<CoarseVolume> {
        let image = dir.join("coarse.img");
        let mount = dir.join("coarse");
        std::fs::create_dir_all(&mount).unwrap();
        let ok = |cmd: &mut Command| cmd.output().is_ok_and(|o| o.status.success());
        let made = ok(Command::new("mkfs.ext4")
            .args(["-q", "-F", "-I", "128", "-b", "4096"])
            .arg(&image)
            .arg("32M"))
            && ok(Command::new("mount")
                .arg("-o")
                .arg("loop")
                .arg(&image)
                .arg(&mount));
        if !made {
            println!("skipped: cannot make and mount an ext4 image with 128-byte inodes here");
            return None;
        }
        Some(CoarseVolume { mount })
    }
}

impl Drop for CoarseVolume {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.mount).status();
    }
}

/// Waits for the start of the next second of the file system's clock.
fn next_second() {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    std::thread::sleep(Duration::from_nanos(
        1_000_000_000 - now.subsec_nanos() as u64 + 5_000_000,
    ));
}

/// On a file system whose timestamps keep whole seconds, a plain-SQLite commit in
/// the same second as a bpe process's last write left the stamp equal, and the next bpe
/// process restored and served the old pages. A stamp is now racy for twice the granularity
/// its times show; a warm restart still works once the file has aged.
#[test]
fn on_a_file_system_with_one_second_timestamps_a_change_between_processes_is_never_stale() {
    let dir = tempdir();
    let Some(volume) = CoarseVolume::new(dir.path()) else {
        return;
    };
    let cases = [
        ("DELETE", 4096, Private),
        ("WAL", 4096, Private),
        ("DELETE", 4096, Shared),
        ("WAL", 4096, Shared),
    ];
    for (journal, page_size, sharing) in cases {
        let db = volume.mount.join(format!("{journal}-{sharing:?}.db"));
        let ext = dir.path().join(format!("{journal}-{sharing:?}.bpe"));
        let mut expect = create_db(&db, journal, page_size);
        for trial in 0..4u64 {
            let out = child("read-write", &db, &ext, &expect, sharing)
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            // Plain SQLite commits within the same second, as another program would: one row
            // rewritten at its length, so the file keeps its size.
            let plain = open_unix(&db);
            let id = 1000 + trial as i64;
            let len: i64 = plain
                .query_row(
                    "SELECT length(payload) FROM rows WHERE id = ?1",
                    [id],
                    |r| r.get(0),
                )
                .unwrap();
            let p = rows::payload(trial + 77, len as usize);
            plain
                .execute(
                    "UPDATE rows SET payload = ?1, crc = ?2 WHERE id = ?3",
                    rusqlite::params![p, rows::crc32(&p), id],
                )
                .unwrap();
            drop(plain);
            expect = expected(&db);
            let after = run_reader(&db, &ext, &expect, sharing);
            println!("{journal} {sharing:?} trial {trial}: after a same-second change {after:?}");
        }
        // Aged past the window, the stamp vouches again: the restart is warm.
        std::thread::sleep(Duration::from_millis(2_100));
        let cold = run_reader(&db, &ext, &expect, sharing);
        let warm = run_reader(&db, &ext, &expect, sharing);
        let started_warm = match sharing {
            Private => warm[0] > 0,
            Shared => warm[2] > 0 && warm[3] * 4 < cold[3],
        };
        assert!(
            started_warm,
            "{journal} {sharing:?}: no warm restart on the coarse volume: {cold:?} then {warm:?}"
        );
    }
}

/// SIGKILL at random moments of readers (during the restore at their start, during fills,
/// during resizes) with plain SQLite changing the database between some of them: every child
/// checks every row and the table's total each round (a stale page fails it, and the child
/// aborts, which the parent sees); then a clean reader checks once more.
#[test]
fn sigkill_during_fill_restore_or_resize_never_serves_a_stale_page() {
    let seed = crash_seed();
    println!("BPE_CRASH_SEED={seed}");
    let mut rng = StdRng::seed_from_u64(seed);
    let dir = tempdir();
    let (mut restored, mut refused) = (0, 0);
    for (journal, page_size) in [("WAL", 4096), ("DELETE", 16384)] {
        let db = dir.path().join(format!("{journal}.db"));
        let ext = dir.path().join(format!("{journal}.bpe"));
        let mut expect = create_db(&db, journal, page_size);
        let restored_before = restored;
        // 8 children, and up to 8 more while none has started warm yet: on a loaded machine a
        // child may be killed before its first checkpoint many times in a row.
        for i in 0..16 {
            if i >= 8 && restored > restored_before {
                break;
            }
            if i % 3 == 2 {
                rewrite(&open_unix(&db), rng.gen_range(3..20), rng.gen());
                settle();
                expect = expected(&db);
            }
            let delay = rng.gen_range(5..400);
            let mut process = child("loop", &db, &ext, &expect, Private).spawn().unwrap();
            let out = process.stdout.take().unwrap();
            let (first_round, started) = std::sync::mpsc::channel();
            let lines = std::thread::spawn(move || {
                let mut all: Vec<String> = Vec::new();
                for line in BufReader::new(out).lines().map_while(Result::ok) {
                    // The first round's report, not the first line: the test harness the child
                    // runs in prints its own lines at its start, and the test's name at the
                    // start of the line the first report ends.
                    if line.contains("COUNTERS ") && !all.iter().any(|l| l.contains("COUNTERS ")) {
                        let _ = first_round.send(());
                    }
                    all.push(line);
                }
                all.join("\n")
            });
            // Every other child is killed counting from its first round rather than from its
            // start: on a loaded machine a start alone can take longer than any delay, and then
            // no child would ever leave a checkpoint for the next to start warm from.
            if i % 2 == 1 {
                let _ = started.recv_timeout(Duration::from_secs(60));
            }
            std::thread::sleep(Duration::from_millis(delay));
            if let Some(status) = process.try_wait().unwrap() {
                let mut err = String::new();
                use std::io::Read;
                process
                    .stderr
                    .take()
                    .unwrap()
                    .read_to_string(&mut err)
                    .unwrap();
                panic!("{journal} {i}: the child ended by itself ({status}):\n{err}");
            }
            process.kill().unwrap();
            let status = process.wait().unwrap();
            assert_eq!(status.signal(), Some(libc::SIGKILL));
            let stdout = lines.join().unwrap();
            if stdout.contains("COUNTERS") {
                let c = counters(&stdout);
                println!("{journal} {i}: killed after {delay} ms, counters {c:?}");
                restored += c[0];
                refused += c[1];
            } else {
                println!("{journal} {i}: killed after {delay} ms, before its first round");
            }
        }
        let last = run_reader(&db, &ext, &expect, Private);
        println!("{journal}: the clean reader after the kills {last:?}");
        restored += last[0];
    }
    println!("{restored} pages restored and {refused} refused in all");
    assert!(
        restored > 0,
        "no process ever started warm: the test tested nothing"
    );
}
