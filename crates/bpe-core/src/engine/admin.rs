//! The operator's settings other than the extension's lifecycle (`lifecycle.rs`): max server
//! memory, drop clean buffers, and the checks every change goes through. The checks are pure
//! functions of the settings they apply to ([`Settings`]), so that a sequence of changes can be
//! validated as a whole before the first one is carried out.

use super::Engine;
use crate::config::{physical_memory, Sharing, INDEX_BUDGET_DIVISOR, MIN_MAX_MEMORY};
use crate::error::{Error, ExtensionRefusal, Result};
use crate::extension::{initial_index_bytes, MIN_EXTENSION_BYTES};
use crate::io::FileIdentity;
use crate::pool::{BufferPool, EvictionSink};
use crate::sync::{Mutex, Rank};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// The settings operator actions change, to validate a sequence of them before any runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settings {
    pub max_memory: u64,
    /// The extension's path and size, and the index bytes it is charged (None: disabled).
    pub extension: Option<(PathBuf, u64, u64)>,
}

/// One change an operator asks of the settings (a statement, an environment variable), for
/// [`Engine::check_changes`].
#[derive(Clone, Copy, Debug)]
pub enum SettingChange<'a> {
    /// Enable the extension at `path` with `size` bytes (or resize it, if it is enabled there).
    ExtensionOn {
        path: &'a Path,
        size: u64,
        /// None: as the configuration says (shared unless told otherwise); at the path enabled
        /// now, whatever it is enabled as.
        sharing: Option<Sharing>,
    },
    ExtensionOff,
    MaxMemory {
        bytes: u64,
    },
}

