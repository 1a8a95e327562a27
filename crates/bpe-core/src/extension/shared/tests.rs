//! The protocol's steps, with participants as separate open descriptions of one extension file
//! in one process (OFD locks conflict between descriptions as between processes). The crash
//! tests with real processes are in tests/shared_extension.rs.

use super::*;
use crate::io::FileStamp;

const REGION: u64 = crate::config::EXTENSION_BATCH_BYTES as u64;

pub(super) struct Setup {
    _dir: tempfile::TempDir,
    pub(super) path: PathBuf,
}

pub(super) fn setup() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ext.bpe");
    std::fs::write(&path, b"").unwrap();
    Setup { _dir: dir, path }
}

pub(super) fn geometry() -> Geometry {
    Geometry::new(4, REGION)
}

pub(super) fn stamp(ino: u64, mtime_ns: i64, racy: bool) -> KnownStamp {
    KnownStamp {
        stamp: FileStamp {
            identity: FileIdentity { dev: 1, ino },
            size: 8192,
            mtime_ns,
            ctime_ns: mtime_ns,
        },
        racy,
    }
}

fn admit(index: &SharedIndex, claim: Claim, file: SharedFile, page: u64, epoch: u64) -> usize {
    let a = Admission {
        file,
        page,
        offset: page as usize * 4096,
        len: 4096,
        crc: page as u32,
        epoch,
    };
    index.publish(claim, &[a]).unwrap_or(0)
}

impl Drop for Setup {
    fn drop(&mut self) {
        if let Ok(m) = std::fs::metadata(&self.path) {
            if let Ok(p) = memory_path(FileIdentity {
                dev: m.dev(),
                ino: m.ino(),
            }) {
                let _ = std::fs::remove_file(p);
            }
        }
    }
}

#[test]
fn a_page_one_process_admitted_is_found_by_another() {
    let s = setup();
    let a = SharedIndex::attach(&s.path, geometry()).unwrap();
    let b = SharedIndex::attach(&s.path, geometry()).unwrap();
    assert_ne!(a.slot(), b.slot());
    assert_eq!(a.others_attached(), 1);
    let fa = a.bind(stamp(7, 100, false)).unwrap();
    let fb = b.bind(stamp(7, 100, false)).unwrap();
    assert_eq!(fa, fb, "the vouched stamp keeps the key");
    let claim = a.claim_region().unwrap();
    assert_eq!(admit(&a, claim, fa, 3, a.epoch_of(fa, 3)), 1);
    match b.lookup(fb, 3) {
        Found::Hit(hit) => {
            assert!(!hit.mine, "b did not load it");
            assert_eq!(hit.location.offset, claim.region as u64 * REGION + 3 * 4096);
            assert_eq!(hit.location.crc, 3);
        }
        other => panic!("expected a hit, got {other:?}"),
    }
    assert!(matches!(a.lookup(fa, 3), Found::Hit(h) if h.mine));
    assert_eq!(b.stats().pages, 1);
    a.check().unwrap();
}

#[test]
fn a_stamp_nobody_vouched_for_forgets_the_file_for_everyone() {
    let s = setup();
    let a = SharedIndex::attach(&s.path, geometry()).unwrap();
    let b = SharedIndex::attach(&s.path, geometry()).unwrap();
    let fa = a.bind(stamp(7, 100, false)).unwrap();
    let claim = a.claim_region().unwrap();
    admit(&a, claim, fa, 1, a.epoch_of(fa, 1));
    // b opens the file after a change no participant made: the stamp differs.
    let fb = b.bind(stamp(7, 200, false)).unwrap();
    assert_ne!(fb.key, fa.key);
    assert_eq!(b.lookup(fb, 1), Found::Miss);
    // a's name is stale: it follows (its own change detection vouches for its reads).
    assert_eq!(a.lookup(fa, 1), Found::Moved);
    assert_eq!(a.follow(fa, FileIdentity { dev: 1, ino: 7 }), Some(fb));
    // An admission under the old name is refused.
    assert_eq!(admit(&a, claim, fa, 2, a.epoch_of(fa, 2)), 0);
    // A racy stamp never vouches: the next binder cannot keep the key.
    let c = SharedIndex::attach(&s.path, geometry()).unwrap();
    c.vouch(fb, stamp(7, 300, true));
    assert_ne!(c.bind(stamp(7, 300, false)).unwrap().key, fb.key);
}

#[test]
fn a_write_voids_an_admission_read_before_it_and_removes_one_made_after() {
    let s = setup();
    let a = SharedIndex::attach(&s.path, geometry()).unwrap();
    let b = SharedIndex::attach(&s.path, geometry()).unwrap();
    let f = a.bind(stamp(9, 100, false)).unwrap();
    let claim = a.claim_region().unwrap();
    let before = a.epoch_of(f, 5);
    let id = FileIdentity { dev: 1, ino: 9 };
    b.invalidate(f, 5, id); // b writes page 5 while a's copy waits for its writer
    assert_eq!(admit(&a, claim, f, 5, before), 0, "read before the write");
    assert_eq!(admit(&a, claim, f, 5, a.epoch_of(f, 5)), 1, "read after it");
    b.invalidate(f, 5, id);
    assert_eq!(a.lookup(f, 5), Found::Miss, "a later write removes it");
    // Other pages are untouched (unless they share a stripe: then conservatively refused).
    assert_eq!(admit(&a, claim, f, 6, a.epoch_of(f, 6)), 1);
    b.forget_file(f, id).unwrap();
    assert_eq!(a.lookup(f, 6), Found::Moved);
}

