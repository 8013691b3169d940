package proxy

import (
	"errors"
	"net"
	"sync/atomic"
	"time"

	"github.com/warmroute/warmroute/proxy/internal/rawio"
)

// A client connection counts itself closed (clientClose), watches its first
// request head (firstHead) and bounds how long a write to a client that
// stopped reading may stall. Where the connection has a raw descriptor it
// does its own I/O (rawConn, over a rawio.Socket); elsewhere it is a
// countedConn.

// clientClose is the closing of a client connection: counted once in
// open, and, once lingerOnClose was called, handed to linger instead of
// closed at once (see Proxy.lingerClose).
type clientClose struct {
	open       *atomic.Int64
	linger     func(net.Conn)
	closed     atomic.Bool
	lingerNext atomic.Bool
}

// lingerOnClose makes the coming Close linger: the connection's answer
// goes out before its request was read to the end.
func (cc *clientClose) lingerOnClose() { cc.lingerNext.Store(true) }

// handOver makes the coming Close close the connection without counting
// it closed: its socket lives on elsewhere (the relay), which counts it.
func (cc *clientClose) handOver() { cc.closed.Store(true) }

// close closes c; the first call counts it closed and lingers if asked to.
func (cc *clientClose) close(c net.Conn) error {
	if cc.closed.CompareAndSwap(false, true) {
		cc.open.Add(-1)
		if cc.linger != nil && cc.lingerNext.Load() {
			cc.linger(c)
			return nil
		}
	}
	return c.Close()
}

// Errors of a client connection's first request head (see firstHead).
var (
	errTLSOnPlainPort = errors.New("TLS handshake on a plain-HTTP port")
	errBareLF         = errors.New("request head with a bare LF line ending")
)

// firstHead watches the bytes of a client connection's first request head
// as they are read, up to the CRLFCRLF that ends it. fasthttp waits for that
// CRLFCRLF before it parses a head whose lines end in a bare LF (a block
// ended by "\n\n" alone would be framed differently by other parsers), and
// a TLS ClientHello has no line end at all: either way it would wait for
// bytes that never come, until the read timeout. So a head with a bare LF,
// or a connection whose first byte starts a TLS handshake record (0x16),
// makes the next read fail at once with errBareLF or errTLSOnPlainPort, and
// the server answers 400 and closes (handleServerError). The first request
// only: after it the connection has shown it speaks HTTP with CRLF, and
// where a later head starts is the parser's business.
type firstHead struct {
	done bool    // the head ended, or err is set
	seen int     // bytes inspected
	last [3]byte // the last three bytes inspected
	err  error
}

// inspect looks at bytes just read.
func (h *firstHead) inspect(p []byte) {
	if h.seen == 0 && len(p) > 0 && p[0] == 0x16 {
		h.err, h.done = errTLSOnPlainPort, true
		return
	}
	for _, c := range p {
		if c == '\n' {
			if h.last[2] != '\r' {
				h.err, h.done = errBareLF, true
				return
			}
			if h.last == [3]byte{'\r', '\n', '\r'} {
				h.done = true
				return
			}
		}
		h.last = [3]byte{h.last[1], h.last[2], c}
		h.seen++
	}
}

// framingErr returns the error found in the connection's first request
// head, or nil.
func (h *firstHead) framingErr() error { return h.err }

// countedConn is a client connection that counts itself closed and sets a
// write deadline of writeStall before each write: the portable form of
// rawConn's accounting.
type countedConn struct {
	net.Conn
	writeStall time.Duration
	clientClose
	firstHead
}

func (c *countedConn) Read(p []byte) (int, error) {
	if c.err != nil {
		return 0, c.err
	}
	n, err := c.Conn.Read(p)
	if !c.done {
		c.inspect(p[:n])
	}
	return n, err
}

func newCountedConn(c net.Conn, writeStall time.Duration, open *atomic.Int64, linger func(net.Conn)) net.Conn {
	return &countedConn{Conn: c, writeStall: writeStall, clientClose: clientClose{open: open, linger: linger}}
}

func (c *countedConn) Write(p []byte) (int, error) {
	if c.writeStall > 0 {
		if err := c.Conn.SetWriteDeadline(time.Now().Add(c.writeStall)); err != nil {
			return 0, err
		}
	}
	return c.Conn.Write(p)
}

// Close closes the connection (see clientClose).
func (c *countedConn) Close() error { return c.clientClose.close(c.Conn) }

