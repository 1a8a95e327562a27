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
              Then the acknowledged-commit oracle on the primary (primary_acks): a plain writer
              commits beside plain readers, then beside bpe readers; every acknowledged row must
              be on the primary and the replica, and bpe must cost the writer no errors.
  bindfs      the same oracle on a bindfs mount whose `<db>-pos` moves after every commit and
              that has no `.primary` (what a LiteFS primary looks like to bpe).
  litestream  Litestream `replicate` of a WAL database to a file:// replica, checkpointing
              beside the readers (the writer runs with wal_autocheckpoint=0, so every checkpoint
              is Litestream's); afterwards `litestream restore` to a new file, read through bpe.
  litestream-vfs  (only with --engines ...,litestream-vfs, unless LITESTREAM_VFS_IN_DEFAULT_ENGINES)
              Litestream `replicate` to a file:// replica, read through Litestream's read-replica
              VFS (the litestream-vfs wheel, loaded into the bpe reader process before bpe): bpe
              readers on `file:NAME?vfs=bpe&bpe_base=litestream` (--ls-vfs-bpe), controls on plain
              `?vfs=litestream`, all in the reader process. The VFS lags the writer (each
              connection polls the replica every second; a new one reads it at open), so each read
              is checked against every committed state instead: it must be exactly the state its
              meta row (the write's number, set in the same transaction) names, never older than
              what that reader (or, for a fresh connection, any earlier read) saw, and no write may
              stay invisible longer than --ls-vfs-fresh-bound; after the last write every reader
              must show it within that bound (the time is reported). See StateOracle. No race
              phase: the rounds do not wait for the replica, so they race it. Litestream's L1-L3
              compaction is kept out of the run (--ls-vfs-compaction: 0.5.17's own long-lived VFS
              connections fail these checks once an L1 file appears).

Each setup: one warm-up read, --baseline-rounds rounds with no writes (the pool's figures without
writes), --rounds rounds with one write transaction (--updates rows) before each round (or every
--write-every seconds), checked against the oracle; then --race-seconds of reads racing a writer
thread (no waiting: each read must be one committed state, no older than what was visible when
it started); then one more checked round. Counters come from bpe_performance_counters: lookups,
L1 hits, pages read from the file, whole-file forgets, pages forgotten; with --json, a per-round
trace of the wal-index header each reader saw. Exits 1 on any stale or wrong row.

  python3 replicated.py --lib target/release/libsqlite_bpe.so --work /tmp/x \
      --litefs ~/go/bin/litefs --litestream venv/bin/litestream [--engines litefs,litestream]
  python3 replicated.py --lib ... --work /tmp/y --litestream venv/bin/litestream \
      --engines litestream-vfs [--litestream-vfs .../litestream_vfs/litestream-vfs.so] [--ls-vfs-bpe off]
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
PRIMARY = {}  # the acknowledged-commit oracle's results, per setup (primary_acks)
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

    def __init__(self, lib, logfile, env_extra=None, extra_args=()):
        env = dict(os.environ)
        env.pop("BPE_DEFAULT_VFS", None)
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        env.update(env_extra or {})
        self.p = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "bpe_reader.py"), lib, *extra_args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=open(logfile, "ab"),
            text=True,
            env=env,
            cwd=HERE,
        )
        CHILDREN.append(self.p)

    def ask(self, **req):
        self.send(**req)
        return self.receive()

    def send(self, **req):
        self.p.stdin.write(json.dumps(req) + "\n")
        self.p.stdin.flush()

    def receive(self):
        line = self.p.stdout.readline()
        while line and not line.startswith("{"):  # a library's own output on stdout
            log("bpe reader stdout:", line.rstrip())
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
        self.in_transaction(version)
        self.c.execute("COMMIT")
        for i in ids:
            self.oracle[i - 1] = version
            self.history[i - 1].append(version)
        self.n = version
        return version

    def in_transaction(self, version):
        """More of write `version`'s transaction (MetaWriter's meta row)."""

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
            uri = f"file:{rmnt}/{db}?vfs=bpe"
            RESULTS[name] = phase(
                name, args, writer, reader, uri, os.path.join(rmnt, db), True,
                wait=wait, race_setup=race_setup,
            )
            RESULTS[name]["final_txid"] = last[0]
            if mode == "wal" and args.lost_header_rounds:
                RESULTS[name]["lost_header"] = lost_header(
                    name, args, writer, reader, uri, os.path.join(rmnt, db), wait
                )
        finally:
            reader.close()
            writer.c.close()
            close_plain_long()
        log(json.dumps({k: v for k, v in RESULTS[name].items() if k != "trace"}, indent=1))
    if args.primary_seconds:
        for mode in ("wal", "delete"):
            db = f"acks-{mode}.db"

            def replica_check(want, db=db):
                wait_until(lambda: os.path.exists(os.path.join(rmnt, db + "-pos")), "the replica's copy")
                target = txid(pmnt, db)
                wait_until(lambda: txid(rmnt, db) >= target, f"the replica to reach TXID {target}")
                c = sqlite3.connect(f"file:{rmnt}/{db}?mode=ro", uri=True)
                have = {r[0] for r in c.execute("SELECT id FROM acks")}
                c.close()
                if want - have:
                    fail(f"litefs-{mode}-primary: the replica misses {len(want - have)} acknowledged commits")
                return len(want - have)

            PRIMARY[f"litefs-{mode}-primary"] = primary_acks(
                f"litefs-{mode}-primary", args, lib, root, os.path.join(pmnt, db), mode,
                replica_check=replica_check,
            )
    stop(replica)
    stop(primary)
    for m in (pmnt, rmnt):
        if os.path.ismount(m):
            subprocess.run(["fusermount3", "-u", "-z", m], check=False)


