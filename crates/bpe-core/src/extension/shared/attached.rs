//! This process's side of a shared extension: which shared name each of its file keys has.
//!
//! A local key is bound on first use, from the file's stamp now (see `SharedIndex::bind`): a
//! key this process just gave a file (first open, a change it could not explain) is exactly
//! the case of a process that has not been watching. When another process moves the file's
//! shared key on, the binding follows it (this process's own change detection vouches for its
//! reads).

use super::{Found, SharedFile, SharedHit, SharedIndex};
use crate::extension::Location;
use crate::files::{FileHandle, KnownStamp};
use crate::io::FileIdentity;
use crate::page::{FileKey, PageKey};
use crate::sync::{Rank, RwLock};
use std::collections::HashMap;
use std::sync::atomic::{
    AtomicU64,
    Ordering::{Relaxed, SeqCst},
};

/// Numbers this process's attachments: a read made under one is worth nothing under another
/// (a later attachment may be to a new segment, whose names start again from the same values).
static ATTACHMENTS: AtomicU64 = AtomicU64::new(1);

/// Bindings kept at most; past it they are dropped and made again on use.
const MAX_BINDINGS: usize = 4096;

#[cfg(test)]
type Hook = Box<dyn FnOnce(&Attached) + Send>;

pub use crate::page::SharedRead;

pub struct Attached {
    pub index: SharedIndex,
    /// Local key -> the shared name and the file it names (a slot may be given to another file
    /// later: the identity tells).
    bindings: RwLock<HashMap<FileKey, (SharedFile, FileIdentity)>>,
    /// Forgets so far, counted under the bindings' lock: a binding made while one ran is not
    /// recorded (it may name what the forget was to drop), but made again.
    forgets: AtomicU64,
    id: u64,
    /// Run once in `bind` between the shared binding and its record (tests: what another
    /// thread may do there).
    #[cfg(test)]
    pub(super) between_bind_and_record: std::sync::Mutex<Option<Hook>>,
}

impl Attached {
    pub fn new(index: SharedIndex) -> Attached {
        Attached {
            index,
            bindings: RwLock::new(Rank::Leaf, HashMap::new()),
            forgets: AtomicU64::new(0),
            id: ATTACHMENTS.fetch_add(1, Relaxed),
            #[cfg(test)]
            between_bind_and_record: Default::default(),
        }
    }

    /// Whether `read` was made under this attachment (frames outlive attachments).
    pub fn made_here(&self, read: &SharedRead) -> bool {
        read.attachment == self.id
    }

    fn bound(&self, key: FileKey) -> Option<SharedFile> {
        self.bindings.read().get(&key).map(|b| b.0)
    }

    /// The shared name of `file`'s pages under its key `key`, bound now if need be.
    ///
    /// A forget that runs between the binding and its record finds nothing to forget, and the
    /// stamp bound may be from before the change that called for it (a truncation): the
    /// binding is then made again, from a stamp taken after the forget.
    fn bind(&self, file: &FileHandle, key: FileKey) -> Option<SharedFile> {
        loop {
            if let Some(f) = self.bound(key) {
                return Some(f);
            }
            let forgets = self.forgets.load(SeqCst);
            let stamp = KnownStamp::taken_now(file.stamp_now().ok()?);
            let shared = self.index.bind(stamp)?;
            #[cfg(test)]
            {
                let hook = self.between_bind_and_record.lock().unwrap().take();
                if let Some(hook) = hook {
                    hook(self);
                }
            }
            let mut b = self.bindings.write();
            if self.forgets.load(SeqCst) != forgets {
                continue;
            }
            if b.len() >= MAX_BINDINGS {
                b.clear();
            }
            b.insert(key, (shared, file.identity()));
            return Some(shared);
        }
    }

    /// The name and write epoch to read page `key` of `file` under (before reading it).
    pub fn read_under(&self, file: &FileHandle, key: PageKey) -> Option<SharedRead> {
        let shared = self.bind(file, key.file)?;
        Some(SharedRead {
            file: shared,
            epoch: self.index.epoch(file.identity(), key.page),
            attachment: self.id,
        })
    }

    /// Where the page is cached, if it is (the key followed if another process moved it).
    pub fn locate(&self, key: PageKey) -> Option<SharedHit> {
        let forgets = self.forgets.load(SeqCst);
        let (shared, id) = *self.bindings.read().get(&key.file)?;
        match self.index.lookup(shared, key.page) {
            Found::Hit(hit) => Some(hit),
            Found::Miss => None,
            Found::Moved => {
                let Some(moved) = self.index.follow(shared, id) else {
                    // Its slot went to another file: bound again from the stamp on next use.
                    self.bindings.write().remove(&key.file);
                    return None;
                };
                let mut b = self.bindings.write();
                if self.forgets.load(SeqCst) != forgets {
                    return None; // a forget ran meanwhile: its binding is gone, or moved on
                }
                b.insert(key.file, (moved, id));
                drop(b);
                match self.index.lookup(moved, key.page) {
                    Found::Hit(hit) => Some(hit),
                    _ => None,
                }
            }
        }
    }

    /// Removes the page's entry if it still is `location` (a read failed its checksum).
    pub fn drop_if(&self, key: PageKey, location: Location) -> bool {
        self.bound(key.file)
            .is_some_and(|f| self.index.drop_if(f, key.page, location))
    }

    /// Invalidates the page for every process (before and after this process writes it).
    pub fn invalidate(&self, file: &FileHandle, key: PageKey) {
        // The name is a hint (the file is found by identity): a binding the lock's holder keeps
        // from being made now never keeps the invalidation from being made.
        let hint = self
            .bind(file, key.file)
            .unwrap_or(SharedFile { slot: 0, key: 0 });
        self.index.invalidate(hint, key.page, file.identity());
    }

    /// The file under local `key` was verified at `stamp`, a stamp read clear of the racy
    /// window (see `SharedStore::persist`).
    pub fn vouch_verified(&self, key: FileKey, stamp: crate::io::FileStamp) {
        if let Some(f) = self.bound(key) {
            self.index.vouch(f, KnownStamp { stamp, racy: false });
        }
    }

    /// Forgets every page of the file under `key` (all bound files if None), for every process.
    pub fn forget(&self, key: Option<FileKey>) {
        for (f, id) in self.unbind(key) {
            self.index.forget_file(f, id);
        }
    }

    /// Drops this process's bindings of the file under `key` (all if None); returns them.
    fn unbind(&self, key: Option<FileKey>) -> Vec<(SharedFile, FileIdentity)> {
        let mut b = self.bindings.write();
        self.forgets.fetch_add(1, SeqCst);
        match key {
            Some(k) => b.remove(&k).into_iter().collect(),
            None => b.drain().map(|(_, b)| b).collect(),
        }
    }

    /// Forgets every page of every file, bound here or not, for every process. False: done at
    /// this process's next lock (see `SharedIndex::empty`). Emptying voids every file's key,
    /// so the bindings here only go (forgetting each file would wait for the lock again).
    pub fn forget_everything(&self) -> bool {
        self.unbind(None);
        self.index.empty()
    }

    /// The local key of each shared key this process has bound.
    pub fn local_keys(&self) -> HashMap<FileKey, FileKey> {
        self.bindings
            .read()
            .iter()
            .map(|(local, (shared, _))| (shared.key, *local))
            .collect()
    }
}
