package proxy

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/warmroute/warmroute/proxy/reqlog"
	"go.opentelemetry.io/otel/trace"
)

// Config is the proxy's configuration. Start from DefaultConfig.
type Config struct {
	// MaxBodySize bounds a request body; larger ones get 413.
	// Long-context prompts need more than fasthttp's 4 MiB default.
	MaxBodySize int
	// MaxBodyMemory bounds the request bodies held in memory at once,
	// across all client connections (see body.go). Bodies over 1 MiB may
	// together take half of it.
	MaxBodyMemory int64
	// BodyMemoryWait is how long a request waits for room in
	// MaxBodyMemory before it is answered 503 body_memory_full.
	BodyMemoryWait time.Duration
	// MaxHeaderSize bounds the request line and headers; larger ones get
	// 431.
	MaxHeaderSize int
	// ReadTimeout bounds reading one request (headers and body) from a
	// client, so a client trickling its headers is cut off.
	ReadTimeout time.Duration
	// IdleTimeout closes a client keep-alive connection idle this long.
	IdleTimeout time.Duration
	// MaxConns bounds concurrent client connections; the ones over it are
	// answered 503 too_many_connections and closed.
	MaxConns int
	// WriteTimeout bounds how long one write to a client may make no
	// progress (its receive window stays full: it stopped reading). The
	// connection is then closed, and a stream's upstream with it, so the
	// engine stops generating for nobody. It bounds stalls, not
	// responses: a long SSE stream the client keeps reading is never cut,
	// however long it lasts.
	WriteTimeout time.Duration

	// ConnectTimeout bounds dialling a backend.
	ConnectTimeout time.Duration
	// FirstByteTimeout bounds the wait for a backend's response after the
	// request was sent (queueing and prefill included): 504 when exceeded.
	FirstByteTimeout time.Duration
	// StreamIdleTimeout bounds the gap between two reads of a streamed
	// response; a stalled stream is cut.
	StreamIdleTimeout time.Duration
	// MaxConnsPerBackend bounds upstream connections per backend (HTTP/1.1:
	// one per in-flight request).
	MaxConnsPerBackend int
	// MaxConnWait is how long a request waits for a free upstream
	// connection before trying another backend.
	MaxConnWait time.Duration
	// IdleConnTimeout closes idle upstream keep-alive connections. Keep it
	// below the engines' keep-alive timeout (uvicorn, under vLLM and
	// SGLang, closes after 5 s) so a request is never written to a
	// connection the backend is closing.
	IdleConnTimeout time.Duration
	// Retries is how many other backends a request may try when it never
	// reached one.
	Retries int
	// MaxBufferedResponse bounds the body of a response that is not
	// streamed (a complete, non-SSE answer), which is read whole before it
	// is sent: a larger one (by its Content-Length, or once that much of a
	// chunked or unframed body arrived) is refused with 502
	// upstream_response_too_large and its connection closed. Streamed
	// answers (SSE, /invocations) are passed through and not bounded.
	MaxBufferedResponse int
	// StreamRelay passes streamed answers between plain-TCP clients and
	// plain-HTTP backends on event loops (Linux), instead of a goroutine
	// and its buffers per stream; see relay.go.
	StreamRelay bool
	// MaxHops bounds the warmroute routers a request may have passed
	// through before this one, as counted by the X-Warmroute-Hops field
	// every router sets on the requests it forwards: a request that passed
	// more is answered 508 loop_detected (a backend address that leads back
	// to a router).
	MaxHops int

	// ProbePath is requested by the active health check ("" disables it).
	ProbePath string
	// ProbeInterval and ProbeTimeout time the active health check.
	ProbeInterval, ProbeTimeout time.Duration
	// ProbeFailThreshold consecutive probe failures mark a backend
	// unhealthy; ProbeRiseThreshold consecutive successes mark it healthy.
	ProbeFailThreshold, ProbeRiseThreshold int
	// EjectAfter consecutive connect failures on the request path eject a
	// backend for EjectFor.
	EjectAfter int
	EjectFor   time.Duration

	// OnProbe, when set, hears every active health-check result (the node
	// reports them to the Raft leader, which commits down and up). It is
	// called from the prober's goroutines and must not block.
	OnProbe func(backend string, ok bool)

	// Requests, when set, gets a record of every request (access log
	// lines, trace recording); the caller starts and closes it. Nil: none.
	Requests *reqlog.Log
	// Tracer, when set, traces each routed request: a span for the
	// routing decision and one for each upstream exchange, children of the
	// client's W3C traceparent, whose context goes upstream in its place.
	// Nil: no tracing, and a client's traceparent passes through as it
	// came.
	Tracer trace.Tracer

	// Logger receives operational logs. Prompt text is never logged.
	Logger *slog.Logger
	// Registry receives the proxy's metrics; nil means none.
	Registry prometheus.Registerer
}

