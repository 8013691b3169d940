package proxy

import (
	"bufio"
	"errors"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"
	"github.com/warmroute/warmroute/ring"
)

// The upstream step: what a request's head becomes on its way to a
// backend, and what the answer's head becomes on its way back, whichever
// way forward then passes the answer on (sendMode).
//
//   - Once per request, before a backend is picked (prepareUpstream): an
//     upgrade or a request that went round a loop of routers is refused,
//     the hop-by-hop fields go and the hop count goes one up. The client's
//     Connection: close is kept for its own connection (dispatch).
//   - On every attempt (sendHead): the request line and Host name the
//     backend, the upstream span's context goes out as the traceparent, the
//     request goes out on the connection the mode chooses and the answer's
//     head is read.
//   - On the answer's head (upstreamHeaders): a 101 or a status outside
//     200-599 is refused with 502, the hop-by-hop fields go.
//   - On a failure to send or to read the head (upstreamFailed): another
//     backend is tried when the request never left this router, otherwise
//     the client gets the error.

// prepareUpstream readies a client's request to be forwarded: it refuses
// protocol upgrades and requests that went round a loop of routers,
// removes the hop-by-hop fields and sets this router's hop count. It
// answers the client itself and returns false when the request must not
// be forwarded. The client's Connection: close is kept by the caller.
func (p *Proxy) prepareUpstream(ctx *fasthttp.RequestCtx, st *reqState, rt route) bool {
	h := &ctx.Request.Header
	h.ResetConnectionClose()
	var found hopSet
	for k := range h.All() {
		found |= hopField(k)
	}
	hops := 0
	if found != 0 {
		status, code, msg := 0, "", ""
		switch {
		case found&hopUpgrade != 0 && !onlyH2C(h):
			status, code, msg = fasthttp.StatusBadRequest, "upgrade_not_supported",
				"protocol upgrades (Upgrade: websocket and the like) are not supported: the router forwards HTTP/1.1 requests only"
		case found&hopHops != 0:
			n, ok := parseHops(h.Peek(HeaderHops))
			switch {
			case !ok:
				status, code, msg = fasthttp.StatusBadRequest, "invalid_hops",
					"invalid "+HeaderHops+" field: want the count of routers passed, 0-999"
			case n >= p.cfg.MaxHops:
				status, code, msg = fasthttp.StatusLoopDetected, "loop_detected",
					"the request already passed "+strconv.Itoa(n)+" warmroute routers (the limit is "+strconv.Itoa(p.cfg.MaxHops)+"): a backend address leads back to a router"
			}
			hops = n
		}
		if status == 0 {
			if err := stripRequestHop(h, requestHop, &st.scratch); err != nil {
				status, code, msg = fasthttp.StatusBadRequest, "invalid_connection_header", err.Error()
			}
		}
		if status != 0 {
			writeError(ctx, status, code, msg)
			p.m.countRequest(p.m.none, rt, ring.ReasonNone, status)
			return false
		}
	}
	h.SetCanonical(hopsKey, hopValues[hops+1])
	return true
}

// sendMode is how forward passes an answer on; it decides the connection
// the request goes out on.
type sendMode uint8

const (
	// sendBuffered: on b's pooled connections, the answer read whole into
	// the client's response.
	sendBuffered sendMode = iota
	// sendStreamed: on b's pooled connections, the body passed on as it
	// comes by the request's goroutine (passStream).
	sendStreamed
	// sendRelayed: on a connection outside the pool (exchangeHead), the
	// body passed on by the relay (forwardRelayed) or, when it is not
	// chunked, by the goroutine (passUnchunked).
	sendRelayed
)

// upstream is an exchange with a backend whose answer's head was read and
// accepted. resp is the answer: the client's response itself when
// buffered, else one of its own with the body still to come. uc and br
// are a relayed exchange's connection and its reader, which holds what
// was read past the head.
type upstream struct {
	mode sendMode
	resp *fasthttp.Response
	uc   *upstreamConn
	br   *bufio.Reader
}

