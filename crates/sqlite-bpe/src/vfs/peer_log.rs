//! The commit log that bpe processes share per database in rollback-journal mode, so that one
//! process's commit costs the others only the pages it wrote.
//!
//! SQLite itself records nothing a reader could use: a commit bumps the header's change counter
//! and that is all. Without more, every other process must forget its whole cache of the file
//! at every commit. So each bpe process, when it commits in rollback mode (holding the
//! database's EXCLUSIVE lock, so one writer at a time across all processes), appends a record
//! `BEGIN(counter before) PAGE(n)... [TRUNCATE(pages)] END(counter after)` here before it
//! releases the lock. A reader that sees the counter move walks the records since its last look:
//! if they chain exactly from the counter it knew to the counter now, it forgets just those
//! pages; if not (a plain SQLite process committed, a writer died before logging, the log was
//! overwritten or recreated), it forgets the whole file. The log can only make invalidation
//! finer, never skip one: a commit it does not explain breaks the chain.
//!
//! The log is a 64 KiB file in /dev/shm named after the user and the database's (device,
//! inode), mode 0600, refused if it is anyone else's. The first process to map it (it gets an
//! exclusive flock) initializes it with a random epoch; every user holds a shared flock while it
//! has it mapped. The descriptor is closed once the log is mapped: the mapping keeps the open
//! file, and with it the flock, until it is unmapped (a flock belongs to the open file, which
//! lives as long as a descriptor or a mapping refers to it), so a database costs no descriptor
//! for its log. Entries are written seqlock-style (sequence number last) so a reader never
//! takes a half-written entry for a whole one.

use bpe_core::own_file::{self, Access};
use bpe_core::FileIdentity;
use std::os::unix::fs::MetadataExt;
use std::os::unix::io::AsRawFd;
use std::path::PathBuf;
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};

const MAGIC: u64 = u64::from_le_bytes(*b"BPELOG01");
/// Entries in the ring: a commit of more pages than half of it is not logged (readers then
/// forget the whole file).
const ENTRIES: u64 = 4096;
const HEADER: usize = 64;
const SIZE: usize = HEADER + ENTRIES as usize * 16;
/// An entry being rewritten.
const WRITING: u64 = u64::MAX;

const BEGIN: u32 = 1;
const PAGE: u32 = 2;
const TRUNCATE: u32 = 3;
const END: u32 = 4;

#[repr(C)]
struct Header {
    magic: AtomicU64,
    epoch: AtomicU64,
    dev: AtomicU64,
    ino: AtomicU64,
    /// The sequence number the next entry gets; entries below it are published.
    head: AtomicU64,
}

#[repr(C)]
struct Entry {
    seq: AtomicU64,
    kind: AtomicU32,
    value: AtomicU32,
}

/// The logs this process has mapped (path, address of the mapping), for the exit handler. A
/// forked child inherits its parent's mappings, and with them its parent's shared flock (a
/// flock belongs to the open file, which the mapping holds): the child's cleanup tries the
/// lock on a descriptor of its own, which the parent's lock refuses, so it never removes a log
/// its parent still maps.
static OPEN: std::sync::Mutex<Vec<(PathBuf, usize)>> = std::sync::Mutex::new(Vec::new());

/// The list's lock, taken (held across a fork: see `process::hold_process_locks`).
pub fn hold_open_list() -> Box<dyn std::any::Any> {
    Box::new(OPEN.lock().unwrap_or_else(|e| e.into_inner()))
}

/// Once per process: removes this user's logs that killed processes left (`remove_unused`: a
/// directory listing and a try-lock per log, at load), and at exit this process's own that no
/// other process uses.
pub fn tidy_dev_shm() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        remove_unused();
        // SAFETY: the handler is extern "C" and never unwinds (it only tries locks and removes
        // files).
        unsafe { libc::atexit(remove_unused_at_exit) };
    });
}

