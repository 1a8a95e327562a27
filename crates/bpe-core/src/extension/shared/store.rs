//! The shared store: the extension's index in shared memory, with every process that has the
//! file open (see `shared/mod.rs` for the protocol, `store.rs` for the interface).
//!
//! A page is staged here only with what its read was made under in this attachment, and is
//! published only if its write epoch has not moved since: a process that wrote the page
//! meanwhile (this one or another) has moved it, whichever staging map the page was in.

use super::{Admission, Attached, Claim, SharedIndex};
use crate::config::Sharing;
use crate::counters::HistogramSnapshot;
use crate::extension::store::{
    Entered, FirstPage, Hit, L2Store, Resident, Ring, Staging, StoreView, Written,
};
use crate::extension::{Location, Vouched};
use crate::files::FileHandle;
use crate::io::extension_file::ExtensionFile;
use crate::io::{FileIdentity, FileStamp};
use crate::page::{FileKey, PageKey, SharedRead};
use crate::pool::Frame;
use crate::sync::{Mutex, Rank};

pub(crate) struct SharedStore {
    attached: Attached,
    staged: Mutex<Staging>,
    /// The region this process's writer fills (the ring is everyone's), if it holds one. Only
    /// the writer's thread sets it.
    claim: Mutex<Option<Claim>>,
}

impl SharedStore {
    pub fn new(index: SharedIndex) -> SharedStore {
        SharedStore {
            attached: Attached::new(index),
            staged: Mutex::new(Rank::ExtensionTables, Staging::default()),
            claim: Mutex::new(Rank::Leaf, None),
        }
    }

    /// The claim held, copied out (the shared index's lock is never taken under this one).
    fn claim(&self) -> Option<Claim> {
        *self.claim.lock()
    }
}

impl L2Store for SharedStore {
    fn sharing(&self) -> Sharing {
        Sharing::Shared
    }

    fn view(&self) -> StoreView {
        let s = self.attached.index.stats();
        StoreView {
            pages: s.pages as usize,
            bytes: s.bytes,
            participants: s.participants,
            recoveries: s.recoveries,
            lock_timeouts: s.lock_timeouts,
            shared_memory_bytes: s.resident_bytes,
        }
    }

    fn others_attached(&self) -> usize {
        self.attached.index.others_attached()
    }

    fn lock_wait(&self) -> Option<HistogramSnapshot> {
        Some(self.attached.index.lock_wait())
    }

    fn locate(&self, key: PageKey) -> Option<Hit> {
        self.attached.locate(key).map(|hit| Hit {
            location: hit.location,
            theirs: !hit.mine,
        })
    }

    /// One lookup (and one hold of the shared lock) per page.
    fn locate_run(&self, after: PageKey, keys: &[PageKey], page_len: usize) -> Vec<Hit> {
        let Some(first) = self.locate(after) else {
            return Vec::new();
        };
        let mut next = first.location.offset + first.location.len as u64;
        keys.iter()
            .map_while(|&k| {
                let hit = self
                    .locate(k)
                    .filter(|h| h.location.offset == next && h.location.len == page_len)?;
                next += page_len as u64;
                Some(hit)
            })
            .collect()
    }

    fn drop_if(&self, key: PageKey, location: Location) -> bool {
        self.attached.drop_if(key, location)
    }

    fn read_under(&self, file: &FileHandle, key: PageKey) -> Option<SharedRead> {
        self.attached.read_under(file, key)
    }

    fn stage(&self, frame: &Frame, seq: u64, keep: &dyn Fn(Location) -> bool) -> bool {
        // Without what its read was made under (in this attachment: names and epochs of an
        // earlier one mean nothing here), a copy cannot be shown current to others.
        if !frame.shared().is_some_and(|r| self.attached.made_here(&r))
            || self
                .attached
                .locate(frame.key)
                .is_some_and(|h| keep(h.location))
        {
            return false;
        }
        let mut staged = self.staged.lock();
        if staged.contains(frame.key) {
            return false;
        }
        staged.insert(frame.key, seq);
        true
    }

    fn unstage(&self, key: PageKey, seq: u64) {
        self.staged.lock().take(key, seq);
    }

    fn staged(&self) -> usize {
        self.staged.lock().len()
    }

    fn invalidate(&self, file: &FileHandle, key: PageKey) {
        self.staged.lock().remove(key);
        self.attached.invalidate(file, key);
    }

    /// Invalidated again: a read that overlapped the write could have staged the old bytes
    /// under the new epoch. Nothing is vouched here (a write's own stamp is within a clock tick
    /// of it and could not vouch); the stamps this process's change detection verifies do, at
    /// each persist and at close.
    fn written(&self, file: &FileHandle, key: PageKey) {
        self.attached.invalidate(file, key);
    }

    /// A file is forgotten whole, for every process.
    fn forget(&self, file: Option<FileKey>, first_page: u64) -> bool {
        self.staged
            .lock()
            .retain(|k| !(file.is_none_or(|f| k.file == f) && k.page >= first_page));
        match file {
            Some(_) => {
                self.attached.forget(file);
                true
            }
            None => self.attached.forget_everything(),
        }
    }

    /// The pages of the files this process has bound, with no time (it is not tracked across
    /// processes).
    fn entries(&self, _last_ref: &dyn Fn(usize) -> u64) -> Vec<(PageKey, u64, Option<u32>)> {
        let local = self.attached.local_keys();
        self.attached
            .index
            .entries()
            .into_iter()
            .filter_map(|(key, page, pid, mine)| {
                Some((
                    PageKey::new(*local.get(&key)?, page),
                    0,
                    (!mine).then_some(pid),
                ))
            })
            .collect()
    }

