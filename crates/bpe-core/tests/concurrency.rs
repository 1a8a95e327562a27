//! Many threads through one engine: readers, a writer, and an operator toggling the extension.
//! Every read must be a whole page (never torn) and never older than the newest write that had
//! completed before the read began (never stale). Bounded by operation counts, not time.

mod common;
use common::*;
use rand::{Rng, SeedableRng};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::Arc;

const PAGES: u64 = 400;
const READERS: usize = 4;
const READS_PER_THREAD: usize = 6000;

#[test]
fn readers_never_see_torn_or_stale_pages() {
    let dir = tempdir();
    let path = make_file(dir.path(), "data", PAGES, PAGE);
    let engine = engine(512 << 10);
    let file = engine.open_file(&path, PAGE).unwrap();
    let ext_path = dir.path().join("ext.bpe");
    engine.enable_extension(&ext_path, 4 << 20).unwrap();

    // Newest version of each page whose write has returned.
    let published: Arc<Vec<AtomicU64>> = Arc::new((0..PAGES).map(|_| AtomicU64::new(0)).collect());
    let done = Arc::new(AtomicBool::new(false));

    std::thread::scope(|s| {
        let mut readers = Vec::new();
        for t in 0..READERS {
            let (engine, file, published) = (&engine, &file, &published);
            readers.push(s.spawn(move || {
                let mut rng = rand::rngs::StdRng::seed_from_u64(t as u64);
                let mut buf = vec![0u8; PAGE];
                for i in 0..READS_PER_THREAD {
                    // Half the reads in a hot tenth of the file, half anywhere (scans and misses).
                    let page = if i % 2 == 0 {
                        rng.gen_range(0..PAGES / 10)
                    } else {
                        rng.gen_range(0..PAGES)
                    };
                    let floor = published[page as usize].load(SeqCst);
                    let tier = engine.read_page(file, page, &mut buf).unwrap().tier;
                    let (p, v) = decode(&buf).unwrap_or_else(|| panic!("page {page} is torn"));
                    assert_eq!(p, page, "read page {page} returned page {p}");
                    assert!(
                        v >= floor,
                        "page {page}: read version {v} from {tier:?}, but {floor} was already written"
                    );
                }
            }));
        }
        {
            let (engine, file, published, done) = (&engine, &file, &published, &done);
            s.spawn(move || {
                let mut rng = rand::rngs::StdRng::seed_from_u64(99);
                let mut version = 0;
                while !done.load(SeqCst) {
                    version += 1;
                    let page = rng.gen_range(0..PAGES);
                    engine
                        .write_page(file, page, &page_bytes(page, version, PAGE))
                        .unwrap();
                    published[page as usize].store(version, SeqCst);
                }
            });
        }
        {
            let (engine, ext_path, done) = (&engine, &ext_path, &done);
            s.spawn(move || {
                let mut i = 0u64;
                while !done.load(SeqCst) {
                    i += 1;
                    match i % 6 {
                        0 => {
                            let _ = engine.drop_clean_buffers();
                        }
                        1 => {
                            let _ = engine.disable_extension();
                        }
                        2 => {
                            let _ = engine.enable_extension(ext_path, 3 << 20);
                        }
                        3 => {
                            let _ = engine.resize_extension((2 + i % 3) << 20);
                        }
                        4 => {
                            let _ = engine.set_max_memory((384 + (i % 3) * 128) << 10);
                        }
                        _ => engine.faults().corrupt_extension_reads(1),
                    }
                    std::thread::sleep(std::time::Duration::from_millis(3));
                }
            });
        }
        // Readers finish on their own; then stop the writer and the operator.
        let outcomes: Vec<_> = readers.into_iter().map(|r| r.join()).collect();
        done.store(true, SeqCst);
        for o in outcomes {
            if let Err(panic) = o {
                std::panic::resume_unwind(panic);
            }
        }
    });
    engine.check_invariants();
}
