#!/usr/bin/env bash
# The Python client's tests against a real 3-node cluster of this checkout's debug timerd
# (scripts/test.sh runs it). Makes a virtualenv (~/.cache/timerdb-pyvenv) with grpcio,
# protobuf and grpcio-tools on first use, checks the committed stubs are current, installs the
# package, starts the cluster on its own ports and data dir, runs the tests, stops it.
set -euo pipefail
cd "$(dirname "$0")"
ROOT=$(cd ../.. && pwd)
VENV=${TIMERDB_PYVENV:-$HOME/.cache/timerdb-pyvenv}
if [[ ! -x "$VENV/bin/python" ]]; then
  # Debian's system python needs python3-venv for this; install it if the first try fails.
  if ! python3 -m venv "$VENV" 2>/dev/null; then
    SUDO=""; [ "$(id -u)" != 0 ] && SUDO="sudo"
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq python3-venv >/dev/null
    rm -rf "$VENV"
    python3 -m venv "$VENV"
  fi
fi
"$VENV/bin/pip" install -q -e ".[dev]"

# The committed stubs must be what the proto generates.
fresh=$(mktemp -d)
"$VENV/bin/python" -m grpc_tools.protoc -I ../../proto --python_out="$fresh" \
  --grpc_python_out="$fresh" --pyi_out="$fresh" ../../proto/timerdb/v1/timerdb.proto
for f in timerdb_pb2.py timerdb_pb2_grpc.py timerdb_pb2.pyi; do
  if ! cmp -s "$fresh/timerdb/v1/$f" "timerdb/v1/$f"; then
    echo "clients/python/timerdb/v1/$f is stale: run clients/python/generate.sh" >&2
    exit 1
  fi
done
rm -rf "$fresh"

source "$ROOT/scripts/test-cluster.sh"
# Sharded (4 data groups beside group 0): the client routes each call to its group's leader.
test_cluster_start "${TIMERDB_PY_PORT:-17201}" py 4
"$VENV/bin/python" -m unittest discover -s tests -v
