package proxy

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"
	"github.com/warmroute/warmroute/internal/backendspec"
	"github.com/warmroute/warmroute/proxy/internal/hot"
	"github.com/warmroute/warmroute/proxy/internal/relay"
	"github.com/warmroute/warmroute/ring"
	"go.opentelemetry.io/otel/propagation"
)

// Header names the proxy reads and writes.
const (
	HeaderTenant   = "X-Amzn-SageMaker-Prefix-Aware-Id"
	HeaderBackend  = "X-Warmroute-Backend"
	HeaderDecision = "X-Warmroute-Decision"
	HeaderEpoch    = "X-Warmroute-Epoch"
)

// table is one routing snapshot: a ring and the live backend state in the
// ring's index order.
type table struct {
	ring  *ring.Ring
	bs    []*backend
	epoch uint64
	// epochHdr is the epoch pre-rendered for the response header.
	epochHdr []byte
	// models are the per-model sub-tables (models.go); nil when no
	// backend's models are known.
	models *modelTables
}

// Proxy is the request path of one router node. Create it with New, feed it
// rings with SetRing, serve with Serve, stop with Shutdown.
type Proxy struct {
	cfg Config
	log *slog.Logger
	m   *metrics

	tab atomic.Pointer[table]

	// splits are the prefixes ADAPTIVE keys route past; hot counts the
	// traffic that proposes them; cost learns what leaving a key's owner
	// costs (cost.go).
	splits atomic.Pointer[ring.Splits]
	hot    *hot.Counter
	// trigger asks for early engine scrapes (SetScrapeTrigger).
	trigger     atomic.Pointer[ScrapeTrigger]
	cost        recomputeCost
	splitsGauge prometheus.Gauge
	// partHits counts PREFIX_AWARE requests per partition of the ring in
	// use, for the leader's balancer (PartitionLoads).
	partHits atomic.Pointer[[]atomic.Uint32]

	mu       sync.Mutex // serialises SetRing; guards backends
	backends map[string]*backend
	// served is what each backend serves (SetModels), by backend id;
	// servedVersion counts SetModels calls, and subRings are the model
	// rings built for the last one (models.go). All under mu.
	served        map[string][]string
	servedVersion uint64
	subRings      subRingCache

	// bodies bounds the request bodies held in memory (body.go).
	bodies *bodyBudget

	states   sync.Pool // *reqState
	streams  sync.Pool // *trackedStream
	observed sync.Pool // *observedStream
	relayed  sync.Pool // *relayStream
	readers  sync.Pool // *bufio.Reader for relayed exchanges
	writers  sync.Pool // *bufio.Writer for relayed exchanges
	scratch  sync.Pool // *[4 << 10]byte read buffers

	// relay passes streamed bodies on event loops (relay.go); nil where
	// the platform has none or Config.StreamRelay is off.
	relay *relay.Relay
	// servedAgain: client connections the relay gave back, being served
	// (guarded by mu).
	servedAgain map[net.Conn]struct{}

	// observing: Requests or Tracer is set (observe.go); prop reads and
	// writes W3C traceparent fields.
	observing bool
	prop      propagation.TraceContext

	server        *fasthttp.Server
	proberStarted bool             // guarded by mu
	trimStarted   bool             // guarded by mu
	sweepStarted  bool             // guarded by mu: startIdleSweep ran
	shutdown      bool             // guarded by mu: Shutdown was called
	listeners     []clientListener // guarded by mu: what Serve serves on

	unready   atomic.Pointer[string] // SetUnready's reason, or nil
	held      atomic.Pointer[string] // Hold's reason, or nil
	open      atomic.Int64           // client connections open
	lingering atomic.Int64           // refused connections being drained

	stop     chan struct{}
	stopOnce sync.Once
	wg       sync.WaitGroup
}

