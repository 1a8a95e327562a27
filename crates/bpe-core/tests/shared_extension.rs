//! One extension shared by several processes, SIGKILLed at random points.
//!
//! Four child processes run the protocol of `bpe_core::shared` against one data file and one
//! extension file, the way bpe processes do under SQLite: readers hold a shared `flock` on the
//! data file (SQLite's SHARED lock), writers an exclusive one (EXCLUSIVE), and each process's
//! "writer thread" writes the pages it staged into its claimed region and publishes them later,
//! outside the data lock. Every hit is checked against the data file read under the same lock:
//! a stale page ends the child with a failure. The parent kills a random child every few tens of
//! milliseconds (mid-lookup, mid-batch, mid-write, holding the shared lock or not) and starts a
//! new one; the survivors must keep answering correctly, and the index must be sound at the end.
//!
//! Replay a failure with `BPE_CRASH_SEED=<seed printed by the test>`.

use bpe_core::shared::{Admission, Claim, Found, Geometry, SharedFile, SharedIndex};
use bpe_core::{FileStamp, KnownStamp};
use rand::{rngs::StdRng, Rng, SeedableRng};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const CHILD: &str = "BPE_SHARED_CHILD";
const DATA: &str = "BPE_SHARED_DATA";
const EXT: &str = "BPE_SHARED_EXT";
const SEED: &str = "BPE_SHARED_SEED";
const STOP: &str = "BPE_SHARED_STOP";

const PAGE: usize = 4096;
const PAGES: u64 = 256;
const REGIONS: usize = 6;
const REGION: u64 = bpe_core::config::EXTENSION_BATCH_BYTES as u64;
/// Pages a child's writer gathers before it writes them (small: the ring turns over often).
const BATCH: usize = 8;

fn geometry() -> Geometry {
    Geometry::new(REGIONS, REGION)
}

/// Page `page` at `version`: its number and version, then a pattern of both.
fn page_bytes(page: u64, version: u64) -> Vec<u8> {
    let mut b = vec![(page * 31 + version) as u8; PAGE];
    b[..8].copy_from_slice(&page.to_le_bytes());
    b[8..16].copy_from_slice(&version.to_le_bytes());
    b
}

fn flock(file: &File, op: libc::c_int) {
    // SAFETY: the descriptor is open for the call.
    assert_eq!(unsafe { libc::flock(file.as_raw_fd(), op) }, 0);
}

fn stamp(file: &File) -> KnownStamp {
    KnownStamp::taken_now(FileStamp::of_metadata(&file.metadata().unwrap()))
}

// ---------------------------------------------------------------------------------------------
// The child.

/// Not a test: the body of the child processes (does nothing unless BPE_SHARED_CHILD is set).
#[test]
#[ignore = "run by the shared-extension crash test as a child process"]
fn child_entry() {
    if std::env::var(CHILD).is_err() {
        return;
    }
    std::panic::set_hook(Box::new(|info| {
        eprintln!("CHILD PANIC: {info}");
        std::process::abort();
    }));
    let env = |name| PathBuf::from(std::env::var(name).unwrap());
    let seed: u64 = std::env::var(SEED).unwrap().parse().unwrap();
    Worker::new(&env(DATA), &env(EXT), seed).run(&env(STOP));
}

struct Worker {
    data: File,
    ext: File,
    index: SharedIndex,
    file: SharedFile,
    rng: StdRng,
    /// Pages read from the data file, with the write epoch read before each read.
    staged: Vec<(u64, u64, Vec<u8>)>,
    claim: Option<Claim>,
    fill: usize,
    hits: u64,
    others_hits: u64,
    writes: u64,
}

impl Worker {
    fn new(data: &Path, ext: &Path, seed: u64) -> Worker {
        let data = OpenOptions::new()
            .read(true)
            .write(true)
            .open(data)
            .unwrap();
        let index = SharedIndex::attach(ext, geometry()).unwrap();
        flock(&data, libc::LOCK_SH);
        // A bounded wait for the lock may give up while others hold it: try again.
        let file = std::iter::repeat_with(|| index.bind(stamp(&data)))
            .flatten()
            .next()
            .unwrap();
        flock(&data, libc::LOCK_UN);
        Worker {
            ext: OpenOptions::new().read(true).write(true).open(ext).unwrap(),
            data,
            index,
            file,
            rng: StdRng::seed_from_u64(seed),
            staged: Vec::new(),
            claim: None,
            fill: 0,
            hits: 0,
            others_hits: 0,
            writes: 0,
        }
    }

