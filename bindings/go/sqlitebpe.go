// Package sqlitebpe registers the database/sql driver "sqlite3_bpe": mattn/go-sqlite3 with the
// sqlite-bpe extension loaded into the process before the first connection opens, so DSNs can name
// the bpe VFS (file:app.db?vfs=bpe) with no boot connection in the application.
//
//	import _ "sqlitebpe"
//	db, err := sql.Open("sqlite3_bpe", "file:app.db?vfs=bpe")
//
// With DefaultVFS set before the first open (or BPE_DEFAULT_VFS=1 in the environment), bpe
// becomes the process's default VFS and plain file names go through the buffer pool too.
package sqlitebpe

import (
	"database/sql"
	"database/sql/driver"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"

	sqlite3 "github.com/mattn/go-sqlite3"
)

// DriverName is the name the driver registers under.
const DriverName = "sqlite3_bpe"

// EntryPoint is the extension's entry point.
const EntryPoint = "sqlite3_sqlitebpe_init"

// DefaultVFS makes bpe the process's default VFS when the extension loads (before the first
// open through this driver).
var DefaultVFS = false

// LoadablePath is the loadable extension: $SQLITE_BPE_LIBRARY, else the workspace's build beside
// this package's source, where cargo put it: in $CARGO_TARGET_DIR (relative to the workspace, where
// cargo is run) when that is set, else in target/ or the target directory `cargo metadata` names;
// dist/ (cargo build --profile dist -p sqlite-bpe) before release/ (cargo build --release). When
// none exists it returns the first place looked in.
func LoadablePath() string {
	candidates := loadableCandidates()
	for _, p := range candidates {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	return candidates[0]
}

// loadableCandidates lists the places LoadablePath looks in, in order.
func loadableCandidates() []string {
	if p := os.Getenv("SQLITE_BPE_LIBRARY"); p != "" {
		return []string{p}
	}
	_, here, _, _ := runtime.Caller(0)
	workspace := filepath.Join(filepath.Dir(here), "..", "..")
	var dirs []string
	if t := os.Getenv("CARGO_TARGET_DIR"); t != "" {
		if !filepath.IsAbs(t) {
			t = filepath.Join(workspace, t)
		}
		dirs = []string{t}
	} else {
		dirs = []string{filepath.Join(workspace, "target")}
		if t := cargoTargetDir(workspace); t != "" && t != dirs[0] {
			dirs = append(dirs, t)
		}
	}
	var out []string
	for _, d := range dirs {
		for _, profile := range []string{"dist", "release"} {
			out = append(out, filepath.Join(d, profile, "libsqlite_bpe.so"))
		}
	}
	return out
}

// cargoTargetDir is `cargo metadata`'s target_directory for the workspace ("" without cargo or a
// workspace).
func cargoTargetDir(workspace string) string {
	if _, err := os.Stat(filepath.Join(workspace, "Cargo.toml")); err != nil {
		return ""
	}
	cmd := exec.Command("cargo", "metadata", "--format-version", "1", "--no-deps")
	cmd.Dir = workspace
	out, err := cmd.Output()
	if err != nil {
		return ""
	}
	var meta struct {
		TargetDirectory string `json:"target_directory"`
	}
	if json.Unmarshal(out, &meta) != nil {
		return ""
	}
	return meta.TargetDirectory
}

type bpeDriver struct {
	inner sqlite3.SQLiteDriver
	once  sync.Once
	err   error
}

// load brings the extension into the process once: through a throwaway in-memory connection,
// since a DSN naming vfs=bpe cannot open before the VFS exists.
func (d *bpeDriver) load() error {
	d.once.Do(func() {
		path := LoadablePath()
		if _, err := os.Stat(path); err != nil {
			d.err = fmt.Errorf("sqlite-bpe: the loadable extension is missing (looked in %s); build it with `cargo build --profile dist -p sqlite-bpe` in the checkout or set SQLITE_BPE_LIBRARY", strings.Join(loadableCandidates(), ", "))
			return
		}
		if DefaultVFS {
			if prev, had := os.LookupEnv("BPE_DEFAULT_VFS"); had {
				defer os.Setenv("BPE_DEFAULT_VFS", prev)
			} else {
				defer os.Unsetenv("BPE_DEFAULT_VFS")
			}
			os.Setenv("BPE_DEFAULT_VFS", "1")
		}
		boot := &sqlite3.SQLiteDriver{Extensions: []string{path}}
		c, err := boot.Open(":memory:")
		if err != nil {
			d.err = fmt.Errorf("sqlite-bpe: loading %s: %w", path, err)
			return
		}
		d.err = c.Close()
	})
	return d.err
}

func (d *bpeDriver) Open(dsn string) (driver.Conn, error) {
	if err := d.load(); err != nil {
		return nil, err
	}
	// Every later connection gets the SQL functions and tables from the extension's
	// auto-extension; it is not loaded again.
	return d.inner.Open(dsn)
}

func init() {
	sql.Register(DriverName, &bpeDriver{})
}
