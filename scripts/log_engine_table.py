#!/usr/bin/env python3
"""Medians of the log-engine benchmark's runs (scripts/log-engine-bench.sh), one row per
configuration, and raft-engine's figure over RocksDB's."""
import json
import statistics
import sys
from collections import defaultdict

FIELDS = ["appends_per_s", "mb_per_s", "p50_ms", "p99_ms", "fsyncs_per_s",
          "written_per_appended", "rss_mib", "restart_ms"]

runs = defaultdict(list)
for line in open(sys.argv[1]):
    line = line.strip()
    if line.startswith("{"):
        r = json.loads(line)
        runs[(r["groups"], r["entry_bytes"], r["engine"])].append(r)

print("| groups | entry | engine | n | " + " | ".join(FIELDS) + " |")
print("|---" * (4 + len(FIELDS)) + "|")
for (g, size, engine) in sorted(runs, key=lambda k: (k[0], k[1], k[2] != "Rocksdb")):
    rs = runs[(g, size, engine)]
    med = {f: statistics.median(r[f] for r in rs) for f in FIELDS}
    row = [str(g), f"{size} B", engine, str(len(rs))] + [f"{med[f]:.2f}" for f in FIELDS]
    print("| " + " | ".join(row) + " |")
    if engine == "RaftEngine" and (g, size, "Rocksdb") in runs:
        base = runs[(g, size, "Rocksdb")]
        ratio = []
        for f in FIELDS:
            b = statistics.median(r[f] for r in base)
            ratio.append(f"x{med[f] / b:.2f}" if b else "-")
        print("| " + " | ".join([str(g), f"{size} B", "ratio", ""] + ratio) + " |")
