//! L2: the buffer pool extension. Clean pages are staged, written by a background thread in
//! large sequential batches into a ring of regions, and read back at random, in parallel, by
//! whichever thread misses in RAM. A page takes exactly its own size, so any mix of page sizes
//! shares one extension. Every read is checked against a crc32c of the page's identity and bytes
//! kept in RAM; any fault is a miss. The ring's oldest region is overwritten first (FIFO), which
//! keeps every write sequential. A private extension's index is checkpointed into the file, and
//! the next process to enable an extension at the same path starts warm from it
//! (`private/persist.rs`).

mod checkpoint;
mod index;
mod private;
pub mod shared;
mod store;
mod writer;

pub use checkpoint::{regions_for, PageCheck};
pub use index::{page_crc, ExtensionIndex, IndexStore, Location, UNIT};

use crate::config::{EXTENSION_BATCH_BYTES, EXTENSION_FAULT_LIMIT, EXTENSION_STAGING_PAGES};
use crate::counters::Counters;
use crate::error::Result;
use crate::files::FileHandle;
use crate::io::aligned::Scratch;
use crate::io::aligned::{is_block_aligned, round_down, round_up};
use crate::io::extension_file::ExtensionFile;
use crate::io::{FaultInjector, FaultyExtensionFile};
use crate::io::{FileIdentity, FileStamp};
use crate::page::{FileKey, PageKey};
use crate::pool::Frame;
use crate::sync::channel::{Sender, TrySendError};
use crate::sync::{Latch, Mutex, Rank};
use private::PrivateStore;
use shared::{Geometry, SharedIndex, SharedRead, SharedStore};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Instant;
use store::{FirstPage, L2Store, Ring};

pub use store::StoreView;

/// Bytes of one region of the ring: one write batch.
pub const REGION_BYTES: u64 = EXTENSION_BATCH_BYTES as u64;
/// The smallest extension: two regions (the writer fills one while the other holds pages) and
/// the checkpoint slots, in whole regions.
pub const MIN_EXTENSION_BYTES: u64 =
    checkpoint::file_bytes(2).div_ceil(REGION_BYTES) * REGION_BYTES;

/// The size an extension asked for `size` bytes has: whole regions (the file is that long; the
/// ring and its checkpoint slots fit in it).
pub const fn effective_size(size: u64) -> u64 {
    size - size % REGION_BYTES
}

/// What the extension needs from the engine that owns it.
pub trait ExtensionHost: Send + Sync {
    /// Charges `bytes` of index memory against max server memory, evicting from RAM to make
    /// room; false when that would exceed the index's budget.
    fn charge_index(&self, bytes: u64) -> bool;
    /// The extension gave up after repeated faults: the engine retires it.
    fn failed(&self, ext: &Arc<Extension>);
    /// Every data file whose cached pages can be vouched for now (see [`Vouched`]).
    fn vouched_files(&self) -> Vouched;
    /// A checkpoint was restored: offer the files open now for adoption (on this thread).
    fn adopt_open_files(&self, ext: &Arc<Extension>);
    /// How often to checkpoint the index while it changes.
    fn checkpoint_interval(&self) -> std::time::Duration;
    /// Which of `keys` are resident in RAM now (a checkpoint marks them, and the next process
    /// reads them back into RAM first).
    fn resident(&self, keys: &[PageKey]) -> Vec<bool>;
}

/// The data files a checkpoint may record: each one's key and the stamp its cached pages were
/// last verified against, the stamp read before the key (see `private/persist.rs`).
#[derive(Default)]
pub struct Vouched {
    pub files: Vec<VouchedFile>,
}

/// One data file a checkpoint may record.
#[derive(Clone, Copy, Debug, Hash)]
pub struct VouchedFile {
    pub key: FileKey,
    pub stamp: FileStamp,
    /// Its first page as RAM holds it (None if RAM does not): adoption compares the file's.
    pub first_page: Option<checkpoint::PageCheck>,
}

