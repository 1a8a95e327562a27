//! The operator's controls, each validated completely before anything changes.

use super::Engine;
use crate::config::{physical_memory, DEFAULT_SLOT_SIZE, INDEX_BUDGET_DIVISOR, MIN_MAX_MEMORY};
use crate::extension::{geometry, Extension, ExtensionIndex};
use crate::{Error, Result};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

/// sys.dm_os_buffer_pool_extension_configuration.state, with SQL Server's numbers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ExtensionState {
    #[default]
    Disabled = 0,
    Disabling = 1,
    Enabling = 3,
    Enabled = 5,
}

impl ExtensionState {
    pub fn description(self) -> &'static str {
        match self {
            ExtensionState::Disabled => "BUFFER POOL EXTENSION DISABLED",
            ExtensionState::Disabling => "BUFFER POOL EXTENSION DISABLING",
            ExtensionState::Enabling => "BUFFER POOL EXTENSION ENABLING",
            ExtensionState::Enabled => "BUFFER POOL EXTENSION ENABLED",
        }
    }
}

/// The extension's configuration as operators see it.
#[derive(Clone, Debug, Default)]
pub struct ExtensionStatus {
    pub state: ExtensionState,
    pub path: Option<PathBuf>,
    pub size_bytes: u64,
    pub slot_size: usize,
    /// Why the extension last disabled itself, if it did.
    pub last_failure: Option<String>,
}

/// Smallest extension: a few write batches, so the ring has somewhere to go.
const MIN_SLOTS: u64 = 256;

impl Engine {
    pub fn max_memory(&self) -> u64 {
        self.max_memory.load(Relaxed)
    }

    /// `max server memory`: shrinking evicts at once, growing takes effect at once.
    pub fn set_max_memory(&self, bytes: u64) -> Result<()> {
        let _admin = self.admin.lock();
        if bytes < MIN_MAX_MEMORY {
            return Err(Error::MemoryBelowMinimum {
                requested: bytes,
                minimum: MIN_MAX_MEMORY,
            });
        }
        if let Some(physical) = physical_memory() {
            if bytes > physical {
                return Err(Error::MemoryAbovePhysical {
                    requested: bytes,
                    physical,
                });
            }
        }
        let index = self.extension_index_bytes();
        if index > bytes / INDEX_BUDGET_DIVISOR {
            return Err(Error::MemoryBelowIndex {
                requested: bytes,
                index_bytes: index,
            });
        }
        self.max_memory.store(bytes, Relaxed);
        self.pool.set_target(bytes - index, self);
        Ok(())
    }

    fn extension_index_bytes(&self) -> u64 {
        self.extension
            .read()
            .as_ref()
            .map_or(0, |e| e.index_bytes())
    }

    /// Checks an extension request against the rules without changing anything; returns the
    /// slot size it would use.
    pub fn validate_extension(&self, path: &Path, size: u64) -> Result<usize> {
        let slot_size = self.validate_extension_size(size)?;
        crate::io::extension_file::validate_path(path)?;
        Ok(slot_size)
    }

    /// The size rules alone (error 868, minimum slots, index budget).
    fn validate_extension_size(&self, size: u64) -> Result<usize> {
        let max_memory = self.max_memory();
        if size <= max_memory {
            return Err(Error::ExtensionNotLargerThanMemory { size, max_memory });
        }
        let slot_size = self.files.lock().max_page_size().max(DEFAULT_SLOT_SIZE);
        let (slots, _) = geometry(size, slot_size);
        if (slots as u64) < MIN_SLOTS {
            return Err(Error::ExtensionTooSmall {
                size,
                slot_size,
                min_slots: MIN_SLOTS,
            });
        }
        let index_bytes = ExtensionIndex::bytes_for(slots as usize);
        let budget = max_memory / INDEX_BUDGET_DIVISOR;
        if index_bytes > budget {
            return Err(Error::IndexOverBudget {
                size,
                index_bytes,
                budget,
            });
        }
        Ok(slot_size)
    }

    /// ALTER SERVER CONFIGURATION SET BUFFER POOL EXTENSION ON (FILENAME = path, SIZE = size).
    pub fn enable_extension(&self, path: &Path, size: u64) -> Result<()> {
        let _admin = self.admin.lock();
        if let Some(ext) = self.extension.read().as_ref() {
            return Err(Error::ExtensionAlreadyEnabled {
                path: ext.path().to_path_buf(),
            });
        }
        self.enable_locked(path, size)
    }

