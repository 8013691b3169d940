package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/warmroute/warmroute/gossip"
	"github.com/warmroute/warmroute/internal/identity"
	"github.com/warmroute/warmroute/internal/limit"
	"github.com/warmroute/warmroute/node/admin"
	"github.com/warmroute/warmroute/node/cluster"
	"github.com/warmroute/warmroute/proxy"
	"github.com/warmroute/warmroute/proxy/engine"
	"github.com/warmroute/warmroute/proxy/reqlog"
	"github.com/warmroute/warmroute/ring"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// Node is one router: proxy plus admin listener.
type Node struct {
	cfg   Config
	log   *slog.Logger
	reg   *prometheus.Registry
	proxy *proxy.Proxy
	name  string
	// version is advertised to other nodes.
	version string

	gossip  *gossip.Mesh       // nil when running alone
	agree   *cluster.Agreement // Raft agreement on backends and routing
	scraper *engine.Scraper    // nil when engine scraping is off
	engines *engineState       // engine figures scraped alone (no gossip)
	// modelsMet count the leader's polls of backends' model lists.
	modelsMet *modelsMetrics

	// reqs writes the access log and the trace recording, tracer exports
	// spans; each nil when off. Both stop after the proxy.
	reqs   *reqlog.Log
	tracer *sdktrace.TracerProvider

	adminToken string // "" when none is configured
	// identity is this router's cluster certificate (mutual TLS for Raft
	// and admin forwarding, signatures on gossip figures), or nil.
	identity *identity.Bundle

	trafficLn net.Listener
	adminLn   net.Listener
	admin     *http.Server
	// extProc is the endpoint-picker listener (extproc.go), nil when off.
	extProc *extProcNode

	// ringMu serialises ring rebuilds and guards baseRing: the ring built
	// from the agreed backends and settings, before the balancer's moves.
	ringMu   sync.Mutex
	baseRing *ring.Ring
	// models is what the backends serve as last handed to the proxy
	// (applyAgreed's goroutine only).
	models map[string][]string
	// started is set by the first Run or Close: each releases what New
	// took, once.
	started atomic.Bool
	// agreed is set once a cluster router has applied the agreed state
	// and routes (awaitAgreement).
	agreed atomic.Bool
}

// Options are what the binary passes besides the config.
type Options struct {
	Logger  *slog.Logger
	Version string
}

