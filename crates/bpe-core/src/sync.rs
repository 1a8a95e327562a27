//! The engine's locks, each with a rank. A thread takes locks in increasing rank only, so two
//! threads can never each hold a lock the other waits for. The order is written down once, here
//! (and drawn in docs/DESIGN.md), and checked on every acquisition in debug builds: a test that
//! takes locks out of order panics at the acquisition instead of deadlocking one run in a
//! thousand.
//!
//! `try_lock` never waits, so it may be taken out of order. Waiting for another thread's page
//! I/O ([`crate::pool::Pending::wait`]) with any ranked lock held is refused the same way.
//!
//! Every primitive the core blocks on is here (locks, [`Latch`], [`channel`], [`spawn`]), so that
//! with the `shuttle` feature the whole engine runs under Shuttle's scheduler, which explores
//! thread interleavings systematically (tests/shuttle.rs). Without it they are std's (fork-safe,
//! unlike parking_lot's: see `backend`) and crossbeam's channels.

use std::ops::{Deref, DerefMut};

#[cfg(not(feature = "shuttle"))]
mod backend {
    //! The standard library's futex-based locks: unlike parking_lot's they keep no process-wide
    //! state (parking_lot's table of parked threads is not fork-safe: a child forked while a
    //! parent thread was parked could lose its own waiters' wake-ups). A poisoned lock is taken
    //! as it is: a panic under a lock is an SQLite error already (`ffi::guard`).
    pub use std::sync::{
        Mutex, MutexGuard, RwLock, RwLockReadGuard as ReadGuard, RwLockWriteGuard as WriteGuard,
    };
    use std::sync::{PoisonError, TryLockError};
    pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
        m.lock().unwrap_or_else(PoisonError::into_inner)
    }
    pub fn try_lock<T>(m: &Mutex<T>) -> Option<MutexGuard<'_, T>> {
        match m.try_lock() {
            Ok(g) => Some(g),
            Err(TryLockError::Poisoned(e)) => Some(e.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        }
    }
    pub fn get_mut<T>(m: &mut Mutex<T>) -> &mut T {
        m.get_mut().unwrap_or_else(PoisonError::into_inner)
    }
    pub fn read<T>(l: &RwLock<T>) -> ReadGuard<'_, T> {
        l.read().unwrap_or_else(PoisonError::into_inner)
    }
    pub fn write<T>(l: &RwLock<T>) -> WriteGuard<'_, T> {
        l.write().unwrap_or_else(PoisonError::into_inner)
    }
    pub fn try_read<T>(l: &RwLock<T>) -> Option<ReadGuard<'_, T>> {
        match l.try_read() {
            Ok(g) => Some(g),
            Err(TryLockError::Poisoned(e)) => Some(e.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        }
    }
    pub fn rw_get_mut<T>(l: &mut RwLock<T>) -> &mut T {
        l.get_mut().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(feature = "shuttle")]
mod backend {
    pub use shuttle::sync::{
        Mutex, MutexGuard, RwLock, RwLockReadGuard as ReadGuard, RwLockWriteGuard as WriteGuard,
    };
    pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
        m.lock().expect("poisoned")
    }
    pub fn try_lock<T>(m: &Mutex<T>) -> Option<MutexGuard<'_, T>> {
        m.try_lock().ok()
    }
    pub fn get_mut<T>(m: &mut Mutex<T>) -> &mut T {
        m.get_mut().expect("poisoned")
    }
    pub fn read<T>(l: &RwLock<T>) -> ReadGuard<'_, T> {
        l.read().expect("poisoned")
    }
    pub fn write<T>(l: &RwLock<T>) -> WriteGuard<'_, T> {
        l.write().expect("poisoned")
    }
    pub fn try_read<T>(l: &RwLock<T>) -> Option<ReadGuard<'_, T>> {
        l.try_read().ok()
    }
    pub fn rw_get_mut<T>(l: &mut RwLock<T>) -> &mut T {
        l.get_mut().expect("poisoned")
    }
}

/// Ranks, lowest first: a lock may be taken only while every lock held ranks below it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Rank {
    /// `Engine::admin`: one operator action at a time (enable, disable, resize, memory).
    Admin = 10,
    /// A client's per-file state (the SQLite adapter's change detection): held while it
    /// invalidates the file, so that no reader of the file gets past its check before that.
    FileState = 15,
    /// `PrivateStore::checkpoint_generation`: one checkpoint at a time (it lists the files).
    Checkpoint = 18,
    /// `Engine::files`: the file registry (open, close, new keys).
    Files = 20,
    /// A file's key: writes hold it shared, a new key takes it exclusively.
    FileKey = 25,
    /// `Engine::status`: the extension's state as operators see it.
    Status = 40,
    /// `MemoryBudget::retarget` (`Engine::memory`): changes of L1's target (max server memory
    /// less the extension index).
    Memory = 45,
    /// `BufferPool::replacer`: the eviction queues.
    Replacer = 50,
    /// One shard of the L1 page table (never two at once).
    Shard = 60,
    /// `Engine::extension`: which extension is current.
    ExtensionSlot = 70,
    /// `Extension::tables`: the L2 index and the staged set.
    ExtensionTables = 80,
    /// Leaf locks: nothing is taken while one is held (but the slab's, as a frame may be dropped).
    Leaf = 90,
    /// `pool::Slab`'s free lists: taken wherever a frame is made or dropped, nothing under it.
    Slab = 95,
}

