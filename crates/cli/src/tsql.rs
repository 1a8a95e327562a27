//! The shell's reading of input: `GO [n]` lines, complete statements, the split of a batch into
//! operator statements (for `bpe_exec`) and SQLite statements, and the DMV names.
//!
//! Nothing here touches SQLite, so all of it is tested as plain text. The text is read with the
//! operator language's one tokenizer ([`bpe_tsql::lex`]), which also gives `GO` lines and blank
//! text.

pub use bpe_tsql::lex::{go_count, is_blank};
use bpe_tsql::lex::{scan, PieceKind};

/// SQL Server's DMV names and the adapter's tables that answer them (`bpe_configurations` is
/// the shell's own, filled with bpe's settings before each query that names it).
const DMVS: [(&str, &str); 5] = [
    ("sys.configurations", CONFIGURATIONS_TABLE),
    ("sys.dm_os_performance_counters", "bpe_performance_counters"),
    ("sys.allocation_units", "bpe_allocation_units"),
    ("sys.dm_os_buffer_descriptors", "bpe_buffer_descriptors"),
    (
        "sys.dm_os_buffer_pool_extension_configuration",
        "bpe_extension_configuration",
    ),
];

/// The shell's table for `sys.configurations`.
pub const CONFIGURATIONS_TABLE: &str = "bpe_configurations";

/// Table hints (`WITH (NOLOCK)`) that a SQLite read has no use for: its isolation is the
/// snapshot of its read transaction, and it picks its own index. `INDEX` takes an argument.
const TABLE_HINTS: [&str; 17] = [
    "nolock",
    "readuncommitted",
    "readcommitted",
    "readcommittedlock",
    "repeatableread",
    "serializable",
    "holdlock",
    "nowait",
    "readpast",
    "rowlock",
    "paglock",
    "tablock",
    "tablockx",
    "updlock",
    "xlock",
    "forcescan",
    "index",
];

/// Query hints (`OPTION (RECOMPILE)`): SQLite prepares each statement the shell runs anew, on
/// one thread. `MAXDOP` takes an argument.
const QUERY_HINTS: [&str; 2] = ["recompile", "maxdop"];

/// An operator statement never spans more lines than this; the search for its end stops here.
const MAX_OPERATOR_LINES: usize = 64;

/// One part of a batch, ready to run.
#[derive(Debug, PartialEq, Eq)]
pub enum Part {
    /// Operator statements for `bpe_exec` (ALTER SERVER CONFIGURATION, sp_configure, ...).
    Operator(String),
    /// SQLite statements, DMV names already rewritten.
    Sql(String),
}

/// Splits `text` after each `;` that ends a statement (as sqlite3_complete sees it: inside
/// CREATE TRIGGER, only `END;` does). Returns the complete statements (with their `;`) and the
/// incomplete rest.
pub fn split_statements(text: &str) -> (Vec<&str>, &str) {
    let mut done = Vec::new();
    let mut start = 0;
    let mut words: Vec<&str> = Vec::new(); // the current statement's first words, and its last
    let mut last_word = "";
    for piece in scan(text) {
        if piece.is_word_or_number() {
            if words.len() < 3 {
                words.push(piece.text(text));
            }
            last_word = piece.text(text);
        } else if piece.kind == PieceKind::Punct(';')
            && (!is_trigger(&words) || last_word.eq_ignore_ascii_case("end"))
        {
            done.push(&text[start..piece.end]);
            start = piece.end;
            words.clear();
            last_word = "";
        }
    }
    (done, &text[start..])
}

fn is_trigger(first_words: &[&str]) -> bool {
    let w = |i: usize| first_words.get(i).map(|s| s.to_ascii_lowercase());
    w(0).as_deref() == Some("create")
        && (w(1).as_deref() == Some("trigger")
            || (matches!(w(1).as_deref(), Some("temp" | "temporary"))
                && w(2).as_deref() == Some("trigger")))
}

/// True when `text` is one or more complete statements and nothing after them but blanks
/// and comments: the shell runs it at once, as the sqlite3 shell does.
pub fn is_complete(text: &str) -> bool {
    let (done, rest) = split_statements(text);
    !done.is_empty() && is_blank(rest)
}

