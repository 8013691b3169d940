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
	// The settings an operator sets, one tagged type a section
	// (settings.go); their fields are promoted (c.MaxBodySize).
	Limits
	Upstream
	Health

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

// DefaultConfig returns the defaults docs/configuration.md lists.
func DefaultConfig() Config {
	return Config{
		Limits: Limits{
			MaxBodySize:    32 << 20,
			MaxBodyMemory:  128 << 20,
			BodyMemoryWait: time.Second,
			MaxHeaderSize:  16 << 10,
			ReadTimeout:    30 * time.Second,
			IdleTimeout:    120 * time.Second,
			WriteTimeout:   60 * time.Second,
			MaxConns:       16384,
		},
		Upstream: Upstream{
			ConnectTimeout:      2 * time.Second,
			FirstByteTimeout:    300 * time.Second,
			StreamIdleTimeout:   120 * time.Second,
			MaxConnsPerBackend:  1024,
			MaxConnWait:         2 * time.Second,
			IdleConnTimeout:     4 * time.Second,
			Retries:             2,
			MaxBufferedResponse: 8 << 20,
			MaxHops:             4,
			StreamRelay:         true,
		},
		Health: Health{
			ProbePath:          "/health",
			ProbeInterval:      1 * time.Second,
			ProbeTimeout:       500 * time.Millisecond,
			ProbeFailThreshold: 2,
			ProbeRiseThreshold: 1,
			EjectAfter:         3,
			EjectFor:           10 * time.Second,
		},
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
	// Halved rather than doubled: a size may be 2^62, which doubled
	// overflows int64 and passed with any budget.
	if c.MaxBodyMemory/2 < c.MaxBodySize {
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
