//! The one tokenizer of the project's SQL text: T-SQL, as much of it as the operator statements
//! need, and enough of SQLite's for the shell to find statement ends and rewrite names.
//!
//! [`scan`] cuts any text into [`Piece`]s that cover it end to end, and never fails: a string,
//! quoted identifier or comment left open runs to the end of the text and says so. The two
//! dialects differ only in `"` and `` ` ``: quotes in SQLite, punctuation in the statements. On
//! top of it:
//! - the statement parser's tokens, which drop blanks and comments and refuse what was left
//!   open, with SQL Server's messages;
//! - [`is_blank`] and [`go_count`], with which the shell reads its input (its statement ends
//!   and DMV names are found on the pieces too).

use crate::{excerpt, StatementError};

/// What a piece of text is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PieceKind {
    /// Whitespace.
    Blank,
    /// `-- ...` to the end of the line (the newline is not part of it).
    LineComment,
    /// `/* ... */` (not nested).
    BlockComment { closed: bool },
    /// A string literal, `'...'` or `N'...'`; `''` inside stands for one quote.
    Str { closed: bool },
    /// A quoted identifier: `[...]`, or in [`Dialect::Sqlite`] `"..."` and `` `...` `` (a
    /// doubled quote inside those stands for one). `open` is its first character.
    Quoted { open: char, closed: bool },
    /// A keyword or identifier: letters, digits, `_ @ # $` and any other non-ASCII character,
    /// not starting with a digit or `$`.
    Word,
    /// Digits, possibly with a fraction (`1.5`, `4.`).
    Number,
    /// Any other character: `;`, `(`, `.`, `=`, ...
    Punct(char),
}

/// A piece of a text: its kind, its byte range, and the 1-based line it starts on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Piece {
    pub kind: PieceKind,
    pub start: usize,
    pub end: usize,
    pub line: usize,
}

impl Piece {
    /// The piece as written in `source` (the text it was scanned from).
    pub fn text<'a>(&self, source: &'a str) -> &'a str {
        &source[self.start..self.end]
    }

    /// Whitespace or a comment: nothing to any statement.
    pub fn is_blank(&self) -> bool {
        matches!(
            self.kind,
            PieceKind::Blank | PieceKind::LineComment | PieceKind::BlockComment { .. }
        )
    }

    /// A word or a number: what the shell counts as a statement's words.
    pub fn is_word_or_number(&self) -> bool {
        matches!(self.kind, PieceKind::Word | PieceKind::Number)
    }
}

fn is_word_start(c: char) -> bool {
    c.is_ascii_alphabetic() || matches!(c, '_' | '@' | '#') || (!c.is_ascii() && !c.is_whitespace())
}

fn is_word_char(c: char) -> bool {
    is_word_start(c) || c.is_ascii_digit() || c == '$'
}

/// Which quotes make identifiers besides T-SQL's `[...]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dialect {
    /// The operator statements': `"` and `` ` `` are punctuation (no statement takes them).
    TSql,
    /// Text that may be SQLite's too, as the shell reads it: `"..."` and `` `...` `` are
    /// quoted identifiers, never split or rewritten inside.
    Sqlite,
}

/// Cuts `text` into pieces covering it end to end, as the shell reads it ([`Dialect::Sqlite`]).
pub fn scan(text: &str) -> Vec<Piece> {
    scan_as(text, Dialect::Sqlite)
}

/// Cuts `text` into pieces covering it end to end.
pub fn scan_as(text: &str, dialect: Dialect) -> Vec<Piece> {
    let mut scanner = Scanner {
        text,
        dialect,
        pos: 0,
        line: 1,
    };
    let mut out = Vec::new();
    while let Some(piece) = scanner.next_piece() {
        out.push(piece);
    }
    out
}

struct Scanner<'a> {
    text: &'a str,
    dialect: Dialect,
    pos: usize,
    line: usize,
}

