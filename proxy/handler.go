package proxy

import (
	"bytes"
	"errors"
	"io"
	"net"
	"time"

	"github.com/valyala/fasthttp"
	"github.com/warmroute/warmroute/ring"
)

// reqState is the per-request scratch: the key, the table in use and the
// backends already tried. It implements ring.Loads. Pooled, so a request
// allocates nothing for it.
type reqState struct {
	t     *table
	now   int64
	tried []uint64 // bitset of backend indexes already tried
	info  ring.KeyInfo
	// obs is the request's access log record and spans (observe.go).
	obs obsState
	// recompute is what prefilling the request away from its owner costs,
	// in average requests (cost.go), for the COST overflow rule.
	recompute int64
	// scratch holds Connection field options while hop-by-hop fields are
	// removed.
	scratch []byte
	// clientClose: the client asked to close its connection after this
	// request (read before the hop-by-hop fields are removed).
	clientClose bool
	// body is the request's body in memory (body.go).
	body reqBody
	// keyed: the request is routed on its key (routeLLM), so its answer
	// is predicted and counted (predict.go); pred is the prediction for
	// the backend it is sent to.
	keyed bool
	pred  prediction
}

var _ ring.Loads = (*reqState)(nil)

// reset readies s for a request on t arriving at now.
func (s *reqState) reset(t *table, now time.Time) {
	s.t = t
	s.now = now.UnixNano()
	s.clientClose = false
	s.keyed = false
	n := (len(t.bs) + 63) / 64
	if cap(s.tried) < n {
		s.tried = make([]uint64, n)
	}
	s.tried = s.tried[:n]
	clear(s.tried)
}

// useTable moves s, keyed but not yet sent, onto t: its model's table.
func (s *reqState) useTable(t *table) {
	s.t = t
	n := (len(t.bs) + 63) / 64
	if cap(s.tried) < n {
		s.tried = make([]uint64, n)
	}
	s.tried = s.tried[:n]
	clear(s.tried)
}

func (s *reqState) InFlight(b int) int64 { return s.t.bs[b].globalInFlight() }

func (s *reqState) Healthy(b int) bool {
	return s.tried[b>>6]&(1<<(b&63)) == 0 && s.t.bs[b].available(s.now)
}

func (s *reqState) Busy(b int) bool { return s.t.bs[b].busy() }

// Queued implements ring.Queues.
func (s *reqState) Queued(b int) int64 { return s.t.bs[b].queued() }

func (s *reqState) markTried(b int) { s.tried[b>>6] |= 1 << (b & 63) }

