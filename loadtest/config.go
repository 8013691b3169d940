package loadtest

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"strings"
	"time"
)

// Mode is the arrival model.
type Mode string

// The arrival models.
const (
	OpenLoop   Mode = "open"   // Poisson arrivals at Rate
	ClosedLoop Mode = "closed" // Concurrency workers back to back
)

// Response headers the load test reads by default.
const (
	HeaderBackend        = "X-Warmroute-Backend"
	HeaderDecision       = "X-Warmroute-Decision"
	HeaderGpusimInstance = "X-Gpusim-Instance"
)

// Errors. Run wraps them with details.
var (
	ErrBadConfig   = errors.New("loadtest: invalid config")
	ErrUnreachable = errors.New("loadtest: target unreachable")
	ErrMetrics     = errors.New("loadtest: metrics unavailable")
	ErrNotLoopback = errors.New("loadtest: target is not on 127.0.0.0/8")
	ErrInterrupted = errors.New("loadtest: interrupted")
)

// Config describes one run. The workload is passed to Run separately.
type Config struct {
	// Label and Workload name the run in progress lines and the Summary
	// (e.g. the routing strategy and the workload kind).
	Label, Workload string
	// Targets are base URLs (http://host:port) of the endpoint; requests
	// go to them in turn, as an L4 load balancer in front of several
	// routers would spread them.
	Targets []string
	Mode    Mode
	// Rate is the open-loop arrival rate, requests per second.
	Rate float64
	// Concurrency is the closed-loop worker count.
	Concurrency int
	// MaxInFlight bounds open-loop requests in flight. When reached, the
	// generator waits; requests sent late are still timed from their
	// intended send time.
	MaxInFlight int
	// Duration stops sending after this long; Requests after this many
	// requests (0: no limit). At least one must be set.
	Duration time.Duration
	Requests int
	// Warmup is sent before the measured Duration: its requests are not
	// recorded and the hit rate counts from its end (steady state rather
	// than cold start). 0: measure from the first request.
	Warmup time.Duration
	// Timeout bounds one request, headers to last byte.
	Timeout time.Duration
	// Drain bounds the wait for requests in flight once sending stops;
	// those still running are cancelled and counted as "canceled".
	Drain time.Duration
	// Seed drives the arrival times (the workload has its own seed).
	Seed uint64

	// BackendHeader names the response header that identifies the backend
	// (default X-Warmroute-Backend); when a response lacks it,
	// X-Gpusim-Instance is used. DecisionHeader names the router decision.
	BackendHeader  string
	DecisionHeader string
	// Backends lists the backend ids traffic is expected to reach, for the
	// max/min share ratio (default: the host:port of each MetricsURL).
	Backends []string

	// MetricsURLs are the backends' Prometheus endpoints; their prefix-
	// cache counters give the KV hit rate. Empty: no hit rate.
	MetricsURLs []string
	// MetricsInterval is the period of the hit-rate-over-time samples.
	MetricsInterval time.Duration
	// RouterMetricsURLs are the warmroute routers' admin /metrics
	// endpoints; their cache prediction counters, read at the start and
	// the end of the measured window, give Summary.Predictions. Empty:
	// none.
	RouterMetricsURLs []string

	// Progress receives a status line every ProgressInterval once the run
	// is longer than that (nil: silent).
	Progress         io.Writer
	ProgressInterval time.Duration

	// AllowRemote permits targets outside 127.0.0.0/8.
	AllowRemote bool

	// Bounds sizes the offline hit-rate bounds computed from the requests
	// sent (Summary.Bounds).
	Bounds BoundsConfig
}

// BoundsConfig sizes the offline hit-rate bounds of a run (stats.Bounds):
// the blocks of every request sent are computed as gpusim would compute
// them (gpusim.PromptBlocks), and run through an infinite cache and through
// Instances LRU caches of KVBlocks blocks. Zero fields take gpusim's
// defaults.
type BoundsConfig struct {
	// Off turns the bounds off.
	Off bool
	// Instances is the number of finite caches (0: one per expected
	// backend: Backends, else MetricsURLs, else Targets).
	Instances int
	// KVBlocks is each cache's capacity in blocks (gpusim --kv-blocks;
	// 0: gpusim's default, 84,000).
	KVBlocks int
	// BlockSize and BytesPerToken are gpusim's --block-size and
	// --bytes-per-token (0: 16 and 4).
	BlockSize, BytesPerToken int
}

