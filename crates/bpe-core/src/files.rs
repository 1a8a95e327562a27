//! Data files known to the engine: one entry (and one pair of descriptors) per inode, shared by
//! every opener and closed only when the last one closes. Sharing matters beyond economy: closing
//! any descriptor of a file drops all of this process's POSIX locks on it.

use crate::config::{check_page_size, Config};
use crate::io::{DataFile, Emulator, FaultInjector, FileIdentity};
use crate::page::FileId;
use crate::readahead::SequentialDetector;
use crate::{Error, Result};
use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;

pub struct CachedFile {
    pub id: FileId,
    pub data: DataFile,
    identity: FileIdentity,
    page_size: AtomicUsize,
    /// Sequential runs of data-file misses.
    pub readahead: SequentialDetector,
    /// Sequential runs of extension hits (pages evicted in scan order sit in consecutive slots).
    pub extension_readahead: SequentialDetector,
}

impl CachedFile {
    pub fn page_size(&self) -> usize {
        self.page_size.load(Relaxed)
    }
    pub(crate) fn store_page_size(&self, n: usize) {
        self.page_size.store(n, Relaxed);
    }
    pub fn path(&self) -> &Path {
        self.data.path()
    }
}

/// A caller's reference to an open data file.
pub type FileHandle = Arc<CachedFile>;

/// What descriptors and monitors show about a file.
#[derive(Clone, Debug)]
pub struct FileInfo {
    pub id: FileId,
    pub path: PathBuf,
    pub page_size: usize,
    pub direct_io: bool,
    pub openers: usize,
}

#[derive(Default)]
pub struct FileRegistry {
    by_identity: HashMap<FileIdentity, (FileHandle, usize)>,
    free_ids: Vec<FileId>,
    next_id: u32,
}

impl FileRegistry {
    pub fn open(
        &mut self,
        path: &Path,
        page_size: usize,
        config: &Config,
        emulator: Option<Arc<Emulator>>,
        faults: Arc<FaultInjector>,
    ) -> Result<FileHandle> {
        check_page_size(page_size)?;
        let meta = std::fs::metadata(path).map_err(|source| Error::OpenData {
            path: path.to_path_buf(),
            source,
        })?;
        let identity = FileIdentity {
            dev: meta.dev(),
            ino: meta.ino(),
        };
        if let Some((handle, openers)) = self.by_identity.get_mut(&identity) {
            *openers += 1;
            return Ok(handle.clone());
        }
        let id = self.allocate_id()?;
        let opened = DataFile::open(path, config.direct_io, emulator, faults).and_then(
            |(data, identity)| {
                if config.exclusive_owner {
                    data.claim_ownership().map_err(|e| match e.kind() {
                        std::io::ErrorKind::WouldBlock => Error::OwnedByAnotherProcess {
                            path: path.to_path_buf(),
                        },
                        _ => Error::OpenData {
                            path: path.to_path_buf(),
                            source: e,
                        },
                    })?;
                }
                Ok((data, identity))
            },
        );
        let (data, identity) = match opened {
            Ok(x) => x,
            Err(e) => {
                self.free_ids.push(id);
                return Err(e);
            }
        };
        let handle = Arc::new(CachedFile {
            id,
            data,
            identity,
            page_size: AtomicUsize::new(page_size),
            readahead: SequentialDetector::default(),
            extension_readahead: SequentialDetector::default(),
        });
        self.by_identity.insert(identity, (handle.clone(), 1));
        Ok(handle)
    }

    fn allocate_id(&mut self) -> Result<FileId> {
        if let Some(id) = self.free_ids.pop() {
            return Ok(id);
        }
        // 0 marks an empty slot in the extension index, so ids start at 1.
        if self.next_id >= FileId::MAX as u32 {
            return Err(Error::TooManyFiles(FileId::MAX as usize - 1));
        }
        self.next_id += 1;
        Ok(self.next_id as FileId)
    }

    /// Drops one opener. Returns true when it was the last (the caller then forgets its pages).
    pub fn close(&mut self, handle: &FileHandle) -> bool {
        let Some((_, openers)) = self.by_identity.get_mut(&handle.identity) else {
            return false;
        };
        *openers -= 1;
        if *openers > 0 {
            return false;
        }
        self.by_identity.remove(&handle.identity);
        self.free_ids.push(handle.id);
        true
    }

    pub fn infos(&self) -> Vec<FileInfo> {
        let mut v: Vec<FileInfo> = self
            .by_identity
            .values()
            .map(|(h, openers)| FileInfo {
                id: h.id,
                path: h.path().to_path_buf(),
                page_size: h.page_size(),
                direct_io: h.data.is_direct(),
                openers: *openers,
            })
            .collect();
        v.sort_by_key(|f| f.id);
        v
    }

    pub fn max_page_size(&self) -> usize {
        self.by_identity
            .values()
            .map(|(h, _)| h.page_size())
            .max()
            .unwrap_or(0)
    }
}
