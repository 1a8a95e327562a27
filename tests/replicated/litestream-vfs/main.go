// Command litestream-vfs puts sqlite-bpe's tiers under Litestream's read-replica VFS (issue 24,
// item 5) in a Go application, the way Litestream documents the VFS for Go: the VFS registered
// in-process (litestream.NewVFS + sqlite3vfs.RegisterVFS), connections through mattn/go-sqlite3,
// bpe loaded by bindings/go (driver "sqlite3_bpe") and opened as
// `file:NAME?vfs=bpe&bpe_base=litestream`.
//
// (Litestream's loadable extension, the litestream-vfs 0.5.17 wheel, cannot be used beside any
// other file database in a process: its auto-extension is declared void, so for every later
// connection whose file is not Litestream's it returns SQLITE_DONE as an error and the open
// fails with "automatic extension loading failed", with or without bpe.)
//
// A writer (plain SQLite, WAL) changes rows of a source database; `litestream replicate` ships
// each commit to a file:// replica; readers read the replica through the VFS.
//
//	-mode oracle  Readers through bpe and, as controls, through the plain VFS: long-lived
//	              connections and a fresh connection per read, each read one transaction. Every
//	              read must equal one committed state of the writer exactly (checked by two sums
//	              over every row against the state its meta row names), and a long-lived
//	              connection's state never goes back. After the last write a fresh bpe
//	              connection must see the final state within -fresh-within. Exits 1 on any
//	              stale or torn read.
//	-mode bench   One arm (-arm litestream, bpe, bpe-ext or bpe-ext-restart) in this process
//	              over a replicated database larger than the VFS's own 10 MB LRU (bench.go).
//	-mode bench-all  Every arm, each in a process of its own (bpe's pool is per process), the
//	              restart arm after the extension arm on the same extension file, then one
//	              table of all arms side by side.
//	-mode hitratio   bpe's share of pages served from its pool while a writer commits once a
//	              second through `litestream replicate`, against the same reads with no writes.
//
// The replica is a file:// directory, or with -replica s3://BUCKET/PATH?endpoint=http://127.0.0.1:PORT
// an S3 bucket (tools/s3-server.sh starts a real server): the writer's `litestream replicate`
// writes to the server, the readers read through a proxy that adds -s3-delay to each GET and
// counts them (s3.go). LITESTREAM_REPLICA_URL is set to the proxy's URL for any reader in the
// process that reads the replica itself.
package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/benbjohnson/litestream"
	_ "github.com/mattn/go-sqlite3"
	"github.com/psanford/sqlite3vfs"
	"sqlitebpe"
)

var (
	mode        = flag.String("mode", "oracle", "oracle, bench, bench-all or hitratio")
	bin         = flag.String("litestream", "litestream", "the litestream binary (replicate)")
	work        = flag.String("work", "", "work directory (a new temporary one if empty)")
	rows        = flag.Int("rows", 4000, "rows in the table")
	rounds      = flag.Int("rounds", 150, "oracle: write transactions")
	updates     = flag.Int("updates", 40, "oracle: rows changed per write transaction")
	writeEvery  = flag.Duration("write-every", 40*time.Millisecond, "oracle: pause between writes")
	readers     = flag.Int("readers", 2, "oracle: reader goroutines per kind (bpe, control)")
	freshWithin = flag.Duration("fresh-within", 20*time.Second, "oracle: bound for the final state to be seen")
	arm         = flag.String("arm", "bpe", "bench: litestream, bpe, bpe-ext or bpe-ext-restart")
	queries     = flag.Int("queries", 2000, "bench: point lookups per pass")
	replicaDir  = flag.String("replica-dir", "", "replica directory (default: under -work); an existing replica is reused")
	replicaURL  = flag.String("replica", "", "s3://BUCKET/PATH?endpoint=http://127.0.0.1:PORT: the replica on an S3 server (default: a file:// replica)")
	s3Delay     = flag.Duration("s3-delay", 0, "S3: latency the readers' proxy adds to each GET")
	jsonOut     = flag.String("json", "", "write the results here")
)

// replicaSpecIsS3 and the proxy are set once in run.
var (
	replicaSpecIsS3 bool
	readProxy       *proxy
)

const (
	padBytes = 900
	// Every syncEvery rounds the writer waits for the replica (see `floor`); pollMargin is
	// 20 of the VFS's poll intervals.
	syncEvery  = 25
	pollMargin = 2 * time.Second
)

func main() {
	flag.Parse()
	applyQuick()
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "litestream-vfs:", err)
		exitProcess(1)
	}
	exitProcess(0)
}

