#!/usr/bin/env bash
# Runs the README's marked examples as written against a real local 3-node cluster (debug
# timerd processes, their own ports and data dir), so the examples cannot rot:
# - a ```sh block after a line `<!-- scripts/readme.sh runs ... -->`: each command runs in bash
#   with curl made strict (`--fail-with-body`: an HTTP error fails it); the README's ports
#   7101-7103 are moved to this run's; a command with `--max-time` may end by its time limit;
# - a block after `<!-- scripts/readme.sh: FILE -->` must be FILE's text, and FILE runs: a .py
#   with the Python client's virtualenv (clients/python/test.sh makes it), a .rs as the cargo
#   example it is; both take the nodes from TIMERDB_ADDRS.
# Exits non-zero at the first example that fails.
set -euo pipefail
cd "$(dirname "$0")/.."
TARGET=${CARGO_TARGET_DIR:-target}
BASE=${TIMERDB_README_PORT:-17101}
source scripts/test-cluster.sh
test_cluster_start "$BASE" readme

# The marked blocks' commands, one per line (continuation lines joined).
commands=$(awk '
  /<!-- scripts\/readme.sh runs/ { marked = 1; next }
  marked && /^```sh/ { inside = 1; next }
  inside && /^```/ { inside = 0; marked = 0; next }
  inside {
    line = $0
    if (line ~ /\\$/) { sub(/\\$/, "", line); pending = pending line; next }
    print pending line; pending = ""
  }' README.md)
[[ -n "$commands" ]] || { echo "readme.sh: no marked block in README.md" >&2; exit 1; }

curl() { command curl --fail-with-body --show-error "$@"; }
export -f curl
n=0
while IFS= read -r cmd; do
  [[ -z "${cmd// }" || "$cmd" =~ ^[[:space:]]*# ]] && continue
  run=${cmd//:7101/:$BASE}
  run=${run//:7102/:$((BASE + 1))}
  run=${run//:7103/:$((BASE + 2))}
  n=$((n + 1))
  echo "\$ $cmd"
  set +e
  out=$(bash -c "$run" 2>&1)
  rc=$?
  set -e
  echo "$out" | head -c 600
  echo
  if [[ $rc -ne 0 && ! ( $rc -eq 28 && "$cmd" == *--max-time* ) ]]; then
    echo "readme.sh: the command above failed (exit $rc)" >&2
    exit 1
  fi
done <<< "$commands"

# Code examples: the README shows the file, the file runs.
export TIMERDB_ADDRS=$TIMERDB_TEST_ADDRS
files=$(sed -n 's/^<!-- scripts\/readme.sh: \(.*\) -->$/\1/p' README.md)
for file in $files; do
  shown=$(awk -v f="<!-- scripts/readme.sh: $file -->" '
    $0 == f { marked = 1; next }
    marked && /^```/ && !inside { inside = 1; next }
    inside && /^```$/ { exit }
    inside { print }' README.md)
  if [[ "$shown" != "$(cat "$file")" ]]; then
    echo "readme.sh: the README's block for $file is not the file's text" >&2
    exit 1
  fi
  echo "\$ (the README's $file)"
  case "$file" in
    *.py) "${TIMERDB_PYVENV:-$HOME/.cache/timerdb-pyvenv}/bin/python" "$file" ;;
    *.rs)
      name=$(basename "$file" .rs)
      cargo build -q -p timerdb-client --example "$name"
      "$TARGET/debug/examples/$name" ;;
    *) echo "readme.sh: no way to run $file" >&2; exit 1 ;;
  esac
  n=$((n + 1))
done
echo "readme.sh: $n README examples ran as written"
