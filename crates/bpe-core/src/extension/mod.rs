//! L2: the buffer pool extension. Clean pages leaving RAM are staged, written by a background
//! thread in large sequential batches into a ring of fixed-size slots, and read back at random,
//! in parallel, by whichever thread misses in RAM. Every read is checked against a crc32c kept in
//! RAM; any fault is a miss. The ring's oldest batch is overwritten first (FIFO), which keeps
//! every write sequential.

mod index;
mod writer;

pub use index::{ExtensionIndex, INDEX_BYTES_PER_SLOT_CAP};

use crate::config::{EXTENSION_BATCH_BYTES, EXTENSION_FAULT_LIMIT, EXTENSION_STAGING_PAGES};
use crate::counters::Counters;
use crate::io::extension_file::ExtensionFile;
use crate::io::{AlignedBuf, FaultInjector};
use crate::page::{FileId, PageKey};
use crate::pool::Frame;
use crate::Result;
use crossbeam_channel::{Sender, TrySendError};
use parking_lot::{Mutex, RwLock};
use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Instant;

/// Consecutive slots read in one request by [`Extension::read_run`]; the first `len` pages
/// passed their checksums.
pub struct Run {
    block: AlignedBuf,
    slot_size: usize,
    page_len: usize,
    pub len: usize,
}

impl Run {
    /// Page `i` of the run (verified when `i < len`).
    pub fn page(&self, i: usize) -> &[u8] {
        &self.block[i * self.slot_size..][..self.page_len]
    }
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
    file: ExtensionFile,
    slot_size: usize,
    slots: u32,
    tables: RwLock<Tables>,
    staging: Sender<Staged>,
    /// Signals once when the background writer has stopped.
    writer_done: Mutex<Option<crossbeam_channel::Receiver<()>>>,
    stopping: Arc<AtomicBool>,
    next_seq: AtomicU64,
    consecutive_faults: AtomicU32,
    failure: Mutex<Option<String>>,
    failed: AtomicBool,
    /// Last reference, in ms since `epoch`, per batch-sized region of the ring.
    region_last_ref: Vec<AtomicU64>,
    slots_per_region: u32,
    counters: Arc<Counters>,
    epoch: Instant,
}

/// Shape of an extension of `size` bytes made of `slot_size` slots.
pub fn geometry(size: u64, slot_size: usize) -> (u32, u32) {
    let slots = (size / slot_size as u64).min(u32::MAX as u64 - 1) as u32;
    let per_region = (EXTENSION_BATCH_BYTES / slot_size).max(1) as u32;
    (slots, per_region)
}

impl Extension {
    pub fn create(
        path: &Path,
        size: u64,
        slot_size: usize,
        counters: Arc<Counters>,
        faults: Arc<FaultInjector>,
        epoch: Instant,
    ) -> Result<Arc<Extension>> {
        let (slots, slots_per_region) = geometry(size, slot_size);
        let file = ExtensionFile::create(path, slots as u64 * slot_size as u64, faults)?;
        let (tx, rx) = crossbeam_channel::bounded(EXTENSION_STAGING_PAGES);
        let regions = slots.div_ceil(slots_per_region) as usize;
        let ext = Arc::new(Extension {
            file,
            slot_size,
            slots,
            tables: RwLock::new(Tables {
                index: ExtensionIndex::new(slots as usize),
                staged: HashMap::new(),
            }),
            staging: tx,
            writer_done: Mutex::new(None),
            stopping: Arc::new(AtomicBool::new(false)),
            next_seq: AtomicU64::new(1),
            consecutive_faults: AtomicU32::new(0),
            failure: Mutex::new(None),
            failed: AtomicBool::new(false),
            region_last_ref: (0..regions).map(|_| AtomicU64::new(0)).collect(),
            slots_per_region,
            counters,
            epoch,
        });
        let done = writer::spawn(ext.clone(), rx);
        *ext.writer_done.lock() = Some(done);
        Ok(ext)
    }