impl Vouched {
    /// Changes whenever a file, its key or its stamp does: a checkpoint is due then even if the
    /// index did not change (a write to a page not in the extension changes the file's stamp;
    /// a stamp that was within a clock tick of a change becomes one to vouch for).
    pub fn fingerprint(&self) -> u64 {
        use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
        BuildHasherDefault::<DefaultHasher>::default().hash_one(&self.files)
    }
}

/// Work the writer's thread runs for others (adoptions: only that thread grows the index).
type Chore = Box<dyn FnOnce() + Send>;

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
    /// Chores are waiting (see `Extension::request_adoption`).
    Chores,
    /// Stop now (the extension is being disabled).
    Stop,
}

/// A page waiting for the background writer.
struct Staged {
    key: PageKey,
    seq: u64,
    frame: Arc<Frame>,
    /// What its read was made under, for a shared extension.
    shared: Option<SharedRead>,
}

pub struct Extension {
    file: FaultyExtensionFile,
    /// Bytes of the file (the effective size).
    size: u64,
    regions: usize,
    /// Where pages are indexed: this process's own index, or one shared with other processes.
    store: Box<dyn L2Store>,
    staging: Sender<ToWriter>,
    /// Set once when the background writer has stopped.
    writer_done: Arc<Latch>,
    stopping: AtomicBool,
    /// Set by a clean close: the writer writes what is still queued before it stops.
    drain_at_close: AtomicBool,
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
    /// The region the writer is filling.
    writer_region: AtomicUsize,
    /// Chores for the writer's thread, and how many are asked for and not done.
    chores: Mutex<Vec<Chore>>,
    chores_pending: AtomicUsize,
    /// Set once the writer has restored the file's checkpoint (at once for a new file).
    restore_done: AtomicBool,
    /// Microseconds the restore took: the checkpoint read and listed, the open files adopted.
    restore_micros: AtomicU64,
}

/// Index bytes an extension of `size` bytes starts with (sized for 4 KiB pages).
pub fn initial_index_bytes(size: u64) -> u64 {
    let regions = regions_for(size);
    ExtensionIndex::bytes_for(regions, REGION_BYTES) + regions as u64 * 8
}

impl Extension {
    /// Opens the extension at `path`: a file a previous process of ours left there (of this
    /// size) is taken over and restored from its checkpoint in the background; otherwise a new
    /// file is made (see `ExtensionFile::open`).
    pub fn open(
        path: &Path,
        size: u64,
        counters: Arc<Counters>,
        faults: Arc<FaultInjector>,
        host: Arc<dyn ExtensionHost>,
        epoch: Instant,
        shared: bool,
    ) -> Result<Arc<Extension>> {
        let size = effective_size(size);
        let regions = regions_for(size);
        let (file, reused, store): (_, _, Box<dyn L2Store>) = if shared {
            let file = ExtensionFile::open_shared(path, size)?;
            let index = SharedIndex::attach(path, Geometry::new(regions, REGION_BYTES))?;
            (file, false, Box::new(SharedStore::new(index)))
        } else {
            let (file, reused) = ExtensionFile::open(path, size)?;
            (file, reused, Box::new(PrivateStore::new(regions)))
        };
        let file = FaultyExtensionFile::new(file, faults);
        if shared {
            // A shared extension keeps no checkpoint (its writers rewrite the ring) and voids
            // any left here: one a private extension left would, at the next private take-over,
            // name pages its regions no longer hold.
            private::void_checkpoints(&file, regions);
        }
        let (tx, rx) = crate::sync::channel::bounded(EXTENSION_STAGING_PAGES);
        let ext = Arc::new(Extension {
            file,
            size,
            regions,
            store,
            staging: tx,
            writer_done: Arc::new(Latch::default()),
            stopping: AtomicBool::new(false),
            drain_at_close: AtomicBool::new(false),
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
            writer_region: AtomicUsize::new(0),
            chores: Mutex::new(Rank::Leaf, Vec::new()),
            chores_pending: AtomicUsize::new(0),
            restore_done: AtomicBool::new(!reused),
            restore_micros: AtomicU64::new(0),
        });
        writer::spawn(ext.clone(), rx, ext.writer_done.clone(), reused);
        Ok(ext)
    }