// handle is the fasthttp request handler.
func (p *Proxy) handle(ctx *fasthttp.RequestCtx) {
	switch string(ctx.Path()) {
	case "/v1/chat/completions":
		p.routeLLM(ctx, routeChat, ring.Chat)
	case "/v1/completions":
		p.routeLLM(ctx, routeCompletions, ring.Completions)
	case "/invocations":
		p.routeLLM(ctx, routeInvocations, ring.Invocations)
	case "/v1/embeddings":
		p.routeLLM(ctx, routeEmbeddings, ring.Embeddings)
	case "/v1/responses":
		p.routeLLM(ctx, routeResponses, ring.Responses)
	case "/v1/rerank", "/rerank", "/v2/rerank":
		p.routeLLM(ctx, routeRerank, ring.Rerank)
	case "/v1/score", "/score":
		p.routeLLM(ctx, routeScore, ring.Score)
	case "/tokenize":
		p.routeLLM(ctx, routeTokenize, ring.Tokenize)
	case "/detokenize":
		p.routeLLM(ctx, routeDetokenize, ring.Detokenize)
	case "/v1/audio/transcriptions", "/v1/audio/translations":
		// Multipart audio, passed through as it is: no prompt to key on
		// and nothing cached, so requests spread like /v1/models.
		if p.requirePost(ctx, routeAudio) {
			p.routeAny(ctx, routeAudio, true)
		}
	case "/v1/models":
		if !ctx.IsGet() && !ctx.IsHead() {
			p.methodNotAllowed(ctx, "GET")
			if p.observing {
				p.observeBare(ctx, routeModels)
			}
			return
		}
		if p.serveModels(ctx, p.tab.Load()) {
			p.answered(ctx, routeModels, fasthttp.StatusOK)
			return
		}
		p.routeAny(ctx, routeModels, false)
	case "/ping":
		if !ctx.IsGet() && !ctx.IsHead() {
			p.methodNotAllowed(ctx, "GET")
			return
		}
		if !p.Ready() {
			code := "no_healthy_backend"
			if p.unready.Load() != nil || p.held.Load() != nil {
				code = "not_ready"
			}
			writeError(ctx, fasthttp.StatusServiceUnavailable, code, p.unreadyReason())
			return
		}
		ctx.SetStatusCode(fasthttp.StatusOK)
	case "/healthz":
		ctx.SetContentType("text/plain; charset=utf-8")
		ctx.SetBodyString("ok\n")
	case "/readyz":
		ctx.SetContentType("text/plain; charset=utf-8")
		if !p.Ready() {
			ctx.SetStatusCode(fasthttp.StatusServiceUnavailable)
			ctx.SetBodyString(p.unreadyReason() + "\n")
			return
		}
		ctx.SetBodyString("ready\n")
	default:
		writeError(ctx, fasthttp.StatusNotFound, "not_found", "unknown route "+string(ctx.Method())+" "+string(ctx.Path()))
		p.answered(ctx, routeOther, fasthttp.StatusNotFound)
	}
}

func (p *Proxy) methodNotAllowed(ctx *fasthttp.RequestCtx, allow string) {
	writeError(ctx, fasthttp.StatusMethodNotAllowed, "method_not_allowed", "method "+string(ctx.Method())+" not allowed; use "+allow)
	ctx.Response.Header.Set("Allow", allow)
}

// handleServerError answers requests fasthttp could not read, as OpenAI JSON.
func (p *Proxy) handleServerError(ctx *fasthttp.RequestCtx, err error) {
	var status int
	var code, msg string
	var small *fasthttp.ErrSmallBuffer
	if fc, ok := ctx.Conn().(interface{ framingErr() error }); ok && fc.framingErr() != nil {
		err = fc.framingErr()
	}
	switch {
	case errors.Is(err, errTLSOnPlainPort):
		status, code, msg = fasthttp.StatusBadRequest, "tls_on_plain_http_port", "this port speaks plain HTTP, not TLS: use http://, not https://"
	case errors.Is(err, errBareLF):
		status, code, msg = fasthttp.StatusBadRequest, "bad_request", "cannot parse the HTTP request: its head has lines ending in a bare LF; HTTP/1.1 lines end in CRLF"
	case errors.Is(err, fasthttp.ErrBodyTooLarge):
		status, code, msg = fasthttp.StatusRequestEntityTooLarge, "body_too_large", "request body exceeds the limit"
	case errors.As(err, &small):
		status, code, msg = fasthttp.StatusRequestHeaderFieldsTooLarge, "headers_too_large", "request headers exceed the limit"
	default:
		var te interface{ Timeout() bool }
		if errors.As(err, &te) && te.Timeout() {
			status, code, msg = fasthttp.StatusRequestTimeout, "request_timeout", "timed out reading the request"
		} else {
			status, code, msg = fasthttp.StatusBadRequest, "bad_request", "cannot parse the HTTP request"
		}
	}
	writeError(ctx, status, code, msg)
	ctx.SetConnectionClose()
	// The rest of the request may still be on its way: closing on it would
	// reset the connection and could destroy this answer.
	if l, ok := ctx.Conn().(interface{ lingerOnClose() }); ok {
		l.lingerOnClose()
	}
	p.answered(ctx, routeOther, status)
}

