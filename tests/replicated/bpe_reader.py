"""The bpe readers: a process of their own that loads libsqlite_bpe.so (the driver, which writes,
never does) and answers one JSON line per request on stdin:

  {"op": "open", "uri": ...}      the long-lived connection (kept open across rounds)
  {"op": "read", "uri": ..., "long": true, "fresh": true, "path": ...}
        reads every row through the long-lived connection, then through a fresh connection
        opened for this read (same URI), and answers each reader's versions (list by id order,
        -1 for a value the writer never made) and its counter deltas (process-wide counters, but
        the reads are sequential, so each delta is that reader's), and with "path" the
        wal-index header (mxFrame, nBackfill, salt1, iChange) before and after each read
  {"op": "multi", "reads": [{"name": ..., "uri": ..., "long": bool}, ...]}
        (the litestream-vfs engine) each read in turn, every one in one read transaction:
        `SELECT round FROM meta`, every row, `PRAGMA litestream_txid`; "long" reads go through a
        long-lived connection kept per name, the others through a connection opened for the
        read. Answers {name: {"versions", "meta", "txid", "ids_ok", "delta", "ms", "t0"}}
        ("t0": time.monotonic() at the read's start, "txid" None where the pragma answers no
        row, e.g. a connection whose VFS does not pass SQLITE_FCNTL_PRAGMA on)
  {"op": "hammer", "uri": ..., "seconds": S}
        (the primary phase) reads the `acks` table for S seconds, in turn through the long-lived
        connection and through a connection opened for the read (one in ten), and answers the
        reads made, the errors met (message -> count) and the counter deltas
  {"op": "ids", "uri": ...}      {"ids": every id of the `acks` table}, through a connection opened
                                 for it
  {"op": "counters"}             the counters now
  {"op": "quit"}

Usage: python3 bpe_reader.py /path/to/libsqlite_bpe.so [--litestream-vfs /path/to/litestream-vfs.so]
       python3 bpe_reader.py --plain        (a plain SQLite reader: bpe is not loaded, no counters)

With --litestream-vfs the Litestream VFS (the litestream-vfs wheel's library) is loaded first,
then bpe. It reads its replica from LITESTREAM_REPLICA_URL in the environment this process was
STARTED with (a Go library: os.environ changes made after the start are not seen). Its
auto-extension (0.5.17) fails the open of every connection whose main file is not its own
("automatic extension loading failed": a `void` function registered as one returning int), so
this process cancels it (sqlite3_reset_auto_extension, through ctypes, before bpe is loaded):
its SQL functions litestream_txid() etc. are then missing, its PRAGMAs remain.
"""

import json
import sqlite3
import sys
import time

from common import COUNTERS, parse, wal_index

LIB = sys.argv[1]
PLAIN = LIB == "--plain"
LITESTREAM_VFS = sys.argv[sys.argv.index("--litestream-vfs") + 1] if "--litestream-vfs" in sys.argv else None


def reset_auto_extensions():
    """sqlite3_reset_auto_extension() of the SQLite library Python's sqlite3 runs on."""
    import ctypes
    import _sqlite3

    candidates = []
    with open("/proc/self/maps") as f:
        for line in f:
            path = line.split()[-1]
            if "/libsqlite3" in path and path not in candidates:
                candidates.append(path)
    candidates.append(_sqlite3.__file__)  # SQLite linked into the module itself
    for path in candidates:
        try:
            fn = ctypes.CDLL(path).sqlite3_reset_auto_extension
        except (OSError, AttributeError):
            continue
        fn.restype = None
        fn()
        return path
    raise RuntimeError("cannot find sqlite3_reset_auto_extension in " + ", ".join(candidates))


boot = sqlite3.connect(":memory:")
boot.enable_load_extension(True)
if LITESTREAM_VFS:
    boot.load_extension(LITESTREAM_VFS)  # entry point from the file name: sqlite3_litestreamvfs_init
    reset_auto_extensions()
if not PLAIN:
    boot.load_extension(LIB)
boot.enable_load_extension(False)
QUERY = "SELECT counter_name, cntr_value FROM bpe_performance_counters WHERE counter_name IN (%s)" % (
    ",".join("?" * len(COUNTERS))
)


