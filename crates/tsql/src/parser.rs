//! The statements' grammar: a hand-written recursive-descent parser over [`lex`] tokens.

use crate::lex::{self, Kind, Token};
use crate::size::{parse_size, MB};
use crate::{excerpt, Statement, StatementError, ADVANCED_OPTION, MAX_MEMORY_OPTION};
use bpe_core::Sharing;
use std::path::PathBuf;

pub(super) fn parse(text: &str) -> Result<Vec<Statement>, StatementError> {
    let tokens = lex::tokens(text)?;
    let mut parser = Parser { tokens, pos: 0 };
    let mut out = Vec::new();
    while let Some(token) = parser.peek() {
        if token.is(';') {
            parser.pos += 1;
        } else {
            out.push(parser.statement()?);
        }
    }
    Ok(out)
}

struct Parser {
    tokens: Vec<Token>,
    pos: usize,
}

/// A value given to sp_configure, as written.
enum OptionValue {
    Number { negative: bool, digits: String },
    Text(String),
}

impl Parser {
    fn peek(&self) -> Option<&Token> {
        self.tokens.get(self.pos)
    }

    /// A syntax error at the current token (or the last one, at the end of the text).
    fn syntax(&self, expected: &str) -> StatementError {
        let token = self.peek().or(self.tokens.last());
        StatementError::Syntax {
            line: token.map_or(1, |t| t.line),
            near: token.map_or_else(String::new, |t| excerpt(&t.text)),
            expected: expected.into(),
        }
    }

    fn at_word(&self, word: &str) -> bool {
        self.peek().is_some_and(|t| t.is_word(word))
    }

    fn at(&self, c: char) -> bool {
        self.peek().is_some_and(|t| t.is(c))
    }

    fn eat_word(&mut self, word: &str) -> bool {
        let found = self.at_word(word);
        self.pos += usize::from(found);
        found
    }

    fn eat(&mut self, c: char) -> bool {
        let found = self.at(c);
        self.pos += usize::from(found);
        found
    }

    fn expect_words(&mut self, words: &[&str]) -> Result<(), StatementError> {
        for word in words {
            if !self.eat_word(word) {
                return Err(self.syntax(word));
            }
        }
        Ok(())
    }

    fn expect(&mut self, c: char) -> Result<(), StatementError> {
        if self.eat(c) {
            Ok(())
        } else {
            Err(self.syntax(&format!("'{c}'")))
        }
    }

    fn statement(&mut self) -> Result<Statement, StatementError> {
        const START: &str =
            "ALTER SERVER CONFIGURATION, EXEC sp_configure, RECONFIGURE or DBCC DROPCLEANBUFFERS";
        if self.eat_word("ALTER") {
            self.alter()
        } else if self.eat_word("EXEC") || self.eat_word("EXECUTE") {
            self.exec()
        } else if self.eat_word("RECONFIGURE") {
            if self.eat_word("WITH") {
                self.expect_words(&["OVERRIDE"])?;
            }
            Ok(Statement::Reconfigure)
        } else if self.eat_word("DBCC") {
            self.dbcc()
        } else if self.at_word("GO") {
            Err(self.syntax("a statement (GO is a batch separator of the client, not a statement)"))
        } else if matches!(self.peek().map(|t| &t.kind), Some(Kind::Word(_))) {
            // T-SQL runs a procedure named first in a batch without EXEC.
            let start = self.pos;
            match self.procedure_name() {
                Ok(name) if name.eq_ignore_ascii_case("sp_configure") => self.sp_configure(),
                _ => {
                    self.pos = start;
                    Err(self.syntax(START))
                }
            }
        } else {
            Err(self.syntax(START))
        }
    }

