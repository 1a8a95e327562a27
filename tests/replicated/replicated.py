"""sqlite-bpe inside the real replicated-SQLite engines, with a stale-row oracle (issue 24).

This driver is the application's writer: Python's sqlite3 WITHOUT bpe (this process never loads
the extension). It records every row's version after each commit (the oracle). The bpe readers
are a separate process (bpe_reader.py) that loads libsqlite_bpe.so and reads through `vfs=bpe`:
one long-lived connection and one fresh connection per round. After every round each reader's
rows must equal the oracle's; a row that differs is a stale row and fails the run. Plain (no-bpe)
connections of this process read the same file each round as controls: a fresh one (if it
differs too, the engine had not caught up: also a failure, reported apart) and a long-lived one
(reported, never a failure: what it misses, the engine did not announce through SQLite's own
protocol).

  litefs      LiteFS (FUSE): a primary and a replica on 127.0.0.1, static lease; the writer on
              the primary's mount, the readers on the replica's; one database in WAL mode, one
              in rollback (DELETE) mode; each write waits until the replica's `<db>-pos` (TXID)
              reached the primary's.
  litestream  Litestream `replicate` of a WAL database to a file:// replica, checkpointing
              beside the readers (the writer runs with wal_autocheckpoint=0, so every checkpoint
              is Litestream's); afterwards `litestream restore` to a new file, read through bpe.

Each setup: one warm-up read, --baseline-rounds rounds with no writes (the pool's figures without
writes), --rounds rounds with one write transaction (--updates rows) before each round (or every
--write-every seconds), checked against the oracle; then --race-seconds of reads racing a writer
thread (no waiting: each read must be one committed state, no older than what was visible when
it started); then one more checked round. Counters come from bpe_performance_counters: lookups,
L1 hits, pages read from the file, whole-file forgets, pages forgotten; with --json, a per-round
trace of the wal-index header each reader saw. Exits 1 on any stale or wrong row.

  python3 replicated.py --lib target/release/libsqlite_bpe.so --work /tmp/x \
      --litefs ~/go/bin/litefs --litestream venv/bin/litestream [--engines litefs,litestream]
"""

import argparse
import bisect
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.dont_write_bytecode = True  # no __pycache__ in the checkout
from common import value, wal_index  # noqa: E402

FAILURES = []
RESULTS = {}
CHILDREN = []  # processes this driver started: ended in cleanup()
MOUNTS = []
CONTROL = True  # --no-control: no plain reader beside the bpe readers


def log(*a):
    print(*a, flush=True)


def fail(msg):
    FAILURES.append(msg)
    log("FAIL:", msg)


# ---------------------------------------------------------------- processes and mounts


def start(cmd, logfile, **kw):
    out = open(logfile, "ab")
    p = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, **kw)
    CHILDREN.append(p)
    with open(logfile + ".pid", "w") as f:
        f.write(str(p.pid))
    return p


def stop(p, sig=signal.SIGTERM, timeout=15):
    if p.poll() is None:
        p.send_signal(sig)
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def cleanup():
    close_plain_long()
    for p in reversed(CHILDREN):
        try:
            stop(p, timeout=10)
        except Exception as e:
            log("cleanup:", e)
    for m in MOUNTS:
        if os.path.ismount(m):
            subprocess.run(["fusermount3", "-u", "-z", m], check=False)


class Reader:
    """The bpe reader process."""

    def __init__(self, lib, logfile, env_extra=None):
        env = dict(os.environ)
        env.pop("BPE_DEFAULT_VFS", None)
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        env.update(env_extra or {})
        self.p = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "bpe_reader.py"), lib],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=open(logfile, "ab"),
            text=True,
            env=env,
            cwd=HERE,
        )
        CHILDREN.append(self.p)

    def ask(self, **req):
        self.p.stdin.write(json.dumps(req) + "\n")
        self.p.stdin.flush()
        line = self.p.stdout.readline()
        if not line:
            raise RuntimeError(f"the bpe reader died (exit {self.p.poll()})")
        out = json.loads(line)
        if isinstance(out, dict) and "error" in out:
            raise RuntimeError("bpe reader: " + out["error"])
        return out

    def close(self):
        try:
            self.ask(op="quit")
        except Exception:
            pass
        stop(self.p)


