//! Two engines sharing one extension (`Config::shared_extension`), in one process: each is a
//! participant of its own (its own descriptions of the file, its own lock byte), as two
//! processes would be. What one loads the other reads from L2; a write through either
//! invalidates for both; a resize is refused while the other is attached; the file goes with
//! the last one. The multi-process crash tests are shared_extension.rs and sqlite-bpe's shared.rs.

mod common;
use bpe_core::{Config, Engine, ExtensionState, Sharing, Tier};
use common::*;
use std::path::Path;
use std::sync::Arc;

const EXT: u64 = 16 << 20;

fn shared_engine() -> Arc<Engine> {
    shared_engine_with(4 << 20)
}

fn shared_engine_with(max_memory: u64) -> Arc<Engine> {
    Engine::new(Config {
        max_memory,
        shared_extension: true,
        ..Config::default()
    })
}

/// Lets the file's timestamps age past the window in which a stamp cannot vouch for it.
fn settle() {
    std::thread::sleep(std::time::Duration::from_millis(80));
}

#[test]
fn what_one_engine_loads_the_other_reads_from_l2_and_a_write_invalidates_it_for_both() {
    let dir = tempdir();
    let data = make_file(dir.path(), "data", 64, PAGE);
    settle();
    let ext = dir.path().join("ext.bpe");
    let (a, b) = (shared_engine(), shared_engine());
    let (fa, fb) = (
        a.open_file(&data, PAGE).unwrap(),
        b.open_file(&data, PAGE).unwrap(),
    );
    a.enable_extension(&ext, EXT).unwrap();
    b.enable_extension(&ext, EXT).unwrap();
    // Out of order: no readahead, one page per read.
    let order: Vec<u64> = (0..64).map(|i| (i * 37) % 64).collect();
    for &p in &order {
        assert_eq!(decode(&read(&a, &fa, p).0), Some((p, 0)));
    }
    assert!(a.wait_for_extension_writes(WAIT));
    for &p in &order {
        let (bytes, tier) = read(&b, &fb, p);
        assert_eq!(decode(&bytes), Some((p, 0)));
        // From L2, or from RAM where L2's readahead brought it first.
        assert_ne!(tier, Tier::DataFile, "page {p}: b finds what a loaded");
    }
    let k = b.counters();
    assert_eq!(k.page_reads, 0, "b read nothing from the data file");
    assert_eq!(
        k.ext_shared_page_reads, 64,
        "counted as other participants' pages"
    );
    assert_eq!(k.ext_shared_processes, 2);
    // The histograms beside the counters: every L2 read request timed, every lock wait too.
    let h = b.histograms();
    let count = |name: &str| h.iter().find(|h| h.name == name).map(|h| h.count());
    assert_eq!(count("Extension read time"), Some(k.ext_read_requests));
    assert!(count("Extension shared lock wait").is_some_and(|n| n >= 64));
    assert!(b
        .descriptors()
        .iter()
        .filter(|d| d.tier == Tier::Extension)
        .all(|d| d.loaded_by == Some(std::process::id())));
    assert_eq!(
        a.counters().ext_shared_page_reads,
        0,
        "a's own pages are a's"
    );

    // b writes page 5; a forgets its RAM copy (its change detection would) and reads it again:
    // the L2 copy a loaded is gone, for a too.
    b.write_page(&fb, 5, &page_bytes(5, 1, PAGE)).unwrap();
    let in_l2 = |e: &Engine, page: u64| {
        e.descriptors()
            .iter()
            .any(|d| d.tier == Tier::Extension && d.page == page)
    };
    assert!(
        !in_l2(&a, 5),
        "b's write removed the copy a loaded, before a forgets anything"
    );
    a.forget_pages(&fa, &[5]);
    assert_eq!(decode(&read(&a, &fa, 5).0), Some((5, 1)));
    a.write_page(&fa, 6, &page_bytes(6, 1, PAGE)).unwrap();
    b.forget_pages(&fb, &[6]);
    assert_eq!(decode(&read(&b, &fb, 6).0), Some((6, 1)));
    a.check_invariants();
    b.check_invariants();
}

