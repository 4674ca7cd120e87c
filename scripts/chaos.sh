#!/usr/bin/env bash
# Chaos runs: three release `timerd` processes under client load and injected faults (SIGKILL,
# SIGSTOP, partitions and delays on peer links, dropped connections, clock skew, a full disk),
# then a checker over the recorded history. Exits non-zero on any violation.
#
#   scripts/chaos.sh --short          the test suite's profile (~7 min): prove the checker catches
#                                     three deliberate bugs, then one 150 s run with every fault
#                                     kind, then one 90 s run with every fault kind and security on
#   scripts/chaos.sh --minutes 30     the long profile: 60 s runs, seed after seed, for 30 minutes
#   scripts/chaos.sh --runs 100       the long profile: 100 runs
#   scripts/chaos.sh --secure ...     (first flag) every run with client TLS + mTLS, peer mTLS and
#                                     auth on (certificates from scripts/certs.sh, made afresh)
#
# Other flags go to timerdb-chaos: --seed N (reproduces a plan), --run-length 90s, --workers N,
# --no-disk (no tmpfs: skips the disk-full fault), --dir D (keep data dirs and node logs).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
echo "== building release timerd and timerdb-chaos (RocksDB itself is compiled once per machine, by scripts/rocksdb.sh)"
cargo build --release --bin timerd --bin timerdb-chaos
BIN="${CARGO_TARGET_DIR:-target}/release"
# Certificates for secure runs: the cluster CA, node-N and a client certificate named
# chaos-client (the harness's admin certificate user), made afresh for every invocation.
CERTS=$(mktemp -d "${TMPDIR:-/tmp}/timerdb-chaos-certs.XXXXXX")
trap 'rm -rf "$CERTS"' EXIT
certs() { bash scripts/certs.sh "$CERTS" --client chaos-client >/dev/null; }
SECURE=()
if [[ "${1:-}" == "--secure" ]]; then
    shift
    certs
    SECURE=(--secure "$CERTS")
fi
if [[ "${1:-}" == "--short" ]]; then
    shift
    echo "== chaos: prove the checker (each deliberate bug must be caught)"
    "$BIN/timerdb-chaos" --prove --run-length 25s "${SECURE[@]}" "$@"
    echo "== chaos: one 150 s run with every fault kind"
    "$BIN/timerdb-chaos" --runs 1 --run-length 150s "${SECURE[@]}" "$@"
    echo "== chaos: one 90 s run with every fault kind, TLS + mTLS + peer mTLS + auth on"
    certs
    "$BIN/timerdb-chaos" --runs 1 --run-length 90s --seed 7 --secure "$CERTS" "$@"
    exit 0
fi
"$BIN/timerdb-chaos" "${SECURE[@]}" "$@"
