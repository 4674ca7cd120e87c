# Sourced by the scripts that test against a real local cluster (scripts/readme.sh,
# clients/python/test.sh, tests/console/run.sh): `test_cluster_start PORT NAME [GROUPS]` starts 3 nodes
# (with GROUPS data groups beside group 0, if given)
# of this checkout's debug timerd (TIMERDB_BIN to override) on PORT..PORT+2 in a fresh
# /tmp/timerdb-NAME.* data dir, stops them and removes the dir when the script exits, and
# exports TIMERDB_BIN, TIMERDB_TEST_ADDRS (the client ports, comma-separated) and
# TIMERDB_TEST_CLUSTER (`scripts/cluster.sh --dir DIR --base-port PORT`, to kill or restart).
TEST_CLUSTER_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

test_cluster_start() {
  local base=$1 name=$2 groups=${3:-}
  local target=${CARGO_TARGET_DIR:-$TEST_CLUSTER_ROOT/target}
  export TIMERDB_BIN=${TIMERDB_BIN:-$target/debug}
  TEST_CLUSTER_DIR=$(mktemp -d "/tmp/timerdb-$name.XXXXXX")
  local cluster="$TEST_CLUSTER_ROOT/scripts/cluster.sh"
  trap '"'"$cluster"'" stop --dir "$TEST_CLUSTER_DIR" >/dev/null 2>&1 || true; rm -rf "$TEST_CLUSTER_DIR"' EXIT
  "$cluster" start --dir "$TEST_CLUSTER_DIR" --base-port "$base" ${groups:+--groups "$groups"} >/dev/null
  export TIMERDB_TEST_ADDRS="127.0.0.1:$base,127.0.0.1:$((base + 1)),127.0.0.1:$((base + 2))"
  export TIMERDB_TEST_CLUSTER="$cluster --dir $TEST_CLUSTER_DIR --base-port $base"
}
