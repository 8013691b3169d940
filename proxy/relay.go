package proxy

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"time"

	"github.com/valyala/fasthttp"
	"github.com/warmroute/warmroute/proxy/internal/relay"
	"github.com/warmroute/warmroute/ring"
)

// Streams on the relay.
//
// A streamed answer that a plain-TCP HTTP/1.1 client asked for from a
// plain-HTTP backend goes through the relay
// (internal/relay) once its headers are known: the request is sent on a
// connection outside the backend's fasthttp pool (exchangeHead: an idle
// one an earlier relayed stream left, relaypool.go, or a new one), the
// client gets the answer's headers, and both connections' descriptors move
// to an event loop, which passes the body as it comes. The request's
// goroutine, its buffers and the fasthttp request and response are
// released at once, so an open stream costs a small struct (relayStream)
// and its sockets' kernel buffers. When the body ended, the client
// connection comes back to the server for its next request (serveAgain),
// and the upstream one, when it may carry another request, to the
// backend's idle relay connections. An answer that turns out not to
// be chunked is passed by the goroutine path on the exchange's connection.
// Every other stream takes the goroutine path
// (trackedStream).

// relayStream is the proxy's side of a stream on the relay: it counts what
// the body carries and ends the request when the relay is done.
type relayStream struct {
	p    *Proxy
	b    *backend
	sent time.Time

	client *rawConn
	up     *upstreamConn
	br     *bufio.Reader // the upstream's reader, until the hand-over
	head   []byte        // the answer's headers for the client
	sse    bool
	// identity: the client speaks HTTP/1.0, so the body goes to it without
	// chunked framing and the connection's close ends it.
	identity bool
	// keepUp: the upstream connection may carry another request after the
	// answer (HTTP/1.1, no Connection: close, a plain final status).
	keepUp bool
	// keepAlive: the client connection serves its next request after the
	// stream (not when it asked to close).
	keepAlive bool
	pipelined []byte // what the client sent after the request

	usage    usageScan
	pred     prediction // what the router predicted of the answer (predict.go)
	gotFirst bool

	// obs: the request's access-log record and upstream span, when
	// observed.
	obs streamObs
}

// relayable reports whether the stream to b may go through the relay, and
// returns the client connection.
func (p *Proxy) relayable(ctx *fasthttp.RequestCtx, st *reqState, b *backend) (*rawConn, bool) {
	if p.relay == nil || b.target.TLS {
		return nil, false
	}
	rc, ok := ctx.Conn().(*rawConn)
	if !ok {
		return nil, false
	}
	// At the bound, an idle relay connection (counted) may still be used.
	if b.client.ConnsCount()+int(b.relayConns.Load()) >= p.cfg.MaxConnsPerBackend && b.idleUps.n.Load() == 0 {
		p.m.offRelay.Inc()
		return nil, false
	}
	return rc, true
}

// forwardRelayed is forward's stream branch for the relay (see relayable
// and sendRelayed): x's head came on a connection of its own, which the
// relay takes over with the client's rc. b's in-flight count is already
// up.
func (p *Proxy) forwardRelayed(ctx *fasthttp.RequestCtx, st *reqState, b *backend, d ring.Decision, rt route, sent time.Time, rc *rawConn, x upstream) (bool, error) {
	up := x.resp
	if up.Header.ContentLength() != -1 {
		return p.passUnchunked(ctx, st, b, d, rt, sent, x)
	}
	resp := &ctx.Response
	p.setHeaders(resp, st.t, b, d)
	p.m.countRequest(b.m, rt, d.Reason, up.StatusCode())

	identity := !ctx.Request.Header.IsHTTP11()
	rs := p.relayed.Get().(*relayStream)
	*rs = relayStream{p: p, b: b, sent: sent, client: rc, up: x.uc, br: x.br, head: rs.head[:0], pred: st.pred,
		sse:       bytes.HasPrefix(up.Header.ContentType(), strEventStream),
		identity:  identity,
		keepUp:    up.Header.IsHTTP11() && !up.Header.ConnectionClose() && !x.uc.noReuse.Load(),
		keepAlive: !st.clientClose && !identity}
	rs.usage.begin(&up.Header)
	if p.observing {
		rs.obs = takeStreamObs(&st.obs, up.StatusCode())
	}
	if identity {
		// HTTP/1.0 has no chunked framing (RFC 9112 section 6.1): the
		// body goes out as it comes, ended by closing the connection.
		resp.Header.Del(fasthttp.HeaderTransferEncoding)
	}
	if !rs.keepAlive {
		resp.Header.SetConnectionClose()
	}
	rs.head = resp.Header.AppendBytes(rs.head)
	fasthttp.ReleaseResponse(up)
	ctx.HijackSetNoResponse(true)
	ctx.Hijack(rs.hijacked)
	return false, nil
}