/// At exit: removes the logs of this process that no other process uses.
extern "C" fn remove_unused_at_exit() {
    // Held by another thread at exit: leave the logs (the next process's tidy removes them). A
    // poisoned lock is taken as it is, as everywhere else: the list is still right.
    let open = match OPEN.try_lock() {
        Ok(open) => open,
        Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
        Err(std::sync::TryLockError::WouldBlock) => return,
    };
    for (path, map) in open.iter() {
        // The mapping is what holds this process's shared flock: it is replaced, in one step,
        // by zeroed private memory (a thread still running reads zeros, never a hole: readers
        // then find no chain and forget the file, writers write into memory nobody reads).
        // SAFETY: the range is exactly a mapping open() made and Drop has not unmapped (it is
        // listed); MAP_FIXED replaces it and nothing else.
        unsafe {
            libc::mmap(
                *map as *mut libc::c_void,
                SIZE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        remove_if_unused(path);
    }
}

/// Removes the log at `path` if no process maps it (nobody holds its flock).
fn remove_if_unused(path: &std::path::Path) {
    let Ok(file) = own_file::open(path, Access::Inspect) else {
        return;
    };
    if flock(&file, libc::LOCK_EX | libc::LOCK_NB) {
        remove_if_ours(path, &file);
    }
}

/// Removes every log of this user that no process maps (nobody holds its flock): what killed
/// processes left behind. A process about to map one either holds its flock already (kept) or
/// maps a file removed under it, whose records nobody else reads: its readers forget the whole
/// file at each commit, as without a log, until it closes the database.
pub fn remove_unused() {
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    let prefix = format!("sqlite-bpe-{uid}-");
    let Ok(entries) = std::fs::read_dir("/dev/shm") else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix(&prefix)) else {
            continue;
        };
        let is_log_name = rest
            .split_once('-')
            .is_some_and(|(dev, ino)| dev.parse::<u64>().is_ok() && ino.parse::<u64>().is_ok());
        if !is_log_name {
            continue;
        }
        let path = entry.path();
        let Ok(file) = own_file::open(&path, Access::Inspect) else {
            continue;
        };
        let ours = file.metadata().is_ok_and(|m| m.is_file() && m.uid() == uid);
        if !ours || !flock(&file, libc::LOCK_EX | libc::LOCK_NB) {
            continue;
        }
        // Still the file we locked (not one created at the name since).
        let same = std::fs::symlink_metadata(&path)
            .ok()
            .zip(file.metadata().ok())
            .is_some_and(|(at_path, locked)| at_path.ino() == locked.ino());
        if same {
            let _ = std::fs::remove_file(&path);
        }
    }
}

/// One mapping of a database's log.
pub struct PeerLog {
    /// The mapping, which also holds the shared flock (its descriptor is closed).
    map: *mut u8,
    path: PathBuf,
}

// SAFETY: the mapping is shared memory accessed only through atomics; the pointer and the file
// are owned by this value for its whole life.
unsafe impl Send for PeerLog {}
// SAFETY: as above: every access to the mapping is an atomic operation.
unsafe impl Sync for PeerLog {}

/// What the records since a reader's last look say.
#[derive(Debug, PartialEq, Eq)]
pub enum Explained {
    /// The commits chain from the counter the reader knew to the counter now: these pages (and
    /// a truncation to this many pages, if any) are all that changed.
    Pages {
        pages: Vec<u64>,
        truncated_to: Option<u64>,
    },
    /// Not explained: forget the whole file.
    Unknown,
}

fn log_path(identity: FileIdentity) -> PathBuf {
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    PathBuf::from(format!(
        "/dev/shm/sqlite-bpe-{uid}-{}-{}",
        identity.dev, identity.ino
    ))
}

fn flock(file: &std::fs::File, op: libc::c_int) -> bool {
    // SAFETY: a plain syscall on a descriptor we own.
    unsafe { libc::flock(file.as_raw_fd(), op) == 0 }
}

/// Allocates the whole log's memory now (idempotent: pages already there stay as they are).
fn reserve(file: &std::fs::File) -> std::io::Result<()> {
    loop {
        // SAFETY: a plain syscall on a descriptor we own; it returns an errno value.
        match unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, SIZE as libc::off_t) } {
            0 => return Ok(()),
            libc::EINTR => continue,
            rc => return Err(std::io::Error::from_raw_os_error(rc)),
        }
    }
}

/// Says once per process, through sqlite3_log, that a log could not be had and why (short:
/// sqlite3_log cuts messages at 210 bytes).
fn unavailable(path: &std::path::Path, e: std::io::Error) {
    static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if SAID.swap(true, Ordering::Relaxed) {
        return;
    }
    let full = if e.raw_os_error() == Some(libc::ENOSPC) {
        "/dev/shm is full, "
    } else {
        ""
    };
    crate::api::log(
        libsqlite3_sys::SQLITE_WARNING,
        &format!(
            "bpe: no commit log ({}: {full}{e}): another process's commit empties the cache",
            path.display()
        ),
    );
}

