#!/usr/bin/env bash
# The web console's browser tests (tests/console/console_test.py): installs what they need if
# missing (Debian's chromium with apt, Playwright into the Python client's virtualenv, no
# browser download), starts a sharded 3-node cluster of this checkout's debug timerd on its own ports,
# runs the tests in headless chromium and stops it. Screenshots of each page go to
# $TIMERDB_SHOTS (default target/console-screenshots), kept as the run's artefacts.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
VENV=${TIMERDB_PYVENV:-$HOME/.cache/timerdb-pyvenv}
if ! command -v chromium >/dev/null 2>&1; then
  echo "console: installing chromium (Debian package)" >&2
  SUDO=""; [ "$(id -u)" != 0 ] && SUDO="sudo"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium >/dev/null
fi
# The Python client's tests make the virtualenv (installing python3-venv if needed); run
# alone, make it the same way.
[[ -x "$VENV/bin/python" ]] || bash clients/python/test.sh >/dev/null
"$VENV/bin/python" -c "import playwright" 2>/dev/null || "$VENV/bin/pip" install -q playwright

TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
source scripts/test-cluster.sh
# Sharded (4 data groups beside group 0): every page works across groups, and the cluster
# page shows the slot map.
test_cluster_start "${TIMERDB_CONSOLE_PORT:-17301}" console 4
export TIMERDB_SHOTS=${TIMERDB_SHOTS:-$TARGET/console-screenshots}
export CHROMIUM=${CHROMIUM:-$(command -v chromium)}
"$VENV/bin/python" -m unittest -v tests/console/console_test.py
echo "console: screenshots in $TIMERDB_SHOTS"