#[test]
fn claims_pass_over_a_live_writer_and_take_a_dead_ones_region() {
    let s = setup();
    let a = SharedIndex::attach(&s.path, geometry()).unwrap();
    let b = SharedIndex::attach(&s.path, geometry()).unwrap();
    let f = a.bind(stamp(9, 100, false)).unwrap();
    let ca = a.claim_region().unwrap();
    admit(&a, ca, f, 1, a.epoch_of(f, 1));
    let cb = b.claim_region().unwrap();
    assert_ne!(ca.region, cb.region);
    // b goes round the ring: it never takes a's region while a lives.
    for _ in 0..6 {
        let c = b.claim_region().unwrap();
        assert_ne!(c.region, ca.region);
        b.seal(c);
    }
    // a dies (its description closes: the kernel drops its lock) with its region filling.
    drop(a);
    let taken = (0..4).find_map(|_| {
        let c = b.claim_region().unwrap();
        (c.region == ca.region).then_some(c)
    });
    assert_eq!(
        taken.map(|c| c.evicted),
        Some(1),
        "a's region is reused, its page forgotten"
    );
    b.check().unwrap();
}

#[test]
fn a_voided_claim_publishes_nothing() {
    let s = setup();
    let a = SharedIndex::attach(&s.path, geometry()).unwrap();
    let f = a.bind(stamp(9, 100, false)).unwrap();
    let c = a.claim_region().unwrap();
    a.lock().unwrap().tables.clear_index(); // what a recovery does
    assert_eq!(admit(&a, c, f, 1, a.epoch_of(f, 1)), 0);
}

#[test]
fn the_last_to_detach_removes_everything_and_only_it() {
    let s = setup();
    let a = SharedIndex::attach(&s.path, geometry()).unwrap();
    let b = SharedIndex::attach(&s.path, geometry()).unwrap();
    let shm = a.mem.path().to_path_buf();
    let mut removed = false;
    assert!(!a.detach(false, || removed = true));
    assert!(!removed && shm.exists());
    assert!(b.detach(false, || removed = true));
    assert!(removed && !shm.exists());
}

#[test]
fn a_clean_exit_leaves_the_index_for_the_next_process() {
    let s = setup();
    let a = SharedIndex::attach(&s.path, geometry()).unwrap();
    let f = a.bind(stamp(7, 100, false)).unwrap();
    let c = a.claim_region().unwrap();
    admit(&a, c, f, 4, a.epoch_of(f, 4));
    assert!(a.detach(true, || panic!("kept: nothing is deleted")));
    assert_eq!(
        a.lookup(f, 4),
        Found::Miss,
        "a detached process is served nothing"
    );
    drop(a);
    let b = SharedIndex::attach(&s.path, geometry()).unwrap();
    let fb = b.bind(stamp(7, 100, false)).unwrap();
    assert!(
        matches!(b.lookup(fb, 4), Found::Hit(_)),
        "the file is unchanged: warm"
    );
    let changed = b.bind(stamp(7, 101, false)).unwrap();
    assert_eq!(
        b.lookup(changed, 4),
        Found::Miss,
        "changed while nobody watched: cold"
    );
}

#[test]
fn another_geometry_is_refused_while_others_are_attached() {
    let s = setup();
    let a = SharedIndex::attach(&s.path, geometry()).unwrap();
    let err = SharedIndex::attach(&s.path, Geometry::new(8, REGION))
        .err()
        .expect("refused");
    assert!(err.to_string().contains("another extension size"), "{err}");
    assert_eq!(
        a.others_attached(),
        0,
        "the refused process left no slot behind"
    );
    // Alone, a segment left with another geometry is laid out afresh.
    drop(a);
    let b = SharedIndex::attach(&s.path, Geometry::new(8, REGION)).unwrap();
    assert_eq!(b.stats().pages, 0);
}

