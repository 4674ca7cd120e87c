#!/usr/bin/env bash
# Installs the system packages timerdb's build needs (libclang for librocksdb-sys bindgen,
# make for jemalloc).
# Safe to run repeatedly: it does nothing when everything is already present.
set -euo pipefail

have_libclang() {
  # libclang.so / libclang-NN.so (not libclang-cpp, which bindgen cannot use)
  compgen -G "/usr/lib/llvm-*/lib/libclang.so*" >/dev/null ||
    compgen -G "/usr/lib/*-linux-gnu/libclang-[0-9]*.so*" >/dev/null
}

if ! have_libclang; then
  echo "deps: installing libclang-dev (needed to build RocksDB bindings)" >&2
  SUDO=""
  if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq libclang-dev >/dev/null
fi

# make: tikv-jemalloc-sys builds jemalloc (timerd's allocator) with its own Makefile.
if ! command -v make >/dev/null 2>&1; then
  echo "deps: installing make (needed to build jemalloc)" >&2
  SUDO=""
  if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq make >/dev/null
fi

if ! command -v cargo >/dev/null 2>&1; then
  echo "deps: cargo not found; install the Rust toolchain (rustup) first" >&2
  exit 1
fi

# RocksDB's C++, compiled once per machine and linked by every build of this checkout
# (scripts/rocksdb.sh, docs/building.md).
bash "$(dirname "$0")/rocksdb.sh"
