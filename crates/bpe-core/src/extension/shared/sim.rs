//! A deterministic simulation of the shared protocol (TigerBeetle's VOPR is the model). tests.rs's `seeded_interleavings_never_serve_a_stale_page` interleaves the steps
//! of one file's readers and writers; this one adds deaths inside the critical sections and
//! many files, and lock holders stopped (SIGSTOP) while the others go on. Participants of one shared index, driven by one seeded generator, read, admit,
//! write, forget and vouch for pages of many files (more than the 1,024 slots, so that slots
//! are taken from files still in use), and die in two ways: a forked child makes one change
//! under the lock as the participant and is killed after a random store of it (the lock left
//! held, the change half made), or a participant leaves without a word (its claim left
//! filling). The oracle is a model of the data files: every hit must be the page's current
//! version, and the tables must be sound after every step (`check`).
//!
//! `BPE_SIM_SEED=n` replays one seed (the failure message names it); `BPE_SIM_SEEDS=n` runs n
//! seeds from the clock; `BPE_SIM_STEPS` sets the steps per seed; `BPE_SIM_TRACE=1` prints
//! every step.
//!
//! It found one bug on its first runs: a forget under a name another process had moved on did
//! nothing, so a change nobody could attribute reached the file's current key only through
//! every other process's own change detection (now `forget_file` finds the file by identity).

use super::tests::{die_after_store, geometry, resume, setup, stamp, stop_holding_the_lock};
use super::*;
use rand::{rngs::StdRng, Rng, SeedableRng};
use std::collections::HashMap;

/// Files most steps touch; the rest are touched rarely, and there are more of them than slots.
const HOT_FILES: u64 = 6;
const FILES: u64 = layout::MAX_FILES as u64 + 200;
const PAGES: u64 = 4;
const PARTICIPANTS: usize = 3;
const PAGES_PER_REGION: usize = crate::config::EXTENSION_BATCH_BYTES / 4096;

/// The data files: each page's version (what a read finds; the crc of an admission is the
/// version it read) and each file's mtime, moved by every write.
#[derive(Default)]
struct Files {
    version: HashMap<(u64, u64), u32>,
    mtime: HashMap<u64, i64>,
}

impl Files {
    fn version(&self, file: u64, page: u64) -> u32 {
        self.version.get(&(file, page)).copied().unwrap_or(0)
    }
    fn mtime(&self, file: u64) -> i64 {
        self.mtime.get(&file).copied().unwrap_or(100)
    }
    fn stamp(&self, file: u64, racy: bool) -> KnownStamp {
        stamp(file + 1, self.mtime(file), racy)
    }
    fn identity(file: u64) -> FileIdentity {
        FileIdentity {
            dev: 1,
            ino: file + 1,
        }
    }
    fn write(&mut self, file: u64, page: u64) {
        *self.version.entry((file, page)).or_default() += 1;
        *self.mtime.entry(file).or_insert(100) += 1;
    }
}

/// A read begun: the name and write epoch taken before it, and the version it found.
struct Pending {
    page: u64,
    name: SharedFile,
    epoch: u64,
    version: u32,
}

/// One process: its attachment, the names it bound, its reads in flight and its claim.
struct Participant {
    index: SharedIndex,
    names: HashMap<u64, SharedFile>,
    /// The mtime its change detection last verified each file at (what it vouches with).
    verified: HashMap<u64, i64>,
    pending: Vec<Pending>,
    claim: Option<Claim>,
    used: usize,
}

impl Participant {
    fn attach(path: &Path) -> Participant {
        Participant {
            index: SharedIndex::attach(path, geometry()).expect("attach"),
            names: HashMap::new(),
            verified: HashMap::new(),
            pending: Vec::new(),
            claim: None,
            used: 0,
        }
    }

    /// The file's name, bound from its stamp now if this process has not been watching it
    /// (None if the lock's holder is stopped).
    fn name(&mut self, files: &Files, file: u64, racy: bool) -> Option<SharedFile> {
        if let Some(n) = self.names.get(&file) {
            return Some(*n);
        }
        let n = self.index.bind(files.stamp(file, racy))?;
        self.names.insert(file, n);
        self.verified.insert(file, files.mtime(file));
        Some(n)
    }

