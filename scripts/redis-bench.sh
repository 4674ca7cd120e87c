#!/usr/bin/env bash
# The comparison of docs/benchmarks.md: a Redis sorted-set delay queue, the usual way to build
# timers on Redis (ZADD queue fire_at member; a poller takes ZRANGEBYSCORE .. now). One
# redis-server (system package, installed when missing) with the AOF on and appendfsync always,
# so that an acknowledged ZADD is on disk, like an acknowledged Schedule. ZADDs come from the same
# numbers of clients as timerdb's schedule workload, and pipelined from 4 clients beside
# timerdb's batch workload. Each configuration runs $RUNS times; the median is printed.
#
#   scripts/redis-bench.sh            RUNS=3 by default; prints a Markdown table
set -euo pipefail
RUNS=${RUNS:-3}
PORT=${PORT:-16379}

if ! command -v redis-server >/dev/null || ! command -v redis-benchmark >/dev/null; then
  echo "redis-bench: installing redis-server and redis-tools (system packages)" >&2
  SUDO=""
  if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq redis-server redis-tools >/dev/null
fi

dir=$(mktemp -d)
cleanup() {
  redis-cli -p "$PORT" shutdown nosave >/dev/null 2>&1 || true
  rm -rf "$dir"
}
trap cleanup EXIT
redis-server --port "$PORT" --dir "$dir" --appendonly yes --appendfsync always --save "" \
  --daemonize yes --logfile "$dir/redis.log"
for _ in $(seq 50); do
  redis-cli -p "$PORT" ping >/dev/null 2>&1 && break
  sleep 0.1
done

median() { sort -g | awk '{v[NR]=$1} END {if (NR%2) print v[(NR+1)/2]; else print (v[NR/2]+v[NR/2+1])/2}'; }

# One redis-benchmark run of ZADD; prints "rps p50_ms p99_ms".
zadd() { # clients pipeline requests
  redis-benchmark -p "$PORT" -c "$1" -P "$2" -n "$3" -r 1000000000 --csv \
    ZADD delayq __rand_int__ t:__rand_int__ |
    awk -F'","' 'NR==2 {gsub(/"/, "", $0); split($0, f, ","); print f[2], f[5], f[7]}'
}

echo "| Redis ZADD (appendfsync always) | median ZADDs/s | p50 ms | p99 ms | runs (ZADDs/s) |"
echo "|---|---:|---:|---:|---|"
for config in "1 1" "16 1" "64 1" "200 1" "4 1000"; do
  set -- $config
  clients=$1 pipeline=$2
  requests=$((clients * pipeline * 20000))
  if [ "$requests" -gt 2000000 ]; then requests=2000000; fi
  rps=() p50=() p99=()
  for _ in $(seq "$RUNS"); do
    read -r r a b < <(zadd "$clients" "$pipeline" "$requests")
    rps+=("$r") p50+=("$a") p99+=("$b")
  done
  label="$clients clients"
  if [ "$pipeline" -gt 1 ]; then label="$clients clients, pipelined $pipeline"; fi
  printf '| %s | %.0f | %s | %s | %s |\n' "$label" \
    "$(printf '%s\n' "${rps[@]}" | median)" \
    "$(printf '%s\n' "${p50[@]}" | median)" \
    "$(printf '%s\n' "${p99[@]}" | median)" \
    "$(printf '%s ' "${rps[@]}")"
done

# The fire path on Redis: N members all due, moved by a Lua poller (ZRANGEBYSCORE, ZREM and
# RPUSH onto a ready list, in one script, up to 100,000 per call) until none is left. No
# consumer, no acks, no replication: the most a single Redis does for what timerdb's burst
# workload measures.
N=${POLL_N:-1000000}
POLLER='local m = redis.call("ZRANGEBYSCORE", KEYS[1], "-inf", ARGV[1], "LIMIT", 0, ARGV[2])
for i = 1, #m, 5000 do
  local j = math.min(i + 4999, #m)
  redis.call("ZREM", KEYS[1], unpack(m, i, j))
  redis.call("RPUSH", KEYS[2], unpack(m, i, j))
end
return #m'
poll() {
  redis-cli -p "$PORT" del due ready >/dev/null
  awk -v n="$N" 'BEGIN { for (i = 0; i < n; i++) { m = "m" i
    printf "*4\r\n$4\r\nZADD\r\n$3\r\ndue\r\n$1\r\n1\r\n$%d\r\n%s\r\n", length(m), m } }' |
    redis-cli -p "$PORT" --pipe >/dev/null
  local start end moved
  start=$(date +%s%N)
  while moved=$(redis-cli -p "$PORT" EVAL "$POLLER" 2 due ready 2 100000) && [ "$moved" != 0 ]; do :; done
  end=$(date +%s%N)
  echo "$N $start $end" | awk '{printf "%.0f\n", $1 / (($3 - $2) / 1e9)}'
}
rates=()
for _ in $(seq "$RUNS"); do rates+=("$(poll)"); done
echo
echo "| Redis Lua poller, $N members due (appendfsync always) | median moved/s | runs (moved/s) |"
echo "|---|---:|---|"
printf '| ZRANGEBYSCORE + ZREM + RPUSH, 100,000 per call | %.0f | %s |\n' \
  "$(printf '%s\n' "${rates[@]}" | median)" "$(printf '%s ' "${rates[@]}")"