def counters():
    if PLAIN:
        return {}
    return dict(boot.execute(QUERY, COUNTERS).fetchall())


def connect(uri):
    c = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
    c.execute("PRAGMA busy_timeout = 10000")
    return c


def scan(conn, path):
    wal_before = wal_index(path) if path else None
    before = counters()
    t0 = time.perf_counter()
    rows = conn.execute("SELECT id, v FROM t ORDER BY id").fetchall()
    ms = (time.perf_counter() - t0) * 1000
    after = counters()
    versions = [parse(i, v) for i, v in rows]
    ids = [i for i, _ in rows]
    return {
        "versions": versions,
        "ids_ok": ids == list(range(1, len(ids) + 1)),
        "delta": {k: after.get(k, 0) - before.get(k, 0) for k in COUNTERS},
        "ms": ms,
        "wal_index": [wal_before, wal_index(path) if path else None],
    }


def scan_meta(conn):
    """One read transaction: the meta row's round, every row, the Litestream VFS's TXID."""
    before = counters()
    t0 = time.monotonic()
    conn.execute("BEGIN")
    try:
        meta = conn.execute("SELECT round FROM meta WHERE k = 1").fetchone()
        rows = conn.execute("SELECT id, v FROM t ORDER BY id").fetchall()
        txid = conn.execute("PRAGMA litestream_txid").fetchone()
    finally:
        conn.execute("COMMIT")
    ms = (time.monotonic() - t0) * 1000
    after = counters()
    ids = [i for i, _ in rows]
    return {
        "versions": [parse(i, v) for i, v in rows],
        "meta": meta[0] if meta else None,
        "txid": txid[0] if txid else None,
        "ids_ok": ids == list(range(1, len(ids) + 1)),
        "delta": {k: after.get(k, 0) - before.get(k, 0) for k in COUNTERS},
        "ms": ms,
        "t0": t0,
    }


def hammer(uri, seconds):
    """Reads `acks` for `seconds` (see the module's doc)."""
    before = counters()
    errors = {}
    reads = 0
    conn = connect(uri)
    end = time.monotonic() + seconds
    try:
        while time.monotonic() < end:
            fresh = reads % 10 == 9
            c = connect(uri) if fresh else conn
            try:
                c.execute("SELECT count(*), max(id) FROM acks").fetchone()
                reads += 1
            except sqlite3.Error as e:
                key = f"{type(e).__name__}: {e}"
                errors[key] = errors.get(key, 0) + 1
            finally:
                if fresh:
                    c.close()
    finally:
        conn.close()
    after = counters()
    return {"reads": reads, "errors": errors, "delta": {k: after.get(k, 0) - before.get(k, 0) for k in COUNTERS}}


long_lived = None
named = {}  # name -> the long-lived connection of the "multi" reads
for line in sys.stdin:
    req = json.loads(line)
    try:
        op = req["op"]
        if op == "open":
            long_lived = connect(req["uri"])
            out = {"ok": True}
        elif op == "read":
            out = {}
            if req.get("long", True):
                out["long"] = scan(long_lived, req.get("path"))
            if req.get("fresh", True):
                fresh = connect(req["uri"])
                try:
                    out["fresh"] = scan(fresh, req.get("path"))
                finally:
                    fresh.close()
        elif op == "multi":
            out = {}
            for r in req["reads"]:
                if r.get("long"):
                    if r["name"] not in named:
                        named[r["name"]] = connect(r["uri"])
                    out[r["name"]] = scan_meta(named[r["name"]])
                else:
                    c = connect(r["uri"])
                    try:
                        out[r["name"]] = scan_meta(c)
                    finally:
                        c.close()
        elif op == "ids":
            c = connect(req["uri"])
            try:
                out = {"ids": [r[0] for r in c.execute("SELECT id FROM acks ORDER BY id")]}
            finally:
                c.close()
        elif op == "hammer":
            out = hammer(req["uri"], req["seconds"])
        elif op == "counters":
            out = counters()
        elif op == "quit":
            break
        else:
            out = {"error": f"unknown op {op}"}
    except Exception as e:  # answered, the driver fails the round
        out = {"error": f"{type(e).__name__}: {e}"}
    sys.stdout.write(json.dumps(out) + "\n")
    sys.stdout.flush()