    fn run(mut self, stop: &Path) {
        loop {
            for _ in 0..256 {
                let page = self.rng.gen_range(0..PAGES);
                if self.rng.gen_bool(0.1) {
                    self.write(page);
                } else {
                    self.read(page);
                }
                if self.staged.len() >= BATCH {
                    self.write_batch();
                }
            }
            if stop.exists() {
                break;
            }
        }
        println!(
            "done hits={} others_hits={} writes={}",
            self.hits, self.others_hits, self.writes
        );
    }

    fn read_data(&self, page: u64) -> Vec<u8> {
        let mut buf = vec![0; PAGE];
        self.data
            .read_exact_at(&mut buf, page * PAGE as u64)
            .unwrap();
        buf
    }

    /// A read under SQLite's SHARED lock: the extension if it has the page, else the data file.
    fn read(&mut self, page: u64) {
        flock(&self.data, libc::LOCK_SH);
        match self.index.lookup(self.file, page) {
            Found::Hit(hit) => {
                let mut buf = vec![0; hit.location.len];
                self.ext
                    .read_exact_at(&mut buf, hit.location.offset)
                    .unwrap();
                if bpe_core::shared::page_crc(page, &buf) == hit.location.crc {
                    let current = self.read_data(page);
                    if buf != current {
                        println!(
                            "STALE page {page}: served version {}, the file has {}",
                            u64::from_le_bytes(buf[8..16].try_into().unwrap()),
                            u64::from_le_bytes(current[8..16].try_into().unwrap())
                        );
                        std::process::exit(3);
                    }
                    self.hits += 1;
                    self.others_hits += u64::from(!hit.mine);
                } else {
                    self.index.drop_if(self.file, page, hit.location);
                }
            }
            Found::Moved => {
                let id = FileStamp::of_metadata(&self.data.metadata().unwrap()).identity;
                // (A bounded wait for the lock may give up: the name stays, and moves next time.)
                if let Some(f) = self
                    .index
                    .follow(self.file, id)
                    .or_else(|| self.index.bind(stamp(&self.data)))
                {
                    self.file = f;
                }
            }
            Found::Miss => {
                let id = FileStamp::of_metadata(&self.data.metadata().unwrap()).identity;
                let epoch = self.index.epoch(id, page);
                let bytes = self.read_data(page);
                self.staged.push((page, epoch, bytes));
            }
        }
        flock(&self.data, libc::LOCK_UN);
    }

    /// A write under SQLite's EXCLUSIVE lock: invalidated before and after, then vouched for.
    fn write(&mut self, page: u64) {
        flock(&self.data, libc::LOCK_EX);
        let version = u64::from_le_bytes(self.read_data(page)[8..16].try_into().unwrap());
        let id = FileStamp::of_metadata(&self.data.metadata().unwrap()).identity;
        self.index.invalidate(self.file, page, id);
        self.data
            .write_all_at(&page_bytes(page, version + 1), page * PAGE as u64)
            .unwrap();
        self.index.invalidate(self.file, page, id);
        self.index.vouch(self.file, stamp(&self.data));
        flock(&self.data, libc::LOCK_UN);
        self.writes += 1;
    }

