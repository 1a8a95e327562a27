#!/usr/bin/env bash
# Two builds side by side on the lookup's gap to the physical limit: `ram_resident` and
# `limited_memory_bpe` (200,000 rows, 32 MB + 512 MB extension, 100,000 lookups, emulated ssd
# data device), each run measuring the 4 KiB QD1 read of the extension's disk beside
# limited_memory_bpe. Rounds alternate which build goes first, so that the disk's drift falls
# on both. Prints per round and per build: the time per lookup, the probe's read, the L2 request
# as the core timed it, the in-RAM lookup, what is left (the engine's miss path: per lookup less
# its L2 requests and the in-RAM lookup) and measured / limit; then the medians.
#
#   tools/bench/ab-lookup.sh BIN_A BIN_B [ROUNDS]
set -euo pipefail
a=$1
b=$2
rounds=${3:-5}
work=${BPE_WORK:-./bpe-bench-work}
out="$work/ab-lookup"
mkdir -p "$out"
rm -f "$out"/*.json
run() { # arm binary round
  "$2" bench lookup --data-device emulated:ssd --rows 200000 --lookups 100000 --memory-mb 32 \
    --extension-mb 512 --configs ram_resident,limited_memory_bpe --reference-mib 256 \
    --ext-dir "$work" --json "$out/$1-$3.json" >/dev/null
}
for round in $(seq 1 "$rounds"); do
  if ((round % 2)); then run a "$a" "$round"; run b "$b" "$round"
  else run b "$b" "$round"; run a "$a" "$round"; fi
done
python3 - "$out" <<'PY'
import glob, json, statistics, sys
out = sys.argv[1]
rows = {"a": [], "b": []}
for arm in rows:
    for f in sorted(glob.glob(f"{out}/{arm}-*.json"), key=lambda f: int(f.rsplit("-", 1)[1][:-5])):
        p = json.load(open(f))["summary"]["physical_limit"]
        miss = p["per_lookup_us"] - p["l2_request_us_per_lookup"] - p["ram_lookup_us"]
        rows[arm].append((f.rsplit("-", 1)[1][:-5], p["per_lookup_us"], p["device_read_latency_us"],
                          p["l2_reads_per_lookup"], p["ram_lookup_us"], p["l2_request_us"],
                          p["bpe_over_limit"], miss))
for arm, rs in rows.items():
    for r in rs:
        print(f"{arm} round {r[0]}: {r[1]:.1f} us/lookup, probe {r[2]:.1f} us, {r[3]:.2f} L2 "
              f"reads/lookup, RAM {r[4]:.1f} us, L2 request {r[5]:.1f} us, miss path {r[7]:.2f} us, "
              f"over limit {r[6]:.3f}")
for arm, rs in rows.items():
    if rs:
        med = lambda i: statistics.median(r[i] for r in rs)
        print(f"{arm}: median {med(1):.1f} us/lookup, probe {med(2):.1f} us, L2 request "
              f"{med(5):.1f} us, RAM {med(4):.1f} us, miss path {med(7):.2f} us, over limit "
              f"{med(6):.3f} ({len(rs)} rounds)")
PY
