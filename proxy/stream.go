package proxy

import (
	"errors"
	"io"
	"time"

	"github.com/valyala/fasthttp"
)

// trackedStream passes an upstream body through to the client. It keeps
// the backend's in-flight count up until the stream ends, times the first
// body byte and, when the client went away (fasthttp closes the body
// stream with the write error), closes the upstream connection so the
// engine stops generating.
type trackedStream struct {
	p    *Proxy
	b    *backend
	up   *fasthttp.Response
	src  fasthttp.ReadCloserWithError
	sent time.Time
	// client holds the answer's headers until the first event, or nil.
	client *rawConn

	gotFirst bool
	readErr  bool // the upstream read failed (not EOF)
	closed   bool
}

func (s *trackedStream) Read(buf []byte) (int, error) {
	n, err := s.src.Read(buf)
	if n > 0 && !s.gotFirst {
		s.gotFirst = true
		s.b.m.ttfb.Observe(time.Since(s.sent).Seconds())
	}
	if err != nil && !errors.Is(err, io.EOF) {
		s.readErr = true
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
	fasthttp.ReleaseResponse(s.up)
	p := s.p
	*s = trackedStream{}
	p.streams.Put(s)
	return cerr
}