impl Scanner<'_> {
    fn peek_at(&self, offset: usize) -> Option<char> {
        self.text[self.pos..].chars().nth(offset)
    }

    fn bump(&mut self) -> Option<char> {
        let c = self.text[self.pos..].chars().next()?;
        self.pos += c.len_utf8();
        if c == '\n' {
            self.line += 1;
        }
        Some(c)
    }

    /// Consumes characters while `keep` holds.
    fn bump_while(&mut self, keep: impl Fn(char) -> bool) {
        while self.peek_at(0).is_some_and(&keep) {
            self.bump();
        }
    }

    /// Consumes up to and including `close`, where a doubled `close` stands for one when
    /// `doubled`; returns whether it was found before the end of the text.
    fn bump_quoted(&mut self, close: char, doubled: bool) -> bool {
        while let Some(c) = self.bump() {
            if c == close {
                if doubled && self.peek_at(0) == Some(close) {
                    self.bump();
                } else {
                    return true;
                }
            }
        }
        false
    }

    fn next_piece(&mut self) -> Option<Piece> {
        let (start, line) = (self.pos, self.line);
        let c = self.bump()?;
        let next = self.peek_at(0);
        let kind = match c {
            c if c.is_whitespace() => {
                self.bump_while(char::is_whitespace);
                PieceKind::Blank
            }
            '-' if next == Some('-') => {
                self.bump_while(|c| c != '\n');
                PieceKind::LineComment
            }
            '/' if next == Some('*') => {
                self.bump();
                let closed = match self.text[self.pos..].find("*/") {
                    Some(at) => {
                        self.advance_to(self.pos + at + 2);
                        true
                    }
                    None => {
                        self.advance_to(self.text.len());
                        false
                    }
                };
                PieceKind::BlockComment { closed }
            }
            '\'' => PieceKind::Str {
                closed: self.bump_quoted('\'', true),
            },
            'N' | 'n' if next == Some('\'') => {
                self.bump();
                PieceKind::Str {
                    closed: self.bump_quoted('\'', true),
                }
            }
            '[' => PieceKind::Quoted {
                open: c,
                closed: self.bump_quoted(']', false),
            },
            '"' | '`' if self.dialect == Dialect::Sqlite => PieceKind::Quoted {
                open: c,
                closed: self.bump_quoted(c, true),
            },
            c if c.is_ascii_digit() => {
                self.bump_while(|c| c.is_ascii_digit());
                if self.peek_at(0) == Some('.') {
                    self.bump();
                    self.bump_while(|c| c.is_ascii_digit());
                }
                PieceKind::Number
            }
            c if is_word_start(c) => {
                self.bump_while(is_word_char);
                PieceKind::Word
            }
            c => PieceKind::Punct(c),
        };
        Some(Piece {
            kind,
            start,
            end: self.pos,
            line,
        })
    }

    /// Moves to byte `to`, counting the lines passed.
    fn advance_to(&mut self, to: usize) {
        self.line += self.text[self.pos..to].matches('\n').count();
        self.pos = to;
    }
}

/// Only whitespace, comments and empty statements (`;`).
pub fn is_blank(text: &str) -> bool {
    scan(text)
        .iter()
        .all(|p| p.is_blank() || p.kind == PieceKind::Punct(';'))
}

/// `GO` or `GO n` alone on a line (a trailing `--` comment allowed), as sqlcmd reads it: the
/// client's batch separator, never a statement. `Some(Err)` for a GO line with a bad count.
pub fn go_count(line: &str) -> Option<Result<u64, String>> {
    let code_end = scan(line)
        .iter()
        .find(|p| p.kind == PieceKind::LineComment)
        .map_or(line.len(), |p| p.start);
    let code = line[..code_end].trim();
    let mut words = code.split_whitespace();
    if !words.next()?.eq_ignore_ascii_case("go") {
        return None;
    }
    let count = match (words.next(), words.next()) {
        (None, _) => Ok(1),
        (Some(n), None) => match n.parse::<u64>() {
            Ok(0) => Err("GO count must be at least 1".to_string()),
            Ok(n) => Ok(n),
            Err(_) => Err(format!("GO count '{n}' is not a whole number")),
        },
        _ => Err(format!("a GO line takes at most one count: '{code}'")),
    };
    Some(count)
}

/// A token of the statement grammar.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Kind {
    /// A keyword or identifier (`[bracketed]` ones unquoted).
    Word(String),
    /// A string literal, unescaped; `N'..'` too.
    Str(String),
    /// Digits, possibly with a fraction (kept as text so errors can quote it).
    Number(String),
    Punct(char),
}

#[derive(Clone, Debug)]
pub(crate) struct Token {
    pub kind: Kind,
    /// The token as written (for "near '...'" in errors).
    pub text: String,
    pub line: usize,
}

