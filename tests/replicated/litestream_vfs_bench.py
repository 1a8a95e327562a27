"""Point lookups through Litestream's read-replica VFS, alone and with bpe's tiers over it.

A database of --db-mb MB (bigger than the Litestream VFS's 10 MB per-connection page cache) is
written once, replicated once to a file:// replica (`litestream replicate -once`; nothing
replicates afterwards, so the replica stands still), and read through
  litestream   file:NAME?vfs=litestream
  bpe          file:NAME?vfs=bpe&bpe_base=litestream   (bpe's RAM/SSD tiers over the same VFS)
with --queries random point lookups by primary key (one fixed list), in two modes:
  fresh        one connection per query (opened, queried, closed: short-lived, as web apps do)
  one          every query through one connection
Each (arm, mode) runs in a process of its own (so bpe's process-wide pool and the VFS start
empty): a cold pass, then a warm pass of the same list in the same process ("one": the same
connection). Every answer is checked (k = 7 * id + 1, a 200-byte v). Prints a table (ratio: the
litestream arm's seconds over this arm's, same mode and pass: > 1 is faster than Litestream
alone) and writes --json.

The Litestream VFS reads the replica named by LITESTREAM_REPLICA_URL in the environment the
process STARTS with (each worker is started with it); its library comes from the litestream-vfs
wheel (--litestream-vfs, else the venv beside --litestream, as tests/replicated/run.sh installs
it). bpe's settings come from the environment as usual (BPE_MAX_SERVER_MEMORY_MB, default 128:
the whole database fits; BPE_EXTENSION_FILE / BPE_EXTENSION_SIZE for the SSD tier, off by
default); BPE_DEFAULT_VFS is removed from the workers' environment.

  python3 tests/replicated/litestream_vfs_bench.py --lib target/release/libsqlite_bpe.so \\
      --litestream ~/.cache/sqlite-bpe/replicated-venv/bin/litestream \\
      [--replica-dir /mnt/slow] [--db-mb 60] [--queries 2000] [--bpe auto|on|off] [--json out.json]

--replica-dir puts the replica under that directory (in a subdirectory this script owns and
rewrites, litestream-vfs-bench-replica), e.g. on a throttled volume; --reuse keeps a replica made
by an earlier run with the same --db-mb and --seed.
"""

import argparse
import json
import os
import random
import shutil
import sqlite3
import subprocess
import sys
import time

ROW_V_BYTES = 200
BYTES_PER_ROW = 216  # measured: 260,000 rows of (id, k, randomblob(200)) make 56.2 MB
COUNTERS = (
    "Buffer cache hit ratio",
    "Buffer cache hit ratio base",
    "Page reads/sec",
    "Extension page reads/sec",
)


def log(*a):
    print(*a, flush=True)


# ---------------------------------------------------------------- the worker (one arm, one mode)


def reset_auto_extensions():
    """The Litestream VFS's auto-extension (0.5.17) fails the open of every connection whose main
    file is not its own (a `void` function registered as one returning int): cancel it, through
    the SQLite library Python's sqlite3 runs on. Its SQL functions go; its PRAGMAs stay."""
    import ctypes
    import _sqlite3

    paths = []
    with open("/proc/self/maps") as f:
        for line in f:
            p = line.split()[-1]
            if "/libsqlite3" in p and p not in paths:
                paths.append(p)
    paths.append(_sqlite3.__file__)
    for p in paths:
        try:
            fn = ctypes.CDLL(p).sqlite3_reset_auto_extension
        except (OSError, AttributeError):
            continue
        fn.restype = None
        fn()
        return
    raise RuntimeError("no sqlite3_reset_auto_extension in " + ", ".join(paths))


def worker(spec):
    boot = sqlite3.connect(":memory:")
    boot.enable_load_extension(True)
    boot.load_extension(spec["litestream_vfs"])
    reset_auto_extensions()
    if spec["arm"] == "bpe":
        boot.load_extension(spec["lib"])
    boot.enable_load_extension(False)

    def counters():
        if spec["arm"] != "bpe":
            return {}
        q = "SELECT counter_name, cntr_value FROM bpe_performance_counters WHERE counter_name IN (%s)" % ",".join(
            "?" * len(COUNTERS)
        )
        return dict(boot.execute(q, COUNTERS).fetchall())

    uri, ids = spec["uri"], spec["ids"]
    bad = 0

    def check(i, row):
        nonlocal bad
        if row is None or row[0] != 7 * i + 1 or len(row[1]) != ROW_V_BYTES:
            bad += 1

    passes = []
    conn = None
    for name in ("cold", "warm"):
        before = counters()
        t0 = time.perf_counter()
        open_s = 0.0
        if spec["mode"] == "fresh":
            for i in ids:
                t1 = time.perf_counter()
                c = sqlite3.connect(uri, uri=True, isolation_level=None)  # the VFS opens its file here
                open_s += time.perf_counter() - t1
                check(i, c.execute("SELECT k, v FROM t WHERE id = ?", (i,)).fetchone())
                c.close()
        else:
            if conn is None:
                conn = sqlite3.connect(uri, uri=True, isolation_level=None)
                conn.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchall()  # opens the VFS's index
                open_s = time.perf_counter() - t0
            for i in ids:
                check(i, conn.execute("SELECT k, v FROM t WHERE id = ?", (i,)).fetchone())
        s = time.perf_counter() - t0
        after = counters()
        p = {"pass": name, "seconds": round(s, 4), "qps": round(len(ids) / s, 1), "open_s": round(open_s, 4)}
        if after:
            d = {k: after.get(k, 0) - before.get(k, 0) for k in COUNTERS}
            p["bpe"] = {
                "lookups": d["Buffer cache hit ratio base"],
                "l1_hits": d["Buffer cache hit ratio"],
                "l2_hits": d["Extension page reads/sec"],
                "file_reads": d["Page reads/sec"],
            }
        passes.append(p)
    txid = None
    try:
        c = conn or sqlite3.connect(uri, uri=True)
        r = c.execute("PRAGMA litestream_txid").fetchone()
        txid = r[0] if r else None
    except sqlite3.Error:
        pass
    return {"passes": passes, "bad_answers": bad, "txid": txid}


