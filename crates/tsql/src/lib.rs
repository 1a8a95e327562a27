//! SQL Server's operator statements for sqlite-bpe: parsed here, carried out on a [`bpe_core`]
//! [`Engine`]. The core knows nothing of this language; its errors are plain, and this crate
//! words them as SQL Server does (error 868 as `Msg 868`).
//!
//! ```text
//! ALTER SERVER CONFIGURATION SET BUFFER POOL EXTENSION ON (FILENAME = '/ssd/x.bpe', SIZE = 4 GB)
//! ALTER SERVER CONFIGURATION SET BUFFER POOL EXTENSION ON (FILENAME = '/ssd/x.bpe', SIZE = 4 GB, SHARED = OFF)
//! ALTER SERVER CONFIGURATION SET BUFFER POOL EXTENSION OFF
//! EXEC sp_configure 'max server memory (MB)', 256      -- also EXECUTE, N'..', '256', @configname =
//! EXEC sp_configure 'max server memory (MB)'           -- shows the value
//! EXEC sp_configure 'show advanced options', 1         -- accepted, no effect
//! RECONFIGURE [WITH OVERRIDE]
//! DBCC DROPCLEANBUFFERS [WITH NO_INFOMSGS]
//! ```
//!
//! Rules, chosen to catch mistakes rather than guess:
//! - Keywords are case-insensitive; whitespace, newlines and `--` / `/* */` comments go anywhere
//!   between tokens. Statements are self-delimiting as in T-SQL, so `;` and line breaks between
//!   them are optional. `GO` is the client's batch separator, not a statement: it is refused here.
//! - `SIZE` needs a unit, as in SQL Server: KB, MB, GB or TB (binary: 1 KB = 1024 bytes). The
//!   number is a whole number above 0, without a sign; the product must fit in 64 bits. The
//!   same [`parse_size`] reads the sizes of the adapter's PRAGMA and environment variables.
//! - `FILENAME` is an absolute path in single quotes (`''` for a quote inside).
//! - `SHARED = ON | OFF` (sqlite-bpe's own option) says whether the extension is shared with
//!   the other processes of this user that enable one at the same path (ON, the default) or is
//!   this process's own (OFF); left out, the host's configuration decides. Asking for the
//!   other sharing of an extension enabled now at the same path is refused: turn it OFF first.
//! - `max server memory (MB)` is a whole number of megabytes above 0, and takes effect at once
//!   (this engine has no pending configuration, so `RECONFIGURE` is accepted and changes nothing).
//! - Every statement of a text is parsed, then validated against the settings the statements
//!   before it would leave, before any is carried out: a syntax error or a refused value
//!   anywhere changes nothing. Statements then run in order; only a failure the checks cannot
//!   foresee (the disk fills while the extension file is created) stops the rest midway, and
//!   the message says which statements took effect.
//! - `ON` while the extension is enabled at the same path resizes it (dropping its contents);
//!   at another path it is refused. `OFF` while it is disabled does nothing.
//!
//! Errors carry SQL Server's error number where SQL Server has one for the same problem.
//!
//! [`lex`] is the project's one tokenizer of SQL text: the parser reads its tokens, and the
//! shell splits its input into batches and statements with it.

pub mod lex;
mod parser;
pub mod size;

use bpe_core::{Engine, Error, ExtensionState, SettingChange, Sharing};
use size::{in_largest_unit, MB};
pub use size::{parse_size, SizeError};
use std::fmt;
use std::path::{Path, PathBuf};

const MAX_MEMORY_OPTION: &str = "max server memory (MB)";
const ADVANCED_OPTION: &str = "show advanced options";

/// One operator statement.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Statement {
    /// ALTER SERVER CONFIGURATION SET BUFFER POOL EXTENSION ON (FILENAME = .., SIZE = ..
    /// [, SHARED = ON|OFF]); `sharing` None when the statement does not say.
    ExtensionOn {
        path: PathBuf,
        size_bytes: u64,
        sharing: Option<Sharing>,
    },
    /// ALTER SERVER CONFIGURATION SET BUFFER POOL EXTENSION OFF.
    ExtensionOff,
    /// sp_configure 'max server memory (MB)', n.
    MaxServerMemory { megabytes: u64 },
    /// sp_configure 'max server memory (MB)' (no value), or sp_configure alone.
    ShowMaxServerMemory,
    /// sp_configure 'show advanced options' [, 0|1]: accepted so that pasted scripts run; every
    /// option here is always visible, so it changes nothing.
    ShowAdvancedOptions { value: Option<bool> },
    /// RECONFIGURE [WITH OVERRIDE].
    Reconfigure,
    /// DBCC DROPCLEANBUFFERS [WITH NO_INFOMSGS].
    DropCleanBuffers,
}

