package proxy

import (
	"time"

	"github.com/warmroute/warmroute/internal/bytesize"
)

// The proxy's settings come in three sections, each one tagged type:
// what clients may send (Limits), what the proxy does with backends
// (Upstream) and how it checks them (Health). Config embeds all three, and
// the node carries them whole, so each knob is declared once, here.
//
// The tags name a knob everywhere an operator meets it: yaml is its key in
// the config file (under the node's limits:, upstream: or health: block),
// flag the serve flag (and the WARMROUTE_ variable made from it), help the
// flag's help text. The serve flags, the variables, --help and the settings
// tables of docs/configuration.md are all made from these tags; a new
// setting is a field here, with its tags, its default in DefaultConfig, its
// check in Config.Validate, and its use.

// Limits bound what clients may send.
type Limits struct {
	// MaxBodySize bounds a request body; larger ones get 413.
	// Long-context prompts need more than fasthttp's 4 MiB default.
	MaxBodySize bytesize.Size `yaml:"max_body_size" flag:"max-body-size" help:"largest request body accepted (413 above)"`
	// MaxBodyMemory bounds the request bodies held in memory at once,
	// across all client connections (see body.go). Bodies over 1 MiB may
	// together take half of it.
	MaxBodyMemory bytesize.Size `yaml:"max_body_memory" flag:"max-body-memory" help:"request bodies held in memory at once, all connections together (at least twice max-body-size; bodies over 1MiB share half of it)"`
	// BodyMemoryWait is how long a request waits for room in
	// MaxBodyMemory before it is answered 503 body_memory_full.
	BodyMemoryWait time.Duration `yaml:"body_memory_wait" flag:"body-memory-wait" help:"how long a request body waits for room in max-body-memory before 503 body_memory_full"`
	// MaxHeaderSize bounds the request line and headers; larger ones get
	// 431.
	MaxHeaderSize bytesize.Size `yaml:"max_header_size" flag:"max-header-size" help:"largest request header block accepted (431 above)"`
	// ReadTimeout bounds reading one request (headers and body) from a
	// client, so a client trickling its headers is cut off.
	ReadTimeout time.Duration `yaml:"read_timeout" flag:"read-timeout" help:"time allowed to read a request's headers and body"`
	// IdleTimeout closes a client keep-alive connection idle this long.
	IdleTimeout time.Duration `yaml:"idle_timeout" flag:"idle-timeout" help:"close client keep-alive connections idle this long"`
	// WriteTimeout bounds how long one write to a client may make no
	// progress (its receive window stays full: it stopped reading). The
	// connection is then closed, and a stream's upstream with it, so the
	// engine stops generating for nobody. It bounds stalls, not
	// responses: a long SSE stream the client keeps reading is never cut,
	// however long it lasts.
	WriteTimeout time.Duration `yaml:"write_timeout" flag:"write-timeout" help:"cut a client whose socket accepts nothing for this long (it stopped reading); streams being read are never cut"`
	// MaxConns bounds concurrent client connections; the ones over it are
	// answered 503 too_many_connections and closed.
	MaxConns int `yaml:"max_conns" flag:"max-conns" help:"concurrent client connections"`
}

