"""The package as a Python user meets it: each scenario runs in a fresh interpreter, because the
extension is process-wide (one buffer pool, one default VFS) and two SQLite libraries (the
standard library's and apsw's) must not share one process's engine."""

import os
import subprocess
import sys
import textwrap

import pytest

import sqlite_bpe

ROWS = 2000


def run(code, tmp_path, env=None):
    """Runs `code` in a new interpreter in tmp_path; returns its stdout; fails on a non-zero exit."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("BPE_")}
    full_env.update(env or {})
    p = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=tmp_path,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, f"exit {p.returncode}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}"
    return p.stdout


FILL = f"""
def fill(db):
    db.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, n TEXT)")
    db.execute("WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < {ROWS}) "
               "INSERT INTO t SELECT i, printf('%.500c', 'A') FROM c")
"""


def test_the_bundled_library_is_stripped_and_small():
    size = os.path.getsize(sqlite_bpe.loadable_path())
    assert size < 5 * 1024 * 1024, f"{size} bytes"


def test_stdlib_sqlite3_reads_through_the_pool_with_a_uri(tmp_path):
    out = run(
        FILL
        + """
import sqlite3, sqlite_bpe
sqlite_bpe.load(sqlite3.connect(":memory:"))
db = sqlite3.connect("file:a.db?vfs=bpe", uri=True, isolation_level=None)
fill(db)
print("sum", db.execute("SELECT sum(length(n)) FROM t").fetchone()[0])
print("cached", db.execute("SELECT count(*) FROM bpe_buffer_descriptors").fetchone()[0])
""",
        tmp_path,
    )
    assert f"sum {ROWS * 500}" in out
    cached = int(out.split("cached ")[1].split()[0])
    assert cached > 0, out


def test_default_vfs_serves_plain_file_names_and_without_it_they_bypass_the_pool(tmp_path):
    code = (
        FILL
        + """
import os, sqlite3, sqlite_bpe
sqlite_bpe.load(sqlite3.connect(":memory:"), default_vfs={flag})
print("env_left", os.environ.get("BPE_DEFAULT_VFS"))
db = sqlite3.connect("{name}", isolation_level=None)
fill(db)
print("sum", db.execute("SELECT sum(length(n)) FROM t").fetchone()[0])
print("cached", db.execute("SELECT count(*) FROM bpe_buffer_descriptors").fetchone()[0])
"""
    )
    on = run(code.format(flag=True, name="on.db"), tmp_path)
    assert f"sum {ROWS * 500}" in on and "env_left None" in on, on
    assert int(on.split("cached ")[1].split()[0]) > 0, on
    off = run(code.format(flag=False, name="off.db"), tmp_path)
    assert f"sum {ROWS * 500}" in off, off
    assert "cached 0" in off, off
    # The switch is read at every load: a process that loaded plainly can switch later.
    late = code.replace(
        "sqlite_bpe.load(sqlite3.connect(\":memory:\"), default_vfs={flag})",
        "sqlite_bpe.load(sqlite3.connect(\":memory:\"))\n"
        "sqlite_bpe.load(sqlite3.connect(\":memory:\"), default_vfs=True)",
    )
    assert late != code
    late = run(late.format(name="late.db"), tmp_path)
    assert int(late.split("cached ")[1].split()[0]) > 0, late


def test_a_bad_default_vfs_setting_fails_the_load_naming_it(tmp_path):
    out = run(
        """
import sqlite3, sqlite_bpe
try:
    sqlite_bpe.load(sqlite3.connect(":memory:"))
except sqlite3.OperationalError as e:
    print("error", e)
""",
        tmp_path,
        env={"BPE_DEFAULT_VFS": "yes"},
    )
    assert "error" in out and "BPE_DEFAULT_VFS" in out, out


def test_apsw_reads_through_the_pool(tmp_path):
    pytest.importorskip("apsw")
    out = run(
        FILL
        + """
import apsw, sqlite_bpe
sqlite_bpe.load(apsw.Connection(":memory:"))
db = apsw.Connection("a.db", vfs="bpe")
fill(db)
print("sum", db.execute("SELECT sum(length(n)) FROM t").fetchone()[0])
print("cached", db.execute("SELECT count(*) FROM bpe_buffer_descriptors").fetchone()[0])
""",
        tmp_path,
    )
    assert f"sum {ROWS * 500}" in out, out
    assert int(out.split("cached ")[1].split()[0]) > 0, out


def test_a_pre_fork_server_loads_once_and_its_workers_read_their_own_pool(tmp_path):
    """gunicorn's pattern: the master loads the extension and may touch the database; workers
    forked from it open their own connections and must read correct rows (each child gets a
    fresh engine: see process.rs)."""
    out = run(
        FILL
        + """
import os, sqlite3, sqlite_bpe
sqlite_bpe.load(sqlite3.connect(":memory:"), default_vfs=True)
db = sqlite3.connect("app.db", isolation_level=None)
fill(db)
db.execute("SELECT sum(length(n)) FROM t").fetchone()
workers = []
for w in range(2):
    pid = os.fork()
    if pid == 0:
        ok = False
        try:
            mine = sqlite3.connect("app.db", isolation_level=None)
            for _ in range(3):
                ok = mine.execute("SELECT sum(length(n)) FROM t").fetchone()[0] == %d
                mine.execute("UPDATE t SET n = n WHERE id = ?", (w + 1,))
        finally:
            os._exit(0 if ok else 1)
    workers.append(pid)
codes = [os.waitpid(p, 0)[1] for p in workers]
print("codes", codes)
print("sum", db.execute("SELECT sum(length(n)) FROM t").fetchone()[0])
print("check", db.execute("PRAGMA integrity_check").fetchone()[0])
"""
        % (ROWS * 500),
        tmp_path,
    )
    assert "codes [0, 0]" in out, out
    assert f"sum {ROWS * 500}" in out and "check ok" in out, out