// New builds a proxy with an empty ring. Validate errors are returned.
func New(cfg Config) (*Proxy, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("proxy config: %w", err)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	p := &Proxy{
		cfg:      cfg,
		log:      log,
		m:        newMetrics(cfg.Registry),
		backends: map[string]*backend{},
		stop:     make(chan struct{}),
		hot:      hot.New(),
		bodies:   newBodyBudget(int64(cfg.MaxBodyMemory)),
		splitsGauge: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "warmroute_prefix_splits",
			Help: "Prompt prefixes in use as split (ADAPTIVE keys route one block past them): those carrying more traffic than one backend should take.",
		}),
	}
	if cfg.Registry != nil {
		cfg.Registry.MustRegister(p.splitsGauge, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "warmroute_relayed_streams",
			Help: "Streamed answers being passed on the event loops (StreamRelay) rather than by a goroutine each.",
		}, func() float64 {
			if p.relay == nil {
				return 0
			}
			return float64(p.relay.Active())
		}), prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "warmroute_request_body_bytes",
			Help: "Bytes of request bodies held in memory, against max-body-memory.",
		}, func() float64 {
			used, _ := p.bodies.held()
			return float64(used)
		}), prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "warmroute_recompute_unit_bytes",
			Help: "The work unit the COST overflow rule weighs a move in: the bytes of prompt an average request makes its backend prefill (mean body x (1 - owners' cached share)); the cluster's agreed one when there is one, else this router's own.",
		}, func() float64 {
			if u := p.cost.agreed.Load(); u > 0 {
				return float64(u)
			}
			u, _ := p.cost.localUnit()
			return float64(u)
		}))
	}
	p.states.New = func() any { return new(reqState) }
	p.streams.New = func() any { return new(trackedStream) }
	p.observed.New = func() any { return new(observedStream) }
	p.relayed.New = func() any { return new(relayStream) }
	p.readers.New = func() any { return bufio.NewReaderSize(nil, 16<<10) }
	p.writers.New = func() any { return bufio.NewWriterSize(nil, 16<<10) }
	p.scratch.New = func() any { return new([4 << 10]byte) }
	if cfg.StreamRelay {
		p.relay = relay.New(relay.Config{
			UpstreamIdle: cfg.StreamIdleTimeout,
			WriteStall:   cfg.WriteTimeout,
			ErrorEvent:   sseUpstreamError,
		})
	}
	p.observing = cfg.Requests != nil || cfg.Tracer != nil
	empty, _ := ring.New(ring.DefaultConfig(), nil)
	p.tab.Store(&table{ring: empty, epochHdr: []byte("0")})
	if cfg.Registry != nil {
		cfg.Registry.MustRegister(&backendCollector{p: p}, &cacheCollector{p: p})
	}
	p.server = &fasthttp.Server{
		Handler:      p.handle,
		ErrorHandler: p.handleServerError,
		Name:         "warmroute",
		// The listener refuses connections over MaxConns (with JSON);
		// fasthttp's own limit, with headroom for workers between two
		// connections, never applies.
		Concurrency:        cfg.MaxConns + cfg.MaxConns/4 + 16,
		MaxRequestBodySize: int(cfg.MaxBodySize),
		// The handler reads each body itself, against the body budget
		// (readBody), instead of fasthttp reading it whole first.
		StreamRequestBody: true,
		ReadBufferSize:    int(cfg.MaxHeaderSize),
		ReadTimeout:       cfg.ReadTimeout,
		IdleTimeout:       cfg.IdleTimeout,
		// A burst of streams leaves as many idle workers (a goroutine
		// and its stack each) as were waiting for headers at once;
		// they go after 2 s instead of fasthttp's 10.
		MaxIdleWorkerDuration:         2 * time.Second,
		DisableHeaderNamesNormalizing: false,
		NoDefaultServerHeader:         true,
		NoDefaultContentType:          true,
		CloseOnShutdown:               true,
		ReduceMemoryUsage:             false,
		// fasthttp's parse errors otherwise quote the request bytes
		// (headers with credentials, prompt text) into its log messages.
		SecureErrorLogMessage: true,
		// A multipart body (an audio upload) is passed on as it came:
		// pre-parsed, fasthttp would rebuild it from a map (its fields
		// reordered) and spill large files to disk.
		DisablePreParseMultipartForm: true,
		Logger:                       fasthttpLogger{log},
	}
	return p, nil
}

