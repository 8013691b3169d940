#!/usr/bin/env bash
# make bench-proxy: warmroute side by side with HAProxy, then the ring's
# scale benchmarks. Installs HAProxy and wrk with apt-get when missing
# (Debian), builds warmroute and the harness, and runs
# loadtest/benchproxy, which starts the stub backends, HAProxy and
# warmroute on loopback, pins them, drives them with wrk and stops them
# all on exit. Arguments go to the harness (e.g. -reps 5 -duration 10s;
# -phases open -open-streams 2000,10000 for the open-streams phase alone,
# see docs/performance.md).
# Environment: BENCH_NICE (default -10; 0 to run at normal priority),
# BENCH_TIMEOUT (default 30m), SKIP_RING=1 to skip the ring benchmarks.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v haproxy >/dev/null || need+=(haproxy)
command -v wrk >/dev/null || need+=(wrk)
command -v taskset >/dev/null || need+=(util-linux)
if [ ${#need[@]} -gt 0 ]; then
  if ! command -v apt-get >/dev/null; then
    echo "bench-proxy: need ${need[*]} and apt-get is not available" >&2
    exit 1
  fi
  sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo"
  echo "bench-proxy: installing ${need[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}" >/dev/null
fi
if [ "$(nproc)" -lt 2 ]; then
  echo "bench-proxy: needs at least 2 CPUs (one for the proxy, one for the load)" >&2
  exit 1
fi

mkdir -p bin out/bench-proxy
CGO_ENABLED=0 go build -trimpath -o bin/warmroute ./cmd/warmroute
CGO_ENABLED=0 go build -trimpath -o bin/benchproxy ./loadtest/benchproxy

nice_arg=${BENCH_NICE:--10}
[ "$(id -u)" = 0 ] || nice_arg=0
pid=""
cleanup() {
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  fi
}
trap cleanup EXIT INT TERM
# The harness itself (and its streaming client) runs on the load
# generator's CPU.
timeout --kill-after=30s "${BENCH_TIMEOUT:-30m}" \
  taskset -c 1 ./bin/benchproxy -nice "$nice_arg" -out out/bench-proxy "$@" &
pid=$!
wait "$pid"
pid=""

if [ "${SKIP_RING:-0}" != 1 ]; then
  echo
  echo "Ring scale benchmarks (rebuild time and retained memory; routing decision vs prompt length):"
  go test -run '^$' -bench 'BenchmarkNew|BenchmarkRoute' -benchmem -count 3 ./ring | tee out/bench-proxy/ring.txt
fi
