//! Helpers shared by the core's integration tests.
#![allow(dead_code)]

use bpe_core::{Config, Engine, FileHandle};
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub const PAGE: usize = 4096;

/// Bytes of `page` at `version`: self-describing (page, version, checksum) so a reader can tell
/// a torn or misplaced page from a real one.
pub fn page_bytes(page: u64, version: u64, size: usize) -> Vec<u8> {
    let mut v = vec![0u8; size];
    v[0..8].copy_from_slice(&page.to_le_bytes());
    v[8..16].copy_from_slice(&version.to_le_bytes());
    let mut x =
        page.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ version.wrapping_mul(0xD6E8_FEB8_6659_FD93);
    for chunk in v[16..size - 8].chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let b = x.to_le_bytes();
        chunk.copy_from_slice(&b[..chunk.len()]);
    }
    let sum = crc32c::crc32c(&v[..size - 8]) as u64;
    v[size - 8..].copy_from_slice(&sum.to_le_bytes());
    v
}

/// (page, version) of bytes made by `page_bytes`, or None if they are not whole.
pub fn decode(bytes: &[u8]) -> Option<(u64, u64)> {
    let n = bytes.len();
    let sum = u64::from_le_bytes(bytes[n - 8..].try_into().unwrap());
    if crc32c::crc32c(&bytes[..n - 8]) as u64 != sum {
        return None;
    }
    Some((
        u64::from_le_bytes(bytes[0..8].try_into().unwrap()),
        u64::from_le_bytes(bytes[8..16].try_into().unwrap()),
    ))
}

/// A data file of `pages` pages at version 0, on the real disk (O_DIRECT works there).
pub fn make_file(dir: &Path, name: &str, pages: u64, page_size: usize) -> PathBuf {
    let path = dir.join(name);
    let mut all = Vec::with_capacity(pages as usize * page_size);
    for p in 0..pages {
        all.extend_from_slice(&page_bytes(p, 0, page_size));
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

pub fn engine(max_memory: u64) -> Arc<Engine> {
    Engine::new(Config {
        max_memory,
        ..Config::default()
    })
}

pub fn read(engine: &Engine, f: &FileHandle, page: u64) -> (Vec<u8>, bpe_core::Tier) {
    let mut buf = vec![0u8; f.page_size()];
    let r = engine.read_page(f, page, &mut buf).unwrap();
    assert_eq!(r.len, f.page_size(), "page {page} was short");
    (buf, r.tier)
}

pub const WAIT: std::time::Duration = std::time::Duration::from_secs(10);