/// Does this line begin an operator statement (ALTER SERVER, EXEC, sp_configure, RECONFIGURE,
/// DBCC)? `ALTER TABLE` and the like are SQLite's.
fn starts_operator(line: &str) -> bool {
    let words: Vec<String> = scan(line)
        .iter()
        .filter(|p| p.is_word_or_number())
        .take(2)
        .map(|p| p.text(line).to_ascii_lowercase())
        .collect();
    let first = words.first().map(String::as_str).unwrap_or("");
    match first {
        "exec" | "execute" | "reconfigure" | "dbcc" | "sp_configure" => true,
        "sys" | "master" => line.to_ascii_lowercase().contains("sp_configure"),
        "alter" => words.get(1).is_some_and(|w| w == "server"),
        _ => false,
    }
}

/// Splits one batch into the parts to run, in order: operator statements go to `bpe_exec`,
/// the rest to SQLite with the DMV names rewritten.
///
/// Operator statements need no `;` (as in T-SQL), so one is found as the longest run of lines,
/// from a line that begins one, that the core's parser accepts. An operator line that no run
/// makes valid is passed on as it is, so the parser's error names the problem.
pub fn split_batch(text: &str) -> Vec<Part> {
    let (mut segments, rest) = split_statements(text);
    segments.push(rest);
    let mut parts = Vec::new();
    for segment in segments {
        split_segment(segment, &mut parts);
    }
    parts
}

fn split_segment(segment: &str, parts: &mut Vec<Part>) {
    let lines: Vec<&str> = segment.split_inclusive('\n').collect();
    let mut sql = String::new();
    let mut i = 0;
    while i < lines.len() {
        if starts_operator(lines[i]) {
            if let Some(n) = operator_lines(&lines[i..]) {
                flush_sql(&mut sql, parts);
                parts.push(Part::Operator(lines[i..i + n].concat()));
                i += n;
                continue;
            }
            if is_blank(&sql) {
                flush_sql(&mut sql, parts);
                parts.push(Part::Operator(lines[i..].concat()));
                return;
            }
        }
        sql.push_str(lines[i]);
        i += 1;
    }
    flush_sql(&mut sql, parts);
}

/// How many of `lines` (at most [`MAX_OPERATOR_LINES`]) form the longest valid run of
/// operator statements.
fn operator_lines(lines: &[&str]) -> Option<usize> {
    let mut text = String::new();
    let mut best = None;
    for (n, line) in lines.iter().take(MAX_OPERATOR_LINES).enumerate() {
        text.push_str(line);
        if matches!(bpe_tsql::parse(&text), Ok(s) if !s.is_empty()) {
            best = Some(n + 1);
        }
    }
    best
}

fn flush_sql(sql: &mut String, parts: &mut Vec<Part>) {
    if !is_blank(sql) {
        let sql = rewrite_idioms(&rewrite_pragma_query(sql));
        let sql = rewrite_numeric_casts(&rewrite_dmv_names(&sql));
        let sql = rewrite_top(&sql);
        if !is_blank(&sql) {
            parts.push(Part::Sql(sql));
        }
    }
    sql.clear();
}

