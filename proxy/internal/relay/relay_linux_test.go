//go:build linux

package relay

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// pair returns a loopback TCP connection's two ends: one for the test, the
// other's descriptor for the relay.
func pair(t *testing.T) (net.Conn, int) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	s, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	fd, err := Detach(s)
	s.Close()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, fd
}

// recorder is an Observer that keeps what it heard.
type recorder struct {
	mu   sync.Mutex
	body []byte
	end  chan Result
}

func newRecorder() *recorder { return &recorder{end: make(chan Result, 1)} }

func (r *recorder) Data(p []byte) {
	r.mu.Lock()
	r.body = append(r.body, p...)
	r.mu.Unlock()
}

func (r *recorder) End(res Result) { r.end <- res }

func (r *recorder) wait(t *testing.T) Result {
	t.Helper()
	select {
	case res := <-r.end:
		return res
	case <-time.After(10 * time.Second):
		t.Fatal("the stream did not end")
	}
	return Result{}
}

// readBody reads a chunked body from br (after head), returning the
// decoded body and whether it ended cleanly.
func readBody(t *testing.T, br *bufio.Reader) ([]byte, error) {
	t.Helper()
	var d Decoder
	var out []byte
	buf := make([]byte, 4096)
	for !d.Done() {
		n, err := br.Read(buf)
		var ferr error
		out, _, ferr = d.Feed(out, buf[:n])
		if ferr != nil {
			return out, ferr
		}
		if err != nil && !d.Done() {
			return out, err
		}
	}
	return out, nil
}

var testErrorEvent = []byte("data: {\"error\":\"upstream\"}\n\n")

func newTestRelay(t *testing.T, cfg Config) *Relay {
	if cfg.ErrorEvent == nil {
		cfg.ErrorEvent = testErrorEvent
	}
	r := New(cfg)
	t.Cleanup(r.Close)
	return r
}

func TestRelayPassesAStream(t *testing.T) {
	r := newTestRelay(t, Config{Loops: 2})
	up, upFD := pair(t)
	cl, clFD := pair(t)
	rec := newRecorder()
	head := "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
	events := []string{"data: one\n\n", "data: two\n\n", "data: three\n\n", "data: [DONE]\n\n"}
	first := encode([]byte(events[0]), nil, nil)
	first = first[:len(first)-len("0\r\n\r\n")]
	if err := r.Start(Spec{Up: upFD, Client: clFD, Head: []byte(head), In: first, SSE: true, Obs: rec}); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(cl)
	got := make([]byte, len(head))
	if _, err := io.ReadFull(br, got); err != nil || string(got) != head {
		t.Fatalf("head %q, %v", got, err)
	}
	go func() {
		for i, ev := range events[1:] {
			time.Sleep(5 * time.Millisecond)
			b := appendChunk(nil, []byte(ev))
			if i == len(events)-2 {
				b = append(b, "0\r\nTrailer: x\r\n\r\n"...)
			}
			up.Write(b)
		}
	}()
	body, err := readBody(t, br)
	if err != nil || string(body) != strings.Join(events, "") {
		t.Fatalf("body %q, %v", body, err)
	}
	res := rec.wait(t)
	if res.Outcome != Complete || res.Client < 0 {
		t.Fatalf("result %+v", res)
	}
	if string(rec.body) != strings.Join(events, "") {
		t.Fatalf("observer heard %q", rec.body)
	}
	// The client connection is the caller's again, and works.
	// It keeps the addresses it is given, and is still non-blocking
	// (Detach does not set O_NONBLOCK on its duplicate: it is shared).
	if fl, err := unix.FcntlInt(uintptr(res.Client), unix.F_GETFL, 0); err != nil || fl&unix.O_NONBLOCK == 0 {
		t.Fatalf("given-back descriptor flags %#x, %v: want O_NONBLOCK", fl, err)
	}
	c := ResumeClient(res.Client, cl.RemoteAddr(), cl.LocalAddr())
	defer c.Close()
	if c.RemoteAddr() != cl.LocalAddr() || c.LocalAddr() != cl.RemoteAddr() {
		t.Fatalf("addresses %v %v, want %v %v", c.LocalAddr(), c.RemoteAddr(), cl.RemoteAddr(), cl.LocalAddr())
	}
	buf := make([]byte, 4)
	cl.Write([]byte("ping"))
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "ping" {
		t.Fatalf("given-back connection read %q, %v", buf, err)
	}
	// Its write side shuts: the peer reads EOF, and may still write.
	if err := c.(interface{ CloseWrite() error }).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	cl.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := cl.Read(buf); n != 0 || err != io.EOF {
		t.Fatalf("peer read after CloseWrite: %d, %v; want EOF", n, err)
	}
	cl.Write([]byte("pong"))
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "pong" {
		t.Fatalf("read after CloseWrite %q, %v", buf, err)
	}
	// The upstream connection was closed.
	up.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := up.Read(buf); n != 0 || err == nil {
		t.Fatalf("upstream still open: %d, %v", n, err)
	}
	if r.Active() != 0 {
		t.Fatalf("active %d", r.Active())
	}
}

