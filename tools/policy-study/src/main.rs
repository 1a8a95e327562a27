//! Replacement-policy study: records the page lookups SQLite workloads make through the bpe VFS
//! (what L1 sees, below SQLite's own pager cache), then replays each trace through our pool
//! (S3-FIFO) and textbook LRU, CLOCK and 2Q at several cache sizes.
//!
//!   cargo run --release -p policy-study            # record and replay, prints a markdown table
//!
//! The result is recorded in docs/REPLACEMENT.md.

mod policies;
mod record;

use bpe_core::PageKey;
use policies::{Clock, Lru, Ours, Policy, TwoQ};
use std::collections::HashSet;

fn hit_ratio(policy: &mut dyn Policy, trace: &[PageKey]) -> f64 {
    let hits = trace.iter().filter(|k| policy.access(**k)).count();
    hits as f64 * 100.0 / trace.len() as f64
}

fn main() {
    let dir = std::env::current_dir().unwrap().join("target/policy-study");
    std::fs::create_dir_all(&dir).unwrap();
    let traces = record::record_all(&dir);
    println!("| trace | lookups | distinct pages | cache (% of distinct) | LRU | CLOCK | 2Q | S3-FIFO (ours) |");
    println!("|---|---|---|---|---|---|---|---|");
    for (name, trace) in &traces {
        let distinct = trace.iter().collect::<HashSet<_>>().len();
        for pct in [5usize, 10, 25, 50] {
            let cap = (distinct * pct / 100).max(16);
            let mut row = format!(
                "| {name} | {} | {distinct} | {pct}% ({cap} pages) |",
                trace.len()
            );
            let policies: Vec<Box<dyn Policy>> = vec![
                Box::new(Lru::new(cap)),
                Box::new(Clock::new(cap)),
                Box::new(TwoQ::new(cap)),
                Box::new(Ours::new(cap, record::PAGE_SIZE)),
            ];
            for mut p in policies {
                row += &format!(" {:.1} |", hit_ratio(p.as_mut(), trace));
            }
            println!("{row}");
        }
    }
}