# ---------------------------------------------------------------- the writer and the oracle


class Writer:
    def __init__(self, path, journal_mode, rows, autocheckpoint=None):
        self.path = path
        self.c = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.c.execute("PRAGMA busy_timeout = 10000")
        mode = self.c.execute(f"PRAGMA journal_mode = {journal_mode}").fetchone()[0]
        assert mode == journal_mode, f"journal_mode {mode}, wanted {journal_mode}"
        if autocheckpoint is not None:
            self.c.execute(f"PRAGMA wal_autocheckpoint = {autocheckpoint}")
        self.c.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT NOT NULL)")
        self.c.execute("BEGIN")
        self.c.executemany("INSERT INTO t VALUES (?, ?)", ((i, value(i, 0)) for i in range(1, rows + 1)))
        self.c.execute("COMMIT")
        self.oracle = [0] * rows  # version of row id i+1
        self.history = [[0] for _ in range(rows)]  # every version row id i+1 had, ascending
        self.n = 0  # writes committed: write k gives the rows it updates version k
        self.rng = random.Random(24)

    def write(self, updates):
        version = self.n + 1
        ids = self.rng.sample(range(1, len(self.oracle) + 1), updates)
        self.c.execute("BEGIN IMMEDIATE")
        self.c.executemany("UPDATE t SET v = ? WHERE id = ?", ((value(i, version), i) for i in ids))
        self.c.execute("COMMIT")
        for i in ids:
            self.oracle[i - 1] = version
            self.history[i - 1].append(version)
        self.n = version
        return version

    def state(self, k):
        """Every row's version after write k."""
        return [h[bisect.bisect_right(h, k) - 1] for h in self.history]


PLAIN_LONG = {}  # path -> the long-lived plain control connection


def close_plain_long():
    while PLAIN_LONG:
        PLAIN_LONG.popitem()[1].close()


def plain_versions(path, ro=False, long_lived=False):
    """The control: a plain (no bpe) connection of this process, fresh or long-lived."""
    from common import parse

    uri = f"file:{path}" + ("?mode=ro" if ro else "")
    if long_lived:
        c = PLAIN_LONG.get(path)
        if c is None:
            c = PLAIN_LONG[path] = sqlite3.connect(uri, uri=True, isolation_level=None)
            c.execute("PRAGMA busy_timeout = 10000")
        return [parse(i, v) for i, v in c.execute("SELECT id, v FROM t ORDER BY id")]
    c = sqlite3.connect(uri, uri=True)
    try:
        c.execute("PRAGMA busy_timeout = 10000")
        return [parse(i, v) for i, v in c.execute("SELECT id, v FROM t ORDER BY id")]
    finally:
        c.close()


def compare(oracle, versions):
    """(stale, wrong): rows older than the oracle, and rows otherwise different (missing, newer
    than the oracle, or bytes the writer never made)."""
    if len(versions) != len(oracle):
        return 0, abs(len(versions) - len(oracle)) + sum(
            1 for a, b in zip(oracle, versions) if a != b
        )
    stale = wrong = 0
    for want, got in zip(oracle, versions):
        if got == want:
            continue
        if 0 <= got < want:
            stale += 1
        else:
            wrong += 1
    return stale, wrong