func run() error {
	dir := *work
	if dir == "" {
		d, err := os.MkdirTemp("", "bpe-litestream-vfs.")
		if err != nil {
			return err
		}
		defer os.RemoveAll(d)
		dir = d
	}
	replica, err := parseReplica(*replicaURL, dir)
	if err != nil {
		return err
	}
	replicaSpecIsS3 = replica.isS3()
	if replica.isS3() {
		if *mode != "bench-all" {
			// bench-all's children read; the parent only writes the replica.
			if readProxy, err = startProxy(replica.endpoint, *s3Delay); err != nil {
				return err
			}
			replica.readEndpoint = readProxy.url
		}
		setupS3Env(replica)
		if readProxy != nil {
			fmt.Printf("replica %s; readers: %s (%s)\n", *replicaURL, replica.readerURL(), delayNote())
		}
	}
	client, err := replica.readerClient()
	if err != nil {
		return err
	}
	if err := client.Init(context.Background()); err != nil {
		return err
	}
	vfs := litestream.NewVFS(client, slog.New(slog.NewTextHandler(io.Discard, nil)))
	vfs.PollInterval = 100 * time.Millisecond
	if err := sqlite3vfs.RegisterVFS("litestream", vfs); err != nil {
		return err
	}
	switch *mode {
	case "oracle":
		return oracle(dir, replica)
	case "bench":
		return bench(dir, replica, client)
	case "bench-all":
		return benchAll(dir, replica, client)
	case "hitratio":
		return hitRatio(dir, replica)
	}
	return fmt.Errorf("unknown -mode %q", *mode)
}

// replicaName is the name the readers open: the VFS reads the replica whatever the name says;
// bpe names its cached snapshots by it.
func replicaName(dir string) string { return filepath.Join(dir, "replica.db") }

func bpeDSN(dir string) string {
	return "file:" + replicaName(dir) + "?vfs=bpe&bpe_base=litestream"
}
func plainDSN(dir string) string { return "file:" + replicaName(dir) + "?vfs=litestream" }

// createSource makes the source database (WAL) with `n` rows at version 0 and a meta row.
func createSource(path string, n int) (*sql.DB, error) {
	db, err := sql.Open("sqlite3", "file:"+path+"?_journal_mode=WAL&_busy_timeout=5000")
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(1)
	stmts := []string{
		"CREATE TABLE IF NOT EXISTS t (id INTEGER PRIMARY KEY, v INTEGER NOT NULL, pad BLOB)",
		"CREATE TABLE IF NOT EXISTS meta (k INTEGER PRIMARY KEY, round INTEGER NOT NULL)",
		"INSERT OR IGNORE INTO meta VALUES (1, 0)",
	}
	for _, s := range stmts {
		if _, err := db.Exec(s); err != nil {
			return nil, err
		}
	}
	tx, err := db.Begin()
	if err != nil {
		return nil, err
	}
	for i := 1; i <= n; i++ {
		if _, err := tx.Exec("INSERT OR IGNORE INTO t VALUES (?, 0, randomblob(?))", i, padBytes); err != nil {
			return nil, err
		}
	}
	return db, tx.Commit()
}

// replicate starts `litestream replicate` of `src` into `replica`.
func replicate(dir, src string, replica *replicaSpec) (*exec.Cmd, error) {
	cfg := filepath.Join(dir, "litestream.yml")
	// Compaction into level 1 is put off past the run: with it (every 30 s by default), the
	// plain VFS's long-lived connections served mixed states in a 300-round run (Litestream's
	// own fault: the control readers caught it, see docs/SQLITE.md).
	yml := fmt.Sprintf("levels:\n  - interval: 24h\n  - interval: 48h\n  - interval: 96h\n"+
		"dbs:\n  - path: %s\n    replicas:\n%s        sync-interval: 50ms\n", src, replica.writerYAML())
	if err := os.WriteFile(cfg, []byte(yml), 0o644); err != nil {
		return nil, err
	}
	log, err := os.Create(filepath.Join(dir, "litestream.log"))
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(*bin, "replicate", "-config", cfg)
	cmd.Stdout, cmd.Stderr = log, log
	return cmd, cmd.Start()
}

// state is one committed state of the writer, as two sums over every row.
type state struct{ sum, weighted int64 }