impl Token {
    pub fn is(&self, c: char) -> bool {
        self.kind == Kind::Punct(c)
    }
    pub fn is_word(&self, word: &str) -> bool {
        matches!(&self.kind, Kind::Word(w) if w.eq_ignore_ascii_case(word))
    }
}

/// The statement grammar's tokens of `text`: blanks and comments dropped; a string, bracketed
/// identifier or comment left open refused.
pub(crate) fn tokens(text: &str) -> Result<Vec<Token>, StatementError> {
    let mut out = Vec::new();
    for piece in scan_as(text, Dialect::TSql) {
        let written = piece.text(text);
        let kind = match piece.kind {
            PieceKind::Blank
            | PieceKind::LineComment
            | PieceKind::BlockComment { closed: true } => continue,
            PieceKind::BlockComment { closed: false } => {
                // The line the text ends on, as SQL Server reports it.
                return Err(StatementError::UnclosedComment {
                    line: piece.line + written.matches('\n').count(),
                });
            }
            PieceKind::Str { closed } => {
                let quoted = written.trim_start_matches(['N', 'n']);
                let inner = &quoted[1..quoted.len() - usize::from(closed)];
                let value = inner.replace("''", "'");
                if !closed {
                    return Err(StatementError::UnclosedQuote {
                        line: piece.line,
                        text: excerpt(&value),
                    });
                }
                Kind::Str(value)
            }
            PieceKind::Quoted { closed, .. } => {
                if !closed {
                    return Err(StatementError::Syntax {
                        line: piece.line,
                        near: excerpt(written),
                        expected: "']' closing the identifier".into(),
                    });
                }
                Kind::Word(written[1..written.len() - 1].to_string())
            }
            PieceKind::Word => Kind::Word(written.to_string()),
            PieceKind::Number => Kind::Number(written.to_string()),
            PieceKind::Punct(c) => Kind::Punct(c),
        };
        out.push(Token {
            kind,
            text: written.to_string(),
            line: piece.line,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kinds(text: &str) -> Vec<(PieceKind, &str)> {
        scan(text).iter().map(|p| (p.kind, p.text(text))).collect()
    }

    #[test]
    fn pieces_cover_the_text() {
        use PieceKind::*;
        assert_eq!(
            kinds("SELECT n'it''s', [a b]\n-- x\n/* y */4GB;"),
            vec![
                (Word, "SELECT"),
                (Blank, " "),
                (Str { closed: true }, "n'it''s'"),
                (Punct(','), ","),
                (Blank, " "),
                (
                    Quoted {
                        open: '[',
                        closed: true
                    },
                    "[a b]"
                ),
                (Blank, "\n"),
                (LineComment, "-- x"),
                (Blank, "\n"),
                (BlockComment { closed: true }, "/* y */"),
                (Number, "4"),
                (Word, "GB"),
                (Punct(';'), ";"),
            ]
        );
        assert_eq!(
            kinds("\"a\"\"b\" `c` 'open"),
            vec![
                (
                    Quoted {
                        open: '"',
                        closed: true
                    },
                    "\"a\"\"b\""
                ),
                (Blank, " "),
                (
                    Quoted {
                        open: '`',
                        closed: true
                    },
                    "`c`"
                ),
                (Blank, " "),
                (Str { closed: false }, "'open"),
            ]
        );
        assert_eq!(
            kinds("x /* open\n"),
            vec![
                (Word, "x"),
                (Blank, " "),
                (BlockComment { closed: false }, "/* open\n"),
            ]
        );
        assert_eq!(
            scan_as("\"a\" `", Dialect::TSql)
                .iter()
                .map(|p| p.kind)
                .collect::<Vec<_>>(),
            vec![Punct('"'), Word, Punct('"'), Blank, Punct('`'),]
        );
        let lines: Vec<usize> = scan("a\n'b\nc' d\n\ne").iter().map(|p| p.line).collect();
        assert_eq!(lines, [1, 1, 2, 3, 3, 3, 5]);
    }

    #[test]
    fn blank_text() {
        assert!(is_blank(" ; -- nothing\n /* at all */ "));
        assert!(is_blank("/* never closed"));
        assert!(!is_blank("x"));
        assert!(!is_blank("''"));
    }
}
