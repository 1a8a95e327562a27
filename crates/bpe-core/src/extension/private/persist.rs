//! Warm restart: the extension's index written to checkpoints, and read back by the next process
//! that enables an extension at the same path.
//!
//! - **Checkpoint** (`PrivateStore::checkpoint_files`): by the writer every few seconds while
//!   the index changes, and at a clean close. It records, for every data file whose cached
//!   pages the engine can vouch for, the stamp they were last verified against, read *before*
//!   the file's key: a change after that moment gives the file another stamp, so a checkpoint
//!   can only err towards dropping pages at restart, never towards keeping stale ones.
//! - **Restore** (`PrivateStore::restore_checkpoint`): by the writer of the next process, before
//!   it writes anything, while queries are served from RAM and the data files. The checkpoint's
//!   pages go to a waiting list per file identity; the writer continues the ring where the
//!   checkpoint left it, and each region it enters voids what the list says of that region.
//! - **Adoption** (`PrivateStore::adopt_file`): when this process opens a listed file (or at
//!   once for a file already open), with every write to the file held off. Its pages are indexed
//!   under the file's current key only if the file is provably as it was: the same identity, a
//!   stamp equal to the nanosecond (size, mtime, ctime), and its first page matching the checksum
//!   the checkpoint recorded of it (SQLite's header: the change counter of every commit); a
//!   checkpoint without one proves nothing. Anything else drops the file's pages. Every page is still read back against its checksum.

use super::restored::{Restored, RestoredFile};
use super::PrivateStore;
use crate::counters::Counters;
use crate::extension::checkpoint::{self, Checkpoint, PageCheck, SavedEntry, SavedFile, MAX_FILES};
use crate::extension::store::{FirstPage, Resident, Ring};
use crate::extension::{IndexStore, Location, Vouched, REGION_BYTES, UNIT};
use crate::io::{FaultyExtensionFile, FileIdentity, FileStamp};
use crate::page::{FileKey, PageKey};
use std::collections::HashMap;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

/// `PrivateStore::checkpoint_next` when the file holds no checkpoint in force.
pub(super) const NO_CHECKPOINT: usize = usize::MAX;

/// Entries indexed per hold of the tables' lock during an adoption: a short hold, so that
/// lookups waiting for the lock are not held up by the whole adoption.
const ADOPT_CHUNK: usize = 4096;