#[test]
fn a_process_that_dies_holding_the_lock_costs_the_index_not_the_others() {
    let s = setup();
    let a = SharedIndex::attach(&s.path, geometry()).unwrap();
    let f = a.bind(stamp(9, 100, false)).unwrap();
    let c = a.claim_region().unwrap();
    admit(&a, c, f, 1, a.epoch_of(f, 1));
    // SAFETY: the child only takes the lock and exits at once (no allocation, no other lock).
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        let g = a.lock();
        std::mem::forget(g);
        // SAFETY: ends the child without running the parent's destructors.
        unsafe { libc::_exit(0) };
    }
    let mut status = 0;
    // SAFETY: waits for the child just forked.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    assert_eq!(a.stats().recoveries, 1);
    assert_eq!(a.stats().pages, 0, "the index was emptied");
    // Every name from before is void (a slot may have been half bound): bound afresh.
    assert_eq!(a.lookup(f, 1), Found::Moved);
    assert_eq!(a.follow(f, FileIdentity { dev: 1, ino: 9 }), None);
    assert_eq!(
        admit(&a, a.claim_region().unwrap(), f, 1, a.epoch_of(f, 1)),
        0
    );
    a.check().unwrap();
    let f = a.bind(stamp(9, 100, false)).unwrap();
    let c = a.claim_region().unwrap();
    assert_eq!(admit(&a, c, f, 1, a.epoch_of(f, 1)), 1, "and works on");
}

/// A seeded simulation of the protocol: three participants (separate attachments) take random
/// steps in every order SQLite's locks allow, against a model data file. A writer's three steps
/// (invalidate, write, invalidate) may interleave with reads that hold no lock (readahead does
/// that) and with publications of pages staged at any time before; a participant may die (its
/// claim left filling) and another attach. Every lookup made under the shared lock must find the
/// model's current version. An entry's crc stands for its bytes: here, the version read.
#[test]
fn seeded_interleavings_never_serve_a_stale_page() {
    use rand::{rngs::StdRng, Rng, SeedableRng};
    const PAGES: u64 = 12;
    for seed in 0..300u64 {
        let s = setup();
        let mut rng = StdRng::seed_from_u64(seed);
        let mut versions = vec![0u64; PAGES as usize];
        let mut parts: Vec<Sim> = (0..3).map(|_| Sim::attach(&s.path)).collect();
        // (writer, page, next step 0..3)
        let mut writing: Option<(usize, u64, u8)> = None;
        for _ in 0..400 {
            let who = rng.gen_range(0..parts.len());
            let page = rng.gen_range(0..PAGES);
            match rng.gen_range(0..10) {
                0 | 1 => {
                    // A step of the write in progress, or a new write (EXCLUSIVE: no other).
                    let (w, p, step) = writing.unwrap_or((who, page, 0));
                    let part = &parts[w];
                    match step {
                        0 | 2 => {
                            part.index
                                .invalidate(part.file, p, FileIdentity { dev: 1, ino: 5 })
                        }
                        _ => versions[p as usize] += 1,
                    }
                    writing = (step < 2).then_some((w, p, step + 1));
                }
                2..=4 if writing.is_none() => {
                    // A read under SHARED: a hit must be current; a miss stages the page.
                    let part = &mut parts[who];
                    match part.index.lookup(part.file, page) {
                        Found::Hit(hit) => assert_eq!(
                            hit.location.crc as u64, versions[page as usize],
                            "seed {seed}: page {page} served stale"
                        ),
                        Found::Moved => unreachable!("nobody forgets the file here"),
                        Found::Miss => {
                            let epoch = part.index.epoch_of(part.file, page);
                            part.staged.push((page, epoch, versions[page as usize]));
                        }
                    }
                }
                5 => {
                    // Readahead: a read that holds no lock, so it may overlap a write.
                    let part = &mut parts[who];
                    let epoch = part.index.epoch_of(part.file, page);
                    part.staged.push((page, epoch, versions[page as usize]));
                }
                6 | 7 => parts[who].publish(),
                8 if rng.gen_bool(0.1) => {
                    // Dies (its claim left filling) and another process attaches. A writer
                    // dying mid-write leaves the bytes it wrote; nothing more is invalidated.
                    if writing.is_some_and(|(w, _, _)| w == who) {
                        writing = None;
                    }
                    parts[who] = Sim::attach(&s.path);
                }
                _ => {}
            }
        }
        parts[0].index.check().unwrap();
    }
}

struct Sim {
    index: SharedIndex,
    file: SharedFile,
    /// (page, epoch before the read, version read)
    staged: Vec<(u64, u64, u64)>,
    claim: Option<Claim>,
    fill: usize,
}

impl Sim {
    fn attach(path: &Path) -> Sim {
        let index = SharedIndex::attach(path, geometry()).unwrap();
        let file = index.bind(stamp(5, 100, false)).unwrap();
        Sim {
            index,
            file,
            staged: Vec::new(),
            claim: None,
            fill: 0,
        }
    }

    /// The writer thread's step: what is staged goes into the claimed region and is published.
    fn publish(&mut self) {
        if self.claim.is_none() || self.fill + self.staged.len() * 4096 > REGION as usize {
            if let Some(c) = self.claim.take() {
                self.index.seal(c);
            }
            self.claim = self.index.claim_region();
            self.fill = 0;
        }
        let Some(claim) = self.claim else {
            return self.staged.clear();
        };
        let pages: Vec<Admission> = self
            .staged
            .drain(..)
            .map(|(page, epoch, version)| {
                self.fill += 4096;
                Admission {
                    file: self.file,
                    page,
                    offset: self.fill - 4096,
                    len: 4096,
                    crc: version as u32,
                    epoch,
                }
            })
            .collect();
        self.index.publish(claim, &pages);
    }
}