/// Why a text of statements was refused or failed. The message names the problem.
#[derive(Debug, thiserror::Error)]
pub enum StatementError {
    #[error("Msg 102, Line {line}: Incorrect syntax near '{near}'{}", hint(.expected))]
    Syntax {
        line: usize,
        near: String,
        expected: String,
    },
    #[error("Msg 105, Line {line}: Unclosed quotation mark after the character string '{text}'")]
    UnclosedQuote { line: usize, text: String },
    #[error("Msg 113, Line {line}: Missing end comment mark '*/'")]
    UnclosedComment { line: usize },
    #[error("Line {line}: invalid buffer pool extension SIZE '{text}': {reason}")]
    BadSize {
        line: usize,
        text: String,
        reason: String,
    },
    #[error("Line {line}: invalid buffer pool extension FILENAME '{path}': {reason}")]
    BadPath {
        line: usize,
        path: String,
        reason: String,
    },
    #[error("Msg 15123: The configuration option '{name}' does not exist, or it may be an advanced option (options here: 'max server memory (MB)', 'show advanced options')")]
    UnknownOption { name: String },
    #[error(
        "Msg 15129: '{value}' is not a valid value for configuration option '{name}': {reason}"
    )]
    BadOptionValue {
        name: &'static str,
        value: String,
        reason: String,
    },
    #[error("Msg 2812: Could not find stored procedure '{0}' (only sp_configure is supported)")]
    UnknownProcedure(String),
    #[error("Msg 2526: Incorrect DBCC statement: DBCC {0} is not supported (only DBCC DROPCLEANBUFFERS)")]
    UnknownDbcc(String),
    #[error("no statement to execute")]
    Empty,
    #[error("{}{}", execution_message(.source), refused_at(*.index, *.count))]
    Invalid {
        /// 1-based position of the refused statement; nothing was carried out.
        index: usize,
        count: usize,
        source: Error,
    },
    #[error("{}{}", execution_message(.source), position(*.index, *.count))]
    Execution {
        /// 1-based position of the failed statement; the ones before it took effect.
        index: usize,
        count: usize,
        source: Error,
    },
}

fn hint(expected: &str) -> String {
    if expected.is_empty() {
        String::new()
    } else {
        format!(": expected {expected}")
    }
}

/// At most 40 characters of `text`, for error messages.
fn excerpt(text: &str) -> String {
    match text.char_indices().nth(40) {
        Some((cut, _)) => format!("{}...", &text[..cut]),
        None => text.to_string(),
    }
}

fn refused_at(index: usize, count: usize) -> String {
    match count {
        1 => String::new(),
        _ => format!(" (statement {index} of {count}; nothing was changed)"),
    }
}

fn position(index: usize, count: usize) -> String {
    match (index, count) {
        (_, 1) => String::new(),
        (1, _) => format!(" (statement 1 of {count}; nothing was changed)"),
        (i, _) => format!(" (statement {i} of {count}; the ones before it took effect)"),
    }
}

/// The rules of a `FILENAME` in itself (not empty, no NUL, absolute), also applied to the
/// adapter's `BPE_EXTENSION_FILE`; the machine's rules (its directory, a file there) are the
/// core's, when the extension is enabled.
pub fn check_extension_path(path: &str) -> Result<(), &'static str> {
    if path.is_empty() {
        return Err("the path is empty");
    }
    if path.contains('\0') {
        return Err("the path contains a NUL character");
    }
    if !Path::new(path).is_absolute() {
        return Err("the path must be absolute");
    }
    Ok(())
}

/// A core error as the statements word it (error 868 as SQL Server's `Msg 868`, its sizes in
/// MB or GB), for settings given elsewhere (the adapter's environment) to say the same.
pub fn error_message(e: &Error) -> String {
    execution_message(e)
}