// rawConn is a client connection whose reads and writes go through a
// rawio.Socket.
//
// For a streamed answer it can hold the headers back (holdHeaders): when
// the engine sent its headers together with the first event, both go out in
// one write, so the client wakes once for them; when the upstream read for
// the first event would wait (the engine sent its headers first, as vLLM
// does, and is still prefilling), the headers go out before it waits, as
// they did before.
type rawConn struct {
	net.Conn
	s *rawio.Socket

	clientClose
	firstHead

	hold    bool          // the next write goes out together with held
	held    []byte        // headers held back
	heldErr error         // a failed write of held, returned by the next write
	up      *rawio.Socket // the upstream whose blocking read flushes held
	flushFn func()        // flushHeld, bound once
}

// newRawConn wraps a client connection: writes that stall longer than
// writeStall fail, and Close counts it closed in open and, when asked,
// lingers with linger (see clientClose). A connection without a raw
// descriptor, or on a platform without raw socket I/O, gets the portable
// wrapper.
func newRawConn(c net.Conn, writeStall time.Duration, open *atomic.Int64, linger func(net.Conn)) net.Conn {
	s := rawio.NewSocket(c, writeStall)
	if s == nil {
		return newCountedConn(c, writeStall, open, linger)
	}
	rc := &rawConn{Conn: c, s: s, clientClose: clientClose{open: open, linger: linger}}
	rc.flushFn = rc.flushHeld
	return rc
}

// Close closes the connection (see clientClose).
func (c *rawConn) Close() error { return c.clientClose.close(c.Conn) }

// SetReadDeadline records the deadline; it reaches the poller when a read
// waits (see rawio.Socket.SetReadDeadline).
func (c *rawConn) SetReadDeadline(t time.Time) error {
	return c.s.SetReadDeadline(deadlineNanos(t), time.Now().UnixNano())
}

// SetDeadline is SetReadDeadline plus the write deadline.
func (c *rawConn) SetDeadline(t time.Time) error {
	if err := c.Conn.SetWriteDeadline(t); err != nil {
		return err
	}
	return c.s.SetReadDeadline(deadlineNanos(t), time.Now().UnixNano())
}

func (c *rawConn) Read(p []byte) (int, error) {
	c.flushHeld()
	if c.done {
		if c.err != nil {
			return 0, c.err
		}
		return c.s.Read(p)
	}
	n, err := c.s.Read(p)
	c.inspect(p[:n])
	return n, err
}

func (c *rawConn) Write(p []byte) (int, error) {
	if c.heldErr != nil {
		err := c.heldErr
		c.heldErr = nil
		return 0, err
	}
	if !c.hold {
		return c.s.Write(p)
	}
	if len(c.held) == 0 {
		c.held = append(c.held, p...)
		return len(p), nil
	}
	// The first body bytes: out with the headers, in one write.
	c.stopHolding()
	first := len(c.held)
	c.held = append(c.held, p...)
	n, err := c.s.Write(c.held)
	c.held = c.held[:0]
	return max(0, n-first), err
}

// holdHeaders holds the next write (the answer's headers) until the one
// after it, or until a read on up would wait.
func (c *rawConn) holdHeaders(up *rawio.Socket) {
	c.hold, c.up = true, up
	up.OnBlock(c.flushFn)
}

func (c *rawConn) stopHolding() {
	c.hold = false
	if c.up != nil {
		c.up.OnBlock(nil)
		c.up = nil
	}
}

// flushHeld sends the held headers now.
func (c *rawConn) flushHeld() {
	c.stopHolding()
	if len(c.held) == 0 {
		return
	}
	if _, err := c.s.Write(c.held); err != nil {
		c.heldErr = err
	}
	c.held = c.held[:0]
}

// releaseHold ends holding for a stream that is over; nil-safe.
func (c *rawConn) releaseHold() {
	if c != nil {
		c.flushHeld()
	}
}

// holdStreamHeaders makes client hold a streamed answer's headers until its
// first body bytes (see rawConn), when both ends do raw socket I/O. laddr
// is the upstream response's LocalAddr, which names the connection it came
// on. It returns the client connection to release when the stream ends, or
// nil.
func holdStreamHeaders(client net.Conn, laddr net.Addr) *rawConn {
	rc, ok := client.(*rawConn)
	if !ok {
		return nil
	}
	a, ok := laddr.(*upstreamAddr)
	if !ok || a.c.d == nil {
		return nil
	}
	rc.holdHeaders(a.c.d.Socket)
	return rc
}