// readState reads the meta row's round and the sums in one read transaction.
func readState(ctx context.Context, c *sql.Conn) (round int64, s state, err error) {
	tx, err := c.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return 0, s, err
	}
	defer tx.Rollback()
	if err = tx.QueryRowContext(ctx, "SELECT round FROM meta WHERE k = 1").Scan(&round); err != nil {
		return 0, s, err
	}
	err = tx.QueryRowContext(ctx, "SELECT sum(v), sum(v * id) FROM t").Scan(&s.sum, &s.weighted)
	return round, s, err
}

// waitForReplica waits until the VFS can read the replica at the writer's round `want`.
func waitForReplica(dsn, driver string, want int64, within time.Duration) (time.Duration, error) {
	start := time.Now()
	var last error
	for time.Since(start) < within {
		db, err := sql.Open(driver, dsn)
		if err == nil {
			var r int64
			err = db.QueryRow("SELECT round FROM meta WHERE k = 1").Scan(&r)
			db.Close()
			if err == nil && r >= want {
				return time.Since(start), nil
			}
		}
		last = err
		time.Sleep(50 * time.Millisecond)
	}
	return 0, fmt.Errorf("the replica did not reach round %d within %v (last error: %v)", want, within, last)
}

// floor is the round every read that starts from now on must reach: set at a sync point, once
// a fresh plain connection saw the round and every connection has had time to poll for it.
type floor struct {
	mu    sync.Mutex
	round int64
	at    time.Time
}

func (f *floor) set(r int64) {
	f.mu.Lock()
	f.round, f.at = r, time.Now()
	f.mu.Unlock()
}

// forReadAt is the floor for a read that started at `t`.
func (f *floor) forReadAt(t time.Time) int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	if t.After(f.at) {
		return f.round
	}
	return -1
}

type tally struct {
	reads, stale, backwards, errors atomic.Int64
	firstBad                        atomic.Value
}

func (t *tally) bad(msg string) {
	t.stale.Add(1)
	t.firstBad.CompareAndSwap(nil, msg)
}

func oracle(dir string, replica *replicaSpec) error {
	src := filepath.Join(dir, "src.db")
	w, err := createSource(src, *rows)
	if err != nil {
		return err
	}
	defer w.Close()
	ls, err := replicate(dir, src, replica)
	if err != nil {
		return err
	}
	defer func() { ls.Process.Kill(); ls.Wait() }()
	if _, err := waitForReplica(plainDSN(dir), "sqlite3", 0, 60*time.Second); err != nil {
		return err
	}

	var mu sync.Mutex
	states := map[int64]state{0: {}}
	vals := make([]int64, *rows+1)
	expect := func(r int64) (state, bool) {
		mu.Lock()
		defer mu.Unlock()
		s, ok := states[r]
		return s, ok
	}

	var fl floor
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	var wg sync.WaitGroup
	results := map[string]*tally{"bpe": {}, "control": {}}
	for kind, driver := range map[string]string{"bpe": sqlitebpe.DriverName, "control": "sqlite3"} {
		dsn := bpeDSN(dir)
		if kind == "control" {
			dsn = plainDSN(dir)
		}
		t := results[kind]
		for i := 0; i < *readers; i++ {
			wg.Add(1)
			go func(long bool) {
				defer wg.Done()
				readLoop(ctx, driver, dsn, long, t, expect, &fl)
			}(i%2 == 0)
		}
	}

	rng := rand.New(rand.NewSource(1))
	for r := int64(1); r <= int64(*rounds); r++ {
		tx, err := w.Begin()
		if err != nil {
			return err
		}
		for j := 0; j < *updates; j++ {
			id := 1 + rng.Intn(*rows)
			if _, err := tx.Exec("UPDATE t SET v = ? WHERE id = ?", r, id); err != nil {
				return err
			}
			vals[id] = r
		}
		if _, err := tx.Exec("UPDATE meta SET round = ? WHERE k = 1", r); err != nil {
			return err
		}
		var s state
		for id, v := range vals {
			s.sum += v
			s.weighted += v * int64(id)
		}
		mu.Lock()
		states[r] = s
		mu.Unlock()
		if err := tx.Commit(); err != nil {
			return err
		}
		if r%syncEvery == 0 {
			// A sync point: once a fresh plain connection sees round r, and every
			// connection has polled since, no read that starts may show an older round.
			if _, err := waitForReplica(plainDSN(dir), "sqlite3", r, *freshWithin); err != nil {
				return err
			}
			time.Sleep(pollMargin)
			fl.set(r)
		}
		time.Sleep(*writeEvery)
	}
	fresh, freshErr := waitForReplica(bpeDSN(dir), sqlitebpe.DriverName, int64(*rounds), *freshWithin)
	stop()
	wg.Wait()

	counters := bpeCounters()
	out := map[string]any{
		"rounds": *rounds, "rows": *rows, "updates": *updates,
		"final_state_seen_after_s": fresh.Seconds(), "counters": counters,
		"replica": replica.readerURL(), "s3_delay": s3Delay.String(), "gets": readProxy.snapshot(),
	}
	failed := freshErr != nil
	for kind, t := range results {
		bad, _ := t.firstBad.Load().(string)
		out[kind] = map[string]any{
			"reads": t.reads.Load(), "stale_or_torn": t.stale.Load(),
			"went_back": t.backwards.Load(), "errors": t.errors.Load(), "first_bad": bad,
		}
		fmt.Printf("%-8s reads %6d  stale/torn %d  went back %d  errors %d  [%s] %s\n", kind,
			t.reads.Load(), t.stale.Load(), t.backwards.Load(), t.errors.Load(), delayNote(), bad)
		if kind == "bpe" && (t.stale.Load() > 0 || t.backwards.Load() > 0 || t.reads.Load() == 0) {
			failed = true
		}
		if kind == "control" && t.stale.Load() > 0 {
			fmt.Println("the plain Litestream VFS served a read that matches no committed state: the engine's fault, not bpe's")
			failed = true
		}
	}
	fmt.Printf("final state seen by a fresh bpe connection after %.2f s (%v)\n", fresh.Seconds(), freshErr)
	fmt.Printf("bpe counters: %v\n", counters)
	if replica.isS3() {
		fmt.Printf("readers' %s [%s]\n", readProxy.snapshot(), delayNote())
	}
	if err := writeJSON(out); err != nil {
		return err
	}
	if failed {
		return fmt.Errorf("FAILED (see above)")
	}
	fmt.Println("PASS: 0 stale or torn reads through bpe over the Litestream VFS")
	return nil
}