func TestRelayUpstreamFailsBetweenEvents(t *testing.T) {
	r := newTestRelay(t, Config{Loops: 1})
	up, upFD := pair(t)
	cl, clFD := pair(t)
	rec := newRecorder()
	r.Start(Spec{Up: upFD, Client: clFD, SSE: true, Obs: rec})
	up.Write(appendChunk(nil, []byte("data: a\n\n")))
	time.Sleep(10 * time.Millisecond)
	up.Close()
	body, err := readBody(t, bufio.NewReader(cl))
	if err != nil || string(body) != "data: a\n\n"+string(testErrorEvent) {
		t.Fatalf("body %q, %v", body, err)
	}
	res := rec.wait(t)
	if res.Outcome != UpstreamFailed || res.Client < 0 || res.TimedOut {
		t.Fatalf("result %+v", res)
	}
	CloseFD(res.Client)
}

func TestRelayUpstreamFailsInsideAnEvent(t *testing.T) {
	r := newTestRelay(t, Config{Loops: 1})
	up, upFD := pair(t)
	cl, clFD := pair(t)
	rec := newRecorder()
	r.Start(Spec{Up: upFD, Client: clFD, SSE: true, Obs: rec})
	up.Write(appendChunk(nil, []byte("data: a\n\ndata: b")))
	time.Sleep(10 * time.Millisecond)
	up.Close()
	body, err := readBody(t, bufio.NewReader(cl))
	if err == nil || string(body) != "data: a\n\ndata: b" {
		t.Fatalf("body %q, %v: want the connection cut after the partial event", body, err)
	}
	if res := rec.wait(t); res.Outcome != UpstreamFailed || res.Client != -1 {
		t.Fatalf("result %+v", res)
	}
}

func TestRelayBadFraming(t *testing.T) {
	r := newTestRelay(t, Config{Loops: 1})
	up, upFD := pair(t)
	cl, clFD := pair(t)
	rec := newRecorder()
	r.Start(Spec{Up: upFD, Client: clFD, SSE: false, Obs: rec})
	up.Write([]byte("zz\r\n"))
	if _, err := readBody(t, bufio.NewReader(cl)); err == nil {
		t.Fatal("want the client connection cut")
	}
	if res := rec.wait(t); res.Outcome != UpstreamFailed || !errors.Is(res.Err, ErrChunkSize) {
		t.Fatalf("result %+v", res)
	}
}

func TestRelayUpstreamIdle(t *testing.T) {
	r := newTestRelay(t, Config{Loops: 1, UpstreamIdle: 300 * time.Millisecond})
	_, upFD := pair(t)
	cl, clFD := pair(t)
	rec := newRecorder()
	r.Start(Spec{Up: upFD, Client: clFD, SSE: true, Obs: rec})
	start := time.Now()
	body, err := readBody(t, bufio.NewReader(cl))
	if err != nil || string(body) != string(testErrorEvent) {
		t.Fatalf("body %q, %v", body, err)
	}
	res := rec.wait(t)
	if res.Outcome != UpstreamFailed || !res.TimedOut {
		t.Fatalf("result %+v", res)
	}
	if d := time.Since(start); d < 300*time.Millisecond {
		t.Fatalf("ended after %v, before the idle bound", d)
	}
	CloseFD(res.Client)
}

