//go:build !linux

package proxy

import (
	"net"
	"sync/atomic"
	"time"
)

// Raw socket I/O is only implemented on Linux; elsewhere connections are
// used as they are, writes go out at once, and only the stale-connection
// peek remains (on other unix systems; see peek_unix.go).
type deferredWrite struct{ conn net.Conn }

func newDeferredWrite(c net.Conn, _ time.Duration) *deferredWrite { return &deferredWrite{conn: c} }

func newRawConn(c net.Conn, writeStall time.Duration, open *atomic.Int64, linger func(net.Conn)) net.Conn {
	return newCountedConn(c, writeStall, open, linger)
}

func (d *deferredWrite) write(p []byte) (int, error) { return d.conn.Write(p) }
func (d *deferredWrite) read(p []byte) (int, error)  { return d.conn.Read(p) }
func (d *deferredWrite) peerClosed() bool            { return peerClosed(d.conn) }

// setReadDeadline applies the deadline (unix nanoseconds) at once.
func (d *deferredWrite) setReadDeadline(dl, _ int64) error {
	return d.conn.SetReadDeadline(time.Unix(0, dl))
}

func (d *deferredWrite) pollerChanged() {}

type rawConn struct{}

func holdStreamHeaders(net.Conn, net.Addr) *rawConn { return nil }

func (c *rawConn) releaseHold() {}
