#!/usr/bin/env bash
# Instructions per lookup, bpe beside stock SQLite, counted by callgrind: the CPU work of a
# fits-in-memory point lookup (`bench autocommit`) without this machine's timing noise (single
# runs of the same pair move far more than the differences sought; the counts repeat). Each
# configuration's process runs under callgrind, which counts only inside the measured loop
# (`ConfigResult::measure`); a count is that loop's instructions over its lookups. The loop runs
# much slower under callgrind, so it does only a small share of its usual lookups.
#
#   cargo build --release && tools/bench/instructions.sh [CONFIGS] [SECONDS]
#
# CONFIGS: `bench autocommit` configurations, comma-separated (default: both journal modes,
# autocommit, bpe and stock). Prints one line per configuration, then bpe over stock for each
# pair, and leaves the callgrind files (for callgrind_annotate) in the directory it names.
set -euo pipefail
configs=${1:-wal_autocommit,stock_wal_autocommit,rollback_autocommit,stock_rollback_autocommit}
seconds=${2:-3}
bin=${BPE_BIN:-$("$(dirname "$0")/../cargo-target-dir.sh")/release/sqlite-bpe}
command -v valgrind >/dev/null || { echo "valgrind is missing (apt-get install valgrind)" >&2; exit 1; }
out=$(mktemp -d /tmp/bpe-instructions.XXXXXX)
BPE_BENCH_CHILD_WRAPPER="valgrind --tool=callgrind --callgrind-out-file=$out/callgrind.%q{BPE_BENCH_CONFIG} --toggle-collect=bpe_bench::report::ConfigResult::measure*" \
  "$bin" bench autocommit --data-device real --seconds "$seconds" --reference-mib 0 \
  --configs "$configs" --json "$out/result.json" >"$out/log" 2>&1 ||
  { echo "the benchmark failed; its output is in $out/log" >&2; exit 1; }
python3 - "$out" <<'EOF'
import json, re, sys
out = sys.argv[1]
report = json.load(open(f"{out}/result.json"))
per = {}
for r in report["configs"]:
    text = open(f"{out}/callgrind.{r['name']}").read()
    instructions = int(re.search(r"^(?:summary|totals): (\d+)", text, re.M).group(1))
    per[r["name"]] = instructions / r["operations"]
    print(f"{r['name']:28} {r['operations']:>8} lookups  {per[r['name']]:8.0f} instructions a lookup")
for name, n in per.items():
    # An arm that varies bpe alone (`*_sql_on_demand`) is held against its stock arm.
    stock = "stock_" + name.removesuffix("_sql_on_demand")
    if stock in per and not name.startswith("stock_"):
        print(f"{name}: bpe / stock instructions {n / per[stock]:.3f}")
print(f"callgrind files: {out}")
EOF