// sendHead is the upstream step of each attempt to forward the request to
// b, the same for every mode: the backend sees its own address as Host
// and an origin-form target (path and query), whatever form the client's
// request line took, and the upstream span's traceparent (observeSend);
// the request goes out on a connection of mode's and the answer's head is
// read and checked (upstreamHeaders), its fields copied into the client's
// response. (One difference stays with the connection: on b's pooled
// connections fasthttp's HostClient names itself as User-Agent when the
// client sent none and writes the path as the client did, while
// exchangeHead writes the request as it is, its path normalised.)
//
// ok: the caller passes the answer on. A buffered exchange is over then,
// b's in-flight slot (taken by hold) given back; any other still holds
// it. !ok: the exchange is over, its slot given back and its connection
// and response let go; retry and err are forward's results (retry: the
// request never reached b).
func (p *Proxy) sendHead(ctx *fasthttp.RequestCtx, st *reqState, b *backend, d ring.Decision, rt route, mode sendMode, sent time.Time) (x upstream, ok, retry bool, err error) {
	req := &ctx.Request
	req.Header.SetHost(b.target.HostPort)
	req.SetRequestURIBytes(ctx.RequestURI())
	// A request that came over TLS carries an https URI; the backend's
	// scheme is its own (HostClient refuses a mismatch). An absolute-form
	// target names a host of the client's choosing: the URI's host is what
	// goes out as Host.
	uri := req.URI()
	uri.SetSchemeBytes(b.scheme)
	uri.SetHost(b.target.HostPort)
	if p.observing {
		p.observeSend(req, st, b, d, sent)
	}

	x.mode = mode
	switch mode {
	case sendBuffered:
		x.resp = &ctx.Response
		err = b.client.Do(req, x.resp)
		// The answer is read whole (or never came): the exchange is over.
		b.inflight.Add(-1)
	case sendStreamed:
		x.resp = fasthttp.AcquireResponse()
		x.resp.StreamBody = true
		err = b.client.Do(req, x.resp)
	case sendRelayed:
		x.resp = fasthttp.AcquireResponse()
		x.uc, x.br, err = p.exchangeHead(b, req, x.resp)
	}
	if err != nil {
		if mode != sendBuffered {
			b.inflight.Add(-1)
			fasthttp.ReleaseResponse(x.resp)
		}
		if p.observing {
			p.observeFailed(st, err)
		}
		retry, err = p.upstreamFailed(ctx, b, d, rt, err)
		return upstream{}, false, retry, err
	}
	b.connOK()
	if mode != sendBuffered {
		x.resp.Header.CopyTo(&ctx.Response.Header)
	}
	if !p.upstreamHeaders(ctx, st, b, d, rt, x.resp) {
		p.dropUpstream(b, x)
		return upstream{}, false, false, nil
	}
	return x, true, false, nil
}

// dropUpstream ends an exchange whose answer was refused, or whose body
// could not be read, after its head: the body still to come is dropped
// with its connection (closed, never reused), the response released and
// b's slot given back. A buffered exchange is over already.
func (p *Proxy) dropUpstream(b *backend, x upstream) {
	switch x.mode {
	case sendBuffered:
		return
	case sendStreamed:
		if bs, ok := x.resp.BodyStream().(fasthttp.ReadCloserWithError); ok && bs != nil {
			_ = bs.CloseWithError(errBadUpstream)
		}
	case sendRelayed:
		p.closeExchange(b, x.uc, x.br)
	}
	fasthttp.ReleaseResponse(x.resp)
	b.inflight.Add(-1)
}

// errBadUpstream closes the stream of a response the proxy refused.
var errBadUpstream = errors.New("response refused")

