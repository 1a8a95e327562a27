//! The extension's lifecycle: one state machine, every transition in this file.
//!
//! ```text
//!                 enable                 created
//!   DISABLED ─────────────▶ ENABLING ─────────────▶ ENABLED ──────────── disable ─────────┐
//!      ▲ ▲                     │ refused             │  │ ▲                                ▼
//!      │ └─────────────────────┘                     │  │ │ done (new size, or the     DISABLING
//!      │                                             │  │ │ old one put back)              │
//!      │                                     resize  │  ▼ │                                │
//!      │                                             │ RESIZING                            │
//!      │                     8 faults in a row       ▼                                     │
//!      └──────────── retired (its own thread) ─── FAILING                                  │
//!      └───────────────────────────────────────────────────────────── writer stopped ─────┘
//! ```
//!
//! Operator actions (enable, disable, resize) run one at a time under `Engine::admin`. A fault
//! streak never changes state on the path that sees it: the extension tells the engine
//! (`ExtensionHost::failed`), the phase becomes FAILING at once (so readers skip it), and the
//! retirement runs on a thread of its own. Getters (`extension_status`) only read. Readers find
//! the working extension through `Engine::extension`, which only these transitions change.

use super::{check_extension_size, Engine};
use crate::config::Sharing;
use crate::error::{Error, Result};
use crate::extension::Extension;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI32, Ordering::Relaxed};
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
    /// Why the extension last disabled itself or could not start, or why a page was last refused.
    pub last_failure: Option<String>,
    /// Shared or private, while an extension is enabled.
    pub sharing: Option<Sharing>,
    /// Why the extension enabled now is private though sharing was the default (no shared
    /// memory to be had): a setting's consequence, not a failure, so it never hides one.
    pub private_because: Option<String>,
}

/// Where the extension is in its lifecycle.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) enum Phase {
    #[default]
    Disabled,
    Enabling {
        path: PathBuf,
    },
    Enabled {
        path: PathBuf,
        size: u64,
    },
    Resizing {
        path: PathBuf,
        to: u64,
    },
    Disabling {
        path: PathBuf,
        size: u64,
    },
    /// Faults made it give up; its retirement is under way.
    Failing {
        path: PathBuf,
        size: u64,
    },
}

/// The phase and what the last failure was.
#[derive(Default)]
pub(crate) struct Lifecycle {
    phase: Phase,
    last_failure: Option<String>,
    /// Set when an extension shared by default fell back to private; kept across resizes.
    private_because: Option<String>,
}

impl Lifecycle {
    fn status(&self) -> ExtensionStatus {
        let (state, path, size_bytes) = match &self.phase {
            Phase::Disabled => (ExtensionState::Disabled, None, 0),
            Phase::Enabling { path } => (ExtensionState::Enabling, Some(path.clone()), 0),
            Phase::Enabled { path, size } => (ExtensionState::Enabled, Some(path.clone()), *size),
            Phase::Resizing { path, to } => (ExtensionState::Enabling, Some(path.clone()), *to),
            Phase::Disabling { path, size } | Phase::Failing { path, size } => {
                (ExtensionState::Disabling, Some(path.clone()), *size)
            }
        };
        ExtensionStatus {
            state,
            path,
            size_bytes,
            last_failure: self.last_failure.clone(),
            sharing: None,
            private_because: None,
        }
    }
}

/// The descriptors of the extension file and of a shared extension's participant lock (-1
/// where there is none), readable without a lock: a forked child closes them, so that the
/// parent's locks on them are not held by the child. Set and cleared by the transitions here.
pub(super) struct ExtensionFds {
    file: AtomicI32,
    lock: AtomicI32,
}

impl ExtensionFds {
    pub(super) fn new() -> ExtensionFds {
        ExtensionFds {
            file: AtomicI32::new(-1),
            lock: AtomicI32::new(-1),
        }
    }

    fn set(&self, ext: &Extension) {
        self.file.store(ext.raw_fd(), Relaxed);
        self.lock.store(ext.raw_lock_fd(), Relaxed);
    }

    fn clear(&self) {
        self.file.store(-1, Relaxed);
        self.lock.store(-1, Relaxed);
    }

    fn get(&self) -> [i32; 2] {
        [self.file.load(Relaxed), self.lock.load(Relaxed)]
    }
}