// New validates cfg, builds the first ring, binds both listeners (so Addr
// methods work before Run; port 0 picks a free port) and, in cluster mode,
// joins the cluster. Close releases everything if Run is never called.
func New(cfg Config, opts Options) (_ *Node, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	id, err := cfg.TLS.clusterIdentity()
	if err != nil {
		return nil, err
	}
	cfg.Cluster.NodeName = cfg.Cluster.name(id)
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	n := &Node{cfg: cfg, log: log, reg: prometheus.NewRegistry(), version: opts.Version, name: cfg.Cluster.NodeName,
		identity: id}
	defer func() {
		if err != nil {
			n.closeEarly()
		}
	}()
	n.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	n.modelsMet = newModelsMetrics(n.reg)

	pc := cfg.ProxyConfig()
	pc.Logger = log.With("component", "proxy")
	pc.Registry = n.reg
	// Probe results go to the Raft leader, which commits down and up with
	// hysteresis; until then this node skips a failing backend on its own.
	pc.OnProbe = func(backend string, ok bool) {
		if a := n.agree; a != nil {
			a.ReportHealth(backend, ok, n.name)
		}
	}
	lc := cfg.RequestLogConfig()
	lc.Registry, lc.Logger = n.reg, log.With("component", "reqlog")
	if n.reqs, err = reqlog.New(lc); err != nil {
		return nil, err
	}
	pc.Requests = n.reqs
	if cfg.Tracing.enabled() {
		if n.tracer, err = newTracer(cfg.Tracing, n.name, opts.Version); err != nil {
			return nil, err
		}
		// The SDK reports failed exports (a collector down) to its
		// process-wide handler, by default unstructured lines on stderr:
		// they go to this router's log instead.
		tlog := log.With("component", "tracing")
		otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) { tlog.Warn("exporting spans", "err", err) }))
		pc.Tracer = n.tracer.Tracer("github.com/warmroute/warmroute/proxy")
	}
	p, err := proxy.New(pc)
	if err != nil {
		return nil, err
	}
	n.proxy = p
	if cfg.Cluster.Enabled() {
		// Held from the first request on: the config file's ring is this
		// router's alone (awaitAgreement).
		p.Hold(notReadyPrefix + "starting: this router has not applied the state agreed under a Raft leader yet")
	}
	backends, err := cfg.RingBackends()
	if err != nil {
		return nil, err
	}
	// Epoch 0: the config file's ring, reused when the agreed state is
	// the same. A router alone routes on it until its own Raft group has
	// seeded; a cluster router is held until the agreed state arrives.
	if _, err := n.installRing(cfg.RingConfig(), backends, nil, 0); err != nil {
		return nil, fmt.Errorf("routing: %w", err)
	}

	if n.trafficLn, err = proxy.Listen(cfg.Listen); err != nil {
		return nil, fmt.Errorf("listen %s: %w", cfg.Listen, err)
	}
	if n.adminLn, err = net.Listen("tcp", cfg.AdminListen); err != nil {
		return nil, fmt.Errorf("admin listen %s: %w", cfg.AdminListen, err)
	}
	adminRefused := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "warmroute", Subsystem: "admin",
		Name: "connections_refused_total", Help: "Admin connections closed at once over the listener's caps, by reason (limit, limit_per_ip)."}, []string{"reason"})
	n.reg.MustRegister(adminRefused)
	n.adminLn = limit.NewListener(n.adminLn, maxAdminConns, maxAdminConnsPerIP, func(r string) { adminRefused.WithLabelValues(r).Inc() })
	if err := n.setupTLS(); err != nil {
		return nil, err
	}
	if err := n.startExtProc(); err != nil {
		return nil, err
	}
	var raftBind, raftAdv string
	if cfg.Cluster.Enabled() {
		if raftBind, raftAdv, err = n.raftAddrs(); err != nil {
			return nil, err
		}
		if err := n.startGossip(raftAdv, !cfg.Cluster.NonVoter); err != nil {
			return nil, err
		}
	}
	if err := n.startAgreement(raftBind, raftAdv); err != nil {
		return nil, err
	}
	if n.adminToken, err = cfg.Admin.token(); err != nil {
		return nil, err
	}
	if cfg.Engine.MetricsPath != "" {
		if n.scraper, err = n.newScraper(); err != nil {
			return nil, err
		}
		// A backend whose in-flight count passes the highest level seen
		// without a queue is scraped at once, not at the next round.
		n.proxy.SetScrapeTrigger(n.scraper)
	}
	n.admin = &http.Server{
		Handler:           n.newAdmin().Handler(),
		ConnContext:       admin.ConnContext, // authenticated connections leave the shared pool
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelDebug),
	}
	return n, nil
}

// Caps on the admin listener's connections (internal/limit); its requests are
// bounded by the http.Server's timeouts.
const (
	maxAdminConns      = 256
	maxAdminConnsPerIP = 64
)

// installRing builds a ring and hands it to the proxy, or hands it the
// ring it has when that one was built from the same settings and
// backends (the agreed state usually repeats the config file's). A
// membership change is merged into the last ring's circle (Rebuild).
func (n *Node) installRing(rc ring.Config, backends []ring.Backend, moves []ring.Move, epoch uint64) (rebuilt bool, err error) {
	n.ringMu.Lock()
	defer n.ringMu.Unlock()
	base := n.baseRing
	if base == nil || !sameRing(base, rc, backends) {
		if base, err = base.Rebuild(rc, backends); err != nil {
			return false, err
		}
		n.baseRing, rebuilt = base, true
	}
	return rebuilt, n.proxy.SetRing(base.WithMoves(moves), epoch)
}