// DefaultConfig returns the defaults documented in the README.
func DefaultConfig() Config {
	return Config{
		MaxBodySize:    32 << 20,
		MaxBodyMemory:  128 << 20,
		BodyMemoryWait: time.Second,
		MaxHeaderSize:  16 << 10,
		ReadTimeout:    30 * time.Second,
		IdleTimeout:    120 * time.Second,
		MaxConns:       16384,
		WriteTimeout:   60 * time.Second,

		ConnectTimeout:     2 * time.Second,
		FirstByteTimeout:   300 * time.Second,
		StreamIdleTimeout:  120 * time.Second,
		MaxConnsPerBackend: 1024,
		MaxConnWait:        2 * time.Second,
		IdleConnTimeout:    4 * time.Second,
		Retries:            2,

		MaxBufferedResponse: 8 << 20,
		StreamRelay:         true,
		MaxHops:             4,

		ProbePath:          "/health",
		ProbeInterval:      1 * time.Second,
		ProbeTimeout:       500 * time.Millisecond,
		ProbeFailThreshold: 2,
		ProbeRiseThreshold: 1,
		EjectAfter:         3,
		EjectFor:           10 * time.Second,
	}
}

// Validate reports every unusable setting, joined into one error
// (errors.Join), or nil.
func (c *Config) Validate() error {
	var errs []error
	pos := func(name string, d time.Duration) {
		if d <= 0 {
			errs = append(errs, fmt.Errorf("%s must be positive, got %s", name, d))
		}
	}
	if c.MaxBodySize < 1<<10 {
		errs = append(errs, fmt.Errorf("max request body size must be at least 1KiB, got %d", c.MaxBodySize))
	}
	if c.MaxBodyMemory < 2*int64(c.MaxBodySize) {
		errs = append(errs, fmt.Errorf("max body memory must be at least twice the max request body size (%d bytes; bodies over 1 MiB share half of it), got %d", c.MaxBodySize, c.MaxBodyMemory))
	}
	if c.BodyMemoryWait < 0 {
		errs = append(errs, fmt.Errorf("body memory wait must not be negative, got %s", c.BodyMemoryWait))
	}
	if c.MaxHeaderSize < 4<<10 {
		errs = append(errs, fmt.Errorf("max header bytes must be at least 4KiB, got %d", c.MaxHeaderSize))
	}
	if c.MaxConns < 1 {
		errs = append(errs, fmt.Errorf("max connections must be positive, got %d", c.MaxConns))
	}
	if c.MaxConnsPerBackend < 1 {
		errs = append(errs, fmt.Errorf("max connections per backend must be positive, got %d", c.MaxConnsPerBackend))
	}
	if c.MaxBufferedResponse < 64<<10 {
		errs = append(errs, fmt.Errorf("max buffered response must be at least 64KiB, got %d", c.MaxBufferedResponse))
	}
	if c.MaxHops < 1 || c.MaxHops > maxHopsLimit {
		errs = append(errs, fmt.Errorf("max hops must be within [1, %d], got %d", maxHopsLimit, c.MaxHops))
	}
	if c.Retries < 0 || c.Retries > 10 {
		errs = append(errs, fmt.Errorf("retries must be within [0, 10], got %d", c.Retries))
	}
	pos("read timeout", c.ReadTimeout)
	pos("idle timeout", c.IdleTimeout)
	pos("write timeout", c.WriteTimeout)
	pos("connect timeout", c.ConnectTimeout)
	pos("first byte timeout", c.FirstByteTimeout)
	pos("stream idle timeout", c.StreamIdleTimeout)
	pos("upstream idle connection timeout", c.IdleConnTimeout)
	if c.MaxConnWait < 0 {
		errs = append(errs, fmt.Errorf("max connection wait must not be negative, got %s", c.MaxConnWait))
	}
	if c.ProbePath != "" {
		if c.ProbePath[0] != '/' {
			errs = append(errs, fmt.Errorf("probe path must start with '/', got %q", c.ProbePath))
		}
		pos("probe interval", c.ProbeInterval)
		pos("probe timeout", c.ProbeTimeout)
		if c.ProbeFailThreshold < 1 || c.ProbeRiseThreshold < 1 {
			errs = append(errs, fmt.Errorf("probe thresholds must be at least 1"))
		}
	}
	if c.EjectAfter < 0 {
		errs = append(errs, fmt.Errorf("eject-after must not be negative, got %d", c.EjectAfter))
	}
	if c.EjectAfter > 0 {
		pos("eject duration", c.EjectFor)
	}
	return errors.Join(errs...)
}
