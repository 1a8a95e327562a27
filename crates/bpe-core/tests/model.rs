//! Model-based test: random sequences of reads, writes (through, and behind with write-backs),
//! memory changes, extension on/off/resize, drop-clean-buffers and injected extension faults,
//! checked against a plain map. Every read must return the latest bytes written, the memory bound
//! must hold after every step, and in the end the files must hold every page's latest bytes.

mod common;
use bpe_core::{BehindLog, Engine, FileHandle, Via};
use common::*;
use proptest::prelude::*;
use std::collections::HashMap;

const FILES: usize = 2;
const PAGES: u64 = 160;

#[derive(Clone, Debug)]
enum Op {
    Read {
        file: usize,
        page: u64,
    },
    /// Reads `len` pages in order from `from`: the readahead paths (data file and extension).
    Scan {
        file: usize,
        from: u64,
        len: u64,
    },
    Write {
        file: usize,
        page: u64,
    },
    /// A write held in L1 (`write_page_behind`), of a page inside the file.
    WriteBehind {
        file: usize,
        page: u64,
    },
    /// The file's writer writes back what it wrote behind.
    WriteBack {
        file: usize,
    },
    SetMemory {
        kib: u64,
    },
    Enable {
        mib: u64,
    },
    Disable,
    Resize {
        mib: u64,
    },
    DropCleanBuffers,
    Truncate {
        file: usize,
        pages: u64,
    },
    FailExtensionReads {
        n: u32,
    },
    FailExtensionWrites {
        n: u32,
    },
    CorruptExtensionReads {
        n: u32,
    },
    SettleWriter,
}

fn op() -> impl Strategy<Value = Op> {
    let file = 0..FILES;
    prop_oneof![
        30 => (file.clone(), 0..PAGES).prop_map(|(file, page)| Op::Read { file, page }),
        4 => (file.clone(), 0..PAGES, 4u64..120)
            .prop_map(|(file, from, len)| Op::Scan { file, from, len }),
        10 => (file.clone(), 0..PAGES + 8).prop_map(|(file, page)| Op::Write { file, page }),
        6 => (file.clone(), 0..PAGES).prop_map(|(file, page)| Op::WriteBehind { file, page }),
        2 => file.clone().prop_map(|file| Op::WriteBack { file }),
        2 => (256u64..1024).prop_map(|kib| Op::SetMemory { kib }),
        3 => (2u64..6).prop_map(|mib| Op::Enable { mib }),
        1 => Just(Op::Disable),
        1 => (2u64..6).prop_map(|mib| Op::Resize { mib }),
        1 => Just(Op::DropCleanBuffers),
        1 => (file.clone(), 0..PAGES).prop_map(|(file, pages)| Op::Truncate { file, pages }),
        1 => (1u32..4).prop_map(|n| Op::FailExtensionReads { n }),
        1 => (1u32..3).prop_map(|n| Op::FailExtensionWrites { n }),
        1 => (1u32..4).prop_map(|n| Op::CorruptExtensionReads { n }),
        4 => Just(Op::SettleWriter),
    ]
}

struct World {
    _dir: tempfile::TempDir,
    ext_path: std::path::PathBuf,
    engine: std::sync::Arc<Engine>,
    files: Vec<FileHandle>,
    paths: Vec<std::path::PathBuf>,
    /// Each file's pages written behind and not yet written back.
    behind: Vec<BehindLog>,
    /// The model: the bytes each page must read as, and each file's length in pages.
    pages: HashMap<(usize, u64), Vec<u8>>,
    len: Vec<u64>,
    version: u64,
}

impl World {
    fn new() -> World {
        let dir = tempdir();
        let engine = engine(256 << 10);
        let mut files = Vec::new();
        let mut paths = Vec::new();
        let mut pages = HashMap::new();
        for f in 0..FILES {
            let path = make_file(dir.path(), &format!("data{f}"), PAGES, PAGE);
            files.push(engine.open_file(&path, PAGE).unwrap());
            paths.push(path);
            for p in 0..PAGES {
                pages.insert((f, p), page_bytes(p, 0, PAGE));
            }
        }
        World {
            ext_path: dir.path().join("ext.bpe"),
            _dir: dir,
            engine,
            files,
            paths,
            behind: (0..FILES).map(|_| BehindLog::default()).collect(),
            pages,
            len: vec![PAGES; FILES],
            version: 0,
        }
    }