#[cfg(debug_assertions)]
mod held {
    use super::Rank;
    use std::cell::RefCell;

    #[cfg(not(feature = "shuttle"))]
    thread_local! {
        static HELD: RefCell<Vec<Rank>> = const { RefCell::new(Vec::new()) };
    }
    // Shuttle runs its threads on one OS thread: the stacks must be per Shuttle thread.
    #[cfg(feature = "shuttle")]
    shuttle::thread_local! {
        static HELD: RefCell<Vec<Rank>> = RefCell::new(Vec::new());
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
    inner: backend::Mutex<T>,
}

pub struct MutexGuard<'a, T> {
    rank: Rank,
    inner: backend::MutexGuard<'a, T>,
}

impl<T> Mutex<T> {
    pub const fn new(rank: Rank, value: T) -> Self {
        Mutex {
            rank,
            inner: backend::Mutex::new(value),
        }
    }

    pub fn lock(&self) -> MutexGuard<'_, T> {
        held::check_and_push(self.rank, std::any::type_name::<T>());
        MutexGuard {
            rank: self.rank,
            inner: backend::lock(&self.inner),
        }
    }

    /// Never waits, so it may be taken out of rank order.
    pub fn try_lock(&self) -> Option<MutexGuard<'_, T>> {
        let inner = backend::try_lock(&self.inner)?;
        held::push(self.rank);
        Some(MutexGuard {
            rank: self.rank,
            inner,
        })
    }

    pub fn get_mut(&mut self) -> &mut T {
        backend::get_mut(&mut self.inner)
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
    inner: backend::RwLock<T>,
}

pub struct ReadGuard<'a, T> {
    rank: Rank,
    inner: backend::ReadGuard<'a, T>,
}

pub struct WriteGuard<'a, T> {
    rank: Rank,
    inner: backend::WriteGuard<'a, T>,
}

impl<T> RwLock<T> {
    pub const fn new(rank: Rank, value: T) -> Self {
        RwLock {
            rank,
            inner: backend::RwLock::new(value),
        }
    }

