//go:build !unix

package proxy

import "net"

// deferredWrite is only implemented on unix; elsewhere newDeferredWrite
// returns nil, writes go out at once, and a pooled connection the backend
// closed is left to fasthttp's own handling.
type deferredWrite struct{}

func newDeferredWrite(net.Conn) *deferredWrite { return nil }

func (d *deferredWrite) write([]byte) (int, error) { panic("unreachable") }
func (d *deferredWrite) read([]byte) (int, error)  { panic("unreachable") }
func (d *deferredWrite) peerClosed() bool          { return false }
