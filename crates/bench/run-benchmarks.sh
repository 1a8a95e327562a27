#!/usr/bin/env bash
# Runs the benchmarks at the scales docs/BENCHMARKS.md reports, writing JSON to $OUT and plots to
# docs/img. Takes about an hour on a 2-core machine. Usage:
#   crates/bench/run-benchmarks.sh [lookup|scan|oltp|dw|autocommit|slowvol ...]   (default: all but
#   autocommit and slowvol; slowvol runs all four with their stock arms on throttled volumes)
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-bench-results}
WORK=${WORK:-$PWD/bpe-bench-work}
mkdir -p "$OUT" docs/img
cargo build --release -p sqlite-bpe-bench --bin bpe-bench
BIN=${BIN:-${CARGO_TARGET_DIR:-target}/release/bpe-bench}
# A copy, so that rebuilding while this runs does not change what runs.
cp "$BIN" "$OUT/bpe-bench"
B=("$OUT/bpe-bench")
run() { local name=$1; shift; "${B[@]}" "$@" --ext-dir "$WORK" --json "$OUT/$name.json" --plot "docs/img/$name.png" | tee "$OUT/$name.txt"; }

for what in "${@:-lookup scan oltp dw}"; do
  for w in $what; do
    case $w in
      lookup) run lookup-hdd lookup --data-device emulated:hdd ;;
      scan) run scan-hdd scan --data-device emulated:hdd ;;
      oltp) run oltp-gp3 oltp --data-device emulated:gp3 --warehouses "${WAREHOUSES:-10}" --seconds "${SECONDS_PER_CONFIG:-120}" ;;
      dw) run dw-san dw --data-device emulated:san --scale "${SCALE:-0.1}" ;;
      autocommit)
        run autocommit-2ms autocommit --data-device emulated:2ms
        run autocommit-real autocommit --data-device real ;;
      slowvol)
        # Every benchmark with its stock arm on a kernel-throttled slow volume the benchmark makes
        # itself (needs root): lookup and scan on slowvol:hdd (150 read IOPS, 200 MiB/s), oltp and
        # dw on slowvol:gp3 (3000 read IOPS, 125 MiB/s). Each volume is kept between the runs that
        # share it, so that each database loads once; the last run on it takes it down. ~30 min.
        H=(--data-device slowvol:hdd)
        G=(--data-device slowvol:gp3)
        run scan-slowvol scan "${H[@]}" --keep-volume
        run lookup-slowvol lookup "${H[@]}"
        run oltp-slowvol oltp "${G[@]}" --warehouses "${WAREHOUSES:-10}" --seconds "${SECONDS_PER_CONFIG:-60}" --keep-volume
        run dw-slowvol dw "${G[@]}" --scale "${SLOWVOL_SCALE:-0.02}" ;;
      *) echo "unknown benchmark $w" >&2; exit 2 ;;
    esac
  done
done