/// Removes the file at `path` if it is still `file` (holding its exclusive lock).
fn remove_if_ours(path: &std::path::Path, file: &std::fs::File) {
    let ours = std::fs::symlink_metadata(path)
        .ok()
        .zip(file.metadata().ok())
        .is_some_and(|(p, f)| p.ino() == f.ino() && p.dev() == f.dev());
    if ours {
        let _ = std::fs::remove_file(path);
    }
}

fn random_epoch() -> u64 {
    let mut n = 0u64;
    // SAFETY: getrandom writes at most 8 bytes into n.
    let got = unsafe { libc::getrandom(&mut n as *mut u64 as *mut libc::c_void, 8, 0) };
    if got != 8 {
        // Unlikely; any value unlike the last one will do.
        n = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
            ^ (std::process::id() as u64) << 32;
    }
    n | 1
}

impl PeerLog {
    /// Maps the log of the database `identity`, creating it if needed. None where there is no
    /// /dev/shm, the file there is not this user's own and private, or its memory cannot be
    /// reserved (a full /dev/shm: said once through sqlite3_log).
    pub fn open(identity: FileIdentity) -> Option<PeerLog> {
        let path = log_path(identity);
        let file = own_file::open(&path, Access::UpdateOrCreate).ok()?;
        let meta = file.metadata().ok()?;
        // SAFETY: geteuid has no preconditions.
        let uid = unsafe { libc::geteuid() };
        if !meta.is_file() || meta.uid() != uid || meta.mode() & 0o077 != 0 {
            return None;
        }
        let alone = flock(&file, libc::LOCK_EX | libc::LOCK_NB);
        if alone {
            file.set_len(SIZE as u64).ok()?;
        } else if !flock(&file, libc::LOCK_SH) || meta.len() != SIZE as u64 {
            return None;
        }
        // Its memory is reserved before it is mapped, by every user (a creator may be a version
        // that did not): tmpfs allocates a page when first touched, and a touch it cannot back
        // (a full /dev/shm) is a SIGBUS. Without a log, readers forget the whole file at each
        // commit of another process: slower, never wrong.
        if let Err(e) = reserve(&file) {
            unavailable(&path, e);
            if alone {
                remove_if_ours(&path, &file);
            }
            return None;
        }
        // SAFETY: maps SIZE bytes of a file that long, its memory reserved, shared, for the life
        // of self.
        let map = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                SIZE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if map == libc::MAP_FAILED {
            return None;
        }
        let log = PeerLog {
            map: map as *mut u8,
            path,
        };
        let h = log.header();
        if alone {
            // Nobody else has it mapped: start afresh (a left-over log may describe another
            // file that had this inode).
            for i in 0..ENTRIES {
                log.entry(i).seq.store(WRITING, Ordering::Relaxed);
            }
            h.dev.store(identity.dev, Ordering::Relaxed);
            h.ino.store(identity.ino, Ordering::Relaxed);
            h.head.store(0, Ordering::Relaxed);
            h.epoch.store(random_epoch(), Ordering::Relaxed);
            h.magic.store(MAGIC, Ordering::Release);
            flock(&file, libc::LOCK_SH);
        }
        // The mapping holds the open file and its shared flock from here.
        drop(file);
        let valid = h.magic.load(Ordering::Acquire) == MAGIC
            && h.dev.load(Ordering::Relaxed) == identity.dev
            && h.ino.load(Ordering::Relaxed) == identity.ino;
        if valid {
            OPEN.lock()
                .unwrap_or_else(|e| e.into_inner())
                .push((log.path.clone(), log.map as usize));
        }
        valid.then_some(log)
    }

    fn header(&self) -> &Header {
        // SAFETY: the mapping is SIZE bytes, page-aligned; Header is 40 bytes of atomics.
        unsafe { &*(self.map as *const Header) }
    }

    fn entry(&self, seq: u64) -> &Entry {
        let i = (seq % ENTRIES) as usize;
        // SAFETY: i < ENTRIES; each entry is 16 bytes after the 64-byte header, 8-aligned.
        unsafe { &*(self.map.add(HEADER + i * 16) as *const Entry) }
    }

    /// Whether a log of this database exists (some bpe process committed in rollback mode).
    pub fn exists(identity: FileIdentity) -> bool {
        log_path(identity).exists()
    }

