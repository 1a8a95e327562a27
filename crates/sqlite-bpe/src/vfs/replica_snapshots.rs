//! The snapshots of a database served by another VFS (Litestream's read replica), as the
//! engine names and relates them.
//!
//! Each replicated transaction (TXID) is a snapshot the engine caches apart
//! (`FileIdentity::snapshot`). Two things make a move to a new TXID cheap:
//! - **Lineage.** Where the replica's log is readable (`replica_log.rs`), the new snapshot
//!   takes from an earlier one every page the transactions between did not change
//!   (`Engine::inherit`): the earlier snapshot this connection read, else the newest this
//!   process has opened.
//! - **Names that outlive the process.** A snapshot whose content the log marks
//!   (`FileTail::content_mark`: the database's post-apply checksum in the LTX file ending at
//!   its TXID, or, where the writer wrote none as Litestream 0.5 does, the checksum of the
//!   finest-level file ending there) is named from that mark, the base VFS, the path and the
//!   replica's place (its URL without the query: not the endpoint it is reached through). The
//!   same content has the same name in the next process, so the extension's checkpoint can
//!   hand its pages over, and a replica written anew under the same URL, whose transaction
//!   numbers start again, names its content differently. After a restart, the first snapshot
//!   looks back through the log for an earlier one the extension still holds. A snapshot the
//!   log does not mark gets a name of this process only.
//!
//! Every lookup in the log that fails costs reads from the base VFS, never a stale page: a
//! snapshot without a lineage reads every page from the base VFS, as before.

use super::replica_log::ReplicaLog;
use bpe_core::{Engine, FileHandle, FileIdentity, OpenKind, Result};
use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard, Weak};

/// Snapshots whose names a source remembers (the newest), so that a connection per request
/// does not ask the log for the name of a transaction this process has seen.
const NAMES_KEPT: usize = 64;
/// After a restart: transactions looked back through for a snapshot the extension holds.
const RESTART_LOOKBACK: u64 = 64;
/// After a restart: LTX tails read, at most, to find it (one GET each on object storage).
const RESTART_TAILS: usize = 16;

/// One database of a base VFS, in this process.
pub struct Source {
    /// Names the database across processes (base VFS, path, replica).
    stable: u64,
    /// Names it in this process only.
    volatile: u64,
    log: Option<Arc<ReplicaLog>>,
    state: Mutex<SourceState>,
}

#[derive(Default)]
struct SourceState {
    names: HashMap<u64, FileIdentity>,
    /// The newest snapshot opened, by TXID, and the process generation whose engine opened
    /// it (a forked child's engine is another: see `process.rs`).
    latest: Option<(u64, u64, Weak<bpe_core::CachedFile>)>,
}

/// A snapshot opened for a connection.
pub struct Opened {
    pub handle: FileHandle,
    /// An earlier snapshot opened to serve as its ancestor after a restart (its pages wait
    /// for adoption while it is open); the caller closes it with the snapshot.
    pub ancestor: Option<FileHandle>,
}

/// A source's key: base VFS, path, replica URL.
type SourceKey = (String, String, String);

static SOURCES: Mutex<Option<HashMap<SourceKey, Arc<Source>>>> = Mutex::new(None);