#[test]
fn a_resize_waits_for_the_others_and_the_file_goes_with_the_last() {
    let dir = tempdir();
    let data = make_file(dir.path(), "data", 8, PAGE);
    let ext = dir.path().join("ext.bpe");
    let (a, b) = (shared_engine(), shared_engine());
    a.open_file(&data, PAGE).unwrap();
    a.enable_extension(&ext, EXT).unwrap();
    b.enable_extension(&ext, EXT).unwrap();
    let err = a.resize_extension(2 * EXT).unwrap_err().to_string();
    assert!(
        err.contains("shared at") && err.contains("detach them"),
        "{err}"
    );
    let status = a.extension_status();
    assert_eq!(
        status.state,
        ExtensionState::Enabled,
        "the old size is back"
    );
    assert_eq!(status.size_bytes, EXT);
    b.disable_extension().unwrap();
    assert!(ext.exists(), "a still uses it");
    a.resize_extension(2 * EXT).unwrap();
    assert_eq!(a.extension_status().size_bytes, 2 * EXT);
    a.disable_extension().unwrap();
    assert!(!ext.exists(), "the last to leave removed it");
}

/// A batch that turns a shared extension OFF and ON again at the same path as this process's
/// own (or at another size) is refused as a whole while other processes use the file: the
/// second step could only fail, after the first had already left the extension.
#[test]
fn off_then_on_again_private_or_resized_is_refused_while_others_share_the_file() {
    use bpe_core::SettingChange::{ExtensionOff, ExtensionOn};
    let dir = tempdir();
    let ext = dir.path().join("ext.bpe");
    let (a, b) = (shared_engine(), shared_engine());
    a.enable_extension(&ext, EXT).unwrap();
    b.enable_extension(&ext, EXT).unwrap();
    let on = |size, sharing| ExtensionOn {
        path: &ext,
        size,
        sharing,
    };
    let refused = |changes: &[bpe_core::SettingChange<'_>]| {
        let (i, e) = a.check_changes(changes).unwrap_err();
        assert_eq!(i, 1, "the ON is the step refused: {e}");
        e.to_string()
    };
    let err = refused(&[ExtensionOff, on(EXT, Some(Sharing::Private))]);
    assert!(err.contains("using it"), "{err}");
    let err = refused(&[ExtensionOff, on(2 * EXT, None)]);
    assert!(err.contains("shared at"), "{err}");
    // Joining again at the same size is what the others allow.
    a.check_changes(&[ExtensionOff, on(EXT, None)]).unwrap();
    assert_eq!(a.extension_sharing(), Some(Sharing::Shared));
    // With the others gone, both are this process's to do.
    b.disable_extension().unwrap();
    a.check_changes(&[ExtensionOff, on(EXT, Some(Sharing::Private))])
        .unwrap();
    a.check_changes(&[ExtensionOff, on(2 * EXT, None)]).unwrap();
    a.disable_extension().unwrap();
}

/// DBCC DROPCLEANBUFFERS in one process empties the machine's one extension, as SQL Server's
/// empties its instance's one buffer pool: the other process reads from the data file again.
#[test]
fn drop_clean_buffers_in_one_process_empties_the_shared_extension_for_every_process() {
    let dir = tempdir();
    let data = make_file(dir.path(), "data", 64, PAGE);
    settle();
    let ext = dir.path().join("ext.bpe");
    let (a, b) = (shared_engine(), shared_engine());
    a.enable_extension(&ext, EXT).unwrap();
    b.enable_extension(&ext, EXT).unwrap();
    let (fa, fb) = (
        a.open_file(&data, PAGE).unwrap(),
        b.open_file(&data, PAGE).unwrap(),
    );
    let order: Vec<u64> = (0..64).map(|i| (i * 37) % 64).collect();
    for &p in &order {
        read(&a, &fa, p);
    }
    assert!(a.wait_for_extension_writes(WAIT));
    assert_eq!(b.counters().ext_allocated_pages, 64);
    b.drop_clean_buffers();
    assert_eq!(a.counters().ext_allocated_pages, 0, "a still sees entries");
    // a empties its own RAM (its DBCC would), and finds nothing in L2 either.
    a.drop_clean_buffers();
    let l2_reads = a.counters().ext_page_reads;
    for &p in &order {
        let (bytes, tier) = read(&a, &fa, p);
        assert_eq!(decode(&bytes), Some((p, 0)));
        // From the data file, or from RAM where readahead brought it first.
        assert_ne!(
            tier,
            Tier::Extension,
            "page {p} still served from the emptied L2"
        );
    }
    assert_eq!(a.counters().ext_page_reads, l2_reads);
    drop(fb);
}