fn execution_message(e: &Error) -> String {
    match e {
        Error::ExtensionNotLargerThanMemory { size, max_memory } => format!(
            "Msg 868: buffer pool extension size ({}) must be larger than max server memory ({})",
            human_bytes(*size),
            human_bytes(*max_memory)
        ),
        // max server memory is set in MB: its errors say MB too (rounded down, so that a
        // machine's 7.8 GB of RAM never reads as more than it is).
        Error::MemoryAbovePhysical {
            requested,
            physical,
        } => format!(
            "max server memory {} MB is above this machine's physical memory ({} MB)",
            requested / MB,
            physical / MB
        ),
        Error::MemoryBelowMinimum { requested, minimum } => format!(
            "max server memory {} is below the minimum of {}",
            mb_text(*requested),
            mb_text(*minimum)
        ),
        Error::MemoryBelowIndex {
            requested,
            index_bytes,
        } => format!(
            "max server memory {} would leave the extension index ({}) more than half of it; shrink or disable the extension first",
            mb_text(*requested),
            human_bytes(*index_bytes)
        ),
        other => other.to_string(),
    }
}

/// A byte count in MB, with a fraction only where it has one (`16 MB`, `0.5 MB`).
fn mb_text(bytes: u64) -> String {
    if bytes.is_multiple_of(MB) {
        format!("{} MB", bytes / MB)
    } else {
        format!("{:.2} MB", bytes as f64 / MB as f64)
    }
}

/// `4 GB`, `1536 KB`, `12345 bytes`: the largest unit that divides the value.
pub fn human_bytes(bytes: u64) -> String {
    let (n, unit) = in_largest_unit(bytes);
    format!("{n} {unit}")
}

/// Parses every statement of `text` and carries them out in order; returns one status line
/// per statement.
pub fn run(engine: &Engine, text: &str) -> Result<String, StatementError> {
    run_statements(engine, &parse(text)?)
}

/// Validates `statements` as a whole, then carries them out in order; returns one status line
/// per statement.
pub fn run_statements(engine: &Engine, statements: &[Statement]) -> Result<String, StatementError> {
    if statements.is_empty() {
        return Err(StatementError::Empty);
    }
    let count = statements.len();
    validate(engine, statements).map_err(|(i, source)| StatementError::Invalid {
        index: i + 1,
        count,
        source,
    })?;
    let mut lines = Vec::with_capacity(count);
    for (i, statement) in statements.iter().enumerate() {
        let line = execute(engine, statement).map_err(|source| StatementError::Execution {
            index: i + 1,
            count,
            source,
        })?;
        lines.push(line);
    }
    Ok(lines.join("\n"))
}