    /// The version a lookup serves, if it hits (a moved key followed, as a watching process
    /// does: its own change detection vouches for its reads).
    fn lookup(&mut self, files: &Files, file: u64, page: u64) -> Option<u32> {
        let name = self.name(files, file, false)?;
        let found = match self.index.lookup(name, page) {
            Found::Moved => match self.index.follow(name, Files::identity(file)) {
                Some(moved) => {
                    self.names.insert(file, moved);
                    self.index.lookup(moved, page)
                }
                None => {
                    self.names.remove(&file);
                    Found::Miss
                }
            },
            found => found,
        };
        self.verified.insert(file, files.mtime(file));
        match found {
            Found::Hit(hit) => Some(hit.location.crc),
            _ => None,
        }
    }

    /// The admission of the oldest read in flight, at the next place of this process's region
    /// (claimed if it has none); None if no region can be claimed.
    fn next_admission(&mut self, which: usize) -> Option<(Claim, Admission)> {
        if self.claim.is_none() {
            self.claim = Some(self.index.claim_region()?);
            self.used = 0;
        }
        let r = self.pending.swap_remove(which);
        let a = Admission {
            file: r.name,
            page: r.page,
            offset: self.used * 4096,
            len: 4096,
            crc: r.version,
            epoch: r.epoch,
        };
        self.used += 1;
        Some((self.claim.expect("claimed"), a))
    }

    fn after_publish(&mut self, published: Option<usize>) {
        if published.is_none() {
            self.claim = None; // voided by a recovery
        } else if self.used == PAGES_PER_REGION {
            if let Some(c) = self.claim.take() {
                self.index.seal(c);
            }
        }
    }
}

struct Sim {
    rng: StdRng,
    seed: u64,
    files: Files,
    path: PathBuf,
    parts: Vec<Participant>,
    hits: u64,
    crashes: u64,
    deaths: u64,
    stalls: u64,
    trace: bool,
}

impl Sim {
    fn file(&mut self) -> u64 {
        if self.rng.gen_bool(0.9) {
            self.rng.gen_range(0..HOT_FILES)
        } else {
            self.rng.gen_range(HOT_FILES..FILES)
        }
    }

    /// One random step. While a holder is stopped (`stalled`), only what a query does: lookups,
    /// reads begun, writes (their removals deferred), all with bounded waits.
    fn step(&mut self, n: usize, stalled: bool) {
        let p = self.rng.gen_range(0..self.parts.len());
        let (file, page) = (self.file(), self.rng.gen_range(0..PAGES));
        let racy = self.rng.gen_bool(0.2);
        let seed = self.seed;
        let mut op = self.rng.gen_range(0..1000);
        if stalled && !(0..=614).contains(&op) && !(815..=914).contains(&op) {
            op = 0;
        }
        if self.trace {
            let name = self.parts[p].names.get(&file);
            let v = self.files.version(file, page);
            eprintln!("step {n}: p{p} op {op} file {file} page {page} (v{v}) racy {racy} {name:?}");
        }
        match op {
            0..=414 => {
                if let Some(v) = self.parts[p].lookup(&self.files, file, page) {
                    let current = self.files.version(file, page);
                    assert_eq!(
                        v, current,
                        "seed {seed}, step {n}: file {file} page {page} served at version {v}, \
                         the file has {current}"
                    );
                    self.hits += 1;
                }
            }
            415..=614 => {
                let part = &mut self.parts[p];
                let Some(name) = part.name(&self.files, file, racy) else {
                    return;
                };
                let epoch = part.index.epoch(Files::identity(file), page);
                part.pending.push(Pending {
                    page,
                    name,
                    epoch,
                    version: self.files.version(file, page),
                });
            }
            615..=814 => {
                let part = &mut self.parts[p];
                if !part.pending.is_empty() {
                    let which = self.rng.gen_range(0..part.pending.len());
                    if let Some((claim, a)) = part.next_admission(which) {
                        let published = part.index.publish(claim, &[a]);
                        part.after_publish(published);
                    }
                }
            }
            815..=914 => self.write(p, file, page, racy, false),
            915..=954 => {
                // Its change detection verified the file at some stamp: it vouches with it.
                let part = &mut self.parts[p];
                if let (Some(&name), Some(&mtime)) =
                    (part.names.get(&file), part.verified.get(&file))
                {
                    part.index.vouch(name, stamp(file + 1, mtime, false));
                }
            }
            955..=974 => self.foreign_change(p, file, false),
            975..=994 => self.crash(p, file, page),
            995..=996 => self.stall(p, n),
            _ => {
                // Leaves without a word (SIGKILL): its lock byte goes with its descriptor.
                self.deaths += 1;
                let path = self.path.clone();
                self.parts[p] = Participant::attach(&path);
            }
        }
        if stalled {
            return; // check() waits for the lock
        }
        let checker = self.rng.gen_range(0..self.parts.len());
        if let Err(e) = self.parts[checker].index.check() {
            panic!("seed {seed}, step {n}: the tables are not sound: {e}");
        }
    }