#[test]
fn a_private_extension_and_a_shared_one_never_use_one_file() {
    let dir = tempdir();
    let ext = dir.path().join("ext.bpe");
    let (shared, private) = (shared_engine(), engine(4 << 20));
    shared.enable_extension(&ext, EXT).unwrap();
    let err = private
        .enable_extension_as(&ext, EXT, Sharing::Private)
        .unwrap_err()
        .to_string();
    assert!(err.contains("using it"), "{err}");
    shared.disable_extension().unwrap();
    private
        .enable_extension_as(&ext, EXT, Sharing::Private)
        .unwrap();
    let err = shared.enable_extension(&ext, EXT).unwrap_err().to_string();
    assert!(err.contains("for itself"), "{err}");
    assert_eq!(shared.extension_status().state, ExtensionState::Disabled);
    private.disable_extension().unwrap();
}

/// Pages in RAM from an earlier attachment are never offered to a later one: a new segment
/// hands out the same names again (the first file bound gets slot 0, key 1), so a frame of file
/// x read under the old one would be published as another file's page.
#[test]
fn frames_read_under_an_earlier_attachment_are_not_admitted_to_a_later_one() {
    let dir = tempdir();
    let x = make_file(dir.path(), "x", 2048, PAGE);
    let y = dir.path().join("y");
    let mut all = Vec::new();
    for p in 0..64 {
        all.extend_from_slice(&page_bytes(p, 7, PAGE));
    }
    std::fs::write(&y, all).unwrap();
    settle();
    let ext = dir.path().join("ext.bpe");
    let (a, b) = (shared_engine(), shared_engine());
    let fx = a.open_file(&x, PAGE).unwrap();
    a.enable_extension(&ext, EXT).unwrap();
    for p in 0..64 {
        read(&a, &fx, p); // in a's RAM, read under the first segment
    }
    a.disable_extension().unwrap(); // the last: the segment goes
    let fy = b.open_file(&y, PAGE).unwrap();
    b.enable_extension(&ext, EXT).unwrap();
    read(&b, &fy, 0); // y is the new segment's first file: slot 0, key 1
    a.enable_extension(&ext, EXT).unwrap();
    // a reads the rest of x: its RAM (4 MB) evicts the pages read under the old segment.
    for p in 64..2048 {
        read(&a, &fx, p);
    }
    assert!(a.wait_for_extension_writes(WAIT));
    // Pages 1.. of y are not in b's RAM: from L2 (where x's old frames would have landed under
    // y's name) or from the file.
    for p in 1..64 {
        assert_eq!(decode(&read(&b, &fy, p).0), Some((p, 7)), "page {p} of y");
    }
}

/// A process's own write leaves the file a stamp within a clock tick of it,
/// which cannot vouch for the file's entries; if nothing vouched later, the next process to
/// bind the file would give it a new key and throw away its shared pages. The stamp the
/// process's change detection verified afterwards (clear of the racy window) vouches at its
/// close, as a private extension's checkpoint would list the file.
#[test]
fn a_file_one_process_wrote_keeps_its_shared_pages_for_the_next_one() {
    let (b, _dir) = write_close_and_reopen(false);
    let k = b.counters();
    assert!(
        k.page_reads <= 1,
        "{} pages read from the data file: the next process threw the shared pages away",
        k.page_reads
    );
}

/// The other side of the same: a write by a program outside the extension after the vouching
/// process closed moves the stamp, and the next process serves none of the old pages.
#[test]
fn a_file_changed_after_the_vouching_process_closed_is_read_afresh() {
    let (b, _dir) = write_close_and_reopen(true);
    assert!(b.counters().page_reads >= 63);
}

