//! Helpers of the statements' tests that need an engine with pages in it.

use bpe_core::{Engine, FileHandle};
use std::path::{Path, PathBuf};

pub const PAGE: usize = 4096;

/// A data file of `pages` pages, each filled with its page number, on the real disk (O_DIRECT
/// works there).
pub fn make_file(dir: &Path, name: &str, pages: u64, page_size: usize) -> PathBuf {
    let path = dir.join(name);
    let mut all = Vec::with_capacity(pages as usize * page_size);
    for p in 0..pages {
        all.resize(all.len() + page_size, p as u8);
    }
    std::fs::write(&path, all).unwrap();
    path
}

/// A temp dir on the project's disk rather than /tmp, which may be tmpfs.
pub fn tempdir() -> tempfile::TempDir {
    let base = Path::new(env!("CARGO_TARGET_TMPDIR"));
    std::fs::create_dir_all(base).unwrap();
    tempfile::tempdir_in(base).unwrap()
}

pub fn read(engine: &Engine, f: &FileHandle, page: u64) -> (Vec<u8>, bpe_core::Tier) {
    let mut buf = vec![0u8; f.page_size()];
    let r = engine.read_page(f, page, &mut buf).unwrap();
    assert_eq!(r.len, f.page_size(), "page {page} was short");
    (buf, r.tier)
}
