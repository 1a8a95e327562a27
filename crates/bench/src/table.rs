//! Aligned text tables: the benchmarks' results, and the CLI's (query results in the shell, the
//! demo's results).

use std::fmt::Write as _;

/// A table of text cells under headers. Columns of cells that look like numbers are
/// right-aligned, the others left-aligned, unless [`Table::left_columns`] says which.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Table {
    pub headers: Vec<String>,
    pub rows: Vec<Vec<String>>,
    /// Some(n): the first n columns left-aligned, the others right-aligned, whatever they hold.
    pub left: Option<usize>,
}

impl Table {
    pub fn new<S: Into<String>>(headers: impl IntoIterator<Item = S>) -> Table {
        Table {
            headers: headers.into_iter().map(Into::into).collect(),
            rows: Vec::new(),
            left: None,
        }
    }

    /// The first `n` columns left-aligned, the others right-aligned.
    pub fn left_columns(mut self, n: usize) -> Table {
        self.left = Some(n);
        self
    }

    pub fn push<S: Into<String>>(&mut self, row: impl IntoIterator<Item = S>) {
        self.rows.push(row.into_iter().map(Into::into).collect());
    }

    /// Headers, a rule of dashes, then the rows; every line ends with a newline.
    pub fn render(&self) -> String {
        let columns = self.headers.len();
        let mut widths: Vec<usize> = self.headers.iter().map(|h| width(h)).collect();
        for row in &self.rows {
            for (w, cell) in widths.iter_mut().zip(row) {
                *w = (*w).max(width(cell));
            }
        }
        let numeric: Vec<bool> = (0..columns)
            .map(|c| match self.left {
                Some(n) => c >= n,
                None => {
                    let mut cells = self.rows.iter().filter_map(|r| r.get(c)).peekable();
                    cells.peek().is_some() && cells.all(|cell| looks_numeric(cell))
                }
            })
            .collect();
        let mut out = String::new();
        let line = |out: &mut String, cells: &[String], align_numbers: bool| {
            let text: Vec<String> = (0..columns)
                .map(|c| {
                    let cell = cells.get(c).map_or("", String::as_str);
                    let pad = " ".repeat(widths[c] - width(cell));
                    if align_numbers && numeric[c] {
                        format!("{pad}{cell}")
                    } else {
                        format!("{cell}{pad}")
                    }
                })
                .collect();
            let _ = writeln!(out, "{}", text.join("  ").trim_end());
        };
        line(&mut out, &self.headers, true);
        let rule: Vec<String> = widths.iter().map(|&w| "-".repeat(w)).collect();
        line(&mut out, &rule, false);
        for row in &self.rows {
            line(&mut out, row, true);
        }
        out
    }
}

fn width(s: &str) -> usize {
    s.chars().count()
}

/// Numbers, and the placeholders that stand in a column of numbers.
fn looks_numeric(cell: &str) -> bool {
    cell == "NULL"
        || cell == "-"
        || (!cell.is_empty()
            && cell
                .trim_end_matches(['x', '%'])
                .replace(',', "")
                .parse::<f64>()
                .is_ok())
}

/// 12345678 → "12,345,678".
pub fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_align_and_numbers_go_right() {
        let mut t = Table::new(["name", "value"]);
        t.push(["a", "1"]);
        t.push(["longer name", "12345"]);
        assert_eq!(
            t.render(),
            "name         value\n-----------  -----\na                1\nlonger name  12345\n"
        );
    }

    #[test]
    fn chosen_columns_go_left() {
        let mut t = Table::new(["name", "what", "time"]).left_columns(2);
        t.push(["a", "1", "1.5 s"]);
        t.push(["bb", "22", "12 ms"]);
        assert_eq!(
            t.render(),
            "name  what   time\n----  ----  -----\na     1     1.5 s\nbb    22    12 ms\n"
        );
    }

    #[test]
    fn empty_tables_and_short_rows() {
        let t = Table::new(["x"]);
        assert_eq!(t.render(), "x\n-\n");
        let mut t = Table::new(["a", "b"]);
        t.push(["only"]);
        assert_eq!(t.render(), "a     b\n----  -\nonly\n");
    }

    #[test]
    fn thousands_separators() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1000), "1,000");
        assert_eq!(thousands(12345678), "12,345,678");
    }
}
