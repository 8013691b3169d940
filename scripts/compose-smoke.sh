#!/usr/bin/env bash
# Compose smoke test: builds the FROM-scratch image, starts the three-zone
# stack of deploy/compose under its own project name, and checks that
#   - every router is ready (GET /readyz),
#   - cluster TLS is on: every router's admin API serves HTTPS (plain HTTP
#     refused) with its own certificate from the stack's CA, which names it
#     (urn:warmroute:router:<name>, checked with 'warmroute tls show' when
#     openssl is installed), and answers /metrics with the admin token only,
#   - the three routers form one cluster across the zone networks
#     (warmroute_gossip_members 3 on each; with Raft, which then runs over
#     mutual TLS: one leader, every router at the same ring epoch), and
#     'warmroute status --ca-file' reads it over HTTPS from the backbone,
#   - a streaming chat request through each router is served as SSE and
#     every router sends it to the same backend, with the same epoch.
# Everything it creates (containers, networks, volumes, secrets) is removed
# on exit. Bounded in time (WR_SMOKE_TIMEOUT seconds, default 180).
#
# Where no Docker engine runs it says so and exits 0 (SKIPPED).
#
# Environment:
#   WR_SMOKE_NO_BUILD=1         use the existing warmroute:dev image
#   WR_SMOKE_ALLOW_NO_RAFT=1    accept a binary without --raft-listen (gossip-only cluster)
#   WR_SMOKE_KEEP=1             leave the stack running (prints how to remove it)
#   WARMROUTE_IMAGE             image to run (default warmroute:dev)
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
compose_file="$root/deploy/compose/docker-compose.yml"
timeout_s=${WR_SMOKE_TIMEOUT:-180}
export WARMROUTE_IMAGE=${WARMROUTE_IMAGE:-warmroute:dev}

say() { echo "compose-smoke: $*"; }
fail() {
	echo "compose-smoke: FAIL: $*" >&2
	exit 1
}

# --- Is there an engine? ----------------------------------------------------
if ! command -v docker >/dev/null 2>&1; then
	say "SKIPPED: docker is not installed; images and the compose smoke test were not run"
	exit 0
fi
if ! timeout 20 docker info >/dev/null 2>&1; then
	say "SKIPPED: no Docker engine is running (docker info failed); images and the compose smoke test were not run"
	exit 0
fi
if command -v docker-compose >/dev/null 2>&1; then
	compose_cmd=(docker-compose)
elif docker compose version >/dev/null 2>&1; then
	compose_cmd=(docker compose)
else
	say "SKIPPED: a Docker engine runs but neither docker-compose nor 'docker compose' is installed"
	exit 0
fi
command -v curl >/dev/null 2>&1 || fail "curl is needed"

# --- Image --------------------------------------------------------------------
if [ "${WR_SMOKE_NO_BUILD:-}" != 1 ]; then
	"$root/deploy/docker/build.sh"
fi
docker image inspect "$WARMROUTE_IMAGE" >/dev/null 2>&1 || fail "image $WARMROUTE_IMAGE not found (run make images)"

serve_help=$(docker run --rm "$WARMROUTE_IMAGE" serve --help 2>&1 || true)
missing=""
for flag in raft-listen raft-advertise data-dir bootstrap-expect admin-token-file cluster-tls-cert-file; do
	if ! grep -q -- "^ *-$flag " <<<"$serve_help"; then
		missing+=" --$flag"
	fi
done
raft=1
if [ -n "$missing" ]; then
	raft=0
	if [ "${WR_SMOKE_ALLOW_NO_RAFT:-}" = 1 ]; then
		say "NOTE: this build of warmroute serve lacks$missing; checking a gossip-only cluster (Raft checks not run)"
	else
		fail "this build of warmroute serve lacks$missing: the cluster flags the compose file sets have not landed (WR_SMOKE_ALLOW_NO_RAFT=1 checks the gossip-only cluster)"
	fi
fi

start=$SECONDS
left() { echo $((timeout_s - (SECONDS - start))); }

# --- A private project: its own name, network range, ports and secrets -------
export COMPOSE_PROJECT_NAME="wrsmoke$$"
used=$(docker network inspect $(docker network ls -q) --format '{{range .IPAM.Config}}{{.Subnet}} {{end}}' 2>/dev/null || true)
WR_NET=""
for n in $(seq 200 250); do
	if ! grep -q "10\.213\.$n\." <<<"$used"; then
		WR_NET="10.213.$n"
		break
	fi
