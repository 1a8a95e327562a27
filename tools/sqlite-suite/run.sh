#!/usr/bin/env bash
# SQLite's own TCL test suite as an outside oracle for the bpe VFS.
#
# Builds SQLite's `testfixture` (from Debian's sqlite3 source package, i.e. the upstream tree
# with test/) with bpe_suite_init.c compiled in as SQLITE_EXTRA_INIT, builds our loadable
# extension, then runs each chosen test file twice, in its own scratch directory on disk:
#
#   baseline   testfixture as is: SQLite's unix VFS
#   bpe        BPE_SUITE_LIB=target/release/libsqlite_bpe.so: bpe is the default VFS
#
# and compares the failing test cases. A bpe-only failure that tools/sqlite-suite/
# expected-failures.txt does not list makes the script exit 1.
#
# Usage: tools/sqlite-suite/run.sh [--quick | --extended | --full | --files "a.test b.test ..." |
#            --list FILE]
#            [--sqlite 3.40|3.50] [--jobs N] [--timeout SECONDS] [--children bpe|plain]
#            [--no-install] [--no-build] [--keep] [--name RUN-NAME]
#
#   --quick         the CI subset (tools/sqlite-suite/quick.txt); the default
#   --extended      CI's second subset (tools/sqlite-suite/extended.txt): the wal*, pager*,
#                   ioerr* and crash* files beyond --quick that fit CI's time
#   --full          every test/*.test (less the meta files that run other files)
#   --files/--list  these test files (names relative to SQLite's test/ directory)
#   --sqlite 3.50   the testfixture built against the bundled 3.50 amalgamation of
#                   libsqlite3-sys (test/*.test and src/test*.c still from the 3.40 tree)
#   --children      what processes that a test spawns (second clients, crash children) use:
#                   plain (default: the unix VFS, so bpe shares its files with plain SQLite
#                   processes and its cross-process change detection is exercised) or bpe (they
#                   inherit BPE_SUITE_LIB, and are refused by the
#                   one-bpe-process-per-file rule: whole files then abort)
#   --timeout       per test file and mode (default 600 s; a timeout counts as a failure)
#   --name          results go to $BPE_SUITE_DIR/runs/<sqlite>-<name>-<children> (default: the mode)
#   --keep          keep each test's scratch files (default: only its output)
#   --reuse-baseline DIR  take the baseline results from an earlier run directory
#                   ($BPE_SUITE_DIR/runs/...) where it has them, and run only bpe for those files
#
# Environment: BPE_SUITE_DIR (cache: sources, builds, scratch; default target/sqlite-suite),
# BPE_MAX_SERVER_MEMORY_MB, BPE_EXTENSION_FILE/SIZE, BPE_DIRECT_IO are passed to the bpe runs.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
SUITE_DIR=${BPE_SUITE_DIR:-$REPO/target/sqlite-suite}

MODE=quick
FILES=""
SQLITE_VARIANT=3.40
JOBS=$(nproc 2>/dev/null || echo 2)
TIMEOUT=600
CHILDREN=plain
INSTALL=1
BUILD=1
KEEP=0
NAME=""
REUSE_BASELINE=""
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) MODE=quick ;;
    --extended) MODE=extended ;;
    --full) MODE=full ;;
    --files) MODE=files; FILES="$2"; shift ;;
    --list) MODE=files; FILES="$(grep -v '^\s*#' "$2" | sed 's/#.*//' | xargs)"; shift ;;
    --sqlite) SQLITE_VARIANT="$2"; shift ;;
    --jobs) JOBS="$2"; shift ;;
    --timeout) TIMEOUT="$2"; shift ;;
    --children) CHILDREN="$2"; shift ;;
    --no-install) INSTALL=0 ;;
    --no-build) BUILD=0 ;;
    --keep) KEEP=1 ;;
    --name) NAME="$2"; shift ;;
    --reuse-baseline) REUSE_BASELINE="$2"; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
    *) echo "run.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
case "$CHILDREN" in bpe|plain) ;; *) echo "--children bpe|plain" >&2; exit 2 ;; esac
case "$SQLITE_VARIANT" in 3.40|3.50) ;; *) echo "--sqlite 3.40|3.50" >&2; exit 2 ;; esac

log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
. "$HERE/../sqlite-source.sh"
phase_start=$(date +%s)
phase() {
  local now; now=$(date +%s)
  log "phase done in $((now - phase_start)) s; next: $*"
  phase_start=$now
}

