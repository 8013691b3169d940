//go:build !linux

package proxy

import "net"

// Raw socket I/O is only implemented on Linux; elsewhere connections are
// used as they are, writes go out at once, and a pooled connection the
// backend closed is left to fasthttp's own handling.
type deferredWrite struct{}

func newDeferredWrite(net.Conn) *deferredWrite { return nil }

func newRawConn(c net.Conn) net.Conn { return c }

func (d *deferredWrite) write([]byte) (int, error) { panic("unreachable") }
func (d *deferredWrite) read([]byte) (int, error)  { panic("unreachable") }
func (d *deferredWrite) peerClosed() bool          { return false }
