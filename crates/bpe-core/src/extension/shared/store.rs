//! The shared store: the extension's index in shared memory, with every process that has the
//! file open (see `shared/mod.rs` for the protocol, `store.rs` for the interface).
//!
//! A page is staged here only with what its read was made under in this attachment, and is
//! published only if its write epoch has not moved since: a process that wrote the page
//! meanwhile (this one or another) has moved it, whichever staging map the page was in.

use super::{Admission, Attached, Claim, SharedIndex};
use crate::config::Sharing;
use crate::extension::store::{Entered, Hit, L2Store, Resident, Staging, Written};
use crate::extension::{Extension, Location, Vouched};
use crate::files::FileHandle;
use crate::io::extension_file::ExtensionFile;
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

    fn stats(&self) -> (usize, u64) {
        let s = self.attached.index.stats();
        (s.pages as usize, s.bytes)
    }

    fn locate(&self, key: PageKey) -> Option<Hit> {
        self.attached.locate(key).map(|hit| Hit {
            location: hit.location,
            theirs: !hit.mine,
        })
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

    /// What a checkpoint's file list does for a private store, vouching does here: the stamps
    /// this process's change detection verified its files at (never racy when read) vouch for
    /// their entries to the next process that binds them. A stamp older than
    /// the file's moves nothing: the next binder sees the file's newer stamp and starts it
    /// afresh.
    fn persist(&self, _ext: &Extension, vouched: Vouched, _: Resident<'_>, _if_changed: bool) {
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

    fn shared_index(&self) -> Option<&SharedIndex> {
        Some(&self.attached.index)
    }
}