impl Engine {
    /// The descriptors of the extension file and of a shared extension's participant lock,
    /// -1 where there is none, for a forked child to close (see `ExtensionFds`).
    pub fn extension_raw_fds(&self) -> [i32; 2] {
        self.extension_fds.get()
    }

    fn enter(&self, phase: Phase) {
        let mut l = self.lifecycle.lock();
        if matches!(phase, Phase::Enabled { .. }) {
            l.last_failure = None;
        }
        l.phase = phase;
    }

    /// The extension's state now. A pure read.
    pub fn extension_status(&self) -> ExtensionStatus {
        let (mut status, private_because) = {
            let l = self.lifecycle.lock();
            (l.status(), l.private_because.clone())
        };
        status.sharing = self.extension_sharing();
        if status.sharing == Some(Sharing::Private) {
            status.private_because = private_because;
        }
        if status.last_failure.is_none() {
            status.last_failure = self
                .extension
                .read()
                .as_ref()
                .and_then(|e| e.failure().or_else(|| e.last_drop()));
        }
        status
    }

    /// ALTER SERVER CONFIGURATION SET BUFFER POOL EXTENSION ON (FILENAME = path, SIZE = size):
    /// shared or private as the configuration says (shared unless told otherwise). Shared by
    /// default where no shared memory can be had (a container's small /dev/shm), it is this
    /// process's own instead, and `private_because` says why.
    pub fn enable_extension(&self, path: &Path, size: u64) -> Result<()> {
        self.enable_checked(path, size, self.config.default_sharing(), true)
    }

    /// ALTER SERVER CONFIGURATION SET BUFFER POOL EXTENSION ON (.., SHARED = ON|OFF): exactly
    /// that sharing, or refused.
    pub fn enable_extension_as(&self, path: &Path, size: u64, sharing: Sharing) -> Result<()> {
        self.enable_checked(path, size, sharing, false)
    }

    fn enable_checked(
        &self,
        path: &Path,
        size: u64,
        sharing: Sharing,
        fallback: bool,
    ) -> Result<()> {
        let _admin = self.admin.lock();
        if let Some(ext) = self.extension.read().as_ref() {
            return Err(Error::ExtensionAlreadyEnabled {
                path: ext.path().to_path_buf(),
            });
        }
        self.lifecycle.lock().private_because = None;
        match self.enable_locked(path, size, sharing) {
            Err(e @ Error::SharedMemoryUnavailable { .. }) if fallback => {
                if self.enable_locked(path, size, Sharing::Private).is_err() {
                    return Err(e);
                }
                let why = format!("{e}; the extension is this process's own instead");
                log::warn!("{why}");
                self.lifecycle.lock().private_because = Some(why);
                Ok(())
            }
            other => other,
        }
    }

    /// The sharing of the extension enabled now, if one is.
    pub fn extension_sharing(&self) -> Option<Sharing> {
        self.extension.read().as_ref().map(|e| e.sharing())
    }