// closeExchange closes an exchangeHead connection that did not go to the
// relay, and returns its reader (nil-safe).
func (p *Proxy) closeExchange(b *backend, uc *upstreamConn, br *bufio.Reader) error {
	err := uc.Close()
	b.relayConns.Add(-1)
	p.putReader(br)
	return err
}

// passUnchunked passes an answer that is not chunked (a Content-Length,
// or a body that ends with the connection) through the goroutine path
// (passStream), on the exchange's connection, which closes at its end.
func (p *Proxy) passUnchunked(ctx *fasthttp.RequestCtx, st *reqState, b *backend, d ring.Decision, rt route, sent time.Time, x upstream) (bool, error) {
	up := x.resp
	up.StreamBody = true
	if err := up.ReadBody(x.br, 0); err != nil {
		p.dropUpstream(b, x)
		return p.upstreamFailed(ctx, b, d, rt, upstreamReadErr(err))
	}
	p.setHeaders(&ctx.Response, st.t, b, d)
	p.m.countRequest(b.m, rt, d.Reason, up.StatusCode())
	var bs fasthttp.ReadCloserWithError
	if r := up.BodyStream(); r != nil {
		bs = &exchangeBody{Reader: r, p: p, b: b, uc: x.uc, br: x.br}
	} else {
		p.closeExchange(b, x.uc, x.br)
	}
	return p.passStream(ctx, st, b, up, bs, sent)
}

// exchangeBody is the body of an exchangeHead answer read by the goroutine
// path; its end closes the exchange's connection.
type exchangeBody struct {
	io.Reader
	p      *Proxy
	b      *backend
	uc     *upstreamConn
	br     *bufio.Reader
	closed bool
}

func (e *exchangeBody) CloseWithError(error) error {
	if e.closed {
		return nil
	}
	e.closed = true
	return e.p.closeExchange(e.b, e.uc, e.br)
}

// exchangeHead sends req to b and reads the answer's headers into up
// (interim 1xx answers skipped), on an idle relay connection of b when
// there is one, otherwise on a new connection. The connection counts in
// b.relayConns until dropUpstream or the stream's end.
//
// An idle connection was checked (takeIdleUp), but the backend may still
// close it as the request goes out (its own keep-alive timeout): when
// writing the request or reading the answer on a reused connection fails
// with no byte of the answer arrived, and not by a deadline, the request
// was not answered and goes out once more, on a new connection, as
// fasthttp does on its pooled connections.
func (p *Proxy) exchangeHead(b *backend, req *fasthttp.Request, up *fasthttp.Response) (*upstreamConn, *bufio.Reader, error) {
	reuse := true
	for {
		uc, reused, err := p.relayConn(b, reuse)
		if err != nil {
			return nil, nil, err
		}
		br, err := p.writeReadHead(uc, req, up)
		if err == nil {
			return uc, br, nil
		}
		p.closeExchange(b, uc, br)
		err = upstreamReadErr(err)
		if !reused || uc.used || errors.Is(err, fasthttp.ErrTimeout) {
			return nil, nil, err
		}
		reuse = false
	}
}

// relayConn returns a connection to b for exchangeHead: an idle relay
// connection when reuse is set and b has one (reused), or a new one. It
// counts in b.relayConns.
func (p *Proxy) relayConn(b *backend, reuse bool) (uc *upstreamConn, reused bool, err error) {
	if reuse {
		if fd := b.takeIdleUp(time.Now().UnixNano(), p.cfg.IdleConnTimeout); fd >= 0 {
			return newUpstreamConn(relay.Resume(fd), p.cfg.FirstByteTimeout, p.cfg.StreamIdleTimeout), true, nil
		}
	}
	c, err := b.client.DialTimeout(b.target.HostPort, p.cfg.ConnectTimeout)
	if err != nil {
		return nil, false, err
	}
	uc, ok := c.(*upstreamConn)
	if !ok {
		c.Close()
		return nil, false, errors.New("upstream connection of an unexpected type")
	}
	b.relayConns.Add(1)
	return uc, false, nil
}

