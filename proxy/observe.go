package proxy

import (
	"bytes"
	"context"
	"time"

	"github.com/valyala/fasthttp"
	"github.com/warmroute/warmroute/proxy/reqlog"
	"github.com/warmroute/warmroute/ring"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// What the request path reports of each request besides its metrics: a
// reqlog.Record (access log line, trace record) and, with a Tracer, two
// spans. All of it hangs off reqState while the handler runs; a streamed
// answer hands it to an observedStream, which completes it when the stream
// ends. With neither configured (p.observing false) the request path pays
// one branch per request.

// routePaths are the access log's route names.
var routePaths = [numRoutes]string{"/v1/chat/completions", "/v1/completions", "/invocations", "/v1/models", "other",
	"/v1/embeddings", "/v1/responses", "/v1/rerank", "/v1/score", "/tokenize", "/detokenize", "/v1/audio"}

// Span names.
const (
	spanRoute    = "warmroute.route"
	spanUpstream = "warmroute.upstream"
)

// headerCarrier lets the W3C propagator read and write fasthttp request
// headers.
type headerCarrier struct{ h *fasthttp.RequestHeader }

var _ propagation.TextMapCarrier = headerCarrier{}

func (c headerCarrier) Get(k string) string { return string(c.h.Peek(k)) }
func (c headerCarrier) Set(k, v string)     { c.h.Set(k, v) }
func (c headerCarrier) Keys() []string {
	var ks []string
	for k := range c.h.All() {
		ks = append(ks, string(k))
	}
	return ks
}

// obsState is a request's record and spans, in its reqState.
type obsState struct {
	rec   *reqlog.Record
	start time.Time
	// rctx carries the route span; route is open until the decision,
	// up while an upstream exchange is.
	rctx      context.Context
	route, up trace.Span
	// chain is the block chain read for a trace record.
	chain ring.KeyInfo
}

// observeStart opens a request's record and route span.
func (p *Proxy) observeStart(ctx *fasthttp.RequestCtx, st *reqState, rt route, start time.Time) {
	o := &st.obs
	o.start = start
	if o.rec = p.cfg.Requests.Begin(start); o.rec != nil {
		o.rec.Route = routePaths[rt]
		o.rec.BytesIn = bytesIn(&ctx.Request)
		if rt == routeModels || rt == routeOther {
			o.rec.SkipTrace()
		}
	}
	if p.cfg.Tracer != nil {
		parent := p.prop.Extract(context.Background(), headerCarrier{&ctx.Request.Header})
		o.rctx, o.route = p.cfg.Tracer.Start(parent, spanRoute, trace.WithSpanKind(trace.SpanKindServer), trace.WithTimestamp(start))
		if o.route.IsRecording() {
			o.route.SetAttributes(attribute.String("http.route", routePaths[rt]),
				attribute.String("http.request.method", string(ctx.Method())))
		}
	}
}

// observeKey records what the routing key told: model, tenant and, for a
// trace record, the prompt's whole block chain (up to
// ring.MaxChainBlocks blocks; the routing key reads only as far as it
// needs).
func (p *Proxy) observeKey(t *table, api ring.API, body, tenant []byte, st *reqState) {
	o := &st.obs
	if o.route != nil && o.route.IsRecording() {
		o.route.SetAttributes(attribute.String("gen_ai.request.model", string(st.info.Model)),
			attribute.Int("warmroute.prefix_bytes", st.info.PrefixBytes),
			attribute.Bool("warmroute.stream", st.info.Stream))
	}
	rec := o.rec
	if rec == nil {
		return
	}
	rec.SetModel(st.info.Model)
	rec.SetTenant(st.info.Tenant)
	if !rec.TraceWanted() {
		return
	}
	kc := t.ring.Config().Key()
	kc.ChainBlocks = ring.MaxChainBlocks
	if ring.Extract(kc, api, body, tenant, &o.chain) != nil {
		rec.SkipTrace()
		return
	}
	rec.SetChain(&o.chain, body)
}

// observeRouted ends the route span at the first decision.
func (p *Proxy) observeRouted(st *reqState, d ring.Decision, err error, decided time.Time) {
	o := &st.obs
	if o.route == nil {
		return
	}
	if o.route.IsRecording() {
		if err != nil {
			o.route.SetStatus(codes.Error, "no healthy backend")
		} else {
			t := st.t
			o.route.SetAttributes(attribute.String("warmroute.decision", d.Reason.String()),
				attribute.String("warmroute.backend", t.bs[d.Backend].id),
				attribute.Int("warmroute.rank", d.Rank),
				attribute.Int64("warmroute.epoch", int64(t.epoch)))
		}
	}
	o.route.End(trace.WithTimestamp(decided))
	o.route = nil
}

// observeSend notes the backend chosen and opens the upstream span, whose
// context replaces the client's traceparent on the request.
func (p *Proxy) observeSend(req *fasthttp.Request, st *reqState, b *backend, d ring.Decision, sent time.Time) {
	o := &st.obs
	if o.rec != nil {
		o.rec.Backend, o.rec.Decision = b.id, d.Reason.String()
	}
	if p.cfg.Tracer == nil {
		return
	}
	parent := o.rctx
	if parent == nil {
		parent = context.Background()
	}
	uctx, span := p.cfg.Tracer.Start(parent, spanUpstream, trace.WithSpanKind(trace.SpanKindClient), trace.WithTimestamp(sent))
	if span.IsRecording() {
		span.SetAttributes(attribute.String("warmroute.backend", b.id),
			attribute.String("warmroute.decision", d.Reason.String()),
			attribute.String("server.address", b.target.HostPort))
	}
	o.up = span
	// The request carries this router's trace context, and only it: a
	// client's traceparent and tracestate, each possibly sent twice, go.
	req.Header.Del("Traceparent")
	req.Header.Del("Tracestate")
	p.prop.Inject(uctx, headerCarrier{&req.Header})
}

// observeFailed ends the upstream span of an exchange that failed.
func (p *Proxy) observeFailed(st *reqState, err error) {
	o := &st.obs
	if o.up == nil {
		return
	}
	o.up.RecordError(err)
	o.up.SetStatus(codes.Error, err.Error())
	o.up.End()
	o.up = nil
}

// observeAnswer records a complete answer: status, time to first byte and,
// for a trace record, the tokens the backend reported.
func (p *Proxy) observeAnswer(st *reqState, resp *fasthttp.Response, sent time.Time) {
	o := &st.obs
	if rec := o.rec; rec != nil {
		rec.TTFB = time.Since(sent)
		if rec.TraceWanted() {
			body := resp.Body()
			var s usageScan
			s.begin(&resp.Header)
			if s.mode != scanOff && bytes.Contains(body, strUsageTail) {
				s.feed(body)
				setPrompt(rec, s.report())
			}
			var c reqlog.CompletionScan
			c.Feed(body)
			rec.CompletionTokens = c.Tokens()
		}
	}
	if o.up != nil {
		endUpstream(o.up, resp.StatusCode(), nil, o.rec)
		o.up = nil
	}
}

func setPrompt(rec *reqlog.Record, u usageReport) {
	if u.result == usageOK || u.result == usageNoDetails {
		rec.PromptTokens = u.prompt
	}
}

// endUpstream ends an upstream span with the answer's status and tokens;
// err is how the client's side of a stream ended.
func endUpstream(span trace.Span, status int, err error, rec *reqlog.Record) {
	if span.IsRecording() {
		span.SetAttributes(attribute.Int("http.response.status_code", status))
		if rec != nil && rec.PromptTokens >= 0 {
			span.SetAttributes(attribute.Int64("gen_ai.usage.input_tokens", rec.PromptTokens))
		}
		if rec != nil && rec.CompletionTokens >= 0 {
			span.SetAttributes(attribute.Int64("gen_ai.usage.output_tokens", rec.CompletionTokens))
		}
		switch {
		case status >= 500:
			span.SetStatus(codes.Error, "")
		case err != nil:
			span.SetStatus(codes.Error, "client went away: "+err.Error())
		}
	}
	span.End()
}

// observeEnd completes the record and spans of a request whose answer
// is complete (or was handed to an observedStream, which then owns them).
func (p *Proxy) observeEnd(ctx *fasthttp.RequestCtx, st *reqState, start time.Time) {
	o := &st.obs
	status := ctx.Response.StatusCode()
	if o.route != nil {
		if status >= 400 {
			o.route.SetStatus(codes.Error, "")
		}
		o.route.SetAttributes(attribute.Int("http.response.status_code", status))
		o.route.End()
	}
	if o.up != nil {
		endUpstream(o.up, status, nil, o.rec)
	}
	if rec := o.rec; rec != nil {
		rec.Status = status
		rec.BytesOut = int64(len(ctx.Response.Body()))
		rec.Duration = time.Since(start)
		if rec.Backend == "" {
			rec.SkipTrace() // never routed: nothing to replay
		}
		p.cfg.Requests.Submit(rec)
	}
	o.rec, o.rctx, o.route, o.up = nil, nil, nil, nil
}

// observeBare records a request answered without routing (404, 405, a
// request fasthttp could not read).
func (p *Proxy) observeBare(ctx *fasthttp.RequestCtx, rt route) {
	// A request fasthttp could not read never got a start time.
	start := ctx.Time()
	if start.IsZero() {
		start = time.Now()
	}
	rec := p.cfg.Requests.Begin(start)
	if rec == nil {
		return
	}
	rec.SkipTrace()
	rec.Route = routePaths[rt]
	rec.Status = ctx.Response.StatusCode()
	rec.BytesIn = bytesIn(&ctx.Request)
	rec.BytesOut = int64(len(ctx.Response.Body()))
	rec.Duration = time.Since(start)
	p.cfg.Requests.Submit(rec)
}

// bytesIn is the size of req's body: its declared length while the body
// is still unread on the connection (it is never read just to be
// counted).
func bytesIn(req *fasthttp.Request) int64 {
	if req.IsBodyStream() {
		return int64(max(req.Header.ContentLength(), 0))
	}
	return int64(len(req.Body()))
}

// streamObs is a stream's access-log record and upstream span, completed
// when the stream ends: by an observedStream on the goroutine path, by a
// relayStream on the relay.
type streamObs struct {
	rec    *reqlog.Record
	span   trace.Span
	status int
	start  time.Time
	out    int64
	comp   reqlog.CompletionScan
}

// takeStreamObs moves the request's record and upstream span to a stream
// whose answer has status.
func takeStreamObs(o *obsState, status int) streamObs {
	so := streamObs{rec: o.rec, span: o.up, status: status, start: o.start}
	if so.rec != nil {
		so.rec.Status = status
	}
	o.rec, o.up = nil, nil
	return so
}

// active reports whether there is a record or span to complete.
func (o *streamObs) active() bool { return o.rec != nil || o.span != nil }

// passed counts body bytes that passed to the client, timing the first
// from sent, and reads the completion tokens for a trace record.
func (o *streamObs) passed(p []byte, sent time.Time) {
	if o.rec == nil || len(p) == 0 {
		return
	}
	if o.out == 0 {
		o.rec.TTFB = time.Since(sent)
	}
	o.out += int64(len(p))
	if o.rec.TraceWanted() {
		o.comp.Feed(p)
	}
}

// end completes the record and span; u is the usage the stream reported
// and err how the client's side ended (nil: it got the whole answer).
func (o *streamObs) end(p *Proxy, u usageReport, err error) {
	rec := o.rec
	if rec != nil {
		rec.BytesOut = o.out
		rec.Duration = time.Since(o.start)
		if rec.TraceWanted() {
			setPrompt(rec, u)
			rec.CompletionTokens = o.comp.Tokens()
		}
	}
	if o.span != nil {
		endUpstream(o.span, o.status, err, rec)
	}
	if rec != nil {
		p.cfg.Requests.Submit(rec)
	}
}

// observeStream hands the request's record and upstream span to a
// stream wrapping ts, which completes them when the stream ends.
func (p *Proxy) observeStream(st *reqState, ts *trackedStream, status int, sent time.Time) fasthttp.ReadCloserWithError {
	os := p.observed.Get().(*observedStream)
	*os = observedStream{ts: ts, p: p, obs: takeStreamObs(&st.obs, status), sent: sent}
	return os
}

// observedStream passes a trackedStream through, completing its record and
// span (streamObs).
type observedStream struct {
	ts     *trackedStream
	p      *Proxy
	obs    streamObs
	sent   time.Time
	closed bool
}

func (s *observedStream) Read(buf []byte) (int, error) {
	n, err := s.ts.Read(buf)
	s.obs.passed(buf[:n], s.sent)
	return n, err
}

func (s *observedStream) CloseWithError(err error) error {
	if s.closed {
		return nil
	}
	s.closed = true
	u := s.ts.usage.report() // CloseWithError clears ts
	cerr := s.ts.CloseWithError(err)
	s.obs.end(s.p, u, err)
	p := s.p
	*s = observedStream{}
	p.observed.Put(s)
	return cerr
}
