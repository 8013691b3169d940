package admin

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/warmroute/warmroute/gossip"
	"github.com/warmroute/warmroute/internal/identity"
	"github.com/warmroute/warmroute/internal/limit"
	"github.com/warmroute/warmroute/node/cluster"
	"github.com/warmroute/warmroute/proxy"
	"github.com/warmroute/warmroute/ring"
)

// Agreement is the router's Raft member (*cluster.Agreement).
type Agreement interface {
	State() (cluster.State, uint64)
	Apply(ctx context.Context, cmd cluster.Command) (uint64, error)
	Leader() (id, raftAddr string)
	Status() cluster.Status
	Halted() error
}

// Router is the router's request path (*proxy.Proxy).
type Router interface {
	Ring() (*ring.Ring, uint64)
	Status() []proxy.BackendStatus
	Ready() bool
	// ExplainSession explains a request with tenant and session (the
	// values of the tenant and session headers; nil when absent).
	ExplainSession(api ring.API, body, tenant, session []byte) (ring.KeyInfo, ring.Explanation, error)
	// Splits are the prompt prefixes ADAPTIVE keys route past.
	Splits() []ring.Split
}

// Members is the router's view of the other routers (gossip).
type Members interface {
	Members() []gossip.Member
	// Failing names the routers that see backend failing.
	Failing(backend string) []string
}

// Engines is where the engines' figures are found: what this router
// scraped, or what gossip brought from the router that scraped them.
type Engines interface {
	// Engine returns the freshest figures for backend, if any.
	Engine(backend string) (gossip.EngineStats, bool)
}

var (
	_ Agreement = (*cluster.Agreement)(nil)
	_ Router    = (*proxy.Proxy)(nil)
)

// Config is what a Server needs.
type Config struct {
	// Name is this router's node name.
	Name string
	// Token is the bearer token ("" for none; see the package doc).
	Token string
	// PublicMetrics serves /metrics to other hosts without the token.
	PublicMetrics bool
	// Metrics is what /metrics serves.
	Metrics *prometheus.Registry

	Agreement Agreement
	Router    Router
	// Members is nil for a router running alone.
	Members Members
	// Engines, when not nil, adds the engines' figures to /status and
	// /v1/backends, and exports them as metrics in Metrics.
	Engines Engines
	// Identity is this router's cluster certificate, or nil: with one,
	// writes are forwarded over HTTPS to a server proving the leader's
	// name, and a forwarded write is accepted only from a router proving
	// the name it gives.
	Identity *identity.Bundle
	// ParseBackend checks a POST /v1/backends body and returns the
	// backend to add (the node's rules for ids and addresses).
	ParseBackend func(BackendRequest) (cluster.Backend, error)

	Logger *slog.Logger
}

// Server serves the admin API. Create it with New; it holds no
// goroutines of its own.
type Server struct {
	cfg    Config
	log    *slog.Logger
	scheme string       // of other routers' admin APIs: http, or https with an identity
	client *http.Client // forwards writes without an identity
}

// Limits and timings.
const (
	// headerForwarded marks an admin write one router forwarded to the
	// leader; the leader never forwards it again.
	headerForwarded = "X-Warmroute-Forwarded"
	// writeRetryFor bounds how long a write waits for a leader.
	writeRetryFor = 10 * time.Second
	// maxBody bounds admin request bodies; maxExplainBody what the route
	// explainer reads (a prompt).
	maxBody        = 1 << 20
	maxExplainBody = 64 << 20
)

// New returns a Server.
func New(cfg Config) *Server {
	s := &Server{cfg: cfg, log: cfg.Logger, scheme: "http", client: &http.Client{Timeout: writeRetryFor}}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if cfg.Identity != nil {
		s.scheme = "https"
	}
	if cfg.Metrics != nil && cfg.Engines != nil {
		if err := cfg.Metrics.Register(engineCollector{s}); err != nil {
			s.log.Error("engine figures: metrics not registered", "err", err)
		}
	}
	return s
}

