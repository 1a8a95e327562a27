package main

// The benchmark (-mode bench: one arm; -mode bench-all: every arm, each in a process of its own)
// and the hit-ratio measurement under a writer (-mode hitratio).

// #include <stdlib.h>
import "C"

import (
	"context"
	"database/sql"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/benbjohnson/litestream"
	"sqlitebpe"
)

var (
	quick          = flag.Bool("quick", false, "small presets for CI (flags given explicitly win): 4,000 rows, 200 lookups, 10 opens, 60 oracle rounds, 10 s hit-ratio phases")
	opens          = flag.Int("opens", 50, "bench: connections opened (and closed) to measure an open's cost")
	perConnQueries = flag.Int("per-conn-queries", 0, "bench: lookups with a connection each (0: -queries)")
	scanRows       = flag.Int("scan-rows", 0, "bench: rows the scan reads, from id 1 (0: every row)")
	armsFlag       = flag.String("arms", "litestream,bpe,bpe-ext,bpe-ext-restart", "bench-all: the arms, in order")
	extFile        = flag.String("ext-file", "", "bench-all: the extension file of the bpe-ext arms (default: under -work)")
	extSize        = flag.String("ext-size", "256MB", "bench-all: the extension's size (more than bpe's max server memory)")
	extShared      = flag.Bool("ext-shared", false, "bench-all: share the extension (BPE_EXTENSION_SHARED=1); private by default, the mode checkpointed for a warm restart")
	hrSeconds      = flag.Duration("hr-seconds", 30*time.Second, "hitratio: length of each phase (no writes, then writes)")
	hrWriteEvery   = flag.Duration("hr-write-every", time.Second, "hitratio: one write transaction this often in the write phase")
	hrHot          = flag.Int("hr-hot", 1000, "hitratio: distinct rows the reader looks up, round robin")
	hrShapes       = flag.String("hr-shapes", "one,each", "hitratio: one long-lived connection (one), a connection per lookup (each), or both")
)

// applyQuick sets the -quick presets on every flag not given on the command line.
func applyQuick() {
	if !*quick {
		return
	}
	given := map[string]bool{}
	flag.Visit(func(f *flag.Flag) { given[f.Name] = true })
	for name, v := range map[string]string{
		"rows": "4000", "queries": "200", "opens": "10", "rounds": "60",
		"hr-seconds": "10s", "hr-hot": "200",
	} {
		if !given[name] {
			flag.Set(name, v) //nolint:errcheck // the presets parse
		}
	}
}

// exitProcess ends the process through the C library's exit, so that bpe's atexit handler runs:
// it checkpoints a private extension for the next process to start warm from. Go's os.Exit (and
// a return from main) end the process without running atexit handlers.
func exitProcess(code int) {
	os.Stdout.Sync()
	C.exit(C.int(code))
}

// ensureReplica makes the replica once: a source database of -rows rows replicated by
// `litestream replicate` until the VFS reads it, then replication stops (the replica stays).
func ensureReplica(dir string, replica *replicaSpec, client litestream.ReplicaClient) error {
	// The marker says which replica this work directory made (its source is here too): a
	// listing right after the writer stopped has once come back empty from the S3 server.
	marker := filepath.Join(dir, "replica-made")
	if b, err := os.ReadFile(marker); err == nil && string(b) == replica.writerYAML() {
		return nil
	}
	ok, err := replicaExists(context.Background(), client)
	if err != nil || ok {
		return err
	}
	src := filepath.Join(dir, "src.db")
	w, err := createSource(src, *rows)
	if err != nil {
		return err
	}
	w.Close()
	start := time.Now()
	ls, err := replicate(dir, src, replica)
	if err != nil {
		return err
	}
	_, err = waitForReplica(plainDSN(dir), "sqlite3", 0, 300*time.Second)
	ls.Process.Kill()
	ls.Wait()
	if err != nil {
		return err
	}
	fmt.Printf("replicated %d rows in %.1f s\n", *rows, time.Since(start).Seconds())
	return os.WriteFile(marker, []byte(replica.writerYAML()), 0o644)
}

