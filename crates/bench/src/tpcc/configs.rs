//! The oltp configurations: memory at 100 % or 25 % of the database, an extension of twice or
//! half the database or none, bpe or stock SQLite, and the terminals' writers taking turns in
//! an in-process queue or left to SQLite's own locking.

use crate::child::runs_by_default;
use serde::{Deserialize, Serialize};

/// How the terminals' write transactions get the database's one write lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Writers {
    /// They take turns in an in-process queue, and a connection of its own checkpoints the WAL
    /// (what a multi-threaded application on SQLite arranges to avoid the busy handler's sleeps).
    Queue,
    /// SQLite's own locking, as an application that does nothing more would have it: `BEGIN
    /// IMMEDIATE`, the busy handler (60 s timeout), a retry of a transaction that still fails
    /// with SQLITE_BUSY, and SQLite's autocheckpoint in the committing connection.
    Sqlite,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Memory {
    /// The whole database, with room for what the run adds.
    Full,
    /// A quarter of the database (at least 8 MB).
    Quarter,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Extension {
    None,
    /// Twice the database (and twice memory, at least 64 MB): nothing is evicted.
    Double,
    /// Half the database: the ring wraps and evicts.
    Half,
}

#[derive(Clone, Copy, Debug)]
pub struct OltpConfig {
    pub name: &'static str,
    pub memory: Memory,
    pub extension: Extension,
    /// Stock SQLite (unix VFS, page cache = memory, OS page cache in a memory cgroup).
    pub stock: bool,
    pub writers: Writers,
}

const fn config(
    name: &'static str,
    memory: Memory,
    extension: Extension,
    stock: bool,
    writers: Writers,
) -> OltpConfig {
    OltpConfig {
        name,
        memory,
        extension,
        stock,
        writers,
    }
}

use Extension as E;
use Memory as M;
use Writers as W;

/// Every configuration, in the order they run and print.
pub const CONFIGS: [OltpConfig; 11] = [
    config("memory_100", M::Full, E::None, false, W::Queue),
    config("stock_memory_100", M::Full, E::None, true, W::Queue),
    config("memory_25", M::Quarter, E::None, false, W::Queue),
    config("memory_25_bpe", M::Quarter, E::Double, false, W::Queue),
    config(
        "memory_25_bpe_ext_half",
        M::Quarter,
        E::Half,
        false,
        W::Queue,
    ),
    config("stock_memory_25", M::Quarter, E::None, true, W::Queue),
    config("memory_100_no_queue", M::Full, E::None, false, W::Sqlite),
    config(
        "stock_memory_100_no_queue",
        M::Full,
        E::None,
        true,
        W::Sqlite,
    ),
    config("memory_25_no_queue", M::Quarter, E::None, false, W::Sqlite),
    config(
        "memory_25_bpe_no_queue",
        M::Quarter,
        E::Double,
        false,
        W::Sqlite,
    ),
    config(
        "stock_memory_25_no_queue",
        M::Quarter,
        E::None,
        true,
        W::Sqlite,
    ),
];

impl OltpConfig {
    /// Memory in MB for a database of `db_mb`: bpe's max server memory, stock SQLite's page
    /// cache (shared by its connections).
    pub fn memory_mb(&self, db_mb: u64) -> u64 {
        match self.memory {
            Memory::Full => db_mb * 5 / 4 + 16,
            Memory::Quarter => (db_mb / 4).max(8),
        }
    }

    /// The extension's size in MB, if it has one (always larger than its memory).
    pub fn extension_mb(&self, db_mb: u64) -> Option<u64> {
        let memory = self.memory_mb(db_mb);
        match self.extension {
            Extension::None => None,
            Extension::Double => Some((db_mb * 2).max(memory * 2).max(64)),
            Extension::Half => Some((db_mb / 2).max(memory + 1)),
        }
    }

    /// The stock configuration this one is compared with: stock SQLite at the same memory with
    /// the same writers (None for a stock one).
    pub fn stock_peer(&self) -> Option<&'static OltpConfig> {
        if self.stock {
            return None;
        }
        CONFIGS
            .iter()
            .find(|c| c.stock && c.memory == self.memory && c.writers == self.writers)
    }
}

/// The configurations to run: those `--configs` names (an unknown name is an error), or without
/// it every one, those of stock SQLite only on a real data device.
pub fn plan(filter: Option<&[String]>, emulated: bool) -> anyhow::Result<Vec<&'static OltpConfig>> {
    if let Some(unknown) = filter
        .unwrap_or_default()
        .iter()
        .find(|n| !CONFIGS.iter().any(|c| c.name == n.as_str()))
    {
        anyhow::bail!(
            "oltp has no configuration {unknown:?}; it has {}",
            CONFIGS.map(|c| c.name).join(", ")
        );
    }
    Ok(CONFIGS
        .iter()
        .filter(|c| runs_by_default(filter, c.name, c.stock, emulated))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(filter: Option<&[String]>, emulated: bool) -> Vec<&'static str> {
        plan(filter, emulated)
            .unwrap()
            .iter()
            .map(|c| c.name)
            .collect()
    }

    #[test]
    fn stock_runs_by_default_only_on_a_real_device() {
        let emulated = names(None, true);
        assert!(!emulated.iter().any(|n| n.starts_with("stock_")));
        assert!(emulated.contains(&"memory_25_bpe_no_queue"));
        assert_eq!(names(None, false).len(), CONFIGS.len());
    }

    #[test]
    fn named_configurations_run_even_emulated() {
        let f = ["stock_memory_25".to_string(), "memory_25".to_string()];
        assert_eq!(names(Some(&f), true), ["memory_25", "stock_memory_25"]);
    }

    #[test]
    fn an_unknown_name_is_an_error_naming_it() {
        let f = ["memory_50".to_string()];
        let e = plan(Some(&f), false).unwrap_err().to_string();
        assert!(
            e.contains("\"memory_50\"") && e.contains("memory_25_bpe"),
            "{e}"
        );
    }

    #[test]
    fn every_bpe_configuration_has_a_stock_peer_with_its_memory_and_writers() {
        for c in CONFIGS.iter().filter(|c| !c.stock) {
            let p = c
                .stock_peer()
                .unwrap_or_else(|| panic!("{} has no peer", c.name));
            assert!(p.stock && p.memory == c.memory && p.writers == c.writers);
        }
        let peer = |n: &str| CONFIGS.iter().find(|c| c.name == n).unwrap().stock_peer();
        assert_eq!(
            peer("memory_25_bpe_no_queue").unwrap().name,
            "stock_memory_25_no_queue"
        );
        assert_eq!(peer("memory_100").unwrap().name, "stock_memory_100");
    }

    #[test]
    fn half_extension_is_half_the_database_and_larger_than_memory() {
        let half = CONFIGS
            .iter()
            .find(|c| c.extension == Extension::Half)
            .unwrap();
        assert_eq!(half.extension_mb(800), Some(400));
        assert_eq!(half.memory_mb(800), 200);
        // A tiny database: memory's 8 MB floor wins over half of 10 MB.
        assert_eq!(half.extension_mb(10), Some(9));
    }
}