    fn alter(&mut self) -> Result<Statement, StatementError> {
        self.expect_words(&[
            "SERVER",
            "CONFIGURATION",
            "SET",
            "BUFFER",
            "POOL",
            "EXTENSION",
        ])?;
        if self.eat_word("OFF") {
            return Ok(Statement::ExtensionOff);
        }
        if !self.eat_word("ON") {
            return Err(self.syntax("ON or OFF"));
        }
        self.expect('(')?;
        let (mut path, mut size, mut sharing) = (None, None, None);
        loop {
            if self.at_word("FILENAME") {
                if path.is_some() {
                    return Err(self.syntax("FILENAME only once"));
                }
                self.pos += 1;
                self.expect('=')?;
                path = Some(self.extension_path()?);
            } else if self.at_word("SIZE") {
                if size.is_some() {
                    return Err(self.syntax("SIZE only once"));
                }
                self.pos += 1;
                self.expect('=')?;
                size = Some(self.size()?);
            } else if self.at_word("SHARED") {
                if sharing.is_some() {
                    return Err(self.syntax("SHARED only once"));
                }
                self.pos += 1;
                self.expect('=')?;
                sharing = Some(if self.eat_word("ON") {
                    Sharing::Shared
                } else if self.eat_word("OFF") {
                    Sharing::Private
                } else {
                    return Err(self.syntax("SHARED = ON or SHARED = OFF"));
                });
            } else {
                return Err(
                    self.syntax("FILENAME = '<path>', SIZE = <n> KB|MB|GB|TB or SHARED = ON|OFF")
                );
            }
            if !self.eat(',') {
                break;
            }
        }
        if !self.at(')') {
            return Err(self.syntax("')'"));
        }
        match (path, size) {
            (Some(path), Some(size_bytes)) => {
                self.pos += 1;
                Ok(Statement::ExtensionOn {
                    path,
                    size_bytes,
                    sharing,
                })
            }
            (None, _) => {
                Err(self.syntax("FILENAME = '<path>' (both FILENAME and SIZE are required)"))
            }
            (_, None) => {
                Err(self.syntax("SIZE = <n> KB|MB|GB|TB (both FILENAME and SIZE are required)"))
            }
        }
    }

    fn extension_path(&mut self) -> Result<PathBuf, StatementError> {
        let Some(Token {
            kind: Kind::Str(path),
            line,
            ..
        }) = self.peek().cloned()
        else {
            return Err(self.syntax("a path in single quotes"));
        };
        self.pos += 1;
        let bad = |reason: &str| StatementError::BadPath {
            line,
            path: path.clone(),
            reason: reason.into(),
        };
        crate::check_extension_path(&path).map_err(bad)?;
        Ok(PathBuf::from(path))
    }

    /// `<n> KB|MB|GB|TB`, as [`parse_size`] reads it; blanks and comments may stand between the
    /// number and its unit, as between any tokens.
    fn size(&mut self) -> Result<u64, StatementError> {
        let line = self.peek().map_or(1, |t| t.line);
        let sign = if self.eat('-') {
            "-"
        } else if self.eat('+') {
            "+"
        } else {
            ""
        };
        let Some(Token {
            kind: Kind::Number(digits),
            ..
        }) = self.peek().cloned()
        else {
            return Err(self.syntax("a size such as 4 GB"));
        };
        self.pos += 1;
        let unit = match self.peek().map(|t| t.kind.clone()) {
            Some(Kind::Word(w)) => {
                self.pos += 1;
                format!(" {w}")
            }
            _ => String::new(),
        };
        let written = format!("{sign}{digits}{unit}");
        parse_size(&written).map_err(|e| StatementError::BadSize {
            line,
            reason: e.to_string(),
            text: written,
        })
    }

    fn dbcc(&mut self) -> Result<Statement, StatementError> {
        match self.peek().cloned() {
            Some(t) if t.is_word("DROPCLEANBUFFERS") => {
                self.pos += 1;
                if self.eat_word("WITH") {
                    self.expect_words(&["NO_INFOMSGS"])?;
                }
                Ok(Statement::DropCleanBuffers)
            }
            Some(Token {
                kind: Kind::Word(w),
                ..
            }) => Err(StatementError::UnknownDbcc(w)),
            _ => Err(self.syntax("DROPCLEANBUFFERS")),
        }
    }

    /// `[master.][sys|dbo.]name` (also `master..name`); returns the last part.
    fn procedure_name(&mut self) -> Result<String, StatementError> {
        let mut parts = Vec::new();
        loop {
            match self.peek().map(|t| t.kind.clone()) {
                Some(Kind::Word(w)) => {
                    self.pos += 1;
                    parts.push(w);
                }
                // master..sp_configure
                _ if self.at('.') && !parts.is_empty() => parts.push(String::new()),
                _ => return Err(self.syntax("a procedure name")),
            }
            if !self.eat('.') {
                break;
            }
        }
        let name = parts.pop().unwrap_or_default();
        let qualifiers_ok = parts.len() <= 2
            && parts.iter().all(|p| {
                ["", "master", "sys", "dbo"]
                    .iter()
                    .any(|q| p.eq_ignore_ascii_case(q))
            });
        if !qualifiers_ok {
            parts.push(name);
            return Err(StatementError::UnknownProcedure(parts.join(".")));
        }
        Ok(name)
    }

