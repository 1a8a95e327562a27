package sqlitebpe

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	_ "github.com/mattn/go-sqlite3" // the plain "sqlite3" driver, as rqlite opens its writer
)

// The rqlite order (issue 24): mattn/go-sqlite3 opens the write connection BEFORE the extension
// loads, so the writer is on the unix VFS; connections opened after the load (BPE_DEFAULT_VFS=1,
// here DefaultVFS) are on bpe. Each round the writer (autocheckpoint off, as rqlite's) updates
// random rows, recording every row's value (the oracle); in WAL mode half the rounds checkpoint:
// TRUNCATE (rqlite's snapshot) or PASSIVE, FULL, RESTART, sometimes with a bpe reader holding a
// read transaction in the way, sometimes with the writer going on before any bpe connection
// looks. The long-lived bpe reader looks after some commits only (so checkpoints reset frames it
// never saw), some rounds is closed while the writer writes (no bpe connection open) and opened
// again; at the end of every round it and a fresh bpe connection read every row: a value unlike
// the oracle, a row twice or a row missing is a stale row. The pool (2 MB, 500 pages) is under
// the database (about 2.4 MB, 590 pages), so pages are evicted and read again; rows change size,
// so pages split and merge. Every tenth WAL round is rqlite's sequence as such. The seed is new
// each run and printed (SQLITEBPE_SEED replays one).
//
// Each journal mode runs in a process of its own: the extension loads once per process, and the
// order (writer first, then the load) is the point. Built at 86846e7^ (before freshness followed
// the wal-index whoever writes), the WAL case fails at its first scripted round, 6 runs of 6.

const (
	rqRows   = 3500
	rqRounds = 100
	rqPoolMB = 2
)

func TestRqliteOrderWAL(t *testing.T)      { runRqliteOrderChild(t, "wal") }
func TestRqliteOrderRollback(t *testing.T) { runRqliteOrderChild(t, "delete") }

func runRqliteOrderChild(t *testing.T, mode string) {
	if os.Getenv("SQLITEBPE_HELPER") == "rqlite-order" {
		if os.Getenv("SQLITEBPE_MODE") == mode {
			rqliteOrder(t, mode, os.Getenv("SQLITEBPE_DIR"))
		}
		return
	}
	t.Parallel() // the two journal modes' processes side by side
	name := t.Name()
	cmd := exec.Command(os.Args[0], "-test.run=^"+name+"$", "-test.v", "-test.count=1")
	// The order under test must not depend on the caller's BPE_* settings.
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "BPE_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, "SQLITEBPE_HELPER=rqlite-order", "SQLITEBPE_MODE="+mode, "SQLITEBPE_DIR="+t.TempDir())
	start := time.Now()
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS: "+name) {
		t.Fatalf("helper failed: %v\n%s", err, out)
	}
	t.Logf("%s in %v\n%s", name, time.Since(start).Round(time.Millisecond), out)
}

func mustExec(t *testing.T, c *sql.Conn, q string, args ...any) {
	t.Helper()
	if _, err := c.ExecContext(context.Background(), q, args...); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
}

func connScalar(t *testing.T, c *sql.Conn, q string) int64 {
	t.Helper()
	var v sql.NullInt64
	if err := c.QueryRowContext(context.Background(), q).Scan(&v); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return v.Int64
}

type rqRow struct{ v, padLen int64 }

