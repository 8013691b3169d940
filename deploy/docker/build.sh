#!/usr/bin/env bash
# Builds the warmroute image FROM scratch: a static CGO_ENABLED=0 binary,
# a passwd/group entry for the non-root user 65532, and the host's CA
# bundle (for https backends). Nothing is pulled from a registry.
#
# usage: deploy/docker/build.sh            (tags warmroute:dev and warmroute:$VERSION)
#   IMAGE=name   image name (default warmroute)
#   TAG=tag      extra tag (default: git describe)
#   GO=go        Go command
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
here="$root/deploy/docker"
IMAGE=${IMAGE:-warmroute}
GO=${GO:-go}
VERSION=${VERSION:-$(git -C "$root" describe --always --dirty 2>/dev/null || echo dev)}
TAG=${TAG:-$VERSION}

if ! command -v docker >/dev/null 2>&1; then
	echo "images: docker not found" >&2
	exit 2
fi

ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT

echo "images: building static binary ($VERSION)"
(cd "$root" && CGO_ENABLED=0 "$GO" build -trimpath -ldflags "-s -w -X main.version=$VERSION" \
	-o "$ctx/warmroute" ./cmd/warmroute)

# The image has no libc or loader: refuse a binary that needs one.
if ! "$GO" version -m "$ctx/warmroute" | grep -q 'CGO_ENABLED=0'; then
	echo "images: binary was not built with CGO_ENABLED=0" >&2
	exit 1
fi
if command -v readelf >/dev/null 2>&1 && readelf -l "$ctx/warmroute" | grep -q 'INTERP'; then
	echo "images: binary is dynamically linked" >&2
	exit 1
fi

cp "$here/Dockerfile" "$here/passwd" "$here/group" "$ctx/"
mkdir "$ctx/data"
ca=""
for f in /etc/ssl/certs/ca-certificates.crt /etc/pki/tls/certs/ca-bundle.crt /etc/ssl/cert.pem; do
	if [ -s "$f" ]; then ca=$f; break; fi
done
if [ -n "$ca" ]; then
	cp "$ca" "$ctx/ca-certificates.crt"
else
	echo "images: no CA bundle on this host; https backends will not verify" >&2
	: >"$ctx/ca-certificates.crt"
fi

echo "images: docker build $IMAGE:dev $IMAGE:$TAG"
# The legacy builder's deprecation notice goes to stderr on every build:
# show stderr only when the build fails.
if ! docker build -q --label "org.opencontainers.image.version=$VERSION" \
	--label "org.opencontainers.image.source=https://github.com/warmroute/warmroute" \
	-t "$IMAGE:dev" -t "$IMAGE:$TAG" "$ctx" >/dev/null 2>"$ctx/build.err"; then
	cat "$ctx/build.err" >&2
	exit 1
fi
docker image inspect "$IMAGE:dev" --format 'images: {{index .RepoTags 0}} {{.Id}} {{.Size}} bytes, user {{.Config.User}}'
