//! The operator's controls. Each is validated completely before anything changes, by checks
//! that are pure functions of the settings they apply to ([`Settings`]), so that a sequence of
//! changes can be validated as a whole before the first one is carried out.
//!
//! The extension's lifecycle:
//!
//! ```text
//!  DISABLED --enable--> ENABLING --file created--> ENABLED --disable--> DISABLING --> DISABLED
//!      ^                   |                         |  ^
//!      +---- refused ------+      resize: DISABLING, |  | (same path, new size; refused:
//!      +---------- faults: retired (file deleted) ---+  |  the old size is put back)
//!                                                     ENABLING
//! ```

use super::Engine;
use crate::config::{physical_memory, INDEX_BUDGET_DIVISOR, MIN_MAX_MEMORY};
use crate::extension::{initial_index_bytes, Extension, MIN_EXTENSION_BYTES, REGION_BYTES};
use crate::io::FileIdentity;
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
    /// Why the extension last disabled itself or could not start, if it did.
    pub last_failure: Option<String>,
}

/// The settings operator actions change, to validate a sequence of them before any runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settings {
    pub max_memory: u64,
    /// The extension's path and size, and the index bytes it is charged (None: disabled).
    pub extension: Option<(PathBuf, u64, u64)>,
}

/// The size an extension of `size` bytes actually gets (whole regions).
pub fn effective_extension_size(size: u64) -> u64 {
    size - size % REGION_BYTES
}

/// `max server memory` of `bytes` next to an extension whose index takes `index_bytes`.
pub fn check_max_memory(bytes: u64, index_bytes: u64) -> Result<()> {
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
    if index_bytes > bytes / INDEX_BUDGET_DIVISOR {
        return Err(Error::MemoryBelowIndex {
            requested: bytes,
            index_bytes,
        });
    }
    Ok(())
}

/// The size rules of an extension next to `max_memory` (error 868, minimum, index budget).
pub fn check_extension_size(size: u64, max_memory: u64) -> Result<()> {
    if size <= max_memory {
        return Err(Error::ExtensionNotLargerThanMemory { size, max_memory });
    }
    if effective_extension_size(size) < MIN_EXTENSION_BYTES {
        return Err(Error::ExtensionTooSmall {
            size,
            minimum: MIN_EXTENSION_BYTES,
        });
    }
    let index_bytes = initial_index_bytes(size);
    let budget = max_memory / INDEX_BUDGET_DIVISOR;
    if index_bytes > budget {
        return Err(Error::IndexOverBudget {
            size,
            index_bytes,
            budget,
        });
    }
    Ok(())
}

impl Engine {
    pub fn max_memory(&self) -> u64 {
        self.max_memory.load(Relaxed)
    }

    /// The settings now.
    pub fn settings(&self) -> Settings {
        Settings {
            max_memory: self.max_memory(),
            extension: self
                .extension
                .read()
                .as_ref()
                .map(|e| (e.path().to_path_buf(), e.size_bytes(), e.index_bytes())),
        }
    }

    /// `max server memory`: shrinking evicts at once, growing takes effect at once.
    pub fn set_max_memory(&self, bytes: u64) -> Result<()> {
        let _admin = self.admin.lock();
        let index = self.settings().extension.map_or(0, |e| e.2);
        check_max_memory(bytes, index)?;
        self.max_memory.store(bytes, Relaxed);
        self.refresh_memory_target();
        Ok(())
    }

    /// Checks an extension request against the rules, as if `max_memory` were the setting,
    /// without changing anything.
    pub fn validate_extension_with(&self, path: &Path, size: u64, max_memory: u64) -> Result<()> {
        check_extension_size(size, max_memory)?;
        crate::io::extension_file::validate_path(path)?;
        // A file at the path is only ever replaced if it is a dead process's extension; never
        // if this process has it open as a data file.
        if let Ok(identity) = FileIdentity::of_path(path) {
            if self.files.lock().knows(identity) {
                return Err(Error::BadExtensionPath {
                    path: path.to_path_buf(),
                    reason: "it is a data file this process has open".into(),
                });
            }
        }
        Ok(())
    }