    /// A forked child takes the lock as participant `p` and stops (SIGSTOP); the others take
    /// a few steps meanwhile; then it continues, unlocks and exits.
    fn stall(&mut self, p: usize, n: usize) {
        let pid = stop_holding_the_lock(&self.parts[p].index);
        self.stalls += 1;
        for _ in 0..self.rng.gen_range(1..30) {
            self.step(n, true);
        }
        resume(pid);
    }

    /// A write through participant `p`: invalidated before and after the bytes go to the file,
    /// then vouched for with the write's own (racy) stamp. With `die`, a forked child makes the
    /// second invalidation and dies after a random store of it.
    fn write(&mut self, p: usize, file: u64, page: u64, racy: bool, die: bool) {
        let part = &mut self.parts[p];
        // The name is a hint: the invalidation finds the file by identity (as Attached's).
        let name = part.name(&self.files, file, racy);
        let hint = name.unwrap_or(SharedFile { slot: 0, key: 0 });
        let id = Files::identity(file);
        part.index.invalidate(hint, page, id);
        self.files.write(file, page);
        if die {
            let at = self.rng.gen_range(1..=8);
            let index = &part.index;
            if die_after_store(at, || index.invalidate(hint, page, id)) {
                self.crashes += 1;
            }
        } else {
            part.index.invalidate(hint, page, id);
            if let Some(name) = name {
                part.index.vouch(name, self.files.stamp(file, true));
            }
        }
    }

    /// Something no participant wrote changes the file (all its pages); the participant whose
    /// change detection sees it forgets the file for everyone, before anyone reads again.
    fn foreign_change(&mut self, p: usize, file: u64, die: bool) {
        let part = &mut self.parts[p];
        let Some(name) = part.name(&self.files, file, false) else {
            return;
        };
        for page in 0..PAGES {
            self.files.write(file, page);
        }
        if die {
            let at = self.rng.gen_range(1..=6);
            let index = &part.index;
            if die_after_store(at, || {
                index.forget_file(name, Files::identity(file));
            }) {
                self.crashes += 1;
            }
            // Whether or not it got as far, the key may have moved: the next use finds out.
            return;
        }
        match part.index.forget_file(name, Files::identity(file)) {
            Some(new) => {
                part.names.insert(file, new);
            }
            None => {
                part.names.remove(&file);
            }
        }
    }

