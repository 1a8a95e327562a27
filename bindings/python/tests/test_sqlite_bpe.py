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


TWO_LIBRARIES = """
import sqlite3, apsw, sqlite_bpe

def stdlib():
    sqlite_bpe.load(sqlite3.connect(":memory:"))
    return sqlite3.connect("file:{db}?vfs=bpe", uri=True, isolation_level=None)

def with_apsw():
    sqlite_bpe.load(apsw.Connection(":memory:"))
    return apsw.Connection("{db}", vfs="bpe")

first, second = {order}
db = first()
try:
    second()
    print("second load accepted")
except Exception as e:
    print("second load refused:", type(e).__name__, e)
# The first library keeps the extension: its pool still serves its connections.
db.execute("CREATE TABLE t(x)")
db.execute("INSERT INTO t VALUES (1)")
print("first library rows", db.execute("SELECT count(*) FROM t").fetchone()[0])
print("cached", db.execute("SELECT count(*) FROM bpe_buffer_descriptors").fetchone()[0])
"""


@pytest.mark.parametrize("order", ["(stdlib, with_apsw)", "(with_apsw, stdlib)"])
def test_a_second_sqlite_library_in_the_process_is_refused_saying_why(tmp_path, order):
    """The stdlib sqlite3 and apsw are two SQLite libraries (apsw's wheel links its own). The
    extension lives in the first that loads it (its VFS, functions, and the routines table all its
    callbacks use); loading it into the second fails at once, saying so (issue 29: the load used
    to return normally, then every `vfs=bpe` open failed with "no such vfs: bpe")."""
    pytest.importorskip("apsw")
    out = run(TWO_LIBRARIES.format(db=f"two-{order[1]}.db", order=order), tmp_path)
    assert "second load refused:" in out, out
    assert "already bound to another SQLite library in this process" in out, out
    assert "load it into one SQLite library per process" in out, out
    assert "first library rows 1" in out, out
    assert int(out.split("cached ")[1].split()[0]) > 0, out


def test_a_forked_child_re_attaches_to_a_shared_extension_from_the_environment(tmp_path):
    """docs/SQLITE.md: a forked child's fresh engine enables the extension the environment names
    again. Shared (the default), the child attaches to the parent's; private
    (BPE_EXTENSION_SHARED=0), the parent's live file is refused and the child runs without one."""
    code = """
import os, sqlite3, sqlite_bpe
sqlite_bpe.load(sqlite3.connect(":memory:"))
db = sqlite3.connect("file:f.db?vfs=bpe", uri=True, isolation_level=None)
print("parent", db.execute("SELECT path, state FROM bpe_extension_configuration").fetchone())
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    os.close(r)
    mine = sqlite3.connect("file:f.db?vfs=bpe", uri=True, isolation_level=None)
    row = mine.execute("SELECT path, state FROM bpe_extension_configuration").fetchone()
    os.write(w, repr(row).encode())
    os._exit(0)
os.close(w)
child = os.read(r, 4096).decode()
os.waitpid(pid, 0)
print("child", child)
"""
    ext = str(tmp_path / "f.bpe")
    env = {
        "BPE_MAX_SERVER_MEMORY_MB": "64",
        "BPE_EXTENSION_FILE": ext,
        "BPE_EXTENSION_SIZE": "256 MB",
    }
    enabled = f"('{ext}', 5)"
    shared = run(code, tmp_path, env=env)
    assert f"parent {enabled}" in shared, shared
    assert f"child {enabled}" in shared, shared
    private = run(code, tmp_path, env={**env, "BPE_EXTENSION_SHARED": "0"})
    assert f"parent {enabled}" in private, private
    assert f"child {enabled}" not in private and "child (None, " in private, private


