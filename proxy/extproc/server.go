package extproc

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/warmroute/warmroute/proxy"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
)

// Picker is what the server needs of the router: its decision path and
// its body-memory budget.
type Picker interface {
	Pick(*proxy.PickRequest) (*proxy.Picked, error)
	ChargeBody() proxy.BodyCharge
	// SessionHeader names the header that carries a session id ("": none).
	SessionHeader() string
}

var _ Picker = (*proxy.Proxy)(nil)

// Health service names.
const (
	ServiceLiveness  = "liveness"
	ServiceReadiness = "readiness"
	// ServiceConformance is the name the extension's conformance
	// manifests probe.
	ServiceConformance = "inference-extension"
)

// Config configures the server. Start from DefaultConfig.
type Config struct {
	// TLS serves the gRPC listener over TLS; nil serves plaintext (the
	// caller allows that on loopback only).
	TLS *tls.Config
	// MaxStreams bounds the streams open at once, over every connection;
	// a stream over it is answered 429 at its first message.
	MaxStreams int
	// MaxStreamsPerConn bounds one connection's concurrent streams (HTTP/2
	// SETTINGS_MAX_CONCURRENT_STREAMS).
	MaxStreamsPerConn uint32
	// MaxBodySize bounds a request body (413 above). Messages may be that
	// large plus MessageSlack.
	MaxBodySize int
	// Fallbacks is how many endpoints to list after the primary.
	Fallbacks int
	// ReadTimeout bounds the request phase: from the stream's start to the
	// decision (408 after it).
	ReadTimeout time.Duration
	// FirstByteTimeout bounds the wait for the response headers after the
	// decision; StreamIdleTimeout the wait between later messages. The
	// stream is ended after either (its slot given back).
	FirstByteTimeout  time.Duration
	StreamIdleTimeout time.Duration
	// Ready reports whether the router can route (readiness); nil: always.
	Ready func() bool
	// HealthInterval is how often readiness is re-read.
	HealthInterval time.Duration

	Logger   *slog.Logger
	Registry prometheus.Registerer
}

// MessageSlack is what a message may carry beyond MaxBodySize: its
// headers and framing.
const MessageSlack = 1 << 20

// DefaultConfig returns the defaults.
func DefaultConfig() Config {
	pc := proxy.DefaultConfig()
	return Config{
		MaxStreams:        4096,
		MaxStreamsPerConn: 1024,
		MaxBodySize:       int(pc.MaxBodySize),
		Fallbacks:         pc.Retries,
		ReadTimeout:       pc.ReadTimeout,
		FirstByteTimeout:  pc.FirstByteTimeout,
		StreamIdleTimeout: pc.StreamIdleTimeout,
		HealthInterval:    250 * time.Millisecond,
	}
}

// Validate reports unusable settings.
func (c *Config) Validate() error {
	var errs []error
	if c.MaxStreams < 1 || c.MaxStreamsPerConn < 1 {
		errs = append(errs, fmt.Errorf("ext_proc stream limits must be positive, got %d and %d per connection", c.MaxStreams, c.MaxStreamsPerConn))
	}
	if c.MaxBodySize < 1<<10 {
		errs = append(errs, fmt.Errorf("ext_proc max body size must be at least 1KiB, got %d", c.MaxBodySize))
	}
	if c.Fallbacks < 0 || c.Fallbacks > 16 {
		errs = append(errs, fmt.Errorf("ext_proc fallbacks must be within [0, 16], got %d", c.Fallbacks))
	}
	if c.ReadTimeout <= 0 || c.FirstByteTimeout <= 0 || c.StreamIdleTimeout <= 0 || c.HealthInterval <= 0 {
		errs = append(errs, errors.New("ext_proc timeouts and the health interval must be positive"))
	}
	return errors.Join(errs...)
}

// Server is the ext_proc gRPC server and its health service.
type Server struct {
	extprocv3.UnimplementedExternalProcessorServer

	cfg    Config
	picker Picker
	log    *slog.Logger
	m      *metrics

	grpc, healthOnly *grpc.Server
	health           *health.Server

	// slots bounds the open streams.
	slots chan struct{}

	stop     chan struct{}
	stopOnce sync.Once
	wg       sync.WaitGroup
}