mkdir -p "$SUITE_DIR"

# ---------------------------------------------------------------------------------------------
# 1. Packages: a C compiler, Tcl's headers, zlib, dpkg-source, and deb-src to fetch SQLite.
if [ "$INSTALL" = 1 ]; then
  install_packages "$SUITE_DIR/src" build-essential tcl-dev zlib1g-dev dpkg-dev xz-utils
fi

# ---------------------------------------------------------------------------------------------
# 2. SQLite's source tree (Debian's sqlite3 source package, without Debian's patches: upstream
#    as released, so that the baseline is upstream's own).
SRC_ROOT="$SUITE_DIR/src"
sqlite_source_tree "$SRC_ROOT"
TREE=$SQLITE_TREE
TESTDIR="$TREE/test"
log "SQLite tree: $TREE"

# ---------------------------------------------------------------------------------------------
# 3. testfixture.
INIT_C="$HERE/bpe_suite_init.c"
BUILD_40="$SUITE_DIR/build-$(basename "$TREE" | sed 's/^sqlite-src-//')"
build_testfixture_340() {
  mkdir -p "$BUILD_40"
  if [ ! -f "$BUILD_40/Makefile" ]; then
    phase "configure (3.40 tree)"
    ( cd "$BUILD_40" && "$TREE/configure" --with-tcl=/usr/lib/tcl8.6 --enable-all \
        > configure.log 2>&1 )
  fi
  phase "make testfixture (3.40 tree)"
  # One compiler run of the amalgamation and the test sources: -j does not help much.
  ( cd "$BUILD_40" && make -j"$JOBS" testfixture \
      OPTS="-DSQLITE_EXTRA_INIT=bpe_suite_init" \
      TESTFIXTURE_SRC1="sqlite3.c $INIT_C" > make.log 2>&1 ) \
    || { tail -30 "$BUILD_40/make.log" >&2; exit 1; }
}

# The bundled 3.50 amalgamation of libsqlite3-sys with the 3.40 tree's test sources: the test
# C files use a few internals (sqliteInt.h) whose layout changed, so they are compiled against
# the 3.50 headers made from the amalgamation (see build350.sh for what had to be adapted).
BUILD_50="$SUITE_DIR/build-3.50"
build_testfixture_350() {
  phase "build testfixture (3.50 amalgamation)"
  TREE="$TREE" BUILD_40="$BUILD_40" BUILD_50="$BUILD_50" INIT_C="$INIT_C" \
    bash "$HERE/build350.sh" || exit 1
}

if [ "$BUILD" = 1 ]; then
  build_testfixture_340
  [ "$SQLITE_VARIANT" = 3.50 ] && build_testfixture_350
  phase "cargo build --release -p sqlite-bpe"
  ( cd "$REPO" && cargo build --release -p sqlite-bpe -q )
fi
if [ "$SQLITE_VARIANT" = 3.50 ]; then TF="$BUILD_50/testfixture"; else TF="$BUILD_40/testfixture"; fi
LIB="${CARGO_TARGET_DIR:-$REPO/target}/release/libsqlite_bpe.so"
[ -x "$TF" ] || { echo "no testfixture at $TF (run without --no-build)" >&2; exit 1; }
[ -f "$LIB" ] || { echo "no $LIB (run without --no-build)" >&2; exit 1; }

# ---------------------------------------------------------------------------------------------
# 4. The test files.
case "$MODE" in
  quick|extended) FILES=$(grep -v '^\s*#' "$HERE/$MODE.txt" | sed 's/#.*//' | xargs) ;;
  full)
    # permutations.test's "full" set: every test/*.test but the files that run others.
    FILES=$(cd "$TESTDIR" && ls *.test | grep -v -x -F \
      -e all.test -e async.test -e quick.test -e veryquick.test -e memleak.test \
      -e permutations.test -e soak.test -e fts3.test -e mallocAll.test -e rtree.test \
      -e full.test -e extraquick.test -e session.test -e rbu.test | xargs) ;;
esac
for f in $FILES; do
  [ -f "$TESTDIR/$f" ] || { echo "run.sh: no test file $TESTDIR/$f" >&2; exit 2; }
done