    /// Runs `chore` on the writer's thread (soon: it looks between batches and when idle).
    pub fn request_adoption(&self, chore: impl FnOnce() + Send + 'static) {
        self.chores_pending.fetch_add(1, Relaxed);
        self.chores.lock().push(Box::new(chore));
        // If the queue is full the writer is busy, and looks at its chores between batches.
        let _ = self.staging.try_send(ToWriter::Chores);
    }

    fn drop_chores(&self) {
        let dropped = std::mem::take(&mut *self.chores.lock());
        self.chores_pending.fetch_sub(dropped.len(), Relaxed);
    }

    fn run_chores(&self) {
        let chores = std::mem::take(&mut *self.chores.lock());
        for chore in chores {
            chore();
            self.chores_pending.fetch_sub(1, Relaxed);
        }
    }

    /// How long the restore took (the checkpoint read and listed, the files open then adopted),
    /// once it is done; None for a new file or before.
    pub fn restore_time(&self) -> Option<std::time::Duration> {
        let us = self.restore_micros.load(Relaxed);
        (self.restore_done.load(Relaxed) && us > 0).then(|| std::time::Duration::from_micros(us))
    }

    /// True once the checkpoint is restored and every adoption asked for has run.
    pub fn restore_settled(&self) -> bool {
        self.restore_done.load(Relaxed) && self.chores_pending.load(Relaxed) == 0
    }

    pub fn path(&self) -> &Path {
        self.file.file().path()
    }
    /// Bytes of the file (the ring and its checkpoint slots fit in it).
    pub fn size_bytes(&self) -> u64 {
        self.size
    }
    /// Bytes of the ring, where pages go.
    pub fn ring_bytes(&self) -> u64 {
        self.regions as u64 * REGION_BYTES
    }
    pub fn identity(&self) -> crate::io::FileIdentity {
        self.file.file().identity()
    }
    /// What the extension holds and who shares it (see [`StoreView`]).
    pub fn view(&self) -> StoreView {
        self.store.view()
    }
    /// Other processes that have the extension open now (0 for a private one).
    pub fn others_attached(&self) -> usize {
        self.store.others_attached()
    }
    /// How long this process waited for the shared index's lock, each time it took it (None for
    /// a private extension).
    pub fn lock_wait(&self) -> Option<crate::counters::HistogramSnapshot> {
        self.store.lock_wait()
    }
    /// Takes the shared extension's lock and stops this process holding it (see
    /// `SharedIndex::stop_holding_the_lock`); false, without stopping, if it is not shared.
    #[cfg(feature = "testing")]
    pub fn stop_holding_the_lock(&self) -> bool {
        self.store.stop_holding_the_lock()
    }
    pub fn is_shared(&self) -> bool {
        self.sharing().is_shared()
    }

    pub fn sharing(&self) -> crate::config::Sharing {
        self.store.sharing()
    }

