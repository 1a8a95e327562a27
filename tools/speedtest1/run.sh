#!/usr/bin/env bash
# SQLite's own performance test program, speedtest1, through the bpe VFS and through the unix
# VFS, with one binary: speedtest1.c (from Debian's sqlite3 source package) and the SQLite 3.50
# amalgamation bundled by libsqlite3-sys (the SQLite the Rust side links), with
# bpe_speedtest_init.c compiled in as SQLITE_EXTRA_INIT. With BPE_SPEEDTEST_LIB set, the binary
# loads target/release/libsqlite_bpe.so at startup and runs with `--vfs bpe`; without it, it is
# stock SQLite.
#
# For each journal mode and each repetition, unix then bpe run `speedtest1 --size N` on a fresh
# database on disk (not /tmp, which may be tmpfs); the table gives the median per test over the
# repetitions, side by side, the totals and bpe / unix.
#
# Usage: tools/speedtest1/run.sh [--quick] [--size N] [--repeat N] [--journal "delete wal"]
#            [--memory-mb N] [--cachesize N] [--testset T] [--no-install] [--no-build]
#            [--out DIR] [-- EXTRA SPEEDTEST1 OPTIONS]
#
#   --quick         --size 25, one repetition (a minute or so)
#   --size N        speedtest1's relative size (default 200)
#   --repeat N      runs per VFS and journal mode, alternating unix and bpe (default 3)
#   --journal M     journal modes to run (default "delete wal"; delete is SQLite's default)
#   --memory-mb N   BPE_MAX_SERVER_MEMORY_MB for bpe (default 1024: all of the database cached)
#   --cachesize N   speedtest1 --cachesize N (SQLite's page cache, pages; default: SQLite's
#                   own default, 2 MB, for both VFSes)
#   --out DIR       where the outputs and speedtest1.json go (default target/speedtest1/runs/<time>)
#
# Environment: BPE_SPEEDTEST_DIR (cache of sources and the build; default target/speedtest1),
# SPEEDTEST1_C (use this speedtest1.c instead of fetching Debian's source package),
# BPE_DATA_* (emulated device) / BPE_EXTENSION_FILE / BPE_EXTENSION_SIZE / BPE_DIRECT_IO
# are passed to the bpe runs as they are.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
ST_DIR=${BPE_SPEEDTEST_DIR:-$REPO/target/speedtest1}

SIZE=200
REPEAT=3
JOURNALS="delete wal"
MEMORY_MB=1024
CACHESIZE=""
TESTSET=""
INSTALL=1
BUILD=1
OUT=""
EXTRA=()
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) SIZE=25; REPEAT=1 ;;
    --size) SIZE="$2"; shift ;;
    --repeat) REPEAT="$2"; shift ;;
    --journal) JOURNALS="$2"; shift ;;
    --memory-mb) MEMORY_MB="$2"; shift ;;
    --cachesize) CACHESIZE="$2"; shift ;;
    --testset) TESTSET="$2"; shift ;;
    --no-install) INSTALL=0 ;;
    --no-build) BUILD=0 ;;
    --out) OUT="$2"; shift ;;
    --) shift; EXTRA=("$@"); break ;;
    -h|--help) sed -n '2,32p' "$0"; exit 0 ;;
    *) echo "run.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done

log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
. "$HERE/../sqlite-source.sh"
mkdir -p "$ST_DIR"

# ---------------------------------------------------------------------------------------------
# 1. Packages: a C compiler, python3 (the table), and dpkg-source with deb-src to fetch SQLite.
if [ "$INSTALL" = 1 ]; then
  src_root=$ST_DIR/src
  [ -n "${SPEEDTEST1_C:-}" ] && src_root=""   # no source package needed
  install_packages "$src_root" build-essential dpkg-dev xz-utils python3
fi

# ---------------------------------------------------------------------------------------------
# 2. Sources: speedtest1.c (Debian's sqlite3 source package, as released upstream) and the
#    amalgamation of libsqlite3-sys.
if [ -n "${SPEEDTEST1_C:-}" ]; then
  ST_C=$SPEEDTEST1_C