func rqliteOrder(t *testing.T, mode, dir string) {
	ctx := context.Background()
	path := filepath.Join(dir, "rqlite.db")
	wal := mode == "wal"
	seed := time.Now().UnixNano() // SQLITEBPE_SEED replays a run
	if v := os.Getenv("SQLITEBPE_SEED"); v != "" {
		var err error
		if seed, err = strconv.ParseInt(v, 10, 64); err != nil {
			t.Fatal(err)
		}
	}
	rng := rand.New(rand.NewSource(seed))

	// 1. The writer, on the plain driver and the unix VFS, before the extension is in the process.
	jm := "DELETE"
	if wal {
		jm = "WAL"
	}
	// No busy wait: a RESTART or TRUNCATE checkpoint with a reader in the way returns at once.
	wdb, err := sql.Open("sqlite3", "file:"+path+"?_journal_mode="+jm+"&_busy_timeout=0")
	if err != nil {
		t.Fatal(err)
	}
	defer wdb.Close()
	w, err := wdb.Conn(ctx) // one pinned connection: it must stay the one opened before the load
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if wal {
		mustExec(t, w, "PRAGMA wal_autocheckpoint=0") // rqlite: checkpoints only at snapshots
	}
	mustExec(t, w, "CREATE TABLE t(id INTEGER PRIMARY KEY, v INTEGER NOT NULL, pad TEXT NOT NULL)")
	mustExec(t, w, fmt.Sprintf("WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < %d) "+
		"INSERT INTO t SELECT i, i, printf('%%.600c', 'p') FROM c", rqRows))
	oracle := make([]rqRow, rqRows+1)
	for id := 1; id <= rqRows; id++ {
		oracle[id] = rqRow{int64(id), 600}
	}
	if wal {
		mustExec(t, w, "PRAGMA wal_checkpoint(TRUNCATE)")
	}
	dbBytes := connScalar(t, w, "SELECT page_count * page_size FROM pragma_page_count, pragma_page_size")
	if dbBytes <= rqPoolMB<<20 {
		t.Fatalf("the database (%d bytes) should be over the pool (%d MB)", dbBytes, rqPoolMB)
	}

	// 2. Only now the extension, through the package's normal path, as the default VFS (rqlite:
	// -extensions-path and BPE_DEFAULT_VFS=1). Readers open read-only, as rqlite's do.
	DefaultVFS = true
	rdsn := "file:" + path + "?mode=ro"
	long, err := sql.Open(DriverName, rdsn)
	if err != nil {
		t.Fatal(err)
	}
	defer long.Close()
	long.SetMaxIdleConns(0) // closing r closes the connection
	r, err := long.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { r.Close() }()
	if _, err := w.ExecContext(ctx, "SELECT bpe_exec('EXEC sp_configure ''max server memory (MB)'', 1')"); err == nil {
		t.Fatal("the writer has the extension's functions: it was not opened before the load")
	}
	mustExec(t, r, fmt.Sprintf("SELECT bpe_exec('EXEC sp_configure ''max server memory (MB)'', %d')", rqPoolMB))
	fresh, err := sql.Open(DriverName, rdsn)
	if err != nil {
		t.Fatal(err)
	}
	defer fresh.Close()
	fresh.SetMaxIdleConns(0) // every Conn below is a new connection

	counter := func(name string) int64 {
		t.Helper()
		var v int64
		if err := r.QueryRowContext(ctx, "SELECT cntr_value FROM bpe_performance_counters WHERE counter_name = ?", name).Scan(&v); err != nil {
			t.Fatalf("counter %q: %v", name, err)
		}
		return v
	}
	lookups0, hits0, reads0 := counter("Page lookups/sec"), counter("Buffer cache hit ratio"), counter("Page reads/sec")

	var readTime time.Duration
	check := func(c *sql.Conn, who string, round int) {
		t.Helper()
		defer func(t0 time.Time) { readTime += time.Since(t0) }(time.Now())
		rows, err := c.QueryContext(ctx, "SELECT id, v, length(pad) FROM t ORDER BY id")
		if err != nil {
			t.Fatalf("round %d, %s: %v", round, who, err)
		}
		defer rows.Close()
		// A stale page shows as a value unlike the oracle, or as a row read twice or missing
		// (an old b-tree page beside a new one).
		seen := make([]bool, rqRows+1)
		stale := []string{}
		for rows.Next() {
			var id, v, pl int64
			if err := rows.Scan(&id, &v, &pl); err != nil {
				t.Fatalf("round %d, %s: %v", round, who, err)
			}
			switch want := oracle[max(0, min(id, rqRows))]; {
			case id < 1 || id > rqRows:
				stale = append(stale, fmt.Sprintf("row %d, which does not exist: read v=%d pad=%d", id, v, pl))
			case seen[id]:
				stale = append(stale, fmt.Sprintf("row %d read twice: expected v=%d pad=%d, read v=%d pad=%d", id, want.v, want.padLen, v, pl))
			case v != want.v || pl != want.padLen:
				stale = append(stale, fmt.Sprintf("row %d: expected v=%d pad=%d, read v=%d pad=%d", id, want.v, want.padLen, v, pl))
			}
			if id >= 1 && id <= rqRows {
				seen[id] = true
			}
		}
		if err := rows.Err(); err != nil {
			t.Fatalf("round %d, %s: %v", round, who, err)
		}
		for id := 1; id <= rqRows; id++ {
			if !seen[id] {
				stale = append(stale, fmt.Sprintf("row %d missing: expected v=%d pad=%d", id, oracle[id].v, oracle[id].padLen))
			}
		}
		if len(stale) > 0 {
			n := len(stale)
			if n > 10 {
				stale = append(stale[:10], "...")
			}
			t.Fatalf("round %d (%s journal, SQLITEBPE_SEED=%d), %s: %d stale rows\n%s", round, mode, seed, who, n, strings.Join(stale, "\n"))
		}
	}
	readFresh := func(round int, when string) {
		c, err := fresh.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		check(c, "a fresh bpe connection "+when, round)
		c.Close()
	}

	check(r, "the long-lived bpe reader before any update", 0)
	roundsStart := time.Now()
	checkpoints := map[string]int{}
	commit := func() {
		t.Helper()
		tx, err := w.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		for k := 1 + rng.Intn(300); k > 0; k-- {
			id := 1 + rng.Intn(rqRows)
			v := rng.Int63n(1 << 40)
			pl := int64(450 + rng.Intn(300)) // rows change size: pages split and merge
			if _, err := tx.Exec("UPDATE t SET v = ?, pad = printf('%.*c', ?, 'q') WHERE id = ?", v, pl, id); err != nil {
				t.Fatal(err)
			}
			oracle[id] = rqRow{v, pl}
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	var holder *sql.Conn // a bpe reader holding a read transaction across rounds (WAL)
	holdUntil := 0
	reopens := 0
	rounds := rqRounds
	for round := 1; round <= rounds; round++ {
		// Some rounds the writer writes (and checkpoints) while no bpe connection is open: the
		// long-lived reader is closed, its pool's last connection to the file, and opened
		// again at the end of the round (an idle pool of rqlite's readers).
		closed := holder == nil && rng.Intn(10) == 0
		// Every tenth WAL round is rqlite's sequence as such: a commit no bpe connection sees,
		// the snapshot's TRUNCATE, a commit into the new WAL, then the readers.
		scripted := wal && holder == nil && round%10 == 1
		closed = closed && !scripted
		if closed {
			if err := r.Close(); err != nil {
				t.Fatal(err)
			}
			reopens++
		}
		// One or two transactions; the long-lived reader looks after some commits only, so
		// some checkpoints backfill (and TRUNCATE or RESTART reset) frames it never saw.
		for n := 1 + rng.Intn(3)/2; n > 0; n-- {
			commit()
			if scripted {
				break
			}
			if !closed && rng.Intn(3) == 0 {
				check(r, "the long-lived bpe reader after a commit", round)
			}
		}
		if wal && !closed && !scripted && holder == nil && rng.Intn(10) == 0 {
			if holder, err = fresh.Conn(ctx); err != nil {
				t.Fatal(err)
			}
			mustExec(t, holder, "BEGIN")
			if got := connScalar(t, holder, "SELECT count(*) FROM t"); got != rqRows {
				t.Fatalf("round %d: the holder counts %d rows", round, got)
			}
			holdUntil = round + 1 + rng.Intn(3)
		}
		if wal {
			// Half the rounds checkpoint: TRUNCATE (rqlite's snapshot) half the time, else
			// PASSIVE, FULL or RESTART.
			ckpt := []string{"", "", "", "", "", "", "TRUNCATE", "TRUNCATE", "TRUNCATE", "PASSIVE", "FULL", "RESTART"}[rng.Intn(12)]
			if scripted {
				ckpt = "TRUNCATE"
			}
			if ckpt != "" {
				// Busy (the holder in the way) is an answer, not an error.
				var busy, logFrames, done int64
				if err := w.QueryRowContext(ctx, "PRAGMA wal_checkpoint("+ckpt+")").Scan(&busy, &logFrames, &done); err != nil {
					t.Fatal(err)
				}
				if busy != 0 || done < logFrames {
					ckpt += " (stopped short)"
				}
				checkpoints[ckpt]++
				after := rng.Intn(4)
				if scripted {
					after = 1
				}
				switch after {
				case 0:
					if closed {
						break
					}
					check(r, "the long-lived bpe reader after wal_checkpoint("+ckpt+")", round)
				case 1, 2:
					// The writer goes on after the snapshot before any bpe connection looks:
					// frames into a new WAL over a checkpoint no reader saw.
					for n := 1 + rng.Intn(2); n > 0; n-- {
						commit()
					}
				}
			}
		}
		if holder != nil && holdUntil <= round {
			mustExec(t, holder, "COMMIT")
			holder.Close()
			holder = nil
		}
		if closed {
			if r, err = long.Conn(ctx); err != nil {
				t.Fatal(err)
			}
			check(r, "the long-lived bpe reader, opened again after writes with no bpe connection open,", round)
		} else {
			check(r, "the long-lived bpe reader at the end of the round", round)
		}
		readFresh(round, "")
	}
	if holder != nil {
		mustExec(t, holder, "COMMIT")
		holder.Close()
	}

	// The readers went through bpe: pages of the database in the pool, lookups, L1 hits, and
	// more page reads than the database has pages (evicted pages were read again).
	if n := connScalar(t, r, "SELECT count(*) FROM bpe_buffer_descriptors WHERE database_id = DB_ID()"); n == 0 {
		t.Fatal("no page of the database is in the buffer pool: the readers bypassed bpe")
	}
	lookups, hits, reads := counter("Page lookups/sec")-lookups0, counter("Buffer cache hit ratio")-hits0, counter("Page reads/sec")-reads0
	pages := dbBytes / 4096
	t.Logf("%s journal, SQLITEBPE_SEED=%d, %d rounds (%d with no bpe connection open), checkpoints %v: %d page lookups, %d L1 hits, %d page reads (database ~%d pages, pool %d MB), %d target pages, %d file cache invalidations, %d pages invalidated",
		mode, seed, rounds, reopens, checkpoints, lookups, hits, reads, pages, rqPoolMB, counter("Target pages"), counter("File cache invalidations"), counter("Pages invalidated by other processes"))
	t.Logf("rounds %v, of which reads %v", time.Since(roundsStart), readTime)
	if lookups == 0 || hits == 0 {
		t.Fatalf("the readers did not go through the pool: %d lookups, %d L1 hits", lookups, hits)
	}
	if target := counter("Target pages"); target >= pages {
		t.Fatalf("the pool holds %d pages, the database ~%d: nothing need be evicted", target, pages)
	}
	if reads <= pages {
		t.Fatalf("%d page reads for a database of ~%d pages: nothing was evicted and read again", reads, pages)
	}
}