    /// DISABLED → ENABLING → ENABLED (or back to DISABLED if refused).
    fn enable_locked(&self, path: &Path, size: u64, sharing: Sharing) -> Result<()> {
        self.validate_extension_as(path, size, self.max_memory(), sharing)?;
        self.enter(Phase::Enabling {
            path: path.to_path_buf(),
        });
        let host = Arc::new(super::Host(self.me.clone()));
        let ext = match Extension::open(
            path,
            size,
            self.counters.clone(),
            self.faults.clone(),
            host,
            self.epoch,
            sharing.is_shared(),
        ) {
            Ok(ext) => ext,
            Err(e) => {
                self.enter(Phase::Disabled);
                return Err(e);
            }
        };
        let size = ext.size_bytes();
        self.extension_fds.set(&ext);
        *self.extension.write() = Some(ext.clone());
        self.offer_open_files(&ext);
        self.refresh_memory_target();
        self.enter(Phase::Enabled {
            path: path.to_path_buf(),
            size,
        });
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

    /// ENABLED → DISABLING → DISABLED: stop admitting, stop the writer, delete the file.
    fn disable_locked(&self) {
        let Some(ext) = self.extension.read().clone() else {
            return;
        };
        self.enter(Phase::Disabling {
            path: ext.path().to_path_buf(),
            size: ext.size_bytes(),
        });
        self.unplug(&ext);
        self.enter(Phase::Disabled);
    }

    /// ENABLED → DISABLING → DISABLED, keeping the file: a last checkpoint is written and the
    /// file left for the next engine or process to start warm from (what a clean exit does;
    /// `disable_extension`, the operator's OFF, deletes it).
    pub fn close_extension(&self) -> Result<()> {
        let _admin = self.admin.lock();
        let Some(ext) = self.extension.read().clone() else {
            return Err(Error::ExtensionNotEnabled);
        };
        self.enter(Phase::Disabling {
            path: ext.path().to_path_buf(),
            size: ext.size_bytes(),
        });
        *self.extension.write() = None;
        self.extension_fds.clear();
        ext.close(self.vouched_files(), &|keys| self.resident(keys));
        self.refresh_memory_target();
        self.enter(Phase::Disabled);
        Ok(())
    }

    /// Takes `ext` out of service: readers stop finding it, its writer stops, its file goes.
    fn unplug(&self, ext: &Arc<Extension>) {
        *self.extension.write() = None;
        self.extension_fds.clear();
        ext.shutdown();
        // The index is freed when the last reader in flight lets go of `ext`.
        self.refresh_memory_target();
    }

    /// ENABLED → RESIZING → ENABLED: the ring is laid out anew (contents dropped). A size the
    /// disk cannot hold is refused and the old size is put back, so that a refused resize
    /// changes nothing but the contents.
    pub fn resize_extension(&self, size: u64) -> Result<()> {
        let _admin = self.admin.lock();
        let Some(ext) = self.extension.read().clone() else {
            return Err(Error::ExtensionNotEnabled);
        };
        let path = ext.path().to_path_buf();
        let old_size = ext.size_bytes();
        let sharing = ext.sharing();
        // The size is checked before the old extension is touched (its path exists now, so
        // the path rules are checked again by enable_locked once the old file is gone).
        check_extension_size(size, self.max_memory())?;
        self.enter(Phase::Resizing {
            path: path.clone(),
            to: size,
        });
        self.unplug(&ext);
        drop(ext);
        let Err(e) = self.enable_locked(&path, size, sharing) else {
            return Ok(());
        };
        if let Err(again) = self.enable_locked(&path, old_size, sharing) {
            log::warn!(
                "buffer pool extension could not be restored after a failed resize: {again}"
            );
            self.lifecycle.lock().last_failure = Some(format!(
                "resize to {size} bytes failed ({e}) and the old size could not be restored ({again})"
            ));
        }
        Err(e)
    }

    /// Records why the extension is not on when configuration outside SQL asked for it (the
    /// host keeps working without it; the reason shows in the status).
    pub fn note_extension_failure(&self, reason: String) {
        self.lifecycle.lock().last_failure = Some(reason);
    }

    /// ENABLED → FAILING: called by the extension when a fault streak reached its limit (from
    /// whatever thread saw the last fault, holding no lock). Readers already skip a failed
    /// extension; the retirement runs on a thread of its own.
    pub(crate) fn extension_failed(self: &Arc<Self>, ext: &Arc<Extension>) {
        {
            let mut l = self.lifecycle.lock();
            if let Phase::Enabled { path, size } = &l.phase {
                l.phase = Phase::Failing {
                    path: path.clone(),
                    size: *size,
                };
            }
        }
        // Its own thread: this may run on a reader's path or on the extension writer's thread,
        // which the retirement waits for.
        let (engine, ext) = (self.clone(), ext.clone());
        crate::sync::spawn("bpe-extension-retire", move || {
            engine.retire_failed_extension(&ext)
        })
        .unwrap_or_else(|e| log::error!("cannot retire the failed extension: {e}"));
    }

    /// FAILING → DISABLED: the engine keeps serving from RAM and the data files, and the reason
    /// stays in the status.
    fn retire_failed_extension(&self, ext: &Arc<Extension>) {
        let _admin = self.admin.lock();
        let current = self.extension.read().clone();
        if !current.is_some_and(|c| Arc::ptr_eq(&c, ext)) {
            return; // an operator action replaced it meanwhile
        }
        let reason = ext.failure().unwrap_or_else(|| "repeated faults".into());
        log::warn!("buffer pool extension disabled itself: {reason}");
        // The file goes now, so that the operator can enable again at once at the same path.
        self.unplug(ext);
        let mut l = self.lifecycle.lock();
        l.phase = Phase::Disabled;
        l.last_failure = Some(reason);
    }
}