#[test]
fn a_slot_given_to_another_file_is_never_followed_into_or_invalidated_through() {
    let s = setup();
    let a = SharedIndex::attach(&s.path, geometry()).unwrap();
    let x = FileIdentity { dev: 1, ino: 1 };
    let fx = a.bind(stamp(1, 100, false)).unwrap();
    // 1024 other files: x's slot (the oldest key) goes to one of them.
    let mut last = fx;
    for ino in 2..=layout::MAX_FILES as u64 + 1 {
        last = a.bind(stamp(ino, 100, false)).unwrap();
    }
    assert_eq!(last.slot, fx.slot, "the oldest binding's slot was reused");
    assert_eq!(a.lookup(fx, 0), Found::Moved);
    assert_eq!(
        a.follow(fx, x),
        None,
        "x's old name leads to another file: bind again"
    );
    // x bound again gets a slot of its own; an invalidation under the stale name finds it.
    let fx2 = a.bind(stamp(1, 100, false)).unwrap();
    let c = a.claim_region().unwrap();
    admit(&a, c, fx2, 3, a.epoch_of(fx2, 3));
    let y = last;
    admit(&a, c, y, 4, a.epoch_of(y, 4));
    a.invalidate(fx, 3, x);
    assert_eq!(a.lookup(fx2, 3), Found::Miss, "x's page 3 is gone");
    assert!(
        matches!(a.lookup(y, 4), Found::Hit(_)),
        "the other file is untouched"
    );
}

/// Runs `change` in a forked child that dies, as a SIGKILLed process would, right after store
/// `at` of the changes it makes under the lock (see `stored`): the lock is left held by a dead
/// process, the change half made. Returns once the child is gone: whether it died so (false:
/// the change made fewer stores, and the child finished it and exited).
pub(super) fn die_after_store(at: u32, change: impl FnOnce()) -> bool {
    // SAFETY: the child only makes the change (locked stores, no allocation) and exits.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        STORES.store(0, Ordering::Relaxed);
        CRASH_AT.store(at, Ordering::Relaxed);
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(change));
        // SAFETY: ends the child without running the parent's destructors.
        unsafe { libc::_exit(1) }; // store `at` was never reached
    }
    let mut status = 0;
    // SAFETY: waits for the child just forked.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    assert!(
        libc::WIFEXITED(status),
        "the child did not exit: {status:#x}"
    );
    libc::WEXITSTATUS(status) == 0
}

/// Forks a child that takes `index`'s lock as its participant and stops (SIGSTOP, as a
/// debugger or a paused container would stop it); returns its pid once it has stopped.
pub(super) fn stop_holding_the_lock(index: &SharedIndex) -> libc::pid_t {
    // SAFETY: the child takes the lock, stops, and once continued unlocks and exits.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        let g = index.lock();
        // SAFETY: stops this (the child) process until SIGCONT.
        unsafe { libc::raise(libc::SIGSTOP) };
        drop(g);
        // SAFETY: ends the child without running the parent's destructors.
        unsafe { libc::_exit(0) };
    }
    let mut status = 0;
    // SAFETY: waits for the child just forked to stop.
    unsafe { libc::waitpid(pid, &mut status, libc::WUNTRACED) };
    assert!(libc::WIFSTOPPED(status), "the holder did not stop");
    pid
}

/// Runs `f` on a thread while the child `pid` holds the lock stopped; `f` must be done within
/// 10 s, else the child is killed (its lock recovered, so that the thread ends) and the test
/// fails naming `what` as having waited for it.
pub(super) fn beside_stopped_holder<T: Send>(
    pid: libc::pid_t,
    what: &str,
    f: impl FnOnce() -> T + Send,
) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::scope(|scope| {
        scope.spawn(move || tx.send(f()).unwrap());
        match rx.recv_timeout(std::time::Duration::from_secs(10)) {
            Ok(done) => done,
            Err(_) => {
                // SAFETY: kills the stopped child: its lock is recovered, and the thread ends.
                unsafe { libc::kill(pid, libc::SIGKILL) };
                panic!("{what} waited for the stopped holder");
            }
        }
    })
}

/// Continues a child `stop_holding_the_lock` stopped: it unlocks and exits.
pub(super) fn resume(pid: libc::pid_t) {
    // SAFETY: continues the child, then waits for it to exit.
    unsafe { libc::kill(pid, libc::SIGCONT) };
    let mut status = 0;
    // SAFETY: waits for the child to exit.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    assert!(
        libc::WIFEXITED(status),
        "the holder did not exit: {status:#x}"
    );
}

/// A process that has been watching one data file, as `Attached` does: it reads under its
/// binding, follows a key another process moved on, and binds again from the file's stamp
/// when its slot no longer holds the file.
struct Watcher {
    index: SharedIndex,
    stamp: KnownStamp,
    name: Option<SharedFile>,
}

