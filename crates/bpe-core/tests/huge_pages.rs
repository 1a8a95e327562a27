//! L1's page bytes end up on huge pages (`Config::large_pages`): each 2 MiB of slab chunks is
//! collapsed into one transparent huge page once all of it was handed out, by a background
//! thread, and its bytes do not change. Its own test binary: the check reads the kernel's
//! accounting of the mapping, which another slab made beside it could share.

use bpe_core::pool::{Slab, Slot};
use std::time::{Duration, Instant};

const HUGE: usize = 2 << 20;

/// The kernel's transparent huge page mode: `always`, `madvise` or `never`.
fn thp_mode() -> String {
    let s =
        std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").unwrap_or_default();
    let mode = s.split('[').nth(1).and_then(|r| r.split(']').next());
    mode.unwrap_or("never").to_owned()
}

/// `AnonHugePages` (KiB) of the mapping that holds `addr`, from /proc/self/smaps.
fn anon_huge_kib_at(addr: usize) -> u64 {
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let mut inside = false;
    for line in smaps.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        if let Some((lo, hi)) = first.split_once('-') {
            if let (Ok(lo), Ok(hi)) = (usize::from_str_radix(lo, 16), usize::from_str_radix(hi, 16))
            {
                inside = (lo..hi).contains(&addr);
                continue;
            }
        }
        if inside {
            if let Some(v) = line.strip_prefix("AnonHugePages:") {
                return v.trim().trim_end_matches("kB").trim().parse().unwrap();
            }
        }
    }
    panic!("no mapping holds {addr:#x}");
}

/// 4 MiB of 4 KiB slots, each filled with its own index.
fn fill(slab: &Slab) -> Vec<Slot> {
    (0..1024u32)
        .map(|i| slab.alloc(4096).unwrap().filled(&[i as u8; 4096]))
        .collect()
}

#[test]
fn a_full_two_mib_of_l1_becomes_a_huge_page_with_large_pages_and_not_without() {
    let mode = thp_mode();
    if mode == "never" {
        eprintln!("skipped: transparent huge pages are off on this kernel");
        return;
    }
    // Without: nothing advises or collapses the region (khugepaged would under `always`).
    let small = Slab::new(64 << 20, 16 << 20, false);
    let small_slots = fill(&small);
    let small_addr = small_slots[0].as_ptr() as usize;
    assert_eq!(
        small_addr % HUGE,
        0,
        "the slab starts on a huge-page boundary"
    );

    let large = Slab::new(64 << 20, 16 << 20, true);
    let slots = fill(&large);
    let addr = slots[0].as_ptr() as usize;
    assert_eq!(addr % HUGE, 0, "the slab starts on a huge-page boundary");
    // A watchdog only: khugepaged collapses the range when it gets to it.
    let deadline = Instant::now() + Duration::from_secs(60);
    while anon_huge_kib_at(addr) < 2048 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(
        anon_huge_kib_at(addr) >= 2048,
        "2 MiB of chunks handed out are collapsed into a huge page"
    );
    for (i, s) in slots.iter().enumerate() {
        assert!(s.iter().all(|&b| b == i as u8), "slot {i} kept its bytes");
    }
    if mode != "always" && anon_huge_kib_at(small_addr) == 0 {
        return;
    }
    assert!(
        mode == "always",
        "a slab without large pages has {} KiB of huge pages",
        anon_huge_kib_at(small_addr)
    );
}
