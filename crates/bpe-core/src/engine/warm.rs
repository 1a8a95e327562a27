//! What the engine does for a warm restart (see `extension/persist.rs`): it says which files'
//! cached pages it can vouch for when the extension checkpoints, and hands each file that opens
//! to the extension for adoption of the pages a previous process left.

use super::{Engine, Via};
use crate::extension::{page_crc, Extension, Vouched};
use crate::files::{FileHandle, OpenKind};
use std::sync::Arc;

impl Engine {
    /// Files with a stamp their cached pages were verified against, and not within a clock tick
    /// of a change (a coarse timestamp could not tell a later write in the same tick): (key,
    /// stamp), each stamp read before its key.
    pub(crate) fn vouched_files(&self) -> Vouched {
        let files: Vec<FileHandle> = self.files.lock().all().cloned().collect();
        let files = files
            .iter()
            .filter_map(|f| {
                let known = f.known_stamp().filter(|k| !k.racy)?;
                Some((f.key(), known.stamp))
            })
            .collect();
        Vouched { files }
    }

    /// A file was opened: if the extension has restored pages of it, adoption is queued for
    /// the extension's writer (the open does not wait for the check's read of the first page).
    pub(super) fn offer_for_adoption(self: &Arc<Self>, file: &FileHandle, kind: OpenKind) {
        if kind == OpenKind::Shared {
            return;
        }
        let Some(ext) = self.current_extension() else {
            return;
        };
        if !ext.has_restored(file.identity()) {
            return;
        }
        let (engine, file, target) = (Arc::downgrade(self), file.clone(), ext.clone());
        ext.request_adoption(move || {
            if let Some(engine) = engine.upgrade() {
                engine.adopt(&target, &file);
            }
        });
    }

    /// Every file open now is offered to a freshly restored extension (on its writer's thread).
    pub(super) fn adopt_open_files(&self, ext: &Arc<Extension>) {
        let open: Vec<FileHandle> = self.files.lock().open_files().cloned().collect();
        for file in &open {
            self.adopt(ext, file);
        }
    }

    /// Adoption proper, with every write to the file held off: a write in flight has reached
    /// the file (and its stamp) before the check, and one that starts after finds the adopted
    /// copies to invalidate.
    fn adopt(&self, ext: &Extension, file: &FileHandle) {
        if !ext.has_restored(file.identity()) {
            return;
        }
        let _writes = file.writes_held_off();
        let now = file.stamp_now().ok();
        ext.adopt(file.key(), now, |len: usize| {
            let mut buf = vec![0u8; len];
            match self.device_read(file, Via(None), 0, &mut buf) {
                Ok(n) if n == len => Some(page_crc(0, &buf)),
                _ => None,
            }
        });
    }

    /// At process exit: a last checkpoint, and the file stays for the next process. Skipped if
    /// an operator action holds the extension at that moment.
    pub fn close_extension_at_exit(&self) {
        if let Some(ext) = self.extension.try_read().and_then(|e| e.clone()) {
            ext.close(self.vouched_files());
        }
    }
}
