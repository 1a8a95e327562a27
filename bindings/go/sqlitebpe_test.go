package sqlitebpe

import (
	"database/sql"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

const rows = 2000

func fill(t *testing.T, db *sql.DB) {
	t.Helper()
	for _, q := range []string{
		"CREATE TABLE t(id INTEGER PRIMARY KEY, n TEXT)",
		"WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < 2000) INSERT INTO t SELECT i, printf('%.500c', 'A') FROM c",
	} {
		if _, err := db.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
}

func scalar(t *testing.T, db *sql.DB, q string) int64 {
	t.Helper()
	var v int64
	if err := db.QueryRow(q).Scan(&v); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return v
}

// A DSN naming the bpe VFS opens on the first try, with no boot connection in the test, and its
// pages are served by the buffer pool; many goroutines share the pool through a connection pool.
func TestDSNWithVfsBpeOpensWithoutABootConnection(t *testing.T) {
	dsn := "file:" + filepath.Join(t.TempDir(), "a.db") + "?vfs=bpe&_journal_mode=WAL"
	db, err := sql.Open(DriverName, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	fill(t, db)
	if got := scalar(t, db, "SELECT sum(length(n)) FROM t"); got != rows*500 {
		t.Fatalf("sum %d", got)
	}
	if cached := scalar(t, db, "SELECT count(*) FROM bpe_buffer_descriptors"); cached == 0 {
		t.Fatal("no page of the database is in the buffer pool")
	}
	db.SetMaxOpenConns(8)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < 50; i++ {
				var n string
				if err := db.QueryRow("SELECT n FROM t WHERE id = ?", 1+(g*50+i)%rows).Scan(&n); err != nil {
					errs <- err
					return
				}
				if len(n) != 500 {
					errs <- err
					return
				}
			}
		}(g)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// A missing library is an error that says what to do, not a panic or "no such vfs".
func TestAMissingLibraryIsAClearError(t *testing.T) {
	d := &bpeDriver{}
	t.Setenv("SQLITE_BPE_LIBRARY", filepath.Join(t.TempDir(), "nope.so"))
	_, err := d.Open(":memory:")
	if err == nil || !strings.Contains(err.Error(), "loadable extension is missing") {
		t.Fatalf("got %v", err)
	}
}

// DefaultVFS (in a process of its own: it changes the process's default VFS) makes a plain file
// name go through the buffer pool.
func TestDefaultVFSServesPlainFileNames(t *testing.T) {
	if os.Getenv("SQLITEBPE_HELPER") == "default-vfs" {
		DefaultVFS = true
		db, err := sql.Open(DriverName, filepath.Join(os.Getenv("SQLITEBPE_DIR"), "plain.db"))
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		fill(t, db)
		if cached := scalar(t, db, "SELECT count(*) FROM bpe_buffer_descriptors"); cached == 0 {
			t.Fatal("a plain file name bypassed the buffer pool")
		}
		if _, set := os.LookupEnv("BPE_DEFAULT_VFS"); set {
			t.Fatal("BPE_DEFAULT_VFS was left set")
		}
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestDefaultVFSServesPlainFileNames$", "-test.v")
	cmd.Env = append(os.Environ(), "SQLITEBPE_HELPER=default-vfs", "SQLITEBPE_DIR="+t.TempDir())
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS") {
		t.Fatalf("helper failed: %v\n%s", err, out)
	}
}

// The library is found where cargo put it: CARGO_TARGET_DIR's dist/ build, else its release/
// build; without either, the error names the places looked in.
func TestLoadablePathFollowsCargoTargetDir(t *testing.T) {
	t.Setenv("SQLITE_BPE_LIBRARY", "")
	dir := t.TempDir()
	t.Setenv("CARGO_TARGET_DIR", dir)
	place := func(profile string) string {
		p := filepath.Join(dir, profile, "libsqlite_bpe.so")
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	_, err := (&bpeDriver{}).Open(":memory:")
	if err == nil || !strings.Contains(err.Error(), filepath.Join(dir, "dist", "libsqlite_bpe.so")) {
		t.Fatalf("without a build: %v", err)
	}
	release := place("release")
	if got := LoadablePath(); got != release {
		t.Fatalf("with a release build: %s, want %s", got, release)
	}
	dist := place("dist")
	if got := LoadablePath(); got != dist {
		t.Fatalf("with a dist build too: %s, want %s", got, dist)
	}
}