else
  sqlite_source_tree "$ST_DIR/src"
  ST_C="$SQLITE_TREE/test/speedtest1.c"
fi
[ -f "$ST_C" ] || { echo "run.sh: no speedtest1.c at $ST_C" >&2; exit 1; }
AMAL_DIR=$(ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/libsqlite3-sys-0.35*/sqlite3 2>/dev/null \
  | sort -V | tail -1 || true)
if [ -z "$AMAL_DIR" ]; then
  ( cd "$REPO" && cargo fetch -q )
  AMAL_DIR=$(ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/libsqlite3-sys-0.35*/sqlite3 | sort -V | tail -1)
fi
SQLITE_VERSION=$(grep -m1 '#define SQLITE_VERSION ' "$AMAL_DIR/sqlite3.h" | awk '{print $3}' | tr -d '"')

# ---------------------------------------------------------------------------------------------
# 3. Build: speedtest1 (cached in $ST_DIR) and the extension.
BIN="$ST_DIR/speedtest1"
INIT_C="$HERE/bpe_speedtest_init.c"
if [ "$BUILD" = 1 ]; then
  if [ ! -x "$BIN" ] || [ "$ST_C" -nt "$BIN" ] || [ "$INIT_C" -nt "$BIN" ] \
      || [ "$HERE/../bpe_load_extension.h" -nt "$BIN" ] || [ "$AMAL_DIR/sqlite3.c" -nt "$BIN" ] \
      || [ "$0" -nt "$BIN" ]; then
    log "building speedtest1 (SQLite $SQLITE_VERSION amalgamation, $ST_C)"
    gcc -O2 -g -I"$AMAL_DIR" -DSQLITE_THREADSAFE=1 -DSQLITE_EXTRA_INIT=bpe_speedtest_init \
      -o "$BIN.tmp" "$ST_C" "$AMAL_DIR/sqlite3.c" "$INIT_C" -ldl -lpthread -lm
    mv "$BIN.tmp" "$BIN"
  fi
  log "cargo build --release -p sqlite-bpe"
  ( cd "$REPO" && cargo build --release -p sqlite-bpe -q )
fi
LIB="$("$REPO/tools/cargo-target-dir.sh")/release/libsqlite_bpe.so"
[ -x "$BIN" ] || { echo "no $BIN (run without --no-build)" >&2; exit 1; }
[ -f "$LIB" ] || { echo "no $LIB (run without --no-build)" >&2; exit 1; }

# ---------------------------------------------------------------------------------------------
# 4. Runs, alternating unix and bpe so that a change in the machine's load hits both.
OUT=${OUT:-$ST_DIR/runs/$(date +%Y%m%d-%H%M%S)}
WORK="$ST_DIR/work"
mkdir -p "$OUT" "$WORK"
args=(--size "$SIZE")
[ -n "$CACHESIZE" ] && args+=(--cachesize "$CACHESIZE")
[ -n "$TESTSET" ] && args+=(--testset "$TESTSET")
args+=("${EXTRA[@]}")
{
  echo "speedtest1: $ST_C"
  echo "SQLite: $SQLITE_VERSION ($AMAL_DIR/sqlite3.c)"
  echo "options: ${args[*]}; bpe: BPE_MAX_SERVER_MEMORY_MB=$MEMORY_MB --vfs bpe"
  echo "database dir: $WORK ($(df -T "$WORK" | awk 'NR==2{print $2}'))"
  echo "machine: $(nproc) cores, $(uname -r)"
} > "$OUT/setup.txt"
cat "$OUT/setup.txt" >&2
for j in $JOURNALS; do
  jargs=()
  [ "$j" != delete ] && jargs=(--journal "$j")
  for rep in $(seq 1 "$REPEAT"); do
    for vfs in unix bpe; do
      db="$WORK/speedtest1-$vfs.db"
      rm -f "$db" "$db-journal" "$db-wal" "$db-shm"
      out="$OUT/$j-$vfs-$rep.txt"
      load=$(cut -d' ' -f1 /proc/loadavg)
      log "$j $vfs run $rep/$REPEAT (load $load)"
      if [ "$vfs" = bpe ]; then
        BPE_SPEEDTEST_LIB="$LIB" BPE_MAX_SERVER_MEMORY_MB="$MEMORY_MB" \
          "$BIN" "${args[@]}" "${jargs[@]}" --vfs bpe "$db" > "$out"
      else
        env -u BPE_SPEEDTEST_LIB "$BIN" "${args[@]}" "${jargs[@]}" "$db" > "$out"
      fi
      echo "-- load average before the run: $load, after: $(cut -d' ' -f1 /proc/loadavg)" >> "$out"
      rm -f "$db" "$db-journal" "$db-wal" "$db-shm"
    done
  done