RUN_DIR="$SUITE_DIR/runs/$SQLITE_VARIANT-${NAME:-$MODE}-$CHILDREN"
rm -rf "$RUN_DIR"
mkdir -p "$RUN_DIR"
TIMES="$SUITE_DIR/times-$SQLITE_VARIANT.tsv"   # seconds per file from earlier runs: longest first
touch "$TIMES"

# Job list "file mode", longest files (by earlier runs) first, each file's two modes together.
python3 - "$TIMES" $FILES > "$RUN_DIR/jobs" <<'EOF'
import sys
times = {}
for line in open(sys.argv[1]):
    p = line.split('\t')
    if len(p) >= 2:
        try: times[p[0]] = max(times.get(p[0], 0), float(p[1]))
        except ValueError: pass
files = sys.argv[2:]
files.sort(key=lambda f: -times.get(f, 1e9))  # unknown first: they may be long
for f in files:
    print(f, "baseline"); print(f, "bpe")
EOF

if [ -n "$REUSE_BASELINE" ]; then
  mkdir -p "$RUN_DIR/baseline"
  while read -r f mode; do
    src="$REUSE_BASELINE/baseline/${f//\//_}"
    if [ "$mode" = baseline ] && [ -f "$src/status" ]; then
      cp -r "$src" "$RUN_DIR/baseline/"
    else
      echo "$f $mode"
    fi
  done < "$RUN_DIR/jobs" > "$RUN_DIR/jobs.left"
  mv "$RUN_DIR/jobs.left" "$RUN_DIR/jobs"
fi

run_one() {  # file mode
  local f=$1 mode=$2 dir rc start end
  dir="$RUN_DIR/$mode/${f//\//_}"
  mkdir -p "$dir"
  start=$(date +%s.%N)
  set +e
  if [ "$mode" = bpe ]; then
    ( cd "$dir" && env BPE_SUITE_LIB="$LIB" BPE_SUITE_CHILDREN="$CHILDREN" \
        timeout -k 10 "$TIMEOUT" "$TF" "$TESTDIR/$f" > out.txt 2>&1 < /dev/null )
  else
    ( cd "$dir" && env -u BPE_SUITE_LIB \
        timeout -k 10 "$TIMEOUT" "$TF" "$TESTDIR/$f" > out.txt 2>&1 < /dev/null )
  fi
  rc=$?
  set -e
  end=$(date +%s.%N)
  printf '%s\t%s\t%s\t%.1f\n' "$f" "$mode" "$rc" "$(echo "$end - $start" | bc)" > "$dir/status"
  printf '%-28s %-8s rc=%-3s %6.1fs\n' "$f" "$mode" "$rc" "$(echo "$end - $start" | bc)" >&2
  if [ "$KEEP" = 0 ]; then
    # Keep only the output: test databases can be large.
    find "$dir" -mindepth 1 -maxdepth 1 ! -name out.txt ! -name status -exec rm -rf {} +
  fi
}
export -f run_one
export RUN_DIR TF TESTDIR LIB TIMEOUT CHILDREN KEEP

n=$(wc -w <<< "$FILES")
phase "running $n test files x 2 modes, $JOBS at a time, timeout ${TIMEOUT}s ($RUN_DIR)"
command -v bc >/dev/null || { [ "$INSTALL" = 1 ] && apt-get install -y -q bc >/dev/null; }
xargs -P "$JOBS" -L 1 bash -c 'run_one "$0" "$1"' < "$RUN_DIR/jobs"
phase "comparing"

# Remember the times (the slower of the two modes) for ordering the next run.
python3 - "$TIMES" "$RUN_DIR" <<'EOF'
import sys, glob, os
times = {}
for line in open(sys.argv[1]):
    p = line.rstrip('\n').split('\t')
    if len(p) >= 2: times[p[0]] = float(p[1])
new = {}
for st in glob.glob(os.path.join(sys.argv[2], '*', '*', 'status')):
    f, mode, rc, secs = open(st).read().strip().split('\t')
    new[f] = max(new.get(f, 0.0), float(secs))
times.update(new)
with open(sys.argv[1], 'w') as out:
    for f, s in sorted(times.items()): out.write(f"{f}\t{s:.1f}\n")
EOF

set +e
python3 "$HERE/compare.py" --run-dir "$RUN_DIR" --expected "$HERE/expected-failures.txt" \
  --timeout "$TIMEOUT" --children "$CHILDREN" $FILES
rc=$?
set -e
phase "end (exit $rc)"
exit $rc
