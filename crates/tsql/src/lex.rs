//! Tokens of T-SQL, as much of it as the operator statements need.

use crate::StatementError;

#[derive(Clone, Debug, PartialEq)]
pub enum Kind {
    /// A keyword or identifier (`[bracketed]` ones unquoted).
    Word(String),
    /// A string literal, unescaped; `N'..'` too.
    Str(String),
    /// Digits, possibly with a fraction (kept as text so errors can quote it).
    Number(String),
    Punct(char),
}

#[derive(Clone, Debug)]
pub struct Token {
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

fn is_word_start(c: char) -> bool {
    c.is_ascii_alphabetic() || c == '_' || c == '@' || c == '#'
}

fn is_word_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == '@' || c == '#' || c == '$'
}

pub fn tokens(text: &str) -> Result<Vec<Token>, StatementError> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    let mut line = 1;
    let slice = |a: usize, b: usize| chars[a..b].iter().collect::<String>();
    while i < chars.len() {
        let c = chars[i];
        let start = i;
        let start_line = line;
        let kind = match c {
            '\n' => {
                line += 1;
                i += 1;
                continue;
            }
            c if c.is_whitespace() => {
                i += 1;
                continue;
            }
            '-' if chars.get(i + 1) == Some(&'-') => {
                while i < chars.len() && chars[i] != '\n' {
                    i += 1;
                }
                continue;
            }
            '/' if chars.get(i + 1) == Some(&'*') => {
                i += 2;
                loop {
                    match chars.get(i) {
                        None => return Err(StatementError::UnclosedComment { line }),
                        Some('*') if chars.get(i + 1) == Some(&'/') => break,
                        Some('\n') => line += 1,
                        _ => {}
                    }
                    i += 1;
                }
                i += 2;
                continue;
            }
            '\'' => Kind::Str(string(&chars, &mut i, &mut line)?),
            'N' | 'n' if chars.get(i + 1) == Some(&'\'') => {
                i += 1;
                Kind::Str(string(&chars, &mut i, &mut line)?)
            }
            '[' => {
                let end = chars[i..].iter().position(|&c| c == ']');
                let Some(end) = end.map(|e| i + e) else {
                    return Err(StatementError::Syntax {
                        line,
                        near: crate::excerpt(&slice(i, chars.len())),
                        expected: "']' closing the identifier".into(),
                    });
                };
                let word = slice(i + 1, end);
                line += word.matches('\n').count();
                i = end + 1;
                Kind::Word(word)
            }
            c if c.is_ascii_digit() => {
                while i < chars.len() && chars[i].is_ascii_digit() {
                    i += 1;
                }
                if chars.get(i) == Some(&'.') {
                    i += 1;
                    while i < chars.len() && chars[i].is_ascii_digit() {
                        i += 1;
                    }
                }
                Kind::Number(slice(start, i))
            }
            c if is_word_start(c) => {
                while i < chars.len() && is_word_char(chars[i]) {
                    i += 1;
                }
                Kind::Word(slice(start, i))
            }
            // Any other character is a token the grammar will refuse, naming what it expected.
            _ => {
                i += 1;
                Kind::Punct(c)
            }
        };
        out.push(Token {
            text: slice(start, i),
            kind,
            line: start_line,
        });
    }
    Ok(out)
}

/// A quoted string starting at `chars[*i] == '\''`; `''` stands for one quote.
fn string(chars: &[char], i: &mut usize, line: &mut usize) -> Result<String, StatementError> {
    let start_line = *line;
    let mut value = String::new();
    *i += 1;
    loop {
        match chars.get(*i) {
            None => {
                return Err(StatementError::UnclosedQuote {
                    line: start_line,
                    text: crate::excerpt(&value),
                })
            }
            Some('\'') if chars.get(*i + 1) == Some(&'\'') => {
                value.push('\'');
                *i += 2;
            }
            Some('\'') => {
                *i += 1;
                return Ok(value);
            }
            Some(&c) => {
                if c == '\n' {
                    *line += 1;
                }
                value.push(c);
                *i += 1;
            }
        }
    }
}