/// One shared engine reads the file's 64 pages, writes page 3 and closes; if `foreign`, a
/// plain write then changes page 5; a second engine reads every page, and must see both.
fn write_close_and_reopen(foreign: bool) -> (Arc<Engine>, tempfile::TempDir) {
    let dir = tempdir();
    let data = make_file(dir.path(), "data", 64, PAGE);
    settle();
    let ext = dir.path().join("ext.bpe");
    let order: Vec<u64> = (0..64).map(|i| (i * 37) % 64).collect();
    {
        let a = shared_engine();
        a.enable_extension(&ext, EXT).unwrap();
        let f = a.open_file(&data, PAGE).unwrap();
        for &p in &order {
            assert_eq!(decode(&read(&a, &f, p).0), Some((p, 0)));
        }
        a.write_page(&f, 3, &page_bytes(3, 1, PAGE)).unwrap();
        a.sync(&f).unwrap();
        assert!(a.wait_for_extension_writes(WAIT));
        settle();
        // The host's change detection accepts the file as it is now (sqlite-bpe does this
        // at its next read transaction): this stamp is clear of the racy window.
        f.accept_stamp(f.stamp_now().unwrap());
        assert!(a.wait_for_readahead(WAIT));
        drop(f);
        drop(a);
    }
    if foreign {
        use std::os::unix::fs::FileExt;
        let file = std::fs::OpenOptions::new().write(true).open(&data).unwrap();
        file.write_all_at(&page_bytes(5, 1, PAGE), 5 * PAGE as u64)
            .unwrap();
    }
    let b = shared_engine();
    b.enable_extension(&ext, EXT).unwrap();
    let f = b.open_file(&data, PAGE).unwrap();
    for &p in &order {
        let version = u64::from(p == 3 || (foreign && p == 5));
        assert_eq!(decode(&read(&b, &f, p).0), Some((p, version)), "page {p}");
    }
    (b, dir)
}

/// A clean exit leaves the shared memory beside the file for the next process to start warm
/// from; once the file is gone (removed by hand, a temporary directory cleaned), the next
/// process to attach any shared extension removes it, and only then: a segment whose file is
/// there stays, and one a process has open is never removed.
#[test]
fn the_shared_memory_of_a_removed_extension_file_is_swept_and_no_other() {
    let dir = tempdir();
    let segment_of = |ext: &std::path::Path| {
        bpe_core::shared::memory_path(bpe_core::FileIdentity::of_path(ext).unwrap()).unwrap()
    };
    let (gone, kept, open) = (
        dir.path().join("gone.bpe"),
        dir.path().join("kept.bpe"),
        dir.path().join("open.bpe"),
    );
    // Drops the engine itself (its background jobs hold it a moment): its extension closes.
    let close = |e: Arc<Engine>| {
        let deadline = std::time::Instant::now() + WAIT;
        while Arc::strong_count(&e) > 1 && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert_eq!(Arc::strong_count(&e), 1, "the engine is still held");
    };
    let mut segments = Vec::new();
    for ext in [&gone, &kept] {
        let e = shared_engine();
        e.enable_extension(ext, EXT).unwrap();
        segments.push(segment_of(ext));
        close(e);
        assert!(segments.last().unwrap().exists(), "a clean exit removed it");
    }
    let holder = shared_engine();
    holder.enable_extension(&open, EXT).unwrap();
    let open_segment = segment_of(&open);
    let segment_ino = |p: &std::path::Path| {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(p).ok().map(|m| m.ino())
    };
    let gone_segment = segment_ino(&segments[0]).unwrap();
    std::fs::remove_file(&gone).unwrap();
    // The holder's file removed under it: its segment stays while it is attached.
    std::fs::remove_file(&open).unwrap();

    let other = dir.path().join("other.bpe");
    let e = shared_engine();
    e.enable_extension(&other, EXT).unwrap();
    // (other.bpe may get gone.bpe's inode number, and so a segment of the same name: a new one.)
    assert!(
        segment_ino(&segments[0]) != Some(gone_segment),
        "the removed file's shared memory stayed"
    );
    assert!(
        segments[1].exists(),
        "a kept file's shared memory was swept"
    );
    assert!(
        open_segment.exists(),
        "an attached process's shared memory was swept"
    );
    e.disable_extension().unwrap();
    close(holder);
    close(e);
    let last = shared_engine();
    last.enable_extension(&other, EXT).unwrap();
    assert!(!open_segment.exists(), "swept once its process left");
    last.disable_extension().unwrap();
}

