#!/usr/bin/env bash
# Fuzzes timerdb's decoders and apply on the stable toolchain (docs/security.md, "Fuzzing"):
#
#   scripts/fuzz.sh [--minutes N | --seconds N] [--target T]... [--save] [--seed S]
#
# Targets: peer (the peer message decoder), backup (the snapshot/backup reader), convert
# (protobuf -> command validation), apply (command programs on three state machines, one of
# them restarted, reinstalled and its caches rebuilt, the other's caches made stale: same
# answers, same digest after every entry). The time is shared evenly. Starts from the committed corpus in
# fuzz/corpus/<target>/; --save keeps inputs that reached a new outcome there. A finding (a
# panic, a broken invariant) is saved to fuzz/findings/<target>/ and fails the run; so does an
# abort of the process. Default: 10 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_TOTAL=600
ARGS=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --minutes) SECONDS_TOTAL=$(( $2 * 60 )); shift 2 ;;
    --seconds) SECONDS_TOTAL=$2; shift 2 ;;
    --target) ARGS+=(--target "$2"); shift 2 ;;
    --seed) ARGS+=(--seed "$2"); shift 2 ;;
    --save) ARGS+=(--save); shift ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
TARGET=${CARGO_TARGET_DIR:-target}
# The apply target opens three RocksDB state machines per input: on tmpfs, twice as many inputs
# a second as on disk.
if [ -z "${TMPDIR:-}" ] && [ -d /dev/shm ] && [ -w /dev/shm ]; then
  export TMPDIR=/dev/shm
fi
bash scripts/deps.sh
cargo build --release --bin timerdb-fuzz
"$TARGET/release/timerdb-fuzz" --seconds "$SECONDS_TOTAL" "${ARGS[@]}"
