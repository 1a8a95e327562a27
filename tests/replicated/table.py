"""Markdown table of a replicated.py --json file (the figures in docs/BENCHMARKS.md).

  python3 tests/replicated/table.py results.json [more.json ...]
"""

import json
import sys

print(
    "| setup | writes | writes/s | served from the pool, no writes | with writes | kept | "
    "Buffer cache hit ratio (no writes / writes) | pages read from the file per write | "
    "whole-file forgets | pages forgotten | stale rows |"
)
print("|---|---|---|---|---|---|---|---|---|---|---|")
races = []
for path in sys.argv[1:]:
    doc = json.load(open(path))
    for name, r in doc["results"].items():
        b = r["no_writes"].get("both", {})
        w = r["with_writes"].get("both", {})
        writes = r["writes"] or 1
        c = r["checks"]
        print(
            f"| {name} | {r['writes']} in {r['rounds']} rounds | {r['writes_per_s']} | "
            f"{b.get('served_ratio')} | {w.get('served_ratio')} | {r.get('served_ratio_kept')} | "
            f"{b.get('hit_ratio')} / {w.get('hit_ratio')} | {w.get('file_reads', 0) / writes:.0f} | "
            f"{w.get('file_forgets')} | {w.get('pages_forgotten')} | {c['stale_rows'] + c['wrong_rows']} |"
        )
        if "race" in r:
            races.append((name, r["race"]))
if races:
    print()
    print("| setup (race) | seconds | writes | bpe reads | stale reads | torn reads | max lag (writes) | served from the pool |")
    print("|---|---|---|---|---|---|---|---|")
    for name, x in races:
        print(
            f"| {name} | {x['seconds']} | {x['writes']} | {x['reads']} | {x['stale_reads']} | "
            f"{x['torn_reads']} | {x['lag_writes_max']} | {x['counters'].get('both', {}).get('served_ratio')} |"
        )
