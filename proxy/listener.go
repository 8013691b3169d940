package proxy

import (
	"context"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/valyala/fasthttp"
)

// Listen opens the client listener on addr (TCP). Accepted connections
// get no TCP keep-alive probes (Go's default sets four socket options on
// every accepted connection): an idle client is closed after IdleTimeout,
// and one that vanishes mid-stream by the write stall deadline
// (WriteTimeout), so probes would find nothing those do not.
func Listen(addr string) (net.Listener, error) {
	lc := net.ListenConfig{KeepAlive: -1}
	return lc.Listen(context.Background(), "tcp", addr)
}

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