// sameRing reports whether r was built from rc's settings and zone and
// from backends.
func sameRing(r *ring.Ring, rc ring.Config, backends []ring.Backend) bool {
	cur := r.Config()
	if cur.Settings != rc.Settings || cur.LocalZone != rc.LocalZone || r.Len() != len(backends) {
		return false
	}
	sorted := slices.SortedFunc(slices.Values(backends), func(a, b ring.Backend) int { return strings.Compare(a.ID, b.ID) })
	return slices.Equal(r.Backends(), sorted)
}

// TrafficAddr is the bound client-facing address.
func (n *Node) TrafficAddr() net.Addr { return n.trafficLn.Addr() }

// AdminAddr is the bound admin address.
func (n *Node) AdminAddr() net.Addr { return n.adminLn.Addr() }

// newTracer builds the tracer provider: parent-based sampling at the
// configured ratio, spans batched to an OTLP/HTTP exporter (which also
// reads the OTEL_EXPORTER_OTLP_* variables; the endpoint setting wins over
// them). The batcher drops spans rather than wait when its queue is full.
func newTracer(c Tracing, name, version string) (*sdktrace.TracerProvider, error) {
	var opts []otlptracehttp.Option
	if c.Endpoint != "" {
		// A base URL gets the signal's path, as OTEL_EXPORTER_OTLP_ENDPOINT
		// does (WithEndpointURL alone would post to "/").
		u, err := url.Parse(c.Endpoint)
		if err != nil {
			return nil, fmt.Errorf("tracing endpoint: %w", err)
		}
		if u.Path == "" || u.Path == "/" {
			u.Path = "/v1/traces"
		}
		opts = append(opts, otlptracehttp.WithEndpointURL(u.String()))
	}
	exp, err := otlptracehttp.New(context.Background(), opts...)
	if err != nil {
		return nil, fmt.Errorf("tracing: %w", err)
	}
	attrs := []attribute.KeyValue{attribute.String("service.name", "warmroute"), attribute.String("service.instance.id", name)}
	if version != "" {
		attrs = append(attrs, attribute.String("service.version", version))
	}
	// OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES win over these.
	res, err := resource.New(context.Background(), resource.WithAttributes(attrs...), resource.WithFromEnv(), resource.WithTelemetrySDK())
	if err != nil {
		return nil, fmt.Errorf("tracing: %w", err)
	}
	return sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp),
		sdktrace.WithResource(res),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(c.SampleRatio))),
	), nil
}

// stopReporting writes out what the request log and the tracer hold and
// stops them; after the proxy, which hands them the last requests.
func (n *Node) stopReporting(ctx context.Context) error {
	var err error
	if n.tracer != nil {
		if e := n.tracer.Shutdown(ctx); e != nil {
			n.log.Warn("exporting the last spans", "err", e)
		}
	}
	if n.reqs != nil {
		err = n.reqs.Close()
	}
	return err
}

// closeEarly releases what New acquired when New fails.
func (n *Node) closeEarly() {
	if n.reqs != nil || n.tracer != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		n.stopReporting(ctx)
		cancel()
	}
	if n.agree != nil {
		n.agree.Close()
	}
	if n.gossip != nil {
		n.gossip.Close()
	}
	n.extProc.close()
	for _, ln := range []net.Listener{n.trafficLn, n.adminLn} {
		if ln != nil {
			ln.Close()
		}
	}
}

// Close releases everything New took (Raft, gossip, both listeners) when
// Run was never called; after Run, which releases them itself when it
// returns, it does nothing. It is safe to call more than once.
func (n *Node) Close() error {
	if n.started.Swap(true) {
		return nil
	}
	n.closeEarly()
	return nil
}

