package proxy

import (
	"errors"
	"net"
	"strings"
	"time"

	"github.com/valyala/fasthttp"
	"github.com/warmroute/warmroute/ring"
)

// The endpoint picker's hook into the request path.
//
// A gateway that forwards requests itself (Envoy with ext_proc, package
// proxy/extproc) asks the router only which backend should serve each
// one. Pick answers with the decision the HTTP path would make for the
// same request: the same key (readKey: prefix, tenant, session, splits),
// the same model table, the same ring pick and in-flight slot (hold). It
// then lists the backends the HTTP path would retry on, as the gateway's
// fallbacks. The slot is this router's in-flight count of the backend,
// shared with the cluster like any other, until Release.

// Errors Pick returns.
var (
	// ErrNoEndpoint: no backend (of the subset, when one was given) may
	// take the request. The gateway answers 503.
	ErrNoEndpoint = errors.New("no endpoint can take the request")
	// ErrModelNotFound: no backend serves the request's model.
	ErrModelNotFound = errors.New("no backend serves the requested model")
)

// MaxSubset bounds the endpoints of a subset hint.
const MaxSubset = 1024

// PickRequest is what the picker knows of a request.
type PickRequest struct {
	// API is the kind of body (RouteAPI tells it from the path).
	API ring.API
	// Keyless requests (GET /v1/models, audio, unknown paths) carry no
	// prompt: they are spread over the healthy backends.
	Keyless bool
	// Body is the request body, read whole; Pick keeps no reference to it.
	Body []byte
	// Tenant is the X-Amzn-SageMaker-Prefix-Aware-Id value; Session the
	// configured session header's (SessionHeader); nil when absent.
	Tenant, Session []byte
	// Subset, when not nil, lists the only endpoints the pick may come
	// from, each "host:port" or a bare host (any port of it). An empty,
	// non-nil Subset allows none. At most MaxSubset entries are read.
	Subset []string
	// Fallbacks is how many further endpoints to list after the primary,
	// in the order the HTTP path would retry on them.
	Fallbacks int
}

// Picked is one decision and the in-flight slot it holds. Its methods are
// for one goroutine at a time (the gateway's stream for the request).
type Picked struct {
	p  *Proxy
	t  *table
	rt route
	// held is the backend whose slot the request holds (nil when
	// released or never held).
	held *backend
	// served is the backend the gateway reported serving (or the primary
	// until a report comes).
	served    *backend
	reason    ring.Reason
	endpoints []string
	backendID string
	usage     usageScan
	counted   bool // the answer's request was counted
	released  bool
	// pred is what the router expected of the primary's answer
	// (predict.go).
	pred prediction
}

// SessionHeader returns the header that names a request's session under
// the routing settings in use ("" when sessions are off).
func (p *Proxy) SessionHeader() string {
	return string(p.tab.Load().ring.Config().SessionHeader)
}

// MaxBodySize is the largest request body the router accepts.
func (p *Proxy) MaxBodySize() int { return int(p.cfg.MaxBodySize) }

// Synced reports whether the router routes on an agreed state (an epoch
// above 0) and can take requests: what a gateway's readiness check asks.
func (p *Proxy) Synced() bool { return p.tab.Load().epoch > 0 && p.Ready() }

// RouteAPI returns the API of a request path (query included or not), as
// the HTTP handler routes it, and whether requests on it are keyed on
// their prompt. Unknown paths are keyless.
func RouteAPI(path string) (api ring.API, keyed bool) {
	if i := strings.IndexByte(path, '?'); i >= 0 {
		path = path[:i]
	}
	switch path {
	case "/v1/chat/completions":
		return ring.Chat, true
	case "/v1/completions":
		return ring.Completions, true
	case "/invocations":
		return ring.Invocations, true
	case "/v1/embeddings":
		return ring.Embeddings, true
	case "/v1/responses":
		return ring.Responses, true
	case "/v1/rerank", "/rerank", "/v2/rerank":
		return ring.Rerank, true
	case "/v1/score", "/score":
		return ring.Score, true
	case "/tokenize":
		return ring.Tokenize, true
	case "/detokenize":
		return ring.Detokenize, true
	}
	return ring.Chat, false
}