impl Watcher {
    fn new(path: &Path, stamp: KnownStamp) -> Watcher {
        let index = SharedIndex::attach(path, geometry()).unwrap();
        let name = index.bind(stamp);
        Watcher { index, stamp, name }
    }

    fn name(&mut self) -> SharedFile {
        *self
            .name
            .get_or_insert_with(|| self.index.bind(self.stamp).unwrap())
    }

    /// The crc (the version) of the page served, if one is.
    fn lookup(&mut self, page: u64) -> Option<u32> {
        let name = self.name();
        let found = match self.index.lookup(name, page) {
            Found::Moved => match self.index.follow(name, self.stamp.stamp.identity) {
                Some(moved) => {
                    self.name = Some(moved);
                    self.index.lookup(moved, page)
                }
                None => {
                    self.name = None;
                    Found::Miss
                }
            },
            found => found,
        };
        match found {
            Found::Hit(hit) => Some(hit.location.crc),
            _ => None,
        }
    }

    /// Reads the page (at `version`) from the data file and admits it.
    fn read_and_admit(&mut self, page: u64, version: u32) {
        let name = self.name();
        let epoch = self.index.epoch_of(name, page);
        let claim = self.index.claim_region().unwrap();
        let a = Admission {
            file: name,
            page,
            offset: 0,
            len: 4096,
            crc: version,
            epoch,
        };
        self.index.publish(claim, &[a]);
        self.index.seal(claim);
    }

    /// Writes the page: invalidated before and after, as every write is.
    fn write(&mut self, page: u64) {
        let name = self.name();
        let id = self.stamp.stamp.identity;
        self.index.invalidate(name, page, id);
        self.index.invalidate(name, page, id);
    }
}

/// A process that dies between the stores that give the oldest file's slot to
/// another file (once every slot is taken) leaves the slot half bound: the new file's identity
/// with the old file's key. The recovery empties the index; if it kept that slot, the old file's
/// watchers would admit its pages again under the key, its writers would find nothing of it to
/// invalidate (they look the file up by identity), and its old bytes would be served.
#[test]
fn a_death_halfway_through_binding_a_slot_never_serves_a_stale_page() {
    let f = stamp(1, 100, false);
    for at in 1..=8 {
        let s = setup();
        let mut reader = Watcher::new(&s.path, f);
        let mut writer = Watcher::new(&s.path, f);
        assert_eq!(reader.name, writer.name, "one key for f");
        for ino in 2..=layout::MAX_FILES as u64 {
            writer.index.bind(stamp(ino, 100, false)).unwrap();
        }
        // A third process opens file 5000: f's slot (the oldest key) goes to it, and it dies.
        let died = die_after_store(at, || {
            writer.index.bind(stamp(5000, 100, false));
        });
        assert!(died, "the child did not die after store {at}");
        // The reader misses (the index was emptied) and admits page 3 again; the writer writes it.
        assert_eq!(reader.lookup(3), None, "store {at}: the index was emptied");
        reader.read_and_admit(3, 0);
        writer.write(3);
        assert_eq!(
            reader.lookup(3),
            None,
            "store {at}: page 3 was written after its admission: served stale"
        );
        assert_eq!(writer.index.stats().recoveries, 1);
        writer.index.check().unwrap();
    }
}

/// A segment is named after its extension file's (dev, ino). Left behind (a clean
/// exit keeps it, and the file may then be removed by hand), it would be adopted by a new file
/// given the same inode number: an index of another file's ring, whose entries point at bytes
/// this file never had. The new file's number is made the old one's here by moving the
/// segment to the new file's name (ext4 and others do reuse a freed inode's number).
#[test]
fn a_segment_left_by_a_removed_file_is_not_adopted_by_one_with_its_inode_number() {
    let s = setup();
    let identity = |path: &Path| {
        let m = std::fs::metadata(path).unwrap();
        FileIdentity {
            dev: m.dev(),
            ino: m.ino(),
        }
    };
    let a = SharedIndex::attach(&s.path, geometry()).unwrap();
    let f = a.bind(stamp(7, 100, false)).unwrap();
    let c = a.claim_region().unwrap();
    admit(&a, c, f, 4, a.epoch_of(f, 4));
    assert!(a.detach(true, || panic!("kept: nothing is deleted")));
    drop(a);
    let old = memory_path(identity(&s.path)).unwrap();
    // Held in use, as a participant holds it: until the rename, the segment's file is gone or
    // another inode, and another test's attach would sweep it (remove_orphaned_memory).
    let in_use = crate::io::shared_memory::open_in_use(&old).unwrap();
    std::fs::remove_file(&s.path).unwrap();
    std::fs::write(&s.path, b"").unwrap();
    let new = memory_path(identity(&s.path)).unwrap();
    std::fs::rename(&old, &new).unwrap();
    drop(in_use);
    let b = SharedIndex::attach(&s.path, geometry()).unwrap();
    let fb = b.bind(stamp(7, 100, false)).unwrap();
    assert_eq!(b.stats().pages, 0, "another file's index is not adopted");
    assert_eq!(b.lookup(fb, 4), Found::Miss);
    // This file's own segment, left by a clean exit, still is (warm).
    let c = b.claim_region().unwrap();
    admit(&b, c, fb, 5, b.epoch_of(fb, 5));
    assert!(b.detach(true, || panic!("kept")));
    drop(b);
    let b = SharedIndex::attach(&s.path, geometry()).unwrap();
    let fb = b.bind(stamp(7, 100, false)).unwrap();
    assert!(matches!(b.lookup(fb, 5), Found::Hit(_)), "its own: warm");
}