// writeReadHead writes req on uc and reads the answer's head into up. The
// reader it returns (nil when the write failed) holds what was read past
// the head.
func (p *Proxy) writeReadHead(uc *upstreamConn, req *fasthttp.Request, up *fasthttp.Response) (*bufio.Reader, error) {
	bw := p.writers.Get().(*bufio.Writer)
	bw.Reset(uc)
	err := req.Write(bw)
	if err == nil {
		err = bw.Flush()
	}
	bw.Reset(nil)
	p.writers.Put(bw)
	if err != nil {
		return nil, err
	}
	br := p.readers.Get().(*bufio.Reader)
	br.Reset(uc)
	return br, readFinalHead(up, br)
}

// readFinalHead reads a response head, skipping interim (1xx) ones except
// 101, at most 8 of them.
func readFinalHead(up *fasthttp.Response, br *bufio.Reader) error {
	for range 8 {
		if err := up.Header.Read(br); err != nil {
			return err
		}
		if sc := up.StatusCode(); sc < 100 || sc > 199 || sc == fasthttp.StatusSwitchingProtocols {
			return nil
		}
	}
	return errors.New("too many interim (1xx) answers")
}

// upstreamReadErr gives a read failure the error upstreamFailed knows:
// a deadline is fasthttp.ErrTimeout (504), as it is on the client path.
func upstreamReadErr(err error) error {
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return fasthttp.ErrTimeout
	}
	return err
}

func (p *Proxy) putReader(br *bufio.Reader) {
	if br != nil {
		br.Reset(nil)
		p.readers.Put(br)
	}
}

// maxPipelined bounds what a client may have sent after a relayed
// request and still get its connection back.
const maxPipelined = 64 << 10

// hijacked runs when the server let go of the client connection c (which
// wraps rs.client): both descriptors go to the relay.
func (rs *relayStream) hijacked(c net.Conn) {
	p := rs.p
	scratch := p.scratch.Get().(*[4 << 10]byte)
	rs.pipelined = readPipelined(c, rs.pipelined[:0], scratch[:])
	p.scratch.Put(scratch)
	if len(rs.pipelined) > maxPipelined {
		rs.keepAlive, rs.pipelined = false, nil
	}
	cfd, cerr := relay.Detach(rs.client.Conn)
	ufd, uerr := relay.Detach(rs.up.Conn)
	in, _ := rs.br.Peek(rs.br.Buffered()) // Start copies it
	// The relay holds both sockets now (or they close here): the server's
	// Close of c no longer counts the connection closed; serveAgain or
	// End does.
	rs.client.handOver()
	rs.up.Close()
	br := rs.br
	rs.br, rs.up = nil, nil
	defer p.putReader(br)
	if cerr != nil || uerr != nil {
		if cfd >= 0 {
			relay.CloseFD(cfd)
		}
		if ufd >= 0 {
			relay.CloseFD(ufd)
		}
		rs.End(relay.Result{Outcome: relay.Stopped, Client: -1, Up: -1, Err: errors.Join(cerr, uerr)})
		return
	}
	if err := p.relay.Start(relay.Spec{Up: ufd, Client: cfd, Head: rs.head, In: in, SSE: rs.sse, KeepUp: rs.keepUp, Identity: rs.identity, Obs: rs}); err != nil {
		rs.End(relay.Result{Outcome: relay.Stopped, Client: -1, Up: -1, Err: err})
	}
}

