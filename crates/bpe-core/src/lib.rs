//! sqlite-bpe's engine-agnostic core: an instance-wide RAM buffer pool (L1) and a buffer pool
//! extension on fast local storage (L2) holding clean pages only, over data files read with
//! O_DIRECT. Nothing here knows about SQLite: callers name pages by (file, page number).
//!
//! Start at [`Engine`]: `engine/data_path.rs` is where a page goes on a read and a write.

#![deny(clippy::undocumented_unsafe_blocks)]

/// An invariant the cache's promises rest on (never a stale page, clean pages only, entries
/// that point at bytes that are there): checked in debug builds, and in every build with the
/// `strict` feature (the Shuttle and simulation runs in CI), as foyer's `strict_assert!`.
macro_rules! strict_assert {
    ($($arg:tt)+) => {
        if cfg!(any(debug_assertions, feature = "strict")) {
            assert!($($arg)+);
        }
    };
}

pub mod config;
pub mod counters;
mod engine;
pub mod error;
mod extension;
mod files;
mod io;
pub mod lineage;
pub mod page;
/// Named points where a test can stop the process between a read of shared state and a write.
pub mod pause;
/// Public with the `testing` feature, for the replacement-policy study (tools/policy-study),
/// which drives L1 on traces.
#[cfg(feature = "testing")]
pub mod pool;
#[cfg(not(feature = "testing"))]
mod pool;
pub mod published;
mod readahead;
/// The ranked locks, for clients that keep per-file state under the engine's lock order.
pub mod sync;

pub use config::{Config, DeviceEmulation, Sharing};
pub use counters::{CounterKind, CounterRow, CounterSnapshot, HistogramSnapshot};
pub use engine::{
    check_extension_size, check_max_memory, effective_extension_size, BehindLog, BufferDescriptor,
    Engine, ExtensionState, ExtensionStatus, PageRead, PinnedPage, SettingChange, Settings, Via,
};
pub use error::{Error, ExtensionRefusal, Result};
/// The shared extension's protocol (one index for the processes of a machine), public with the
/// `testing` feature for its multi-process crash tests.
#[cfg(feature = "testing")]
pub use extension::shared;
/// Where the shared memory of the extension file `identity` lives (/dev/shm), for tools that
/// measure or clean it.
pub use extension::shared::memory_path as shared_memory_path;
pub use extension::{initial_index_bytes, MIN_EXTENSION_BYTES};
pub use files::{
    CachedFile, FileHandle, FileInfo, KnownStamp, OpenKind, OpenRequest, PARKED_FILES, RACY_WINDOW,
};
pub use io::aligned::{hold_large_spares, Scratch, READAHEAD_BUFFERS_KEPT_BYTES};
pub use io::clock::monotonic_ns;
/// Opening the files kept beside the user's: never through a symbolic link.
pub use io::own_file;
pub use io::{AlignedBuf, DataDevice, DeviceCharges, DeviceOp, FileIdentity, FileStamp};
pub use page::{FileKey, PageKey, Tier};