// SetRing installs a new ring snapshot. Backends keep their counters across
// snapshots (matched by ID and address); backends no longer in the ring
// stop being probed and are forgotten once their streams end.
func (p *Proxy) SetRing(r *ring.Ring, epoch uint64) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	t := &table{ring: r, bs: make([]*backend, r.Len()), epoch: epoch, epochHdr: strconv.AppendUint(nil, epoch, 10)}
	next := make(map[string]*backend, r.Len())
	for i, rb := range r.Backends() {
		target, err := backendspec.ParseTarget(rb.Addr)
		if err != nil {
			return fmt.Errorf("backend %s: %w", rb.ID, err)
		}
		b := p.backends[rb.ID]
		if b == nil || b.target != target {
			b = newBackend(rb.ID, target, &p.cfg, p.m)
			b.cost = &p.cost
		}
		t.bs[i] = b
		next[rb.ID] = b
	}
	for id, b := range p.backends {
		if next[id] != b {
			// Gone from the proxy: its streams end on their own, and
			// their upstream connections are closed rather than kept.
			b.closeIdleUps()
		}
	}
	p.backends = next
	if h := p.partHits.Load(); h == nil || len(*h) != r.Partitions() {
		hits := make([]atomic.Uint32, r.Partitions())
		p.partHits.Store(&hits)
	}
	p.tab.Store(p.withModels(t))
	return nil
}

// PartitionUnit is what one request adds to its partition's count in
// PartitionLoads: counts are fixed-point, so that decaying the count of a
// partition with a request or two does not round it away.
const PartitionUnit = 256

// PartitionLoads returns the requests counted per partition, in
// PartitionUnit per request, decayed by 1/16 at each call (so they follow
// the last sixteen or so calls), and the ring they were counted on. Call it
// from one goroutine.
func (p *Proxy) PartitionLoads(dst []uint32) ([]uint32, *ring.Ring) {
	t := p.tab.Load()
	h := p.partHits.Load()
	dst = dst[:0]
	if h == nil || len(*h) != t.ring.Partitions() {
		return dst, t.ring
	}
	for i := range *h {
		v := (*h)[i].Load()
		dst = append(dst, v)
		if v != 0 {
			(*h)[i].Store(v - (v+15)/16)
		}
	}
	return dst, t.ring
}

// SetSplits installs the split prefixes ADAPTIVE keys route past.
func (p *Proxy) SetSplits(list []ring.Split) error {
	s, err := ring.NewSplits(list)
	if err != nil {
		return err
	}
	p.splits.Store(s)
	p.splitsGauge.Set(float64(s.Len()))
	return nil
}

// Splits returns the split prefixes in use.
func (p *Proxy) Splits() []ring.Split { return p.splits.Load().List() }

// HotPrefix is a prefix this router's traffic counts as a candidate for a
// split: its block-chain key and depth, its recent request count (decayed,
// in HotUnit per request) and the ring partition its requests route on.
type HotPrefix struct {
	Key   uint64
	Depth int
	Count uint64
	Part  uint32
}

// HotUnit is what one request adds to the counts of HotPrefixes.
const HotUnit = hot.Unit

// HotPrefixes closes a counting period and returns the requests counted
// (decayed, in HotUnit per request) and the candidates for a split this
// router's own traffic shows, given the splits in use: those splits still
// counted and the prefixes whose share reached one active backend's fair
// share (see package hot), the busiest first. Call it periodically from
// one goroutine; the Raft leader adds every router's counts up and
// commits the splits whose owners are pressed.
func (p *Proxy) HotPrefixes() (uint64, []HotPrefix) {
	t := p.tab.Load()
	n := 0
	for i := range t.bs {
		if t.ring.Backend(i).State == ring.Active {
			n++
		}
	}
	total, cands := p.hot.Rotate(n, p.Splits())
	out := make([]HotPrefix, len(cands))
	for i, c := range cands {
		out[i] = HotPrefix{Key: c.Key, Depth: c.Depth, Count: c.Count, Part: c.Part}
	}
	return total, out
}

// SetScrapeTrigger installs what asks for an early scrape of an engine
// whose cluster in-flight count passes the highest level seen without a
// queue (see backend.learn); nil turns it off.
func (p *Proxy) SetScrapeTrigger(t ScrapeTrigger) {
	if t == nil {
		p.trigger.Store(nil)
		return
	}
	p.trigger.Store(&t)
}

// scrapeTrigger returns the installed ScrapeTrigger, or nil.
func (p *Proxy) scrapeTrigger() ScrapeTrigger {
	if t := p.trigger.Load(); t != nil {
		return *t
	}
	return nil
}

// Ring returns the current snapshot and its epoch.
func (p *Proxy) Ring() (*ring.Ring, uint64) {
	t := p.tab.Load()
	return t.ring, t.epoch
}