/// A process binds a data file as it first reads it (its stamp vouched for: the
/// key other processes cached pages under is kept). If the file is truncated, and the engine
/// forgets its pages, between that binding and its record, the forget finds nothing bound and
/// is lost: the binding recorded after it still names the pages it was to forget.
#[test]
fn a_forget_while_a_file_is_being_bound_is_not_lost() {
    use crate::config::Config;
    use crate::files::{FileRegistry, OpenRequest, RACY_WINDOW};
    let s = setup();
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("data.db");
    std::fs::write(&db, vec![1u8; 4 * 4096]).unwrap();
    std::thread::sleep(2 * RACY_WINDOW); // its stamp can vouch
    let (file, _) = FileRegistry::default()
        .open(
            &OpenRequest {
                path: &db,
                open_from: &db,
                expect: None,
                page_size: &|| 4096,
            },
            &Config::default(),
        )
        .unwrap();
    let stamp = KnownStamp::taken_now(file.stamp_now().unwrap());
    assert!(!stamp.racy);
    // Another process has page 1 cached.
    let other = SharedIndex::attach(&s.path, geometry()).unwrap();
    let shared = other.bind(stamp).unwrap();
    let c = other.claim_region().unwrap();
    assert_eq!(admit(&other, c, shared, 1, other.epoch_of(shared, 1)), 1);
    let me = Attached::new(SharedIndex::attach(&s.path, geometry()).unwrap());
    let key = PageKey::new(file.key(), 1);
    let truncated = file.clone();
    *me.between_bind_and_record.lock().unwrap() = Some(Box::new(move |me: &Attached| {
        truncated.data().unwrap().truncate(4096).unwrap();
        me.forget(Some(key.file));
    }));
    me.read_under(&file, key).unwrap();
    assert!(me.between_bind_and_record.lock().unwrap().is_none());
    assert_eq!(me.locate(key), None, "page 1 was forgotten");
}

/// A recovery voids every claim. An engine's writer that claimed a region before
/// it must not write into the region again: another process may have claimed it since and
/// filled it, and those bytes are what its entries point at. (Before the fix, the writer found
/// out only at `publish`, after it had written.)
#[test]
fn a_writer_whose_claim_a_recovery_voided_never_writes_into_the_region_again() {
    use crate::extension::{checkpoint::regions_for, effective_size, REGION_BYTES};
    use std::os::unix::fs::FileExt;
    const SIZE: u64 = 16 << 20;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let page = |p: u64| -> Vec<u8> { (0..4096u64).map(|i| (p * 131 + i * 7) as u8).collect() };
    std::fs::write(&data, (0..4096).flat_map(page).collect::<Vec<u8>>()).unwrap();
    let ext = dir.path().join("ext.bpe");
    let a = crate::Engine::new(crate::Config {
        max_memory: 4 << 20,
        shared_extension: true,
        ..crate::Config::default()
    });
    a.enable_extension(&ext, SIZE).unwrap();
    let f = a.open_file(&data, 4096).unwrap();
    let mut buf = vec![0u8; 4096];
    // Out of order (no readahead): pages 0..8 are admitted, written into the region the writer
    // claims (the ring's first), which it goes on filling.
    for p in [5u64, 0, 7, 2, 4, 1, 6, 3].map(|i| i * 397 % 4096) {
        a.read_page(&f, p, &mut buf).unwrap();
    }
    assert!(a.wait_for_extension_writes(std::time::Duration::from_secs(10)));
    let geometry = Geometry::new(regions_for(effective_size(SIZE)), REGION_BYTES);

    // A third participant dies holding the lock: the next locker recovers, voiding every claim.
    let x = SharedIndex::attach(&ext, geometry).unwrap();
    assert!(die_after_store(1, || {
        x.bind(stamp(77, 100, false));
    }));
    // Another participant then claims round the ring to the first region and fills it.
    let b = SharedIndex::attach(&ext, geometry).unwrap();
    let claim = loop {
        let c = b.claim_region().expect("a region to claim");
        if c.region == 0 {
            break c;
        }
        b.seal(c);
    };
    assert_eq!(b.stats().recoveries, 1);
    let marker = vec![0xA5u8; REGION_BYTES as usize];
    let file = std::fs::OpenOptions::new()
        .write(true)
        .read(true)
        .open(&ext)
        .unwrap();
    file.write_all_at(&marker, 0).unwrap();
    file.sync_all().unwrap();

    // The engine's writer gets more pages.
    for p in [13u64, 8, 15, 10, 12, 9, 14, 11].map(|i| i * 397 % 4096) {
        a.read_page(&f, p, &mut buf).unwrap();
    }
    assert!(a.wait_for_extension_writes(std::time::Duration::from_secs(10)));
    let mut region = vec![0u8; REGION_BYTES as usize];
    file.read_exact_at(&mut region, 0).unwrap();
    let overwritten = region.iter().zip(&marker).filter(|(x, y)| x != y).count();
    assert_eq!(
        overwritten, 0,
        "{overwritten} bytes of the region another participant holds were overwritten"
    );
    b.seal(claim);
}

