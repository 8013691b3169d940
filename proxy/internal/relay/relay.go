package relay

import (
	"errors"
	"time"
)

// Config is a relay's configuration.
type Config struct {
	// Loops is the number of event loops (each one goroutine, parked in
	// the runtime poller while nothing happens); 0 means GOMAXPROCS, at
	// most 8.
	Loops int
	// UpstreamIdle ends a stream whose upstream sent nothing for this
	// long, as failed; 0: no bound.
	UpstreamIdle time.Duration
	// WriteStall ends a stream whose client took no byte for this long
	// while bytes waited for it; 0: no bound.
	WriteStall time.Duration
	// ErrorEvent is the SSE event (without chunk framing) sent when an
	// SSE upstream fails between two events, before the body's end.
	ErrorEvent []byte
}

// Spec is a stream to relay.
type Spec struct {
	// Up and Client are the upstream's and the client's descriptors
	// (non-blocking sockets, see Detach). The relay owns them from Start
	// on.
	Up, Client int
	// Head is written to the client first: the answer's headers. Not
	// copied: it must stay unchanged until Obs.End.
	Head []byte
	// In is what was already read from the upstream after its headers:
	// the start of the chunked body. Copied.
	In []byte
	// SSE: the body is an event stream, which may be ended with
	// Config.ErrorEvent when the upstream fails between two events.
	SSE bool
	// KeepUp: the upstream connection may carry another request after
	// this answer (HTTP/1.1, no Connection: close), so when the body
	// ends cleanly its descriptor is given back (Result.Up) instead of
	// closed.
	KeepUp bool
	// Identity: the client speaks HTTP/1.0, which has no chunked framing
	// (RFC 9112 section 6.1): the body goes to it as it is, and the end of
	// the body is marked by closing the connection, which the caller does
	// (Result.Client is the client's descriptor as usual).
	Identity bool
	// Obs hears the body and the end.
	Obs Observer
}

// Observer hears a relayed stream. Its methods run on the stream's loop
// and must not block.
type Observer interface {
	// Data is called with body bytes (the chunk framing removed) as they
	// pass to the client. p is only valid during the call.
	Data(p []byte)
	// End is called once, when the stream is over.
	End(r Result)
}

// Outcome is how a stream ended.
type Outcome uint8

const (
	// Complete: the whole body went to the client.
	Complete Outcome = iota
	// UpstreamFailed: the upstream closed before the body's end, broke
	// the framing, failed, or stayed silent past UpstreamIdle.
	UpstreamFailed
	// ClientGone: the client closed its connection, failed, or took no
	// byte for WriteStall.
	ClientGone
	// Stopped: the relay was closed.
	Stopped
)

var outcomeNames = [...]string{"complete", "upstream_failed", "client_gone", "stopped"}

func (o Outcome) String() string {
	if int(o) < len(outcomeNames) {
		return outcomeNames[o]
	}
	return "unknown"
}

// Result is a stream's end.
type Result struct {
	Outcome Outcome
	// Client is the client's descriptor when the answer went out as a
	// whole HTTP message (Complete, or UpstreamFailed ended by the error
	// event): the caller owns it and may serve its next request. -1 when
	// the relay closed it.
	Client int
	// Up is the upstream's descriptor when Spec.KeepUp was set and the
	// stream is Complete with the upstream's body read exactly to its end
	// (the last chunk and the trailers, no byte after them): the caller
	// owns it and may send its next request on it. -1 when the relay
	// closed it.
	Up int
	// TimedOut: UpstreamFailed because the upstream stayed silent past
	// UpstreamIdle.
	TimedOut bool
	// Err is the error that ended the stream, if any.
	Err error
}

// Errors.
var (
	ErrClosed      = errors.New("relay: closed")
	ErrUnsupported = errors.New("relay: not supported on this platform")
	errIdle        = errors.New("relay: upstream silent too long")
	errStall       = errors.New("relay: client took no byte too long")
	errUpstreamEOF = errors.New("relay: upstream closed before the end of the body")
	errClientHup   = errors.New("relay: client closed the connection")
)

func (c *Config) loops(procs int) int {
	switch {
	case c.Loops > 0:
		return c.Loops
	case procs > 8:
		return 8
	case procs < 1:
		return 1
	}
	return procs
}
