#!/usr/bin/env bash
# The soak test: a router in front of gpusim instances that are killed and
# restarted, under steady mixed load with client aborts, for SOAK_DURATION
# (default 10m); the router's goroutines, heap and RSS are sampled from its
# /metrics. Prints the curve and the pass criteria; exits non-zero on a
# failed criterion. Everything runs on 127.0.0.1; the router runs with
# cluster TLS (a CA and certificate made for the run, admin API over HTTPS).
set -euo pipefail
cd "$(dirname "$0")/.."
SOAK_DURATION=${SOAK_DURATION:-10m}
mkdir -p out
echo "soak: $SOAK_DURATION (log: out/soak.log)"
WARMROUTE_SOAK_DURATION="$SOAK_DURATION" go test -count=1 -run '^TestSoak$' -v -timeout 60m ./loadtest/soak 2>&1 | tee out/soak.log
exit "${PIPESTATUS[0]}"
