//! The WAL checkpointer of the configurations with the writers' queue: SQLite's autocheckpoint
//! rule, run on a connection of its own.
//!
//! SQLite's autocheckpoint runs in the committing terminal, inside its turn in the writers'
//! queue, and every other writer would wait for it; so the terminals turn theirs off and this
//! thread checkpoints beside them, by the rule of SQLite's default WAL hook: once the WAL holds
//! [`CHECKPOINT_FRAMES`] frames, after every commit while it still does.
//!
//! The rule is SQLite's; its effect under load is not quite. A checkpoint inside the commit
//! finishes before the next writer starts, and that writer starts a fully backfilled WAL over.
//! Here the next writer has usually begun before the checkpoint is done, so the WAL seldom
//! starts over: it grows until [`WAL_RESTART_FRAMES`], where the checkpointer stops the writers
//! for a `RESTART`, and meanwhile nearly every commit makes a checkpoint due.
//!
//! Two other rules were measured on `slowvol:gp3` (docs/BENCHMARKS.md, "The writers' queue
//! checkpoints as SQLite would"): this benchmark's first (a checkpoint back to back while
//! 1,000 frames or more waited, every 20 ms otherwise) and one checkpoint per 1,000 new frames.
//! Of the three, this one did best with `synchronous = NORMAL` and about as well as the others
//! with `FULL`; it is kept for following SQLite's own rule, not for those ratios.

use std::os::raw::c_int;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The WAL's length from which a commit makes a checkpoint due: SQLite's default
/// `wal_autocheckpoint`.
const CHECKPOINT_FRAMES: i64 = 1000;

/// WAL frames after which the checkpointer stops the writers to restart the WAL, so that it
/// stays bounded even when readers keep it from being started over.
const WAL_RESTART_FRAMES: i64 = 20_000;

/// How often the checkpointer looks for commits; the terminals commit a few hundred times a
/// second here.
const POLL: Duration = Duration::from_millis(2);

/// What the newest commit of any terminal in this process told the WAL hook. A plain `fn` is all
/// rusqlite's hook takes, hence a static: one OLTP run at a time per process, which the
/// benchmark's child processes are (tests that install the hook take turns, see the tests).
static LAST_COMMIT: Mutex<CommitReport> = Mutex::new(CommitReport {
    frames: 0,
    commits: 0,
});

#[derive(Debug, Clone, Copy)]
struct CommitReport {
    /// Frames in the WAL after the commit.
    frames: i64,
    /// Commits reported so far: one that came since the last checkpoint is what makes the next
    /// one due, as SQLite's WAL hook runs once per commit.
    commits: u64,
}

fn last_commit() -> CommitReport {
    *LAST_COMMIT.lock().unwrap_or_else(|e| e.into_inner())
}

fn note_wal_frames(_: &rusqlite::hooks::Wal, frames: c_int) -> rusqlite::Result<()> {
    let mut wal = LAST_COMMIT.lock().unwrap_or_else(|e| e.into_inner());
    wal.frames = i64::from(frames);
    wal.commits += 1;
    Ok(())
}

/// Makes `conn`'s commits report the WAL's length to the checkpointer. This replaces the
/// connection's autocheckpoint (SQLite keeps one WAL hook a connection), which is the point.
pub fn report_commits(conn: &rusqlite::Connection) {
    conn.wal_hook(Some(note_wal_frames));
}

/// What the checkpointer did, for the run's details.
#[derive(Debug, Default, Clone, Copy)]
pub struct Checkpoints {
    /// `PASSIVE` checkpoints run.
    pub passive: u64,
    /// `RESTART`s run, each with the writers' queue held.
    pub restart: u64,
    /// Checkpoints of either kind SQLite answered busy (another checkpoint running, or a reader
    /// holding what a `RESTART` waits for).
    pub busy: u64,
    /// Time the writers' queue stood still for the `RESTART`s.
    pub writers_held: Duration,
}

/// A connection that checkpoints, and the newest commit it has checkpointed after.
pub struct Checkpointer {
    conn: rusqlite::Connection,
    last: CommitReport,
}

impl Checkpointer {
    pub fn new(conn: rusqlite::Connection) -> Self {
        let last = last_commit();
        Self { conn, last }
    }

    /// Checkpoints until `stop` or `deadline`: whenever the WAL holds [`CHECKPOINT_FRAMES`]
    /// frames or more and a commit came since the last checkpoint (module docs).
    pub fn run_until(
        &mut self,
        writers: &Mutex<()>,
        stop: &AtomicBool,
        deadline: Instant,
    ) -> anyhow::Result<Checkpoints> {
        let mut done = Checkpoints::default();
        while !stop.load(Relaxed) && Instant::now() < deadline {
            let wal = last_commit();
            if wal.frames < CHECKPOINT_FRAMES || wal.commits == self.last.commits {
                std::thread::sleep(POLL);
                continue;
            }
            done.passive += 1;
            done.busy += u64::from(self.checkpoint("PASSIVE")?);
            self.last = wal;
            if wal.frames > WAL_RESTART_FRAMES {
                let _turn = writers.lock().unwrap_or_else(|e| e.into_inner());
                let held = Instant::now();
                done.restart += 1;
                done.busy += u64::from(self.checkpoint("RESTART")?);
                // No writer commits while the queue is held: this is the WAL the RESTART left,
                // and the commits during the PASSIVE above are not due again.
                self.last = last_commit();
                done.writers_held += held.elapsed();
            }
        }
        Ok(done)
    }