done
[ -n "$WR_NET" ] || fail "no free 10.213.x.0/24 for the backbone network"
export WR_NET
# Empty host ports: Docker picks free ones on 127.0.0.1.
export WR_PORT_A="" WR_PORT_B="" WR_PORT_C="" WR_ADMIN_PORT_A="" WR_ADMIN_PORT_B="" WR_ADMIN_PORT_C=""
export WR_GPUSIM_TIME_SCALE=${WR_GPUSIM_TIME_SCALE:-0.1}
tmp=$(mktemp -d)
export WR_SECRETS_DIR="$tmp/secrets"
"$root/deploy/compose/init-secrets.sh" "$WR_SECRETS_DIR" >/dev/null
ca_file="$WR_SECRETS_DIR/ca/warmroute-ca.pem"
token=$(cat "$WR_SECRETS_DIR/admin.token")

dc() { timeout 120 "${compose_cmd[@]}" -f "$compose_file" "$@"; }

ok=0
cleanup() {
	local rc=$?
	if [ "$ok" != 1 ]; then
		say "router logs (last 40 lines each):"
		for r in router-a router-b router-c; do
			dc logs --no-color --tail 40 "$r" 2>&1 | sed "s/^/  /" || true
		done
	fi
	if [ "${WR_SMOKE_KEEP:-}" = 1 ]; then
		say "stack kept: COMPOSE_PROJECT_NAME=$COMPOSE_PROJECT_NAME WR_NET=$WR_NET docker-compose -f $compose_file down -v"
	else
		dc down -v --remove-orphans --timeout 5 >/dev/null 2>&1 || say "WARN: compose down failed"
		rm -rf "$tmp"
	fi
	exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

say "project $COMPOSE_PROJECT_NAME, backbone $WR_NET.0/24, image $WARMROUTE_IMAGE"
dc up -d --no-build >"$tmp/up.log" 2>&1 || {
	cat "$tmp/up.log" >&2
	fail "docker-compose up failed"
}

say "stack up ($((SECONDS - start))s)"
declare -A traffic admin
for r in router-a router-b router-c; do
	id=$(docker ps -q --filter "label=com.docker.compose.project=$COMPOSE_PROJECT_NAME" \
		--filter "label=com.docker.compose.service=$r")
	[ -n "$id" ] || fail "$r is not running"
	t=$(docker port "$id" 8080/tcp | head -1)
	a=$(docker port "$id" 9090/tcp | head -1)
	[ -n "$t" ] && [ -n "$a" ] || fail "no published ports for $r"
	traffic[$r]=$t
	admin[$r]=$a
done

# wait_for DESC CMD...: polls CMD until it succeeds or the time is up.
wait_for() {
	local desc=$1
	shift
	while ! "$@"; do
		[ "$(left)" -gt 0 ] || fail "timed out after ${timeout_s}s waiting for $desc"
		sleep 1
	done
	say "ok: $desc ($((SECONDS - start))s)"
}

# admin_curl ROUTER PATH [curl args]: the router's admin API over HTTPS,
# verified against the stack's CA under the router's service name (the DNS
# name in its certificate), with the admin token.
admin_curl() {
	local r=$1 p=$2
	shift 2
	curl -fsS --max-time 3 --cacert "$ca_file" --resolve "$r:${admin[$r]##*:}:127.0.0.1" \
		-H "Authorization: Bearer $token" "$@" "https://$r:${admin[$r]##*:}$p"
}

metric() { # metric ROUTER NAME_WITH_LABELS -> value or empty
	admin_curl "$1" /metrics 2>/dev/null | awk -v m="$2" '$1 == m { print $2 }' || true
}

all_ready() {
	local r
	for r in router-a router-b router-c; do
		curl -fsS --max-time 3 -o /dev/null "http://${traffic[$r]}/readyz" || return 1
	done
}
wait_for "all three routers ready" all_ready

# --- Cluster TLS ------------------------------------------------------------------
tls_on() {
	local r
	for r in router-a router-b router-c; do
		admin_curl "$r" /metrics -o /dev/null 2>/dev/null || return 1
	done
}
wait_for "cluster TLS: every admin API serves HTTPS with its router's certificate (CA-verified, service name) and the token" tls_on
for r in router-a router-b router-c; do
	code=$(curl -sS --max-time 3 -o /dev/null -w '%{http_code}' "http://${admin[$r]}/metrics" 2>/dev/null || true)
	[ "$code" != 200 ] || fail "$r: the admin API answered plain HTTP"
	code=$(curl -sS --max-time 3 -o /dev/null -w '%{http_code}' --cacert "$ca_file" \
		--resolve "$r:${admin[$r]##*:}:127.0.0.1" "https://$r:${admin[$r]##*:}/metrics" 2>/dev/null || true)
	[ "$code" = 401 ] || [ "$code" = 403 ] || fail "$r: /metrics without the admin token answered HTTP $code, want 401 or 403"
done
say "ok: plain HTTP refused, and /metrics without the token, on every admin port"
if command -v openssl >/dev/null 2>&1; then
	cp "$ca_file" "$tmp/ca.pem"
	for r in router-a router-b router-c; do
		openssl s_client -connect "127.0.0.1:${admin[$r]##*:}" -servername "$r" </dev/null 2>/dev/null |
			openssl x509 >"$tmp/$r.served.pem" 2>/dev/null || fail "$r: could not read the admin API's certificate"
		docker run --rm --network none --user "$(id -u):$(id -g)" -v "$tmp:/w:ro" "$WARMROUTE_IMAGE" \
			tls show --ca /w/ca.pem --name "$r" "/w/$r.served.pem" >"$tmp/$r.show" 2>&1 ||
			fail "$r: its certificate does not prove its name: $(cat "$tmp/$r.show")"
	done
	say "ok: each router's certificate names it (warmroute tls show --name --ca)"
fi

members_three() {
	local r
	for r in router-a router-b router-c; do
		[ "$(metric "$r" warmroute_gossip_members)" = 3 ] || return 1
	done
}
wait_for "gossip: three members seen by every router" members_three

if [ "$raft" = 1 ]; then
	raft_agreed() {
		local r leaders=0 epochs=""
		for r in router-a router-b router-c; do
			[ "$(metric "$r" 'warmroute_raft_state{state="leader"}')" = 1 ] && leaders=$((leaders + 1))
			epochs+="$(metric "$r" warmroute_ring_epoch) "
		done
		[ "$leaders" = 1 ] || return 1
		read -r e1 e2 e3 <<<"$epochs"
		[ -n "$e1" ] && [ "$e1" != 0 ] && [ "$e1" = "$e2" ] && [ "$e2" = "$e3" ]
	}
	wait_for "raft (mutual TLS): one leader, every router at the same ring epoch" raft_agreed
fi

# The CLI from inside the stack: HTTPS with --ca-file, the token, another
# router's service name (router-b's own secrets directory holds both files).
status_out=$(docker run --rm --network "${COMPOSE_PROJECT_NAME}_backbone" \
	-v "$WR_SECRETS_DIR/router-b:/s:ro" "$WARMROUTE_IMAGE" \
	status --admin https://router-a:9090 --ca-file /s/warmroute-ca.pem --token-file /s/admin.token 2>&1) ||
	fail "warmroute status over HTTPS failed: $status_out"
for r in router-a router-b router-c; do
	grep -q "$r" <<<"$status_out" || fail "warmroute status does not list $r: $status_out"
done
say "ok: warmroute status --ca-file over HTTPS lists the three routers"

# --- A streaming request through each router -----------------------------------
body='{"model":"meta-llama/Llama-3.1-70B-Instruct","stream":true,"max_tokens":8,"messages":[{"role":"system","content":"You are the compose smoke test. Answer briefly."},{"role":"user","content":"Which zone served this?"}]}'
first_backend=""
first_epoch=""
for r in router-a router-b router-c; do
	hdr="$tmp/$r.hdr"
	out="$tmp/$r.out"
	code=$(curl -sS -N --max-time 30 -o "$out" -D "$hdr" -w '%{http_code}' \
		-H 'Content-Type: application/json' --data "$body" "http://${traffic[$r]}/v1/chat/completions") || fail "$r: request failed"
	[ "$code" = 200 ] || fail "$r: HTTP $code: $(head -c 300 "$out")"
	grep -qi '^content-type: text/event-stream' "$hdr" || fail "$r: not an event stream: $(cat "$hdr")"
	chunks=$(grep -c '^data: {' "$out" || true)
	[ "$chunks" -ge 2 ] || fail "$r: $chunks SSE data chunks"
	grep -q '^data: \[DONE\]' "$out" || fail "$r: stream did not end with [DONE]"
	backend=$(awk -F': ' 'tolower($1) == "x-warmroute-backend" { gsub(/\r/, "", $2); print $2 }' "$hdr")
	decision=$(awk -F': ' 'tolower($1) == "x-warmroute-decision" { gsub(/\r/, "", $2); print $2 }' "$hdr")
	epoch=$(awk -F': ' 'tolower($1) == "x-warmroute-epoch" { gsub(/\r/, "", $2); print $2 }' "$hdr")
	[ -n "$backend" ] || fail "$r: no X-Warmroute-Backend header"
	say "ok: $r streamed $chunks chunks from $backend ($decision, epoch $epoch)"
	if [ -z "$first_backend" ]; then
		first_backend=$backend
		first_epoch=$epoch
	else
		[ "$backend" = "$first_backend" ] || fail "$r sent the prompt to $backend, router-a to $first_backend"
		[ "$epoch" = "$first_epoch" ] || fail "$r is at epoch $epoch, router-a at $first_epoch"
	fi
done

ok=1
say "PASS in $((SECONDS - start))s"