/// The size an extension of `size` bytes actually gets (whole regions).
pub fn effective_extension_size(size: u64) -> u64 {
    crate::extension::effective_size(size)
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

/// Max server memory, and L1's target under it: what the extension's index leaves of it. Every
/// change of either sets the target again, one at a time, so that the two never disagree.
pub(super) struct MemoryBudget {
    max: AtomicU64,
    /// Serializes changes of L1's target.
    retarget: Mutex<()>,
}

impl MemoryBudget {
    pub(super) fn new(max: u64) -> MemoryBudget {
        MemoryBudget {
            max: AtomicU64::new(max),
            retarget: Mutex::new(Rank::Memory, ()),
        }
    }

    #[inline]
    fn max(&self) -> u64 {
        self.max.load(Relaxed)
    }

    /// Max server memory from now on; L1's target follows at the next `retarget`.
    fn set_max(&self, bytes: u64) {
        self.max.store(bytes, Relaxed);
    }

    /// Sets L1's target to max server memory less the index `index_bytes` reads (under the
    /// lock, so that a change of the index meanwhile waits its turn).
    pub(super) fn retarget(
        &self,
        pool: &BufferPool,
        sink: &dyn EvictionSink,
        index_bytes: impl FnOnce() -> u64,
    ) {
        let _retarget = self.retarget.lock();
        let index = index_bytes();
        pool.set_target(self.max().saturating_sub(index), sink);
    }

    /// The extension's index grows to `bytes`: false, and nothing changed, if that is more than
    /// its budget ([`INDEX_BUDGET_DIVISOR`]); else L1's target shrinks to make room.
    pub(super) fn charge_index(
        &self,
        bytes: u64,
        pool: &BufferPool,
        sink: &dyn EvictionSink,
    ) -> bool {
        let _retarget = self.retarget.lock();
        if bytes > self.max() / INDEX_BUDGET_DIVISOR {
            return false;
        }
        pool.set_target(self.max().saturating_sub(bytes), sink);
        true
    }
}

impl Engine {
    pub fn max_memory(&self) -> u64 {
        self.memory.max()
    }

    /// The settings now.
    /// Whether `changes`, carried out in order, would each be accepted, every one checked
    /// against the settings the ones before it leave; nothing is changed. Err: the index of the
    /// first change refused, and why. The one owner of these rules: the operator language asks
    /// the engine instead of deriving them again.
    pub fn check_changes(
        &self,
        changes: &[SettingChange<'_>],
    ) -> std::result::Result<(), (usize, Error)> {
        let mut plan = self.settings();
        let current_path = plan.extension.as_ref().map(|e| e.0.clone());
        let mut turned_off = false;
        for (i, change) in changes.iter().enumerate() {
            self.plan_change(&mut plan, &current_path, &mut turned_off, *change)
                .map_err(|e| (i, e))?;
        }
        Ok(())
    }

    /// One step of `check_changes`: `plan` as the change would leave it.
    fn plan_change(
        &self,
        plan: &mut Settings,
        current_path: &Option<PathBuf>,
        turned_off: &mut bool,
        change: SettingChange<'_>,
    ) -> Result<()> {
        match change {
            SettingChange::ExtensionOn {
                path,
                size,
                sharing,
            } => {
                let new = (
                    path.to_path_buf(),
                    effective_extension_size(size),
                    initial_index_bytes(size),
                );
                match &plan.extension {
                    Some((p, current, _)) if p == path => {
                        let enabled = self.extension_sharing().filter(|_| !*turned_off);
                        if let (Some(asked), Some(enabled)) = (sharing, enabled) {
                            if asked != enabled {
                                return Err(Error::ExtensionSharingDiffers {
                                    path: path.to_path_buf(),
                                    enabled: enabled.word(),
                                    asked: asked.word(),
                                });
                            }
                        }
                        if effective_extension_size(size) != *current {
                            check_extension_size(size, plan.max_memory)?;
                            plan.extension = Some(new);
                        }
                    }
                    Some((p, _, _)) => {
                        return Err(Error::ExtensionAlreadyEnabled { path: p.clone() })
                    }
                    None if *turned_off && current_path.as_deref() == Some(path) => {
                        // The file there now is the one an earlier OFF leaves: deleted if this
                        // process was its last user, kept for the others if it was shared.
                        check_extension_size(size, plan.max_memory)?;
                        self.check_others_allow(path, size, sharing)?;
                        plan.extension = Some(new);
                    }
                    None => {
                        let sharing = sharing.unwrap_or(self.config.default_sharing());
                        self.validate_extension_as(path, size, plan.max_memory, sharing)?;
                        plan.extension = Some(new);
                    }
                }
            }
            SettingChange::ExtensionOff => {
                *turned_off |= plan.extension.is_some();
                plan.extension = None;
            }
            SettingChange::MaxMemory { bytes } => {
                check_max_memory(bytes, plan.extension.as_ref().map_or(0, |e| e.2))?;
                plan.max_memory = bytes;
            }
        }
        Ok(())
    }

    /// After this process leaves the shared extension at `path`, whether the processes still
    /// attached let it enable `path` again as `sharing` at `size`: they keep the file, so only
    /// joining them at their size can succeed.
    fn check_others_allow(&self, path: &Path, size: u64, sharing: Option<Sharing>) -> Result<()> {
        let Some(ext) = self.current_extension() else {
            return Ok(());
        };
        let others = ext.others_attached();
        if others == 0 {
            return Ok(());
        }
        let refused = |why| Error::ExtensionRefused {
            path: path.to_path_buf(),
            why,
        };
        if sharing.unwrap_or(self.config.default_sharing()) == Sharing::Private {
            return Err(refused(ExtensionRefusal::InUse));
        }
        if effective_extension_size(size) != ext.size_bytes() {
            return Err(refused(ExtensionRefusal::SharedAtOtherSize(
                ext.size_bytes(),
            )));
        }
        Ok(())
    }

    /// Whether an extension of `size` bytes is the size of the one enabled now (sizes are
    /// rounded down to whole regions): enabling it again at its path changes nothing.
    pub fn extension_has_size(&self, size: u64) -> bool {
        self.settings()
            .extension
            .is_some_and(|(_, current, _)| current == effective_extension_size(size))
    }

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
        self.memory.set_max(bytes);
        self.refresh_memory_target();
        Ok(())
    }

    /// Checks an extension request against the rules, as if `max_memory` were the setting,
    /// without changing anything.
    pub fn validate_extension_with(&self, path: &Path, size: u64, max_memory: u64) -> Result<()> {
        self.validate_extension_as(path, size, max_memory, self.config.default_sharing())
    }

    /// `validate_extension_with` for an extension to be enabled as `sharing`.
    pub fn validate_extension_as(
        &self,
        path: &Path,
        size: u64,
        max_memory: u64,
        sharing: Sharing,
    ) -> Result<()> {
        check_extension_size(size, max_memory)?;
        crate::io::extension_file::validate_path(path, sharing.is_shared())?;
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

    /// DBCC DROPCLEANBUFFERS: empties L1 and L2 (every cached page is clean). False: a shared
    /// extension's lock is held by a stopped process (SIGSTOP, a debugger, a paused container);
    /// it is emptied when that process lets go, and until then nobody reads from it.
    pub fn drop_clean_buffers(&self) -> bool {
        self.pool.invalidate(None);
        self.current_extension()
            .is_none_or(|ext| ext.invalidate_where(None, 0))
    }

    /// Takes the shared extension's lock as this process's participant and stops the process
    /// (SIGSTOP) holding it, as a debugger would; lets go once continued (SIGCONT). False,
    /// without stopping, if no shared extension is enabled. Tests only: what a participant
    /// stopped holding the lock costs the others.
    #[cfg(feature = "testing")]
    pub fn stop_holding_the_extension_lock(&self) -> bool {
        self.current_extension()
            .is_some_and(|ext| ext.stop_holding_the_lock())
    }

    /// Whether an extension file is open: without one, no file can be it, and the look at a
    /// file's identity (a system call) can be skipped.
    pub fn has_extension_file(&self) -> bool {
        self.extension.read().is_some()
    }

    /// Whether `identity` is the extension file's: no file SQLite opens may ever be it.
    pub fn is_extension_file(&self, identity: FileIdentity) -> bool {
        self.extension
            .read()
            .as_ref()
            .is_some_and(|e| e.identity() == identity)
    }
}
