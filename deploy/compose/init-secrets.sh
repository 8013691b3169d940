#!/usr/bin/env bash
# Creates the compose stack's secrets: a random 32-byte gossip key and an
# admin bearer token, in deploy/compose/secrets (or the directory given).
# Existing files are kept. The files belong to uid 65532, the image's user;
# when chown is not permitted they are made world-readable instead.
#
# usage: deploy/compose/init-secrets.sh [DIR]
set -euo pipefail

dir=${1:-$(cd "$(dirname "$0")" && pwd)/secrets}
mkdir -p "$dir"
umask 077
if [ ! -s "$dir/gossip.key" ]; then
	head -c 32 /dev/urandom | base64 >"$dir/gossip.key"
fi
if [ ! -s "$dir/admin.token" ]; then
	head -c 24 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=\n' >"$dir/admin.token"
fi
chmod 0755 "$dir"
if chown 65532:65532 "$dir/gossip.key" "$dir/admin.token" 2>/dev/null; then
	chmod 0400 "$dir/gossip.key" "$dir/admin.token"
else
	echo "init-secrets: cannot chown to 65532; making the files world-readable" >&2
	chmod 0444 "$dir/gossip.key" "$dir/admin.token"
fi
echo "$dir"
