#!/usr/bin/env bash
# Runs the benchmarks at the scales docs/BENCHMARKS.md reports, writing JSON to $OUT and plots to
# docs/img. Takes about an hour on a 2-core machine. Usage:
#   crates/bench/run-benchmarks.sh [lookup|scan|oltp|dw|autocommit|slowvol ...]   (default: all but
#   autocommit and slowvol)
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
        # The kernel-throttled slow volume the benchmark makes itself (150 read IOPS, 200 MiB/s;
        # needs root), kept between these runs so that each database loads once; the last run
        # takes it down. Stock SQLite runs beside bpe there by default.
        V=(--data-device slowvol:hdd)
        run lookup-slowvol lookup "${V[@]}" --keep-volume
        run scan-slowvol scan "${V[@]}" --keep-volume
        # 195 MB table, 16 MB of memory, 512 MB extension, both journal modes.
        run lookup-slowvol-stock-wal lookup --quick --rows 200000 --extension-mb 512 --journal wal "${V[@]}" --keep-volume
        run lookup-slowvol-stock-delete lookup --quick --rows 200000 --extension-mb 512 --journal delete "${V[@]}" ;;
      *) echo "unknown benchmark $w" >&2; exit 2 ;;
    esac
  done
done