// readLoop reads states until ctx ends: through one connection, or a fresh one per read.
func readLoop(ctx context.Context, driver, dsn string, long bool, t *tally, expect func(int64) (state, bool), fl *floor) {
	var kept *sql.DB
	last := int64(-1)
	for ctx.Err() == nil {
		db := kept
		if db == nil {
			d, err := sql.Open(driver, dsn)
			if err != nil {
				t.errors.Add(1)
				return
			}
			d.SetMaxOpenConns(1)
			db = d
		}
		started := time.Now()
		round, got, err := readOnce(ctx, db)
		if long {
			kept = db
		} else {
			db.Close()
		}
		if err != nil {
			if ctx.Err() == nil {
				t.errors.Add(1)
				t.firstBad.CompareAndSwap(nil, "error: "+err.Error())
			}
			continue
		}
		t.reads.Add(1)
		want, ok := expect(round)
		switch {
		case !ok:
			t.bad(fmt.Sprintf("round %d was never committed", round))
		case got != want:
			t.bad(fmt.Sprintf("round %d read sums %v, committed %v", round, got, want))
		case round < fl.forReadAt(started):
			t.bad(fmt.Sprintf("round %d read after round %d was visible to every connection", round, fl.forReadAt(started)))
		case long && round < last:
			t.backwards.Add(1)
		}
		last = round
	}
	if kept != nil {
		kept.Close()
	}
}

func readOnce(ctx context.Context, db *sql.DB) (int64, state, error) {
	c, err := db.Conn(ctx)
	if err != nil {
		return 0, state{}, err
	}
	defer c.Close()
	return readState(ctx, c)
}

// bpeCounters reads bpe's counters for this process.
func bpeCounters() map[string]int64 {
	db, err := sql.Open(sqlitebpe.DriverName, ":memory:")
	if err != nil {
		return nil
	}
	defer db.Close()
	out := map[string]int64{}
	q := "SELECT counter_name, cntr_value FROM bpe_performance_counters WHERE counter_name IN " +
		"('Buffer cache hit ratio', 'Buffer cache hit ratio base', 'Page lookups/sec', 'Page reads/sec', " +
		"'Extension page reads/sec', 'Extension page writes/sec')"
	rs, err := db.Query(q)
	if err != nil {
		return nil
	}
	defer rs.Close()
	for rs.Next() {
		var k string
		var v int64
		if rs.Scan(&k, &v) == nil {
			out[k] = v
		}
	}
	return out
}

func writeJSON(v any) error {
	if *jsonOut == "" {
		return nil
	}
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(*jsonOut, b, 0o644)
}
