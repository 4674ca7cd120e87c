#!/usr/bin/env bash
# Counts the instructions two timerd builds execute for the same write work, under callgrind:
# a one-node cluster takes 20 ScheduleBatch calls of 1,000 timers each over HTTP/JSON (the same
# bodies for both builds), and only those calls are counted (instrumentation is switched on
# after a warm-up batch and off after the last answer).
#
# Why: the benchmarks time three nodes and a client sharing 2 cores, where one run's p99 can be
# off by 10-20 % for no reason of ours. An instruction count is the same whatever else the
# machine does (two counts of one build differ by < 1 %), so it tells a slower write path from
# an unlucky run: the gate's 13th and 14th runs flagged batch p99 ×1.10 and ×1.14, and this
# counted HEAD at 0.7 % fewer instructions than the commit before the flag (docs/benchmarks.md).
# It counts CPU work only: neither replication (one node) nor fsync waits nor contention.
#
#   scripts/instructions.sh OLD_TIMERD NEW_TIMERD [ROUNDS]   each build ROUNDS times (2),
#                                                            alternating; prints each count
#                                                            and the ratio of the medians
set -euo pipefail
old=${1:?usage: $0 OLD_TIMERD NEW_TIMERD [ROUNDS]} new=${2:?usage: $0 OLD_TIMERD NEW_TIMERD [ROUNDS]}
rounds=${3:-2}
command -v valgrind >/dev/null || { echo "instructions.sh needs valgrind" >&2; exit 2; }
work=$(mktemp -d)
pid=""
trap 'rm -rf "$work"' EXIT

python3 - "$work" <<'EOF'
import json, sys
for b in range(21):
    timers = [{"id": f"b{b}-t{k}", "delay_ms": 3_600_000, "payload": "aGVsbG8gd29ybGQgaGVsbG8gd29ybGQ="}
              for k in range(1000)]
    open(f"{sys.argv[1]}/batch{b}.json", "w").write(json.dumps({"timers": timers}))
EOF

# count BIN: prints the instructions the 20 batches cost on a fresh one-node cluster.
count() {
  local bin=$1 port out
  # count runs in a subshell ($(count …)): its own trap stops the node it started.
  trap 'if [ -n "$pid" ]; then kill "$pid" 2>/dev/null; fi' EXIT
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  out="$work/callgrind.out"
  rm -rf "$work/data" "$out"
  valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$out" "$bin" --id 1 \
    --listen "127.0.0.1:$port" --data-dir "$work/data" --peers "1=127.0.0.1:$port" --log warn \
    >"$work/log" 2>&1 &
  pid=$!
  post() {
    curl -s -o /dev/null -w '%{http_code}' -X POST \
      "localhost:$port/v1/namespaces/bench/timers:batch" -d @"$work/batch$1.json" || true
  }
  # The warm-up batch, once the node has elected itself and serves (up to 2 minutes under
  # valgrind); then every batch must be answered 200.
  local code=""
  for _ in $(seq 1 120); do
    code=$(post 0)
    [ "$code" = 200 ] && break
    sleep 1
  done
  [ "$code" = 200 ] || { echo "$bin: the warm-up batch answered '$code'" >&2; cat "$work/log" >&2; exit 1; }
  callgrind_control -i on "$pid" >/dev/null
  for b in $(seq 1 20); do
    code=$(post "$b")
    [ "$code" = 200 ] || { echo "$bin: batch $b answered '$code'" >&2; cat "$work/log" >&2; exit 1; }
  done
  callgrind_control -i off "$pid" >/dev/null
  kill -TERM "$pid"
  wait "$pid" || true
  pid=""
  # awk reads to the end: an early exit would SIGPIPE callgrind_annotate (pipefail).
  callgrind_annotate "$out" 2>/dev/null | awk '/PROGRAM TOTALS/ && !n++ { gsub(",", "", $1); print $1 }'
}

olds=() news=()
for r in $(seq 1 "$rounds"); do
  o=$(count "$old"); n=$(count "$new")
  echo "round $r: old $o  new $n instructions"
  olds+=("$o"); news+=("$n")
done
python3 - "${olds[*]}" "${news[*]}" <<'EOF'
import statistics, sys
old = [int(x) for x in sys.argv[1].split()]
new = [int(x) for x in sys.argv[2].split()]
o, n = statistics.median(old), statistics.median(new)
print(f"20 batches of 1,000 timers: old {o / 1e9:.3f}e9, new {n / 1e9:.3f}e9 instructions, "
      f"new ÷ old ×{n / o:.3f}")
EOF