/// Every participant's writer claims regions from the shared ring's head, so whether a copy is
/// about to be overwritten is measured from there, not from this engine's own writer: a hot set
/// one engine reads every round through the extension survives the ring turning three times
/// under the other engine's cold pages (core `tiers.rs` has the one-engine case).
#[test]
fn pages_one_engine_keeps_reading_outlive_a_ring_the_other_turns() {
    let dir = tempdir();
    let data = make_file(dir.path(), "data", 7000, PAGE);
    settle();
    let ext = dir.path().join("ext.bpe");
    // ~120 pages of RAM each.
    let (a, b) = (shared_engine_with(512 << 10), shared_engine_with(512 << 10));
    let (fa, fb) = (
        a.open_file(&data, PAGE).unwrap(),
        b.open_file(&data, PAGE).unwrap(),
    );
    a.enable_extension(&ext, 8 << 20).unwrap(); // 15 regions of 128 pages
    b.enable_extension(&ext, 8 << 20).unwrap();
    let hot: Vec<u64> = (0..200u64).map(|i| (i * 7919) % 200).collect();
    let mut cold = (200..7000u64).map(|i| 200 + (i * 7919) % 6800);
    let mut hot_from_file = Vec::new();
    for round in 0..20 {
        let mut from_file = 0;
        for &p in &hot {
            let (bytes, tier) = read(&b, &fb, p);
            assert_eq!(decode(&bytes), Some((p, 0)));
            from_file += (tier == Tier::DataFile) as usize;
        }
        hot_from_file.push(from_file);
        for p in cold.by_ref().take(320) {
            read(&a, &fa, p);
        }
        assert!(b.wait_for_extension_writes(WAIT), "round {round}");
        assert!(a.wait_for_extension_writes(WAIT), "round {round}");
    }
    let evicted = a.counters().ext_page_evictions + b.counters().ext_page_evictions;
    assert!(evicted > 2000, "the ring did not turn over: {evicted}");
    // Not none, as with one engine: b's writer fills its claimed region slowly (only its
    // rewrites), and a's go on around it, so the region is already near the head when b seals
    // it, and some of what b wrote last goes before b reads it again (24-56 reads in all in
    // four runs; a FIFO ring without the rule loses the hot set every sixth round, 256).
    let lost: usize = hot_from_file[1..].iter().sum();
    assert!(
        lost <= 100,
        "hot pages read from the data file again, by round: {hot_from_file:?}"
    );
}

/// What a child of the stopped-holder test is: `hold` (attaches, then stops holding the lock)
/// or `exit` (attaches, then closes as a process's exit does when told to on stdin).
const CHILD: &str = "BPE_TEST_SHARED_CHILD";
/// The extension file the children share.
const CHILD_EXT: &str = "BPE_TEST_SHARED_EXT";
/// The data file they read.
const CHILD_DATA: &str = "BPE_TEST_SHARED_DATA";
/// How long anything here may take before it counts as a hang (never a verdict on speed).
const HANG: std::time::Duration = std::time::Duration::from_secs(60);

/// Warnings and errors the core logged in this process (the writer that did not stop, a
/// detach that found uses outstanding), each also printed as `LOG <level> <message>` so that
/// a child's reach its parent.
static LOGGED: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

struct Recorder;

impl log::Log for Recorder {
    fn enabled(&self, m: &log::Metadata) -> bool {
        m.level() <= log::Level::Warn
    }
    fn log(&self, r: &log::Record) {
        if self.enabled(r.metadata()) {
            let line = format!("LOG {} {}", r.level(), r.args());
            println!("{line}");
            LOGGED.lock().unwrap().push(line);
        }
    }
    fn flush(&self) {}
}

