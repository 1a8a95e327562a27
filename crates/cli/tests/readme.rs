//! The README against docs/BENCHMARKS.md: every ratio the README states was measured there, each
//! row of its table links to the section that measured it (and that section states the row's
//! ratios), and the README's local links lead to files and headings that exist.

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn read(path: &str) -> String {
    std::fs::read_to_string(root().join(path)).unwrap_or_else(|e| panic!("reading {path}: {e}"))
}

/// The ratios a text states: a number or a range of two (`1.44`, `0.99-1.02`, `141`) followed by
/// `×`, by `x` that ends a word, or by ` times`. Returned without the sign, as written.
fn ratios(text: &str) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let starts_number = chars[i].is_ascii_digit()
            && (i == 0 || !(chars[i - 1].is_alphanumeric() || chars[i - 1] == '.'));
        if !starts_number {
            i += 1;
            continue;
        }
        let start = i;
        while i < chars.len() && (chars[i].is_ascii_digit() || chars[i] == '.' || chars[i] == ',') {
            i += 1;
        }
        if i + 1 < chars.len() && chars[i] == '-' && chars[i + 1].is_ascii_digit() {
            i += 1;
            while i < chars.len() && (chars[i].is_ascii_digit() || chars[i] == '.') {
                i += 1;
            }
        }
        let number: String = chars[start..i].iter().collect();
        let number = number.trim_end_matches(['.', ',']).to_string();
        let rest: String = chars[i..chars.len().min(i + 6)].iter().collect();
        let ends_word = |k: usize| chars.get(k).is_none_or(|c| !c.is_alphanumeric());
        if rest.starts_with('×')
            || (rest.starts_with('x') && ends_word(i + 1))
            || (rest.starts_with(" times") && ends_word(i + 6))
        {
            out.push(number);
        }
    }
    out
}

/// Does `text` state `number` as a number of its own (not inside a longer one)?
fn states(text: &str, number: &str) -> bool {
    text.match_indices(number).any(|(at, _)| {
        let before = text[..at].chars().next_back();
        let mut after = text[at + number.len()..].chars();
        let next = after.next();
        let digit_after_dot = next == Some('.') && after.next().is_some_and(|c| c.is_ascii_digit());
        !before.is_some_and(|c| c.is_ascii_digit() || c == '.')
            && !next.is_some_and(|c| c.is_ascii_digit())
            && !digit_after_dot
    })
}

/// Does `text` state `number` as a ratio: followed by `×`, `x` or ` times`?
fn states_ratio(text: &str, number: &str) -> bool {
    text.match_indices(number).any(|(at, _)| {
        let before = text[..at].chars().next_back();
        let after = &text[at + number.len()..];
        !before.is_some_and(|c| c.is_ascii_digit() || c == '.')
            && (after.starts_with('×') || after.starts_with('x') || after.starts_with(" times"))
    })
}

/// GitHub's anchor for a heading: lower case, punctuation and symbols dropped, spaces as `-`.
fn slug(heading: &str) -> String {
    heading
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            '-' | '_' => Some(c),
            c if c.is_alphanumeric() => Some(c),
            _ => None,
        })
        .collect()
}

/// The sections of a markdown text: (anchor, text from the heading to the next heading of the
/// same or a higher level, its subsections included).
fn sections(text: &str) -> Vec<(String, String)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut fenced = false;
    let mut headings = Vec::new();
    for (n, line) in lines.iter().enumerate() {
        if line.starts_with("```") {
            fenced = !fenced;
        }
        if !fenced && line.starts_with('#') {
            let level = line.chars().take_while(|&c| c == '#').count();
            headings.push((n, level, slug(line[level..].trim())));
        }
    }
    headings
        .iter()
        .map(|&(n, level, ref anchor)| {
            let end = headings
                .iter()
                .find(|&&(m, l, _)| m > n && l <= level)
                .map_or(lines.len(), |&(m, _, _)| m);
            (anchor.clone(), lines[n..end].join("\n"))
        })
        .collect()
}

/// The local links of a markdown text: (file, anchor).
fn links(text: &str) -> Vec<(String, Option<String>)> {
    let mut out = Vec::new();
    for (at, _) in text.match_indices("](") {
        let target = &text[at + 2..];
        let Some(end) = target.find(')') else {
            continue;
        };
        let target = &target[..end];
        if target.contains("://") {
            continue;
        }
        match target.split_once('#') {
            Some((file, anchor)) => out.push((file.to_string(), Some(anchor.to_string()))),
            None => out.push((target.to_string(), None)),
        }
    }
    out
}

