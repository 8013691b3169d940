//go:build !unix

package proxy

import "net"

// peerClosed cannot look without blocking here; fasthttp's own handling
// applies.
func peerClosed(net.Conn) bool { return false }
