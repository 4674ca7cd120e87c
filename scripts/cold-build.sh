#!/usr/bin/env bash
# Measures the first run on a "fresh machine" (docs/building.md): clones this checkout's HEAD
# into DIR and runs the README's two commands there with everything a machine caches empty —
# the cargo registry (CARGO_HOME), the target dir, the RocksDB archive cache and the Python
# virtualenv — timing each. What stays: the Rust toolchain and the system packages (libclang,
# chromium). Writes DIR/times and the two logs. Takes ~1 h on 2 cores; needs ~20 GB.
#
#   scripts/cold-build.sh --dir /tmp/cold
set -euo pipefail
DIR=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --dir) DIR=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
[[ -n "$DIR" ]] || { echo "usage: scripts/cold-build.sh --dir DIR (emptied first)" >&2; exit 2; }
SRC=$(cd "$(dirname "$0")/.." && pwd)
rm -rf "$DIR"
mkdir -p "$DIR"
DIR=$(cd "$DIR" && pwd)
git clone -q "$SRC" "$DIR/clone"
export CARGO_HOME="$DIR/cargo-home" CARGO_TARGET_DIR="$DIR/target"
export TIMERDB_ROCKSDB_CACHE="$DIR/rocksdb" TIMERDB_PYVENV="$DIR/venv"
export TIMERDB_CLUSTER_DIR="$DIR/cluster" CI=true
mkdir -p "$CARGO_HOME"
# The toolchain's cargo and rustc stay where rustup put them.
export PATH="$HOME/.cargo/bin:$PATH"
cd "$DIR/clone"
{
  echo "commit $(git rev-parse --short HEAD)"
  start=$(date +%s)
  bash scripts/demo.sh >"$DIR/command1.log" 2>&1 && r1=ok || r1=failed
  t1=$(( $(date +%s) - start ))
  bash scripts/cluster.sh stop >/dev/null 2>&1 || true
  echo "command 1 (scripts/demo.sh): $((t1 / 60)) min $((t1 % 60)) s, $r1"
  start=$(date +%s)
  bash scripts/test.sh >"$DIR/command2.log" 2>&1 && r2=ok || r2=failed
  t2=$(( $(date +%s) - start ))
  echo "command 2 (scripts/test.sh): $((t2 / 60)) min $((t2 % 60)) s, $r2"
  grep -h "RocksDB compiled in" "$DIR/command1.log" "$DIR/command2.log" || true
} | tee "$DIR/times"