// New builds a server; Serve runs it.
func New(cfg Config, p Picker) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Server{cfg: cfg, picker: p, log: log, m: newMetrics(cfg.Registry),
		health: health.NewServer(), slots: make(chan struct{}, cfg.MaxStreams), stop: make(chan struct{})}
	opts := []grpc.ServerOption{
		grpc.MaxRecvMsgSize(cfg.MaxBodySize + MessageSlack),
		grpc.MaxConcurrentStreams(cfg.MaxStreamsPerConn),
		grpc.MaxHeaderListSize(64 << 10),
		grpc.ConnectionTimeout(10 * time.Second),
		// Gateways keep their connection to the picker open; pings find a
		// peer that went away without closing it.
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: time.Minute, Timeout: 20 * time.Second}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
	}
	if cfg.TLS != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(cfg.TLS)))
	}
	s.grpc = grpc.NewServer(opts...)
	extprocv3.RegisterExternalProcessorServer(s.grpc, s)
	healthpb.RegisterHealthServer(s.grpc, s.health)
	// Kubernetes' gRPC probes speak plaintext only: the health service is
	// also served alone, without TLS, where ServeHealth is called.
	s.healthOnly = grpc.NewServer(grpc.ConnectionTimeout(10*time.Second), grpc.MaxRecvMsgSize(4<<10))
	healthpb.RegisterHealthServer(s.healthOnly, s.health)
	s.health.SetServingStatus(ServiceLiveness, healthpb.HealthCheckResponse_SERVING)
	s.setReady(false)
	s.wg.Add(1)
	go s.followReadiness()
	return s, nil
}

// readyServices are the names that answer the router's readiness.
var readyServices = []string{"", ServiceReadiness, extprocv3.ExternalProcessor_ServiceDesc.ServiceName, ServiceConformance}

func (s *Server) setReady(ok bool) {
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if ok {
		st = healthpb.HealthCheckResponse_SERVING
	}
	for _, name := range readyServices {
		s.health.SetServingStatus(name, st)
	}
}

// followReadiness re-reads readiness every HealthInterval until Shutdown.
func (s *Server) followReadiness() {
	defer s.wg.Done()
	tick := time.NewTicker(s.cfg.HealthInterval)
	defer tick.Stop()
	last := false
	for {
		ok := s.cfg.Ready == nil || s.cfg.Ready()
		if ok != last {
			s.setReady(ok)
			last = ok
		}
		select {
		case <-s.stop:
			return
		case <-tick.C:
		}
	}
}

// Serve serves ext_proc and health on ln until Shutdown.
func (s *Server) Serve(ln net.Listener) error { return serve(s.grpc, ln) }

// ServeHealth serves the health service alone, in plaintext, on ln until
// Shutdown.
func (s *Server) ServeHealth(ln net.Listener) error { return serve(s.healthOnly, ln) }

func serve(g *grpc.Server, ln net.Listener) error {
	err := g.Serve(ln)
	if errors.Is(err, grpc.ErrServerStopped) || errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}

// Shutdown reports not ready, stops accepting and waits until ctx ends for
// open streams to finish; then it cuts them. A stream is not cut sooner:
// once decided, its request is being served, and a gateway that loses the
// picker's stream mid-answer may fail the request. Safe to call more than
// once.
func (s *Server) Shutdown(ctx context.Context) error {
	s.stopOnce.Do(func() { close(s.stop) })
	s.wg.Wait()
	s.health.Shutdown()
	done := make(chan struct{})
	go func() {
		s.grpc.GracefulStop()
		s.healthOnly.GracefulStop()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		s.grpc.Stop()
		s.healthOnly.Stop()
		<-done
		return ctx.Err()
	}
}

// metrics are the server's series.
type metrics struct {
	streams   prometheus.Gauge
	immediate *prometheus.CounterVec
	picks     prometheus.Counter
	served    *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		streams: prometheus.NewGauge(prometheus.GaugeOpts{Name: "warmroute_extproc_streams",
			Help: "ext_proc streams open (one per request the gateway asks about)."}),
		immediate: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "warmroute_extproc_immediate_responses_total",
			Help: "Requests the picker answered itself instead of naming an endpoint, by HTTP status."}, []string{"status"}),
		picks: prometheus.NewCounter(prometheus.CounterOpts{Name: "warmroute_extproc_picks_total",
			Help: "Requests the picker named an endpoint for."}),
		served: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "warmroute_extproc_served_reports_total",
			Help: "Served-endpoint reports in response metadata, by outcome: primary, fallback (another listed endpoint, or one the router knows), unknown (not a backend of this router), missing (response headers without a report)."}, []string{"outcome"}),
	}
	if reg != nil {
		reg.MustRegister(m.streams, m.immediate, m.picks, m.served)
	}
	return m
}