// SetRemote records the in-flight count the other router nodes report for a
// backend, and its engine's queue at the last scrape (see EngineQueue):
// the backend is busy while the cluster's in-flight count stays above what
// it was at a scrape that saw a queue, less that queue. Unknown IDs are
// ignored.
func (p *Proxy) SetRemote(id string, inflight int64, q EngineQueue) {
	t := p.tab.Load()
	if i, ok := t.ring.Index(id); ok {
		b := t.bs[i]
		b.remote.Store(inflight)
		b.setQueue(q)
		b.rising(p.scrapeTrigger(), b.globalInFlight(), time.Now().UnixNano())
	}
}

// BackendLoad is one backend's own in-flight count on this node, and
// whether this node sees it failing: its health checks failed
// ProbeFailThreshold times in a row, or it is passively ejected after
// EjectAfter connect failures.
type BackendLoad struct {
	Backend  string
	InFlight int64
	Failing  bool
}

// AppendInFlight appends this node's exact in-flight count and local
// health verdict per backend.
func (p *Proxy) AppendInFlight(dst []BackendLoad) []BackendLoad {
	now := time.Now().UnixNano()
	for _, b := range p.tab.Load().bs {
		dst = append(dst, BackendLoad{Backend: b.id, InFlight: b.inflight.Load(),
			Failing: b.probeDown.Load() || b.ejectedUntil.Load() > now})
	}
	return dst
}

// BackendStatus is a backend's live state for status pages.
type BackendStatus struct {
	ID             string `json:"id"`
	Addr           string `json:"addr"`
	Zone           string `json:"zone,omitempty"`
	State          string `json:"state"`
	Healthy        bool   `json:"healthy"`
	ProbeDown      bool   `json:"probe_down"`
	Ejected        bool   `json:"ejected"`
	Busy           bool   `json:"busy"`
	InFlight       int64  `json:"in_flight"`
	RemoteInFlight int64  `json:"remote_in_flight"`
	// Limit is ConcurrencyThreshold x weight; 0 when the threshold is not
	// set.
	Limit int64 `json:"limit"`
	// Capacity is the learned number of requests the engine runs at once
	// (0: not learned yet): its running count when it last queued.
	Capacity int64 `json:"capacity,omitempty"`
	// Pressed: the engine is taken to queue, or the cluster's in-flight
	// count reached Limit or Capacity. Only a pressed backend's prefixes
	// are split and its partitions moved.
	Pressed bool `json:"pressed"`
	// Cache is this router's cache predictions for the backend and what
	// its answers delivered, per decision kind that had answers.
	Cache []CacheFigures `json:"cache,omitempty"`
}

// Status reports every backend of the current snapshot.
func (p *Proxy) Status() []BackendStatus {
	t := p.tab.Load()
	now := time.Now().UnixNano()
	out := make([]BackendStatus, len(t.bs))
	for i, b := range t.bs {
		rb := t.ring.Backend(i)
		out[i] = BackendStatus{
			ID: b.id, Addr: rb.Addr, Zone: rb.Zone, State: rb.State.String(),
			Healthy:   rb.State == ring.Active && b.available(now),
			ProbeDown: b.probeDown.Load(), Ejected: b.ejectedUntil.Load() > now,
			Busy: b.busy(), InFlight: b.inflight.Load(), RemoteInFlight: b.remote.Load(),
			Limit: t.ring.Limit(i), Capacity: b.capacity.Load(), Pressed: b.pressed(t.ring.Limit(i)),
			Cache: b.cache.figures(),
		}
		if out[i].Limit == ring.NoLimit {
			out[i].Limit = 0 // ConcurrencyThreshold not set
		}
	}
	return out
}

// Ready reports whether at least one backend can take a request.
func (p *Proxy) Ready() bool {
	if p.unready.Load() != nil || p.held.Load() != nil {
		return false
	}
	t := p.tab.Load()
	now := time.Now().UnixNano()
	for i, b := range t.bs {
		if t.ring.Backend(i).State == ring.Active && b.available(now) {
			return true
		}
	}
	return false
}

// SetUnready marks the router not ready whatever its backends' health,
// with reason in the /readyz and /ping answers; "" clears it. The node
// uses it when the router must not take traffic (its agreement halted).
func (p *Proxy) SetUnready(reason string) {
	if reason == "" {
		p.unready.Store(nil)
		return
	}
	p.unready.Store(&reason)
}