GUNICORN_APP = """
import json, os, sqlite3, sqlite_bpe

# Each worker loads the extension when gunicorn imports this module in it (no --preload): its
# engine enables the extension the environment names, with nothing said about sharing.
sqlite_bpe.load(sqlite3.connect(":memory:"), default_vfs=True)

def app(environ, start_response):
    db = sqlite3.connect(os.environ["APP_DB"], isolation_level=None)
    total = db.execute("SELECT sum(length(n)) FROM t").fetchone()[0]
    counters = dict(db.execute(
        "SELECT counter_name, cntr_value FROM bpe_performance_counters"))
    path, state, sharing = db.execute(
        "SELECT path, state, sharing FROM bpe_extension_configuration").fetchone()
    db.close()
    body = json.dumps({
        "pid": os.getpid(), "sum": total, "path": path, "state": state, "sharing": sharing,
        "ext_reads": counters["Extension page reads/sec"],
        "others": counters["Extension page reads of other processes' pages/sec"],
    }).encode()
    start_response("200 OK", [("Content-Type", "application/json")])
    return [body]
"""


def test_gunicorn_workers_without_preload_share_one_extension_from_the_file_variable(tmp_path):
    """Issue 27: 4 sync workers, no --preload, only the extension's file (and size) in the
    environment. Every worker enables the same extension, shared, and reads the pages another
    worker put there: one extension for the server, not one per worker (before, the second
    worker to enable it ran with none)."""
    gunicorn = pytest.importorskip("gunicorn")
    import json
    import socket
    import time
    import urllib.request
    from concurrent.futures import ThreadPoolExecutor

    rows = 8000  # ~5 MB of 500-byte rows: far more pages than one scan leaves in doubt
    db = tmp_path / "app.db"
    import sqlite3

    plain = sqlite3.connect(db, isolation_level=None)
    plain.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, n TEXT)")
    plain.execute(
        "WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < ?) "
        "INSERT INTO t SELECT i, printf('%.500c', 'A') FROM c",
        (rows,),
    )
    plain.close()
    (tmp_path / "app.py").write_text(GUNICORN_APP)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ext = str(tmp_path / "server.bpe")
    env = {k: v for k, v in os.environ.items() if not k.startswith("BPE_")}
    env.update(
        APP_DB=str(db),
        BPE_EXTENSION_FILE=ext,
        BPE_EXTENSION_SIZE="256 MB",
        BPE_MAX_SERVER_MEMORY_MB="64",
    )
    server = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", "--workers", "4", "--worker-class", "sync",
         "--bind", f"127.0.0.1:{port}", "--chdir", str(tmp_path), "app:app"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )

    def ask():
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=30) as r:
            return json.loads(r.read())

    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                first = ask()
                break
            except OSError:
                assert server.poll() is None and time.monotonic() < deadline, "gunicorn did not start"
                time.sleep(0.2)
        assert first["sum"] == rows * 500, first
        # The first scan's pages reach the extension off the query path; then every worker
        # scans, concurrently so that the 4 sync workers all take requests, until each has
        # answered and each but the first has read pages another worker wrote.
        time.sleep(1.0)
        seen = {first["pid"]: first}
        while time.monotonic() < deadline:
            with ThreadPoolExecutor(8) as pool:
                for answer in pool.map(lambda _: ask(), range(8)):
                    assert answer["sum"] == rows * 500, answer
                    seen[answer["pid"]] = answer
            others = [a for pid, a in seen.items() if pid != first["pid"]]
            if len(seen) == 4 and all(a["others"] > 0 for a in others):
                break
            time.sleep(0.2)
    finally:
        server.terminate()
        out, _ = server.communicate(timeout=30)
    answers = list(seen.values())
    assert len(seen) == 4, f"only workers {sorted(seen)} answered\n{out}"
    for a in answers:
        assert (a["path"], a["state"], a["sharing"]) == (ext, 5, "shared"), (a, out)
    for a in answers:
        if a["pid"] != first["pid"]:
            assert a["others"] > 0, f"worker {a['pid']} read no page another wrote: {answers}"