    fn exec(&mut self) -> Result<Statement, StatementError> {
        let name = self.procedure_name()?;
        if !name.eq_ignore_ascii_case("sp_configure") {
            return Err(StatementError::UnknownProcedure(name));
        }
        self.sp_configure()
    }

    /// The arguments of sp_configure: `['option' [, value]]`, positional or named.
    fn sp_configure(&mut self) -> Result<Statement, StatementError> {
        let name = match self.peek() {
            Some(t) if matches!(t.kind, Kind::Str(_)) || t.is_word("@configname") => {
                self.named("@configname")?;
                match self.peek().map(|t| t.kind.clone()) {
                    Some(Kind::Str(s)) => {
                        self.pos += 1;
                        s
                    }
                    _ => return Err(self.syntax("the option name in single quotes")),
                }
            }
            // sp_configure alone lists the options: here, the one that matters.
            _ => return Ok(Statement::ShowMaxServerMemory),
        };
        let value = if self.eat(',') {
            self.named("@configvalue")?;
            Some(self.option_value()?)
        } else {
            None
        };
        let normalized = name.split_whitespace().collect::<Vec<_>>().join(" ");
        match normalized.to_ascii_lowercase().as_str() {
            "max server memory (mb)" | "max server memory" => match value {
                None => Ok(Statement::ShowMaxServerMemory),
                Some(v) => Ok(Statement::MaxServerMemory {
                    megabytes: megabytes(v)?,
                }),
            },
            "show advanced options" | "show advanced option" => match value {
                None => Ok(Statement::ShowAdvancedOptions { value: None }),
                Some(v) => Ok(Statement::ShowAdvancedOptions {
                    value: Some(advanced_flag(v)?),
                }),
            },
            _ => Err(StatementError::UnknownOption { name }),
        }
    }

    /// An optional `@name =` before an argument.
    fn named(&mut self, parameter: &str) -> Result<(), StatementError> {
        if self.eat_word(parameter) {
            self.expect('=')?;
        }
        Ok(())
    }

    fn option_value(&mut self) -> Result<OptionValue, StatementError> {
        let negative = self.eat('-');
        let value = match self.peek().map(|t| t.kind.clone()) {
            Some(Kind::Number(digits)) => OptionValue::Number { negative, digits },
            Some(Kind::Str(text)) if !negative => OptionValue::Text(text),
            _ => return Err(self.syntax("a value such as 256")),
        };
        self.pos += 1;
        Ok(value)
    }
}

/// The value of 'max server memory (MB)': a whole number of megabytes above 0.
fn megabytes(value: OptionValue) -> Result<u64, StatementError> {
    let (negative, digits) = match value {
        OptionValue::Number { negative, digits } => (negative, digits),
        // '256' and N'256' convert as SQL Server converts them to int.
        OptionValue::Text(text) => {
            let t = text.trim();
            let (negative, digits) = match t.strip_prefix('-') {
                Some(rest) => (true, rest),
                None => (false, t),
            };
            if digits.is_empty() || !digits.chars().all(|c| c.is_ascii_digit() || c == '.') {
                return Err(StatementError::BadOptionValue {
                    name: MAX_MEMORY_OPTION,
                    value: text,
                    reason: "not a number".into(),
                });
            }
            (negative, digits.to_string())
        }
    };
    let written = format!("{}{digits}", if negative { "-" } else { "" });
    let bad = |reason: &str| StatementError::BadOptionValue {
        name: MAX_MEMORY_OPTION,
        value: written.clone(),
        reason: reason.into(),
    };
    if negative {
        return Err(bad("it must be positive"));
    }
    if digits.contains('.') {
        return Err(bad("it must be a whole number of megabytes"));
    }
    let too_large = || bad("it is too large");
    let mb: u64 = digits.parse().map_err(|_| too_large())?;
    if mb == 0 {
        return Err(bad("it must be at least 1"));
    }
    mb.checked_mul(MB).ok_or_else(too_large)?;
    Ok(mb)
}

fn advanced_flag(value: OptionValue) -> Result<bool, StatementError> {
    let written = match value {
        OptionValue::Number { negative, digits } => {
            format!("{}{digits}", if negative { "-" } else { "" })
        }
        OptionValue::Text(t) => t.trim().to_string(),
    };
    match written.as_str() {
        "0" => Ok(false),
        "1" => Ok(true),
        _ => Err(StatementError::BadOptionValue {
            name: ADVANCED_OPTION,
            value: written,
            reason: "it must be 0 or 1".into(),
        }),
    }
}
