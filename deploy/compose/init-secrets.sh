#!/usr/bin/env bash
# Creates the compose stack's secrets in deploy/compose/secrets (or the
# directory given):
#
#   gossip.key, admin.token   a random 32-byte gossip key and the admin
#                             bearer token (the CLI's --token-file)
#   ca/                       the cluster CA: warmroute-ca.pem and
#                             warmroute-ca-key.pem (mode 0600, never mounted
#                             into a container)
#   router-a/ router-b/ router-c/
#                             what each router mounts at /run/secrets: its
#                             own certificate and key (router-a.pem,
#                             router-a-key.pem), warmroute-ca.pem,
#                             gossip.key and admin.token; no router sees
#                             another's key
#   prometheus/               admin.token and warmroute-ca.pem for the
#                             monitoring profile
#
# Existing keys, tokens and certificates are kept (the copies in the
# router and prometheus directories are refreshed). The CA and the router
# certificates (1 year; DNS name = the service name, for Prometheus) are
# made by `warmroute tls`, run from WARMROUTE_BIN when set, else from the
# image WARMROUTE_IMAGE (default warmroute:dev; build it with make images).
# The routers' files belong to uid 65532, the image's user, and
# prometheus/ to 65534 (nobody, the Prometheus image's user); when chown is
# not permitted they are made world-readable instead.
#
# usage: deploy/compose/init-secrets.sh [DIR]
set -euo pipefail

routers=(router-a router-b router-c)
dir=${1:-$(cd "$(dirname "$0")" && pwd)/secrets}
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
umask 077
die() {
	echo "init-secrets: $*" >&2
	exit 1
}

if [ ! -s "$dir/gossip.key" ]; then
	head -c 32 /dev/urandom | base64 >"$dir/gossip.key"
fi
if [ ! -s "$dir/admin.token" ]; then
	head -c 24 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=\n' >"$dir/admin.token"
fi

# --- The cluster CA and one certificate per router (warmroute tls) -----------
if [ -n "${WARMROUTE_BIN:-}" ]; then
	out=$dir
	wr_tls() { "$WARMROUTE_BIN" tls "$@" >/dev/null; }
else
	image=${WARMROUTE_IMAGE:-warmroute:dev}
	command -v docker >/dev/null 2>&1 || die "docker not found; set WARMROUTE_BIN to a warmroute binary"
	docker image inspect "$image" >/dev/null 2>&1 ||
		die "image $image not found: run make images first (or set WARMROUTE_BIN to a warmroute binary)"
	out=/out
	wr_tls() {
		docker run --rm --network none --user "$(id -u):$(id -g)" -v "$dir:/out" "$image" tls "$@" >/dev/null
	}
fi

mkdir -p "$dir/ca"
chmod 0700 "$dir/ca"
if [ ! -s "$dir/ca/warmroute-ca.pem" ]; then
	wr_tls ca create --dir "$out/ca" --name "warmroute compose CA"
fi
missing=()
for r in "${routers[@]}"; do
	[ -s "$dir/$r/$r.pem" ] && [ -s "$dir/$r/$r-key.pem" ] || missing+=("$r")
done
if [ ${#missing[@]} -gt 0 ]; then
	staging="$dir/.new-certs"
	rm -rf "$staging"
	mkdir "$staging"
	names=$(
		IFS=,
		echo "${missing[*]}"
	)
	wr_tls cert create --dir "$out/.new-certs" --ca "$out/ca/warmroute-ca.pem" --names "$names" --dns '{name}'
	for r in "${missing[@]}"; do
		mkdir -p "$dir/$r"
		rm -f "$dir/$r/$r.pem" "$dir/$r/$r-key.pem"
		mv "$staging/$r.pem" "$staging/$r-key.pem" "$dir/$r/"
	done
	rmdir "$staging"
fi

# --- What each container mounts ------------------------------------------------
# copy SRC DIR: a fresh copy of SRC in DIR (the old one may be read-only).
copy() {
	rm -f "$2/$(basename "$1")"
	cp "$1" "$2/"
}
for r in "${routers[@]}"; do
	copy "$dir/gossip.key" "$dir/$r"
	copy "$dir/admin.token" "$dir/$r"
	copy "$dir/ca/warmroute-ca.pem" "$dir/$r"
done
mkdir -p "$dir/prometheus"
copy "$dir/admin.token" "$dir/prometheus"
copy "$dir/ca/warmroute-ca.pem" "$dir/prometheus"

# own UID FILE...: the files belong to UID, readable by it alone; else to
# everyone.
fallback=0
own() {
	local uid=$1
	shift
	if chown "$uid:$uid" "$@" 2>/dev/null; then
		chmod 0400 "$@"
	else
		fallback=1
		chmod 0444 "$@"
	fi
}
chmod 0755 "$dir"
own 65532 "$dir/gossip.key" "$dir/admin.token"
for r in "${routers[@]}"; do
	chmod 0755 "$dir/$r"
	own 65532 "$dir/$r"/*
done
chmod 0755 "$dir/prometheus"
own 65534 "$dir/prometheus"/*
if [ "$fallback" = 1 ]; then
	echo "init-secrets: cannot chown to 65532/65534; made the files world-readable (the CA key stays private)" >&2
fi
echo "$dir"