fn record_logs() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        log::set_logger(&Recorder).unwrap();
        log::set_max_level(log::LevelFilter::Warn);
    });
}

/// What the writer's stop logs when the writer does not stop (it was waiting for the lock).
const WRITER_STUCK: &str = "writer did not stop";

/// Not a test: the body of the child processes of
/// `a_participant_stopped_holding_the_lock_stalls_no_attach_off_or_exit` (does nothing unless
/// its variable is set).
#[test]
#[ignore = "run as a child process by the stopped-holder test"]
fn child_entry() {
    use std::io::BufRead;
    let Ok(mode) = std::env::var(CHILD) else {
        return;
    };
    record_logs();
    let ext = std::path::PathBuf::from(std::env::var(CHILD_EXT).unwrap());
    let e = shared_engine();
    e.enable_extension(&ext, EXT).unwrap();
    assert_eq!(e.extension_sharing(), Some(Sharing::Shared));
    match mode.as_str() {
        "hold" => {
            // Continued (SIGCONT): it has let go; it ends when the parent closes stdin.
            assert!(e.stop_holding_the_extension_lock());
            let _ = std::io::stdin().lines().count();
        }
        "exit" => {
            // Pages of its own in the ring: its writer holds a region when the exit comes.
            let data = std::path::PathBuf::from(std::env::var(CHILD_DATA).unwrap());
            let f = e.open_file(&data, PAGE).unwrap();
            for p in (0..64).rev() {
                assert_eq!(decode(&read(&e, &f, p).0), Some((p, 0)));
            }
            assert!(e.wait_for_extension_writes(WAIT));
            println!("ATTACHED");
            let mut line = String::new();
            std::io::stdin().lock().read_line(&mut line).unwrap();
            // What the adapter's exit handler does; then the process ends without unwinding.
            e.close_extension_at_exit();
            println!("CLOSED");
            std::process::exit(0);
        }
        other => panic!("unknown child mode {other}"),
    }
}

fn child(mode: &str, ext: &Path, data: &Path) -> std::process::Child {
    use std::process::{Command, Stdio};
    Command::new(std::env::current_exe().unwrap())
        .args(["child_entry", "--exact", "--ignored", "--nocapture"])
        .args(["--test-threads=1"])
        .env(CHILD, mode)
        .env(CHILD_EXT, ext)
        .env(CHILD_DATA, data)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap()
}

/// Kills the children it names when dropped, so that a failing test leaves no process stopped
/// holding the lock (a stopped process ignores everything but SIGKILL and SIGCONT).
struct Reaper(Vec<u32>);

impl Drop for Reaper {
    fn drop(&mut self) {
        for &pid in &self.0 {
            // SAFETY: kills a child process of this test (a no-op error if it has ended).
            unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
        }
    }
}

/// Runs `f` on a thread; past [`HANG`] the processes `kill` are killed (a stopped holder's lock
/// is recovered, so the thread ends) and the test fails naming `what` as having hung.
/// How long it took is printed (for the docs' figures), never judged.
fn within<T: Send>(what: &str, kill: &[u32], f: impl FnOnce() -> T + Send) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    let started = std::time::Instant::now();
    std::thread::scope(|scope| {
        scope.spawn(move || {
            let _ = tx.send(f());
        });
        match rx.recv_timeout(HANG) {
            Ok(done) => {
                println!("{what}: {:?}", started.elapsed());
                done
            }
            Err(_) => {
                for &pid in kill {
                    // SAFETY: kills a child process of this test.
                    unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
                }
                panic!("{what} waited for the participant stopped holding the lock");
            }
        }
    })
}