    fn enable_locked(&self, path: &Path, size: u64) -> Result<()> {
        let slot_size = self.validate_extension(path, size)?;
        self.set_state(ExtensionState::Enabling, Some(path), 0, slot_size);
        let ext = match Extension::create(
            path,
            size,
            slot_size,
            self.counters.clone(),
            self.faults.clone(),
            self.epoch,
        ) {
            Ok(ext) => ext,
            Err(e) => {
                self.set_state(ExtensionState::Disabled, None, 0, 0);
                return Err(e);
            }
        };
        let index = ext.index_bytes();
        let size = ext.size_bytes();
        *self.extension.write() = Some(ext);
        self.pool.set_target(self.max_memory() - index, self);
        self.set_state(ExtensionState::Enabled, Some(path), size, slot_size);
        Ok(())
    }

    /// ALTER SERVER CONFIGURATION SET BUFFER POOL EXTENSION OFF.
    pub fn disable_extension(&self) -> Result<()> {
        let _admin = self.admin.lock();
        if self.extension.read().is_none() {
            return Err(Error::ExtensionNotEnabled);
        }
        self.disable_locked();
        Ok(())
    }

    fn disable_locked(&self) {
        let Some(ext) = self.extension.read().clone() else {
            return;
        };
        let status = self.extension_status();
        self.set_state(
            ExtensionState::Disabling,
            status.path.as_deref(),
            status.size_bytes,
            status.slot_size,
        );
        *self.extension.write() = None;
        ext.shutdown();
        // The index is freed when the last reader in flight lets go of `ext`.
        self.pool.set_target(self.max_memory(), self);
        self.set_state(ExtensionState::Disabled, None, 0, 0);
    }

    /// Changes the extension's size online. Its contents are dropped (the ring is laid out anew).
    pub fn resize_extension(&self, size: u64) -> Result<()> {
        let _admin = self.admin.lock();
        let Some(ext) = self.extension.read().clone() else {
            return Err(Error::ExtensionNotEnabled);
        };
        let path = ext.path().to_path_buf();
        drop(ext);
        // Validate the new size before touching the old extension (its path exists now, so the
        // path rules are checked again by enable_locked once the old file is gone).
        self.validate_extension_size(size)?;
        let old_size = self.extension_status().size_bytes;
        self.disable_locked();
        let Err(e) = self.enable_locked(&path, size) else {
            return Ok(());
        };
        // Refused (say, the disk is full): put back an extension of the old size, whose space
        // was just freed, so that a refused resize changes nothing but the contents.
        if let Err(again) = self.enable_locked(&path, old_size) {
            log::warn!(
                "buffer pool extension could not be restored after a failed resize: {again}"
            );
            self.status.lock().last_failure = Some(format!(
                "resize to {size} bytes failed ({e}) and the old size could not be restored ({again})"
            ));
        }
        Err(e)
    }

    /// Records why the extension is not on when configuration outside SQL asked for it (the
    /// host keeps working without it; the reason shows in the status).
    pub fn note_extension_failure(&self, reason: String) {
        self.status.lock().last_failure = Some(reason);
    }

    /// Called when the extension gave up after repeated faults: the engine keeps serving from
    /// RAM and the data files, and the reason stays visible in the status.
    pub(crate) fn retire_failed_extension(&self, ext: &Arc<Extension>, reason: String) {
        let Some(_admin) = self.admin.try_lock() else {
            return; // an operator action is under way and will see the failure
        };
        let current = self.extension.read().clone();
        if !current.is_some_and(|c| Arc::ptr_eq(&c, ext)) {
            return;
        }
        log::warn!("buffer pool extension disabled itself: {reason}");
        *self.extension.write() = None;
        // The file goes now, so that the operator can enable again at once at the same path;
        // the writer is joined elsewhere, as this may be the writer's own thread.
        ext.remove_file_only();
        let ext = ext.clone();
        std::thread::spawn(move || ext.shutdown());
        self.pool.set_target(self.max_memory(), self);
        self.set_state(ExtensionState::Disabled, None, 0, 0);
        self.status.lock().last_failure = Some(reason);
    }

    fn set_state(&self, state: ExtensionState, path: Option<&Path>, size: u64, slot_size: usize) {
        let mut s = self.status.lock();
        s.state = state;
        s.path = path.map(Path::to_path_buf);
        s.size_bytes = size;
        s.slot_size = slot_size;
        if state == ExtensionState::Enabled {
            s.last_failure = None;
        }
    }

    /// DBCC DROPCLEANBUFFERS: empties L1 and L2 (every cached page is clean).
    pub fn drop_clean_buffers(&self) {
        self.pool.invalidate(None);
        if let Some(ext) = self.current_extension() {
            ext.invalidate_where(None, 0);
        }
    }
}