class Tally:
    """Counter deltas summed over a phase, per reader."""

    def __init__(self):
        self.d = {}

    def add(self, who, scan):
        t = self.d.setdefault(who, {"reads": 0, "ms": 0.0})
        t["reads"] += 1
        t["ms"] += scan["ms"]
        for k, v in scan["delta"].items():
            t[k] = t.get(k, 0) + v

    def summary(self):
        out = {}
        for who, t in self.d.items():
            lookups = t.get("Buffer cache hit ratio base", 0)
            hits = t.get("Buffer cache hit ratio", 0)
            l2 = t.get("Extension page reads/sec", 0)
            out[who] = {
                "reads": t["reads"],
                "lookups": lookups,
                "l1_hits": hits,
                "l2_hits": l2,
                "file_reads": t.get("Page reads/sec", 0),
                # SQL Server's Buffer cache hit ratio (readahead pages count as hits)
                "hit_ratio": round((hits + l2) / lookups, 4) if lookups else None,
                # pages served without reading the database file: 1 - file reads / lookups
                "served_ratio": round(max(0.0, 1 - t.get("Page reads/sec", 0) / lookups), 4)
                if lookups
                else None,
                "file_forgets": t.get("File cache invalidations", 0),
                "pages_forgotten": t.get("Pages invalidated by other processes", 0),
                "ms_per_read": round(t["ms"] / t["reads"], 2),
            }
        return out


def read_round(name, rnd, reader, uri, oracle, control_path, control_ro, tally, checks, trace=None):
    """One round of reads: the long-lived and a fresh bpe connection, then the plain control."""
    out = reader.ask(op="read", uri=uri, long=True, fresh=True, path=control_path)
    control = plain_versions(control_path, control_ro) if CONTROL else None
    # The long-lived plain control: a plain SQLite connection keeps its own page cache across
    # transactions while the wal-index (WAL) or the header's change counter (rollback) says
    # nothing changed: what it misses, the engine did not announce. Reported, not a failure.
    if CONTROL:
        ll_stale, ll_wrong = compare(oracle, plain_versions(control_path, control_ro, long_lived=True))
        checks["plain_long_lived_stale_rows"] = checks.get("plain_long_lived_stale_rows", 0) + ll_stale + ll_wrong
        if ll_stale or ll_wrong:
            log(f"{name} round {rnd}: the long-lived PLAIN control reader: {ll_stale} stale, {ll_wrong} wrong")
    if trace is not None:
        trace.append(
            {
                "round": rnd,
                # (mxFrame, nBackfill, salt1, iChange) before and after each read, or None;
                # each reader's [whole-file forgets, pages forgotten, pages read from the file]
                **{
                    who: {
                        "wal_index": out[who]["wal_index"],
                        "forgets": [
                            out[who]["delta"][k]
                            for k in ("File cache invalidations", "Pages invalidated by other processes", "Page reads/sec")
                        ],
                    }
                    for who in ("long", "fresh")
                },
            }
        )
    c_stale, c_wrong = compare(oracle, control) if CONTROL else (0, 0)
    for who in ("long", "fresh"):
        scan = out[who]
        tally.add(who, scan)
        tally.add("both", scan)
        stale, wrong = compare(oracle, scan["versions"])
        checks["reads"] += 1
        if who == "fresh" and scan["delta"]["Buffer cache hit ratio base"] <= 0:
            fail(f"{name} round {rnd}: the fresh reader made no bpe page lookups (not on vfs=bpe?)")
        if stale or wrong or not scan["ids_ok"]:
            checks["stale_rows"] += stale
            checks["wrong_rows"] += wrong
            sample = [
                (i + 1, want, got)
                for i, (want, got) in enumerate(zip(oracle, scan["versions"]))
                if want != got
            ][:5]
            fail(
                f"{name} round {rnd}: {who} bpe reader: {stale} stale rows, {wrong} wrong rows "
                f"(id, oracle, served) {sample}; plain control: {c_stale} stale, {c_wrong} wrong"
            )
    if c_stale or c_wrong:
        checks["control_stale_rows"] += c_stale + c_wrong
        fail(f"{name} round {rnd}: the plain control reader differs too ({c_stale} stale, {c_wrong} wrong)")


