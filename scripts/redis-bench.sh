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
