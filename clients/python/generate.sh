#!/usr/bin/env bash
# Regenerates the protobuf and gRPC stubs under timerdb/v1/ from the repository's proto/ with
# grpcio-tools (its bundled protoc: no system protoc). The stubs are committed so that
# `pip install clients/python` needs no code generation; test.sh checks they are current.
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
"$PY" -m grpc_tools.protoc -I ../../proto \
  --python_out=. --grpc_python_out=. --pyi_out=. \
  ../../proto/timerdb/v1/timerdb.proto
touch timerdb/v1/__init__.py