impl PrivateStore {
    /// Writes the index to the next checkpoint slot, for the `vouched` files (key, stamp), read
    /// stamp first, then key, before this call (see the module doc), marking the pages
    /// `resident` says are in RAM. Errors only cost warmth at the next start.
    pub(super) fn checkpoint_files(
        &self,
        ring: &Ring<'_>,
        vouched: Vouched,
        resident: Resident<'_>,
    ) {
        let mut generation = self.checkpoint_generation.lock();
        self.index_changed.store(false, Relaxed);
        let started = Instant::now();
        let mut files: Vec<SavedFile> = Vec::new();
        let mut by_key: HashMap<FileKey, u16> = HashMap::new();
        let mut entries = Vec::new();
        let mut keys = Vec::new();
        let capacity = checkpoint::entry_capacity(self.regions);
        let current = ring.writer_region;
        {
            let t = self.tables.read();
            for v in &vouched.files {
                if files.len() == MAX_FILES {
                    break;
                }
                by_key.insert(v.key, files.len() as u16);
                files.push(SavedFile {
                    stamp: v.stamp,
                    first_page: v.first_page,
                });
            }
            // Newest region first: if the slot runs out of room, the oldest pages are left out.
            'regions: for back in 0..self.regions {
                let region = (current + self.regions - back) % self.regions;
                for (key, loc) in t.index.region_entries(region) {
                    let Some(&file) = by_key.get(&key.file) else {
                        continue;
                    };
                    if entries.len() == capacity {
                        break 'regions;
                    }
                    // Only pages of the files vouched for, each where its region holds it:
                    // what a restore will take on trust once the file's stamp matches.
                    strict_assert!(loc.offset / REGION_BYTES == region as u64);
                    strict_assert!(loc.offset % REGION_BYTES + loc.len as u64 <= REGION_BYTES);
                    keys.push(key);
                    entries.push(SavedEntry {
                        file,
                        page: key.page as u32,
                        crc: loc.crc,
                        region: region as u32,
                        unit: ((loc.offset % REGION_BYTES) / UNIT as u64) as u16,
                        size_log2: loc.len.trailing_zeros() as u8,
                        hot: false,
                    });
                }
            }
            // Files this process never opened keep what the last checkpoint said of them (a
            // file listed above already, open and waiting for its adoption, is listed once).
            let listed: std::collections::HashSet<FileIdentity> =
                vouched.files.iter().map(|v| v.stamp.identity).collect();
            for r in t.restored.files.values() {
                if files.len() == MAX_FILES {
                    break;
                }
                if listed.contains(&r.stamp.identity) {
                    continue;
                }
                let file = files.len() as u16;
                files.push(SavedFile {
                    stamp: r.stamp,
                    first_page: r.first_page,
                });
                let room = capacity - entries.len();
                entries.extend(
                    r.entries
                        .iter()
                        .filter(|e| t.restored.live(e))
                        .take(room)
                        .map(|e| SavedEntry { file, ..*e }),
                );
            }
        }
        // The hot set: which of this process's pages are in RAM too (asked without the index
        // lock; a page that came or went meanwhile only makes the next start a little less warm).
        for (e, in_ram) in entries.iter_mut().zip(resident(&keys)) {
            e.hot = in_ram;
        }
        let c = Checkpoint {
            generation: *generation,
            next_region: (current + 1) % self.regions,
            files,
            entries,
        };
        let buf = c.encode(self.regions);
        let offset = checkpoint::slot_offset(self.regions, c.generation);
        match ring.file.write_at(offset, &buf) {
            Ok(()) => {
                *generation += 1;
                self.checkpoint_next.store(c.next_region, Relaxed);
                self.checkpointed_files
                    .store(vouched.fingerprint(), Relaxed);
                Counters::bump(&ring.counters.ext_checkpoints);
                log::debug!(
                    "buffer pool extension checkpoint {}: {} pages of {} files in {:?}",
                    c.generation,
                    c.entries.len(),
                    c.files.len(),
                    started.elapsed()
                );
            }
            // The slot may be torn and the other one holds the previous checkpoint, whose
            // bound on the writer (`checkpoint_next`) no longer holds: void both (best effort;
            // a file that refuses writes is on its way to being retired and deleted anyway).
            Err(e) => {
                log::warn!("buffer pool extension checkpoint not written: {e}");
                self.void_checkpoints(ring.file);
            }
        }
    }

    /// Reads the newest valid checkpoint, lists its pages for adoption, and returns the region
    /// the writer goes on from. Run by the writer before it writes anything.
    pub(super) fn restore_checkpoint(&self, ring: &Ring<'_>) -> usize {
        let started = Instant::now();
        // Headers first: only the newest slot's payload is read and decoded, the other one
        // only if the newest fails its checks (a torn last checkpoint).
        let mut heads: Vec<(u64, u64, usize)> = Vec::new();
        for slot in 0..2u64 {
            match self.read_slot_header(ring.file, slot) {
                Ok((generation, payload)) => heads.push((generation, slot, payload)),
                Err(why) => log::debug!("checkpoint slot {slot}: {why}"),
            }
        }
        heads.sort_unstable_by_key(|h| std::cmp::Reverse(h.0));
        let highest = heads.first().map(|h| h.0);
        let newest = heads.iter().find_map(|&(_, slot, payload)| {
            self.read_slot(ring.file, slot, payload)
                .map_err(|why| log::debug!("checkpoint slot {slot}: {why}"))
                .ok()
        });
        let Some(c) = newest else {
            log::info!(
                "buffer pool extension {}: no usable checkpoint, starting cold",
                ring.file.file().path().display()
            );
            return 0;
        };
        *self.checkpoint_generation.lock() = highest.unwrap_or(0).wrapping_add(1);
        // Grouped by the checkpoint's file index (no hashing per entry).
        let mut per_file: Vec<Vec<SavedEntry>> = vec![Vec::new(); c.files.len()];
        for e in &c.entries {
            per_file[e.file as usize].push(*e);
        }
        let files: HashMap<FileIdentity, RestoredFile> = c
            .files
            .iter()
            .zip(per_file)
            .map(|(f, entries)| {
                let r = RestoredFile {
                    stamp: f.stamp,
                    first_page: f.first_page,
                    entries,
                };
                (f.stamp.identity, r)
            })
            .collect();
        let mut restored = Restored {
            files,
            overwritten: vec![false; self.regions],
            entries: c.entries.len(),
            adopting: None,
        };
        // What the previous writer may have overwritten after this checkpoint (it was killed,
        // or closed: either way these are the ring's oldest regions, the next to go).
        for back in 0..checkpoint::unlisted_regions(self.regions) {
            restored.overwrite((c.next_region + back) % self.regions);
        }
        self.checkpoint_next.store(c.next_region, Relaxed);
        let bytes = restored.bytes();
        if !(ring.charge_more)(bytes) {
            ring.counters
                .ext_pages_not_restored
                .fetch_add(c.entries.len() as u64, Relaxed);
            log::warn!("buffer pool extension: no memory to restore the checkpoint's index");
            return c.next_region;
        }
        let waiting = restored.files.len();
        self.tables.write().restored = restored;
        self.waiting_files.store(waiting, Relaxed);
        log::info!(
            "buffer pool extension {}: checkpoint {} lists {} pages of {} files (read in {:?})",
            ring.file.file().path().display(),
            c.generation,
            c.entries.len(),
            c.files.len(),
            started.elapsed()
        );
        c.next_region
    }

    /// Overwrites both slots' headers: the next process starts cold.
    fn void_checkpoints(&self, file: &FaultyExtensionFile) {
        void_checkpoints(file, self.regions);
        self.checkpoint_next.store(NO_CHECKPOINT, Relaxed);
    }

    /// A checkpoint is due before the writer, entering `region` (already forgotten), goes
    /// further than the checkpoint in force lets a restore assume.
    pub(super) fn checkpoint_due_at(&self, region: usize) -> bool {
        let next = self.checkpoint_next.load(Relaxed);
        next != NO_CHECKPOINT
            && (region + self.regions - next) % self.regions
                >= checkpoint::unlisted_regions(self.regions)
    }

    /// A slot's generation and payload length, from its header alone.
    fn read_slot_header(
        &self,
        file: &FaultyExtensionFile,
        slot: u64,
    ) -> Result<(u64, usize), String> {
        let mut head = crate::io::AlignedBuf::new(4096);
        file.read_at(checkpoint::slot_offset(self.regions, slot), &mut head)
            .map_err(|e| e.to_string())?;
        Checkpoint::header(&head, self.regions)
    }

    /// A whole slot whose header claimed `payload` bytes, decoded and checked.
    fn read_slot(
        &self,
        file: &FaultyExtensionFile,
        slot: u64,
        payload: usize,
    ) -> Result<Checkpoint, String> {
        let mut whole = crate::io::AlignedBuf::new(4096 + payload);
        file.read_at(checkpoint::slot_offset(self.regions, slot), &mut whole)
            .map_err(|e| e.to_string())?;
        Checkpoint::decode(&whole, self.regions)
    }

    /// Indexes the checkpoint's pages of a file under `key` if the file is provably unchanged:
    /// `now` (its stamp now) equals the recorded one, and its first page matches the copy's
    /// checksum. The caller holds off every write to the file, and runs on the writer's thread
    /// (see `Extension::adopt`). Returns the adopted pages that were in the previous process's
    /// RAM (to read back into RAM), newest region first.
    pub(super) fn adopt_file(
        &self,
        ring: &Ring<'_>,
        key: FileKey,
        identity: FileIdentity,
        now: Option<FileStamp>,
        first_page: &mut dyn FirstPage,
    ) -> Vec<(PageKey, Location)> {
        let rec = {
            let mut t = self.tables.write();
            let rec = t.restored.take(identity);
            t.restored.adopting = rec.is_some().then_some(identity);
            rec
        };
        let Some(rec) = rec else {
            return Vec::new();
        };
        // A stamp that cannot be read, or of another inode (the file was replaced under its
        // name), proves nothing: none of its pages.
        let now = now.filter(|n| n.identity == identity);
        let hot = self.adopt_entries(ring, key, now, rec, first_page);
        let mut t = self.tables.write();
        t.restored.adopting = None;
        self.waiting_files
            .store(t.restored.files_waiting(), Relaxed);
        hot
    }

    /// `adopt` for the entries `rec` taken off the waiting list.
    fn adopt_entries(
        &self,
        ring: &Ring<'_>,
        key: FileKey,
        now: Option<FileStamp>,
        rec: RestoredFile,
        first_page: &mut dyn FirstPage,
    ) -> Vec<(PageKey, Location)> {
        let refuse = |why: &str| {
            ring.counters
                .ext_pages_not_restored
                .fetch_add(rec.entries.len() as u64, Relaxed);
            log::info!(
                "buffer pool extension: {} cached pages of a file (inode {}) not restored: {why}",
                rec.entries.len(),
                rec.stamp.identity.ino
            );
            Vec::new()
        };
        if now != Some(rec.stamp) {
            return refuse("the file changed while no bpe process had it open");
        }
        if rec.stamp.identity.is_snapshot() {
            // A snapshot's identity names content that never changes (its caller derives it
            // from the database's checksum at that transaction): nothing left to check.
            return self.index_adopted(ring, key, rec);
        }
        // The stamp alone never vouches (a write within a coarse clock tick can leave it as it
        // was): the first page must read as the copy the checkpoint recorded, from the ring or
        // from RAM.
        let ring_copy = {
            let t = self.tables.read();
            rec.entries
                .iter()
                .find(|e| e.page == 0 && t.restored.live(e))
                .map(|e| PageCheck {
                    len: e.len() as u32,
                    crc: e.crc,
                })
        };
        let Some(check) = ring_copy.or(rec.first_page) else {
            return refuse("the checkpoint has no copy of its first page to check it against");
        };
        if first_page.crc(check.len as usize) != Some(check.crc) {
            return refuse("its first page differs from the cached copy");
        }
        self.index_adopted(ring, key, rec)
    }

    /// Indexes the checked entries of `rec` under `key`; returns those that were in RAM.
    fn index_adopted(
        &self,
        ring: &Ring<'_>,
        key: FileKey,
        rec: RestoredFile,
    ) -> Vec<(PageKey, Location)> {
        // Index memory first (charging may evict from RAM, which offers pages to us). Only the
        // writer's thread grows the index (adoptions run there), so the room charged stays room.
        let mut counts = vec![0usize; self.regions];
        for e in &rec.entries {
            counts[e.region as usize] += 1;
        }
        let per_region: Vec<(usize, usize)> = counts
            .into_iter()
            .enumerate()
            .filter(|&(_, n)| n > 0)
            .collect();
        let grow = {
            let t = self.tables.read();
            t.index.bytes_after_adding(&per_region) - t.index.bytes()
        };
        if !(ring.charge_more)(grow) {
            ring.counters
                .ext_pages_not_restored
                .fetch_add(rec.entries.len() as u64, Relaxed);
            log::info!(
                "buffer pool extension: {} cached pages of a file (inode {}) not restored: the \
                 index has no memory left for them",
                rec.entries.len(),
                rec.stamp.identity.ino
            );
            return Vec::new();
        }
        self.tables.write().index.prepare_many(&per_region);
        let mut adopted = 0;
        let mut hot = Vec::new();
        // In chunks: the tables' lock is every L2 reader's, and a large file's adoption must
        // not stall the reads of the others. Only this thread grows the index, so the room
        // prepared stays room between chunks.
        for chunk in rec.entries.chunks(ADOPT_CHUNK) {
            let mut t = self.tables.write();
            let tables = &mut *t;
            for e in chunk {
                let page = PageKey::new(key, e.page as u64);
                if !tables.restored.live(e)
                    || tables.index.contains(page)
                    || tables.staged.contains(page)
                    || !tables.index.has_room(e.region as usize)
                {
                    continue;
                }
                tables.index.insert(
                    page,
                    e.region as usize,
                    e.offset_in_region(),
                    e.len(),
                    e.crc,
                    true,
                );
                adopted += 1;
                if e.hot {
                    hot.push((page, tables.index.lookup(page).expect("just indexed")));
                }
            }
        }
        self.index_changed.store(true, Relaxed);
        ring.counters
            .ext_pages_restored
            .fetch_add(adopted as u64, Relaxed);
        hot
    }
}

/// Overwrites both checkpoint slots' headers of a ring of `regions`: the next process to take
/// the file over starts cold (a shared extension's writers rewrite the ring, and a checkpoint a
/// private one left would, at a later private take-over, name pages its regions no longer hold).
pub(in crate::extension) fn void_checkpoints(file: &FaultyExtensionFile, regions: usize) {
    let blank = crate::io::AlignedBuf::new(4096);
    for slot in 0..2u64 {
        let _ = file.write_at(checkpoint::slot_offset(regions, slot), &blank);
    }
}