    pub fn read(&self) -> ReadGuard<'_, T> {
        held::check_and_push(self.rank, std::any::type_name::<T>());
        ReadGuard {
            rank: self.rank,
            inner: backend::read(&self.inner),
        }
    }

    pub fn write(&self) -> WriteGuard<'_, T> {
        held::check_and_push(self.rank, std::any::type_name::<T>());
        WriteGuard {
            rank: self.rank,
            inner: backend::write(&self.inner),
        }
    }

    /// Never waits, so it may be taken out of rank order.
    pub fn try_read(&self) -> Option<ReadGuard<'_, T>> {
        let inner = backend::try_read(&self.inner)?;
        held::push(self.rank);
        Some(ReadGuard {
            rank: self.rank,
            inner,
        })
    }

    pub fn get_mut(&mut self) -> &mut T {
        backend::rw_get_mut(&mut self.inner)
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

/// A one-shot event: threads wait until it is set, once.
pub struct Latch {
    done: backend::Mutex<bool>,
    #[cfg(not(feature = "shuttle"))]
    cv: std::sync::Condvar,
    #[cfg(feature = "shuttle")]
    cv: shuttle::sync::Condvar,
}

impl Default for Latch {
    fn default() -> Self {
        Latch {
            done: backend::Mutex::new(false),
            cv: Default::default(),
        }
    }
}

impl Latch {
    pub fn set(&self) {
        *backend::lock(&self.done) = true;
        self.cv.notify_all();
    }

    pub fn is_set(&self) -> bool {
        *backend::lock(&self.done)
    }

    /// Waits until set; false if `timeout` passed first (Shuttle's scheduler never times out).
    pub fn wait_timeout(&self, timeout: std::time::Duration) -> bool {
        let deadline = std::time::Instant::now() + timeout;
        let mut done = backend::lock(&self.done);
        while !*done {
            #[cfg(not(feature = "shuttle"))]
            {
                let left = deadline.saturating_duration_since(std::time::Instant::now());
                if left.is_zero() {
                    return false;
                }
                done = match self.cv.wait_timeout(done, left) {
                    Ok((g, _)) => g,
                    Err(e) => e.into_inner().0,
                };
            }
            #[cfg(feature = "shuttle")]
            {
                let _ = deadline;
                done = self.cv.wait(done).expect("poisoned");
            }
        }
        true
    }

    pub fn wait(&self) {
        let mut done = backend::lock(&self.done);
        while !*done {
            #[cfg(not(feature = "shuttle"))]
            {
                done = self
                    .cv
                    .wait(done)
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
            }
            #[cfg(feature = "shuttle")]
            {
                done = self.cv.wait(done).expect("poisoned");
            }
        }
    }
}

/// A bounded queue between threads (the extension's staging queue).
pub mod channel {
    use std::time::Duration;

    #[derive(Debug, PartialEq, Eq)]
    pub enum TrySendError {
        Full,
        Disconnected,
    }

    #[derive(Debug, PartialEq, Eq)]
    pub enum RecvTimeoutError {
        Timeout,
        Disconnected,
    }

    #[cfg(not(feature = "shuttle"))]
    pub struct Sender<T>(crossbeam_channel::Sender<T>);
    #[cfg(not(feature = "shuttle"))]
    pub struct Receiver<T>(crossbeam_channel::Receiver<T>);

    #[cfg(not(feature = "shuttle"))]
    pub fn bounded<T>(n: usize) -> (Sender<T>, Receiver<T>) {
        let (tx, rx) = crossbeam_channel::bounded(n);
        (Sender(tx), Receiver(rx))
    }

    #[cfg(not(feature = "shuttle"))]
    impl<T> Sender<T> {
        pub fn try_send(&self, value: T) -> Result<(), (TrySendError, T)> {
            self.0.try_send(value).map_err(|e| match e {
                crossbeam_channel::TrySendError::Full(v) => (TrySendError::Full, v),
                crossbeam_channel::TrySendError::Disconnected(v) => (TrySendError::Disconnected, v),
            })
        }
    }

    #[cfg(not(feature = "shuttle"))]
    impl<T> Receiver<T> {
        /// A value already queued, if any.
        pub fn try_recv(&self) -> Option<T> {
            self.0.try_recv().ok()
        }

        pub fn recv_timeout(&self, timeout: Duration) -> Result<T, RecvTimeoutError> {
            self.0.recv_timeout(timeout).map_err(|e| match e {
                crossbeam_channel::RecvTimeoutError::Timeout => RecvTimeoutError::Timeout,
                crossbeam_channel::RecvTimeoutError::Disconnected => RecvTimeoutError::Disconnected,
            })
        }
    }

    #[cfg(feature = "shuttle")]
    pub struct Sender<T>(shuttle::sync::mpsc::SyncSender<T>);
    #[cfg(feature = "shuttle")]
    pub struct Receiver<T>(shuttle::sync::mpsc::Receiver<T>);

    #[cfg(feature = "shuttle")]
    pub fn bounded<T>(n: usize) -> (Sender<T>, Receiver<T>) {
        let (tx, rx) = shuttle::sync::mpsc::sync_channel(n);
        (Sender(tx), Receiver(rx))
    }

    #[cfg(feature = "shuttle")]
    impl<T> Sender<T> {
        pub fn try_send(&self, value: T) -> Result<(), (TrySendError, T)> {
            self.0.try_send(value).map_err(|e| match e {
                std::sync::mpsc::TrySendError::Full(v) => (TrySendError::Full, v),
                std::sync::mpsc::TrySendError::Disconnected(v) => (TrySendError::Disconnected, v),
            })
        }
    }

    #[cfg(feature = "shuttle")]
    impl<T> Receiver<T> {
        /// A value already queued, if any.
        pub fn try_recv(&self) -> Option<T> {
            self.0.try_recv().ok()
        }

        /// Under Shuttle this never times out: it waits for a value or the other end.
        pub fn recv_timeout(&self, _timeout: Duration) -> Result<T, RecvTimeoutError> {
            self.0.recv().map_err(|_| RecvTimeoutError::Disconnected)
        }
    }
}

/// Starts a named background thread.
pub fn spawn(name: &str, f: impl FnOnce() + Send + 'static) -> std::io::Result<()> {
    #[cfg(not(feature = "shuttle"))]
    return std::thread::Builder::new()
        .name(name.into())
        .spawn(f)
        .map(drop);
    #[cfg(feature = "shuttle")]
    return shuttle::thread::Builder::new()
        .name(name.into())
        .spawn(f)
        .map(drop);
}

/// Lets other threads run (for waits that poll).
/// A short wait in a polling loop: 1 ms, or under Shuttle a yield to its other threads (a real
/// sleep would stall every Shuttle thread, the one awaited included).
pub fn pause() {
    #[cfg(not(feature = "shuttle"))]
    std::thread::sleep(std::time::Duration::from_millis(1));
    #[cfg(feature = "shuttle")]
    shuttle::thread::yield_now();
}

pub fn yield_now() {
    #[cfg(not(feature = "shuttle"))]
    std::thread::yield_now();
    #[cfg(feature = "shuttle")]
    shuttle::thread::yield_now();
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