// apiRoutes are the metrics' route labels of the keyed APIs.
var apiRoutes = [...]route{
	ring.Chat: routeChat, ring.Completions: routeCompletions, ring.Invocations: routeInvocations,
	ring.Embeddings: routeEmbeddings, ring.Responses: routeResponses, ring.Rerank: routeRerank,
	ring.Score: routeScore, ring.Tokenize: routeTokenize, ring.Detokenize: routeDetokenize,
}

// Pick decides where req goes and takes a slot of that backend's
// in-flight count, which Release gives back. Errors: the key's (ring's
// sentinels, for a 400), ErrModelNotFound, ErrNoEndpoint.
func (p *Proxy) Pick(req *PickRequest) (*Picked, error) {
	rt := routeOther
	if !req.Keyless && int(req.API) < len(apiRoutes) {
		rt = apiRoutes[req.API]
	}
	st := p.states.Get().(*reqState)
	defer func() {
		st.info = ring.KeyInfo{}
		p.states.Put(st)
	}()
	t := p.tab.Load()
	start := time.Now()
	st.reset(t, start)
	if req.Keyless {
		st.info = ring.KeyInfo{Key: uint64(st.now)}
	} else {
		st.keyed = true
		if err := p.readKey(t, req.API, req.Body, req.Tenant, req.Session, st, true); err != nil {
			p.m.countRequest(p.m.none, rt, ring.ReasonNone, fasthttp.StatusBadRequest)
			return nil, err
		}
		if t.models != nil {
			mt := t.forModel(st.info.Model)
			if mt == nil {
				p.m.countRequest(p.m.none, rt, ring.ReasonNone, fasthttp.StatusNotFound)
				return nil, ErrModelNotFound
			}
			if mt != st.t {
				st.useTable(mt)
			}
		}
	}
	if req.Subset != nil {
		excludeOutside(st, req.Subset)
	}
	d, err := st.t.ring.PickCost(st.info.Key, st.recompute, st)
	if err == nil {
		d, err = p.hold(st, d)
	}
	p.m.observeDecision(start)
	if err != nil {
		p.m.countRequest(p.m.none, rt, ring.ReasonNone, fasthttp.StatusServiceUnavailable)
		return nil, ErrNoEndpoint
	}
	b := st.t.bs[d.Backend]
	pk := &Picked{p: p, t: st.t, rt: rt, held: b, served: b, reason: d.Reason, backendID: b.id,
		endpoints: make([]string, 0, 1+max(0, req.Fallbacks)),
		pred:      p.predict(st, b, d, len(req.Body))}
	pk.endpoints = append(pk.endpoints, b.target.HostPort)
	// The fallbacks are the picks the HTTP path would make on retries:
	// each one with the backends before it marked tried. They hold no slot.
	st.markTried(d.Backend)
	for range req.Fallbacks {
		f, err := st.t.ring.PickCost(st.info.Key, st.recompute, st)
		if err != nil {
			break
		}
		st.markTried(f.Backend)
		pk.endpoints = append(pk.endpoints, st.t.bs[f.Backend].target.HostPort)
	}
	return pk, nil
}

// excludeOutside marks every backend of st's table that the subset does
// not name as tried, so no pick can land on it.
func excludeOutside(st *reqState, subset []string) {
	if len(subset) > MaxSubset {
		subset = subset[:MaxSubset]
	}
	for i, b := range st.t.bs {
		if !inSubset(b.target.HostPort, subset) {
			st.markTried(i)
		}
	}
}

// inSubset reports whether hostport is one of the entries: the same
// host:port, or the same host for an entry without a port.
func inSubset(hostport string, subset []string) bool {
	host, _, _ := net.SplitHostPort(hostport)
	for _, e := range subset {
		if e == hostport {
			return true
		}
		if _, _, err := net.SplitHostPort(e); err != nil && strings.Trim(e, "[]") == host {
			return true
		}
	}
	return false
}

