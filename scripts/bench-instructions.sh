#!/usr/bin/env bash
# User-space instructions per proxied request, HAProxy against warmroute,
# counted by valgrind's callgrind: a figure that does not depend on what
# else the machine is doing, unlike CPU time (docs/performance.md). Kernel
# work (system calls, TCP) is not counted; it is the same per system call
# for both, and the system calls are counted separately with strace -c.
#
# Each proxy runs alone under callgrind with one thread (GOMAXPROCS=1 and
# no async preemption for warmroute, whose SIGURG preemption signals trip
# callgrind), gets a 3 s wrk warm-up, then its counters are zeroed and it
# serves wrk (64 connections, the bench-proxy workload) for DURATION
# seconds; the count is divided by the requests wrk completed. HAProxy's
# configuration is bench-proxy's own (benchproxy haproxy-config). Requires
# valgrind, haproxy and wrk (installed with apt-get when missing).
# Usage: scripts/bench-instructions.sh [warmroute-binary ...]
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${DURATION:-10}

need=()
command -v valgrind >/dev/null || need+=(valgrind)
command -v haproxy >/dev/null || need+=(haproxy)
command -v wrk >/dev/null || need+=(wrk)
if [ ${#need[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}" >/dev/null
fi

mkdir -p bin out/bench-instructions
CGO_ENABLED=0 go build -trimpath -o bin/warmroute ./cmd/warmroute
CGO_ENABLED=0 go build -trimpath -o bin/benchproxy ./loadtest/benchproxy
out=out/bench-instructions
bins=("$@")
[ ${#bins[@]} -gt 0 ] || bins=(bin/warmroute)

pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT INT TERM

./bin/benchproxy script >"$out/chat.lua"
./bin/benchproxy stub -n 4 >"$out/stubs.txt" 2>&1 &
pids+=($!)
for _ in $(seq 1 50); do
  [ "$(grep -c LISTEN "$out/stubs.txt" || true)" = 4 ] && break
  sleep 0.1
done
addrs=$(awk '/LISTEN/ {print $2}' "$out/stubs.txt")
backends=$(echo "$addrs" | sed 's|^|http://|' | paste -sd, -)

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# measure NAME PORT CMD...: runs CMD under callgrind and prints Ir/request.
measure() {
  local name=$1 port=$2
  shift 2
  local cg=$out/callgrind.$name
  rm -f "$cg".*
  GODEBUG=asyncpreemptoff=1 GOMAXPROCS=1 valgrind --tool=callgrind --callgrind-out-file="$cg.%p" "$@" >"$out/$name.log" 2>&1 &
  local vp=$!
  pids+=("$vp")
  local url=http://127.0.0.1:$port/v1/chat/completions
  for _ in $(seq 1 100); do
    curl -s -o /dev/null -XPOST "$url" -d '{"model":"m","messages":[{"role":"user","content":"hi"}]}' && break
    sleep 0.3
  done
  wrk -t1 -c64 -d3s -s "$out/chat.lua" "$url" >/dev/null 2>&1
  callgrind_control -z "$vp" >/dev/null
  local res
  res=$(wrk -t1 -c64 -d"${DURATION}s" -s "$out/chat.lua" "$url" 2>&1)
  callgrind_control -d "$vp" >/dev/null
  sleep 1
  kill "$vp" 2>/dev/null || true
  wait "$vp" 2>/dev/null || true
  local n ir
  n=$(echo "$res" | awk '/requests in/ {print $1}')
  ir=$(callgrind_annotate "$(ls "$cg".*.1 | head -1)" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",","",$1); print $1}')
  if [ -z "$n" ] || [ -z "$ir" ] || echo "$res" | grep -q "Non-2xx"; then
    echo "$name: measurement failed; see $out/$name.log" >&2
    return 1
  fi
  printf '%-24s %8d requests %14d instructions %8d per request\n' "$name" "$n" "$ir" $((ir / n))
}

port=$(free_port)
./bin/benchproxy haproxy-config -listen "127.0.0.1:$port" -backends "$(echo "$addrs" | paste -sd, -)" >"$out/haproxy.cfg"
measure haproxy "$port" haproxy -db -f "$out/haproxy.cfg"

for b in "${bins[@]}"; do
  port=$(free_port)
  admin=$(free_port)
  measure "$(basename "$b")" "$port" "$b" serve --listen "127.0.0.1:$port" --admin-listen "127.0.0.1:$admin" \
    --backends "$backends" --strategy PREFIX_AWARE --prefix-length 2048 --load-factor 1.25 --log-level warn
done