def phase(name, args, writer, reader, uri, control_path, control_ro, wait=None, observe=None, race_setup=None):
    """Baseline (no writes) then the write rounds; returns the setup's results."""
    checks = {"reads": 0, "stale_rows": 0, "wrong_rows": 0, "control_stale_rows": 0}
    base, writes = Tally(), Tally()
    trace = []  # per write-phase round: the wal-index seen and each reader's forgets (JSON only)
    reader.ask(op="open", uri=uri)
    # A warm-up read (checked, not counted): the baseline is a warm pool.
    read_round(name, "warm-up", reader, uri, writer.oracle, control_path, control_ro, Tally(), checks)
    t0 = time.monotonic()
    for rnd in range(args.baseline_rounds):
        read_round(name, f"baseline {rnd}", reader, uri, writer.oracle, control_path, control_ro, base, checks)
        if observe:
            observe()
    t1 = time.monotonic()
    nwrites, last_write = 0, None
    for rnd in range(1, args.rounds + 1):
        now = time.monotonic()
        if last_write is None or now - last_write >= args.write_every:
            nwrites += 1
            last_write = now
            writer.write(args.updates)
            if wait:
                wait()
        read_round(name, rnd, reader, uri, writer.oracle, control_path, control_ro, writes, checks, trace)
        if observe:
            observe()
        if len(FAILURES) > 20:
            break
    t2 = time.monotonic()
    res = {
        "rows": len(writer.oracle),
        "updates_per_round": args.updates,
        "rounds": args.rounds,
        "writes": nwrites,
        "write_every_s": args.write_every,
        "baseline_rounds": args.baseline_rounds,
        "checks": checks,
        "no_writes": base.summary(),
        "with_writes": writes.summary(),
        "rounds_per_s": round(args.rounds / (t2 - t1), 2),
        "writes_per_s": round(nwrites / (t2 - t1), 2),
        "baseline_s": round(t1 - t0, 2),
        "rounds_s": round(t2 - t1, 2),
        "trace": trace,
    }
    if args.race_seconds > 0:
        res["race"] = race(name, args, writer, reader, uri, race_setup(), wait)
        if wait:
            wait(settle=True)
        read_round(name, "after the race", reader, uri, writer.oracle, control_path, control_ro, Tally(), checks)
    for key in ("hit_ratio", "served_ratio"):
        b = res["no_writes"].get("both", {}).get(key)
        w = res["with_writes"].get("both", {}).get(key)
        if b and w is not None:
            res[key + "_kept"] = round(w / b, 4)
    return res


def race(name, args, writer, reader, uri, setup, wait):
    """Reads racing the replication: a writer thread commits every --race-write-gap seconds while
    the readers read back to back without waiting. Each read must be one committed state k
    (every row as after write k: no mix of two states) with k no older than what was known
    visible to the readers before the read started (`visible()`: the replica's TXID for
    LiteFS, the writes committed for Litestream) and no newer than what was committed after."""
    visible, mapping_ok = setup
    stop_writing = threading.Event()
    errors = []

    def writing():
        while not stop_writing.is_set():
            try:
                writer.write(args.updates)
            except Exception as e:
                errors.append(f"{type(e).__name__}: {e}")
                return
            time.sleep(args.race_write_gap)

    first = writer.n
    thread = threading.Thread(target=writing)
    tally = Tally()
    reads = []
    t0 = time.monotonic()
    thread.start()
    try:
        while time.monotonic() - t0 < args.race_seconds:
            lo = visible()
            out = reader.ask(op="read", uri=uri, long=True, fresh=True)
            hi = writer.n + 1  # a commit may be visible before the writer counted it
            for who in ("long", "fresh"):
                tally.add(who, out[who])
                tally.add("both", out[who])
                reads.append((who, lo, hi, out[who]["versions"]))
    finally:
        stop_writing.set()
        thread.join()
    elapsed = time.monotonic() - t0
    if errors:
        fail(f"{name} race: the writer failed: {errors[0]}")
    if wait:
        wait(settle=True)
    ok, detail = mapping_ok()
    res = {
        "seconds": round(elapsed, 2),
        "writes": writer.n - first,
        "reads": len(reads),
        "stale_reads": 0,
        "torn_reads": 0,
        "lower_bound_checked": ok,
        "lag_writes_max": 0,
        "counters": tally.summary(),
    }
    if not ok:
        fail(f"{name} race: cannot map what the readers could see to writes: {detail}")
    for who, lo, hi, versions in reads:
        if -1 in versions or len(versions) != len(writer.oracle):
            res["torn_reads"] += 1
            fail(f"{name} race: {who} reader: rows the writer never made or missing rows")
            continue
        k = max(versions)
        res["lag_writes_max"] = max(res["lag_writes_max"], hi - 1 - k)
        if k > hi:
            res["torn_reads"] += 1
            fail(f"{name} race: {who} reader saw write {k}, only {hi - 1} committed")
            continue
        want = writer.state(k)
        if versions != want:
            res["torn_reads"] += 1
            bad = [(i + 1, w, g) for i, (w, g) in enumerate(zip(want, versions)) if w != g]
            fail(f"{name} race: {who} reader: not one committed state (newest write {k}; "
                 f"{len(bad)} rows differ from it, (id, state {k}, served) {bad[:5]})")
        elif ok and k < lo:
            res["stale_reads"] += 1
            fail(f"{name} race: {who} reader served the state after write {k}, write {lo} was already visible")
    return res