// Hold makes the router refuse every request bound for a backend with
// 503 not_ready and reason, and report not ready with it, until Hold("").
// The node holds a cluster router until it has applied a state agreed
// under a leader: the ring it would route on before that is only its own
// config file's.
func (p *Proxy) Hold(reason string) {
	if reason == "" {
		p.held.Store(nil)
		return
	}
	p.held.Store(&reason)
}

// unreadyReason is why Ready is false: the reason SetUnready or Hold gave,
// or that no backend is healthy.
func (p *Proxy) unreadyReason() string {
	if r := p.unready.Load(); r != nil {
		return *r
	}
	if r := p.held.Load(); r != nil {
		return *r
	}
	return "no healthy backend"
}

// Explain tells where a request with this body and tenant header would go
// and why, without sending it.
func (p *Proxy) Explain(api ring.API, body, tenant []byte) (ring.KeyInfo, ring.Explanation, error) {
	return p.ExplainSession(api, body, tenant, nil)
}

// ExplainSession is Explain for a request that carries session id session
// in the configured session header (nil: none).
func (p *Proxy) ExplainSession(api ring.API, body, tenant, session []byte) (ring.KeyInfo, ring.Explanation, error) {
	t := p.tab.Load()
	st := &reqState{}
	st.reset(t, time.Now())
	if err := p.readKey(t, api, body, tenant, session, st, false); err != nil {
		return st.info, ring.Explanation{}, err
	}
	return st.info, t.ring.ExplainCost(st.info.Key, st.recompute, st), nil
}

// Serve accepts client connections on ln until Shutdown. It also runs the
// active health checks. After Shutdown it closes ln and returns at once.
func (p *Proxy) Serve(ln net.Listener) error {
	cl := clientListener{Listener: ln, p: p, closeOnce: new(sync.Once)}
	p.mu.Lock()
	if p.shutdown {
		p.mu.Unlock()
		cl.Close()
		return nil
	}
	p.listeners = append(p.listeners, cl)
	p.mu.Unlock()
	p.startProber()
	p.startTrimmer()
	p.startIdleSweep()
	err := p.server.Serve(cl)
	if errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}

// Shutdown stops accepting connections and waits, until ctx ends, for open
// requests and streams to finish; then it closes what is left, and the idle
// upstream connections (the relay's too). It stops the health checks. Safe
// to call more than once.
func (p *Proxy) Shutdown(ctx context.Context) error {
	p.stopOnce.Do(func() { close(p.stop) })
	p.mu.Lock()
	p.shutdown = true
	lns := p.listeners
	p.listeners = nil
	p.mu.Unlock()
	// fasthttp's Shutdown closes only the listeners its Serve has
	// registered; a Serve called just before would register later and
	// accept for ever. Closing them here first ends every Serve (fasthttp
	// closes them again, which clientListener makes a no-op).
	for _, ln := range lns {
		ln.Close()
	}
	err := p.server.ShutdownWithContext(ctx)
	if p.relay != nil {
		// Relayed streams are not the server's connections: wait for
		// them here, then end what is left.
		if rerr := p.relay.Wait(ctx); err == nil {
			err = rerr
		}
		p.relay.Close()
	}
	p.closeServedAgain()
	p.wg.Wait()
	p.mu.Lock()
	for _, b := range p.backends {
		b.client.CloseIdleConnections()
		b.closeIdleUps()
	}
	p.mu.Unlock()
	return err
}

// fasthttpLogger routes fasthttp's own messages to slog, at debug level,
// with every quoted string that is not an address redacted: fasthttp
// quotes pieces of malformed requests into its errors (a header line with a
// credential, prompt text), which must never reach the logs.
type fasthttpLogger struct{ l *slog.Logger }

func (f fasthttpLogger) Printf(format string, args ...any) {
	if !f.l.Enabled(context.Background(), slog.LevelDebug) {
		return
	}
	f.l.Debug(redactQuoted(fmt.Sprintf(format, args...)), "component", "fasthttp")
}