/// Checks every statement against the settings the ones before it would leave, changing
/// nothing. On a refusal: the statement's 0-based index and why.
pub fn validate(engine: &Engine, statements: &[Statement]) -> Result<(), (usize, Error)> {
    // The engine owns the rules: each statement that changes a setting is asked of it, and a
    // refusal is reported at the statement's own index.
    let (at, changes): (Vec<usize>, Vec<SettingChange<'_>>) = statements
        .iter()
        .enumerate()
        .filter_map(|(i, statement)| {
            let change = match statement {
                Statement::ExtensionOn {
                    path,
                    size_bytes,
                    sharing,
                } => SettingChange::ExtensionOn {
                    path,
                    size: *size_bytes,
                    sharing: *sharing,
                },
                Statement::ExtensionOff => SettingChange::ExtensionOff,
                Statement::MaxServerMemory { megabytes } => SettingChange::MaxMemory {
                    bytes: megabytes.saturating_mul(MB),
                },
                Statement::ShowMaxServerMemory
                | Statement::ShowAdvancedOptions { .. }
                | Statement::Reconfigure
                | Statement::DropCleanBuffers => return None,
            };
            Some((i, change))
        })
        .unzip();
    engine.check_changes(&changes).map_err(|(k, e)| (at[k], e))
}

/// Carries out one statement; returns its status line.
pub fn execute(engine: &Engine, statement: &Statement) -> bpe_core::Result<String> {
    Ok(match statement {
        Statement::ExtensionOn {
            path,
            size_bytes,
            sharing,
        } => extension_on(engine, path, *size_bytes, *sharing)?,
        Statement::ExtensionOff => {
            if engine.extension_status().state == ExtensionState::Disabled {
                "Buffer pool extension is already disabled; nothing changed.".into()
            } else {
                engine.disable_extension()?;
                "Buffer pool extension disabled.".into()
            }
        }
        Statement::MaxServerMemory { megabytes } => {
            let old = engine.max_memory();
            engine.set_max_memory(megabytes.saturating_mul(MB))?;
            format!(
                "Configuration option '{MAX_MEMORY_OPTION}' changed from {} to {megabytes}.",
                megabytes_text(old)
            )
        }
        Statement::ShowMaxServerMemory => format!(
            "{MAX_MEMORY_OPTION} = {}",
            megabytes_text(engine.max_memory())
        ),
        Statement::ShowAdvancedOptions { .. } => {
            format!("Configuration option '{ADVANCED_OPTION}' accepted: every option here is always shown.")
        }
        Statement::Reconfigure => {
            "RECONFIGURE: nothing pending (configuration changes apply at once).".into()
        }
        Statement::DropCleanBuffers => {
            if engine.drop_clean_buffers() {
                "DBCC DROPCLEANBUFFERS: clean pages dropped from memory and the extension.".into()
            } else {
                "DBCC DROPCLEANBUFFERS: clean pages dropped from memory; the shared extension's \
                 lock is held by a stopped process: it is emptied when that process lets go, \
                 and nothing is read from it until then."
                    .into()
            }
        }
    })
}

fn extension_on(
    engine: &Engine,
    path: &Path,
    size: u64,
    sharing: Option<Sharing>,
) -> bpe_core::Result<String> {
    let status = engine.extension_status();
    if status.state == ExtensionState::Enabled && status.path.as_deref() == Some(path) {
        if let (Some(asked), Some(enabled)) = (sharing, status.sharing) {
            if asked != enabled {
                return Err(Error::ExtensionSharingDiffers {
                    path: path.to_path_buf(),
                    enabled: enabled.word(),
                    asked: asked.word(),
                });
            }
        }
        if engine.extension_has_size(size) {
            return Ok(format!(
                "Buffer pool extension is already enabled at '{}' with {}; nothing changed.",
                path.display(),
                human_bytes(status.size_bytes)
            ));
        }
        engine.resize_extension(size)?;
        return Ok(format!(
            "Buffer pool extension at '{}' resized from {} to {} (its contents were dropped).",
            path.display(),
            human_bytes(status.size_bytes),
            human_bytes(engine.extension_status().size_bytes)
        ));
    }
    match sharing {
        Some(sharing) => engine.enable_extension_as(path, size, sharing)?,
        None => engine.enable_extension(path, size)?,
    }
    let status = engine.extension_status();
    // Private though sharing was the default: why (see enable_extension).
    let note = status
        .private_because
        .map_or(String::new(), |why| format!(" Note: {why}."));
    Ok(format!(
        "Buffer pool extension enabled at '{}' with {} ({}).{note}",
        path.display(),
        human_bytes(status.size_bytes),
        status.sharing.map_or("", Sharing::word)
    ))
}

fn megabytes_text(bytes: u64) -> String {
    if bytes.is_multiple_of(MB) {
        (bytes / MB).to_string()
    } else {
        format!("{:.2} ({bytes} bytes)", bytes as f64 / MB as f64)
    }
}

/// The canonical text of a statement: parses back to the same statement (for extension sizes
/// in whole kilobytes, as parsed ones are).
impl fmt::Display for Statement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const ALTER: &str = "ALTER SERVER CONFIGURATION SET BUFFER POOL EXTENSION";
        match self {
            Statement::ExtensionOn {
                path,
                size_bytes,
                sharing,
            } => {
                let path = path.to_string_lossy().replace('\'', "''");
                let size = human_bytes(*size_bytes);
                let shared = match sharing {
                    None => "",
                    Some(Sharing::Shared) => ", SHARED = ON",
                    Some(Sharing::Private) => ", SHARED = OFF",
                };
                write!(f, "{ALTER} ON (FILENAME = '{path}', SIZE = {size}{shared})")
            }
            Statement::ExtensionOff => write!(f, "{ALTER} OFF"),
            Statement::MaxServerMemory { megabytes } => {
                write!(f, "EXEC sp_configure '{MAX_MEMORY_OPTION}', {megabytes}")
            }
            Statement::ShowMaxServerMemory => write!(f, "EXEC sp_configure '{MAX_MEMORY_OPTION}'"),
            Statement::ShowAdvancedOptions { value: None } => {
                write!(f, "EXEC sp_configure '{ADVANCED_OPTION}'")
            }
            Statement::ShowAdvancedOptions { value: Some(v) } => {
                write!(f, "EXEC sp_configure '{ADVANCED_OPTION}', {}", u8::from(*v))
            }
            Statement::Reconfigure => write!(f, "RECONFIGURE"),
            Statement::DropCleanBuffers => write!(f, "DBCC DROPCLEANBUFFERS"),
        }
    }
}

/// Parses every statement of `text`. An empty text (or only comments and `;`) gives no statement.
pub fn parse(text: &str) -> Result<Vec<Statement>, StatementError> {
    parser::parse(text)
}