    fn footprint(&self) -> u64 {
        0 // the index is in shared memory, laid out in full when the segment is made
    }

    /// The shared head, where the next claim starts its search: every process's writer claims
    /// regions from there. None if the index cannot be locked now.
    fn ring_tail(&self) -> Option<usize> {
        self.attached.index.ring_head()
    }

    /// The next region free of other live writers (the one held, if the writer holds one).
    fn enter_region(&self, _next: usize) -> Option<Entered> {
        if let Some(c) = self.claim() {
            return Some(Entered {
                region: c.region,
                evicted: 0,
            });
        }
        let c = self.attached.index.claim_region()?;
        *self.claim.lock() = Some(c);
        Some(Entered {
            region: c.region,
            evicted: c.evicted,
        })
    }

    /// A recovery voids claims, and another process may have claimed the region and filled it
    /// since: never write into it again. A recovery between this check and
    /// the write is still possible: the reads' crc check makes that a miss.
    fn holds_region(&self) -> bool {
        self.claim()
            .is_some_and(|c| self.attached.index.holds_claim(c))
    }

    /// None: the index is laid out in full in shared memory, and never grows.
    fn index_bytes_with(&self, _region: usize, _pages: usize) -> Option<u64> {
        None
    }

    /// Nothing to release: the index never grows (`index_bytes_with`), so it is never short of
    /// room; the regions are everyone's, and only a claim empties one.
    fn release_region(&self, _region: usize) -> usize {
        0
    }

    fn index_written(&self, _region: usize, pages: &[Written]) -> bool {
        let claim = self.claim();
        strict_assert!(claim.is_some(), "a write without a claim");
        let Some(claim) = claim else {
            return false;
        };
        let admissions: Vec<Admission> = {
            let mut staged = self.staged.lock();
            pages
                .iter()
                .filter(|p| staged.take(p.key, p.seq))
                .filter_map(|p| {
                    let read = p.read?;
                    Some(Admission {
                        file: read.file,
                        page: p.key.page,
                        offset: p.offset,
                        len: p.len,
                        crc: p.crc,
                        epoch: read.epoch,
                    })
                })
                .collect()
        };
        // Published after the bytes are written: no entry points at bytes not there.
        if self.attached.index.publish(claim, &admissions).is_none() {
            // The claim was voided (a recovery): never write into the region again.
            *self.claim.lock() = None;
            return false;
        }
        true
    }

    fn leave_region(&self) {
        let claim = self.claim.lock().take();
        if let Some(c) = claim {
            self.attached.index.seal(c);
        }
    }

    /// Never: no checkpoint bounds the ring (each claim is published as it is written).
    fn persist_due_at(&self, _region: usize) -> bool {
        false
    }

    /// A participant stopped holding the shared lock would keep the writer waiting for it (in
    /// a claim, a publication, a seal): its waits give up now.
    fn stop_waiting(&self) {
        self.attached.index.interrupt_waits();
    }

    /// What a checkpoint's file list does for a private store, vouching does here: the stamps
    /// this process's change detection verified its files at (never racy when read) vouch for
    /// their entries to the next process that binds them. A stamp older than
    /// the file's moves nothing: the next binder sees the file's newer stamp and starts it
    /// afresh.
    fn persist(&self, _: &Ring<'_>, vouched: Vouched, _: Resident<'_>, _if_changed: bool) {
        for v in &vouched.files {
            self.attached.vouch_verified(v.key, v.stamp);
        }
    }

    /// The file goes with the last process that shares it (which probes byte 0 for others:
    /// this process's own hold on it goes first).
    fn shut_down(&self, file: &ExtensionFile) {
        file.unlock();
        self.attached.index.detach(false, || file.remove());
    }

    /// The shared memory stays with the file when this is the last process: the next one to
    /// share it starts warm (its bindings check every file's stamp against the one vouched for).
    fn close(&self, file: &ExtensionFile) {
        self.attached.index.detach(true, || {});
        file.unlock();
    }

    /// The participant lock's own open description of the file.
    fn lock_fd(&self) -> Option<i32> {
        Some(self.attached.index.raw_fd())
    }

    #[cfg(feature = "testing")]
    fn stop_holding_the_lock(&self) -> bool {
        self.attached.index.stop_holding_the_lock();
        true
    }

    /// Nothing to take over: the index outlived its processes in shared memory, and the attach
    /// found it. (A shared extension's file is never taken over as a private one's is.)
    fn restore(&self, _: &Ring<'_>) -> usize {
        0
    }

    /// Nothing waits: a file is bound at its first use instead, from its stamp then, which
    /// keeps its entries only if it is the stamp vouched for (`Attached::bind`).
    fn adopt(
        &self,
        _: &Ring<'_>,
        _key: FileKey,
        _identity: FileIdentity,
        _now: Option<FileStamp>,
        _first_page: &mut dyn FirstPage,
    ) -> Vec<(PageKey, Location)> {
        Vec::new()
    }

    /// None: see `adopt`.
    fn has_waiting_files(&self) -> bool {
        false
    }

    fn has_restored(&self, _file: FileIdentity) -> bool {
        false
    }

    fn recorded_stamp(&self, _file: FileIdentity) -> Option<FileStamp> {
        None
    }
}