// answered counts and reports a request the router answered itself,
// before any routing: no backend, no key.
func (p *Proxy) answered(ctx *fasthttp.RequestCtx, rt route, status int) {
	p.m.countRequest(p.m.none, rt, ring.ReasonNone, status)
	if p.observing {
		p.observeBare(ctx, rt)
	}
}

// requirePost answers 405 to anything but a POST on rt and reports
// whether the request is a POST.
func (p *Proxy) requirePost(ctx *fasthttp.RequestCtx, rt route) bool {
	if ctx.IsPost() {
		return true
	}
	p.methodNotAllowed(ctx, "POST")
	p.answered(ctx, rt, fasthttp.StatusMethodNotAllowed)
	return false
}

// routeLLM routes a request by its prompt prefix.
func (p *Proxy) routeLLM(ctx *fasthttp.RequestCtx, rt route, api ring.API) {
	if !p.requirePost(ctx, rt) {
		return
	}
	st := p.states.Get().(*reqState)
	defer p.states.Put(st)
	defer p.dropBody(ctx, &st.body)
	if !p.readBody(ctx, rt, &st.body) {
		return
	}
	t := p.tab.Load()
	start := time.Now()
	st.reset(t, start)
	if p.observing {
		p.observeStart(ctx, st, rt, start)
	}
	body, tenant := ctx.Request.Body(), ctx.Request.Header.Peek(HeaderTenant)
	var session []byte
	if h := t.ring.Config().SessionHeader; h != "" {
		session = ctx.Request.Header.Peek(string(h))
	}
	if err := p.readKey(t, api, body, tenant, session, st, true); err != nil {
		writeError(ctx, fasthttp.StatusBadRequest, badRequestCode(err), err.Error())
		p.m.countRequest(p.m.none, rt, ring.ReasonNone, fasthttp.StatusBadRequest)
		if p.observing {
			p.observeEnd(ctx, st, start)
		}
		return
	}
	if t.models != nil {
		mt := t.forModel(st.info.Model)
		if mt == nil {
			modelNotFound(ctx, st.info.Model)
			p.m.countRequest(p.m.none, rt, ring.ReasonNone, fasthttp.StatusNotFound)
			if p.observing {
				p.observeEnd(ctx, st, start)
			}
			return
		}
		if mt != t {
			st.useTable(mt)
		}
	}
	if p.observing {
		p.observeKey(t, api, body, tenant, st)
	}
	st.keyed = true
	// Streamed answers (SSE) are passed through as they come; others are
	// read whole and sent in one write. /invocations is opaque: always
	// streamed.
	p.dispatch(ctx, st, rt, start, st.info.Stream || api == ring.Invocations)
	if p.observing {
		p.observeEnd(ctx, st, start)
	}
}

// readKey reads the request's routing key into st: the fixed-length key,
// or under ADAPTIVE the block chain, routed past the split prefixes (and,
// with count, counted towards the next splits); with a session id (the
// value of the configured session header, nil when absent), the session's
// key instead. It also sets st.recompute.
func (p *Proxy) readKey(t *table, api ring.API, body, tenant, session []byte, st *reqState, count bool) error {
	rc := t.ring.Config()
	kc := rc.Key()
	var splits *ring.Splits
	if rc.Adaptive() {
		splits = p.splits.Load()
		kc.ChainBlocks = splits.ChainBlocks()
	}
	err := ring.Extract(kc, api, body, tenant, &st.info)
	if err == nil {
		err = checkUTF8(kc, api, body)
	}
	if err != nil {
		return err
	}
	if session != nil && string(session) != ring.NewSession {
		if err := ring.CheckSession(session); err != nil {
			return err
		}
		st.info.UseSession(session)
	}
	st.recompute = p.cost.units(int64(len(body)), count)
	if rc.Adaptive() && !st.info.Session {
		splits.Route(&st.info)
	}
	if !count {
		return nil
	}
	if rc.Adaptive() {
		p.hot.Request()
		part := uint32(t.ring.Partition(st.info.Key))
		for d := 0; d < st.info.Blocks; d++ {
			p.hot.Add(st.info.KeyAt(d), d, part)
		}
	}
	if rc.Strategy == ring.PrefixAware {
		if h := p.partHits.Load(); h != nil && len(*h) == t.ring.Partitions() && len(*h) > 0 {
			(*h)[t.ring.Partition(st.info.Key)].Add(PartitionUnit)
		}
	}
	return nil
}

