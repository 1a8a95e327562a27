"""sqlite-bpe: a buffer pool extension for SQLite, loaded into a Python connection.

    import sqlite3, sqlite_bpe
    boot = sqlite3.connect(":memory:")
    sqlite_bpe.load(boot)                       # registers the `bpe` VFS for the process
    db = sqlite3.connect("file:app.db?vfs=bpe", uri=True)

or, for code that cannot pass URIs (ORMs), make `bpe` the process's default VFS:

    sqlite_bpe.load(boot, default_vfs=True)
    db = sqlite3.connect("app.db")              # served by the buffer pool

Works with the standard library's sqlite3 (built with loadable-extension support, as Debian's
is) and with apsw. The extension is process-wide: one buffer pool for every connection.
"""

import os
from pathlib import Path

__all__ = ["load", "loadable_path", "ENTRY_POINT"]

#: The extension's entry point (SQLite also derives it from the library's file name).
ENTRY_POINT = "sqlite3_sqlitebpe_init"


def loadable_path() -> str:
    """The path of the bundled loadable extension (for `.load` or `load_extension`)."""
    path = Path(__file__).resolve().parent / "libsqlite_bpe.so"
    if not path.exists():
        raise FileNotFoundError(f"the bundled extension is missing: {path}")
    return str(path)


def load(conn, default_vfs: bool = False) -> None:
    """Loads sqlite-bpe into `conn` (a `sqlite3.Connection` or an `apsw.Connection`).

    The first load in a process creates the buffer pool and registers the `bpe` VFS, reading the
    BPE_* environment variables (max server memory, an extension file); later loads only add the
    SQL functions and virtual tables to that connection. With `default_vfs=True`, `bpe` becomes
    the process's default VFS: every database opened afterwards by a plain file name goes through
    the buffer pool.
    """
    previous = os.environ.get("BPE_DEFAULT_VFS")
    if default_vfs:
        os.environ["BPE_DEFAULT_VFS"] = "1"
    try:
        if type(conn).__module__.split(".")[0] == "apsw":
            conn.enable_load_extension(True)
            try:
                conn.load_extension(loadable_path(), ENTRY_POINT)
            finally:
                conn.enable_load_extension(False)
        else:
            if not hasattr(conn, "enable_load_extension"):
                raise RuntimeError(
                    "this Python's sqlite3 was built without loadable extensions "
                    "(use Debian's python3, or apsw)"
                )
            conn.enable_load_extension(True)
            try:
                conn.load_extension(loadable_path())
            finally:
                conn.enable_load_extension(False)
    finally:
        if default_vfs:
            if previous is None:
                del os.environ["BPE_DEFAULT_VFS"]
            else:
                os.environ["BPE_DEFAULT_VFS"] = previous
