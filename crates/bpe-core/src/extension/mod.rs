//! L2: the buffer pool extension. Clean pages are staged, written by a background thread in
//! large sequential batches into a ring of regions, and read back at random, in parallel, by
//! whichever thread misses in RAM. A page takes exactly its own size, so any mix of page sizes
//! shares one extension. Every read is checked against a crc32c of the page's identity and bytes
//! kept in RAM; any fault is a miss. The ring's oldest region is overwritten first (FIFO), which
//! keeps every write sequential.

mod index;
mod writer;

pub use index::{page_crc, ExtensionIndex, Location, UNIT};

use crate::config::{EXTENSION_BATCH_BYTES, EXTENSION_FAULT_LIMIT, EXTENSION_STAGING_PAGES};
use crate::counters::Counters;
use crate::io::aligned::Scratch;
use crate::io::aligned::{round_down, round_up};
use crate::io::extension_file::ExtensionFile;
use crate::io::{FaultInjector, FaultyExtensionFile};
use crate::page::{FileKey, PageKey};
use crate::pool::Frame;
use crate::sync::channel::{Sender, TrySendError};
use crate::sync::{Latch, Mutex, Rank, RwLock};
use crate::Result;
use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Instant;

/// Bytes of one region of the ring: one write batch.
pub const REGION_BYTES: u64 = EXTENSION_BATCH_BYTES as u64;
/// The smallest extension: two regions (the writer fills one while the other holds pages).
pub const MIN_EXTENSION_BYTES: u64 = 2 * REGION_BYTES;

/// What the extension needs from the engine that owns it.
pub trait ExtensionHost: Send + Sync {
    /// Charges `bytes` of index memory against max server memory, evicting from RAM to make
    /// room; false when that would exceed the index's budget.
    fn charge_index(&self, bytes: u64) -> bool;
    /// The extension gave up after repeated faults: the engine retires it.
    fn failed(&self, ext: &Arc<Extension>);
}

/// Pages read in one request by [`Extension::read_run`]; the first `len` passed their checksums.
pub struct Run {
    block: Scratch,
    /// Where the first page starts in `block`.
    skip: usize,
    page_len: usize,
    pub len: usize,
}

impl Run {
    /// Page `i` of the run (verified when `i < len`).
    pub fn page(&self, i: usize) -> &[u8] {
        &self.block[self.skip + i * self.page_len..][..self.page_len]
    }
}

/// What the background writer receives.
enum ToWriter {
    Page(Staged),
    /// Stop now (the extension is being disabled).
    Stop,
}

/// A page waiting for the background writer.
struct Staged {
    key: PageKey,
    seq: u64,
    frame: Arc<Frame>,
}

struct Tables {
    index: ExtensionIndex,
    /// Pages handed to the writer and not yet indexed, with their staging sequence number.
    /// A write to the page removes it here, and the writer then drops its copy.
    staged: HashMap<PageKey, u64>,
}

pub struct Extension {
    file: FaultyExtensionFile,
    regions: usize,
    tables: RwLock<Tables>,
    staging: Sender<ToWriter>,
    /// Set once when the background writer has stopped.
    writer_done: Arc<Latch>,
    stopping: AtomicBool,
    next_seq: AtomicU64,
    consecutive_faults: AtomicU32,
    failure: Mutex<Option<String>>,
    failed: AtomicBool,
    /// Bytes of index memory charged against max server memory (never less than the index).
    charged: AtomicU64,
    /// Why a page was last refused, if one was (for operators: every drop is counted and said).
    last_drop: Mutex<Option<String>>,
    /// Last reference, in ms since `epoch`, per region of the ring.
    region_last_ref: Vec<AtomicU64>,
    counters: Arc<Counters>,
    host: Arc<dyn ExtensionHost>,
    epoch: Instant,
}

/// Regions of an extension of `size` bytes.
pub fn regions_for(size: u64) -> usize {
    (size / REGION_BYTES).min(u32::MAX as u64 / 1024) as usize
}

/// Index bytes an extension of `size` bytes starts with (sized for 4 KiB pages).
pub fn initial_index_bytes(size: u64) -> u64 {
    let regions = regions_for(size);
    ExtensionIndex::bytes_for(regions, REGION_BYTES) + regions as u64 * 8
}