/// The rows of the README's table of speeds: (its cells).
fn speed_rows(readme: &str) -> Vec<Vec<String>> {
    let lines: Vec<&str> = readme.lines().collect();
    let header = lines
        .iter()
        .position(|l| l.starts_with('|') && l.contains("speed over stock"))
        .expect("the README has a table with a `speed over stock` column");
    lines[header + 2..]
        .iter()
        .take_while(|l| l.starts_with('|'))
        .map(|l| {
            l.trim_matches('|')
                .split(" | ")
                .map(|c| c.trim().to_string())
                .collect()
        })
        .collect()
}

#[test]
fn the_ratio_finder_reads_the_forms_the_readme_uses() {
    assert_eq!(
        ratios("**141×** / **125×**, 0.99-1.02×, 29.9x, 23 times faster; 4 GB, 0x10, max 2 ms"),
        ["141", "125", "0.99-1.02", "29.9", "23"]
    );
    assert!(states("at **0.87** and", "0.87"));
    assert!(!states("10.875", "0.87"));
    assert!(!states("0.871", "0.87"));
    assert!(!states("0.87.5", "0.87"));
    assert!(states_ratio("runs 23 times faster", "23"));
    assert!(states_ratio("**141×**", "141"));
    assert!(!states_ratio("at **0.87** and", "0.87"));
    assert!(!states_ratio("123×", "23"));
    assert_eq!(
        slug("dw at a database 4× stock's memory (TPC-H SF 0.1, `slowvol:gp3`; goal 4)"),
        "dw-at-a-database-4-stocks-memory-tpc-h-sf-01-slowvolgp3-goal-4"
    );
}

#[test]
fn every_ratio_the_readme_states_was_measured_in_benchmarks_md() {
    let readme = read("README.md");
    let benchmarks = read("docs/BENCHMARKS.md");
    let stated = ratios(&readme);
    assert!(
        stated.len() >= 8,
        "the README states its table's ratios: found only {stated:?}"
    );
    let missing: Vec<&String> = stated
        .iter()
        .filter(|r| !states_ratio(&benchmarks, r))
        .collect();
    assert!(
        missing.is_empty(),
        "ratios in README.md that docs/BENCHMARKS.md does not state: {missing:?}"
    );
}

#[test]
fn each_table_row_links_to_the_section_that_measured_its_ratios() {
    let readme = read("README.md");
    let benchmarks = read("docs/BENCHMARKS.md");
    let sections = sections(&benchmarks);
    let rows = speed_rows(&readme);
    assert!(
        (1..=8).contains(&rows.len()),
        "the table has {} rows (at most 8)",
        rows.len()
    );
    for row in rows {
        assert_eq!(row.len(), 4, "a row of four cells: {row:?}");
        let speeds = ratios(&row[2]);
        assert!(!speeds.is_empty(), "no ratio in the speed cell: {row:?}");
        let row_links = links(&row[3]);
        let [(file, Some(anchor))] = row_links.as_slice() else {
            panic!("the last cell is one link to a section of docs/BENCHMARKS.md: {row:?}");
        };
        assert_eq!(file, "docs/BENCHMARKS.md", "{row:?}");
        let (_, section) = sections
            .iter()
            .find(|(a, _)| a == anchor)
            .unwrap_or_else(|| panic!("docs/BENCHMARKS.md has no heading #{anchor}: {row:?}"));
        for speed in speeds {
            assert!(
                states(section, &speed),
                "section #{anchor} does not state {speed}: {row:?}"
            );
        }
    }
}

#[test]
fn the_readmes_local_links_lead_to_files_and_headings_that_exist() {
    for readme in [
        "README.md",
        "bindings/python/README.md",
        "bindings/node/README.md",
        "bindings/go/README.md",
        "bindings/java/README.md",
    ] {
        let text = read(readme);
        let dir = Path::new(readme).parent().unwrap();
        for (file, anchor) in links(&text) {
            let path = dir.join(&file);
            assert!(
                root().join(&path).exists(),
                "{readme} links to {file}, which does not exist"
            );
            if let Some(anchor) = anchor {
                let target = read(path.to_str().unwrap());
                assert!(
                    sections(&target).iter().any(|(a, _)| *a == anchor),
                    "{readme} links to {file}#{anchor}: no such heading"
                );
            }
        }
    }
}

#[test]
fn the_readme_is_read_in_five_minutes() {
    let lines = read("README.md").lines().count();
    assert!(lines <= 150, "README.md has {lines} lines (at most 150)");
}