// Upstream bounds what the proxy does with backends.
type Upstream struct {
	// ConnectTimeout bounds dialling a backend.
	ConnectTimeout time.Duration `yaml:"connect_timeout" flag:"connect-timeout" help:"time allowed to connect to a backend"`
	// FirstByteTimeout bounds the wait for a backend's response after the
	// request was sent (queueing and prefill included): 504 when exceeded.
	FirstByteTimeout time.Duration `yaml:"first_byte_timeout" flag:"first-byte-timeout" help:"time allowed for a backend to start answering (504 after)"`
	// StreamIdleTimeout bounds the gap between two reads of a streamed
	// response; a stalled stream is cut.
	StreamIdleTimeout time.Duration `yaml:"stream_idle_timeout" flag:"stream-idle-timeout" help:"longest gap allowed between chunks of a streamed response"`
	// MaxConnsPerBackend bounds upstream connections per backend (HTTP/1.1:
	// one per in-flight request).
	MaxConnsPerBackend int `yaml:"max_conns_per_backend" flag:"max-conns-per-backend" help:"upstream connections per backend"`
	// MaxConnWait is how long a request waits for a free upstream
	// connection before trying another backend.
	MaxConnWait time.Duration `yaml:"max_conn_wait" flag:"max-conn-wait" help:"wait for a free upstream connection before trying another backend"`
	// IdleConnTimeout closes idle upstream keep-alive connections. Keep it
	// below the engines' keep-alive timeout (uvicorn, under vLLM and
	// SGLang, closes after 5 s) so a request is never written to a
	// connection the backend is closing.
	IdleConnTimeout time.Duration `yaml:"idle_conn_timeout" flag:"upstream-idle-conn-timeout" help:"close idle upstream connections after this (keep below the engine's keep-alive, 5s for vLLM)"`
	// Retries is how many other backends a request may try when it never
	// reached one.
	Retries int `yaml:"retries" flag:"retries" help:"other backends to try when a request could not reach one"`
	// MaxBufferedResponse bounds the body of a response that is not
	// streamed (a complete, non-SSE answer), which is read whole before it
	// is sent: a larger one (by its Content-Length, or once that much of a
	// chunked or unframed body arrived) is refused with 502
	// upstream_response_too_large and its connection closed. Streamed
	// answers (SSE, /invocations) are passed through and not bounded.
	MaxBufferedResponse bytesize.Size `yaml:"max_buffered_response" flag:"max-buffered-response" help:"largest complete (not streamed) backend answer the router reads; larger ones get 502 upstream_response_too_large (streamed answers are not bounded)"`
	// MaxHops bounds the warmroute routers a request may have passed
	// through before this one, as counted by the X-Warmroute-Hops field
	// every router sets on the requests it forwards: a request that passed
	// more is answered 508 loop_detected (a backend address that leads back
	// to a router).
	MaxHops int `yaml:"max_hops" flag:"max-hops" help:"warmroute routers a request may already have passed (X-Warmroute-Hops) before this router answers 508 loop_detected (1-64)"`
	// StreamRelay passes streamed answers between plain-TCP clients and
	// plain-HTTP backends on event loops (Linux), instead of a goroutine
	// and its buffers per stream; see relay.go.
	StreamRelay bool `yaml:"stream_relay" flag:"stream-relay" help:"pass streamed answers on event loops instead of a goroutine and buffers each (Linux; plain TCP to the client and the backend; other streams always take the goroutine path)"`
}

// Health configures active and passive health checking.
type Health struct {
	// ProbePath is requested by the active health check ("" disables it).
	ProbePath string `yaml:"probe_path" flag:"probe-path" help:"health-check path on backends (empty disables active checks)"`
	// ProbeInterval and ProbeTimeout time the active health check.
	ProbeInterval time.Duration `yaml:"probe_interval" flag:"probe-interval" help:"active health-check interval"`
	ProbeTimeout  time.Duration `yaml:"probe_timeout" flag:"probe-timeout" help:"active health-check timeout"`
	// ProbeFailThreshold consecutive probe failures mark a backend
	// unhealthy; ProbeRiseThreshold consecutive successes mark it healthy.
	ProbeFailThreshold int `yaml:"fail_threshold" flag:"probe-fail-threshold" help:"consecutive failed checks that mark a backend down"`
	ProbeRiseThreshold int `yaml:"rise_threshold" flag:"probe-rise-threshold" help:"consecutive passed checks that mark it up again"`
	// EjectAfter consecutive connect failures on the request path eject a
	// backend for EjectFor.
	EjectAfter int           `yaml:"eject_after" flag:"eject-after" help:"consecutive connect failures that eject a backend (0 = never)"`
	EjectFor   time.Duration `yaml:"eject_for" flag:"eject-for" help:"how long an ejected backend is skipped"`
}
