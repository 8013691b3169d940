package main

import (
	"fmt"
	"strings"
)

// haproxyMaxConn is the client connections the wrk and streaming phases'
// HAProxy accepts.
const haproxyMaxConn = 4096

// haproxyConfig renders the HAProxy configuration the comparison runs:
// one thread (the process is pinned to one core, as warmroute is), HTTP
// keep-alive on both sides with server connection reuse, and body-prefix
// affinity with bounded loads: the request is buffered, the first
// prefixBytes bytes of its body are hashed onto a consistent-hash ring,
// and hash-balance-factor caps any server at balanceFactor percent of the
// average load. http-no-delay makes HAProxy forward SSE chunks as they
// come: without it HAProxy sends with MSG_MORE and an SSE stream reached
// the client only at its end. maxconn bounds client connections, in the
// process and (set in defaults too, since a frontend's own default may be
// lower) in the frontend.
func haproxyConfig(listen string, backends []string, prefixBytes, balanceFactor, maxconn int) string {
	var b strings.Builder
	fmt.Fprintf(&b, `global
    nbthread 1
    maxconn %d

defaults
    mode http
    maxconn %d
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
`, maxconn, maxconn, listen, prefixBytes, balanceFactor)
	for i, a := range backends {
		fmt.Fprintf(&b, "    server e%d %s\n", i, a)
	}
	return b.String()
}
