#!/usr/bin/env bash
# Builds timerdb, starts a local 3-node cluster and shows it working: timers scheduled through a
# follower fire on time, a cancelled one does not, the leader is SIGKILLed while timers are due
# and every one of them still fires exactly once; then a consumer receives and acks them all.
# Leaves the cluster running (stop it with
# `scripts/cluster.sh stop`).
#
#   scripts/demo.sh [--groups G]   --groups: a sharded cluster of G data groups beside group 0
#                                  (docs/sharding.md); the leader killed is the one of the group
#                                  holding the demo's namespace, and the slot map is shown.
set -euo pipefail
cd "$(dirname "$0")/.."
GROUPS_ARGS=()
while [[ $# -gt 0 ]]; do
  case $1 in
    --groups) GROUPS_ARGS=(--groups "$2"); shift 2 ;;
    *) echo "usage: scripts/demo.sh [--groups G]" >&2; exit 2 ;;
  esac
done
export TIMERDB_CLUSTER_DIR=${TIMERDB_CLUSTER_DIR:-.cluster}
bash scripts/deps.sh
echo "== building timerdb (debug profile)"
# Only the two binaries the demo runs (scripts/test.sh builds the tests' targets itself).
cargo build --bin timerd --bin timerctl
TARGET=${CARGO_TARGET_DIR:-target}
CTL="$TARGET/debug/timerctl"
scripts/cluster.sh stop >/dev/null 2>&1 || true
rm -rf "$TIMERDB_CLUSTER_DIR"
TIMERDB_BIN="$TARGET/debug" scripts/cluster.sh start "${GROUPS_ARGS[@]}"

leader=$(TIMERDB_BIN="$TARGET/debug" scripts/cluster.sh leader)
if [[ ${#GROUPS_ARGS[@]} -gt 0 ]]; then
  echo
  echo "== the slot map: which Raft group owns which hash slots"
  "$CTL" -e 127.0.0.1:7101 slots
  "$CTL" -e 127.0.0.1:7101 group list
  # The namespace's group's leader, once it has one: that is the node the demo kills.
  for _ in $(seq 50); do
    found=$("$CTL" -e 127.0.0.1:7101 --output json slots --namespace demo 2>/dev/null |
      grep -o '"leader": *[0-9]*' | grep -o '[0-9]*$' || true)
    if [[ -n "$found" && "$found" != 0 ]]; then leader=$found; break; fi
    sleep 0.2
  done
  "$CTL" -e 127.0.0.1:7101 slots --namespace demo
fi
follower=$(( leader % 3 + 1 ))
EP="127.0.0.1:$((7100 + follower))"
echo
echo "== scheduling through follower node $follower ($EP)"
"$CTL" -e "$EP" schedule demo hello --in 2s --payload "hello, world"
"$CTL" -e "$EP" schedule demo later --in 4s
"$CTL" -e "$EP" schedule demo cancel-me --in 3s
"$CTL" -e "$EP" cancel demo cancel-me
"$CTL" -e "$EP" reschedule demo later --in 1s
echo
echo "== 500 timers due over the next 4 seconds"
"$CTL" -e "$EP" load demo --count 500 --in 2s --spread 2s --concurrency 16
echo
echo "== SIGKILL the leader (node $leader) while they come due"
sleep 2.5
TIMERDB_BIN="$TARGET/debug" scripts/cluster.sh kill "$leader"
sleep 3
"$CTL" -e "$EP" status
echo
echo "== every timer fired once, on time, despite the kill"
"$CTL" -e "$EP" get demo hello
"$CTL" -e "$EP" get demo later
"$CTL" -e "$EP" get demo cancel-me
"$CTL" -e "$EP" list demo --state pending
fired=$("$CTL" -e "$EP" list demo --state fired --all --limit 1000 | tail -1)
echo "FIRED: $fired (expected 502)"
echo
echo "== restart node $leader: it rejoins from its data dir and catches up"
TIMERDB_BIN="$TARGET/debug" scripts/cluster.sh restart "$leader"
sleep 3
TIMERDB_BIN="$TARGET/debug" scripts/cluster.sh status
echo
echo "== a consumer subscribes through node $leader and acks every fired timer"
"$CTL" -e "127.0.0.1:$((7100 + leader))" watch demo --ack --count 502 --max-in-flight 100 | tail -3
acked=$("$CTL" -e "$EP" list demo --state acked --all --limit 1000 | tail -1)
echo "ACKED: $acked (expected 502)"
echo
echo "The cluster is still running: try '$CTL -e $EP list demo'. Stop it with 'scripts/cluster.sh stop'."
[[ "$fired" == "502 timer(s)" && "$acked" == "502 timer(s)" ]]