/// The T-SQL idioms of DBA scripts, as SQLite takes them (outside strings and comments):
/// - `N'...'` (a Unicode string) as `'...'`: SQLite's strings are Unicode already;
/// - `@@VERSION` as a string naming sqlite-bpe and the SQLite under it;
/// - table hints (`WITH (NOLOCK)`, `WITH (INDEX = 0)`, the others in [`TABLE_HINTS`]) and the
///   query hints `OPTION (RECOMPILE)` and `OPTION (MAXDOP n)` dropped (what they ask does not
///   apply to SQLite, see the lists); a hint list with any other hint is left for SQLite's error;
/// - `SET NOCOUNT ON|OFF` and `SET STATISTICS IO|TIME ON|OFF` dropped (the shell prints no row
///   counts and no statistics).
pub fn rewrite_idioms(sql: &str) -> String {
    let all = scan(sql);
    let code: Vec<usize> = (0..all.len()).filter(|&i| !all[i].is_blank()).collect();
    let text = |k: usize| code.get(k).map_or("", |&i| all[i].text(sql));
    let is = |k: usize, what: &str| text(k).eq_ignore_ascii_case(what);
    let mut edits: Vec<(usize, usize, String)> = Vec::new();
    let mut k = 0;
    while k < code.len() {
        let piece = all[code[k]];
        let word = piece.kind == PieceKind::Word;
        let statement_start = k == 0 || all[code[k - 1]].kind == PieceKind::Punct(';');
        if matches!(piece.kind, PieceKind::Str { .. }) && text(k).starts_with(['N', 'n']) {
            edits.push((piece.start, piece.start + 1, String::new()));
        } else if word && is(k, "@@version") {
            edits.push((
                piece.start,
                piece.end,
                format!(
                    "('sqlite-bpe {} on SQLite ' || sqlite_version())",
                    env!("CARGO_PKG_VERSION")
                ),
            ));
        } else if word && (is(k, "with") || is(k, "option")) && is(k + 1, "(") {
            let (hints, takes_argument) = if is(k, "with") {
                (&TABLE_HINTS[..], "index")
            } else {
                (&QUERY_HINTS[..], "maxdop")
            };
            if let Some(close) = hint_list_end(&code, &all, sql, k + 1, hints, takes_argument) {
                edits.push((piece.start, all[code[close]].end, String::new()));
                k = close + 1;
                continue;
            }
        } else if word && statement_start && is(k, "set") {
            let n = if is(k + 1, "nocount") && (is(k + 2, "on") || is(k + 2, "off")) {
                3
            } else if is(k + 1, "statistics")
                && (is(k + 2, "io") || is(k + 2, "time"))
                && (is(k + 3, "on") || is(k + 3, "off"))
            {
                4
            } else {
                0
            };
            if n > 0 {
                let last = if is(k + n, ";") { k + n } else { k + n - 1 };
                edits.push((piece.start, all[code[last]].end, String::new()));
                k = last + 1;
                continue;
            }
        }
        k += 1;
    }
    apply_edits(sql, edits)
}

/// Where the hint list that opens at `code[open]` (a `(`) closes, when every hint in it is one
/// of `hints` (`takes_argument`'s argument, up to the next `,`, may be anything).
fn hint_list_end(
    code: &[usize],
    all: &[bpe_tsql::lex::Piece],
    sql: &str,
    open: usize,
    hints: &[&str],
    takes_argument: &str,
) -> Option<usize> {
    let mut depth = 0;
    let mut in_argument = false;
    for (k, &i) in code.iter().enumerate().skip(open) {
        let t = all[i].text(sql);
        match all[i].kind {
            PieceKind::Punct('(') => depth += 1,
            PieceKind::Punct(')') => {
                depth -= 1;
                if depth == 0 {
                    return (k > open + 1).then_some(k);
                }
            }
            PieceKind::Punct(',') if depth == 1 => in_argument = false,
            _ if depth > 1 || in_argument => {}
            PieceKind::Word if hints.iter().any(|h| t.eq_ignore_ascii_case(h)) => {
                in_argument = t.eq_ignore_ascii_case(takes_argument);
            }
            _ => return None,
        }
    }
    None
}

/// `PRAGMA bpe_extension;` (the query form, no value) as `SELECT * FROM pragma_bpe_extension;`:
/// the same state with named columns (a VFS pragma returns a single string).
pub fn rewrite_pragma_query(sql: &str) -> String {
    let all = scan(sql);
    let words: Vec<String> = all
        .iter()
        .filter(|p| {
            !matches!(
                p.kind,
                PieceKind::Blank | PieceKind::LineComment | PieceKind::BlockComment { .. }
            )
        })
        .map(|p| p.text(sql).to_ascii_lowercase())
        .collect();
    let w: Vec<&str> = words.iter().map(String::as_str).collect();
    if matches!(
        w.as_slice(),
        ["pragma", "bpe_extension"] | ["pragma", "bpe_extension", ";"]
    ) {
        let end = if w.len() == 3 { ";" } else { "" };
        let tail = &sql[sql.trim_end().len()..];
        return format!("SELECT * FROM pragma_bpe_extension{end}{tail}");
    }
    sql.to_string()
}