type passResult struct {
	Arm, Pass     string
	Ops           int
	Seconds       float64
	MsPerOp       float64
	Gets          gets
	BasePageReads int64 // bpe: pages read from the base VFS (Litestream)
	ExtPageReads  int64 // bpe: pages read from the extension file
	ExtPageWrites int64 // bpe: pages written to the extension file
}

func lookupIDs(n int, seed int64) []int {
	rng := rand.New(rand.NewSource(seed))
	ids := make([]int, n)
	for i := range ids {
		ids[i] = 1 + rng.Intn(*rows)
	}
	return ids
}

func lookup(ctx context.Context, c *sql.Conn, id int) error {
	var v int64
	var pad []byte
	return c.QueryRowContext(ctx, "SELECT v, pad FROM t WHERE id = ?", id).Scan(&v, &pad)
}

// withConn runs f on a connection of a new pool of one, closed after.
func withConn(ctx context.Context, driver, dsn string, f func(*sql.Conn) error) error {
	db, err := sql.Open(driver, dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	c, err := db.Conn(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	return f(c)
}

// bench runs one arm's passes in this process.
func bench(dir string, replica *replicaSpec, client litestream.ReplicaClient) error {
	ctx := context.Background()
	if err := ensureReplica(dir, replica, client); err != nil {
		return err
	}
	driver, dsn := sqlitebpe.DriverName, bpeDSN(dir)
	switch *arm {
	case "litestream":
		driver, dsn = "sqlite3", plainDSN(dir)
	case "bpe", "bpe-ext", "bpe-ext-restart":
	default:
		return fmt.Errorf("unknown -arm %q (litestream, bpe, bpe-ext, bpe-ext-restart)", *arm)
	}
	ext := extensionState()
	if strings.HasPrefix(*arm, "bpe-ext") && !strings.Contains(ext, "extension enabled") {
		return fmt.Errorf("arm %s: the extension is not enabled (%s): set BPE_EXTENSION_FILE and BPE_EXTENSION_SIZE", *arm, ext)
	}
	fmt.Printf("arm %s: %s; extension: %s\n", *arm, delayNote(), ext)
	ids := lookupIDs(*queries, 7)
	perConn := *perConnQueries
	if perConn <= 0 || perConn > len(ids) {
		perConn = len(ids)
	}
	scan := *scanRows
	if scan <= 0 {
		scan = *rows
	}

	var results []passResult
	measure := func(pass string, ops int, f func() error) error {
		g0, c0, t0 := readProxy.snapshot(), bpeCounters(), time.Now()
		if err := f(); err != nil {
			return fmt.Errorf("%s: %w", pass, err)
		}
		secs := time.Since(t0).Seconds()
		g, c1 := readProxy.snapshot().sub(g0), bpeCounters()
		r := passResult{*arm, pass, ops, secs, secs * 1000 / float64(ops), g,
			c1["Page reads/sec"] - c0["Page reads/sec"], c1["Extension page reads/sec"] - c0["Extension page reads/sec"],
			c1["Extension page writes/sec"] - c0["Extension page writes/sec"]}
		results = append(results, r)
		fmt.Printf("%-16s %-30s %5d ops %8.3f s %8.2f ms/op  bpe base reads %5d ext reads %5d writes %5d  %s  [%s]\n",
			r.Arm, r.Pass, r.Ops, r.Seconds, r.MsPerOp, r.BasePageReads, r.ExtPageReads, r.ExtPageWrites, r.Gets, delayNote())
		return nil
	}
	oneConn := func() error {
		return withConn(ctx, driver, dsn, func(c *sql.Conn) error {
			for _, id := range ids {
				if err := lookup(ctx, c, id); err != nil {
					return fmt.Errorf("lookup %d: %w", id, err)
				}
			}
			return nil
		})
	}
	if err := measure("lookups, one connection, 1st", len(ids), oneConn); err != nil {
		return err
	}
	if err := measure("lookups, one connection, 2nd", len(ids), oneConn); err != nil {
		return err
	}
	err := measure("lookups, a connection each", perConn, func() error {
		for _, id := range ids[:perConn] {
			if err := withConn(ctx, driver, dsn, func(c *sql.Conn) error { return lookup(ctx, c, id) }); err != nil {
				return fmt.Errorf("lookup %d: %w", id, err)
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	err = measure("opens (open, close)", *opens, func() error {
		for i := 0; i < *opens; i++ {
			if err := withConn(ctx, driver, dsn, func(*sql.Conn) error { return nil }); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	scanOnce := func() error {
		return withConn(ctx, driver, dsn, func(c *sql.Conn) error {
			var n, bytes int64
			q := "SELECT count(*), sum(length(pad)) FROM t WHERE id <= ?"
			if err := c.QueryRowContext(ctx, q, scan).Scan(&n, &bytes); err != nil {
				return err
			}
			if n != int64(scan) {
				return fmt.Errorf("the scan counted %d rows, want %d", n, scan)
			}
			return nil
		})
	}
	if err := measure("scan, 1st", scan, scanOnce); err != nil {
		return err
	}
	if err := measure("scan, 2nd", scan, scanOnce); err != nil {
		return err
	}
	return writeJSON(map[string]any{"arm": *arm, "rows": *rows, "queries": *queries, "s3_delay": s3Delay.String(),
		"replica": replica.readerURL(), "extension": ext, "results": results, "counters": bpeCounters()})
}

// extensionState says whether bpe's extension is enabled in this process, and where.
func extensionState() string {
	db, err := sql.Open(sqlitebpe.DriverName, ":memory:")
	if err != nil {
		return "error: " + err.Error()
	}
	defer db.Close()
	var state, path string
	var kb int64
	q := "SELECT state_description, coalesce(path, ''), coalesce(current_size_in_kb, 0) FROM bpe_extension_configuration"
	if err := db.QueryRow(q).Scan(&state, &path, &kb); err != nil {
		return "error: " + err.Error()
	}
	if path == "" {
		return strings.ToLower(state)
	}
	return fmt.Sprintf("%s %s (%d MB, %s)", strings.ToLower(state), path, kb/1024, os.Getenv("BPE_EXTENSION_SHARED"))
}

// benchAll runs every arm in a process of its own, the restart arm after the extension arm on
// the same file, and prints them side by side.
func benchAll(dir string, replica *replicaSpec, client litestream.ReplicaClient) error {
	if err := ensureReplica(dir, replica, client); err != nil {
		return err
	}
	ext := *extFile
	if ext == "" {
		ext = filepath.Join(dir, "bpe-ext.bpe")
	}
	if old, _ := filepath.Glob(ext + "*"); len(old) > 0 {
		for _, f := range old {
			os.Remove(f)
		}
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	shared := "0"
	if *extShared {
		shared = "1"
	}
	arms := strings.Split(*armsFlag, ",")
	all := map[string][]passResult{}
	started := time.Now().UTC()
	for _, a := range arms {
		jf := filepath.Join(dir, "bench-"+a+".json")
		args := append(append([]string{}, os.Args[1:]...), "-mode", "bench", "-arm", a, "-json", jf, "-work", dir)
		cmd := exec.Command(self, args...)
		cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
		for _, kv := range os.Environ() {
			if !strings.HasPrefix(kv, "LITESTREAM_REPLICA_URL=") && !strings.HasPrefix(kv, "BPE_EXTENSION_") {
				cmd.Env = append(cmd.Env, kv)
			}
		}
		if strings.HasPrefix(a, "bpe-ext") {
			cmd.Env = append(cmd.Env, "BPE_EXTENSION_FILE="+ext, "BPE_EXTENSION_SIZE="+*extSize, "BPE_EXTENSION_SHARED="+shared)
		}
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("arm %s: %w", a, err)
		}
		b, err := os.ReadFile(jf)
		if err != nil {
			return err
		}
		var out struct{ Results []passResult }
		if err := json.Unmarshal(b, &out); err != nil {
			return err
		}
		all[a] = out.Results
	}
	fmt.Printf("\n%s, %d rows, %d lookups, %s, %s\n", started.Format("2006-01-02 15:04 UTC"), *rows, *queries, delayNote(), *armsFlag)
	fmt.Printf("seconds (GETs of page data) per pass:\n| pass |")
	for _, a := range arms {
		fmt.Printf(" %s |", a)
	}
	fmt.Printf("\n|---|%s\n", strings.Repeat("---|", len(arms)))
	for i, p := range all[arms[0]] {
		fmt.Printf("| %s (%d) |", p.Pass, p.Ops)
		for _, a := range arms {
			if i < len(all[a]) {
				r := all[a][i]
				if strings.HasPrefix(r.Pass, "opens") {
					fmt.Printf(" %.1f ms/open (%d GETs) |", r.MsPerOp, r.Gets.total())
				} else {
					fmt.Printf(" %.3f (%d) |", r.Seconds, r.Gets.Page)
				}
			}
		}
		fmt.Println()
	}
	return writeJSON(map[string]any{"date": started.Format(time.RFC3339), "rows": *rows, "queries": *queries,
		"s3_delay": s3Delay.String(), "replica": *replicaURL, "arms": all})
}

// hitRatio: a source database replicated while a bpe reader looks up a hot set on one
// long-lived connection (each lookup one read transaction, so the connection moves to the
// newest replicated transaction between them): first with no writes, then with one write
// transaction every -hr-write-every. Reported: bpe's share of page lookups served from its
// pool (1 - pages read from Litestream / page lookups) and SQL Server's hit ratio, per phase.
func hitRatio(dir string, replica *replicaSpec) error {
	ctx := context.Background()
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
	if _, err := waitForReplica(plainDSN(dir), "sqlite3", 0, 120*time.Second); err != nil {
		return err
	}
	hot := lookupIDs(*hrHot, 11)
	var results []phaseResult
	err = withConn(ctx, sqlitebpe.DriverName, bpeDSN(dir), func(c *sql.Conn) error {
		for _, shape := range strings.Split(*hrShapes, ",") {
			if shape != "one" && shape != "each" {
				return fmt.Errorf("-hr-shapes: unknown shape %q (one, each)", shape)
			}
			if err := hitRatioShape(ctx, dir, c, w, shape, hot, &results); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	ok := len(results) > 0
	for i := 0; i+1 < len(results); i += 2 {
		a, b := results[i], results[i+1]
		if a.ServedFromPool > 0 {
			fmt.Printf("hitratio %s: with writes, %.1f %% of the no-write share served from the pool (%d rows, hot set %d, %s)\n",
				a.Shape, 100*b.ServedFromPool/a.ServedFromPool, *rows, *hrHot, delayNote())
		}
		ok = ok && a.Lookups > 0 && b.Lookups > 0 && b.Writes > 0
	}
	if !ok {
		return fmt.Errorf("hitratio: a phase did no lookups or a write phase no writes: %+v", results)
	}
	// A count, not a time: a one-row write changes a few pages (a leaf, its parents, page 1),
	// so across a write phase bpe reads again at most pagesPerWrite pages a write, plus one
	// hot set for a move whose log could not be read. A snapshot that keeps none of its
	// ancestor's pages reads the whole hot set at every write.
	const pagesPerWrite = 16
	for i := 1; i < len(results); i += 2 {
		b := results[i]
		if bound := pagesPerWrite*b.Writes + int64(*hrHot); b.PagesFromBase > bound {
			return fmt.Errorf("hitratio %s: %d pages read again from Litestream over %d writes, more than %d (%d a write and one hot set of %d): new transactions are not keeping the pages they did not change",
				b.Shape, b.PagesFromBase, b.Writes, bound, pagesPerWrite, *hrHot)
		}
	}
	return writeJSON(map[string]any{"rows": *rows, "hot": *hrHot, "s3_delay": s3Delay.String(),
		"replica": replica.readerURL(), "phases": results})
}

type phaseResult struct {
	Shape, Phase                   string
	Seconds                        float64
	Lookups, Writes                int64
	PageLookups, PagesFromBase     int64
	ServedFromPool, BufferHitRatio float64
	Gets                           gets
}

// hitRatioShape runs the two phases (no writes, writes) with one connection shape: `c` for
// every lookup (one), or a new connection per lookup (each). The pool is warmed on `c` first.
func hitRatioShape(ctx context.Context, dir string, c *sql.Conn, w *sql.DB, shape string, hot []int, results *[]phaseResult) error {
	for _, id := range hot {
		if err := lookup(ctx, c, id); err != nil {
			return err
		}
	}
	lookupOnce := func(id int) error {
		if shape == "one" {
			return lookup(ctx, c, id)
		}
		return withConn(ctx, sqlitebpe.DriverName, bpeDSN(dir), func(c *sql.Conn) error { return lookup(ctx, c, id) })
	}
	for _, writes := range []bool{false, true} {
		c0, g0, t0 := bpeCounters(), readProxy.snapshot(), time.Now()
		var nWrites int64
		stop := make(chan struct{})
		var wg sync.WaitGroup
		var werr error
		if writes {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rng := rand.New(rand.NewSource(3))
				tick := time.NewTicker(*hrWriteEvery)
				defer tick.Stop()
				for {
					select {
					case <-stop:
						return
					case <-tick.C:
					}
					if _, err := w.Exec("UPDATE t SET v = v + 1 WHERE id = ?", 1+rng.Intn(*rows)); err != nil {
						werr = err
						return
					}
					nWrites++
				}
			}()
		}
		var n int64
		deadline := t0.Add(*hrSeconds)
		for i := 0; time.Now().Before(deadline); i++ {
			if err := lookupOnce(hot[i%len(hot)]); err != nil {
				close(stop)
				wg.Wait()
				return err
			}
			n++
		}
		close(stop)
		wg.Wait()
		if werr != nil {
			return werr
		}
		c1, g := bpeCounters(), readProxy.snapshot().sub(g0)
		r := phaseResult{Shape: shape, Phase: "no writes", Seconds: time.Since(t0).Seconds(), Lookups: n, Writes: nWrites, Gets: g}
		if writes {
			r.Phase = fmt.Sprintf("1 write / %v", *hrWriteEvery)
		}
		r.PageLookups = c1["Page lookups/sec"] - c0["Page lookups/sec"]
		r.PagesFromBase = c1["Page reads/sec"] - c0["Page reads/sec"]
		if r.PageLookups > 0 {
			r.ServedFromPool = 1 - float64(r.PagesFromBase)/float64(r.PageLookups)
		}
		if base := c1["Buffer cache hit ratio base"] - c0["Buffer cache hit ratio base"]; base > 0 {
			r.BufferHitRatio = float64(c1["Buffer cache hit ratio"]-c0["Buffer cache hit ratio"]) / float64(base)
		}
		*results = append(*results, r)
		fmt.Printf("hitratio %-4s %-16s %5.1f s  lookups %6d  writes %3d  page lookups %7d  from Litestream %6d  served from the pool %.4f  buffer cache hit ratio %.4f  %s  [%s]\n",
			r.Shape, r.Phase, r.Seconds, r.Lookups, r.Writes, r.PageLookups, r.PagesFromBase, r.ServedFromPool, r.BufferHitRatio, r.Gets, delayNote())
	}
	return nil
}