/// Their lock, taken (held across a fork: see `process::hold_process_locks`).
pub fn hold_sources() -> Box<dyn std::any::Any> {
    Box::new(lock(&SOURCES))
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// FNV-1a: a hash that is the same in every process and every build.
fn fnv(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for &b in *part {
            h = (h ^ b as u64).wrapping_mul(0x0100_0000_01b3);
        }
        h = (h ^ 0xff).wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// A snapshot source number below 2^63.
fn source_number(h: u64) -> u64 {
    h & (u64::MAX >> 1)
}

impl Source {
    /// The source for `path` opened through `base`, its log at `replica` if named.
    pub fn get(base: &str, path: &Path, replica: Option<&str>) -> Arc<Source> {
        use std::os::unix::ffi::OsStrExt;
        let key = (
            base.to_string(),
            path.to_string_lossy().into_owned(),
            replica.unwrap_or("").to_string(),
        );
        let mut sources = lock(&SOURCES);
        let sources = sources.get_or_insert_with(HashMap::new);
        if let Some(s) = sources.get(&key) {
            return s.clone();
        }
        // The replica without its query: where the server is reached (an endpoint, a proxy's
        // port) is not what the database is, and the content is named by its checksum anyway.
        let replica_place = key.2.split('?').next().unwrap_or_default();
        let stable = fnv(&[
            base.as_bytes(),
            path.as_os_str().as_bytes(),
            replica_place.as_bytes(),
        ]);
        let now = bpe_core::monotonic_ns().to_le_bytes();
        let pid = std::process::id().to_le_bytes();
        let log = replica.and_then(|url| match ReplicaLog::open(url) {
            Ok(log) => Some(Arc::new(log)),
            Err(e) => {
                crate::api::log(libsqlite3_sys::SQLITE_WARNING, &format!("bpe: {e}"));
                None
            }
        });
        let source = Arc::new(Source {
            stable,
            volatile: source_number(fnv(&[&stable.to_le_bytes(), &pid, &now])),
            log,
            state: Mutex::new(SourceState::default()),
        });
        sources.insert(key, source.clone());
        source
    }

    /// Opens the snapshot at `txid` for a connection whose last snapshot was `previous`.
    pub fn open(
        &self,
        engine: &Engine,
        path: &Path,
        page_size: usize,
        txid: u64,
        previous: Option<(u64, &FileHandle)>,
    ) -> Result<Opened> {
        let latest = || {
            let state = lock(&self.state);
            let (generation, t, weak) = state.latest.as_ref()?;
            let ours = *generation == crate::process::generation();
            Some((*t, weak.upgrade().filter(|_| ours)?))
        };
        let parent: Option<(u64, FileHandle)> = previous
            .filter(|(t, _)| *t != txid)
            .map(|(t, h)| (t, h.clone()))
            .or_else(|| latest().filter(|(t, _)| *t != txid));
        let moved = match (&self.log, &parent) {
            (Some(log), Some((t, _))) => log.changes((*t).min(txid), (*t).max(txid)),
            _ => None,
        };
        let checksum_here = moved
            .as_ref()
            .filter(|_| parent.as_ref().is_some_and(|(t, _)| *t < txid))
            .and_then(|m| m.checksum_after);
        let identity = self.name(txid, checksum_here);
        let (handle, kind) = engine.open_snapshot(path, identity, page_size)?;
        let mut ancestor = None;
        if kind == OpenKind::New {
            match (parent, moved) {
                (Some((_, parent)), Some(m)) => engine.inherit(&handle, &parent, m.changed),
                (None, _) => {
                    if let Some((t, a)) = self.restarted_ancestor(engine, path, page_size, txid) {
                        match self.log.as_ref().and_then(|log| log.changes(t, txid)) {
                            Some(m) => {
                                engine.inherit(&handle, &a, m.changed);
                                ancestor = Some(a);
                            }
                            None => {
                                engine.close_file(&a);
                            }
                        }
                    }
                }
                _ => {}
            }
        }
        let mut state = lock(&self.state);
        let generation = crate::process::generation();
        if state
            .latest
            .as_ref()
            .is_none_or(|(g, t, _)| *g != generation || *t <= txid)
        {
            state.latest = Some((generation, txid, Arc::downgrade(&handle)));
        }
        Ok(Opened { handle, ancestor })
    }

    /// The name of the snapshot at `txid`: from the database's checksum there if known (given,
    /// or read from the log), else this process's own.
    fn name(&self, txid: u64, checksum: Option<u64>) -> FileIdentity {
        if let Some(id) = lock(&self.state).names.get(&txid) {
            return *id;
        }
        let checksum = checksum.or_else(|| {
            self.log
                .as_ref()
                .and_then(|log| log.checksum_at(txid, RESTART_LOOKBACK))
        });
        let id = self.name_from(txid, checksum);
        self.remember(txid, id);
        id
    }

    fn name_from(&self, txid: u64, checksum: Option<u64>) -> FileIdentity {
        let source = match checksum {
            Some(c) => source_number(fnv(&[&self.stable.to_le_bytes(), &c.to_le_bytes()])),
            None => self.volatile,
        };
        FileIdentity::snapshot(source, txid)
    }

    fn remember(&self, txid: u64, id: FileIdentity) {
        let mut state = lock(&self.state);
        if state.names.len() >= NAMES_KEPT {
            if let Some(oldest) = state.names.keys().min().copied() {
                state.names.remove(&oldest);
            }
        }
        state.names.insert(txid, id);
    }

    /// The first snapshot this process opens: an earlier one whose pages the extension kept
    /// from a previous process, found by name through the log, opened (for its adoption), with
    /// its TXID.
    fn restarted_ancestor(
        &self,
        engine: &Engine,
        path: &Path,
        page_size: usize,
        txid: u64,
    ) -> Option<(u64, FileHandle)> {
        let log = self.log.as_ref()?;
        if !engine.has_restored_pages_waiting() {
            return None;
        }
        let since = txid.saturating_sub(RESTART_LOOKBACK);
        for (t, checksum) in log.checksums_before(since, txid, RESTART_TAILS) {
            let id = self.name_from(t, Some(checksum));
            if engine.holds_pages_of(id) {
                self.remember(t, id);
                let (handle, _) = engine.open_snapshot(path, id, page_size).ok()?;
                return Some((t, handle));
            }
        }
        None
    }
}