/// A participant stopped (SIGSTOP, a debugger) while it holds the shared index's lock: a new
/// process's attach is refused, naming the cause, instead of waiting for the whole stop; OFF
/// detaches without waiting for it, leaving the file to the others; a process's exit closes
/// without waiting for it. Once the holder runs again, attaching works and every page read is
/// right. Before, the three waited as long as the stop lasted (the exit 10 s, for its writer).
#[test]
fn a_participant_stopped_holding_the_lock_stalls_no_attach_off_or_exit() {
    use std::io::{BufRead, Write};
    record_logs();
    let dir = tempdir();
    let data = make_file(dir.path(), "data", 64, PAGE);
    settle();
    let ext = dir.path().join("ext.bpe");
    let a = shared_engine();
    a.enable_extension(&ext, EXT).unwrap();
    let fa = a.open_file(&data, PAGE).unwrap();
    for p in 0..64 {
        assert_eq!(decode(&read(&a, &fa, p).0), Some((p, 0)));
    }
    assert!(a.wait_for_extension_writes(WAIT));

    // Its own data file: pages A has not put in the ring, which its writer writes itself.
    let own = make_file(dir.path(), "own", 64, PAGE);
    settle();
    let mut exiting = child("exit", &ext, &own);
    let mut said = std::io::BufReader::new(exiting.stdout.take().unwrap()).lines();
    let attached = within("the exiting child's attach", &[exiting.id()], || {
        said.find(|l| l.as_ref().is_ok_and(|l| l.ends_with("ATTACHED")))
    });
    assert!(attached.is_some(), "the exiting child did not attach");

    let mut holder = child("hold", &ext, &data);
    let pid = holder.id();
    let stopped = within("the holder's attach", &[pid, exiting.id()], || {
        let mut status = 0;
        // SAFETY: waits for this test's child to stop (or end), without reaping a stop.
        unsafe { libc::waitpid(pid as libc::pid_t, &mut status, libc::WUNTRACED) };
        status
    });
    assert!(
        libc::WIFSTOPPED(stopped),
        "the holder did not stop: {stopped:#x}"
    );
    let all = [pid, exiting.id()];
    let _reaper = Reaper(all.to_vec());

    // A new participant: refused, with the reason, and no extension half enabled.
    let b = shared_engine();
    let refused = within("attaching", &all, || b.enable_extension(&ext, EXT));
    let err = refused
        .expect_err("attached beside a participant stopped holding the lock")
        .to_string();
    assert!(err.contains("held its shared index's lock"), "{err}");
    assert_eq!(b.extension_sharing(), None);

    // OFF: its writer stopped, and detached; the file stays for the others.
    within("OFF", &all, || a.disable_extension()).unwrap();
    assert_eq!(a.extension_sharing(), None);
    let logged = LOGGED.lock().unwrap().clone();
    assert!(
        !logged.iter().any(|l| l.contains(WRITER_STUCK)),
        "OFF: {logged:?}"
    );
    assert!(ext.exists(), "OFF removed the file others share");
    assert_eq!(decode(&read(&a, &fa, 7).0), Some((7, 0)));

    // A process's exit: its writer stops, it closes and ends by itself.
    writeln!(exiting.stdin.as_mut().unwrap(), "exit").unwrap();
    let (lines, status) = within("exit", &all, || {
        let lines: Vec<String> = said.by_ref().map_while(Result::ok).collect();
        (lines, exiting.wait().unwrap())
    });
    assert!(
        status.success() && lines.iter().any(|l| l.ends_with("CLOSED")),
        "the exit failed: {status:?} {lines:?}"
    );
    assert!(
        !lines.iter().any(|l| l.contains(WRITER_STUCK)),
        "exit: {lines:?}"
    );

    // The holder runs again, lets go and ends; then attaching works and reads are right.
    // SAFETY: continues this test's stopped child.
    unsafe { libc::kill(pid as libc::pid_t, libc::SIGCONT) };
    drop(holder.stdin.take());
    let ended = within("the holder's end", &[pid], || holder.wait().unwrap());
    assert!(ended.success(), "the holder failed: {ended:?}");
    within("attaching after the stop", &[], || {
        b.enable_extension(&ext, EXT)
    })
    .unwrap();
    assert_eq!(b.extension_sharing(), Some(Sharing::Shared));
    let fb = b.open_file(&data, PAGE).unwrap();
    for p in 0..64 {
        assert_eq!(decode(&read(&b, &fb, p).0), Some((p, 0)), "page {p}");
    }
    b.check_invariants();
}