// readPipelined appends to dst what the server had read from c past the
// request (a client pipelining its next request), up to maxPipelined+1
// bytes, without waiting for more: the read deadline is in the past, so
// only buffered bytes come back. scratch is the read buffer; nothing is
// kept of it (hardly any client pipelines behind a stream).
func readPipelined(c net.Conn, dst, scratch []byte) []byte {
	_ = c.SetReadDeadline(time.Unix(1, 0))
	for len(dst) <= maxPipelined {
		n, err := c.Read(scratch)
		dst = append(dst, scratch[:n]...)
		if err != nil || n == 0 {
			break
		}
	}
	_ = c.SetReadDeadline(time.Time{})
	return dst
}

// Data hears body bytes as they pass (on the relay's loop).
func (rs *relayStream) Data(p []byte) {
	if !rs.gotFirst {
		rs.gotFirst = true
		rs.b.m.ttfb.Observe(time.Since(rs.sent).Seconds())
	}
	rs.usage.feed(p)
	rs.obs.passed(p, rs.sent)
}

// End ends the request (on the relay's loop, or in hijacked).
func (rs *relayStream) End(r relay.Result) {
	p, b := rs.p, rs.b
	switch r.Outcome {
	case relay.UpstreamFailed:
		b.m.upErrors["other"].Inc()
	case relay.ClientGone, relay.Stopped:
		b.m.aborts.Inc()
	}
	if r.Up >= 0 {
		b.putIdleUp(r.Up, time.Now().UnixNano(), p.cfg.idleUpLimit())
	} else {
		b.relayConns.Add(-1)
	}
	b.inflight.Add(-1)
	u := rs.usage.report()
	b.countUsage(rs.pred, u)
	if rs.obs.active() {
		var cerr error // how the client's side ended: nil when it got a whole answer
		if r.Client < 0 {
			cerr = r.Err
			if cerr == nil {
				cerr = errors.New(r.Outcome.String())
			}
		}
		rs.obs.end(p, u, cerr)
	}
	switch {
	case r.Client < 0:
		p.open.Add(-1)
	case rs.keepAlive:
		// The server closed rs.client at the hand-over; a closed
		// connection still reports its addresses, which the client's
		// descriptor keeps.
		p.serveAgain(r.Client, rs.client.LocalAddr(), rs.client.RemoteAddr(), rs.pipelined)
	default:
		relay.CloseFD(r.Client)
		p.open.Add(-1)
	}
	head := rs.head
	*rs = relayStream{head: head[:0]}
	p.relayed.Put(rs)
}

// serveAgain gives a client connection back to the server for its next
// request (prefixed with what it pipelined), unless Shutdown began. The
// connection is still counted open; it keeps its addresses laddr and
// raddr.
func (p *Proxy) serveAgain(fd int, laddr, raddr net.Addr, pipelined []byte) {
	c := relay.ResumeClient(fd, laddr, raddr)
	p.mu.Lock()
	if p.shutdown {
		p.mu.Unlock()
		c.Close()
		p.open.Add(-1)
		return
	}
	conn := newRawConn(c, p.cfg.WriteTimeout, &p.open, p.lingerClose)
	if len(pipelined) > 0 {
		conn = &prefixConn{Conn: conn, pre: bytes.Clone(pipelined)}
	}
	if p.servedAgain == nil {
		p.servedAgain = map[net.Conn]struct{}{}
	}
	p.servedAgain[conn] = struct{}{}
	p.wg.Add(1)
	p.mu.Unlock()
	go func() {
		defer p.wg.Done()
		_ = p.server.ServeConn(conn)
		p.mu.Lock()
		delete(p.servedAgain, conn)
		p.mu.Unlock()
	}()
}

// closeServedAgain closes the connections serveAgain gave the server that
// are still open (Shutdown, once the server's own wait is over), so their
// goroutines end.
func (p *Proxy) closeServedAgain() {
	p.mu.Lock()
	cs := make([]net.Conn, 0, len(p.servedAgain))
	for c := range p.servedAgain {
		cs = append(cs, c)
	}
	p.mu.Unlock()
	for _, c := range cs {
		c.Close()
	}
}

// prefixConn reads pre before its connection.
type prefixConn struct {
	net.Conn
	pre []byte
}

func (c *prefixConn) Read(b []byte) (int, error) {
	if len(c.pre) > 0 {
		n := copy(b, c.pre)
		c.pre = c.pre[n:]
		return n, nil
	}
	return c.Conn.Read(b)
}

var _ io.Reader = (*prefixConn)(nil)
