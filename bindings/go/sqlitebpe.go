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
	"fmt"
	"os"
	"path/filepath"
	"runtime"
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

// LoadablePath is the loadable extension: $SQLITE_BPE_LIBRARY, else the workspace's dist build
// (cargo build --profile dist -p sqlite-bpe) beside this package's source.
func LoadablePath() string {
	if p := os.Getenv("SQLITE_BPE_LIBRARY"); p != "" {
		return p
	}
	_, here, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(here), "..", "..", "target", "dist", "libsqlite_bpe.so")
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
			d.err = fmt.Errorf("sqlite-bpe: the loadable extension is missing (%v); build it with `cargo build --profile dist -p sqlite-bpe` or set SQLITE_BPE_LIBRARY", err)
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
