//! Replacement policies replayed against recorded traces. `S3Fifo` is the product's own pool
//! (bpe_core::pool::BufferPool) driven through its public API; the others are textbook
//! implementations kept here only as yardsticks.

use bpe_core::pool::{BufferPool, EvictionSink, Frame, LoadSource, Lookup, NewFrame};
use bpe_core::PageKey;
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::Arc;

pub trait Policy {
    /// Accesses a page; true on a hit.
    fn access(&mut self, key: PageKey) -> bool;
}

/// Least recently used.
pub struct Lru {
    cap: usize,
    clock: u64,
    stamp: HashMap<PageKey, u64>,
    order: BTreeMap<u64, PageKey>,
}

impl Lru {
    pub fn new(cap: usize) -> Self {
        Lru {
            cap,
            clock: 0,
            stamp: HashMap::new(),
            order: BTreeMap::new(),
        }
    }
}

impl Policy for Lru {
    fn access(&mut self, key: PageKey) -> bool {
        self.clock += 1;
        let hit = match self.stamp.insert(key, self.clock) {
            Some(old) => {
                self.order.remove(&old);
                true
            }
            None => false,
        };
        self.order.insert(self.clock, key);
        if self.stamp.len() > self.cap {
            let (_, victim) = self.order.pop_first().unwrap();
            self.stamp.remove(&victim);
        }
        hit
    }
}

/// CLOCK (second chance): one reference bit per frame and a sweeping hand.
pub struct Clock {
    frames: Vec<(PageKey, bool)>,
    index: HashMap<PageKey, usize>,
    hand: usize,
    cap: usize,
}

impl Clock {
    pub fn new(cap: usize) -> Self {
        Clock {
            frames: Vec::new(),
            index: HashMap::new(),
            hand: 0,
            cap,
        }
    }
}

impl Policy for Clock {
    fn access(&mut self, key: PageKey) -> bool {
        if let Some(&i) = self.index.get(&key) {
            self.frames[i].1 = true;
            return true;
        }
        if self.frames.len() < self.cap {
            self.index.insert(key, self.frames.len());
            self.frames.push((key, false));
            return false;
        }
        loop {
            let (k, referenced) = self.frames[self.hand];
            if referenced {
                self.frames[self.hand].1 = false;
                self.hand = (self.hand + 1) % self.cap;
            } else {
                self.index.remove(&k);
                self.index.insert(key, self.hand);
                self.frames[self.hand] = (key, false);
                self.hand = (self.hand + 1) % self.cap;
                return false;
            }
        }
    }
}

/// 2Q (Johnson & Shasha, full version): A1in FIFO (25 %), A1out ghost (50 %), Am LRU.
pub struct TwoQ {
    kin: usize,
    kout: usize,
    cap: usize,
    a1in: VecDeque<PageKey>,
    in_set: HashSet<PageKey>,
    a1out: VecDeque<PageKey>,
    out_set: HashSet<PageKey>,
    am: Lru,
}

impl TwoQ {
    pub fn new(cap: usize) -> Self {
        let kin = (cap / 4).max(1);
        TwoQ {
            kin,
            kout: (cap / 2).max(1),
            cap,
            a1in: VecDeque::new(),
            in_set: HashSet::new(),
            a1out: VecDeque::new(),
            out_set: HashSet::new(),
            am: Lru::new(cap - kin),
        }
    }
}

impl Policy for TwoQ {
    fn access(&mut self, key: PageKey) -> bool {
        if self.am.stamp.contains_key(&key) {
            return self.am.access(key);
        }
        if self.in_set.contains(&key) {
            return true;
        }
        if self.out_set.remove(&key) {
            self.a1out.retain(|k| *k != key);
            self.am.access(key);
            return false;
        }
        self.a1in.push_back(key);
        self.in_set.insert(key);
        if self.a1in.len() > self.kin || self.in_set.len() + self.am.stamp.len() > self.cap {
            if let Some(old) = self.a1in.pop_front() {
                self.in_set.remove(&old);
                self.a1out.push_back(old);
                self.out_set.insert(old);
                if self.a1out.len() > self.kout {
                    let gone = self.a1out.pop_front().unwrap();
                    self.out_set.remove(&gone);
                }
            }
        }
        false
    }
}

struct NoSink;
impl EvictionSink for NoSink {
    fn evicted(&self, _: &Arc<Frame>) {}
}

/// The product's L1 (S3-FIFO) itself, sized to hold `cap` pages of `page_size` bytes.
pub struct Ours {
    pool: BufferPool,
    page_size: usize,
}

impl Ours {
    pub fn new(cap: usize, page_size: usize) -> Self {
        let charge = page_size as u64 + bpe_core::config::L1_FRAME_OVERHEAD;
        Ours {
            pool: BufferPool::new(cap as u64 * charge, false),
            page_size,
        }
    }
}

impl Policy for Ours {
    fn access(&mut self, key: PageKey) -> bool {
        match self.pool.lookup(key) {
            Lookup::Hit(frame) => {
                frame.touch(0);
                true
            }
            Lookup::Load(ticket) => {
                let data = vec![0u8; self.page_size];
                let frame = NewFrame {
                    key,
                    data: &data,
                    now_ms: 0,
                    read_micros: 0,
                    prefetched: false,
                    from_extension: false,
                    current_key: None,
                    shared: None,
                    dirty: false,
                };
                self.pool
                    .finish_load(ticket, frame, LoadSource::DataFile, &NoSink);
                false
            }
            Lookup::Wait(_) => unreachable!("single-threaded replay"),
        }
    }
}
