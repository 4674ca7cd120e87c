#!/usr/bin/env bash
# Compiles RocksDB's C++ once per machine and points this checkout at it (docs/building.md).
#
# librocksdb-sys compiles RocksDB (~300 C++ files) in its build script, once per cargo profile
# and target directory: a cold `scripts/test.sh` used to compile it three times (dev, clippy's
# check build, release), 26 + 22 + 35 minutes on a 2-core machine. Its build script links a
# prebuilt `librocksdb.a` instead when ROCKSDB_LIB_DIR and ROCKSDB_STATIC are set, which
# .cargo/config.toml does for every cargo command run in this checkout: ROCKSDB_LIB_DIR is
# `.rocksdb`, a link this script makes to a machine-wide cache directory.
#
# The cache directory is keyed by everything the archive depends on: the librocksdb-sys version
# (Cargo.lock), the rocksdb features (Cargo.toml), the CPU flags (.cargo/config.toml), the C++
# compiler's version and this script's compile settings. RocksDB is compiled optimised (-O3,
# release) without debug info, so dev, test and release builds all link the same fast RocksDB.
#
# Usage: scripts/rocksdb.sh            (every other script runs it first; it is quick when cached)
# Env:   TIMERDB_ROCKSDB_CACHE         the cache root (default ~/.cache/timerdb-rocksdb)
#        ROCKSDB_COMPILE=1             bypasses all this: librocksdb-sys compiles RocksDB itself
set -euo pipefail
cd "$(dirname "$0")/.."

CACHE=${TIMERDB_ROCKSDB_CACHE:-$HOME/.cache/timerdb-rocksdb}
# The compile settings below; change this when they change, so old archives are not reused.
SETTINGS="release opt-level=3 debug=false v1"

version=$(awk '/^name = "librocksdb-sys"$/ { getline; gsub(/"/, "", $3); print $3 }' Cargo.lock)
if [ -z "$version" ]; then
  echo "rocksdb.sh: librocksdb-sys is not in Cargo.lock" >&2
  exit 1
fi
key=$(
  {
    echo "$version"
    echo "$SETTINGS"
    grep '^rocksdb = ' Cargo.toml
    # The CPU flags reach the C++; `--cfg tokio_unstable` (Rust only) does not.
    grep -E '^\[target|^rustflags' .cargo/config.toml | sed 's/, *"--cfg", *"tokio_unstable"//' || true
    "${CXX:-c++}" --version | head -1
    echo "${CXXFLAGS:-}" "${RUSTFLAGS:-}"
  } | sha256sum | cut -c1-12
)
dir="$CACHE/librocksdb-sys-$version-$key"

if [ ! -f "$dir/librocksdb.a" ]; then
  mkdir -p "$CACHE"
  # One compile at a time per machine: a second caller waits for the first and then reuses it.
  exec 9>"$CACHE/.lock"
  flock 9
  if [ ! -f "$dir/librocksdb.a" ]; then
    echo "== compiling RocksDB (librocksdb-sys $version) once for this machine into $dir"
    echo "   (~20 min on 2 cores; every later build of every profile links this archive)"
    build="$CACHE/build-$key"
    start=$(date +%s)
    # ROCKSDB_COMPILE=1 overrides .cargo/config.toml's ROCKSDB_LIB_DIR for this one build.
    # The workspace's feature resolution applies, so the archive has the features timerdb uses.
    ROCKSDB_COMPILE=1 CARGO_PROFILE_RELEASE_DEBUG=false CARGO_PROFILE_RELEASE_OPT_LEVEL=3 \
      cargo build --release -p librocksdb-sys --target-dir "$build"
    archive=$(find "$build/release/build" -path '*/librocksdb-sys-*/out/librocksdb.a' | head -1)
    if [ -z "$archive" ]; then
      echo "rocksdb.sh: the build left no librocksdb.a under $build" >&2
      exit 1
    fi
    mkdir -p "$dir.tmp"
    cp "$archive" "$dir.tmp/librocksdb.a"
    rm -rf "$dir"
    mv "$dir.tmp" "$dir"
    rm -rf "$build"
    echo "== RocksDB compiled in $(( ($(date +%s) - start) / 60 )) min $(( ($(date +%s) - start) % 60 )) s: $dir"
  fi
  flock -u 9
fi
ln -sfn "$dir" .rocksdb
