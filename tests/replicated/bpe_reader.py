"""The bpe readers: a process of their own that loads libsqlite_bpe.so (the driver, which writes,
never does) and answers one JSON line per request on stdin:

  {"op": "open", "uri": ...}      the long-lived connection (kept open across rounds)
  {"op": "read", "uri": ..., "long": true, "fresh": true, "path": ...}
        reads every row through the long-lived connection, then through a fresh connection
        opened for this read (same URI), and answers each reader's versions (list by id order,
        -1 for a value the writer never made) and its counter deltas (process-wide counters, but
        the reads are sequential, so each delta is that reader's), and with "path" the
        wal-index header (mxFrame, nBackfill, salt1, iChange) before and after each read
  {"op": "counters"}             the counters now
  {"op": "quit"}

Usage: python3 bpe_reader.py /path/to/libsqlite_bpe.so
"""

import json
import sqlite3
import sys
import time

from common import COUNTERS, parse, wal_index

LIB = sys.argv[1]

boot = sqlite3.connect(":memory:")
boot.enable_load_extension(True)
boot.load_extension(LIB)
boot.enable_load_extension(False)
QUERY = "SELECT counter_name, cntr_value FROM bpe_performance_counters WHERE counter_name IN (%s)" % (
    ",".join("?" * len(COUNTERS))
)


def counters():
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


long_lived = None
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
