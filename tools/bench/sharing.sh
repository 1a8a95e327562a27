#!/usr/bin/env bash
# A shared extension against a private one, side by side (the shared path's cost per
# lookup and per write). Rounds alternate which arm runs first, so that the disk's drift over
# the run falls on both. In-process emulated ssd data device (100 us per read, 1 ms per sync);
# lookup: limited_memory_bpe (200,000 rows, 32 MB + 512 MB extension); oltp: memory_25_bpe
# (2 warehouses, 20 s). Prints each round's shared/private throughput and their geometric mean.
#
#   cargo build --release && tools/bench/sharing.sh [ROUNDS] [lookup|oltp|both]
set -euo pipefail
rounds=${1:-10}
which=${2:-both}
bin=${BPE_BIN:-$("$(dirname "$0")/../cargo-target-dir.sh")/release/sqlite-bpe}
work=${BPE_WORK:-./bpe-bench-work}
out="$work/sharing"
mkdir -p "$out"
rm -f "$out"/*.json
run() { # bench sharing round
  case $1 in
    lookup) BPE_EXTENSION_SHARED=$2 "$bin" bench lookup --data-device emulated:ssd --rows 200000 \
      --lookups 100000 --memory-mb 32 --extension-mb 512 --configs limited_memory_bpe \
      --reference-mib 0 --ext-dir "$work" --json "$out/$1-$2-$3.json" >/dev/null ;;
    oltp) BPE_EXTENSION_SHARED=$2 "$bin" bench oltp --data-device emulated:ssd --warehouses 2 \
      --seconds 20 --configs memory_25_bpe --reference-mib 0 --ext-dir "$work" \
      --json "$out/$1-$2-$3.json" >/dev/null ;;
  esac
}
benches=(lookup oltp)
[[ $which == both ]] || benches=("$which")
for round in $(seq 1 "$rounds"); do
  order="0 1"
  ((round % 2)) || order="1 0"
  for bench in "${benches[@]}"; do
    for sharing in $order; do run "$bench" "$sharing" "$round"; done
  done
done
python3 - "$out" <<'PY'
import glob, json, math, statistics, sys
out = sys.argv[1]
for bench in ["lookup", "oltp"]:
    arms = {}
    for sharing in "01":
        arms[sharing] = {}
        for f in glob.glob(f"{out}/{bench}-{sharing}-*.json"):
            c = json.load(open(f))["configs"][0]
            arms[sharing][f.rsplit("-", 1)[1]] = c["operations"] / c["seconds"]
    rounds = sorted(set(arms["0"]) & set(arms["1"]))
    if not rounds:
        continue
    ratios = [arms["1"][r] / arms["0"][r] for r in rounds]
    gm = math.exp(sum(map(math.log, ratios)) / len(ratios))
    print(f"{bench}: private median {statistics.median(arms['0'].values()):.0f}/s, shared median "
          f"{statistics.median(arms['1'].values()):.0f}/s; shared/private per round "
          f"{' '.join(f'{x:.2f}' for x in ratios)}; geometric mean {gm:.3f}")
PY