    /// The writer thread's step, outside any data lock: the staged pages into this process's
    /// region, then published.
    fn write_batch(&mut self) {
        let bytes = self.staged.len() * PAGE;
        if self.claim.is_none() || self.fill + bytes > REGION as usize {
            if let Some(c) = self.claim.take() {
                self.index.seal(c);
            }
            self.claim = self.index.claim_region();
            self.fill = 0;
        }
        let Some(claim) = self.claim else {
            self.staged.clear();
            return;
        };
        let mut block = Vec::with_capacity(bytes);
        let mut admissions = Vec::new();
        for (page, epoch, data) in self.staged.drain(..) {
            admissions.push(Admission {
                file: self.file,
                page,
                offset: self.fill + block.len(),
                len: PAGE,
                crc: bpe_core::shared::page_crc(page, &data),
                epoch,
            });
            block.extend_from_slice(&data);
        }
        let at = claim.region as u64 * REGION + self.fill as u64;
        self.ext.write_all_at(&block, at).unwrap();
        self.fill += block.len();
        self.index.publish(claim, &admissions);
    }
}

// ---------------------------------------------------------------------------------------------
// The parent.

fn spawn(data: &Path, ext: &Path, stop: &Path, seed: u64) -> std::process::Child {
    Command::new(std::env::current_exe().unwrap())
        .args([
            "child_entry",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, "work")
        .env(DATA, data)
        .env(EXT, ext)
        .env(STOP, stop)
        .env(SEED, seed.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap()
}

fn seed() -> u64 {
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

/// The children alive: killed if the test fails midway (else they would run on, orphaned).
struct Children(Vec<std::process::Child>);

impl Drop for Children {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The child's report, if it finished by itself: (hits, hits on pages another process loaded).
fn finish(child: std::process::Child) -> (u64, u64) {
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "a surviving child failed ({}): {text}",
        out.status
    );
    let line = text
        .lines()
        .find_map(|l| l.split_once("done ").map(|(_, r)| r))
        .unwrap_or_else(|| panic!("no report in {text:?}"));
    let field = |name: &str| -> u64 {
        line.split_whitespace()
            .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('=')?.parse().ok())
            .unwrap()
    };
    (field("hits"), field("others_hits"))
}

#[test]
fn survivors_of_random_sigkills_never_serve_a_stale_page() {
    let seed = seed();
    println!("BPE_CRASH_SEED={seed}");
    let mut rng = StdRng::seed_from_u64(seed);
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let ext = dir.path().join("ext.bpe");
    let stop = dir.path().join("stop");
    let mut bytes = Vec::with_capacity(PAGES as usize * PAGE);
    for p in 0..PAGES {
        bytes.extend_from_slice(&page_bytes(p, 0));
    }
    std::fs::write(&data, bytes).unwrap();
    File::create(&ext)
        .unwrap()
        .set_len(REGIONS as u64 * REGION)
        .unwrap();
    // The parent stays attached throughout, so the shared memory lives across all the kills.
    let observer = SharedIndex::attach(&ext, geometry()).unwrap();

    let mut children = Children(
        (0..4)
            .map(|_| spawn(&data, &ext, &stop, rng.gen()))
            .collect(),
    );
    let mut kills = 0;
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(4) {
        std::thread::sleep(Duration::from_millis(rng.gen_range(10..120)));
        let victim = rng.gen_range(0..children.0.len());
        children.0[victim].kill().unwrap();
        let status = children.0[victim].wait().unwrap();
        // Killed, or already failed by itself (a stale page): the latter must not pass.
        assert!(status.code().is_none(), "child failed by itself: {status}");
        kills += 1;
        children.0[victim] = spawn(&data, &ext, &stop, rng.gen());
    }
    std::fs::write(&stop, b"").unwrap();
    let reports: Vec<_> = std::mem::take(&mut children.0)
        .into_iter()
        .map(finish)
        .collect();
    let hits: u64 = reports.iter().map(|r| r.0).sum();
    let others: u64 = reports.iter().map(|r| r.1).sum();
    println!("{kills} kills; survivors: {hits} hits, {others} on pages another process loaded");
    observer.check().unwrap();
    assert!(
        others > 0,
        "the survivors were served pages other processes loaded"
    );
    let shm = bpe_core::shared::memory_path(
        FileStamp::of_metadata(&std::fs::metadata(&ext).unwrap()).identity,
    )
    .unwrap();
    assert!(observer.detach(false, || std::fs::remove_file(&ext).unwrap()));
    assert!(
        !shm.exists() && !ext.exists(),
        "the last to detach removed both"
    );
}