/// `SELECT [DISTINCT | ALL] TOP n ...` or `TOP (n)` as SQLite's `SELECT ... LIMIT n`: T-SQL's
/// row limit at the head of a statement, as DBA scripts write it. Only a statement's own
/// leading SELECT (not a subquery's), and only when it has no LIMIT already; `TOP n PERCENT`
/// and `WITH TIES` are left as they are, so SQLite's error names them.
pub fn rewrite_top(sql: &str) -> String {
    let all = scan(sql);
    let code: Vec<usize> = (0..all.len())
        .filter(|&i| {
            !matches!(
                all[i].kind,
                PieceKind::Blank | PieceKind::LineComment | PieceKind::BlockComment { .. }
            )
        })
        .collect();
    let word = |k: usize| code.get(k).map(|&i| all[i].text(sql).to_ascii_lowercase());
    if word(0).as_deref() != Some("select") {
        return sql.to_string();
    }
    let mut k = 1;
    if matches!(word(k).as_deref(), Some("distinct" | "all")) {
        k += 1;
    }
    if word(k).as_deref() != Some("top") {
        return sql.to_string();
    }
    let top = code[k];
    // `n` or `( n )`.
    let (count, last) = match (word(k + 1).as_deref(), word(k + 2), word(k + 3)) {
        (Some("("), Some(n), Some(close)) if close == ")" => (n, code[k + 3]),
        (Some(n), _, _) => (n.to_string(), code[k + 1]),
        _ => return sql.to_string(),
    };
    let next = word(if all[last].text(sql) == ")" {
        k + 4
    } else {
        k + 2
    });
    let has_limit = code
        .iter()
        .any(|&i| all[i].text(sql).eq_ignore_ascii_case("limit"));
    if !count.bytes().all(|b| b.is_ascii_digit())
        || matches!(next.as_deref(), Some("percent" | "with"))
        || has_limit
    {
        return sql.to_string();
    }
    // The LIMIT goes before the statement's `;` (or at its end).
    let end = code
        .iter()
        .rev()
        .find(|&&i| all[i].kind == PieceKind::Punct(';'))
        .map_or(sql.trim_end().len(), |&i| all[i].start);
    let head = &sql[..all[top].start];
    let body = sql[all[last].end..end].trim_end();
    format!(
        "{head}{} LIMIT {count}{}",
        body.trim_start_matches(' '),
        &sql[end..]
    )
}

/// `CAST(x AS NUMERIC)`, `DECIMAL(p, s)` or `DEC(p)` as `round(CAST(x AS REAL), s)` (`s` is 0
/// where not given, as in T-SQL). SQLite's NUMERIC cast keeps an integer an integer, so the
/// seed scripts' `cast(free_space_in_bytes as numeric)/1024` would divide integers (giving 0
/// where SQL Server gives 0.048828); a REAL divides as T-SQL's decimal does, and the rounding
/// keeps the scale T-SQL's cast gives. Only the CAST's own type (not an AS inside a subquery of
/// it), outside strings and comments; other types are left to SQLite.
pub fn rewrite_numeric_casts(sql: &str) -> String {
    let all = scan(sql);
    let code: Vec<usize> = (0..all.len()).filter(|&i| !all[i].is_blank()).collect();
    let text = |k: usize| all[code[k]].text(sql);
    let is = |k: usize, what: &str| text(k).eq_ignore_ascii_case(what);
    // One frame per open parenthesis: for a CAST's, where the CAST starts and, after its AS,
    // where its type starts (an index into `code`).
    struct Frame {
        cast_start: Option<usize>,
        type_at: Option<usize>,
    }
    let mut stack: Vec<Frame> = Vec::new();
    let mut edits: Vec<(usize, usize, String)> = Vec::new();
    for k in 0..code.len() {
        match all[code[k]].kind {
            PieceKind::Punct('(') => stack.push(Frame {
                cast_start: (k > 0
                    && all[code[k - 1]].kind == PieceKind::Word
                    && is(k - 1, "cast"))
                .then(|| all[code[k - 1]].start),
                type_at: None,
            }),
            PieceKind::Word if is(k, "as") => {
                if let Some(top) = stack.last_mut() {
                    if top.cast_start.is_some() && top.type_at.is_none() {
                        top.type_at = Some(k + 1);
                    }
                }
            }
            PieceKind::Punct(')') => {
                let Some(Frame {
                    cast_start: Some(cast_start),
                    type_at: Some(t),
                }) = stack.pop()
                else {
                    continue;
                };
                let Some(scale) = decimal_scale(&(t..k).map(text).collect::<Vec<_>>()) else {
                    continue;
                };
                edits.push((cast_start, cast_start, "round(".into()));
                edits.push((all[code[t]].start, all[code[k]].start, "REAL".into()));
                edits.push((all[code[k]].end, all[code[k]].end, format!(", {scale})")));
            }
            _ => {}
        }
    }
    edits.sort_by_key(|&(start, end, _)| (start, end));
    apply_edits(sql, edits)
}

