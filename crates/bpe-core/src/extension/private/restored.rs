//! A restored checkpoint's pages waiting for adoption (see `persist.rs`): what the last
//! checkpoint said and this process has not adopted yet, per file, less what the writer has
//! overwritten since.

use crate::extension::checkpoint::{PageCheck, SavedEntry};
use crate::io::{FileIdentity, FileStamp};
use std::collections::HashMap;

/// A checkpoint's pages of one data file, waiting for the file to be opened.
pub(super) struct RestoredFile {
    pub stamp: FileStamp,
    pub first_page: Option<PageCheck>,
    pub entries: Vec<SavedEntry>,
}

/// What the last checkpoint said and this process has not adopted yet.
#[derive(Default)]
pub(super) struct Restored {
    pub files: HashMap<FileIdentity, RestoredFile>,
    /// Regions the writer entered since the restore: what the checkpoint says of them is void.
    pub overwritten: Vec<bool>,
    pub entries: usize,
    /// The file being adopted (its entries taken from `files`, not all indexed yet): a miss of
    /// it still waits (see `Extension::await_restore`).
    pub adopting: Option<FileIdentity>,
}

/// Bytes of RAM one waiting entry takes (charged like the index).
const RESTORED_ENTRY_BYTES: u64 = std::mem::size_of::<SavedEntry>() as u64;

impl Restored {
    pub(super) fn bytes(&self) -> u64 {
        self.entries as u64 * RESTORED_ENTRY_BYTES
    }

    /// Files whose pages wait for adoption, the one being adopted included.
    pub(super) fn files_waiting(&self) -> usize {
        self.files.len() + usize::from(self.adopting.is_some())
    }

    /// The writer is about to overwrite `region`.
    pub(super) fn overwrite(&mut self, region: usize) {
        if let Some(o) = self.overwritten.get_mut(region) {
            *o = true;
        }
        if !self.overwritten.is_empty() && self.overwritten.iter().all(|&o| o) {
            // The ring came round: nothing of the checkpoint is left.
            self.files.clear();
            self.entries = 0;
        }
    }

    pub(super) fn live(&self, e: &SavedEntry) -> bool {
        !self.overwritten[e.region as usize]
    }

    pub(super) fn clear(&mut self) {
        self.files.clear();
        self.entries = 0;
    }

    pub(super) fn take(&mut self, id: FileIdentity) -> Option<RestoredFile> {
        let r = self.files.remove(&id)?;
        self.entries -= r.entries.len();
        Some(r)
    }
}