// Run serves until ctx is cancelled, then stops accepting, lets open streams
// finish for up to ShutdownTimeout and returns. Components stop in the
// reverse of the order they started: the proxy drains while this node still
// publishes its (falling) load, then it leaves the cluster.
func (n *Node) Run(ctx context.Context) error {
	if n.started.Swap(true) {
		return errors.New("node: Run after Run or Close")
	}
	bg, stopBG := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	if n.scraper != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n.scraper.Run(bg)
		}()
	}
	if n.gossip != nil {
		wg.Add(2)
		go func() {
			defer wg.Done()
			n.followGossip(bg)
		}()
		go func() {
			defer wg.Done()
			n.awaitAgreement(bg)
		}()
	}
	wg.Add(5)
	go func() {
		defer wg.Done()
		n.followAgreement(bg)
	}()
	go func() {
		defer wg.Done()
		n.learnCost(bg)
	}()
	go func() {
		defer wg.Done()
		n.learnModels(bg)
	}()
	go func() {
		defer wg.Done()
		n.learnSplits(bg)
	}()
	go func() {
		defer wg.Done()
		n.balance(bg)
	}()
	defer func() {
		stopBG()
		wg.Wait()
		n.stopAgreement()
		if n.gossip != nil {
			if err := n.gossip.Close(); err != nil {
				n.log.Warn("leaving the cluster", "err", err)
			}
		}
	}()

	errc := make(chan error, 4)
	go func() { errc <- n.proxy.Serve(n.trafficLn) }()
	go func() {
		if err := n.admin.Serve(n.adminLn); err != nil && !errors.Is(err, http.ErrServerClosed) {
			errc <- fmt.Errorf("admin listener: %w", err)
			return
		}
		errc <- nil
	}()
	n.log.Info("router serving", "node", n.name, "listen", n.TrafficAddr().String(), "admin", n.AdminAddr().String(),
		"strategy", n.cfg.Routing.Strategy.String(), "backends", len(n.cfg.Backends), "cluster", n.gossip != nil)

	var runErr error
	pending := 2 + n.extProc.serve(errc, n.log) // Serve goroutines still running
	select {
	case <-ctx.Done():
	case runErr = <-errc:
		pending--
	case runErr = <-n.agree.Fatal():
		// This router's data belong to another cluster: stop rather than
		// route on them.
	}
	n.log.Info("shutting down", "drain", n.cfg.ShutdownTimeout)
	sctx, cancel := context.WithTimeout(context.Background(), n.cfg.ShutdownTimeout)
	defer cancel()
	// The picker's streams hold in-flight slots of the proxy's backends:
	// both drain together.
	pickerDone := make(chan error, 1)
	go func() { pickerDone <- n.extProc.shutdown(sctx) }()
	if err := n.proxy.Shutdown(sctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		runErr = errors.Join(runErr, err)
	}
	if err := <-pickerDone; err != nil && !errors.Is(err, context.DeadlineExceeded) {
		runErr = errors.Join(runErr, err)
	}
	if err := n.admin.Shutdown(sctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		runErr = errors.Join(runErr, err)
	}
	// Both servers return once shut down (also when Shutdown came first).
	for ; pending > 0; pending-- {
		runErr = errors.Join(runErr, <-errc)
	}
	// Streams the proxy cut at the deadline have handed over their
	// records by now.
	rctx, rcancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer rcancel()
	runErr = errors.Join(runErr, n.stopReporting(rctx))
	return runErr
}

// NewLogger builds the slog logger the Log settings describe.
func NewLogger(c Log, w *os.File) *slog.Logger {
	var lvl slog.Level
	_ = lvl.UnmarshalText([]byte(strings.ToUpper(c.Level)))
	opts := &slog.HandlerOptions{Level: lvl}
	if strings.EqualFold(c.Format, "json") {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// register registers c with reg (nil: none) and returns it, or the
// collector registered before it under the same name (a loop that a test
// starts twice on one registry shares its counters).
func register[C prometheus.Collector](reg prometheus.Registerer, c C) C {
	if reg == nil {
		return c
	}
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if old, ok := are.ExistingCollector.(C); ok {
				return old
			}
		}
	}
	return c
}
