//! `BPE_CACHE_PATHS`: which main databases the pool caches. With `bpe` as the default VFS every
//! database a host opens goes through the VFS, its snapshot, backup and scratch copies too; they
//! would fill the pool and the extension with pages nobody reads again. A main database outside
//! the scope is opened by the unix VFS in place, exactly as without the extension (its journal
//! and WAL always are).
//!
//! The value is a `:`-separated list of absolute entries: a directory (every database under it,
//! at any depth) or a file, or a glob pattern (`*`, `?`, `[...]`; `*` stays within one path
//! component, `**` crosses them). Unset: every main database is cached. A wrong value fails the
//! load, naming the variable and the entry.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

pub const VAR: &str = "BPE_CACHE_PATHS";

static SCOPE: OnceLock<Scope> = OnceLock::new();

#[derive(Debug)]
enum Entry {
    Under(PathBuf),
    Matching(glob::Pattern),
}

/// The databases to cache; no entries: all of them.
#[derive(Debug, Default)]
pub struct Scope {
    entries: Vec<Entry>,
}

const MATCH: glob::MatchOptions = glob::MatchOptions {
    case_sensitive: true,
    require_literal_separator: true,
    require_literal_leading_dot: false,
};

impl Scope {
    pub fn parse(value: &str) -> Result<Scope, String> {
        let bad = |entry: &str, why: &str| format!("{VAR}={value:?}: {entry:?} {why}");
        let mut entries = Vec::new();
        for entry in value.split(':') {
            if entry.trim().is_empty() {
                return Err(bad(entry, "is empty (entries are separated by ':')"));
            }
            if !entry.starts_with('/') {
                return Err(bad(entry, "is not an absolute path"));
            }
            if entry.contains(['*', '?', '[']) {
                let pattern = glob::Pattern::new(entry)
                    .map_err(|e| bad(entry, &format!("is not a glob pattern: {e}")))?;
                entries.push(Entry::Matching(pattern));
            } else {
                // SQLite names a database by its full path with symbolic links resolved.
                let dir = std::fs::canonicalize(entry).unwrap_or_else(|_| PathBuf::from(entry));
                entries.push(Entry::Under(dir));
            }
        }
        Ok(Scope { entries })
    }

    pub fn covers(&self, path: &Path) -> bool {
        self.entries.is_empty()
            || self.entries.iter().any(|e| match e {
                Entry::Under(dir) => path.starts_with(dir),
                // A pattern is text (the variable is UTF-8); a name's other bytes are matched
                // as U+FFFD, which `*` and `?` match (glob's own path match refuses them).
                Entry::Matching(p) => p.matches_with(&path.to_string_lossy(), MATCH),
            })
    }
}

/// Reads the variable, once per process (with the rest of the environment).
pub fn configure_from_env() -> Result<(), String> {
    if SCOPE.get().is_some() {
        return Ok(());
    }
    let scope = match std::env::var(VAR) {
        Ok(v) => Scope::parse(&v)?,
        Err(std::env::VarError::NotPresent) => Scope::default(),
        Err(std::env::VarError::NotUnicode(_)) => return Err(format!("{VAR} is not UTF-8")),
    };
    let _ = SCOPE.set(scope);
    Ok(())
}

/// Whether the main database at `path` (SQLite's full path name) is cached.
pub fn covers(path: &Path) -> bool {
    SCOPE.get().is_none_or(|s| s.covers(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directories_files_and_globs_choose_the_databases() {
        let s =
            Scope::parse("/srv/app/data:/srv/one.db:/var/db/*.sqlite:/home/**/live.db").unwrap();
        for yes in [
            "/srv/app/data/main.db",
            "/srv/app/data/tenants/7.db",
            "/srv/one.db",
            "/var/db/users.sqlite",
            "/home/ann/projects/live.db",
        ] {
            assert!(s.covers(Path::new(yes)), "{yes}");
        }
        for no in [
            "/srv/app/data-backup/main.db",
            "/srv/one.db.bak",
            "/var/db/sub/users.sqlite",
            "/var/db/users.sqlite.snapshot",
            "/tmp/vacuum-into.db",
        ] {
            assert!(!s.covers(Path::new(no)), "{no}");
        }
        assert!(Scope::default().covers(Path::new("/anything.db")));
    }

    #[test]
    fn a_name_that_is_not_utf8_is_matched_by_directories_and_globs_alike() {
        use std::os::unix::ffi::OsStrExt;
        let name = Path::new(std::ffi::OsStr::from_bytes(b"/var/db/caf\xe9.sqlite"));
        for value in [
            "/var/db",
            "/var/db/*.sqlite",
            "/var/db/caf?.sqlite",
            "/var/**",
        ] {
            assert!(Scope::parse(value).unwrap().covers(name), "{value}");
        }
        assert!(!Scope::parse("/var/db/*.db").unwrap().covers(name));
    }

    #[test]
    fn a_wrong_entry_is_refused_by_name() {
        for (value, says) in [
            ("data/main.db", "\"data/main.db\" is not an absolute path"),
            ("/srv/a.db::/srv/b.db", "\"\" is empty"),
            ("/srv/[a.db", "is not a glob pattern"),
            ("", "is empty"),
        ] {
            let e = Scope::parse(value).unwrap_err();
            assert!(e.starts_with(VAR) && e.contains(says), "{value:?}: {e}");
        }
    }
}
