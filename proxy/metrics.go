package proxy

import (
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/warmroute/warmroute/ring"
)

// route labels.
type route uint8

const (
	routeChat route = iota
	routeCompletions
	routeInvocations
	routeModels
	routeOther
	routeEmbeddings
	routeResponses
	routeRerank
	routeScore
	routeTokenize
	routeDetokenize
	routeAudio
	numRoutes
)

var routeNames = [numRoutes]string{"chat", "completions", "invocations", "models", "other",
	"embeddings", "responses", "rerank", "score", "tokenize", "detokenize", "audio"}

// codeSlots are the statuses whose counters are cached per backend.
var codeSlots = [...]int{200, 400, 401, 404, 408, 413, 422, 429, 499, 500, 502, 503, 504}

func codeSlot(code int) int {
	for i, c := range codeSlots {
		if c == code {
			return i
		}
	}
	return -1
}

// metrics are the proxy's Prometheus series.
type metrics struct {
	requests  *prometheus.CounterVec
	decision  prometheus.Histogram
	ttfb      *prometheus.HistogramVec
	retries   *prometheus.CounterVec
	aborts    *prometheus.CounterVec
	ejections *prometheus.CounterVec
	upErrors  *prometheus.CounterVec
	// connsRejected counts client connections refused over MaxConns.
	connsRejected prometheus.Counter
	// bodiesRefused counts requests refused because their body found no
	// room in MaxBodyMemory.
	bodiesRefused prometheus.Counter
	// memReturns counts the memory returns after a burst (trim.go).
	memReturns prometheus.Counter
	// offRelay counts streams that could have gone through the relay
	// but took the goroutine path: their backend had
	// MaxConnsPerBackend connections open and no idle relay one.
	offRelay prometheus.Counter
	none     *backendMetrics // requests that reached no backend

	// The usage backends report in their answers (usage.go).
	promptTokens *prometheus.CounterVec
	cachedTokens *prometheus.CounterVec
	usageReports *prometheus.CounterVec
}

// usageCounters are one backend's usage series, resolved once.
type usageCounters struct {
	prompt, cached prometheus.Counter
	reports        [numUsageResults]prometheus.Counter // by result; usageNone is nil
}

// requestCounters caches resolved counters so the request path does not
// hash label values: one per route, decision reason (every row of ring's
// reason table) and cached status.
type requestCounters [numRoutes][ring.NumReasons][len(codeSlots)]atomic.Pointer[prometheus.Counter]

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "warmroute_requests_total",
			Help: "Requests by route, routing decision, backend and HTTP status.",
		}, []string{"route", "decision", "backend", "code"}),
		decision: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "warmroute_routing_decision_seconds",
			Help:    "Time to read the routing key and pick a backend.",
			Buckets: []float64{250e-9, 500e-9, 1e-6, 2e-6, 5e-6, 10e-6, 25e-6, 50e-6, 100e-6, 1e-3},
		}),
		ttfb: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "warmroute_upstream_first_byte_seconds",
			Help:    "Time from sending a request to a backend to its first response body byte (time to first token for streams).",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60},
		}, []string{"backend"}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "warmroute_retries_total",
			Help: "Requests retried on another backend because they never reached this one.",
		}, []string{"backend"}),
		aborts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "warmroute_client_aborts_total",
			Help: "Streams cut short because the client went away; the upstream stream was closed.",
		}, []string{"backend"}),
		ejections: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "warmroute_backend_ejections_total",
			Help: "Passive ejections after consecutive connect failures.",
		}, []string{"backend"}),
		upErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "warmroute_upstream_errors_total",
			Help: "Failed upstream exchanges by kind: dial, timeout, no_free_conns, protocol (a response refused: too large, a switch of protocols, an invalid status or header), other.",
		}, []string{"backend", "kind"}),
		memReturns: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "warmroute_memory_returns_total",
			Help: "Times the router returned free memory to the system after a burst of client connections ended.",
		}),
		offRelay: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "warmroute_streams_off_relay_total",
			Help: "Streams passed by a goroutine each (more memory and CPU per stream) instead of the event-loop relay, because their backend had max-conns-per-backend connections open and none idle; raise max-conns-per-backend if this grows.",
		}),
		connsRejected: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "warmroute_client_connections_rejected_total",
			Help: "Client connections refused with 503 because MaxConns were open.",
		}),
		bodiesRefused: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "warmroute_request_bodies_refused_total",
			Help: "Requests answered 503 body_memory_full: their body found no room in max-body-memory within max-body-memory-wait.",
		}),
		promptTokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "warmroute_backend_prompt_tokens_total",
			Help: "Prompt tokens in the valid usage reports (usage.prompt_tokens) of the backend's 2xx answers, streamed (the last report of a stream) or not.",
		}, []string{"backend"}),
		cachedTokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "warmroute_backend_cached_prompt_tokens_total",
			Help: "Prompt tokens the backend reported as found in its prefix (KV) cache (usage.prompt_tokens_details.cached_tokens; 0 for a report without it, as vLLM omits it when nothing was cached). Hit rate: rate of this over rate of warmroute_backend_prompt_tokens_total.",
		}, []string{"backend"}),
		usageReports: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "warmroute_backend_usage_reports_total",
			Help: "Answers with a usage report, by result: ok (prompt and cached tokens), no_details (prompt tokens only), invalid (a count missing, not a plain integer under 10^9, or cached > prompt: not counted).",
		}, []string{"backend", "result"}),
	}
	if reg != nil {
		reg.MustRegister(m.requests, m.decision, m.ttfb, m.retries, m.aborts, m.ejections, m.upErrors, m.connsRejected, m.bodiesRefused, m.memReturns, m.offRelay,
			m.promptTokens, m.cachedTokens, m.usageReports)
	}
	m.none = &backendMetrics{}
	return m
}