func TestRelayClientGoneClosesUpstream(t *testing.T) {
	r := newTestRelay(t, Config{Loops: 1})
	up, upFD := pair(t)
	cl, clFD := pair(t)
	rec := newRecorder()
	r.Start(Spec{Up: upFD, Client: clFD, SSE: true, Obs: rec})
	up.Write(appendChunk(nil, []byte("data: a\n\n")))
	cl.Close()
	if res := rec.wait(t); res.Outcome != ClientGone || res.Client != -1 {
		t.Fatalf("result %+v", res)
	}
	up.SetReadDeadline(time.Now().Add(5 * time.Second))
	// EOF, or a reset: the relay closed it with the event unread.
	if _, err := io.ReadAll(up); err != nil && !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("upstream not closed: %v", err)
	}
}

// A client that stops reading: bytes wait, the upstream is not read (its
// writes back up), and the stream ends after WriteStall; one that reads
// again gets everything in order.
func TestRelayBackpressure(t *testing.T) {
	const events, size = 40000, 1000
	for _, stall := range []time.Duration{0, 300 * time.Millisecond} {
		r := newTestRelay(t, Config{Loops: 1, WriteStall: stall})
		up, upFD := pair(t)
		cl, clFD := pair(t)
		rec := newRecorder()
		r.Start(Spec{Up: upFD, Client: clFD, Obs: rec})
		var want bytes.Buffer
		for i := 0; i < events; i++ {
			want.Write(bytes.Repeat([]byte{byte('a' + i%26)}, size))
		}
		wrote := make(chan error, 1)
		go func() {
			p := want.Bytes()
			for i := 0; i < events; i++ {
				if _, err := up.Write(appendChunk(nil, p[i*size:(i+1)*size])); err != nil {
					wrote <- err
					return
				}
			}
			_, err := up.Write(lastChunk)
			wrote <- err
		}()
		if stall > 0 {
			// The stream ends after the stall, and the upstream with it.
			if res := rec.wait(t); res.Outcome != ClientGone || !errors.Is(res.Err, errStall) {
				t.Fatalf("result %+v", res)
			}
			if err := <-wrote; err == nil {
				t.Fatal("the upstream wrote everything to a client that reads nothing")
			}
			continue
		}
		select {
		case err := <-wrote:
			t.Fatalf("the upstream wrote all %d bytes (%v) to a client that reads nothing", want.Len(), err)
		case <-time.After(500 * time.Millisecond):
		}
		body, err := readBody(t, bufio.NewReader(cl))
		if err != nil || !bytes.Equal(body, want.Bytes()) {
			t.Fatalf("body %d bytes (want %d), %v", len(body), want.Len(), err)
		}
		if err := <-wrote; err != nil {
			t.Fatal(err)
		}
		res := rec.wait(t)
		if res.Outcome != Complete {
			t.Fatalf("result %+v", res)
		}
		CloseFD(res.Client)
	}
}

