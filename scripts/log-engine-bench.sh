#!/usr/bin/env bash
# The log-engine benchmark (docs/log-engine.md): timerdb's RocksDB log engine against tikv's
# raft-engine, for 1, 8 and 64 Raft groups, small (256 B, a Fire entry) and large (1 MiB, a
# ScheduleBatch) entries. Each configuration runs in its own process, the two engines
# alternating, ROUNDS times; prints the medians and each figure's ratio raft-engine/RocksDB.
#
#   scripts/log-engine-bench.sh [--rounds N] [--seconds S] [--groups "1 8 64"] [--out FILE]
#
# Not part of the test run: it takes ~8 minutes with the defaults (3 rounds of 10 s), plus a
# ~6 minute build of its own workspace (bench/log-engine: raft-engine must not change the
# features of timerdb's own build, so it has its own target dir).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=3 seconds=10 groups="1 8 64" out=bench-results/log-engine.jsonl
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    --groups) groups=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
scripts/rocksdb.sh >/dev/null
target=$PWD/target/log-engine-bench
(cd bench/log-engine && CARGO_TARGET_DIR=$target cargo build --release --quiet)
bin=$target/release/timerdb-log-engine-bench
mkdir -p "$(dirname "$out")"
: >"$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for round in $(seq 1 "$rounds"); do
  for g in $groups; do
    for size in 256 1048576; do
      # A large entry pipelines less: 2 outstanding per group, as a leader's batches do.
      inflight=4; [ "$size" -gt 4096 ] && inflight=2
      # Alternate which engine goes first, so neither always runs on a warmer disk.
      engines="rocksdb raft-engine"; [ $((round % 2)) -eq 0 ] && engines="raft-engine rocksdb"
      for e in $engines; do
        "$bin" --engine "$e" --groups "$g" --entry-bytes "$size" --in-flight "$inflight" \
          --seconds "$seconds" --dir "$work/$e" | tee -a "$out"
        sync
      done
    done
  done
done
python3 scripts/log_engine_table.py "$out"