/// A participant stopped while it holds the lock (SIGSTOP, a debugger, a paused
/// container) costs the others a bounded wait, never a stall: their lookups miss, a write's
/// invalidation goes ahead (its removal waits for the writer's next lock, the copy hidden
/// meanwhile), and nothing stale is served when the holder resumes.
#[test]
fn a_stopped_lock_holder_costs_a_bounded_wait_and_never_a_stale_page() {
    let s = setup();
    let a = SharedIndex::attach(&s.path, geometry()).unwrap();
    let b = SharedIndex::attach(&s.path, geometry()).unwrap();
    let c = SharedIndex::attach(&s.path, geometry()).unwrap();
    let id = FileIdentity { dev: 1, ino: 9 };
    let f = a.bind(stamp(9, 100, false)).unwrap();
    let claim = a.claim_region().unwrap();
    assert_eq!(admit(&a, claim, f, 1, a.epoch(id, 1)), 1);

    let pid = stop_holding_the_lock(&c);

    // Without the bound each call waits for the holder forever.
    let (lookup, hidden, binding, timeouts) =
        beside_stopped_holder(pid, "a lookup or an invalidation", || {
            let lookup = b.lookup(f, 1);
            b.invalidate(f, 1, id); // b writes page 1 while c holds the lock
            let hidden = a.lookup(f, 1);
            let binding = b.bind(stamp(9, 100, false));
            (lookup, hidden, binding, b.stats().lock_timeouts)
        });
    assert_eq!(
        lookup,
        Found::Miss,
        "a lookup misses while the holder is stopped"
    );
    assert_eq!(hidden, Found::Miss);
    assert_eq!(binding, None);
    assert!(timeouts >= 1, "the timeouts are counted");

    resume(pid);
    // b's removal has not run yet (b has not locked since): the copy is still indexed, but
    // page 1 was written after it, so no lookup may find it.
    assert_eq!(
        a.lookup(f, 1),
        Found::Miss,
        "page 1 served from before its write"
    );
    // b's next lock removes it; page 1 can then be admitted again, under its new epoch.
    assert_eq!(b.lookup(f, 2), Found::Miss);
    a.check().unwrap();
    assert_eq!(admit(&a, claim, f, 1, a.epoch(id, 1)), 1);
    assert!(matches!(a.lookup(f, 1), Found::Hit(_)));
    assert_eq!(
        a.stats().recoveries,
        0,
        "a stopped holder is not a dead one"
    );
}

/// DBCC DROPCLEANBUFFERS beside a stopped lock holder returns within its bound instead of
/// waiting for the holder, and the emptying is not lost: the process's next lock, once the
/// holder lets go, empties the index before anything is looked up under it.
#[test]
fn emptying_beside_a_stopped_lock_holder_returns_and_empties_when_it_lets_go() {
    let s = setup();
    let a = SharedIndex::attach(&s.path, geometry()).unwrap();
    let c = SharedIndex::attach(&s.path, geometry()).unwrap();
    let id = FileIdentity { dev: 1, ino: 9 };
    let f = a.bind(stamp(9, 100, false)).unwrap();
    let claim = a.claim_region().unwrap();
    assert_eq!(admit(&a, claim, f, 1, a.epoch(id, 1)), 1);

    let pid = stop_holding_the_lock(&c);
    let emptied = beside_stopped_holder(pid, "emptying", || a.empty());
    assert!(!emptied, "said emptied while another process held the lock");
    resume(pid);
    // Every name is voided and the file bound afresh finds nothing.
    assert_eq!(
        a.lookup(f, 1),
        Found::Moved,
        "the old name still finds its file"
    );
    let f = a.bind(stamp(9, 100, false)).unwrap();
    assert_eq!(
        a.lookup(f, 1),
        Found::Miss,
        "the page outlived a DROPCLEANBUFFERS"
    );
    a.check().unwrap();
    assert_eq!(a.stats().recoveries, 0, "an emptying, not a recovery");
    // Emptied once: what is admitted afterwards stays.
    let claim = a.claim_region().unwrap();
    assert_eq!(admit(&a, claim, f, 1, a.epoch(id, 1)), 1);
    assert!(matches!(a.lookup(f, 1), Found::Hit(_)));
    assert!(a.empty(), "nobody holds the lock now");
    assert!(!matches!(a.lookup(f, 1), Found::Hit(_)));
}