    /// Ends every reader's chain: a commit is about to happen that the log cannot record (one
    /// in WAL mode, whose frames reach the database file at a checkpoint without moving the
    /// header's change counter unless page 1 changed). A rollback-mode reader whose position is
    /// older then forgets the whole file, instead of taking a later chain of logged commits for
    /// all that changed.
    pub fn break_chains(&self) {
        self.header().epoch.fetch_add(1, Ordering::AcqRel);
    }

    /// The log's identity: a reader's position is only meaningful in the same epoch.
    pub fn epoch(&self) -> u64 {
        self.header().epoch.load(Ordering::Acquire)
    }

    pub fn head(&self) -> u64 {
        self.header().head.load(Ordering::Acquire)
    }

    /// Appends the record of a commit: the change counter went from `before` to `after` by
    /// writing `pages` (and truncating to `truncated_to` pages). The caller holds the
    /// database's EXCLUSIVE lock, so no other process appends at the same time. Returns the new
    /// head; a commit too large to log is not logged (readers then forget the whole file).
    pub fn append(&self, before: u32, after: u32, pages: &[u64], truncated_to: Option<u64>) -> u64 {
        let head = self.head();
        let n = pages.len() as u64 + 2 + u64::from(truncated_to.is_some());
        if n > ENTRIES / 2 || pages.iter().any(|&p| p >= u32::MAX as u64) {
            return head;
        }
        let records = std::iter::once((BEGIN, before))
            .chain(pages.iter().map(|&p| (PAGE, p as u32)))
            .chain(truncated_to.map(|t| (TRUNCATE, t.min(u32::MAX as u64) as u32)))
            .chain(std::iter::once((END, after)));
        for (i, (kind, value)) in records.enumerate() {
            let seq = head + i as u64;
            let e = self.entry(seq);
            e.seq.store(WRITING, Ordering::Relaxed);
            fence(Ordering::Release);
            e.kind.store(kind, Ordering::Relaxed);
            e.value.store(value, Ordering::Relaxed);
            e.seq.store(seq, Ordering::Release);
        }
        self.header().head.store(head + n, Ordering::Release);
        head + n
    }

    /// Reads the entries [from, to): None if any was overwritten meanwhile (or never written).
    fn entries(&self, from: u64, to: u64) -> Option<Vec<(u32, u32)>> {
        if to < from || to - from > ENTRIES {
            return None;
        }
        (from..to)
            .map(|seq| {
                let e = self.entry(seq);
                let s1 = e.seq.load(Ordering::Acquire);
                let kind = e.kind.load(Ordering::Relaxed);
                let value = e.value.load(Ordering::Relaxed);
                fence(Ordering::Acquire);
                let s2 = e.seq.load(Ordering::Relaxed);
                (s1 == seq && s2 == seq).then_some((kind, value))
            })
            .collect()
    }

    /// What changed between the reader's position `from` (where the counter was `known`) and
    /// the head `to`, if the records chain from `known` to `now`.
    pub fn explain(&self, from: u64, to: u64, known: u32, now: u32) -> Explained {
        let Some(entries) = self.entries(from, to) else {
            return Explained::Unknown;
        };
        let mut counter = known;
        let mut pages = Vec::new();
        let mut truncated_to: Option<u64> = None;
        let mut open = false;
        let mut commits = 0;
        for (kind, value) in entries {
            match (kind, open) {
                (BEGIN, false) if value == counter => open = true,
                (PAGE, true) => pages.push(value as u64),
                (TRUNCATE, true) => {
                    truncated_to = Some(truncated_to.map_or(value as u64, |t| t.min(value as u64)))
                }
                (END, true) => {
                    counter = value;
                    open = false;
                    commits += 1;
                }
                _ => return Explained::Unknown,
            }
        }
        // No commit logged explains no change: the header moved for another reason (a write
        // outside SQLite, a plain SQLite process whose commit the log does not hold).
        if open || counter != now || commits == 0 {
            return Explained::Unknown;
        }
        pages.sort_unstable();
        pages.dedup();
        Explained::Pages {
            pages,
            truncated_to,
        }
    }
}