# ---------------------------------------------------------------- LiteFS


def litefs_config(root, name, port, primary_port, candidate):
    d = os.path.join(root, name)
    os.makedirs(os.path.join(d, "mnt"), exist_ok=True)
    os.makedirs(os.path.join(d, "data"), exist_ok=True)
    cfg = os.path.join(d, "litefs.yml")
    with open(cfg, "w") as f:
        f.write(
            f"""fuse:
  dir: "{d}/mnt"
data:
  dir: "{d}/data"
exit-on-error: false
http:
  addr: "127.0.0.1:{port}"
lease:
  type: "static"
  advertise-url: "http://127.0.0.1:{primary_port}"
  candidate: {"true" if candidate else "false"}
"""
        )
    return cfg, os.path.join(d, "mnt")


def wait_until(pred, what, timeout=30):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            if pred():
                return
        except OSError:
            pass
        time.sleep(0.01)
    raise RuntimeError(f"timed out waiting for {what}")


def txid(mount, db):
    with open(os.path.join(mount, db + "-pos")) as f:
        return int(f.read().split("/")[0], 16)


def run_litefs(args, lib):
    root = os.path.join(args.work, "litefs")
    os.makedirs(root, exist_ok=True)
    pport, rport = args.port, args.port + 1
    pcfg, pmnt = litefs_config(root, "primary", pport, pport, True)
    rcfg, rmnt = litefs_config(root, "replica", rport, pport, False)
    MOUNTS.extend([pmnt, rmnt])
    primary = start([args.litefs, "mount", "-config", pcfg], os.path.join(root, "primary.log"))
    wait_until(lambda: os.path.ismount(pmnt), "the primary's mount")
    replica = start([args.litefs, "mount", "-config", rcfg], os.path.join(root, "replica.log"))
    wait_until(lambda: os.path.ismount(rmnt), "the replica's mount")
    wait_until(lambda: os.path.exists(os.path.join(rmnt, ".primary")), "the replica's .primary")
    for mode, db in (("wal", "wal.db"), ("delete", "rollback.db")):
        name = f"litefs-{mode}"
        log(f"== {name}: writer on {pmnt}/{db}, bpe readers on {rmnt}/{db}")
        writer = Writer(os.path.join(pmnt, db), mode, args.rows)
        last = [txid(pmnt, db)]

        def wait(db=db, last=last, settle=False):
            if not settle:
                wait_until(lambda: txid(pmnt, db) > last[0], "the primary's TXID to move")
            last[0] = txid(pmnt, db)
            wait_until(lambda: txid(rmnt, db) >= last[0], f"the replica to reach TXID {last[0]}")
            if primary.poll() is not None or replica.poll() is not None:
                raise RuntimeError("a LiteFS process exited")

        wait_until(lambda: os.path.exists(os.path.join(rmnt, db + "-pos")) and txid(rmnt, db) >= last[0], "the replica's first copy")
        def race_setup(db=db, writer=writer):
            # One LiteFS transaction per write: write k is TXID base + (k - first).
            base, first = txid(pmnt, db), writer.n

            def visible():
                return first + txid(rmnt, db) - base

            def mapping_ok():
                moved = txid(pmnt, db) - base
                return moved == writer.n - first, f"TXID moved {moved}, {writer.n - first} writes"

            return visible, mapping_ok

        reader = Reader(lib, os.path.join(root, f"reader-{mode}.log"))
        try:
            RESULTS[name] = phase(
                name, args, writer, reader, f"file:{rmnt}/{db}?vfs=bpe", os.path.join(rmnt, db), True,
                wait=wait, race_setup=race_setup,
            )
            RESULTS[name]["final_txid"] = last[0]
        finally:
            reader.close()
            writer.c.close()
            close_plain_long()
        log(json.dumps({k: v for k, v in RESULTS[name].items() if k != "trace"}, indent=1))
    stop(replica)
    stop(primary)
    for m in (pmnt, rmnt):
        if os.path.ismount(m):
            subprocess.run(["fusermount3", "-u", "-z", m], check=False)