// routeAny sends a key-less request (GET /v1/models, audio) to a healthy
// backend, keyed on the time so that such requests spread; stream passes
// the answer on as it comes instead of reading it whole.
func (p *Proxy) routeAny(ctx *fasthttp.RequestCtx, rt route, stream bool) {
	st := p.states.Get().(*reqState)
	defer p.states.Put(st)
	defer p.dropBody(ctx, &st.body)
	if !p.readBody(ctx, rt, &st.body) {
		return
	}
	now := time.Now()
	st.reset(p.tab.Load(), now)
	st.info = ring.KeyInfo{Key: uint64(st.now)}
	if p.observing {
		p.observeStart(ctx, st, rt, now)
	}
	p.dispatch(ctx, st, rt, now, stream)
	if p.observing {
		p.observeEnd(ctx, st, now)
	}
}

func badRequestCode(err error) string {
	switch {
	case errors.Is(err, ring.ErrMalformedJSON):
		return "invalid_json"
	case errors.Is(err, ring.ErrTooDeep):
		return "json_too_deep"
	case errors.Is(err, ring.ErrBadTenant):
		return "invalid_prefix_aware_id"
	case errors.Is(err, ring.ErrBadSession):
		return "invalid_session_id"
	}
	return "invalid_request"
}

// dispatch readies the request for the backends (prepareUpstream) and
// sends it; a held router (Hold) answers 503 not_ready instead. The
// client's Connection: close outlives the hop-by-hop fields removed on
// the way: the server reads it after the handler.
func (p *Proxy) dispatch(ctx *fasthttp.RequestCtx, st *reqState, rt route, start time.Time, stream bool) {
	if r := p.held.Load(); r != nil {
		writeError(ctx, fasthttp.StatusServiceUnavailable, "not_ready", *r)
		p.m.countRequest(p.m.none, rt, ring.ReasonNone, fasthttp.StatusServiceUnavailable)
		return
	}
	st.clientClose = ctx.Request.Header.ConnectionClose()
	if p.prepareUpstream(ctx, st, rt) {
		p.send(ctx, st, rt, start, stream)
	}
	if st.clientClose {
		ctx.Request.Header.SetConnectionClose()
	}
}

// send picks a backend and forwards, trying further backends while the
// request never reached one.
func (p *Proxy) send(ctx *fasthttp.RequestCtx, st *reqState, rt route, start time.Time, stream bool) {
	t := st.t
	var lastErr error
	allBusy := true // every failure so far was a backend out of connections
	for attempt := 0; attempt <= p.cfg.Retries; attempt++ {
		d, err := t.ring.PickCost(st.info.Key, st.recompute, st)
		if err == nil {
			d, err = p.hold(st, d)
		}
		var decided time.Time
		if attempt == 0 {
			decided = p.m.observeDecision(start)
			if p.observing {
				p.observeRouted(st, d, err, decided)
			}
		} else {
			decided = time.Now()
		}
		if err != nil {
			if lastErr != nil {
				p.unreachable(ctx, rt, lastErr, allBusy)
				return
			}
			writeError(ctx, fasthttp.StatusServiceUnavailable, "no_healthy_backend", "no healthy backend")
			p.m.countRequest(p.m.none, rt, ring.ReasonNone, fasthttp.StatusServiceUnavailable)
			return
		}
		b := t.bs[d.Backend]
		st.pred = p.predict(st, b, d, len(ctx.Request.Body()))
		retry, err := p.forward(ctx, st, b, d, rt, stream, decided)
		if !retry {
			return
		}
		lastErr = err
		allBusy = allBusy && errors.Is(err, fasthttp.ErrNoFreeConns)
		st.markTried(d.Backend)
		b.m.retries.Inc()
	}
	p.unreachable(ctx, rt, lastErr, allBusy)
}

