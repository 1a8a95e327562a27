//! The engine's locks, each with a rank. A thread takes locks in increasing rank only, so two
//! threads can never each hold a lock the other waits for. The order is written down once, here
//! (and drawn in docs/DESIGN.md), and checked on every acquisition in debug builds: a test that
//! takes locks out of order panics at the acquisition instead of deadlocking one run in a
//! thousand.
//!
//! `try_lock` never waits, so it may be taken out of order. Waiting for another thread's page
//! I/O ([`crate::pool::Pending::wait`]) with any ranked lock held is refused the same way.

use std::ops::{Deref, DerefMut};

/// Ranks, lowest first: a lock may be taken only while every lock held ranks below it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Rank {
    /// `Engine::admin`: one operator action at a time (enable, disable, resize, memory).
    Admin = 10,
    /// A client's per-file state (the SQLite adapter's change detection): held while it
    /// invalidates the file, so that no reader of the file gets past its check before that.
    FileState = 15,
    /// `Engine::files`: the file registry (open, close, new keys).
    Files = 20,
    /// `Engine::status`: the extension's state as operators see it.
    Status = 40,
    /// `Engine::memory`: changes of L1's target (max server memory less the extension index).
    Memory = 45,
    /// `BufferPool::replacer`: the eviction queues.
    Replacer = 50,
    /// One shard of the L1 page table (never two at once).
    Shard = 60,
    /// `Engine::extension`: which extension is current.
    ExtensionSlot = 70,
    /// `Extension::tables`: the L2 index and the staged set.
    ExtensionTables = 80,
    /// Leaf locks: nothing is taken while one is held.
    Leaf = 90,
}

#[cfg(debug_assertions)]
mod held {
    use super::Rank;
    use std::cell::RefCell;

    thread_local! {
        static HELD: RefCell<Vec<Rank>> = const { RefCell::new(Vec::new()) };
    }

    // `try_with`: locks taken while the thread's locals are being destroyed (an exit handler)
    // go unchecked rather than panic.
    pub fn check_and_push(rank: Rank, name: &str) {
        let _ = HELD.try_with(|h| {
            let mut h = h.borrow_mut();
            if let Some(&top) = h.iter().max() {
                assert!(
                    rank > top,
                    "lock order violated: taking {name} ({rank:?}) while holding {top:?} (held: {h:?})"
                );
            }
            h.push(rank);
        });
    }

    pub fn push(rank: Rank) {
        let _ = HELD.try_with(|h| h.borrow_mut().push(rank));
    }

    pub fn pop(rank: Rank) {
        let _ = HELD.try_with(|h| {
            let mut h = h.borrow_mut();
            if let Some(i) = h.iter().rposition(|&r| r == rank) {
                h.remove(i);
            }
        });
    }

    pub fn assert_none(what: &str) {
        let _ = HELD.try_with(|h| {
            let h = h.borrow();
            assert!(h.is_empty(), "{what} while holding locks {h:?}");
        });
    }
}

#[cfg(not(debug_assertions))]
mod held {
    use super::Rank;
    #[inline(always)]
    pub fn check_and_push(_: Rank, _: &str) {}
    #[inline(always)]
    pub fn push(_: Rank) {}
    #[inline(always)]
    pub fn pop(_: Rank) {}
    #[inline(always)]
    pub fn assert_none(_: &str) {}
}

/// Panics (debug builds) if the calling thread holds any ranked lock: for waits on other
/// threads, which must never happen under a lock.
pub fn assert_no_locks_held(what: &str) {
    held::assert_none(what);
}

/// A mutex with a rank.
pub struct Mutex<T> {
    rank: Rank,
    inner: parking_lot::Mutex<T>,
}

pub struct MutexGuard<'a, T> {
    rank: Rank,
    inner: parking_lot::MutexGuard<'a, T>,
}

impl<T> Mutex<T> {
    pub const fn new(rank: Rank, value: T) -> Self {
        Mutex {
            rank,
            inner: parking_lot::Mutex::new(value),
        }
    }