    /// Runs one checkpoint; true if SQLite answered busy (it reports that as a row, not an
    /// error).
    fn checkpoint(&self, mode: &str) -> anyhow::Result<bool> {
        let sql = format!("PRAGMA wal_checkpoint({mode})");
        let busy: i64 = self.conn.query_row(&sql, [], |r| r.get(0))?;
        Ok(busy != 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Commits one row a transaction until the WAL holds at least `frames` frames.
    fn commit_until(conn: &rusqlite::Connection, frames: i64) {
        for _ in 0..100_000 {
            if last_commit().frames >= frames {
                return;
            }
            conn.execute("INSERT INTO t(v) VALUES (randomblob(100))", [])
                .unwrap();
        }
        panic!("the WAL hook never reported {frames} frames");
    }

    fn wal_database() -> (tempfile::TempDir, rusqlite::Connection, Checkpointer) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        let writer = rusqlite::Connection::open(&path).unwrap();
        writer
            .execute_batch(
                "PRAGMA journal_mode = WAL; PRAGMA synchronous = OFF; CREATE TABLE t(v);",
            )
            .unwrap();
        report_commits(&writer);
        let checkpointer = Checkpointer::new(rusqlite::Connection::open(&path).unwrap());
        (dir, writer, checkpointer)
    }

    fn run_briefly(checkpointer: &mut Checkpointer, writers: &Mutex<()>) -> Checkpoints {
        let stop = AtomicBool::new(false);
        let deadline = Instant::now() + Duration::from_millis(100);
        checkpointer.run_until(writers, &stop, deadline).unwrap()
    }

    fn commit_one(conn: &rusqlite::Connection) -> i64 {
        conn.execute("INSERT INTO t(v) VALUES (1)", []).unwrap();
        last_commit().frames
    }

    /// The tests share [`LAST_COMMIT`]: one at a time.
    static HOOK_TESTS: Mutex<()> = Mutex::new(());

    #[test]
    fn a_wal_past_the_restart_length_is_restarted_and_started_over() {
        let _one_hook = HOOK_TESTS.lock().unwrap_or_else(|e| e.into_inner());
        let (_dir, writer, mut checkpointer) = wal_database();
        let writers = Mutex::new(());
        commit_until(&writer, WAL_RESTART_FRAMES + 1);
        let done = run_briefly(&mut checkpointer, &writers);
        assert_eq!(
            (done.passive, done.restart, done.busy),
            (1, 1, 0),
            "{done:?}"
        );
        assert_eq!(run_briefly(&mut checkpointer, &writers).restart, 0);
        let frames = commit_one(&writer);
        assert!(
            frames < 10,
            "the RESTART did not start the WAL over: {frames} frames"
        );
    }

    #[test]
    fn the_checkpointer_follows_sqlites_autocheckpoint_rule() {
        let _one_hook = HOOK_TESTS.lock().unwrap_or_else(|e| e.into_inner());
        let (dir, writer, mut checkpointer) = wal_database();
        let path = dir.path().join("db");
        let writers = Mutex::new(());

        commit_until(&writer, CHECKPOINT_FRAMES / 2);
        let early = run_briefly(&mut checkpointer, &writers);
        assert_eq!(
            early.passive, 0,
            "checkpointed a WAL of fewer than 1,000 frames"
        );
        commit_until(&writer, CHECKPOINT_FRAMES);
        let due = run_briefly(&mut checkpointer, &writers);
        assert_eq!(
            due.passive, 1,
            "one checkpoint once due, none while nothing is committed"
        );
        // It backfilled the whole WAL, so the next commit starts it over: nothing is due.
        let frames = commit_one(&writer);
        assert!(frames < 10, "the WAL was not started over: {frames} frames");
        assert_eq!(run_briefly(&mut checkpointer, &writers).passive, 0);

        // A reader whose snapshot predates the next checkpoint keeps the WAL from starting over;
        // then every commit makes one checkpoint due, as SQLite's WAL hook would.
        commit_until(&writer, CHECKPOINT_FRAMES);
        let reader = rusqlite::Connection::open(&path).unwrap();
        reader
            .execute_batch("BEGIN; SELECT count(*) FROM t;")
            .unwrap();
        assert_eq!(run_briefly(&mut checkpointer, &writers).passive, 1);
        let frames = commit_one(&writer);
        assert!(
            frames > CHECKPOINT_FRAMES,
            "the WAL started over under a reader"
        );
        assert_eq!(run_briefly(&mut checkpointer, &writers).passive, 1);
        assert_eq!(run_briefly(&mut checkpointer, &writers).passive, 0);
        reader.execute_batch("COMMIT").unwrap();
    }
}