// holdTries bounds the picks hold makes for one request.
const holdTries = 8

// hold takes a slot of the picked backend's in-flight count for the
// request; forward gives it back when the exchange ends. When the ring
// does not admit the decision with the count the slot made (ring.Admits:
// other requests on this router took the backend's last room between the
// pick and here), the slot goes back and the request is picked again,
// seeing those requests: ConcurrencyThreshold stays a hard cap on each
// router, with no lock on the request path. (Requests on other routers are
// seen as their gossip arrives.) Every pick that loses a slot sees a
// fuller fleet, so this ends at a held slot or a fallback; after holdTries
// picks the last one is taken as it is. On error nothing is held.
func (p *Proxy) hold(st *reqState, d ring.Decision) (ring.Decision, error) {
	t := st.t
	for try := 1; ; try++ {
		b := t.bs[d.Backend]
		n := b.inflight.Add(1)
		b.rising(p.scrapeTrigger(), n+b.remote.Load(), st.now)
		if try == holdTries || t.ring.Admits(d, n+b.remote.Load()) {
			return d, nil
		}
		b.inflight.Add(-1)
		var err error
		if d, err = t.ring.PickCost(st.info.Key, st.recompute, st); err != nil {
			return d, err
		}
	}
}

// unreachable answers a request no backend took: 503 when every backend
// tried had no free connection within MaxConnWait (they are saturated, not
// gone: retry later), else 502.
func (p *Proxy) unreachable(ctx *fasthttp.RequestCtx, rt route, lastErr error, allBusy bool) {
	if allBusy {
		writeError(ctx, fasthttp.StatusServiceUnavailable, "backends_saturated",
			"every backend tried is at its connection limit (max-conns-per-backend); retry later")
		ctx.Response.Header.Set("Retry-After", "1")
		p.m.countRequest(p.m.none, rt, ring.ReasonNone, fasthttp.StatusServiceUnavailable)
		return
	}
	writeError(ctx, fasthttp.StatusBadGateway, "backend_unreachable", "no backend could be reached: "+lastErr.Error())
	p.m.countRequest(p.m.none, rt, ring.ReasonNone, fasthttp.StatusBadGateway)
}

// forward sends the request to b and hands the response to the client. It
// returns retry=true only when the request never reached b. With stream
// the body is passed through as the backend sends it (on the relay when
// the client and b allow it, relayable; else by this goroutine);
// otherwise it is read whole (straight into the client's response, no
// copy, at most MaxBufferedResponse bytes) and the answer goes out in one
// write. Every way goes through the same upstream step (sendHead).
//
// sent is when the backend was chosen; the time to first byte is measured
// from it (the request goes out a microsecond or so later). The request
// holds a slot of b's in-flight count (hold); forward gives it back.
func (p *Proxy) forward(ctx *fasthttp.RequestCtx, st *reqState, b *backend, d ring.Decision, rt route, stream bool, sent time.Time) (retry bool, err error) {
	mode := sendBuffered
	var rc *rawConn
	if stream {
		mode = sendStreamed
		if c, ok := p.relayable(ctx, st, b); ok {
			mode, rc = sendRelayed, c
		}
	}
	x, ok, retry, err := p.sendHead(ctx, st, b, d, rt, mode, sent)
	if !ok {
		return retry, err
	}
	switch mode {
	case sendRelayed:
		return p.forwardRelayed(ctx, st, b, d, rt, sent, rc, x)
	case sendStreamed:
		p.setHeaders(&ctx.Response, st.t, b, d)
		p.m.countRequest(b.m, rt, d.Reason, x.resp.StatusCode())
		bs, _ := x.resp.BodyStream().(fasthttp.ReadCloserWithError)
		return p.passStream(ctx, st, b, x.resp, bs, sent)
	}
	resp := x.resp // the client's response, the answer read whole into it
	b.m.ttfb.Observe(time.Since(sent).Seconds())
	if p.observing {
		p.observeAnswer(st, resp, sent)
	}
	p.setHeaders(resp, st.t, b, d)
	p.m.countRequest(b.m, rt, d.Reason, resp.StatusCode())
	b.countBodyUsage(resp, st.pred)
	return false, nil
}

