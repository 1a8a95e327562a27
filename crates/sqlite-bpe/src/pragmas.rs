//! PRAGMAs on `bpe` databases, for people who think in SQLite terms. Each maps onto the same
//! operator statement `bpe_exec` runs, so validation and messages are the same.
//!
//! | pragma | does |
//! |---|---|
//! | `PRAGMA bpe_max_server_memory_mb` / `= N` | show / set max server memory (MB) |
//! | `PRAGMA bpe_extension` | show the extension's state, path and size |
//! | `PRAGMA bpe_extension = '/abs/path.bpe,4GB'` | enable it (or resize it, same path) |
//! | `PRAGMA bpe_extension = off` | disable it |
//! | `PRAGMA bpe_drop_clean_buffers` | empty both tiers (DBCC DROPCLEANBUFFERS) |

use crate::env_config::parse_size;
use bpe_tsql::{run_statements, Statement};

/// Runs a bpe PRAGMA. None: not ours (SQLite handles it); Some(Ok(text)) / Some(Err(message)).
pub fn run(name: &str, value: Option<&str>) -> Option<Result<String, String>> {
    let name = name.to_ascii_lowercase();
    let value = value.map(|v| v.trim().trim_matches(|c| c == '\'' || c == '"'));
    let engine = crate::process::engine();
    let statement = match (name.as_str(), value) {
        ("bpe_max_server_memory_mb", None) => {
            return Some(Ok((engine.max_memory() >> 20).to_string()));
        }
        ("bpe_max_server_memory_mb", Some(v)) => {
            if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
                return Some(Err(format!(
                    "bpe_max_server_memory_mb: {v:?} is not a whole number of MB"
                )));
            }
            match v.parse() {
                Ok(megabytes) => Statement::MaxServerMemory { megabytes },
                Err(_) => {
                    return Some(Err(format!("bpe_max_server_memory_mb: {v:?} is too large")))
                }
            }
        }
        ("bpe_extension", None) => {
            let s = engine.extension_status();
            let path = s.path.map(|p| p.display().to_string()).unwrap_or_default();
            let mut out = format!("{} {} {}", s.state.description(), path, s.size_bytes);
            if let Some(f) = s.last_failure {
                out += &format!(" (last failure: {f})");
            }
            if let Some(why) = s.private_because {
                out += &format!(" (private: {why})");
            }
            return Some(Ok(out));
        }
        ("bpe_extension", Some(v)) if v.eq_ignore_ascii_case("off") => Statement::ExtensionOff,
        ("bpe_extension", Some(v)) => {
            let Some((path, size)) = v.rsplit_once(',') else {
                return Some(Err(format!(
                    "bpe_extension: expected 'path,size' or off, got {v:?}"
                )));
            };
            let bytes = match parse_size("bpe_extension size", size) {
                Ok(b) => b,
                Err(e) => return Some(Err(e)),
            };
            let path = std::path::PathBuf::from(path.trim());
            if !path.is_absolute() {
                return Some(Err(format!(
                    "bpe_extension: the path {path:?} must be absolute"
                )));
            }
            Statement::ExtensionOn {
                path,
                size_bytes: bytes,
                sharing: None,
            }
        }
        ("bpe_drop_clean_buffers", _) => Statement::DropCleanBuffers,
        _ => return None,
    };
    Some(run_statements(&engine, &[statement]).map_err(|e| e.to_string()))
}