// Validate reports the first problem with c.
func (c BoundsConfig) Validate() error {
	switch {
	case c.Instances < 0 || c.Instances > 1024:
		return fmt.Errorf("%w: bound instances %d outside 0-1024", ErrBadConfig, c.Instances)
	case c.KVBlocks < 0 || c.KVBlocks > 1<<24:
		return fmt.Errorf("%w: bound KV blocks %d outside 0-%d", ErrBadConfig, c.KVBlocks, 1<<24)
	case c.BlockSize < 0 || c.BlockSize > 1<<16:
		return fmt.Errorf("%w: bound block size %d outside 0-65536", ErrBadConfig, c.BlockSize)
	case c.BytesPerToken < 0 || c.BytesPerToken > 64:
		return fmt.Errorf("%w: bound bytes per token %d outside 0-64", ErrBadConfig, c.BytesPerToken)
	}
	return nil
}

// DefaultConfig returns an open-loop run of 30 s at 10 requests/s against
// a router on localhost:8080.
func DefaultConfig() Config {
	return Config{
		Targets:          []string{"http://127.0.0.1:8080"},
		Mode:             OpenLoop,
		Rate:             10,
		Concurrency:      8,
		MaxInFlight:      512,
		Duration:         30 * time.Second,
		Timeout:          120 * time.Second,
		Drain:            30 * time.Second,
		Seed:             1,
		BackendHeader:    HeaderBackend,
		DecisionHeader:   HeaderDecision,
		MetricsInterval:  2 * time.Second,
		ProgressInterval: 5 * time.Second,
	}
}

// Validate reports the first problem with c.
func (c Config) Validate() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: %s", ErrBadConfig, fmt.Sprintf(format, a...))
	}
	if len(c.Targets) == 0 {
		return bad("no target")
	}
	for _, t := range c.Targets {
		if err := checkURL(t, c.AllowRemote); err != nil {
			return fmt.Errorf("target %q: %w", t, err)
		}
	}
	for _, m := range c.MetricsURLs {
		if err := checkURL(m, c.AllowRemote); err != nil {
			return fmt.Errorf("metrics URL %q: %w", m, err)
		}
	}
	for _, m := range c.RouterMetricsURLs {
		if err := checkURL(m, c.AllowRemote); err != nil {
			return fmt.Errorf("router metrics URL %q: %w", m, err)
		}
	}
	switch c.Mode {
	case OpenLoop:
		if !(c.Rate > 0) || c.Rate > 1e5 {
			return bad("rate %g outside (0, 100000]", c.Rate)
		}
		if c.MaxInFlight < 1 {
			return bad("max in flight %d < 1", c.MaxInFlight)
		}
	case ClosedLoop:
		if c.Concurrency < 1 || c.Concurrency > 100000 {
			return bad("concurrency %d outside 1-100000", c.Concurrency)
		}
	default:
		return bad("mode %q (want open or closed)", c.Mode)
	}
	if c.Duration <= 0 && c.Requests <= 0 {
		return bad("set a duration or a request count")
	}
	if c.Duration < 0 || c.Requests < 0 {
		return bad("negative duration or request count")
	}
	if c.Warmup < 0 {
		return bad("negative warm-up")
	}
	if c.Timeout <= 0 || c.Drain < 0 {
		return bad("timeout must be > 0 and drain >= 0")
	}
	if c.MetricsInterval <= 0 || c.ProgressInterval <= 0 {
		return bad("intervals must be > 0")
	}
	if c.BackendHeader == "" || c.DecisionHeader == "" {
		return bad("empty header name")
	}
	return c.Bounds.Validate()
}

// checkURL accepts http(s)://host:port[/] on loopback (unless remote is
// allowed).
func checkURL(s string, remote bool) error {
	u, err := url.Parse(s)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrBadConfig, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return fmt.Errorf("%w: scheme must be http or https", ErrBadConfig)
	}
	if u.Host == "" {
		return fmt.Errorf("%w: no host", ErrBadConfig)
	}
	if remote {
		return nil
	}
	host := u.Hostname()
	if host == "localhost" {
		return nil
	}
	ip := net.ParseIP(host)
	if ip == nil || !ip.IsLoopback() || ip.To4() == nil {
		return ErrNotLoopback
	}
	return nil
}

// hostPort returns the host:port of a URL, the id a router gives the
// backend at that address.
func hostPort(s string) string {
	u, err := url.Parse(s)
	if err != nil || u.Host == "" {
		return s
	}
	return u.Host
}

// trimBase removes a trailing slash from a base URL.
func trimBase(s string) string { return strings.TrimRight(s, "/") }