/// `sql` with each (start, end, replacement) edit made; the edits are in order and do not
/// overlap.
fn apply_edits(sql: &str, edits: Vec<(usize, usize, String)>) -> String {
    let mut out = String::with_capacity(sql.len() + 16 * edits.len());
    let mut at = 0;
    for (start, end, with) in edits {
        out.push_str(&sql[at..start]);
        out.push_str(&with);
        at = end;
    }
    out.push_str(&sql[at..]);
    out
}

/// The scale of a T-SQL exact numeric type written as `words` (`NUMERIC`, `DECIMAL(10, 2)`,
/// `dec(5)`): `s`, or 0 where not given. None for any other type.
fn decimal_scale(words: &[&str]) -> Option<u32> {
    let (name, rest) = words.split_first()?;
    if !["numeric", "decimal", "dec"]
        .iter()
        .any(|t| name.eq_ignore_ascii_case(t))
    {
        return None;
    }
    let number = |w: &str| w.parse::<u32>().ok().filter(|&n| n <= 38);
    match rest {
        [] => Some(0),
        ["(", p, ")"] => number(p).map(|_| 0),
        ["(", p, ",", s, ")"] => number(p).and(number(s)),
        _ => None,
    }
}

/// Replaces SQL Server's DMV names (any case) with the adapter's tables, outside strings and
/// comments.
pub fn rewrite_dmv_names(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len());
    let all = scan(sql);
    let mut i = 0;
    while i < all.len() {
        // `sys` `.` `dm_os_...` as three pieces.
        if let [sys, dot, name, ..] = &all[i..] {
            if sys.kind == PieceKind::Word
                && sys.text(sql).eq_ignore_ascii_case("sys")
                && dot.kind == PieceKind::Punct('.')
                && name.kind == PieceKind::Word
            {
                let full = format!("sys.{}", name.text(sql)).to_ascii_lowercase();
                if let Some((_, table)) = DMVS.iter().find(|(dmv, _)| *dmv == full) {
                    out.push_str(table);
                    i += 3;
                    continue;
                }
            }
        }
        out.push_str(all[i].text(sql));
        i += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bpe_extension_pragma_query_reads_its_table() {
        assert_eq!(
            rewrite_pragma_query("PRAGMA bpe_extension;\n"),
            "SELECT * FROM pragma_bpe_extension;\n"
        );
        assert_eq!(
            rewrite_pragma_query("pragma BPE_EXTENSION"),
            "SELECT * FROM pragma_bpe_extension"
        );
        // Setting it, or another pragma, is left to SQLite.
        for same in ["PRAGMA bpe_extension = off;", "PRAGMA page_size;"] {
            assert_eq!(rewrite_pragma_query(same), same);
        }
    }

    #[test]
    fn dba_script_idioms_become_sqlite() {
        let version = format!(
            "('sqlite-bpe {} on SQLite ' || sqlite_version())",
            env!("CARGO_PKG_VERSION")
        );
        for (tsql, sqlite) in [
            (
                "SELECT n FROM t WITH (NOLOCK) WHERE id = 1",
                "SELECT n FROM t  WHERE id = 1",
            ),
            (
                "SELECT AVG(c) FROM big WITH (INDEX=0)",
                "SELECT AVG(c) FROM big ",
            ),
            (
                "select n from t with ( nolock, index(ix_t) ) option (recompile);",
                "select n from t  ;",
            ),
            ("SELECT 1 OPTION (MAXDOP 1, RECOMPILE)", "SELECT 1 "),
            (
                "SELECT name FROM x WHERE name = N'max server memory (MB)'",
                "SELECT name FROM x WHERE name = 'max server memory (MB)'",
            ),
            ("SELECT @@VERSION;", &format!("SELECT {version};")),
            (
                "SET NOCOUNT ON;\nSET STATISTICS TIME ON\nSELECT 1;",
                "\n\nSELECT 1;",
            ),
            // Left alone: strings, comments, a CTE, other hints, other SETs, names.
            (
                "SELECT 'WITH (NOLOCK)', N FROM t -- OPTION (RECOMPILE)",
                "SELECT 'WITH (NOLOCK)', N FROM t -- OPTION (RECOMPILE)",
            ),
            (
                "WITH c(x) AS (SELECT 1) SELECT x FROM c",
                "WITH c(x) AS (SELECT 1) SELECT x FROM c",
            ),
            (
                "SELECT 1 FROM t WITH (NOLOCK, FASTFIRSTROW)",
                "SELECT 1 FROM t WITH (NOLOCK, FASTFIRSTROW)",
            ),
            (
                "SELECT 1 OPTION (FORCE ORDER)",
                "SELECT 1 OPTION (FORCE ORDER)",
            ),
            ("SET ROWCOUNT 10", "SET ROWCOUNT 10"),
            ("SELECT @@SPID", "SELECT @@SPID"),
        ] {
            assert_eq!(rewrite_idioms(tsql), sqlite, "{tsql}");
        }
        assert_eq!(
            rewrite_dmv_names("SELECT * FROM sys.configurations"),
            "SELECT * FROM bpe_configurations"
        );
        // A batch of only what the shell drops runs nothing.
        assert!(split_batch("SET NOCOUNT ON;\n").is_empty());
    }

    #[test]
    fn top_n_becomes_limit_n() {
        assert_eq!(
            rewrite_top("SELECT TOP 5 * FROM t ORDER BY a;\n"),
            "SELECT * FROM t ORDER BY a LIMIT 5;\n"
        );
        assert_eq!(
            rewrite_top("select distinct top (3) a from t"),
            "select distinct a from t LIMIT 3"
        );
        // Left alone: no TOP, a subquery's TOP, PERCENT, an existing LIMIT, a non-number.
        for same in [
            "SELECT a FROM t;",
            "SELECT a FROM (SELECT TOP 2 a FROM t);",
            "SELECT TOP 10 PERCENT a FROM t;",
            "SELECT TOP 2 a FROM t LIMIT 1;",
            "SELECT TOP x a FROM t;",
            "SELECT 'TOP 5' FROM t;",
        ] {
            assert_eq!(rewrite_top(same), same);
        }
    }

    #[test]
    fn numeric_and_decimal_casts_become_rounded_reals() {
        assert_eq!(
            rewrite_numeric_casts("cast(free_space_in_bytes as numeric)/1024 as mb,"),
            "round(cast(free_space_in_bytes as REAL), 0)/1024 as mb,"
        );
        assert_eq!(
            rewrite_numeric_casts("SELECT CAST(x AS DECIMAL(10, 2)), Cast ( y as dec(5) ) FROM t"),
            "SELECT round(CAST(x AS REAL), 2), round(Cast ( y as REAL), 0) FROM t"
        );
        // Nested, and a subquery's own AS inside the CAST.
        assert_eq!(
            rewrite_numeric_casts(
                "cast(cast(a as numeric(18,4)) + (select b as c from t) as numeric)"
            ),
            "round(cast(round(cast(a as REAL), 4) + (select b as c from t) as REAL), 0)"
        );
        // Left alone: other types, strings, comments, a CAST with no type, a bad scale.
        for same in [
            "SELECT cast(x AS integer), cast(y as real), cast(z as text);",
            "SELECT 'cast(x as numeric)' -- cast(x as numeric)",
            "SELECT cast(x as numeric(10, 99));",
            "SELECT numeric FROM t WHERE cast(x)",
            "SELECT count(*) AS numeric FROM t",
        ] {
            assert_eq!(rewrite_numeric_casts(same), same);
        }
    }

    #[test]
    fn go_lines() {
        assert_eq!(go_count("GO"), Some(Ok(1)));
        assert_eq!(go_count("  go 3  "), Some(Ok(3)));
        assert_eq!(go_count("Go -- run it"), Some(Ok(1)));
        assert!(go_count("GO 0")
            .unwrap()
            .unwrap_err()
            .contains("at least 1"));
        assert!(go_count("GO x").unwrap().unwrap_err().contains("'x'"));
        assert!(go_count("GO 1 2").unwrap().is_err());
        assert_eq!(go_count("GOTO"), None);
        assert_eq!(go_count("SELECT 1 GO"), None);
        assert_eq!(go_count(""), None);
    }

    #[test]
    fn completeness_follows_sqlite() {
        assert!(is_complete("SELECT 1;"));
        assert!(is_complete("SELECT 1; -- done\n"));
        assert!(!is_complete("SELECT 1"));
        assert!(!is_complete("SELECT ';"));
        assert!(!is_complete("SELECT 1; SELECT"));
        assert!(!is_complete("/* ; */"));
        let trigger = "CREATE TRIGGER t AFTER INSERT ON a BEGIN\n  INSERT INTO b VALUES (1);\n";
        assert!(!is_complete(trigger));
        assert!(is_complete(&format!("{trigger}END;")));
        assert!(!is_complete(
            "CREATE TEMP TRIGGER t AFTER INSERT ON a BEGIN SELECT 1;"
        ));
    }

    #[test]
    fn batches_split_into_operator_and_sqlite_parts() {
        let batch = "EXEC sp_configure 'max server memory (MB)', 64\nRECONFIGURE\n\
                     SELECT * FROM sys.dm_os_performance_counters\n";
        assert_eq!(
            split_batch(batch),
            vec![
                Part::Operator(
                    "EXEC sp_configure 'max server memory (MB)', 64\nRECONFIGURE\n".into()
                ),
                Part::Sql("SELECT * FROM bpe_performance_counters\n".into()),
            ]
        );
        let multi = "ALTER SERVER CONFIGURATION SET BUFFER POOL EXTENSION ON\n  (FILENAME = '/x/e.bpe',\n   SIZE = 1 GB)\nSELECT 1;\nDBCC DROPCLEANBUFFERS;";
        assert_eq!(
            split_batch(multi),
            vec![
                Part::Operator("ALTER SERVER CONFIGURATION SET BUFFER POOL EXTENSION ON\n  (FILENAME = '/x/e.bpe',\n   SIZE = 1 GB)\n".into()),
                Part::Sql("SELECT 1;".into()),
                Part::Operator("DBCC DROPCLEANBUFFERS;".into()),
            ]
        );
        // SQLite's ALTER stays SQLite's; an invalid operator statement goes to the parser whole.
        assert_eq!(
            split_batch("ALTER TABLE t ADD c;"),
            vec![Part::Sql("ALTER TABLE t ADD c;".into())]
        );
        assert_eq!(
            split_batch("DBCC DROPCLEANBUFFERS now\nSELECT 1"),
            vec![Part::Operator("DBCC DROPCLEANBUFFERS now\nSELECT 1".into())]
        );
        assert_eq!(split_batch(" -- nothing\n;"), vec![]);
    }

    #[test]
    fn dmv_names_are_rewritten_outside_strings() {
        assert_eq!(
            rewrite_dmv_names(
                "SELECT * FROM SYS.DM_OS_BUFFER_DESCRIPTORS d, sys.dm_os_buffer_pool_extension_configuration"
            ),
            "SELECT * FROM bpe_buffer_descriptors d, bpe_extension_configuration"
        );
        let quoted = "SELECT 'sys.dm_os_performance_counters' -- sys.dm_os_performance_counters";
        assert_eq!(rewrite_dmv_names(quoted), quoted);
        assert_eq!(
            rewrite_dmv_names("select * from sys.dm_os_wait_stats"),
            "select * from sys.dm_os_wait_stats"
        );
    }
}
