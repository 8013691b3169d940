package main

import (
	"fmt"
	"strings"
)

// haproxyConfig renders the HAProxy configuration the comparison runs:
// one thread (the process is pinned to one core, as warmroute is), HTTP
// keep-alive on both sides with server connection reuse, and body-prefix
// affinity with bounded loads: the request is buffered, the first
// prefixBytes bytes of its body are hashed onto a consistent-hash ring,
// and hash-balance-factor caps any server at balanceFactor percent of the
// average load. http-no-delay makes HAProxy forward SSE chunks as they
// come: without it HAProxy sends with MSG_MORE and an SSE stream reached
// the client only at its end.
func haproxyConfig(listen string, backends []string, prefixBytes, balanceFactor int) string {
	var b strings.Builder
	fmt.Fprintf(&b, `global
    nbthread 1
    maxconn 4096

defaults
    mode http
    timeout connect 2s
    timeout client 60s
    timeout server 60s
    timeout http-request 30s
    option http-keep-alive
    option http-no-delay
    http-reuse always

frontend bench
    bind %s
    default_backend engines

backend engines
    option http-buffer-request
    balance hash req.body,bytes(0,%d)
    hash-type consistent
    hash-balance-factor %d
`, listen, prefixBytes, balanceFactor)
	for i, a := range backends {
		fmt.Fprintf(&b, "    server e%d %s\n", i, a)
	}
	return b.String()
}