impl Extension {
    pub fn create(
        path: &Path,
        size: u64,
        counters: Arc<Counters>,
        faults: Arc<FaultInjector>,
        host: Arc<dyn ExtensionHost>,
        epoch: Instant,
    ) -> Result<Arc<Extension>> {
        let regions = regions_for(size);
        let file = ExtensionFile::create(path, regions as u64 * REGION_BYTES)?;
        let file = FaultyExtensionFile::new(file, faults);
        let (tx, rx) = crate::sync::channel::bounded(EXTENSION_STAGING_PAGES);
        let ext = Arc::new(Extension {
            file,
            regions,
            tables: RwLock::new(
                Rank::ExtensionTables,
                Tables {
                    index: ExtensionIndex::new(regions, REGION_BYTES),
                    staged: HashMap::new(),
                },
            ),
            staging: tx,
            writer_done: Arc::new(Latch::default()),
            stopping: AtomicBool::new(false),
            next_seq: AtomicU64::new(1),
            consecutive_faults: AtomicU32::new(0),
            failure: Mutex::new(Rank::Leaf, None),
            failed: AtomicBool::new(false),
            charged: AtomicU64::new(initial_index_bytes(size)),
            last_drop: Mutex::new(Rank::Leaf, None),
            region_last_ref: (0..regions).map(|_| AtomicU64::new(0)).collect(),
            counters,
            host,
            epoch,
        });
        writer::spawn(ext.clone(), rx, ext.writer_done.clone());
        Ok(ext)
    }

