//! docs/DESIGN.md's module map lists every source file of the core and the adapter, and nothing
//! that is gone: a new module is described where a reader looks for it.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The `.rs` files under `dir`, relative to it.
fn tree(dir: &Path) -> BTreeSet<String> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeSet<String>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(root, &path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let rel = path.strip_prefix(root).unwrap();
                out.insert(rel.to_string_lossy().into_owned());
            }
        }
    }
    let mut out = BTreeSet::new();
    walk(dir, dir, &mut out);
    out
}

/// The files the map's text block after the line naming `crate_src` lists: a line whose first
/// word ends in `/` opens a folder for the indented lines under it.
fn listed(design: &str, crate_src: &str) -> BTreeSet<String> {
    let map = &design[design.find("## Module map").expect("a module map section")..];
    let after = &map[map
        .find(crate_src)
        .unwrap_or_else(|| panic!("{crate_src} in the map"))..];
    let block = after.split("```text").nth(1).expect("a text block");
    let block = block.split("```").next().unwrap();
    let mut folder = String::new();
    let mut out = BTreeSet::new();
    for line in block.lines().filter(|l| !l.trim().is_empty()) {
        let word = line.split_whitespace().next().unwrap();
        let indented = line.starts_with(' ');
        if word.ends_with('/') {
            folder = word.to_string();
        } else if word.ends_with(".rs") {
            let prefix = if indented { folder.as_str() } else { "" };
            out.insert(format!("{prefix}{word}"));
        }
    }
    out
}

#[test]
fn the_design_documents_module_map_matches_the_source_tree() {
    let root = workspace();
    let design = std::fs::read_to_string(root.join("docs/DESIGN.md")).unwrap();
    for crate_src in ["crates/bpe-core/src/", "crates/sqlite-bpe/src/"] {
        let files = tree(&root.join(crate_src));
        let map = listed(&design, &format!("`{crate_src}`"));
        let missing: Vec<_> = files.difference(&map).collect();
        let gone: Vec<_> = map.difference(&files).collect();
        assert!(
            missing.is_empty() && gone.is_empty(),
            "docs/DESIGN.md's module map for {crate_src}: not listed {missing:?}, listed but \
             not in the tree {gone:?}"
        );
    }
}