# ---------------------------------------------------------------- the driver


def find_litestream_vfs(args):
    if args.litestream_vfs:
        return os.path.abspath(args.litestream_vfs)
    ls = shutil.which(args.litestream) or args.litestream
    py = os.path.join(os.path.dirname(os.path.abspath(ls)), "python")
    if os.path.exists(py):
        r = subprocess.run([py, "-c", "import litestream_vfs; print(litestream_vfs.loadable_path())"],
                           capture_output=True, text=True)
        if r.returncode == 0 and r.stdout.strip():
            return r.stdout.strip()
    sys.exit("no Litestream VFS library: pass --litestream-vfs (tests/replicated/run.sh installs litestream-vfs "
             "into ~/.cache/sqlite-bpe/replicated-venv)")


def build(args, work, replica):
    """The database and its replica; returns the number of rows."""
    rows = args.db_mb * 2**20 // BYTES_PER_ROW
    marker = os.path.join(work, "bench-db.json")
    want = {"rows": rows, "seed": args.seed, "replica": replica}
    if args.reuse and os.path.exists(marker) and os.path.isdir(os.path.join(replica, "ltx")):
        with open(marker) as f:
            if json.load(f) == want:
                log(f"reusing the replica {replica} ({rows} rows)")
                return rows
    db = os.path.join(work, "src.db")
    for p in (db, db + "-wal", db + "-shm", marker):
        if os.path.exists(p):
            os.remove(p)
    shutil.rmtree(replica, ignore_errors=True)
    # Litestream's local state beside the database: left over, it continues the old TXIDs.
    shutil.rmtree(os.path.join(work, ".src.db-litestream"), ignore_errors=True)
    t0 = time.monotonic()
    c = sqlite3.connect(db, isolation_level=None)
    c.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, k INTEGER NOT NULL, v BLOB NOT NULL)")
    c.execute("BEGIN")
    c.execute(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?) "
        f"INSERT INTO t SELECT i, 7 * i + 1, randomblob({ROW_V_BYTES}) FROM n",
        (rows,),
    )
    c.execute("COMMIT")
    assert c.execute("PRAGMA journal_mode = WAL").fetchone()[0] == "wal"  # Litestream needs WAL
    pages, page_size = c.execute("PRAGMA page_count").fetchone()[0], c.execute("PRAGMA page_size").fetchone()[0]
    c.close()
    cfg = os.path.join(work, "litestream.yml")
    with open(cfg, "w") as f:
        f.write(f"dbs:\n  - path: {db}\n    replica:\n      type: file\n      path: {replica}\n")
    r = subprocess.run([args.litestream, "replicate", "-once", "-config", cfg], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"litestream replicate -once failed: {r.stdout}{r.stderr}")
    size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(replica) for f in fs)
    log(f"database {db}: {rows} rows, {pages} pages of {page_size} B ({pages * page_size / 2**20:.1f} MiB); "
        f"replica {replica}: {size / 2**20:.1f} MiB ({time.monotonic() - t0:.1f} s)")
    with open(marker, "w") as f:
        json.dump(want, f)
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--lib", default="target/release/libsqlite_bpe.so")
    ap.add_argument("--litestream", default="litestream")
    ap.add_argument("--litestream-vfs", help="litestream-vfs.so (default: the litestream_vfs package beside --litestream)")
    ap.add_argument("--work", default="/tmp/litestream-vfs-bench")
    ap.add_argument("--replica-dir", help="put the replica under this directory (another file system)")
    ap.add_argument("--reuse", action="store_true", help="keep an earlier run's replica (same --db-mb, --seed)")
    ap.add_argument("--db-mb", type=int, default=60)
    ap.add_argument("--queries", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=24)
    ap.add_argument("--modes", default="fresh,one")
    ap.add_argument("--bpe", choices=("auto", "on", "off"), default="auto",
                    help="the bpe arm: on, off, or on when the library knows bpe_base (auto)")
    ap.add_argument("--base-via", choices=("uri", "env"), default="uri",
                    help="name the base VFS in the URI (bpe_base=litestream) or in BPE_BASE_VFS")
    ap.add_argument("--uri-params", default="", help="more URI parameters for both arms, e.g. cache_size=104857600")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    if args.worker:
        with open(args.worker) as f:
            spec = json.load(f)
        json.dump(worker(spec), sys.stdout)
        return

    work = os.path.abspath(args.work)
    os.makedirs(work, exist_ok=True)
    lib = os.path.abspath(args.lib)
    lsvfs = find_litestream_vfs(args)
    if args.replica_dir:
        replica = os.path.join(os.path.abspath(args.replica_dir), "litestream-vfs-bench-replica")
    else:
        replica = os.path.join(work, "replica")
    bpe = args.bpe == "on" or (args.bpe == "auto" and os.path.exists(lib) and b"bpe_base" in open(lib, "rb").read())
    rows = build(args, work, replica)
    rng = random.Random(args.seed)
    ids = [rng.randrange(1, rows + 1) for _ in range(args.queries)]
    name = os.path.join(work, "replica.db")  # never created: the VFS reads LITESTREAM_REPLICA_URL's replica
    extra = "&" + args.uri_params if args.uri_params else ""
    arms = [("litestream", f"file:{name}?vfs=litestream{extra}", {})]
    if bpe:
        if args.base_via == "env":
            arms.append(("bpe", f"file:{name}?vfs=bpe{extra}", {"BPE_BASE_VFS": "litestream"}))
        else:
            arms.append(("bpe", f"file:{name}?vfs=bpe&bpe_base=litestream{extra}", {}))
    else:
        log("the bpe arm is off (--bpe off, or the library does not know bpe_base): Litestream alone")
    env0 = dict(os.environ)
    env0.pop("BPE_DEFAULT_VFS", None)
    env0["LITESTREAM_REPLICA_URL"] = "file://" + replica
    env0["PYTHONDONTWRITEBYTECODE"] = "1"
    results = []
    failed = False
    for mode in [m for m in args.modes.split(",") if m]:
        for arm, uri, env_extra in arms:
            spec = {"arm": arm, "mode": mode, "uri": uri, "ids": ids, "lib": lib, "litestream_vfs": lsvfs}
            spec_path = os.path.join(work, f"spec-{arm}-{mode}.json")
            with open(spec_path, "w") as f:
                json.dump(spec, f)
            env = dict(env0, LITESTREAM_LOG_FILE=os.path.join(work, f"vfs-{arm}-{mode}.log"), **env_extra)
            r = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", spec_path],
                               capture_output=True, text=True, env=env)
            if r.returncode != 0:
                log(f"{arm} {mode}: the worker failed (exit {r.returncode}):\n{r.stderr[-3000:]}")
                failed = True
                continue
            out = json.loads(r.stdout)
            if out["bad_answers"]:
                log(f"{arm} {mode}: {out['bad_answers']} wrong answers")
                failed = True
            if arm == "bpe" and not out["passes"][0].get("bpe", {}).get("lookups"):
                log(f"bpe {mode}: no bpe page lookups (not on vfs=bpe?)")
                failed = True
            for p in out["passes"]:
                results.append({"arm": arm, "mode": mode, **p, "txid": out["txid"]})
    # ratio: the litestream arm's seconds over this row's (same mode and pass)
    base = {(r["mode"], r["pass"]): r["seconds"] for r in results if r["arm"] == "litestream"}
    log(f"\n{args.queries} point lookups, {rows} rows ({args.db_mb} MB), replica {replica}")
    log(f"{'arm':<11} {'mode':<6} {'pass':<5} {'seconds':>9} {'queries/s':>10} {'ratio':>7} {'opening':>8}  "
        "bpe (lookups, L1 hits, file reads)")
    for r in results:
        b = base.get((r["mode"], r["pass"]))
        r["ratio"] = round(b / r["seconds"], 2) if b and r["seconds"] else None
        extra_b = ""
        if "bpe" in r:
            extra_b = f"  {r['bpe']['lookups']}, {r['bpe']['l1_hits']}, {r['bpe']['file_reads']}"
        log(f"{r['arm']:<11} {r['mode']:<6} {r['pass']:<5} {r['seconds']:>9.3f} {r['qps']:>10.1f} {r['ratio']!s:>7} "
            f"{r['open_s']:>8.3f}{extra_b}")
    log("(opening: seconds of the pass spent in sqlite3.connect, where the Litestream VFS builds its page index)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "rows": rows,
                    "db_mb": args.db_mb,
                    "queries": args.queries,
                    "replica": replica,
                    "litestream_vfs": lsvfs,
                    "lib": lib if bpe else None,
                    "bpe_env": {k: v for k, v in os.environ.items() if k.startswith("BPE_")},
                    "results": results,
                },
                f,
                indent=1,
            )
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