# ---------------------------------------------------------------- Litestream


def run_litestream(args, lib):
    root = os.path.join(args.work, "litestream")
    os.makedirs(root, exist_ok=True)
    db = os.path.join(root, "app.db")
    replica_dir = os.path.join(root, "replica")
    cfg = os.path.join(root, "litestream.yml")
    with open(cfg, "w") as f:
        f.write(
            f"""dbs:
  - path: {db}
    monitor-interval: 100ms
    checkpoint-interval: 1s
    min-checkpoint-page-count: {args.ls_min_checkpoint_pages}
    replica:
      type: file
      path: {replica_dir}
      sync-interval: 100ms
"""
        )
    name = "litestream"
    log(f"== {name}: writer and bpe readers on {db}, litestream replicate to file://{replica_dir}")
    writer = Writer(db, "wal", args.rows, autocheckpoint=0)
    ls = start([args.litestream, "replicate", "-config", cfg], os.path.join(root, "litestream.log"))
    wait_until(
        lambda: any(files for _, _, files in os.walk(replica_dir)), "Litestream's first snapshot", 60
    )
    ckpt = {"backfills": 0, "restarts": 0, "last": wal_index(db)}

    def observe():
        s = wal_index(db)
        last = ckpt["last"]
        if s and last:
            if s[2] != last[2]:
                ckpt["restarts"] += 1
            elif s[1] > last[1]:
                ckpt["backfills"] += 1
        ckpt["last"] = s
        if ls.poll() is not None:
            raise RuntimeError("litestream exited")

    reader = Reader(lib, os.path.join(root, "reader.log"))
    try:
        def race_setup():
            return (lambda: writer.n), (lambda: (True, ""))

        RESULTS[name] = phase(
            name, args, writer, reader, f"file:{db}?vfs=bpe", db, False, observe=observe, race_setup=race_setup
        )
        RESULTS[name]["wal_index_seen"] = {
            "checkpoints_seen_between_rounds": ckpt["backfills"],
            "wal_restarts_seen_between_rounds": ckpt["restarts"],
        }
        # Restore: stop replicating (Litestream syncs what is left on SIGTERM), restore to a new
        # file, read it through bpe (a fresh connection) against the oracle.
        time.sleep(1.0)
        stop(ls, timeout=60)
        restored = os.path.join(root, "restored.db")
        r = subprocess.run(
            [args.litestream, "restore", "-config", cfg, "-o", restored, db],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if r.returncode != 0:
            fail(f"litestream restore failed: {r.stdout} {r.stderr}")
        else:
            out = reader.ask(op="read", uri=f"file:{restored}?vfs=bpe", long=False, fresh=True)
            stale, wrong = compare(writer.oracle, out["fresh"]["versions"])
            RESULTS[name]["restore"] = {"stale_rows": stale, "wrong_rows": wrong, "rows": len(out["fresh"]["versions"])}
            if stale or wrong:
                fail(f"litestream restore read through bpe: {stale} stale, {wrong} wrong rows")
            if out["fresh"]["delta"]["Buffer cache hit ratio base"] <= 0:
                fail("the restored file's read made no bpe lookups")
        with open(os.path.join(root, "litestream.log"), errors="replace") as f:
            text = f.read()
        RESULTS[name]["litestream_log_checkpoints"] = text.count("checkpoint")
    finally:
        reader.close()
        writer.c.close()
        close_plain_long()
        stop(ls)
    log(json.dumps({k: v for k, v in RESULTS[name].items() if k != "trace"}, indent=1))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--litefs", default="litefs")
    ap.add_argument("--litestream", default="litestream")
    ap.add_argument("--engines", default="litefs,litestream")
    ap.add_argument("--rounds", type=int, default=100)
    ap.add_argument("--baseline-rounds", type=int, default=20)
    ap.add_argument("--rows", type=int, default=5000)
    ap.add_argument("--updates", type=int, default=10, help="rows updated per write round (one transaction)")
    ap.add_argument(
        "--write-every",
        type=float,
        default=0.0,
        help="seconds between write transactions in the write phase (0: one before every round)",
    )
    ap.add_argument("--race-seconds", type=float, default=5.0, help="reads racing the replication, per setup (0: none)")
    ap.add_argument("--race-write-gap", type=float, default=0.02, help="seconds between the race's writes")
    ap.add_argument("--ls-min-checkpoint-pages", type=int, default=16)
    ap.add_argument("--port", type=int, default=20202)
    ap.add_argument("--json", help="write the results here")
    ap.add_argument(
        "--no-control",
        action="store_true",
        help="no plain (no-bpe) control reader: only the bpe readers touch the replica",
    )
    args = ap.parse_args()
    global CONTROL
    CONTROL = not args.no_control
    lib = os.path.abspath(args.lib)
    os.makedirs(args.work, exist_ok=True)
    engines = [e for e in args.engines.split(",") if e]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        for e in engines:
            t = time.monotonic()
            try:
                {"litefs": run_litefs, "litestream": run_litestream}[e](args, lib)
            except Exception as ex:
                fail(f"{e}: {type(ex).__name__}: {ex}")
            log(f"-- {e}: {time.monotonic() - t:.1f} s")
    finally:
        cleanup()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"results": RESULTS, "failures": FAILURES}, f, indent=1)
    log("\nSUMMARY")
    for name, r in RESULTS.items():
        c = r["checks"]
        fb = r["no_writes"].get("both", {})
        fw = r["with_writes"].get("both", {})
        log(
            f"{name}: {c['reads']} bpe reads, {c['stale_rows']} stale rows, {c['wrong_rows']} wrong rows, "
            f"control {c['control_stale_rows']}; served from the pool {fb.get('served_ratio')} without "
            f"writes, {fw.get('served_ratio')} with {r['writes']} writes in {r['rounds']} rounds "
            f"({r['writes_per_s']} writes/s; hit ratio {fb.get('hit_ratio')} / {fw.get('hit_ratio')}; "
            f"{fw.get('lookups')} lookups, {fw.get('file_reads')} file reads, "
            f"{fw.get('file_forgets')} whole-file forgets, {fw.get('pages_forgotten')} pages forgotten)"
        )
    if FAILURES:
        log(f"{len(FAILURES)} failures")
        sys.exit(1)
    log("OK: 0 stale rows")


if __name__ == "__main__":
    main()