done

# ---------------------------------------------------------------------------------------------
# 5. The table: median seconds per test over the repetitions, bpe / unix.
python3 - "$OUT" "$JOURNALS" "$REPEAT" "$SQLITE_VERSION" <<'EOF'
import json, os, re, statistics, sys
out, journals, repeat, version = sys.argv[1], sys.argv[2].split(), int(sys.argv[3]), sys.argv[4]
line = re.compile(r'^\s*(\d+) - (.*?)\.*\s+([\d.]+)s\s*$')
total = re.compile(r'^\s*TOTAL\.*\s+([\d.]+)s\s*$')
def parse(path):
    tests, tot = {}, None
    for l in open(path):
        m = line.match(l)
        if m:
            tests[int(m.group(1))] = (m.group(2).strip(), float(m.group(3)))
        m = total.match(l)
        if m:
            tot = float(m.group(1))
    return tests, tot
result = {"sqlite": version, "repeat": repeat, "journals": {}}
for j in journals:
    runs = {v: [parse(os.path.join(out, f"{j}-{v}-{r}.txt")) for r in range(1, repeat + 1)]
            for v in ("unix", "bpe")}
    names = {}
    for v in runs:
        for tests, _ in runs[v]:
            for k, (name, _) in tests.items():
                names[k] = name
    rows = []
    for k in sorted(names):
        med = {v: statistics.median([t[k][1] for t, _ in runs[v] if k in t]) for v in runs}
        rows.append({"test": k, "name": names[k], "unix_s": med["unix"], "bpe_s": med["bpe"],
                     "ratio": med["bpe"] / med["unix"] if med["unix"] > 0 else None})
    tot = {v: statistics.median([t for _, t in runs[v] if t is not None]) for v in runs}
    tot_all = {v: [t for _, t in runs[v]] for v in runs}
    mins = {v: min(tot_all[v]) for v in runs}
    result["journals"][j] = {"tests": rows, "total_unix_s": tot["unix"], "total_bpe_s": tot["bpe"],
                             "total_ratio": tot["bpe"] / tot["unix"], "totals_unix_s": tot_all["unix"],
                             "totals_bpe_s": tot_all["bpe"],
                             "min_total_ratio": mins["bpe"] / mins["unix"]}
    print(f"\n== journal_mode={j}: median of {repeat} run(s), seconds")
    print(f"{'test':>5}  {'what':<58} {'unix':>8} {'bpe':>8} {'bpe/unix':>8}")
    for r in rows:
        ratio = f"{r['ratio']:.2f}" if r["ratio"] is not None else "-"
        print(f"{r['test']:>5}  {r['name'][:58]:<58} {r['unix_s']:>8.3f} {r['bpe_s']:>8.3f} {ratio:>8}")
    t = result["journals"][j]
    print(f"{'':>5}  {'TOTAL':<58} {t['total_unix_s']:>8.3f} {t['total_bpe_s']:>8.3f} {t['total_ratio']:>8.2f}")
    print(f"       totals of each run: unix {tot_all['unix']}, bpe {tot_all['bpe']}; "
          f"fastest bpe / fastest unix = {mins['bpe'] / mins['unix']:.2f}")
json.dump(result, open(os.path.join(out, "speedtest1.json"), "w"), indent=1)
print(f"\noutputs and speedtest1.json in {out}")
for j in journals:
    t = result["journals"][j]
    target = " (target <= 1.1)" if j == "delete" else ""
    print(f"{j}: total bpe / unix = {t['total_ratio']:.2f} (medians), "
          f"{t['min_total_ratio']:.2f} (fastest runs){target}")
EOF