    fn apply(&mut self, op: &Op) {
        if let Op::Scan { file, from, len } = *op {
            for page in from..(from + len).min(PAGES + 8) {
                self.apply(&Op::Read { file, page });
            }
            return;
        }
        let e = &self.engine;
        match *op {
            Op::Scan { .. } => unreachable!("handled above"),
            Op::Read { file, page } => {
                let mut buf = vec![0u8; PAGE];
                let r = e.read_page(&self.files[file], page, &mut buf).unwrap();
                if page < self.len[file] {
                    assert_eq!(r.len, PAGE);
                    assert!(
                        buf == self.pages[&(file, page)],
                        "file {file} page {page} read from {:?} is not the latest version",
                        r.tier
                    );
                } else {
                    assert_eq!(r.len, 0, "read past end of file returned bytes");
                }
            }
            Op::Write { file, page } => {
                self.version += 1;
                let bytes = page_bytes(page, self.version, PAGE);
                e.write_page(&self.files[file], page, &bytes).unwrap();
                // Writing past the end extends the file; a hole reads as zeros.
                for hole in self.len[file]..page {
                    self.pages.insert((file, hole), vec![0u8; PAGE]);
                }
                self.len[file] = self.len[file].max(page + 1);
                self.pages.insert((file, page), bytes);
            }
            Op::WriteBehind { file, page } => {
                // Inside the file only: a page written behind past the end extends the file at
                // the write-back, and SQLite, the one user, reads no page past its own size.
                if page < self.len[file] {
                    self.version += 1;
                    let bytes = page_bytes(page, self.version, PAGE);
                    let log = &mut self.behind[file];
                    e.write_page_behind(&self.files[file], page, &bytes, Via(None), log)
                        .unwrap();
                    self.pages.insert((file, page), bytes);
                }
            }
            Op::WriteBack { file } => {
                e.write_back(&self.files[file], &mut self.behind[file], Via(None))
                    .unwrap();
                assert!(self.behind[file].is_empty());
            }
            Op::SetMemory { kib } => {
                // May be refused (the extension index needs room); refusal must change nothing.
                let before = e.max_memory();
                if e.set_max_memory(kib << 10).is_err() {
                    assert_eq!(e.max_memory(), before);
                }
            }
            Op::Enable { mib } => {
                let was = e.extension_status().state;
                let res = e.enable_extension(&self.ext_path, mib << 20);
                if res.is_err() {
                    assert_eq!(e.extension_status().state, was);
                }
            }
            Op::Disable => {
                let _ = e.disable_extension();
                assert!(!self.ext_path.exists(), "disabled extension left its file");
            }
            Op::Resize { mib } => {
                let _ = e.resize_extension(mib << 20);
            }
            Op::DropCleanBuffers => {
                let _ = e.drop_clean_buffers();
            }
            Op::Truncate { file, pages } => {
                e.truncate(&self.files[file], pages * PAGE as u64).unwrap();
                for p in pages..self.len[file] {
                    self.pages.remove(&(file, p));
                }
                // Growing by truncate adds zeroed pages.
                for p in self.len[file]..pages {
                    self.pages.insert((file, p), vec![0u8; PAGE]);
                }
                self.len[file] = pages;
            }
            Op::FailExtensionReads { n } => e.faults().fail_extension_reads(n),
            Op::FailExtensionWrites { n } => e.faults().fail_extension_writes(n),
            Op::CorruptExtensionReads { n } => e.faults().corrupt_extension_reads(n),
            Op::SettleWriter => assert!(e.wait_for_extension_writes(WAIT)),
        }
        e.check_invariants();
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn every_read_returns_the_latest_write(ops in proptest::collection::vec(op(), 1..250)) {
        let mut world = World::new();
        for op in &ops {
            world.apply(op);
        }
        // Finally, every page of every file, from wherever it is cached.
        for f in 0..FILES {
            for p in 0..world.len[f] {
                world.apply(&Op::Read { file: f, page: p });
            }
        }
        // And, written back, from the files themselves: nothing written behind was lost.
        for f in 0..FILES {
            world.apply(&Op::WriteBack { file: f });
            let disk = std::fs::read(&world.paths[f]).unwrap();
            for p in 0..world.len[f] {
                let at = p as usize * PAGE;
                assert!(
                    disk[at..at + PAGE] == world.pages[&(f, p)][..],
                    "file {f} page {p} on disk is not the latest version"
                );
            }
        }
    }
}

/// The same checks along one scripted path that surely goes through every tier, so the random
/// test above cannot pass merely by never reaching the extension.
#[test]
fn scripted_path_through_every_tier() {
    let mut w = World::new();
    w.apply(&Op::Enable { mib: 4 });
    for round in 0..3 {
        for p in 0..PAGES {
            w.apply(&Op::Read { file: 0, page: p });
            if p % 7 == round {
                w.apply(&Op::Write { file: 0, page: p });
            }
        }
        w.apply(&Op::SettleWriter);
    }
    w.apply(&Op::CorruptExtensionReads { n: 2 });
    for p in 0..PAGES {
        w.apply(&Op::Read { file: 0, page: p });
    }
    let c = w.engine.counters();
    assert!(
        c.ext_page_writes > 0,
        "nothing was written to the extension"
    );
    assert!(c.ext_page_reads > 0, "nothing was read from the extension");
    assert!(c.ext_checksum_failures > 0, "corruption was not detected");
    assert!(c.lazy_writes > 0, "nothing was evicted from RAM");
}