// Handler returns the admin API's handler.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	metrics := promhttp.HandlerFor(s.cfg.Metrics, promhttp.HandlerOpts{Registry: s.cfg.Metrics})
	if s.cfg.PublicMetrics {
		mux.Handle("GET /metrics", metrics)
	} else {
		mux.Handle("GET /metrics", s.guarded(false, metrics.ServeHTTP))
	}
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok\n") })
	mux.HandleFunc("GET /status", s.guarded(false, s.handleStatus))
	mux.HandleFunc("POST /debug/route", s.guarded(false, s.handleExplain))
	mux.HandleFunc("POST /debug/route/{path...}", s.guarded(false, s.handleExplain))
	mux.HandleFunc("GET /v1/backends", s.guarded(false, s.handleListBackends))
	mux.HandleFunc("GET /v1/backends/{id}", s.guarded(false, s.handleGetBackend))
	mux.HandleFunc("POST /v1/backends", s.guarded(true, s.handleUpsertBackend))
	mux.HandleFunc("DELETE /v1/backends/{id}", s.guarded(true, s.handleRemoveBackend))
	mux.HandleFunc("POST /v1/backends/{id}/{action}", s.guarded(true, s.handleBackendState))
	mux.HandleFunc("GET /v1/config", s.guarded(false, s.handleGetConfig))
	mux.HandleFunc("PATCH /v1/config", s.guarded(true, s.handlePatchConfig))
	mux.HandleFunc("PUT /v1/config", s.guarded(true, s.handlePutConfig))
	mux.HandleFunc("GET /v1/cluster", s.guarded(false, s.handleCluster))
	mux.HandleFunc("GET /v1/revocations", s.guarded(false, s.handleRevocations))
	mux.HandleFunc("POST /v1/revocations", s.guarded(true, s.handleRevoke))
	mux.HandleFunc("DELETE /v1/revocations", s.guarded(true, s.handleRevoke))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeJSONError(w, http.StatusNotFound, "not_found", "unknown admin route "+r.Method+" "+r.URL.Path)
	})
	return mux
}

// authorize enforces the admin token (see the package doc). It answers
// the request and returns false when it is refused.
func (s *Server) authorize(w http.ResponseWriter, r *http.Request, write bool) bool {
	if r.Header.Get(headerForwarded) != "" {
		by, ok := s.forwardedBy(r)
		if !ok {
			writeJSONError(w, http.StatusForbidden, "forwarded_write_unproven",
				"a forwarded admin write must come from a router proving its name with its cluster certificate")
			return false
		}
		if write && s.cfg.Identity != nil && by != "" {
			promote(w, r, "router:"+by)
			return true
		}
	}
	loopback := isLoopbackRemote(r.RemoteAddr)
	if loopback {
		promote(w, r, "loopback")
	}
	if s.cfg.Token == "" {
		if write && !loopback {
			writeJSONError(w, http.StatusForbidden, "admin_token_required",
				"admin writes from other hosts need a token: start the routers with --admin-token-file or WARMROUTE_ADMIN_TOKEN")
			return false
		}
		return true
	}
	if !write && loopback {
		return true
	}
	got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || subtle.ConstantTimeCompare([]byte(strings.TrimSpace(got)), []byte(s.cfg.Token)) != 1 {
		w.Header().Set("WWW-Authenticate", `Bearer realm="warmroute-admin"`)
		writeJSONError(w, http.StatusUnauthorized, "unauthorized", "missing or wrong admin bearer token")
		return false
	}
	if host, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
		promote(w, r, "token:"+host)
	}
	return true
}

type connKey struct{}

// ConnContext is the admin http.Server's ConnContext: it keeps each
// request's connection, so that authorize can promote it (internal/limit)
// once a request proved who sent it: the token, loopback, or a router's
// certificate. A promoted connection leaves the pool that idle
// connections of neighbours without credentials contend for.
func ConnContext(ctx context.Context, c net.Conn) context.Context {
	return context.WithValue(ctx, connKey{}, c)
}

// promote moves r's connection to the listener's proven pool under key;
// when that pool is full the connection closes after this answer.
func promote(w http.ResponseWriter, r *http.Request, key string) {
	c, ok := r.Context().Value(connKey{}).(net.Conn)
	if ok && !limit.Promote(c, key) {
		w.Header().Set("Connection", "close")
	}
}

func isLoopbackRemote(remote string) bool {
	host, _, err := net.SplitHostPort(remote)
	if err != nil {
		return false
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// guarded wraps a handler with authorize.
func (s *Server) guarded(write bool, h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if s.authorize(w, r, write) {
			h(w, r)
		}
	}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

func writeJSONError(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(proxy.ErrorBody(status, code, msg))
}

func readBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, bool) {
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	if err != nil {
		writeJSONError(w, http.StatusRequestEntityTooLarge, "body_too_large", err.Error())
		return nil, false
	}
	return b, true
}