    pub fn lock(&self) -> MutexGuard<'_, T> {
        held::check_and_push(self.rank, std::any::type_name::<T>());
        MutexGuard {
            rank: self.rank,
            inner: self.inner.lock(),
        }
    }

    /// Never waits, so it may be taken out of rank order.
    pub fn try_lock(&self) -> Option<MutexGuard<'_, T>> {
        let inner = self.inner.try_lock()?;
        held::push(self.rank);
        Some(MutexGuard {
            rank: self.rank,
            inner,
        })
    }

    pub fn get_mut(&mut self) -> &mut T {
        self.inner.get_mut()
    }
}

impl<T> Drop for MutexGuard<'_, T> {
    fn drop(&mut self) {
        held::pop(self.rank);
    }
}

impl<T> Deref for MutexGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.inner
    }
}

impl<T> DerefMut for MutexGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.inner
    }
}

/// A reader-writer lock with a rank (readers and writers alike follow the order).
pub struct RwLock<T> {
    rank: Rank,
    inner: parking_lot::RwLock<T>,
}

pub struct ReadGuard<'a, T> {
    rank: Rank,
    inner: parking_lot::RwLockReadGuard<'a, T>,
}

pub struct WriteGuard<'a, T> {
    rank: Rank,
    inner: parking_lot::RwLockWriteGuard<'a, T>,
}

impl<T> RwLock<T> {
    pub const fn new(rank: Rank, value: T) -> Self {
        RwLock {
            rank,
            inner: parking_lot::RwLock::new(value),
        }
    }

    pub fn read(&self) -> ReadGuard<'_, T> {
        held::check_and_push(self.rank, std::any::type_name::<T>());
        ReadGuard {
            rank: self.rank,
            inner: self.inner.read(),
        }
    }

    pub fn write(&self) -> WriteGuard<'_, T> {
        held::check_and_push(self.rank, std::any::type_name::<T>());
        WriteGuard {
            rank: self.rank,
            inner: self.inner.write(),
        }
    }

    /// Never waits, so it may be taken out of rank order.
    pub fn try_read(&self) -> Option<ReadGuard<'_, T>> {
        let inner = self.inner.try_read()?;
        held::push(self.rank);
        Some(ReadGuard {
            rank: self.rank,
            inner,
        })
    }

    pub fn get_mut(&mut self) -> &mut T {
        self.inner.get_mut()
    }
}

impl<T> Drop for ReadGuard<'_, T> {
    fn drop(&mut self) {
        held::pop(self.rank);
    }
}

impl<T> Drop for WriteGuard<'_, T> {
    fn drop(&mut self) {
        held::pop(self.rank);
    }
}

impl<T> Deref for ReadGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.inner
    }
}

impl<T> Deref for WriteGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.inner
    }
}

impl<T> DerefMut for WriteGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.inner
    }
}

#[cfg(all(test, debug_assertions))]
mod tests {
    use super::*;

    #[test]
    fn locks_taken_in_rank_order_pass() {
        let a = Mutex::new(Rank::Files, ());
        let b = RwLock::new(Rank::Shard, ());
        let _a = a.lock();
        let _b = b.read();
    }

    #[test]
    #[should_panic(expected = "lock order violated")]
    fn a_lock_ranked_below_one_held_panics() {
        let a = Mutex::new(Rank::Files, ());
        let b = RwLock::new(Rank::Shard, ());
        let _b = b.write();
        let _a = a.lock();
    }

    #[test]
    fn try_lock_may_go_out_of_order_and_guards_may_drop_out_of_order() {
        let a = Mutex::new(Rank::Admin, ());
        let b = Mutex::new(Rank::Status, ());
        let c = Mutex::new(Rank::Leaf, ());
        let gb = b.lock();
        let ga = a.try_lock().expect("free");
        let gc = c.lock();
        drop(gb);
        drop(ga);
        drop(gc);
        let _a = a.lock(); // nothing held any more
    }

    #[test]
    #[should_panic(expected = "while holding locks")]
    fn waiting_under_a_lock_is_refused() {
        let a = Mutex::new(Rank::Files, ());
        let _a = a.lock();
        assert_no_locks_held("waiting for a page load");
    }
}