def primary_acks(name, args, lib, logdir, db_path, journal_mode, after_commit=None, replica_check=None):
    """The acknowledged-commit oracle where SQLite's own writers commit (a LiteFS primary, or a
    bindfs mount whose `<db>-pos` moves after each commit, as LiteFS moves it when the writer
    unlocks). A plain writer inserts one row per transaction for --primary-seconds while two
    readers read: first two plain SQLite readers, then two bpe readers. Every acknowledged row
    must be in the file afterwards, for plain SQLite and for bpe (on the replica too, with
    `replica_check`); the bpe readers must cost the writer no more errors than the plain ones
    (SQLITE_BUSY, SQLITE_PROTOCOL: a cache that writes the wal-index makes them) and must not
    forget the whole file at the writer's commits."""
    w = sqlite3.connect(db_path, isolation_level=None, check_same_thread=False)
    w.execute("PRAGMA busy_timeout = 5000")
    mode = w.execute(f"PRAGMA journal_mode = {journal_mode}").fetchone()[0]
    assert mode == journal_mode, f"journal_mode {mode}, wanted {journal_mode}"
    w.execute("CREATE TABLE IF NOT EXISTS acks(id INTEGER PRIMARY KEY, v TEXT NOT NULL)")
    acked, next_id, out = [], 1, {}
    for arm in ("plain", "bpe"):
        readers = [
            Reader(lib if arm == "bpe" else "--plain", os.path.join(logdir, f"{name}-{arm}-reader.log"))
            for _ in range(2)
        ]
        uri = f"file:{db_path}" + ("?vfs=bpe" if arm == "bpe" else "")
        try:
            for r in readers:
                r.send(op="hammer", uri=uri, seconds=args.primary_seconds)
            errors, commits = {}, 0
            end = time.monotonic() + args.primary_seconds
            while time.monotonic() < end:
                i, next_id = next_id, next_id + 1
                try:
                    w.execute("INSERT INTO acks VALUES (?, ?)", (i, value(i, 0)))
                except sqlite3.Error as e:
                    key = getattr(e, "sqlite_errorname", None) or str(e)
                    errors[key] = errors.get(key, 0) + 1
                    continue
                acked.append(i)
                commits += 1
                if after_commit:
                    after_commit()
            replies = [r.receive() for r in readers]
        finally:
            for r in readers:
                r.close()
        reader_errors = {}
        for rep in replies:
            for k, n in rep["errors"].items():
                reader_errors[k] = reader_errors.get(k, 0) + n
        out[arm] = {
            "commits": commits,
            "writer_errors": errors,
            "reads": sum(rep["reads"] for rep in replies),
            "reader_errors": reader_errors,
            "whole_file_forgets": sum(rep["delta"].get("File cache invalidations", 0) for rep in replies),
        }
        log(f"{name}: {arm} readers: {out[arm]}")
    # The oracle: every acknowledged row, through plain SQLite and through bpe.
    want = set(acked)
    plain = sqlite3.connect(db_path)
    have = {r[0] for r in plain.execute("SELECT id FROM acks")}
    check = plain.execute("PRAGMA integrity_check").fetchone()[0]
    plain.close()
    out["lost"] = len(want - have)
    if want - have:
        fail(f"{name}: {len(want - have)} acknowledged commits are gone (first: {sorted(want - have)[:5]})")
    if check != "ok":
        fail(f"{name}: integrity_check says {check}")
    probe = Reader(lib, os.path.join(logdir, f"{name}-probe.log"))
    try:
        seen = probe.ask(op="ids", uri=f"file:{db_path}?vfs=bpe")["ids"]
    finally:
        probe.close()
    if not want <= set(seen):
        fail(f"{name}: a bpe reader misses {len(want - set(seen))} acknowledged rows")
    try:
        w.execute("INSERT INTO acks VALUES (?, ?)", (next_id, value(next_id, 0)))
    except sqlite3.Error as e:
        fail(f"{name}: the commit after the phase failed: {e}")
    w.close()
    if replica_check:
        out["replica_lost"] = replica_check(want)
    plain_err, bpe_err = (sum(out[a]["writer_errors"].values()) for a in ("plain", "bpe"))
    if bpe_err > plain_err:
        fail(f"{name}: beside bpe readers the writer met {bpe_err} errors, beside plain readers {plain_err}: "
             f"{out['bpe']['writer_errors']}")
    plain_rerr, bpe_rerr = (sum(out[a]["reader_errors"].values()) for a in ("plain", "bpe"))
    if bpe_rerr > plain_rerr:
        fail(f"{name}: bpe readers met {bpe_rerr} errors, plain readers {plain_rerr}: {out['bpe']['reader_errors']}")
    # WAL: a plain writer's commit forgets nothing (its pages are WAL frames); a WAL restart a
    # reader did not see whole forgets the file, a handful of times a run. Rollback: a plain
    # writer's commit names no pages, so each forgets the file once a reader (as each makes a plain
    # reader's SQLite drop its page cache). A cache that acts on the position where SQLite commits
    # forgot it once more per commit (WAL: at nearly every commit).
    forgets, commits = out["bpe"]["whole_file_forgets"], out["bpe"]["commits"]
    bound = max(10, commits // 10) if journal_mode == "wal" else len(replies) * commits
    out["bpe"]["whole_file_forgets_bound"] = bound
    if forgets > bound:
        fail(f"{name}: the bpe readers forgot the whole file {forgets} times for {commits} commits (at most {bound})")
    log(f"{name}: {len(acked)} acknowledged commits, {out['lost']} lost")
    return out


def run_bindfs(args, lib):
    """A bindfs mount whose `<db>-pos` moves after each commit and that has no `.primary`: what a
    LiteFS primary looks like to bpe, which any user can set up."""
    root = os.path.join(args.work, "bindfs")
    src, mnt = os.path.join(root, "src"), os.path.join(root, "mnt")
    os.makedirs(src, exist_ok=True)
    os.makedirs(mnt, exist_ok=True)
    subprocess.run(["bindfs", src, mnt], check=True)
    MOUNTS.append(mnt)
    try:
        for mode in ("wal", "delete"):
            db = os.path.join(mnt, f"acks-{mode}.db")
            txid = [1]

            def move(db=db, txid=txid):
                txid[0] += 1
                with open(db + "-pos", "w") as f:
                    f.write(f"{txid[0]:016x}/{txid[0] * 7919:016x}\n")

            move()
            PRIMARY[f"bindfs-{mode}-primary"] = primary_acks(
                f"bindfs-{mode}-primary", args, lib, root, db, mode, after_commit=move
            )
    finally:
        subprocess.run(["fusermount3", "-u", "-z", mnt], check=False)


def lost_header(name, args, writer, reader, uri, replica_db, wait):
    """LiteFS's lost wal-index header, made on purpose: after each replicated write, the header
    the replica had before it is written back over the one LiteFS wrote (what a write-back
    through another process's `-shm` mmap does to it: LiteFS's `updateSHM` comment; once seen in
    CI). The header then says nothing changed, while the pages are in the file and `<db>-pos`
    moved. Every bpe read must still equal the oracle."""
    shm = replica_db + "-shm"
    checks = {"reads": 0, "stale_rows": 0, "wrong_rows": 0, "control_stale_rows": 0}
    restored = 0
    for rnd in range(1, args.lost_header_rounds + 1):
        with open(shm, "rb") as f:
            before = f.read(136)
        writer.write(args.updates)
        wait()
        with open(shm, "r+b") as f:
            f.write(before)
        with open(shm, "rb") as f:
            restored += f.read(136) == before
        read_round(f"{name} lost header", rnd, reader, uri, writer.oracle, replica_db, True, Tally(), checks)
    log(f"{name}: lost header: {args.lost_header_rounds} rounds, the old header back in {restored}, "
        f"{checks['reads']} bpe reads, {checks['stale_rows']} stale rows")
    if restored == 0:
        fail(f"{name}: lost header: the old wal-index header could not be written back (the test tests nothing)")
    return {"rounds": args.lost_header_rounds, "header_restored": restored, "checks": checks}


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


# ---------------------------------------------------------------- Litestream VFS (read replica)

# The engines run when --engines is not given. True adds litestream-vfs to them (and so to run.sh's
# and CI's default run): flip it once bpe over a named base VFS (bpe_base=litestream) has landed.
LITESTREAM_VFS_IN_DEFAULT_ENGINES = False
DEFAULT_ENGINES = "litefs,bindfs,litestream" + (",litestream-vfs" if LITESTREAM_VFS_IN_DEFAULT_ENGINES else "")
# What the litestream-vfs engine's subject readers read through (--ls-vfs-bpe): "on" vfs=bpe over
# the Litestream VFS (bpe_base=litestream), "off" plain vfs=litestream (the harness alone, checking
# the engine), "auto" "on" when the library knows bpe_base (the string is in it), else "off".
LITESTREAM_VFS_BPE_ARM = "auto"
LITESTREAM_VFS_VERSION = "0.5.17"  # run.sh pins the same


class MetaWriter(Writer):
    """The Writer with a meta row (k = 1) holding the number of the last write, set in that write's
    own transaction: a read of it in the reader's read transaction names the one committed state
    the reader's rows must equal."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.c.execute("CREATE TABLE meta(k INTEGER PRIMARY KEY, round INTEGER NOT NULL)")
        self.c.execute("INSERT INTO meta VALUES (1, 0)")
        self.commit_times = [time.monotonic()]  # write k returned from COMMIT at commit_times[k]

    def in_transaction(self, version):
        self.c.execute("UPDATE meta SET round = ? WHERE k = 1", (version,))

    def write(self, updates):
        version = super().write(updates)
        self.commit_times.append(time.monotonic())
        return version


class StateOracle:
    """The litestream-vfs engine's checks. The Litestream VFS lags the writer (its connections poll
    the replica, each on its own; a new connection reads the replica's list at open), so a read
    need not be the writer's latest state. Each read must instead be:
      one committed state   every row as after write m, m the meta row read in the same read
                            transaction (rows of another state than m, a mix of states, bytes the
                            writer never made, a meta row newer than the writer: torn);
      never backwards       m no older than what the same reader saw before (a long-lived
                            connection; the series of fresh connections of each kind);
      fresh at open         a fresh connection's m no older than the newest state any read
                            completed before it opened (the replica had published it);
      lagging within bound  write m + 1, if any, committed no more than `bound` seconds before
                            the read started.
    Reports each reader's lag: writes not yet visible, and how long the oldest of them had been
    committed when the read started ("invisible_s")."""

    def __init__(self, writer, bound):
        self.w = writer
        self.bound = bound
        self.last = {}  # reader -> newest state it saw
        self.newest_done = 0  # newest state a completed read saw
        self.stats = {}
        self.cache = {}

    def state(self, k):
        if k not in self.cache:
            if len(self.cache) > 64:
                self.cache.clear()
            self.cache[k] = self.w.state(k)
        return self.cache[k]

    def check(self, who, scan, fresh):
        """(problems, expected state or None) of one read; updates the reader's figures."""
        st = self.stats.setdefault(
            who,
            {"reads": 0, "bad_reads": 0, "torn": 0, "backwards": 0, "stale_at_open": 0,
             "states_seen": set(), "lag_writes_max": 0, "lag_writes_sum": 0,
             "invisible_s_max": 0.0, "invisible_s_sum": 0.0, "txid_none": 0, "txids": set(), "ms_sum": 0.0},
        )
        st["reads"] += 1
        st["ms_sum"] += scan["ms"]
        if scan.get("txid") is None:
            st["txid_none"] += 1
        else:
            st["txids"].add(scan["txid"])
        n, m, versions = self.w.n, scan["meta"], scan["versions"]
        problems, want = [], None
        if not scan["ids_ok"] or len(versions) != len(self.w.oracle) or -1 in versions:
            st["torn"] += 1
            problems.append(f"rows missing or bytes the writer never made ({versions.count(-1)} such rows)")
        elif not isinstance(m, int) or not 0 <= m <= n:
            st["torn"] += 1
            problems.append(f"meta row {m!r}, {n} writes committed")
        else:
            want = self.state(m)
            if versions != want:
                st["torn"] += 1
                k = max(versions)
                if k <= n and versions == self.state(k):
                    problems.append(f"the rows are committed state {k}, the meta row says {m}")
                else:
                    bad = [(i + 1, a, b) for i, (a, b) in enumerate(zip(want, versions)) if a != b]
                    problems.append(f"no committed state: {len(bad)} rows differ from state {m} (the meta row's); "
                                    f"(id, state {m}, served) {bad[:5]}")
            else:
                if m < self.last.get(who, 0):
                    st["backwards"] += 1
                    problems.append(f"state {m} after state {self.last[who]} (backwards)")
                    want = self.state(self.last[who])
                if fresh and m < self.newest_done:
                    st["stale_at_open"] += 1
                    problems.append(f"a fresh connection at state {m}; state {self.newest_done} was seen before it opened")
                    want = self.state(self.newest_done)
                self.last[who] = max(m, self.last.get(who, 0))
                self.newest_done = max(self.newest_done, m)
                st["states_seen"].add(m)
                st["lag_writes_max"] = max(st["lag_writes_max"], n - m)
                st["lag_writes_sum"] += n - m
                if m < n:
                    inv = scan["t0"] - self.w.commit_times[m + 1]
                    st["invisible_s_max"] = max(st["invisible_s_max"], inv)
                    st["invisible_s_sum"] += inv
                    if inv > self.bound:
                        st["lagging"] = st.get("lagging", 0) + 1
                        problems.append(f"state {m}: write {m + 1} was committed {inv:.1f} s before the read "
                                        f"(bound {self.bound} s)")
                        want = self.state(n)
        if problems:
            st["bad_reads"] += 1
        return problems, want

    def summary(self):
        out = {}
        for who, st in self.stats.items():
            r = st["reads"] or 1
            out[who] = {
                "reads": st["reads"],
                "bad_reads": st["bad_reads"],
                "torn_reads": st["torn"],
                "backwards_reads": st["backwards"],
                "stale_at_open_reads": st["stale_at_open"],
                "lagging_reads": st.get("lagging", 0),
                "distinct_states_seen": len(st["states_seen"]),
                "lag_writes_max": st["lag_writes_max"],
                "lag_writes_mean": round(st["lag_writes_sum"] / r, 2),
                "invisible_s_max": round(st["invisible_s_max"], 3),
                "invisible_s_mean": round(st["invisible_s_sum"] / r, 3),
                "ms_per_read": round(st["ms_sum"] / r, 2),
                "txid_pragma_answered": st["reads"] - st["txid_none"],
                "distinct_txids": len(st["txids"]),
            }
        return out


def find_litestream_vfs(args):
    """The Litestream VFS library: --litestream-vfs, else the litestream_vfs package of the venv
    beside --litestream (run.sh's)."""
    if args.litestream_vfs:
        return os.path.abspath(args.litestream_vfs)
    import shutil

    ls = shutil.which(args.litestream) or args.litestream
    py = os.path.join(os.path.dirname(os.path.abspath(ls)), "python")
    if os.path.exists(py):
        r = subprocess.run(
            [py, "-c", "import litestream_vfs; print(litestream_vfs.loadable_path())"], capture_output=True, text=True
        )
        if r.returncode == 0 and r.stdout.strip():
            return r.stdout.strip()
    raise RuntimeError(
        f"no Litestream VFS library: pass --litestream-vfs (run.sh installs litestream-vfs=={LITESTREAM_VFS_VERSION} "
        f"into its venv)"
    )


def bpe_arm_on(setting, lib):
    if setting in ("on", "off"):
        return setting == "on"
    with open(lib, "rb") as f:
        return b"bpe_base" in f.read()


def run_litestream_vfs(args, lib):
    root = os.path.join(args.work, "litestream-vfs")
    os.makedirs(root, exist_ok=True)
    name = "litestream-vfs"
    lsvfs = find_litestream_vfs(args)
    bpe = bpe_arm_on(args.ls_vfs_bpe, lib)
    db = os.path.join(root, "app.db")
    replica_dir = os.path.join(root, "replica")
    cfg = os.path.join(root, "litestream.yml")
    # Compaction: "default" is Litestream's (L1 every 30 s on the clock, L2 5 min, L3 1 h); "off"
    # moves L1-L3 to 24 h, 48 h, 96 h (on the clock: none during a run unless it crosses 00:00 UTC).
    # 0.5.17's long-lived VFS connections served torn states (rows of writes newer than the meta
    # row, rows back at version 0) and stopped advancing after an L1 file appeared mid-run.
    levels = "" if args.ls_vfs_compaction == "default" else (
        "levels:\n  - interval: 24h\n  - interval: 48h\n  - interval: 96h\n"
    )
    with open(cfg, "w") as f:
        f.write(
            f"""l0-retention: 1h
{levels}dbs:
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
    # Never created: the Litestream VFS reads LITESTREAM_REPLICA_URL's replica whatever the name.
    vname = os.path.join(root, "replica.db")
    extra = "&" + args.ls_vfs_uri_params if args.ls_vfs_uri_params else ""
    env = {
        "LITESTREAM_REPLICA_URL": "file://" + replica_dir,
        # The VFS logs to stdout unless told: that is the reader's answer pipe.
        "LITESTREAM_LOG_FILE": os.path.join(root, "litestream-vfs.log"),
    }
    control_uri = f"file:{vname}?vfs=litestream{extra}"
    if not bpe:
        subject_uri = control_uri
    elif args.ls_vfs_base_via == "env":
        subject_uri = f"file:{vname}?vfs=bpe{extra}"
        env["BPE_BASE_VFS"] = "litestream"
    else:
        subject_uri = f"file:{vname}?vfs=bpe&bpe_base=litestream{extra}"
    log(f"== {name}: writer on {db}, litestream replicate to file://{replica_dir}; readers through "
        f"{subject_uri}" + ("" if bpe else " (bpe arm OFF: plain Litestream VFS)") + f", controls through {control_uri}")
    log(f"   Litestream VFS: {lsvfs}")
    writer = MetaWriter(db, "wal", args.rows, autocheckpoint=0)
    ls = start([args.litestream, "replicate", "-config", cfg], os.path.join(root, "litestream.log"))
    wait_until(lambda: os.listdir(os.path.join(replica_dir, "ltx", "0")), "Litestream's first LTX file", 60)
    reads = [("long", subject_uri, True), ("fresh", subject_uri, False)]
    if CONTROL:
        reads = [("control_long", control_uri, True), reads[0], ("control_fresh", control_uri, False), reads[1]]
    request = [{"name": who, "uri": uri, "long": lg} for who, uri, lg in reads]
    oracle = StateOracle(writer, args.ls_vfs_fresh_bound)
    checks = {"reads": 0, "stale_rows": 0, "wrong_rows": 0, "control_stale_rows": 0,
              "bad_reads": 0, "control_bad_reads": 0}
    base, writes = Tally(), Tally()
    trace = []

    def do_round(rnd, tally, only=None):
        out = reader.ask(op="multi", reads=[r for r in request if only is None or r["name"] in only])
        row = {"round": rnd, "n": writer.n}
        bad = set()
        for who, _, lg in reads:
            if who not in out:
                continue
            scan = out[who]
            control = who.startswith("control")
            problems, want = oracle.check(who, scan, fresh=not lg)
            row[who] = [scan["meta"], scan["txid"], round(scan["ms"], 1),
                        scan["delta"]["Buffer cache hit ratio base"], scan["delta"]["Page reads/sec"]]
            if not control:
                checks["reads"] += 1
                tally.add(who, scan)
                tally.add("both", scan)
                if bpe and not lg and scan["delta"]["Buffer cache hit ratio base"] <= 0:
                    fail(f"{name} round {rnd}: the fresh bpe reader made no bpe page lookups (not on vfs=bpe?)")
            if problems:
                bad.add(who)
                stale, wrong = compare(want, scan["versions"]) if want else (0, len(scan["versions"]) or 1)
                if control:
                    checks["control_bad_reads"] += 1
                    checks["control_stale_rows"] += stale + wrong
                    fail(f"{name} round {rnd}: the {who} reader (plain Litestream VFS: the engine's fault): "
                         + "; ".join(problems))
                else:
                    checks["bad_reads"] += 1
                    checks["stale_rows"] += stale
                    checks["wrong_rows"] += wrong
                    fail(f"{name} round {rnd}: the {who} {'bpe' if bpe else 'subject'} reader: " + "; ".join(problems))
        trace.append(row)
        return out, bad

    reader = Reader(lib, os.path.join(root, "reader.log"), env_extra=env, extra_args=["--litestream-vfs", lsvfs])
    try:
        t0 = time.monotonic()
        do_round("warm-up", Tally())
        for rnd in range(args.baseline_rounds):
            do_round(f"baseline {rnd}", base)
        t1 = time.monotonic()
        rounds_run = 0
        for rnd in range(1, args.rounds + 1):
            writer.write(args.updates)
            do_round(rnd, writes)
            rounds_run = rnd
            if ls.poll() is not None:
                raise RuntimeError("litestream exited")
            if len(FAILURES) > 20:
                break
            time.sleep(args.ls_vfs_round_gap)
        t2 = time.monotonic()
        # Eventually fresh: after the last write, each reader (a new connection for the fresh ones)
        # until it shows the last write.
        target, committed = writer.n, writer.commit_times[writer.n]
        fresh_after, pending, gave_up = {}, {who for who, _, _ in reads}, set()
        while pending and time.monotonic() - committed < args.ls_vfs_fresh_bound + 5:
            out, bad = do_round("eventually fresh", Tally(), only=pending)
            gave_up |= bad  # failed already: not waited for (one failure each, not one a poll)
            pending -= bad
            for who, scan in out.items():
                if who in bad:
                    continue
                if scan["meta"] == target and scan["versions"] == writer.oracle:
                    fresh_after[who] = round(scan["t0"] + scan["ms"] / 1000 - committed, 3)
                    pending.discard(who)
            time.sleep(0.02)
        for who, _, _ in reads:
            s = fresh_after.get(who)
            if who in gave_up and s is None:
                continue
            if s is None or s > args.ls_vfs_fresh_bound:
                what = "never" if s is None else f"only after {s} s"
                if who.startswith("control"):
                    checks["control_bad_reads"] += 1
                    fail(f"{name}: the {who} reader (plain Litestream VFS: the engine's fault) showed the last "
                         f"write {what} (bound {args.ls_vfs_fresh_bound} s)")
                else:
                    fail(f"{name}: the {who} reader showed the last write {what} (bound {args.ls_vfs_fresh_bound} s)")
        totals = reader.ask(op="counters")
        res = {
            "bpe_arm": bpe,
            "compaction": args.ls_vfs_compaction,
            "subject_uri": subject_uri,
            "control_uri": control_uri if CONTROL else None,
            "litestream_vfs": lsvfs,
            "rows": len(writer.oracle),
            "updates_per_round": args.updates,
            "rounds": rounds_run,
            "writes": writer.n,
            "write_every_s": args.ls_vfs_round_gap,
            "baseline_rounds": args.baseline_rounds,
            "checks": checks,
            "oracle": oracle.summary(),
            "eventually_fresh_s": fresh_after,
            "eventually_fresh_not_waited_for": sorted(gave_up),  # failed a check while waited for
            "fresh_bound_s": args.ls_vfs_fresh_bound,
            "no_writes": base.summary(),
            "with_writes": writes.summary(),
            "bpe_counters_total": totals,
            "rounds_per_s": round(rounds_run / (t2 - t1), 2),
            "writes_per_s": round(writer.n / (t2 - t1), 2),
            "baseline_s": round(t1 - t0, 2),
            "rounds_s": round(t2 - t1, 2),
            "trace": trace,
        }
        for key in ("hit_ratio", "served_ratio"):
            b = res["no_writes"].get("both", {}).get(key)
            w = res["with_writes"].get("both", {}).get(key)
            if b and w is not None:
                res[key + "_kept"] = round(w / b, 4)
        stop(ls, timeout=60)
        with open(os.path.join(root, "litestream.log"), errors="replace") as f:
            res["litestream_log_errors"] = sum(1 for line in f if "level=ERROR" in line)
        try:
            with open(env["LITESTREAM_LOG_FILE"], errors="replace") as f:
                text = f.read()
            res["litestream_vfs_log"] = {lvl: text.count("level=" + lvl) for lvl in ("WARN", "ERROR")}
        except OSError:
            res["litestream_vfs_log"] = None
        res["name_created"] = os.path.exists(vname)  # the VFS ignores the name: a file there came from elsewhere
        if res["name_created"]:
            log(f"{name}: NOTE {vname} exists after the run (the Litestream VFS never creates it)")
        RESULTS[name] = res
    finally:
        reader.close()
        writer.c.close()
        stop(ls)
    log(json.dumps({k: v for k, v in RESULTS[name].items() if k != "trace"}, indent=1))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--litefs", default="litefs")
    ap.add_argument("--litestream", default="litestream")
    ap.add_argument("--engines", default=DEFAULT_ENGINES, help=f"of litefs, bindfs, litestream, litestream-vfs (default {DEFAULT_ENGINES})")
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
    ap.add_argument("--primary-seconds", type=float, default=4.0,
                    help="LiteFS primary and bindfs: seconds of commits per reader arm in the acknowledged-commit oracle (0: none)")
    ap.add_argument("--lost-header-rounds", type=int, default=10,
                    help="litefs (WAL): rounds whose replicated wal-index header is overwritten with the old one")
    ap.add_argument("--litestream-vfs", help="the Litestream VFS library (litestream-vfs.so; default: the litestream_vfs "
                    "package of the venv beside --litestream)")
    ap.add_argument("--ls-vfs-bpe", choices=("auto", "on", "off"), default=LITESTREAM_VFS_BPE_ARM,
                    help="litestream-vfs: read through vfs=bpe over the Litestream VFS (on), plain vfs=litestream (off), "
                    "or on when the library knows bpe_base (auto)")
    ap.add_argument("--ls-vfs-base-via", choices=("uri", "env"), default="uri",
                    help="litestream-vfs, bpe arm: name the base VFS in the URI (bpe_base=litestream) or in BPE_BASE_VFS")
    ap.add_argument("--ls-vfs-compaction", choices=("off", "default"), default="off",
                    help="litestream-vfs: Litestream's L1-L3 compaction during the run: off (intervals of 24 h and "
                    "more) or Litestream's default (L1 every 30 s), where 0.5.17's own long-lived VFS connections "
                    "fail the checks")
    ap.add_argument("--ls-vfs-round-gap", type=float, default=0.05, help="litestream-vfs: seconds between rounds")
    ap.add_argument("--ls-vfs-fresh-bound", type=float, default=15.0,
                    help="litestream-vfs: seconds after a write within which every reader must show it (reads "
                    "lagging more fail; after the last write, each reader is waited for up to this)")
    ap.add_argument("--ls-vfs-uri-params", default="",
                    help="litestream-vfs: more URI parameters for every reader, e.g. poll_interval=100ms (0.5.17 reads "
                    "replica_url, poll_interval, cache_size from the URI)")
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
                {"litefs": run_litefs, "litestream": run_litestream, "litestream-vfs": run_litestream_vfs,
                 "bindfs": run_bindfs}[e](args, lib)
            except Exception as ex:
                fail(f"{e}: {type(ex).__name__}: {ex}")
            log(f"-- {e}: {time.monotonic() - t:.1f} s")
    finally:
        cleanup()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"results": RESULTS, "primary": PRIMARY, "failures": FAILURES}, f, indent=1)
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
        if "oracle" in r:
            o = r["oracle"]
            log(
                f"{name}: {'bpe' if r['bpe_arm'] else 'bpe arm OFF (plain Litestream VFS)'}; bad reads "
                f"{c['bad_reads']}, control {c['control_bad_reads']}; "
                + "; ".join(
                    f"{who}: {x['reads']} reads, {x['distinct_states_seen']} states, lag max {x['lag_writes_max']} "
                    f"writes / {x['invisible_s_max']} s, {x['ms_per_read']} ms/read, last write after "
                    f"{r['eventually_fresh_s'].get(who)} s"
                    for who, x in o.items()
                )
            )
    for name, r in PRIMARY.items():
        log(
            f"{name}: {r['plain']['commits'] + r['bpe']['commits']} acknowledged commits, {r['lost']} lost"
            + (f", {r['replica_lost']} missing on the replica" if "replica_lost" in r else "")
            + "; " + "; ".join(
                f"beside {a} readers: writer errors {r[a]['writer_errors'] or 0}, reader errors "
                f"{r[a]['reader_errors'] or 0}, {r[a]['reads']} reads, whole-file forgets {r[a]['whole_file_forgets']}"
                for a in ("plain", "bpe")
            )
        )
    if FAILURES:
        log(f"{len(FAILURES)} failures")
        sys.exit(1)
    log("OK: 0 stale rows")


if __name__ == "__main__":
    main()