    pub fn path(&self) -> &Path {
        self.file.path()
    }
    pub fn slot_size(&self) -> usize {
        self.slot_size
    }
    pub fn slots(&self) -> u32 {
        self.slots
    }
    pub fn size_bytes(&self) -> u64 {
        self.slots as u64 * self.slot_size as u64
    }
    pub fn cached_pages(&self) -> usize {
        self.tables.read().index.len()
    }
    pub fn index_bytes(&self) -> u64 {
        self.tables.read().index.bytes() + self.region_last_ref.len() as u64 * 8
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// Offers a clean page (just read from the data file, or leaving RAM). Never blocks: if the writer is behind, the page is
    /// simply not admitted. A page whose unchanged copy is already here is not written again.
    pub fn admit(&self, frame: &Arc<Frame>) {
        if self.failed.load(Relaxed) || self.stopping.load(Relaxed) {
            return;
        }
        if frame.data.len() > self.slot_size || !ExtensionIndex::fits(frame.key) {
            Counters::bump(&self.counters.ext_admissions_dropped);
            return;
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
        match self.staging.try_send(staged) {
            Ok(()) => {
                t.staged.insert(frame.key, seq);
            }
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                Counters::bump(&self.counters.ext_admissions_dropped);
            }
        }
    }

    /// Reads a page into `buf` if a verified copy is here. Any fault is a miss (and is counted).
    pub fn read(&self, key: PageKey, buf: &mut [u8]) -> bool {
        if self.failed.load(Relaxed) {
            return false;
        }
        let Some((slot, crc)) = self.tables.read().index.lookup(key) else {
            return false;
        };
        if buf.len() > self.slot_size {
            return false;
        }
        let mut block = AlignedBuf::new(self.slot_size);
        self.counters.ext_outstanding_io.fetch_add(1, Relaxed);
        let res = self.file.read_at(
            slot as u64 * self.slot_size as u64,
            &mut block[..self.slot_size],
        );
        self.counters.ext_outstanding_io.fetch_sub(1, Relaxed);
        let page = &block[..buf.len()];
        match res {
            Err(e) => {
                Counters::bump(&self.counters.ext_io_errors);
                self.drop_entry(key, slot, crc);
                self.fault(format!("read error: {e}"));
                false
            }
            Ok(()) if crc32c::crc32c(page) != crc => {
                // The writer may have recycled the slot since we looked: that is a plain miss.
                // Only a slot that still claims to hold this page is corrupt.
                if self.drop_entry(key, slot, crc) {
                    Counters::bump(&self.counters.ext_checksum_failures);
                    self.fault(format!("checksum mismatch in slot {slot}"));
                }
                false
            }
            Ok(()) => {
                buf.copy_from_slice(page);
                self.consecutive_faults.store(0, Relaxed);
                Counters::bump(&self.counters.ext_page_reads);
                self.region_last_ref[(slot / self.slots_per_region) as usize]
                    .store(self.now_ms(), Relaxed);
                true
            }
        }
    }

    /// Reads the pages of `keys` that sit in the slots right after `after`'s, in one request:
    /// a scan over pages that were admitted in scan order. Returns the longest such run (a prefix
    /// of `keys`) in the buffer it was read into, its first `len` pages verified; a page that
    /// fails its checksum ends the run there, as a plain miss (its slot may have been recycled).
    pub fn read_run(&self, after: PageKey, keys: &[PageKey], page_len: usize) -> Option<Run> {
        if self.failed.load(Relaxed) || keys.is_empty() || page_len > self.slot_size {
            return None;
        }
        let run: Vec<(u32, u32)> = {
            let t = self.tables.read();
            let (first, _) = t.index.lookup(after)?;
            keys.iter()
                .map(|&k| t.index.lookup(k))
                .enumerate()
                .map_while(|(i, found)| found.filter(|(slot, _)| *slot == first + 1 + i as u32))
                .collect()
        };
        let &(start, _) = run.first()?;
        let mut block = AlignedBuf::new(self.slot_size * run.len());
        self.counters.ext_outstanding_io.fetch_add(1, Relaxed);
        let res = self
            .file
            .read_at(start as u64 * self.slot_size as u64, &mut block[..]);
        self.counters.ext_outstanding_io.fetch_sub(1, Relaxed);
        if let Err(e) = res {
            Counters::bump(&self.counters.ext_io_errors);
            self.fault(format!("read error: {e}"));
            return None;
        }
        let mut out = Run {
            block,
            slot_size: self.slot_size,
            page_len,
            len: 0,
        };
        for (i, &(slot, crc)) in run.iter().enumerate() {
            if crc32c::crc32c(out.page(i)) != crc {
                if self.drop_entry(keys[i], slot, crc) {
                    Counters::bump(&self.counters.ext_checksum_failures);
                    self.fault(format!("checksum mismatch in slot {slot}"));
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
            self.region_last_ref[(start / self.slots_per_region) as usize]
                .store(self.now_ms(), Relaxed);
        }
        Some(out)
    }

    /// Removes the entry if it still is (slot, crc). Returns whether it was.
    fn drop_entry(&self, key: PageKey, slot: u32, crc: u32) -> bool {
        let mut t = self.tables.write();
        if t.index.lookup(key) == Some((slot, crc)) {
            t.index.remove(key);
            true
        } else {
            false
        }
    }

    fn fault(&self, reason: String) {
        let n = self.consecutive_faults.fetch_add(1, Relaxed) + 1;
        if n >= EXTENSION_FAULT_LIMIT && !self.failed.swap(true, Relaxed) {
            *self.failure.lock() = Some(format!("{n} consecutive faults, last: {reason}"));
        }
    }

    /// Set once repeated faults made the extension give up; the engine then disables it.
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
    pub fn invalidate_where(&self, file: Option<FileId>, first_page: u64) {
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
            .map(|(slot, key)| {
                let r = (slot / self.slots_per_region) as usize;
                (key, self.region_last_ref[r].load(Relaxed))
            })
            .collect()
    }

    /// Stops admitting, waits for the writer's batch in flight, and deletes the file.
    pub fn shutdown(&self) {
        self.stopping.store(true, Relaxed);
        if let Some(done) = self.writer_done.lock().take() {
            // The writer checks `stopping` between batches: well under a second.
            match done.recv_timeout(std::time::Duration::from_secs(10)) {
                Ok(()) => {}
                Err(crossbeam_channel::RecvTimeoutError::Timeout) => {
                    log::error!("buffer pool extension writer did not stop within 10 s")
                }
                Err(crossbeam_channel::RecvTimeoutError::Disconnected) => {
                    log::error!("buffer pool extension writer ended abnormally")
                }
            }
        }
        self.file.remove();
    }
}

impl Drop for Extension {
    fn drop(&mut self) {
        self.stopping.store(true, Relaxed);
        self.file.remove();
    }
}

impl Extension {
    /// Deletes the file without waiting for the writer (process exit).
    pub fn remove_file_only(&self) {
        self.file.remove();
    }
}

impl Extension {
    /// Pages staged and not yet written (or dropped).
    pub fn pending_writes(&self) -> usize {
        self.tables.read().staged.len()
    }
}
