package proxy

import (
	"errors"
	"io"
	"time"

	"github.com/valyala/fasthttp"
)

// trackedStream passes an upstream body through to the client. It keeps
// the backend's in-flight count up until the stream ends, times the first
// body byte, reads the usage the backend reports (counted when the stream
// ends) and, when the client went away (fasthttp closes the body stream
// with the write error), closes the upstream connection so the engine
// stops generating.
type trackedStream struct {
	p    *Proxy
	b    *backend
	up   *fasthttp.Response
	src  fasthttp.ReadCloserWithError
	sent time.Time
	// client holds the answer's headers until the first event, or nil.
	client *rawConn

	// sse: an SSE answer without a Content-Length, so an error event can
	// be appended when the upstream fails.
	sse bool
	// tail holds the last two bytes passed on, to tell whether the stream
	// stands between two events.
	tail [2]byte
	// pending is what is left of the error event to pass on.
	pending []byte
	// usage reads the usage the backend reports as the body passes;
	// pred is what the router predicted of it (predict.go).
	usage usageScan
	pred  prediction

	gotFirst bool
	readErr  bool // the upstream read failed (not EOF)
	closed   bool
}

var (
	strEventStream = []byte("text/event-stream")

	// sseUpstreamError ends an SSE stream the upstream broke off (it
	// failed, or stayed silent past StreamIdleTimeout) in the OpenAI and
	// vLLM manner: an error event, then a clean end of the body, so
	// clients raise an error that says what happened instead of a
	// transport error. There is no "data: [DONE]": the answer is
	// incomplete.
	sseUpstreamError = []byte(`data: {"error":{"message":"the inference backend stopped sending this stream before it ended","type":"server_error","param":null,"code":"upstream_stream_failed"}}` + "\n\n")
)

func (s *trackedStream) Read(buf []byte) (int, error) {
	if s.pending != nil {
		n := copy(buf, s.pending)
		if s.pending = s.pending[n:]; len(s.pending) == 0 {
			return n, io.EOF
		}
		return n, nil
	}
	n, err := s.src.Read(buf)
	if n > 0 {
		if !s.gotFirst {
			s.gotFirst = true
			s.b.m.ttfb.Observe(time.Since(s.sent).Seconds())
		}
		if n >= 2 {
			s.tail = [2]byte{buf[n-2], buf[n-1]}
		} else {
			s.tail = [2]byte{s.tail[1], buf[0]}
		}
		s.usage.feed(buf[:n])
	}
	if err != nil && !errors.Is(err, io.EOF) {
		s.readErr = true
		// Between events (or before the first), an error event can be
		// added without corrupting one; inside an event the connection
		// is cut as before.
		if s.sse && (!s.gotFirst || s.tail == [2]byte{'\n', '\n'}) {
			s.pending = sseUpstreamError
			return n, nil
		}
	}
	return n, err
}

// CloseWithError is called once by fasthttp when the response is done:
// err is nil after a complete write, or the error that stopped it.
func (s *trackedStream) CloseWithError(err error) error {
	if s.closed {
		return nil
	}
	s.closed = true
	s.client.releaseHold()
	cerr := s.src.CloseWithError(err)
	switch {
	case s.readErr:
		s.b.m.upErrors["other"].Inc()
	case err != nil:
		s.b.m.aborts.Inc()
	}
	s.b.inflight.Add(-1)
	// What the backend reported counts even when the client left: the
	// prompt was computed.
	s.b.countUsage(s.pred, s.usage.report())
	fasthttp.ReleaseResponse(s.up)
	p := s.p
	*s = trackedStream{}
	p.streams.Put(s)
	return cerr
}
