#!/usr/bin/env bash
# What idle Raft groups cost (issue 36, docs/sharding.md §7): starts a local 3-node cluster of
# release `timerd` processes with --groups G, lets it settle, then reads each process's CPU time
# (utime + stime, /proc/PID/stat) over a window with no client traffic at all, and prints the
# CPU share per node. Run once per G to compare, e.g.:
#
#   scripts/idle-groups.sh --groups 0 --seconds 30
#   scripts/idle-groups.sh --groups 64 --seconds 30
#
# Needs a release build of timerd (TIMERDB_BIN, default $CARGO_TARGET_DIR/release). Uses ports
# 7301-7303 and a temporary directory; stops the cluster at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
GROUPS_N=0
SECONDS_N=30
SETTLE=10
while [[ $# -gt 0 ]]; do
  case "$1" in
    --groups) GROUPS_N=$2; shift 2 ;;
    --seconds) SECONDS_N=$2; shift 2 ;;
    --settle) SETTLE=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
TARGET=${CARGO_TARGET_DIR:-target}
export TIMERDB_BIN=${TIMERDB_BIN:-$TARGET/release}
[[ -x "$TIMERDB_BIN/timerd" ]] || { echo "no $TIMERDB_BIN/timerd: build it (cargo build --release)" >&2; exit 1; }
DIR=$(mktemp -d /tmp/timerdb-idle.XXXX)
trap 'scripts/cluster.sh stop --dir "$DIR" >/dev/null 2>&1 || true; rm -rf "$DIR"' EXIT
scripts/cluster.sh start --dir "$DIR" --base-port 7301 --groups "$GROUPS_N" >/dev/null
sleep "$SETTLE"
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
declare -A before
for n in 1 2 3; do before[$n]=$(ticks "$(cat "$DIR/n$n.pid")"); done
sleep "$SECONDS_N"
hz=$(getconf CLK_TCK)
total=0
for n in 1 2 3; do
  used=$(( $(ticks "$(cat "$DIR/n$n.pid")") - before[$n] ))
  total=$(( total + used ))
  awk -v u="$used" -v hz="$hz" -v s="$SECONDS_N" -v n="$n" \
    'BEGIN { printf "node %d: %.2f %% of a core\n", n, 100 * u / hz / s }'
done
awk -v u="$total" -v hz="$hz" -v s="$SECONDS_N" -v g="$GROUPS_N" \
  'BEGIN { printf "groups %d, idle %d s: %.2f %% of a core for the 3 nodes\n", g, s, 100 * u / hz / s }'