// upstreamHeaders checks the status of the response up from b and removes
// its hop-by-hop fields from the client's response (ctx.Response, into
// which up's header was copied, or which is up). A backend that switched
// protocols (101) or sent a status outside 200-599 gets its connection
// closed, never reused, and the client 502: it returns false then.
func (p *Proxy) upstreamHeaders(ctx *fasthttp.RequestCtx, st *reqState, b *backend, d ring.Decision, rt route, up *fasthttp.Response) bool {
	resp := &ctx.Response
	resp.Header.ResetConnectionClose()
	status, code, msg := 0, "", ""
	switch sc := up.StatusCode(); {
	case sc == fasthttp.StatusSwitchingProtocols:
		closeUpstream(up)
		status, code, msg = fasthttp.StatusBadGateway, "upstream_switched_protocols",
			"backend "+b.id+" switched protocols (101); the router does not forward upgrades"
	case sc < 200 || sc > 599:
		closeUpstream(up)
		status, code, msg = fasthttp.StatusBadGateway, "upstream_invalid_status",
			"backend "+b.id+" answered with status "+strconv.Itoa(sc)
	default:
		var found hopSet
		for k := range resp.Header.All() {
			found |= hopField(k)
		}
		if found&responseHop == 0 {
			return true
		}
		err := stripResponseHop(&resp.Header, responseHop, &st.scratch)
		if err == nil {
			return true
		}
		status, code, msg = fasthttp.StatusBadGateway, "upstream_invalid_header", "backend "+b.id+" sent an invalid header: "+err.Error()
	}
	b.m.upErrors["protocol"].Inc()
	writeError(ctx, status, code, msg)
	p.m.countRequest(b.m, rt, d.Reason, status)
	return false
}

// closeUpstream closes the connection a response with a status outside
// 2xx-5xx came on. Its reads marked it unusable before fasthttp could pool
// it (see upstreamConn.sniff), so no other request uses it; this ends it
// now rather than when the pool next hands it out.
func closeUpstream(up *fasthttp.Response) {
	if a, ok := up.LocalAddr().(*upstreamAddr); ok && a.c.noReuse.Load() {
		_ = a.c.Conn.Close()
	}
}

// upstreamFailed answers a failed exchange, or asks for a retry when the
// request never left this node.
func (p *Proxy) upstreamFailed(ctx *fasthttp.RequestCtx, b *backend, d ring.Decision, rt route, err error) (bool, error) {
	switch {
	case errors.Is(err, errDial) || errors.Is(err, fasthttp.ErrDialTimeout) || errors.Is(err, errStaleConn):
		b.m.upErrors["dial"].Inc()
		if b.connFailed(&p.cfg, time.Now()) {
			b.m.ejects.Inc()
			p.log.Warn("backend ejected after connect failures", "backend", b.id, "for", p.cfg.EjectFor)
		}
		return true, err
	case errors.Is(err, fasthttp.ErrNoFreeConns):
		b.m.upErrors["no_free_conns"].Inc()
		return true, err
	case errors.Is(err, fasthttp.ErrBodyTooLarge):
		b.m.upErrors["protocol"].Inc()
		writeError(ctx, fasthttp.StatusBadGateway, "upstream_response_too_large",
			"backend "+b.id+" sent a response over "+strconv.Itoa(int(p.cfg.MaxBufferedResponse))+
				" bytes, the limit for answers that are not streamed (max-buffered-response); ask for a streamed answer (\"stream\": true)")
		p.m.countRequest(b.m, rt, d.Reason, fasthttp.StatusBadGateway)
		return false, err
	case errors.Is(err, fasthttp.ErrTimeout):
		b.m.upErrors["timeout"].Inc()
		writeError(ctx, fasthttp.StatusGatewayTimeout, "upstream_timeout", "backend "+b.id+" did not answer in time")
		p.m.countRequest(b.m, rt, d.Reason, fasthttp.StatusGatewayTimeout)
		return false, err
	}
	b.m.upErrors["other"].Inc()
	writeError(ctx, fasthttp.StatusBadGateway, "upstream_error", "backend "+b.id+" failed: "+err.Error())
	p.m.countRequest(b.m, rt, d.Reason, fasthttp.StatusBadGateway)
	return false, err
}