// passStream passes the body of up (its stream bs, or its body when bs is
// nil) to the client as it comes, through a trackedStream. b's in-flight
// count is already up; the stream's end takes it down.
func (p *Proxy) passStream(ctx *fasthttp.RequestCtx, st *reqState, b *backend, up *fasthttp.Response, bs fasthttp.ReadCloserWithError, sent time.Time) (bool, error) {
	resp := &ctx.Response
	if bs == nil {
		// The whole body came with the headers.
		b.m.ttfb.Observe(time.Since(sent).Seconds())
		resp.SetBody(up.Body())
		b.countBodyUsage(resp, st.pred)
		if p.observing {
			p.observeAnswer(st, resp, sent)
		}
		fasthttp.ReleaseResponse(up)
		b.inflight.Add(-1)
		return false, nil
	}
	ts := p.streams.Get().(*trackedStream)
	*ts = trackedStream{p: p, b: b, up: up, src: bs, sent: sent, pred: st.pred,
		client: holdStreamHeaders(ctx.Conn(), up.LocalAddr()),
		sse:    up.Header.ContentLength() < 0 && bytes.HasPrefix(up.Header.ContentType(), strEventStream)}
	ts.usage.begin(&up.Header)
	var body fasthttp.ReadCloserWithError = ts
	if p.observing && (st.obs.rec != nil || st.obs.up != nil) {
		body = p.observeStream(st, ts, up.StatusCode(), sent)
	}
	if up.Header.ContentLength() < 0 && !ctx.Request.Header.IsHTTP11() {
		return p.passIdentity(ctx, body)
	}
	resp.ImmediateHeaderFlush = true
	resp.SetBodyStream(body, up.Header.ContentLength())
	return false, nil
}

// passIdentity streams body, of unknown length, to an HTTP/1.0 client,
// which cannot read chunked framing (RFC 9112 section 6.1), while fasthttp
// frames every such body as chunks: the headers without Transfer-Encoding,
// the body as it comes, and the connection's close as its end. It runs on
// the connection's goroutine, as fasthttp's own streaming of a body does,
// so Shutdown treats it as any stream on the goroutine path; each write is
// bounded by WriteTimeout (the client connection's write stall) like any
// other.
func (p *Proxy) passIdentity(ctx *fasthttp.RequestCtx, body fasthttp.ReadCloserWithError) (bool, error) {
	resp := &ctx.Response
	resp.Header.Del(fasthttp.HeaderTransferEncoding)
	resp.Header.SetConnectionClose()
	c := ctx.Conn()
	_, err := c.Write(resp.Header.AppendBytes(nil))
	if err == nil {
		// Each read (an event or a few) is written before the next.
		_, err = io.CopyBuffer(c, body, make([]byte, 16<<10))
	}
	_ = body.CloseWithError(err)
	// No response from the server: the hijack handler returns at once,
	// and the server closes the connection after it.
	ctx.HijackSetNoResponse(true)
	ctx.Hijack(func(net.Conn) {})
	return false, nil
}

func (p *Proxy) setHeaders(resp *fasthttp.Response, t *table, b *backend, d ring.Decision) {
	resp.Header.Set(HeaderBackend, b.id)
	resp.Header.Set(HeaderDecision, d.Reason.String())
	resp.Header.SetBytesV(HeaderEpoch, t.epochHdr)
}