impl Drop for PeerLog {
    fn drop(&mut self) {
        let map = self.map as usize;
        OPEN.lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|(_, m)| *m != map);
        // SAFETY: unmaps exactly what open() mapped; nothing refers to it after this. With the
        // mapping goes this process's shared flock.
        unsafe { libc::munmap(self.map as *mut libc::c_void, SIZE) };
        // The last user removes it (no other process holds its shared lock).
        remove_if_unused(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity(n: u64) -> FileIdentity {
        FileIdentity {
            dev: u64::MAX - 7,
            ino: (std::process::id() as u64) << 20 | n,
        }
    }

    #[test]
    fn records_chain_from_a_known_counter_to_the_current_one() {
        let a = PeerLog::open(identity(1)).expect("/dev/shm");
        let b = PeerLog::open(identity(1)).expect("shared");
        assert_eq!(a.epoch(), b.epoch(), "the second mapping sees the same log");
        let start = b.head();
        a.append(10, 11, &[3, 1], None);
        a.append(11, 12, &[1, 9], Some(40));
        let head = b.head();
        assert_eq!(
            b.explain(start, head, 10, 12),
            Explained::Pages {
                pages: vec![1, 3, 9],
                truncated_to: Some(40)
            }
        );
        // A commit the log does not hold (another process's, a plain SQLite writer's) breaks
        // the chain: the counter now is not where the records lead.
        assert_eq!(b.explain(start, head, 10, 13), Explained::Unknown);
        assert_eq!(b.explain(start, head, 9, 12), Explained::Unknown);
        // No commit since: a header that moved anyway is not explained.
        assert_eq!(b.explain(head, head, 12, 12), Explained::Unknown);
        // Overwritten entries are not trusted.
        for c in 12..12 + ENTRIES as u32 / 3 {
            a.append(c, c + 1, &[0], None);
        }
        assert_eq!(
            b.explain(start, b.head(), 10, 12 + ENTRIES as u32 / 3),
            Explained::Unknown
        );
    }

    /// tmpfs backs a page when it is first touched, and a touch it cannot back is a SIGBUS: the
    /// log's memory is reserved before it is mapped, by its creator and by a joiner (whose
    /// creator may be an older version that did not reserve it).
    #[test]
    fn the_log_is_reserved_before_it_is_mapped() {
        let reserved = |f: &std::fs::File| f.metadata().unwrap().blocks() * 512;
        let a = PeerLog::open(identity(3)).expect("/dev/shm");
        let file = own_file::open(&a.path, Access::Inspect).unwrap();
        assert!(reserved(&file) >= SIZE as u64, "the creator reserves it");
        drop(file);
        drop(a);
        // An older creator's log: sized, not reserved, its creator still holding it.
        let path = log_path(identity(4));
        let older = own_file::open(&path, Access::CreateNew).unwrap();
        older.set_len(SIZE as u64).unwrap();
        assert!(flock(&older, libc::LOCK_SH));
        let sparse = reserved(&older) < SIZE as u64;
        // Joined: reserved, then refused (the older creator never wrote a header here).
        assert!(PeerLog::open(identity(4)).is_none());
        let joined = reserved(&older);
        std::fs::remove_file(&path).unwrap();
        if sparse {
            assert!(joined >= SIZE as u64, "the joiner reserves it");
        }
    }

    /// The mapping, not a descriptor, holds the log in use: none is left open, and while it
    /// is mapped no sweeper can take its exclusive lock.
    #[test]
    fn a_mapped_log_holds_its_lock_without_a_descriptor() {
        let path = log_path(identity(5));
        let fds = || {
            std::fs::read_dir("/proc/self/fd")
                .unwrap()
                .filter(|e| std::fs::read_link(e.as_ref().unwrap().path()).is_ok_and(|l| l == path))
                .count()
        };
        let a = PeerLog::open(identity(5)).expect("/dev/shm");
        assert_eq!(fds(), 0, "a descriptor of the log is open");
        let other = own_file::open(&path, Access::Inspect).unwrap();
        assert!(
            !flock(&other, libc::LOCK_EX | libc::LOCK_NB),
            "not marked in use"
        );
        drop(a);
        assert!(!path.exists(), "the last user removes it");
    }

    #[test]
    fn the_last_user_removes_the_log() {
        let path = log_path(identity(2));
        let a = PeerLog::open(identity(2)).expect("/dev/shm");
        let b = PeerLog::open(identity(2)).expect("shared");
        drop(a);
        assert!(path.exists(), "removed while another mapping uses it");
        drop(b);
        assert!(!path.exists());
    }
}
