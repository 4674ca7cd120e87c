#!/usr/bin/env bash
# Runs a local 3-node timerdb cluster on loopback.
#
#   scripts/cluster.sh start   [--dir DIR] [--base-port 7101] [--tls] [--groups G]
#                                                                build, start 3 nodes, wait for a leader;
#                                                                --tls: certificates made in DIR/certs
#                                                                (scripts/certs.sh), client and peer TLS,
#                                                                clients must present a certificate (mTLS);
#                                                                --groups: G data groups beside group 0
#                                                                (docs/sharding.md), kept for restarts
#   scripts/cluster.sh status  [--dir DIR]                       every member: role, term, applied, lag
#   scripts/cluster.sh stop    [--dir DIR]                       SIGTERM every node (clean shutdown)
#   scripts/cluster.sh kill N  [--dir DIR]                       SIGKILL node N (a crash)
#   scripts/cluster.sh restart N [--dir DIR]                     start node N again on its data dir
#   scripts/cluster.sh leader  [--dir DIR]                       print the leader's node id
#
# Data, logs and pids live under DIR (default ./.cluster). Node N listens on base-port + N - 1.
# A cluster started with --tls stays TLS (restart, status); timerctl then needs
#   --ca DIR/certs/ca.crt --cert DIR/certs/client.crt --key DIR/certs/client.key
set -euo pipefail
cd "$(dirname "$0")/.."

cmd=${1:-}
shift || true
node_arg=""
TLS=""
DATA_GROUPS=""
if [[ "$cmd" == kill || "$cmd" == restart ]]; then node_arg=${1:?"$cmd needs a node id (1-3)"}; shift; fi
DIR=${TIMERDB_CLUSTER_DIR:-.cluster}
BASE_PORT=${TIMERDB_BASE_PORT:-7101}
while [[ $# -gt 0 ]]; do
  case "$1" in
    --dir) DIR=$2; shift 2 ;;
    --base-port) BASE_PORT=$2; shift 2 ;;
    --tls) TLS=1; shift ;;
    --groups) DATA_GROUPS=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
mkdir -p "$DIR"
DIR=$(cd "$DIR" && pwd)
TARGET=${CARGO_TARGET_DIR:-target}
BIN=${TIMERDB_BIN:-$TARGET/debug}
addr() { echo "127.0.0.1:$((BASE_PORT + $1 - 1))"; }
PEERS="1=$(addr 1),2=$(addr 2),3=$(addr 3)"

build() {
  if [[ -z "${TIMERDB_BIN:-}" ]]; then
    bash scripts/deps.sh
    # Only what the cluster runs: the tests' targets are built by the test commands.
    cargo build --bin timerd --bin timerctl
  fi
}

# TLS: chosen at start, remembered in DIR/tls for the later commands.
if [[ -n "$TLS" ]]; then
  bash scripts/certs.sh "$DIR/certs" >/dev/null
  touch "$DIR/tls"
fi
CERTS="$DIR/certs"
# Data groups: chosen at start, remembered in DIR/groups for restarts.
if [[ -n "$DATA_GROUPS" ]]; then echo "$DATA_GROUPS" >"$DIR/groups"; fi
groups_args() {
  [[ -f "$DIR/groups" ]] || return 0
  echo "--groups $(cat "$DIR/groups")"
}
tls_node_args() {
  [[ -f "$DIR/tls" ]] || return 0
  echo "--tls-cert $CERTS/node-$1.crt --tls-key $CERTS/node-$1.key --client-ca $CERTS/client-ca.crt" \
    "--peer-ca $CERTS/ca.crt --peer-cert $CERTS/node-$1.crt --peer-key $CERTS/node-$1.key"
}
ctl() {
  if [[ -f "$DIR/tls" ]]; then
    "$BIN/timerctl" --ca "$CERTS/ca.crt" --cert "$CERTS/client.crt" --key "$CERTS/client.key" "$@"
  else
    "$BIN/timerctl" "$@"
  fi
}

alive() { [[ -f "$DIR/n$1.pid" ]] && kill -0 "$(cat "$DIR/n$1.pid")" 2>/dev/null; }

start_node() {
  local n=$1
  if alive "$n"; then echo "node $n already running (pid $(cat "$DIR/n$n.pid"))"; return; fi
  # shellcheck disable=SC2046 # the TLS flags are words
  # --push-allow-private: the local cluster's push receivers run on this machine (loopback).
  nohup "$BIN/timerd" --id "$n" --listen "$(addr "$n")" --data-dir "$DIR/n$n" --peers "$PEERS" \
    --push-allow-private=true $(tls_node_args "$n") $(groups_args) >>"$DIR/n$n.log" 2>&1 &
  echo $! >"$DIR/n$n.pid"
  echo "node $n started on $(addr "$n") (pid $!, log $DIR/n$n.log)"
}

leader() {
  for n in 1 2 3; do
    # Capture, then match: `| grep -q` can SIGPIPE timerctl, which pipefail reports as failure.
    if alive "$n" && out=$(ctl -e "$(addr "$n")" status 2>/dev/null) &&
      [[ "$out" =~ leader:\ node\ ([0-9]+) ]]; then
      echo "${BASH_REMATCH[1]}"; return 0
    fi
  done
  return 1
}

wait_leader() {
  for _ in $(seq 1 150); do
    if l=$(leader); then echo "leader is node $l"; return 0; fi
    sleep 0.2
  done
  echo "no leader after 30 s; see $DIR/n*.log" >&2
  return 1
}

case "$cmd" in
  start)
    build
    for n in 1 2 3; do start_node "$n"; done
    wait_leader
    ;;
  status)
    # One table of every member, asked through the first node that runs.
    for n in 1 2 3; do
      if alive "$n"; then ctl -e "$(addr "$n")" status; exit 0; fi
    done
    echo "no node is running" >&2
    exit 1
    ;;
  stop)
    for n in 1 2 3; do
      if alive "$n"; then kill -TERM "$(cat "$DIR/n$n.pid")"; fi
    done
    for n in 1 2 3; do
      for _ in $(seq 1 100); do alive "$n" || break; sleep 0.1; done
      if alive "$n"; then kill -KILL "$(cat "$DIR/n$n.pid")"; fi
      rm -f "$DIR/n$n.pid"
    done
    echo "cluster stopped (data kept in $DIR)"
    ;;
  kill)
    alive "$node_arg" || { echo "node $node_arg is not running" >&2; exit 1; }
    kill -KILL "$(cat "$DIR/n$node_arg.pid")"
    rm -f "$DIR/n$node_arg.pid"
    echo "node $node_arg killed (SIGKILL)"
    ;;
  restart)
    start_node "$node_arg"
    ;;
  leader)
    leader
    ;;
  *)
    sed -n '2,19p' "$0"; exit 2 ;;
esac
