package proxy

import (
	"errors"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
)

// clientListener accepts client connections, refuses those over MaxConns
// with an OpenAI-style 503 (fasthttp's own refusal is plain text), and
// hands the server connections that count themselves and bound how long a
// write to a client that stopped reading may stall (see rawConn).
type clientListener struct {
	net.Listener
	p         *Proxy
	closeOnce *sync.Once // Shutdown and fasthttp both close it
}

// Close closes the listener once; later calls return nil.
func (l clientListener) Close() error {
	var err error
	l.closeOnce.Do(func() { err = l.Listener.Close() })
	return err
}

func (l clientListener) Accept() (net.Conn, error) {
	p := l.p
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if p.open.Add(1) > int64(p.cfg.MaxConns) {
			p.open.Add(-1)
			p.m.connsRejected.Inc()
			p.refuse(c)
			continue
		}
		return newRawConn(c, p.cfg.WriteTimeout, &p.open, p.lingerClose), nil
	}
}

// refusal is the answer to a connection over MaxConns.
var refusal = func() []byte {
	body := ErrorBody(fasthttp.StatusServiceUnavailable, "too_many_connections", "the router serves its maximum number of client connections; retry later")
	return append([]byte("HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\nConnection: close\r\nContent-Length: "+
		strconv.Itoa(len(body))+"\r\n\r\n"), body...)
}()

// maxLingering bounds the refused connections drained at once; past it
// they are closed at once.
const maxLingering = 64

// lingerFor is how long a refused connection is drained.
const lingerFor = 500 * time.Millisecond

// refuse answers a connection over the limit and closes it, lingering (the
// client has usually sent its request already).
func (p *Proxy) refuse(c net.Conn) {
	_ = c.SetDeadline(time.Now().Add(lingerFor))
	if _, err := c.Write(refusal); err != nil {
		c.Close()
		return
	}
	p.lingerClose(c)
}

// lingerClose closes a client connection that was answered without its
// request being read to the end (a refusal, a body over the limit, a
// request that cannot be parsed). Closing with those bytes unread would
// reset the connection, and a reset can destroy the answer before the
// client reads it. So the write side is shut (the answer is out, then
// FIN), and the rest is read and dropped for up to lingerFor, by a
// goroutine that Shutdown waits for: at most maxLingering of them, and
// none once Shutdown began; past that the connection is closed at once.
func (p *Proxy) lingerClose(c net.Conn) {
	p.mu.Lock()
	if p.shutdown || p.lingering.Load() >= maxLingering {
		p.mu.Unlock()
		c.Close()
		return
	}
	p.lingering.Add(1)
	p.wg.Add(1)
	p.mu.Unlock()
	_ = c.SetReadDeadline(time.Now().Add(lingerFor))
	go func() {
		defer p.wg.Done()
		defer p.lingering.Add(-1)
		if cw, ok := c.(interface{ CloseWrite() error }); ok {
			_ = cw.CloseWrite()
		}
		var buf [4 << 10]byte
		for {
			if _, err := c.Read(buf[:]); err != nil {
				break
			}
		}
		c.Close()
	}()
}

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