    /// For a shared extension, what a read of `key` is made under (see `SharedRead`): taken
    /// before the read. None for a private one.
    pub fn read_under(&self, file: &FileHandle, key: PageKey) -> Option<SharedRead> {
        self.store.read_under(file, key)
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
    /// page whose unchanged copy is already here is not written again, unless it was read from
    /// that copy and the copy is in the older half of the ring ([`Extension::nears_the_tail`]).
    /// Only a copy that served a read is renewed: a page read from the data file was admitted
    /// then, and renewing its copy as it leaves RAM too wrote every page twice where the ring
    /// turns within L1's residence time (a scan a little larger than a small ring: no hit left).
    pub fn admit(&self, frame: &Arc<Frame>) {
        // Clean pages only: a dirty frame's bytes are not in the data file yet (the pool never
        // evicts one; this is where the invariant is checked).
        debug_assert!(
            !frame.is_dirty(),
            "a dirty page was offered to the extension"
        );
        if frame.is_dirty() {
            return;
        }
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
        let seq = self.next_seq.fetch_add(1, Relaxed);
        // Staged before it is sent: the writer indexes only what is still staged.
        if !self.store.stage(frame, seq, &|copy| {
            !(frame.from_extension && self.nears_the_tail(copy))
        }) {
            return;
        }
        let staged = Staged {
            key: frame.key,
            seq,
            frame: frame.clone(),
            shared: frame.shared(),
        };
        match self.staging.try_send(ToWriter::Page(staged)) {
            Ok(()) => {}
            Err((TrySendError::Full, _)) => {
                self.store.unstage(frame.key, seq);
                self.drop_admission(1, || {
                    format!(
                        "the writer is behind ({EXTENSION_STAGING_PAGES} pages waiting): pages \
                         are offered again when they leave RAM"
                    )
                });
            }
            Err((TrySendError::Disconnected, _)) => self.store.unstage(frame.key, seq),
        }
    }

    /// Whether a copy of `key` is indexed here (not verified: a read may still miss).
    pub fn holds(&self, key: PageKey) -> bool {
        !self.failed.load(Relaxed) && self.store.locate(key).is_some()
    }

    /// Reads a page into `buf` if a verified copy is here. Any fault is a miss (and is counted).
    /// `buf` is left as it was on a miss.
    pub fn read(self: &Arc<Self>, key: PageKey, buf: &mut [u8]) -> bool {
        self.read_into(key, buf, false)
    }

    /// As [`Extension::read`], but the request reads straight into `buf` where it can (an
    /// aligned `buf`, such as a slot of L1's slab, and a copy on whole blocks of the file),
    /// and the checksum is checked there: no copy out of a buffer of its own. On a miss `buf`
    /// holds whatever was read (bytes that failed their checksum, say): the caller must not use
    /// it, and reads the page elsewhere into the same buffer.
    pub fn read_in_place(self: &Arc<Self>, key: PageKey, buf: &mut [u8]) -> bool {
        self.read_into(key, buf, true)
    }

    fn read_into(self: &Arc<Self>, key: PageKey, buf: &mut [u8], in_place: bool) -> bool {
        if self.failed.load(Relaxed) {
            return false;
        }
        let Some(store::Hit {
            location: loc,
            theirs,
        }) = self.store.locate(key)
        else {
            return false;
        };
        if loc.len != buf.len() {
            return false;
        }
        let (start, skip, len) = aligned_span(loc.offset, loc.len);
        let direct = in_place && skip == 0 && len == loc.len && is_block_aligned(start, buf);
        let mut block = None;
        let res = if direct {
            self.read_request(start, buf)
        } else {
            let block = block.insert(Scratch::new(len));
            self.read_request(start, &mut block[..len])
        };
        let page: &[u8] = match &block {
            Some(block) => &block[skip..skip + loc.len],
            None => buf,
        };
        let res = res.map(|()| page_crc(key.page, page) == loc.crc);
        match res {
            Err(e) => {
                Counters::bump(&self.counters.ext_io_errors);
                self.drop_entry(key, loc);
                self.fault(format!("read error: {e}"));
                false
            }
            Ok(false) => {
                // The writer may have reused the region since we looked, or (for a restored
                // entry) the previous process's writer did after its checkpoint: a plain miss.
                // Only a written entry that still claims this place is corrupt.
                if self.drop_entry(key, loc) && !loc.restored {
                    Counters::bump(&self.counters.ext_checksum_failures);
                    self.fault(format!("checksum mismatch at offset {}", loc.offset));
                }
                false
            }
            Ok(true) => {
                if let Some(block) = &block {
                    buf.copy_from_slice(&block[skip..skip + loc.len]);
                }
                self.consecutive_faults.store(0, Relaxed);
                Counters::bump(&self.counters.ext_page_reads);
                if theirs {
                    Counters::bump(&self.counters.ext_shared_page_reads);
                }
                self.touch_region(loc.offset);
                true
            }
        }
    }

    /// Reads `len` bytes of the ring at `offset` in one request (for the restart's prewarm);
    /// returns the block and where the bytes start in it. The caller checks every page in it
    /// with [`Extension::verified`].
    pub fn read_span(&self, offset: u64, len: usize) -> Option<(Scratch, usize)> {
        if self.failed.load(Relaxed) {
            return None;
        }
        let (start, skip, total) = aligned_span(offset, len);
        let mut block = Scratch::new(total);
        match self.read_request(start, &mut block[..total]) {
            Ok(()) => Some((block, skip)),
            Err(e) => {
                Counters::bump(&self.counters.ext_io_errors);
                log::warn!("buffer pool extension: prewarm read failed: {e}");
                None
            }
        }
    }

    /// Whether `bytes` are the copy of `key` the index places at `loc` (still indexed so, and
    /// matching its checksum); counted as a page read if so.
    pub fn verified(&self, key: PageKey, loc: Location, bytes: &[u8]) -> bool {
        let ok = bytes.len() == loc.len
            && page_crc(key.page, bytes) == loc.crc
            && self.store.locate(key).map(|h| h.location) == Some(loc);
        if ok {
            Counters::bump(&self.counters.ext_page_reads);
        }
        ok
    }

    /// One read request to the file, counted as outstanding while it runs and timed.
    fn read_request(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        let c = &self.counters;
        c.ext_outstanding_io.fetch_add(1, Relaxed);
        let started = Instant::now();
        let res = self.file.read_at(offset, buf);
        let took = started.elapsed();
        c.ext_read_micros
            .fetch_add(took.as_micros() as u64, Relaxed);
        c.ext_read_latency.record(took);
        c.ext_read_requests.fetch_add(1, Relaxed);
        c.ext_outstanding_io.fetch_sub(1, Relaxed);
        res
    }

    /// Whether a copy at `location` is in the older half of the ring, the half the writer
    /// overwrites next. The ring is written in order (FIFO), so a page that is read again and
    /// again, from here into RAM and out, would otherwise keep its first copy until the ring
    /// overwrites it, however much of the ring is dead copies of rewritten pages, and its next
    /// read would go to the data file: with a write-heavy load the ring turns over in seconds
    /// (TPC-C with an extension twice the database turns it over in well under a minute, every
    /// rewritten page leaving a dead copy). Offered as it leaves RAM again, such a page is written anew
    /// at the head instead, as log-structured caches reinsert what is still used; a page not
    /// read in half a turn of the ring still ages out. Costs one more page in a sequential
    /// batch, at most once per half turn per page.
    fn nears_the_tail(&self, location: Location) -> bool {
        // A shared ring's is its head, where every process's writer claims regions: this
        // process's own position says nothing of how far the others have gone.
        let Some(tail) = self.store.ring_tail() else {
            return false;
        };
        let region = (location.offset / REGION_BYTES) as usize;
        // 0 for the region overwritten next, regions - 1 for the one written last.
        let from_tail = (region + self.regions - tail % self.regions) % self.regions;
        from_tail * 2 < self.regions
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
        let run = self.store.locate_run(after, keys, page_len);
        let first = run.first()?;
        let (start, skip, len) = aligned_span(first.location.offset, page_len * run.len());
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
        for (i, hit) in run.iter().enumerate() {
            let loc = &hit.location;
            if page_crc(keys[i].page, out.page(i)) != loc.crc {
                if self.drop_entry(keys[i], *loc) && !loc.restored {
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
            let theirs = run.iter().take(out.len).filter(|h| h.theirs).count();
            self.counters
                .ext_shared_page_reads
                .fetch_add(theirs as u64, Relaxed);
            self.touch_region(first.location.offset);
        }
        Some(out)
    }

    /// Removes the entry if it still is `loc`. Returns whether it was.
    fn drop_entry(&self, key: PageKey, loc: Location) -> bool {
        self.store.drop_if(key, loc)
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

    /// Drops any copy of page `key` of `file`, indexed or staged, before the data file is
    /// written: for every process if the extension is shared.
    pub fn invalidate_page(&self, file: &FileHandle, key: PageKey) {
        self.store.invalidate(file, key);
    }

    /// The page's bytes are in the data file now (a shared extension invalidates it again: a
    /// read that overlapped the write could have staged the old bytes under the new epoch).
    pub fn written(&self, file: &FileHandle, key: PageKey) {
        self.store.written(file, key);
    }

    /// The page's bytes are in the data file now, after a write through or a write-back: a
    /// shared extension is told again (see [`Extension::written`]), and the answer is the epoch
    /// a copy of those bytes is current under (None for a private extension).
    pub fn now_written(&self, file: &FileHandle, key: PageKey) -> Option<SharedRead> {
        self.written(file, key);
        self.read_under(file, key)
    }

    /// Records what the next process may take on trust (see `L2Store::persist`).
    pub(super) fn persist(&self, if_changed: bool) {
        let vouched = self.host.vouched_files();
        self.with_ring(|ring| {
            self.store
                .persist(ring, vouched, &|keys| self.host.resident(keys), if_changed)
        });
    }

    /// Runs `f` with what the store's persistence, restore and adoption use of the extension.
    fn with_ring<R>(&self, f: impl FnOnce(&Ring<'_>) -> R) -> R {
        f(&Ring {
            file: &self.file,
            counters: &self.counters,
            writer_region: self.writer_region.load(Relaxed),
            charge_more: &|more| self.charge_more(more),
        })
    }

    /// Takes over what the previous process left (the writer, before it writes anything);
    /// returns the region the writer goes on from.
    fn restore(&self) -> usize {
        self.with_ring(|ring| self.store.restore(ring))
    }

    /// Before a miss of `file` goes to the data file: while the restore runs, or while this
    /// file's pages wait for adoption, waits for them (up to a second), and says whether it
    /// waited (then the page is worth looking up again): a restored copy here is worth more than
    /// a read of the slow device, and the restore takes tens of milliseconds per GiB. Once
    /// nothing waits, this is two atomic loads.
    pub fn await_restore(&self, file: FileIdentity) -> bool {
        let pending = || !self.restore_done.load(Relaxed) || self.waits_for_adoption(file);
        if !pending() {
            return false;
        }
        let deadline = Instant::now() + std::time::Duration::from_secs(1);
        while pending() && Instant::now() < deadline && !self.stopping.load(Relaxed) {
            crate::sync::pause();
        }
        true
    }

    /// Whether pages of some file still wait for adoption.
    pub fn has_waiting_files(&self) -> bool {
        self.store.has_waiting_files()
    }

    /// Whether pages of `file` wait for adoption (one atomic load once none do).
    fn waits_for_adoption(&self, file: FileIdentity) -> bool {
        self.has_waiting_files() && self.has_restored(file)
    }

    /// The stamp the last checkpoint recorded for a file whose pages wait (fault injection).
    pub(crate) fn recorded_stamp(&self, file: FileIdentity) -> Option<FileStamp> {
        self.store.recorded_stamp(file)
    }

    /// Whether the last checkpoint lists pages of this file that are still waiting.
    pub fn has_restored(&self, file: FileIdentity) -> bool {
        self.store.has_restored(file)
    }

    /// Indexes the checkpoint's pages of a file under `key` if the file is provably unchanged:
    /// `now` (its stamp now) equals the recorded one, and its first page matches the copy's
    /// checksum. The caller holds off every write to the file, and runs on the writer's thread
    /// (see `Extension::request_adoption`). Returns the adopted pages that were in the previous
    /// process's RAM (to read back into RAM), newest region first.
    pub fn adopt(
        &self,
        key: FileKey,
        identity: FileIdentity,
        now: Option<FileStamp>,
        mut first_page: impl FirstPage,
    ) -> Vec<(PageKey, Location)> {
        self.with_ring(|ring| self.store.adopt(ring, key, identity, now, &mut first_page))
    }

    /// Drops every copy of pages of `file` from `first_page` on (all files if None). A shared
    /// extension forgets the whole file, for every process. False: a shared extension whose
    /// lock a stopped process holds is emptied at this process's next lock instead.
    pub fn invalidate_where(&self, file: Option<FileKey>, first_page: u64) -> bool {
        self.store.forget(file, first_page)
    }

    /// Every cached page with the time its region was last referenced and, in a shared
    /// extension, the pid of the other process that loaded it.
    pub fn entries(&self) -> Vec<(PageKey, u64, Option<u32>)> {
        self.store
            .entries(&|region| self.region_last_ref[region].load(Relaxed))
    }

    /// Stops admitting, waits for the writer's batch in flight, and deletes the file (the
    /// operator's OFF, a resize, a retirement after faults).
    pub fn shutdown(&self) {
        self.stop_writer();
        self.store.shut_down(self.file.file());
    }

    /// Stops the writer, writes a last checkpoint of the `vouched` files' pages, those in RAM
    /// marked (see [`Extension::checkpoint_files`]), and keeps the file, for the next process to start warm
    /// from (the engine closes; the process exits).
    pub fn close(&self, vouched: Vouched, resident: store::Resident<'_>) {
        self.drain_at_close.store(true, Relaxed);
        if !self.stop_writer() {
            return; // a writer still running could overwrite what the next process restores
        }
        if !self.failed.load(Relaxed) {
            self.with_ring(|ring| self.store.persist(ring, vouched, resident, false));
        }
        self.store.close(self.file.file());
    }

    /// True once the writer has stopped (it is waited for up to 10 s).
    fn stop_writer(&self) -> bool {
        self.stopping.store(true, Relaxed);
        // A participant stopped holding a shared lock would keep the writer waiting for it (in
        // a claim, a publication, a seal) past the wait below.
        self.store.stop_waiting();
        // Wakes the writer if it waits for pages; if the queue is full it is busy, and checks
        // `stopping` between batches (well under a second).
        let _ = self.staging.try_send(ToWriter::Stop);
        if !self
            .writer_done
            .wait_timeout(std::time::Duration::from_secs(10))
        {
            log::error!("buffer pool extension writer did not stop within 10 s");
            return false;
        }
        true
    }

    /// Pages staged and not yet written (or dropped).
    pub fn pending_writes(&self) -> usize {
        self.store.staged()
    }

    /// Raises the index memory charged against max server memory to `needed` bytes (it never
    /// lowers it); false if the host cannot make room. The charge is claimed before the host
    /// lowers L1's target, so that a concurrent recomputation of that target (max server memory
    /// less this charge: an operator's memory change, an enable) never works from the old,
    /// smaller charge and leaves the two summing above the bound. Shuttle found that order.
    fn charge(&self, needed: u64) -> bool {
        let before = self.charged.fetch_max(needed, Relaxed);
        if needed <= before || self.host.charge_index(needed) {
            return true;
        }
        // Refused: give the claim back unless it was raised meanwhile.
        let _ = self
            .charged
            .compare_exchange(needed, before, Relaxed, Relaxed);
        false
    }

    /// RAM the index, its per-region times and the restored pages waiting for adoption take.
    fn index_footprint(&self) -> u64 {
        self.store.footprint() + self.regions as u64 * 8
    }

    /// Charges `more` bytes of index memory on top of what the index and the waiting list take.
    fn charge_more(&self, more: u64) -> bool {
        self.charge(self.index_footprint() + more)
    }

    /// The index never takes more memory than is charged for it (tests and soak runs).
    pub fn check_invariants(&self) {
        let bytes = self.index_footprint();
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

    /// The shared extension's participant lock descriptor (-1 if not shared), likewise.
    pub(crate) fn raw_lock_fd(&self) -> i32 {
        self.store.lock_fd().unwrap_or(-1)
    }
}

impl Drop for Extension {
    fn drop(&mut self) {
        // The file stays unless `shutdown` removed it: `close` left it for the next process.
        self.stopping.store(true, Relaxed);
    }
}

/// The block-aligned span covering `len` bytes at `offset`: (start, skip to the bytes, length).
fn aligned_span(offset: u64, len: usize) -> (u64, usize, usize) {
    let align = crate::config::DIRECT_IO_ALIGN;
    let start = round_down(offset, align as u64);
    let skip = (offset - start) as usize;
    (start, skip, round_up(skip + len, align))
}
