package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/warmroute/warmroute/proxy"
	"github.com/warmroute/warmroute/ring"
)

// Node is one router: proxy plus admin listener.
type Node struct {
	cfg   Config
	log   *slog.Logger
	reg   *prometheus.Registry
	proxy *proxy.Proxy
	name  string

	trafficLn net.Listener
	adminLn   net.Listener
	admin     *http.Server

	// ringMu serialises ring rebuilds.
	ringMu sync.Mutex
}

// New validates cfg, builds the first ring and binds both listeners, so
// Addr methods work before Run (port 0 picks a free port).
func New(cfg Config, log *slog.Logger) (*Node, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	n := &Node{cfg: cfg, log: log, reg: prometheus.NewRegistry()}
	n.name, _ = os.Hostname()
	n.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	pc := cfg.ProxyConfig()
	pc.Logger = log.With("component", "proxy")
	pc.Registry = n.reg
	p, err := proxy.New(pc)
	if err != nil {
		return nil, err
	}
	n.proxy = p
	backends, err := cfg.RingBackends()
	if err != nil {
		return nil, err
	}
	if err := n.installRing(cfg.RingConfig(), backends, 1); err != nil {
		return nil, err
	}

	if n.trafficLn, err = net.Listen("tcp", cfg.Listen); err != nil {
		return nil, fmt.Errorf("listen %s: %w", cfg.Listen, err)
	}
	if n.adminLn, err = net.Listen("tcp", cfg.AdminListen); err != nil {
		n.trafficLn.Close()
		return nil, fmt.Errorf("admin listen %s: %w", cfg.AdminListen, err)
	}
	n.admin = &http.Server{
		Handler:           n.adminHandler(),
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelDebug),
	}
	return n, nil
}

// installRing builds a ring and hands it to the proxy.
func (n *Node) installRing(rc ring.Config, backends []ring.Backend, epoch uint64) error {
	n.ringMu.Lock()
	defer n.ringMu.Unlock()
	r, err := ring.New(rc, backends)
	if err != nil {
		return err
	}
	return n.proxy.SetRing(r, epoch)
}

// TrafficAddr is the bound client-facing address.
func (n *Node) TrafficAddr() net.Addr { return n.trafficLn.Addr() }

// AdminAddr is the bound admin address.
func (n *Node) AdminAddr() net.Addr { return n.adminLn.Addr() }

// Proxy exposes the node's proxy (tests, embedding).
func (n *Node) Proxy() *proxy.Proxy { return n.proxy }

// Run serves until ctx is cancelled, then stops accepting, lets open streams
// finish for up to ShutdownTimeout and returns. Components stop in the
// reverse of the order they started.
func (n *Node) Run(ctx context.Context) error {
	errc := make(chan error, 2)
	go func() { errc <- n.proxy.Serve(n.trafficLn) }()
	go func() {
		if err := n.admin.Serve(n.adminLn); err != nil && !errors.Is(err, http.ErrServerClosed) {
			errc <- fmt.Errorf("admin listener: %w", err)
			return
		}
		errc <- nil
	}()
	n.log.Info("router serving", "listen", n.TrafficAddr().String(), "admin", n.AdminAddr().String(),
		"strategy", n.cfg.Routing.Strategy.String(), "backends", len(n.cfg.Backends))

	var runErr error
	select {
	case <-ctx.Done():
	case runErr = <-errc:
	}
	n.log.Info("shutting down", "drain", n.cfg.ShutdownTimeout)
	sctx, cancel := context.WithTimeout(context.Background(), n.cfg.ShutdownTimeout)
	defer cancel()
	if err := n.proxy.Shutdown(sctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		runErr = errors.Join(runErr, err)
	}
	if err := n.admin.Shutdown(sctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		runErr = errors.Join(runErr, err)
	}
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