func TestRelayCloseStopsStreams(t *testing.T) {
	r := New(Config{Loops: 2})
	var recs []*recorder
	for range 6 {
		_, upFD := pair(t)
		_, clFD := pair(t)
		rec := newRecorder()
		recs = append(recs, rec)
		if err := r.Start(Spec{Up: upFD, Client: clFD, Obs: rec}); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := r.Wait(ctx); err == nil {
		t.Fatal("Wait returned with streams open")
	}
	r.Close()
	for _, rec := range recs {
		if res := rec.wait(t); res.Outcome != Stopped {
			t.Fatalf("result %+v", res)
		}
	}
	if r.Active() != 0 {
		t.Fatalf("active %d", r.Active())
	}
	_, upFD := pair(t)
	_, clFD := pair(t)
	if err := r.Start(Spec{Up: upFD, Client: clFD, Obs: newRecorder()}); !errors.Is(err, ErrClosed) {
		t.Fatalf("Start after Close: %v", err)
	}
}

// Many streams at once on two loops: every one gets its own bytes.
func TestRelayManyStreams(t *testing.T) {
	r := newTestRelay(t, Config{Loops: 2})
	const n = 200
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		up, upFD := pair(t)
		cl, clFD := pair(t)
		rec := newRecorder()
		if err := r.Start(Spec{Up: upFD, Client: clFD, SSE: true, Obs: rec}); err != nil {
			t.Fatal(err)
		}
		wg.Add(2)
		want := strings.Repeat(string(rune('a'+i%26)), 50)
		go func() {
			defer wg.Done()
			for range 5 {
				up.Write(appendChunk(nil, []byte("data: "+want+"\n\n")))
				time.Sleep(time.Millisecond)
			}
			up.Write(lastChunk)
		}()
		go func() {
			defer wg.Done()
			body, err := readBody(t, bufio.NewReader(cl))
			if err == nil && string(body) != strings.Repeat("data: "+want+"\n\n", 5) {
				err = errors.New("wrong body " + string(body[:min(len(body), 40)]))
			}
			if err == nil {
				if res := rec.wait(t); res.Outcome != Complete {
					err = errors.New("outcome " + res.Outcome.String())
				} else {
					CloseFD(res.Client)
				}
			}
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
}

// With KeepUp, an upstream whose body ended exactly at its last chunk is
// given back (Result.Up), out of the loop's epoll set, at a message
// boundary and open; Quiet says it may carry a request until its peer
// sends or closes. Without KeepUp, with bytes after the body, or after a
// failure it is closed.
func TestRelayGivesTheUpstreamBack(t *testing.T) {
	r := newTestRelay(t, Config{Loops: 1})
	body := appendChunk(nil, []byte("data: a\n\n"))
	cases := []struct {
		name   string
		keep   bool
		send   []byte
		closes bool // the upstream closes after sending
		given  bool
	}{
		{"clean end", true, append(append([]byte(nil), body...), "0\r\nX-T: 1\r\n\r\n"...), false, true},
		{"not kept", false, append(append([]byte(nil), body...), lastChunk...), false, false},
		{"bytes after the end", true, append(append(append([]byte(nil), body...), lastChunk...), "HTTP/1.1 200"...), false, false},
		{"early end", true, body, true, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			up, upFD := pair(t)
			cl, clFD := pair(t)
			rec := newRecorder()
			if err := r.Start(Spec{Up: upFD, Client: clFD, SSE: true, KeepUp: tc.keep, Obs: rec}); err != nil {
				t.Fatal(err)
			}
			up.Write(tc.send)
			if tc.closes {
				up.Close()
			}
			readBody(t, bufio.NewReader(cl))
			res := rec.wait(t)
			if res.Client >= 0 {
				CloseFD(res.Client)
			}
			if !tc.given {
				if res.Up != -1 {
					CloseFD(res.Up)
					t.Fatalf("result %+v: want the upstream closed", res)
				}
				return
			}
			if res.Outcome != Complete || res.Up < 0 {
				t.Fatalf("result %+v: want the upstream given back", res)
			}
			if !Quiet(res.Up) {
				t.Fatal("a given-back upstream with nothing to read is not quiet")
			}
			up.Write([]byte("x"))
			deadline := time.Now().Add(5 * time.Second)
			for Quiet(res.Up) && time.Now().Before(deadline) {
				time.Sleep(time.Millisecond)
			}
			if Quiet(res.Up) {
				t.Fatal("a given-back upstream with a byte to read is quiet")
			}
			c := Resume(res.Up)
			defer c.Close()
			c.SetReadDeadline(time.Now().Add(5 * time.Second))
			buf := make([]byte, 1)
			if _, err := io.ReadFull(c, buf); err != nil || buf[0] != 'x' {
				t.Fatalf("read %q, %v on the given-back upstream", buf, err)
			}
			up.Close()
			c.SetReadDeadline(time.Now().Add(5 * time.Second))
			if _, err := c.Read(buf); err != io.EOF {
				t.Fatalf("after the peer closed: %v, want EOF", err)
			}
		})
	}
}