func (m *metrics) forBackend(id string) *backendMetrics {
	bm := &backendMetrics{
		id:       id,
		ttfb:     m.ttfb.WithLabelValues(id),
		retries:  m.retries.WithLabelValues(id),
		aborts:   m.aborts.WithLabelValues(id),
		ejects:   m.ejections.WithLabelValues(id),
		upErrors: map[string]prometheus.Counter{},
	}
	for _, k := range []string{"dial", "timeout", "no_free_conns", "protocol", "other"} {
		bm.upErrors[k] = m.upErrors.WithLabelValues(id, k)
	}
	bm.usage.prompt = m.promptTokens.WithLabelValues(id)
	bm.usage.cached = m.cachedTokens.WithLabelValues(id)
	for r := usageOK; r < numUsageResults; r++ {
		bm.usage.reports[r] = m.usageReports.WithLabelValues(id, usageResultNames[r])
	}
	return bm
}

// countUsage counts the usage report r of an answer from bm's backend.
func (bm *backendMetrics) countUsage(r usageReport) {
	uc := &bm.usage
	if r.result == usageNone || uc.prompt == nil {
		return
	}
	uc.reports[r.result].Inc()
	if r.result != usageInvalid {
		uc.prompt.Add(float64(r.prompt))
		uc.cached.Add(float64(r.cached))
	}
}

// countRequest increments warmroute_requests_total without allocating for
// the common statuses.
func (m *metrics) countRequest(bm *backendMetrics, rt route, why ring.Reason, code int) {
	slot := codeSlot(code)
	if slot < 0 || why >= ring.NumReasons {
		m.requests.WithLabelValues(routeNames[rt], why.String(), bm.id, statusLabel(code)).Inc()
		return
	}
	p := &bm.reqs[rt][why][slot]
	c := p.Load()
	if c == nil {
		cc := m.requests.WithLabelValues(routeNames[rt], why.String(), bm.id, statusLabel(code))
		p.Store(&cc)
		c = &cc
	}
	(*c).Inc()
}

// observeDecision records the routing decision begun at start and returns
// the time it ended.
func (m *metrics) observeDecision(start time.Time) time.Time {
	now := time.Now()
	m.decision.Observe(now.Sub(start).Seconds())
	return now
}