    pub fn path(&self) -> &Path {
        self.file.file().path()
    }
    pub fn size_bytes(&self) -> u64 {
        self.regions as u64 * REGION_BYTES
    }
    pub fn identity(&self) -> crate::io::FileIdentity {
        self.file.file().identity()
    }
    pub fn cached_pages(&self) -> usize {
        self.tables.read().index.len()
    }
    /// Bytes of the ring the cached pages take.
    pub fn cached_bytes(&self) -> u64 {
        self.tables.read().index.live_bytes()
    }
    /// Bytes of RAM the extension's index is charged against max server memory.
    pub fn index_bytes(&self) -> u64 {
        self.charged.load(Relaxed)
    }
    /// Why a page was last refused, if one was.
    pub fn last_drop(&self) -> Option<String> {
        self.last_drop.lock().clone()
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    fn drop_admission(&self, pages: u64, why: impl FnOnce() -> String) {
        self.counters
            .ext_admissions_dropped
            .fetch_add(pages, Relaxed);
        let mut last = self.last_drop.lock();
        if last.is_none() {
            let why = why();
            log::info!("buffer pool extension: {why}");
            *last = Some(why);
        }
    }

    /// Offers a clean page (just read from the data file, or leaving RAM). Never blocks: if the
    /// writer is behind, the page is not admitted (and is offered again when it leaves RAM). A
    /// page whose unchanged copy is already here is not written again.
    pub fn admit(&self, frame: &Arc<Frame>) {
        if self.failed.load(Relaxed) || self.stopping.load(Relaxed) || !frame.is_current() {
            return;
        }
        if !ExtensionIndex::fits(frame.key) {
            return self.drop_admission(1, || {
                format!(
                    "page {} is numbered beyond what the index holds (2^32 - 1)",
                    frame.key.page
                )
            });
        }
        let held = |t: &Tables| t.index.contains(frame.key) || t.staged.contains_key(&frame.key);
        // Most offers at eviction are of pages admitted at load: a shared lock answers them.
        if held(&self.tables.read()) {
            return;
        }
        let mut t = self.tables.write();
        if held(&t) {
            return;
        }
        let seq = self.next_seq.fetch_add(1, Relaxed);
        let staged = Staged {
            key: frame.key,
            seq,
            frame: frame.clone(),
        };
        match self.staging.try_send(ToWriter::Page(staged)) {
            Ok(()) => {
                t.staged.insert(frame.key, seq);
            }
            Err((TrySendError::Full, _)) => {
                drop(t);
                self.drop_admission(1, || {
                    format!(
                        "the writer is behind ({EXTENSION_STAGING_PAGES} pages waiting): pages \
                         are offered again when they leave RAM"
                    )
                });
            }
            Err((TrySendError::Disconnected, _)) => {}
        }
    }

    /// Whether a copy of `key` is indexed here (not verified: a read may still miss).
    pub fn holds(&self, key: PageKey) -> bool {
        !self.failed.load(Relaxed) && self.tables.read().index.contains(key)
    }

    /// Reads a page into `buf` if a verified copy is here. Any fault is a miss (and is counted).
    pub fn read(self: &Arc<Self>, key: PageKey, buf: &mut [u8]) -> bool {
        if self.failed.load(Relaxed) {
            return false;
        }
        let Some(loc) = self.tables.read().index.lookup(key) else {
            return false;
        };
        if loc.len != buf.len() {
            return false;
        }
        let (start, skip, len) = aligned_span(loc.offset, loc.len);
        let mut block = Scratch::new(len);
        let res = self.read_request(start, &mut block[..len]);
        let page = &block[skip..skip + loc.len];
        match res {
            Err(e) => {
                Counters::bump(&self.counters.ext_io_errors);
                self.drop_entry(key, loc);
                self.fault(format!("read error: {e}"));
                false
            }
            Ok(()) if page_crc(key, page) != loc.crc => {
                // The writer may have reused the region since we looked: that is a plain miss.
                // Only an entry that still claims this place is corrupt.
                if self.drop_entry(key, loc) {
                    Counters::bump(&self.counters.ext_checksum_failures);
                    self.fault(format!("checksum mismatch at offset {}", loc.offset));
                }
                false
            }
            Ok(()) => {
                buf.copy_from_slice(page);
                self.consecutive_faults.store(0, Relaxed);
                Counters::bump(&self.counters.ext_page_reads);
                self.touch_region(loc.offset);
                true
            }
        }
    }

    /// One read request to the file, counted as outstanding while it runs and timed.
    fn read_request(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        let c = &self.counters;
        c.ext_outstanding_io.fetch_add(1, Relaxed);
        let started = Instant::now();
        let res = self.file.read_at(offset, buf);
        c.ext_read_micros
            .fetch_add(started.elapsed().as_micros() as u64, Relaxed);
        c.ext_read_requests.fetch_add(1, Relaxed);
        c.ext_outstanding_io.fetch_sub(1, Relaxed);
        res
    }

    fn touch_region(&self, offset: u64) {
        self.region_last_ref[(offset / REGION_BYTES) as usize].store(self.now_ms(), Relaxed);
    }

    /// Reads the pages of `keys` that sit right after `after`'s, in one request: a scan over
    /// pages that were admitted in scan order. Returns the longest such run (a prefix of `keys`)
    /// in the buffer it was read into, its first `len` pages verified; a page that fails its
    /// checksum ends the run there, as a plain miss (its region may have been reused).
    pub fn read_run(
        self: &Arc<Self>,
        after: PageKey,
        keys: &[PageKey],
        page_len: usize,
    ) -> Option<Run> {
        if self.failed.load(Relaxed) || keys.is_empty() {
            return None;
        }
        let run: Vec<Location> = {
            let t = self.tables.read();
            let first = t.index.lookup(after)?;
            let mut next = first.offset + first.len as u64;
            keys.iter()
                .map_while(|&k| {
                    let loc = t
                        .index
                        .lookup(k)
                        .filter(|l| l.offset == next && l.len == page_len)?;
                    next += page_len as u64;
                    Some(loc)
                })
                .collect()
        };
        let first = run.first()?;
        let (start, skip, len) = aligned_span(first.offset, page_len * run.len());
        let mut block = Scratch::new(len);
        let res = self.read_request(start, &mut block[..len]);
        if let Err(e) = res {
            Counters::bump(&self.counters.ext_io_errors);
            self.fault(format!("read error: {e}"));
            return None;
        }
        let mut out = Run {
            block,
            skip,
            page_len,
            len: 0,
        };
        for (i, loc) in run.iter().enumerate() {
            if page_crc(keys[i], out.page(i)) != loc.crc {
                if self.drop_entry(keys[i], *loc) {
                    Counters::bump(&self.counters.ext_checksum_failures);
                    self.fault(format!("checksum mismatch at offset {}", loc.offset));
                }
                break;
            }
            out.len += 1;
        }
        if out.len > 0 {
            self.consecutive_faults.store(0, Relaxed);
            self.counters
                .ext_page_reads
                .fetch_add(out.len as u64, Relaxed);
            self.touch_region(first.offset);
        }
        Some(out)
    }

    /// Removes the entry if it still is `loc`. Returns whether it was.
    fn drop_entry(&self, key: PageKey, loc: Location) -> bool {
        let mut t = self.tables.write();
        if t.index.lookup(key) == Some(loc) {
            t.index.remove(key);
            true
        } else {
            false
        }
    }

    fn fault(self: &Arc<Self>, reason: String) {
        let n = self.consecutive_faults.fetch_add(1, Relaxed) + 1;
        if n >= EXTENSION_FAULT_LIMIT && !self.failed.swap(true, Relaxed) {
            *self.failure.lock() = Some(format!("{n} consecutive faults, last: {reason}"));
            self.host.failed(self);
        }
    }

    /// Set once repeated faults made the extension give up.
    pub fn failure(&self) -> Option<String> {
        if self.failed.load(Relaxed) {
            self.failure.lock().clone()
        } else {
            None
        }
    }

    /// Drops any copy of `key`, indexed or staged. Called before the data file is written.
    pub fn invalidate(&self, key: PageKey) {
        let mut t = self.tables.write();
        t.staged.remove(&key);
        t.index.remove(key);
    }

    /// Drops every copy of pages of `file` from `first_page` on (all files if None).
    pub fn invalidate_where(&self, file: Option<FileKey>, first_page: u64) {
        let hit = |k: PageKey| file.is_none_or(|f| k.file == f) && k.page >= first_page;
        let mut t = self.tables.write();
        t.staged.retain(|k, _| !hit(*k));
        t.index.remove_where(hit);
    }

    /// Every cached page with the time its region was last referenced.
    pub fn entries(&self) -> Vec<(PageKey, u64)> {
        let t = self.tables.read();
        t.index
            .entries()
            .map(|(region, key)| (key, self.region_last_ref[region].load(Relaxed)))
            .collect()
    }

    /// Stops admitting, waits for the writer's batch in flight, and deletes the file.
    pub fn shutdown(&self) {
        self.stopping.store(true, Relaxed);
        // Wakes the writer if it waits for pages; if the queue is full it is busy, and checks
        // `stopping` between batches (well under a second).
        let _ = self.staging.try_send(ToWriter::Stop);
        if !self
            .writer_done
            .wait_timeout(std::time::Duration::from_secs(10))
        {
            log::error!("buffer pool extension writer did not stop within 10 s");
        }
        self.file.file().remove();
    }

    /// Deletes the file without waiting for the writer (process exit, self-disable).
    pub fn remove_file_only(&self) {
        self.file.file().remove();
    }

    /// Pages staged and not yet written (or dropped).
    pub fn pending_writes(&self) -> usize {
        self.tables.read().staged.len()
    }

    /// The index never takes more memory than is charged for it (tests and soak runs).
    pub fn check_invariants(&self) {
        let bytes = self.tables.read().index.bytes() + self.regions as u64 * 8;
        assert!(
            bytes <= self.index_bytes(),
            "extension index takes {bytes} bytes, more than the {} charged",
            self.index_bytes()
        );
    }

    /// The descriptor of the file, to be closed in a forked child (see `Engine::after_fork`).
    pub(crate) fn raw_fd(&self) -> i32 {
        self.file.file().raw_fd()
    }
}

impl Drop for Extension {
    fn drop(&mut self) {
        self.stopping.store(true, Relaxed);
        self.file.file().remove();
    }
}

/// The block-aligned span covering `len` bytes at `offset`: (start, skip to the bytes, length).
fn aligned_span(offset: u64, len: usize) -> (u64, usize, usize) {
    let align = crate::config::DIRECT_IO_ALIGN;
    let start = round_down(offset, align as u64);
    let skip = (offset - start) as usize;
    (start, skip, round_up(skip + len, align))
}