// redactQuoted replaces the content of every double-quoted span of s
// (Go-quoted: backslash escapes) with "…", except host:port addresses.
func redactQuoted(s string) string {
	var b strings.Builder
	for {
		i := strings.IndexByte(s, '"')
		if i < 0 {
			b.WriteString(s)
			return b.String()
		}
		b.WriteString(s[:i+1])
		s = s[i+1:]
		j := 0
		for j < len(s) && s[j] != '"' {
			if s[j] == '\\' {
				j++
			}
			j++
		}
		if j > len(s) {
			j = len(s)
		}
		if isAddr(s[:j]) {
			b.WriteString(s[:j])
		} else {
			b.WriteString("…")
		}
		if j == len(s) {
			return b.String()
		}
		b.WriteByte('"')
		s = s[j+1:]
	}
}

// isAddr reports whether s is an IP address with a numeric port.
func isAddr(s string) bool {
	host, port, err := net.SplitHostPort(s)
	if err != nil || net.ParseIP(host) == nil {
		return false
	}
	_, err = strconv.ParseUint(port, 10, 16)
	return err == nil
}

// backendCollector exports per-backend gauges read from the atomics at
// scrape time, so the request path pays nothing for them.
type backendCollector struct{ p *Proxy }

var (
	descInFlight = prometheus.NewDesc("warmroute_backend_in_flight",
		"In-flight requests per backend: scope=own is this node's exact count, scope=global adds the other nodes' reported counts.",
		[]string{"backend", "scope"}, nil)
	descHealthy = prometheus.NewDesc("warmroute_backend_healthy",
		"1 when the backend may take requests (active, passing health checks, not ejected).",
		[]string{"backend"}, nil)
	descBusy = prometheus.NewDesc("warmroute_backend_busy",
		"1 when the backend's engine reports queued requests.",
		[]string{"backend"}, nil)
	descLimit = prometheus.NewDesc("warmroute_backend_limit",
		"The backend's concurrency limit (ConcurrencyThreshold x weight); absent when the threshold is not set.",
		[]string{"backend"}, nil)
	descEpoch = prometheus.NewDesc("warmroute_ring_epoch",
		"The epoch of the ring snapshot in use.", nil, nil)
	descBackends = prometheus.NewDesc("warmroute_ring_backends",
		"Backends in the ring snapshot in use.", nil, nil)
	descClientConns = prometheus.NewDesc("warmroute_client_connections",
		"Client connections open on the traffic listener.", nil, nil)
)

func (c *backendCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descInFlight, descHealthy, descBusy, descLimit, descEpoch, descBackends, descClientConns} {
		ch <- d
	}
}

func (c *backendCollector) Collect(ch chan<- prometheus.Metric) {
	t := c.p.tab.Load()
	now := time.Now().UnixNano()
	b2f := func(v bool) float64 {
		if v {
			return 1
		}
		return 0
	}
	for i, b := range t.bs {
		own := b.inflight.Load()
		ch <- prometheus.MustNewConstMetric(descInFlight, prometheus.GaugeValue, float64(own), b.id, "own")
		ch <- prometheus.MustNewConstMetric(descInFlight, prometheus.GaugeValue, float64(own+b.remote.Load()), b.id, "global")
		ch <- prometheus.MustNewConstMetric(descHealthy, prometheus.GaugeValue, b2f(t.ring.Backend(i).State == ring.Active && b.available(now)), b.id)
		ch <- prometheus.MustNewConstMetric(descBusy, prometheus.GaugeValue, b2f(b.busy()), b.id)
		if l := t.ring.Limit(i); l != ring.NoLimit {
			ch <- prometheus.MustNewConstMetric(descLimit, prometheus.GaugeValue, float64(l), b.id)
		}
	}
	ch <- prometheus.MustNewConstMetric(descEpoch, prometheus.GaugeValue, float64(t.epoch))
	ch <- prometheus.MustNewConstMetric(descBackends, prometheus.GaugeValue, float64(len(t.bs)))
	ch <- prometheus.MustNewConstMetric(descClientConns, prometheus.GaugeValue, float64(c.p.open.Load()))
}

// every runs fn every d on a goroutine of its own until Shutdown, once:
// started (guarded by p.mu) says it runs already.
func (p *Proxy) every(started *bool, d time.Duration, fn func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if *started || p.shutdown {
		return
	}
	*started = true
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		tick := time.NewTicker(d)
		defer tick.Stop()
		for {
			select {
			case <-p.stop:
				return
			case <-tick.C:
			}
			fn()
		}
	}()
}
