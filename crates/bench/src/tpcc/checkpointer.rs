//! The WAL checkpointer of the configurations with the writers' queue: SQLite's autocheckpoint
//! rule, run on a connection of its own.
//!
//! SQLite's autocheckpoint runs in the committing terminal, inside its turn in the writers'
//! queue, and every other writer would wait for it; so the terminals turn theirs off and this
//! thread checkpoints beside them, by the rule of SQLite's default WAL hook: once the WAL holds
//! [`CHECKPOINT_FRAMES`] frames, after every commit while it still does. Once a checkpoint has
//! backfilled the whole WAL and no reader holds an older snapshot, the next writer starts the
//! WAL over and nothing is due until it holds 1,000 frames again.
//!
//! Two other rules were measured on `slowvol:gp3` (issue 25, docs/BENCHMARKS.md, "The writers'
//! queue checkpoints as SQLite would"). A checkpoint every 20 ms whatever the WAL held (this
//! benchmark's first rule) ran 0.72-0.85x this one with `synchronous = NORMAL` and 1.16-1.25x it
//! with `FULL`, bpe and stock alike. A checkpoint per 1,000 new frames ran 0.77-0.79x it for bpe
//! with `NORMAL` (bpe wrote 8.5 database pages a transaction against 6.25) and 1.23-1.44x it with
//! `FULL`, where this rule checkpoints, and syncs, after nearly every commit beside the commits'
//! own syncs. This one is kept: it is the default both sides would get, and the best of the three
//! for bpe against stock.

use std::os::raw::c_int;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The WAL's length from which a commit makes a checkpoint due: SQLite's default
/// `wal_autocheckpoint`.
pub const CHECKPOINT_FRAMES: i64 = 1000;

/// WAL frames after which the checkpointer stops the writers to restart the WAL, so that it
/// stays bounded even when readers keep it from being started over.
const WAL_RESTART_FRAMES: i64 = 20_000;

/// How often the checkpointer looks for commits; the terminals commit a few hundred times a
/// second here.
const POLL: Duration = Duration::from_millis(2);

/// The WAL's length after the newest commit of any terminal in this process, as SQLite hands it
/// to the WAL hook. A plain `fn` is all rusqlite's hook takes, hence a static: one OLTP run at a
/// time per process, which the benchmark's child processes are.
static WAL: Mutex<WalLength> = Mutex::new(WalLength {
    frames: 0,
    commits: 0,
});

#[derive(Debug, Clone, Copy)]
struct WalLength {
    frames: i64,
    /// Commits reported so far: one that came since the last checkpoint is what makes the next
    /// one due, as SQLite's WAL hook runs once per commit.
    commits: u64,
}

fn wal_length() -> WalLength {
    *WAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn note_wal_frames(_: &rusqlite::hooks::Wal, frames: c_int) -> rusqlite::Result<()> {
    let mut wal = WAL.lock().unwrap_or_else(|e| e.into_inner());
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
    pub passive: u64,
    pub restart: u64,
}

/// A connection that checkpoints, and the WAL's length when it last did.
pub struct Checkpointer {
    conn: rusqlite::Connection,
    last: WalLength,
}

impl Checkpointer {
    pub fn new(conn: rusqlite::Connection) -> Self {
        let last = wal_length();
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
            let wal = wal_length();
            if wal.frames < CHECKPOINT_FRAMES || wal.commits == self.last.commits {
                std::thread::sleep(POLL);
                continue;
            }
            self.checkpoint("PASSIVE")?;
            done.passive += 1;
            if wal.frames > WAL_RESTART_FRAMES {
                let _turn = writers.lock().unwrap_or_else(|e| e.into_inner());
                self.checkpoint("RESTART")?;
                done.restart += 1;
            }
            self.last = wal;
        }
        Ok(done)
    }

    fn checkpoint(&self, mode: &str) -> anyhow::Result<()> {
        let sql = format!("PRAGMA wal_checkpoint({mode})");
        Ok(self.conn.execute_batch(&sql)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Commits one row a transaction until the WAL holds at least `frames` frames.
    fn commit_until(conn: &rusqlite::Connection, frames: i64) {
        while wal_length().frames < frames {
            conn.execute("INSERT INTO t(v) VALUES (randomblob(100))", [])
                .unwrap();
        }
    }

    fn run_briefly(checkpointer: &mut Checkpointer, writers: &Mutex<()>) -> Checkpoints {
        let stop = AtomicBool::new(false);
        let deadline = Instant::now() + Duration::from_millis(100);
        checkpointer.run_until(writers, &stop, deadline).unwrap()
    }

    fn commit_one(conn: &rusqlite::Connection) -> i64 {
        conn.execute("INSERT INTO t(v) VALUES (1)", []).unwrap();
        wal_length().frames
    }

    #[test]
    fn the_checkpointer_follows_sqlites_autocheckpoint_rule() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        let writer = rusqlite::Connection::open(&path).unwrap();
        writer
            .execute_batch("PRAGMA journal_mode = WAL; CREATE TABLE t(v);")
            .unwrap();
        report_commits(&writer);
        let mut checkpointer = Checkpointer::new(rusqlite::Connection::open(&path).unwrap());
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