    /// A forked child makes one change as participant `p` and dies after a random store of it.
    fn crash(&mut self, p: usize, file: u64, page: u64) {
        match self.rng.gen_range(0..6) {
            0 => self.write(p, file, page, false, true),
            1 => self.foreign_change(p, file, true),
            2 => {
                let part = &mut self.parts[p];
                if part.pending.is_empty() {
                    return;
                }
                let which = self.rng.gen_range(0..part.pending.len());
                if let Some((claim, a)) = part.next_admission(which) {
                    let at = self.rng.gen_range(1..=24);
                    let index = &part.index;
                    if die_after_store(at, || {
                        index.publish(claim, &[a]);
                    }) {
                        self.crashes += 1;
                    }
                }
            }
            3 => {
                let at = self.rng.gen_range(1..=12);
                let stamp = self
                    .files
                    .stamp(self.rng.gen_range(HOT_FILES..FILES), false);
                let index = &self.parts[p].index;
                if die_after_store(at, || {
                    index.bind(stamp);
                }) {
                    self.crashes += 1;
                }
            }
            4 => {
                let at = self.rng.gen_range(1..=3000);
                let index = &self.parts[p].index;
                if die_after_store(at, || {
                    index.claim_region();
                }) {
                    self.crashes += 1;
                }
            }
            _ => {
                let part = &self.parts[p];
                let (Some(&name), Some(&mtime)) = (part.names.get(&file), part.verified.get(&file))
                else {
                    return;
                };
                let at = self.rng.gen_range(1..=4);
                let index = &part.index;
                if die_after_store(at, || index.vouch(name, stamp(file + 1, mtime, false))) {
                    self.crashes += 1;
                }
            }
        }
    }
}

fn run(seed: u64, steps: usize) -> Sim {
    let s = setup();
    let mut sim = Sim {
        rng: StdRng::seed_from_u64(seed),
        seed,
        files: Files::default(),
        path: s.path.clone(),
        parts: (0..PARTICIPANTS)
            .map(|_| Participant::attach(&s.path))
            .collect(),
        hits: 0,
        crashes: 0,
        deaths: 0,
        stalls: 0,
        trace: std::env::var_os("BPE_SIM_TRACE").is_some(),
    };
    // Every slot taken at the start: binding another file takes the oldest one's.
    for f in HOT_FILES..HOT_FILES + layout::MAX_FILES as u64 {
        sim.parts[0].index.bind(sim.files.stamp(f, false));
    }
    for n in 0..steps {
        sim.step(n, false);
    }
    drop(s);
    sim
}

fn env_number(name: &str) -> Option<u64> {
    std::env::var(name).ok().map(|v| {
        v.parse()
            .unwrap_or_else(|_| panic!("{name}={v}: a whole number"))
    })
}

#[test]
fn the_shared_protocol_never_serves_a_stale_page_whoever_dies_wherever() {
    if std::env::var_os("BPE_SIM_CHILD").is_none() {
        // Thousands of forked children, each holding copies of every descriptor of the process
        // while it lives, would keep other tests' locks alive (a participant they drop would
        // not look dead): the simulation runs alone, in a process of its own.
        let name = "extension::shared::sim::\
                    the_shared_protocol_never_serves_a_stale_page_whoever_dies_wherever";
        let status = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", name, "--nocapture", "--test-threads=1"])
            .env("BPE_SIM_CHILD", "1")
            .status()
            .unwrap();
        assert!(status.success(), "the simulation failed: its seed is above");
        return;
    }
    let steps = env_number("BPE_SIM_STEPS").unwrap_or(20_000) as usize;
    let seeds: Vec<u64> = match env_number("BPE_SIM_SEED") {
        Some(seed) => vec![seed],
        None => {
            let base = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64);
            let n = env_number("BPE_SIM_SEEDS").unwrap_or(3);
            (0..n)
                .map(|i| base.wrapping_add(i.wrapping_mul(0x9E37_79B9)))
                .collect()
        }
    };
    let (mut hits, mut crashes, mut recoveries) = (0, 0, 0);
    for seed in seeds {
        eprintln!("shared protocol simulation: seed {seed} (BPE_SIM_SEED={seed} replays it)");
        let sim = run(seed, steps);
        hits += sim.hits;
        crashes += sim.crashes;
        recoveries += sim.parts[0].index.stats().recoveries;
        eprintln!(
            "  {} hits checked, {} children killed mid-change, {} participants killed, \
             {} lock holders stopped",
            sim.hits, sim.crashes, sim.deaths, sim.stalls
        );
    }
    // The run tested something: pages were served, and changes were cut short and recovered.
    assert!(
        hits > 100,
        "{hits} hits: the simulation served almost nothing"
    );
    assert!(
        crashes > 10 && recoveries > 0,
        "{crashes} crashes, {recoveries} recoveries"
    );
}
