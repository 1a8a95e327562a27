//! Pages one snapshot of a file may take from an earlier snapshot's cache.
//!
//! A snapshot (`FileIdentity::snapshot`) never changes, so each is cached under a file of its
//! own and connections at different snapshots never see each other's pages. Without more, a
//! reader that moves to the next snapshot reads every page again from the caller's device,
//! which for a database in object storage is a GET a page. The caller often knows which pages
//! changed between two snapshots (a replication log lists them); every other page of the newer
//! snapshot is byte for byte the older one's. A snapshot's *lineage* records that: earlier
//! snapshots, newest first, each with the pages changed since it. On a miss, a page not among
//! an ancestor's changed pages is copied from that ancestor's cached copy (RAM or extension)
//! instead of read from the device (`Engine::load`, `engine/data_path.rs`).
//!
//! Sets are supersets: a page listed as changed that did not change costs a device read, never
//! a wrong page, so a caller may list more than changed (a compacted log's file spans more
//! transactions), never less.

use std::sync::{Arc, Weak};

/// Earlier snapshots a snapshot keeps in its lineage, at most: each miss looks at them in turn.
pub const MAX_ANCESTORS: usize = 4;

/// Page numbers (0-based), sorted, without duplicates.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PageSet(Vec<u64>);

impl PageSet {
    pub fn new(mut pages: Vec<u64>) -> PageSet {
        pages.sort_unstable();
        pages.dedup();
        PageSet(pages)
    }

    pub fn contains(&self, page: u64) -> bool {
        self.0.binary_search(&page).is_ok()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Both sets' pages.
    pub fn union(&self, other: &PageSet) -> PageSet {
        let mut all = Vec::with_capacity(self.0.len() + other.0.len());
        all.extend_from_slice(&self.0);
        all.extend_from_slice(&other.0);
        PageSet::new(all)
    }
}

/// An earlier snapshot (`F`: the engine's file) and the pages changed since it. Weak: a
/// snapshot the registry forgot is gone from the lineage too (its key could otherwise be
/// renumbered under another file).
pub(crate) struct Ancestor<F> {
    pub file: Weak<F>,
    pub changed: Arc<PageSet>,
}

impl<F> Clone for Ancestor<F> {
    fn clone(&self) -> Self {
        Ancestor {
            file: self.file.clone(),
            changed: self.changed.clone(),
        }
    }
}

/// A snapshot's ancestors, newest first (see the module doc).
pub(crate) struct Lineage<F>(Vec<Ancestor<F>>);

impl<F> Clone for Lineage<F> {
    fn clone(&self) -> Self {
        Lineage(self.0.clone())
    }
}

impl<F> Default for Lineage<F> {
    fn default() -> Self {
        Lineage(Vec::new())
    }
}

impl<F> Lineage<F> {
    /// The lineage of a snapshot whose parent is `parent` (lineage `parents`), with `changed`
    /// the pages changed from the parent to it: the parent, then the parent's ancestors with
    /// `changed` added to what changed since each.
    pub fn after(parent: &Arc<F>, parents: &Lineage<F>, changed: PageSet) -> Lineage<F> {
        let changed = Arc::new(changed);
        let mut ancestors = vec![Ancestor {
            file: Arc::downgrade(parent),
            changed: changed.clone(),
        }];
        for a in parents.0.iter().take(MAX_ANCESTORS - 1) {
            ancestors.push(Ancestor {
                file: a.file.clone(),
                changed: Arc::new(a.changed.union(&changed)),
            });
        }
        Lineage(ancestors)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The ancestors whose copy of `page` is the snapshot's own, newest first: up to the first
    /// that lists the page as changed (every older one lists it too).
    pub fn holders(&self, page: u64) -> impl Iterator<Item = Arc<F>> + '_ {
        self.0
            .iter()
            .take_while(move |a| !a.changed.contains(page))
            .filter_map(|a| a.file.upgrade())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_set_is_sorted_and_unique() {
        let s = PageSet::new(vec![5, 1, 5, 3]);
        assert_eq!(s.len(), 3);
        assert!(s.contains(1) && s.contains(3) && s.contains(5));
        assert!(!s.contains(2) && !s.contains(0));
        let u = s.union(&PageSet::new(vec![2, 3]));
        assert_eq!(u, PageSet::new(vec![1, 2, 3, 5]));
    }
}