// Endpoints returns the primary endpoint (host:port) and the fallbacks.
func (pk *Picked) Endpoints() []string { return pk.endpoints }

// Backend is the primary's backend id; Reason why it was chosen.
func (pk *Picked) Backend() string     { return pk.backendID }
func (pk *Picked) Reason() ring.Reason { return pk.reason }

// Served records the endpoint the gateway reports serving the request (a
// fallback when the primary failed): the in-flight slot moves to it, and
// its usage is counted for it. An endpoint the router does not know gives
// the slot back; Served then reports false.
func (pk *Picked) Served(endpoint string) bool {
	if pk.held == nil || endpoint == pk.held.target.HostPort {
		return pk.held != nil
	}
	var to *backend
	for _, b := range pk.t.bs {
		if b.target.HostPort == endpoint {
			to = b
			break
		}
	}
	if to != nil {
		to.inflight.Add(1)
	}
	// Another endpoint than the one predicted: no warm cache was
	// expected there.
	pk.pred.warm = false
	pk.held.inflight.Add(-1)
	pk.held, pk.served = to, to
	return to != nil
}

// ResponseHeaders takes the status and content type of the answer: the
// request is counted, and a 2xx JSON or event-stream answer's usage is
// read from the body pieces ResponseBody gets.
func (pk *Picked) ResponseHeaders(status int, contentType []byte) {
	if pk.served == nil {
		return
	}
	if !pk.counted {
		pk.counted = true
		pk.p.m.countRequest(pk.served.m, pk.rt, pk.reason, status)
	}
	var h fasthttp.ResponseHeader
	h.SetStatusCode(status)
	h.SetContentTypeBytes(contentType)
	pk.usage.begin(&h)
}

// ResponseBody scans a piece of the answer for its usage, holding none
// of it.
func (pk *Picked) ResponseBody(p []byte) {
	if pk.served != nil {
		pk.usage.feed(p)
	}
}

// Release ends the request: its in-flight slot is given back and the
// usage its answer reported is counted. Safe to call more than once.
func (pk *Picked) Release() {
	if pk.served != nil && pk.counted && !pk.released {
		pk.served.countUsage(pk.pred, pk.usage.report())
		pk.usage = usageScan{}
	}
	pk.released = true
	if pk.held != nil {
		pk.held.inflight.Add(-1)
		pk.held = nil
	}
}

// BodyCharge is request body memory taken from the router's budget (the
// one the HTTP path's bodies share) by a reader that gets a body in
// pieces: the first 1 MiB of a body counts as an ordinary body, the rest
// as a large one (which may take half of the budget).
type BodyCharge struct {
	p            *Proxy
	small, large int64
}

// ChargeBody returns an empty charge against p's body budget.
func (p *Proxy) ChargeBody() BodyCharge { return BodyCharge{p: p} }

// Take charges n more bytes, waiting up to BodyMemoryWait for room; false
// when there was none (nothing more is charged then).
func (c *BodyCharge) Take(n int) bool {
	if n <= 0 {
		return true
	}
	bb := c.p.bodies
	deadline := time.Now().Add(c.p.cfg.BodyMemoryWait)
	small := min(int64(n), max(0, largeBody-c.small))
	large := int64(n) - small
	if small > 0 && !bb.take(small, false, deadline) {
		c.p.m.bodiesRefused.Inc()
		return false
	}
	if large > 0 && !bb.take(large, true, deadline) {
		bb.give(small, false)
		c.p.m.bodiesRefused.Inc()
		return false
	}
	c.small += small
	c.large += large
	return true
}

// Give returns every byte charged. Safe to call more than once.
func (c *BodyCharge) Give() {
	if c.p == nil {
		return
	}
	c.p.bodies.give(c.small, false)
	c.p.bodies.give(c.large, true)
	c.small, c.large = 0, 0
}
