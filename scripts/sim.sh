#!/usr/bin/env bash
# Runs the deterministic simulator (docs/guarantees.md, "The simulator"): whole three-node
# clusters in one process on virtual time, with crashes, partitions, slow links and clock skew
# drawn from each seed, judged by the chaos checker's rules and the replicas' digest trail.
#
#   scripts/sim.sh [--minutes M | --seeds N] [--first S] [--prove] [--seed S] [--plant BUG]
#
# --prove plants each known bug in turn (docs/guarantees.md lists them) and fails unless some
# seed catches it. --seed S replays one seed and prints its history. Default: 100 seeds.
# A failing seed is replayed bit for bit by `scripts/sim.sh --seed S` (add RUST_LOG=info for
# the nodes' logs, stamped with simulated time).
set -euo pipefail
cd "$(dirname "$0")/.."
ARGS=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --minutes|--seeds|--first|--seed|--plant|--jobs|--load-secs)
      ARGS+=("$1" "$2"); shift 2 ;;
    --prove) ARGS+=(--prove); shift ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
if [ ${#ARGS[@]} -eq 0 ]; then ARGS=(--seeds 100); fi
TARGET=${CARGO_TARGET_DIR:-target}
DIR=/tmp/timerdb-sim
if [ -d /dev/shm ] && [ -w /dev/shm ]; then DIR=/dev/shm/timerdb-sim; fi
bash scripts/deps.sh
cargo build --release --bin timerdb-sim
"$TARGET/release/timerdb-sim" --dir "$DIR" "${ARGS[@]}"