    /// Checks an extension request against the rules without changing anything.
    pub fn validate_extension(&self, path: &Path, size: u64) -> Result<()> {
        self.validate_extension_with(path, size, self.max_memory())
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
        self.validate_extension(path, size)?;
        self.set_state(super::ExtensionState::Enabling, Some(path), 0);
        let host = Arc::new(super::Host(self.me.clone()));
        let ext = match Extension::create(
            path,
            size,
            self.counters.clone(),
            self.faults.clone(),
            host,
            self.epoch,
        ) {
            Ok(ext) => ext,
            Err(e) => {
                self.set_state(ExtensionState::Disabled, None, 0);
                return Err(e);
            }
        };
        let size = ext.size_bytes();
        self.extension_fd.store(ext.raw_fd(), Relaxed);
        *self.extension.write() = Some(ext);
        self.refresh_memory_target();
        self.set_state(ExtensionState::Enabled, Some(path), size);
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
        let status = self.status.lock().clone();
        self.set_state(
            ExtensionState::Disabling,
            status.path.as_deref(),
            status.size_bytes,
        );
        *self.extension.write() = None;
        self.extension_fd.store(-1, Relaxed);
        ext.shutdown();
        // The index is freed when the last reader in flight lets go of `ext`.
        self.refresh_memory_target();
        self.set_state(ExtensionState::Disabled, None, 0);
    }

    /// Changes the extension's size online. Its contents are dropped (the ring is laid out anew).
    pub fn resize_extension(&self, size: u64) -> Result<()> {
        let _admin = self.admin.lock();
        let Some(ext) = self.extension.read().clone() else {
            return Err(Error::ExtensionNotEnabled);
        };
        let path = ext.path().to_path_buf();
        let old_size = ext.size_bytes();
        drop(ext);
        // Validate the new size before touching the old extension (its path exists now, so the
        // path rules are checked again by enable_locked once the old file is gone).
        check_extension_size(size, self.max_memory())?;
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

    /// Called (on a thread of its own) when the extension gave up after repeated faults: the
    /// engine keeps serving from RAM and the data files, and the reason stays in the status.
    pub(crate) fn retire_failed_extension(&self, ext: &Arc<Extension>) {
        let _admin = self.admin.lock();
        let current = self.extension.read().clone();
        if !current.is_some_and(|c| Arc::ptr_eq(&c, ext)) {
            return; // an operator action replaced it meanwhile
        }
        let reason = ext.failure().unwrap_or_else(|| "repeated faults".into());
        log::warn!("buffer pool extension disabled itself: {reason}");
        *self.extension.write() = None;
        self.extension_fd.store(-1, Relaxed);
        // The file goes now, so that the operator can enable again at once at the same path.
        ext.shutdown();
        self.refresh_memory_target();
        self.set_state(ExtensionState::Disabled, None, 0);
        self.status.lock().last_failure = Some(reason);
    }

    fn set_state(&self, state: ExtensionState, path: Option<&Path>, size: u64) {
        let mut s = self.status.lock();
        s.state = state;
        s.path = path.map(Path::to_path_buf);
        s.size_bytes = size;
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

    /// Deletes the extension file without waiting for anything (process exit): it holds pages
    /// in the clear. Skipped if an operator action holds the extension at that moment.
    pub fn remove_extension_file_at_exit(&self) {
        if let Some(ext) = self.extension.try_read().and_then(|e| e.clone()) {
            ext.remove_file_only();
        }
    }

    /// Whether `identity` is the extension file's: no file SQLite opens may ever be it.
    pub fn is_extension_file(&self, identity: FileIdentity) -> bool {
        self.extension
            .read()
            .as_ref()
            .is_some_and(|e| e.identity() == identity)
    }
}