/// A thread of a process that has left the shared extension (its engine
/// disabled it, or the process is exiting) may still be writing a page. Its invalidation must
/// not touch the segment, which the next process to attach keeps or lays out anew: a pending
/// count left in a kept segment hides that stripe's pages from every process for good (and in
/// a segment laid out anew the touch is a SIGBUS or a write into another layout's tables).
#[test]
fn a_detached_process_never_touches_the_segment_again() {
    let s = setup();
    let a = SharedIndex::attach(&s.path, geometry()).unwrap();
    let id = FileIdentity { dev: 1, ino: 9 };
    let fa = a.bind(stamp(9, 100, false)).unwrap();
    assert!(a.detach(true, || {}), "a was the only one");

    let b = SharedIndex::attach(&s.path, geometry()).unwrap();
    let f = b.bind(stamp(9, 100, false)).unwrap();
    let claim = b.claim_region().unwrap();
    assert_eq!(admit(&b, claim, f, 1, b.epoch(id, 1)), 1);
    let epoch = b.epoch(id, 1);
    // a's late calls: a write's invalidation, a lookup, an epoch read.
    a.invalidate(fa, 1, id);
    assert_eq!(a.lookup(fa, 1), Found::Miss);
    assert_eq!(a.epoch(id, 1), 0);
    assert_eq!(b.epoch(id, 1), epoch, "a moved b's epoch after leaving");
    assert!(
        matches!(b.lookup(f, 1), Found::Hit(_)),
        "a's late invalidation left a pending count in b's segment"
    );
    b.check().unwrap();
}

/// A segment of another layout version belongs to processes of that version,
/// which may hold no lock on it (older versions took none). The sweep keeps it while any
/// process maps it, and removes it once none does.
#[test]
fn another_versions_segment_is_swept_only_once_no_process_maps_it() {
    let dir = crate::io::shm_dir::own_directory().unwrap();
    let segment = dir.join(format!(
        "extension-4294967295-{}.shared",
        u32::MAX - std::process::id()
    ));
    // Made and held in use (the shared lock every participant holds) until it is mapped: a
    // concurrent test's attach sweeps orphaned segments, and would remove this one between its
    // creation and the mapping (CI failed so once: ENOENT at the open).
    let file = crate::io::shared_memory::open_in_use(&segment).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&file, &[0x5a_u8; 4096], 0).unwrap();
    // SAFETY: a fresh read-only shared mapping of a 4 KiB file this test made; unmapped below.
    let mapped = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            4096,
            libc::PROT_READ,
            libc::MAP_SHARED,
            std::os::fd::AsRawFd::as_raw_fd(&file),
            0,
        )
    };
    assert_ne!(mapped, libc::MAP_FAILED);
    // Other tests of this binary fork children, which would map it too for as long as they live.
    // SAFETY: advice on the mapping just made; it changes no byte.
    unsafe { libc::madvise(mapped, 4096, libc::MADV_DONTFORK) };
    drop(file);
    remove_orphaned_memory();
    let kept = segment.exists();
    // SAFETY: the mapping made above, unmapped once.
    unsafe { libc::munmap(mapped, 4096) };
    assert!(kept, "swept while a process maps it");
    // A child forked before the advice maps it until it exits (a stopped lock holder lives up to
    // 10 s): the segment goes once no process maps it.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while segment.exists() && std::time::Instant::now() < deadline {
        remove_orphaned_memory();
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(!segment.exists(), "kept once no process maps it");
}

/// The stripes grow with the ring (twice its 4 KiB pages, a power of two) between their
/// bounds, and a write voids only its own stripe: pages of the other stripes keep their
/// epochs.
#[test]
fn stripes_scale_with_the_ring_and_a_write_moves_one_epoch() {
    use super::layout::{MAX_STRIPES, MIN_STRIPES};
    let mib = 1 << 20;
    assert_eq!(Geometry::new(4, mib).stripes, MIN_STRIPES);
    // 1,504 MB of 4 KiB pages: 770,048 pages' worth of stripes, rounded up.
    assert_eq!(Geometry::new(1504, mib).stripes, MAX_STRIPES);
    assert_eq!(Geometry::new(128, mib).stripes, 1 << 16);
    assert_eq!(Geometry::new(1 << 14, mib).stripes, MAX_STRIPES);
    for regions in [1, 3, 100, 777, 5000] {
        assert!(Geometry::new(regions, mib).stripes.is_power_of_two());
    }

    let s = setup();
    let index = SharedIndex::attach(&s.path, Geometry::new(128, mib)).unwrap();
    let id = FileIdentity { dev: 1, ino: 7 };
    let before: Vec<u64> = (0..4096).map(|p| index.epoch(id, p)).collect();
    let file = index.bind(stamp(7, 1, false)).unwrap();
    index.invalidate(file, 100, id);
    let moved: Vec<u64> = (0..4096)
        .filter(|&p| index.epoch(id, p) != before[p as usize])
        .collect();
    assert!(moved.contains(&100), "the written page's epoch moved");
    // 4,096 pages over 65,536 stripes: a page shares page 100's stripe by chance only.
    assert!(moved.len() <= 3, "{} pages' epochs moved", moved.len());
}
