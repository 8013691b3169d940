//go:build linux

package proxy

import (
	"bufio"
	"bytes"
	"context"
	"net"
	"os"
	"runtime"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/warmroute/warmroute/internal/backendspec"
	"github.com/warmroute/warmroute/ring"
)

// poolStub is a raw backend that counts its connections and lets each
// test decide every answer: answer writes the answer to the req-th request
// (from 0) on the conn-th connection (from 0) and reports whether the
// connection goes on. requests and accepts count what came; ended counts
// connections that are over (the proxy closed them, or answer ended them).
type poolStub struct {
	ln       net.Listener
	accepts  atomic.Int32
	requests atomic.Int32
	ended    atomic.Int32
}

func newPoolStub(t *testing.T, answer func(c net.Conn, conn, req int) bool) *poolStub {
	s := &poolStub{}
	s.ln = serveConns(t, func(c net.Conn) {
		defer s.ended.Add(1)
		conn := int(s.accepts.Add(1)) - 1
		br := bufio.NewReaderSize(c, 64<<10)
		buf := make([]byte, 0, 256<<10)
		for req := 0; ; req++ {
			if _, _, err := readMessage(br, buf); err != nil {
				return
			}
			s.requests.Add(1)
			if !answer(c, conn, req) {
				return
			}
		}
	})
	return s
}

func (s *poolStub) url() string { return "http://" + s.ln.Addr().String() }

// sseAnswer is a whole streamed answer: rawSSEHead and rawSSEChunks.
func sseAnswer(c net.Conn) bool {
	_, err := c.Write(append(append([]byte(nil), rawSSEHead...), rawSSEChunks...))
	return err == nil
}

// poolHarness serves a relaying proxy in front of s.
func poolHarness(t *testing.T, s *poolStub, tune ...func(*Config)) (*harness, *backend) {
	cfg := noProbes()
	cfg.StreamRelay = true
	for _, f := range tune {
		f(&cfg)
	}
	h := startProxyBackends(t, cfg, ring.DefaultConfig(), []ring.Backend{{ID: "b/", Addr: s.url()}})
	return h, h.p.backends["b/"]
}

// streamOK sends a streamed request on c and checks its whole answer.
func streamOK(t *testing.T, c *rawClient, what string) {
	t.Helper()
	head, body, err := c.do(chatRequest(1<<10, true))
	if err != nil || !bytes.HasPrefix(head, []byte("HTTP/1.1 200")) || !bytes.HasSuffix(body, []byte("data: [DONE]\n\n")) ||
		bytes.Contains(body, []byte("error")) {
		t.Fatalf("%s: %v %q %q", what, err, head, body)
	}
}

// waitIdle waits until b has n idle relay connections and counts want
// relay connections in all.
func waitIdle(t *testing.T, b *backend, n, want int) {
	t.Helper()
	waitFor(t, func() bool { return int(b.idleUps.n.Load()) == n && b.relayConns.Load() == int64(want) },
		"the idle relay connections counted")
}

// Streams one after the other to a backend share one upstream connection:
// the relay gives it back when a body ended, and the next stream takes it.
func TestRelayReusesUpstreamConnection(t *testing.T) {
	s := newPoolStub(t, func(c net.Conn, _, _ int) bool { return sseAnswer(c) })
	h, b := poolHarness(t, s)
	c := newRawClient(t, strings.TrimPrefix(h.url, "http://"))
	for i := range 4 {
		streamOK(t, c, "stream")
		waitIdle(t, b, 1, 1)
		if i == 1 {
			// A client connection of its own takes the same upstream.
			streamOK(t, newRawClient(t, strings.TrimPrefix(h.url, "http://")), "stream on another client connection")
			waitIdle(t, b, 1, 1)
		}
	}
	if n := s.accepts.Load(); n != 1 {
		t.Fatalf("the backend accepted %d connections for 5 streams, want 1", n)
	}
	if n := b.inflight.Load(); n != 0 {
		t.Fatalf("in flight %d", n)
	}
}

// An idle connection the backend closed is found before use: the next
// stream goes out on a new connection and the client sees nothing of it.
func TestRelayStaleIdleUpstream(t *testing.T) {
	s := newPoolStub(t, func(c net.Conn, conn, _ int) bool { return sseAnswer(c) && conn != 0 })
	h, b := poolHarness(t, s)
	c := newRawClient(t, strings.TrimPrefix(h.url, "http://"))
	streamOK(t, c, "first stream")
	waitFor(t, func() bool { return s.ended.Load() == 1 }, "the backend closing its connection")
	streamOK(t, c, "stream after the backend closed the idle connection")
	if n, r := s.accepts.Load(), s.requests.Load(); n != 2 || r != 2 {
		t.Fatalf("accepts %d, requests %d, want 2 and 2", n, r)
	}
	waitIdle(t, b, 1, 1)
}

// A reused connection the backend closes as the request arrives (its
// keep-alive timeout racing the check): the request was not answered, and
// goes out again, once, on a new connection.
func TestRelayReusedUpstreamClosedOnRequest(t *testing.T) {
	s := newPoolStub(t, func(c net.Conn, conn, req int) bool {
		if conn == 0 && req == 1 {
			return false // read, then closed unanswered
		}
		return sseAnswer(c)
	})
	h, b := poolHarness(t, s)
	c := newRawClient(t, strings.TrimPrefix(h.url, "http://"))
	streamOK(t, c, "first stream")
	waitIdle(t, b, 1, 1)
	streamOK(t, c, "stream whose reused connection closed")
	if n, r := s.accepts.Load(), s.requests.Load(); n != 2 || r != 3 {
		t.Fatalf("accepts %d, requests %d, want 2 and 3", n, r)
	}
	waitIdle(t, b, 1, 1)

	// Not when the reused connection fails after part of an answer: the
	// request was answered, and is not sent again.
	s2 := newPoolStub(t, func(c net.Conn, conn, req int) bool {
		if conn == 0 && req == 1 {
			c.Write([]byte("HTTP/1.1 200 OK\r\nContent-Ty"))
			return false
		}
		return sseAnswer(c)
	})
	h2, b2 := poolHarness(t, s2)
	c2 := newRawClient(t, strings.TrimPrefix(h2.url, "http://"))
	streamOK(t, c2, "first stream")
	waitIdle(t, b2, 1, 1)
	head, _, err := c2.do(chatRequest(1<<10, true))
	if err != nil || !bytes.HasPrefix(head, []byte("HTTP/1.1 502")) {
		t.Fatalf("a half-answered request: %v %q, want 502", err, head)
	}
	if n, r := s2.accepts.Load(), s2.requests.Load(); n != 1 || r != 2 {
		t.Fatalf("accepts %d, requests %d, want 1 and 2", n, r)
	}
	waitIdle(t, b2, 0, 0)

	// Nor when the backend keeps the request past FirstByteTimeout: it
	// may be working on it.
	s3 := newPoolStub(t, func(c net.Conn, conn, req int) bool {
		if conn == 0 && req == 1 {
			c.Read(make([]byte, 1)) // until the proxy gives up
			return false
		}
		return sseAnswer(c)
	})
	h3, b3 := poolHarness(t, s3, func(c *Config) { c.FirstByteTimeout = 300 * time.Millisecond })
	c3 := newRawClient(t, strings.TrimPrefix(h3.url, "http://"))
	streamOK(t, c3, "first stream")
	waitIdle(t, b3, 1, 1)
	head, _, err = c3.do(chatRequest(1<<10, true))
	if err != nil || !bytes.HasPrefix(head, []byte("HTTP/1.1 504")) {
		t.Fatalf("a request the backend kept: %v %q, want 504", err, head)
	}
	if n, r := s3.accepts.Load(), s3.requests.Load(); n != 1 || r != 2 {
		t.Fatalf("accepts %d, requests %d, want 1 and 2", n, r)
	}
	waitIdle(t, b3, 0, 0)
}

// An upstream connection is kept only after an answer that ended exactly
// at its last chunk on HTTP/1.1 without Connection: close.
func TestRelayDoesNotKeepUnreusableUpstream(t *testing.T) {
	sse := func(head string, body []byte) func(c net.Conn) bool {
		return func(c net.Conn) bool {
			c.Write(append([]byte(head), body...))
			return true // the backend would go on: only the proxy ends it
		}
	}
	cases := []struct {
		name   string
		answer func(c net.Conn) bool
		failed bool // the client sees the stream fail
	}{
		{"connection close", sse("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n", rawSSEChunks), false},
		{"bytes after the body", sse(string(rawSSEHead), append(append([]byte(nil), rawSSEChunks...), "HTTP/1.1 200 OK\r\n"...)), false},
		{"interim answer first", sse("HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n"+string(rawSSEHead), rawSSEChunks), false},
		{"body cut short", func(c net.Conn) bool {
			c.Write(append(append([]byte(nil), rawSSEHead...), chunked("data: {\"t\":1}\n\n")[:20]...))
			return false
		}, true},
		{"broken framing", sse(string(rawSSEHead), []byte("zz\r\n")), true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := newPoolStub(t, func(c net.Conn, _, _ int) bool { return tc.answer(c) })
			h, b := poolHarness(t, s)
			for i := range 2 {
				c := newRawClient(t, strings.TrimPrefix(h.url, "http://"))
				head, body, err := c.do(chatRequest(1<<10, true))
				if !tc.failed && (err != nil || !bytes.HasPrefix(head, []byte("HTTP/1.1 200")) || !bytes.Contains(body, []byte("[DONE]"))) {
					t.Fatalf("stream %d: %v %q %q", i, err, head, body)
				}
				waitFor(t, func() bool { return s.ended.Load() == int32(i+1) }, "the upstream connection closed")
				waitIdle(t, b, 0, 0)
			}
			if n := s.accepts.Load(); n != 2 {
				t.Fatalf("accepts %d, want 2", n)
			}
		})
	}
}

// Idle connections are closed after IdleConnTimeout.
func TestRelayIdleUpstreamExpires(t *testing.T) {
	s := newPoolStub(t, func(c net.Conn, _, _ int) bool { return sseAnswer(c) })
	h, b := poolHarness(t, s, func(c *Config) { c.IdleConnTimeout = 300 * time.Millisecond })
	c := newRawClient(t, strings.TrimPrefix(h.url, "http://"))
	streamOK(t, c, "stream")
	start := time.Now()
	waitIdle(t, b, 1, 1)
	waitFor(t, func() bool { return s.ended.Load() == 1 }, "the idle connection closed")
	if d := time.Since(start); d < 250*time.Millisecond {
		t.Fatalf("closed after %v, before IdleConnTimeout", d)
	}
	waitIdle(t, b, 0, 0)
	// A connection found expired before the sweep is not used either.
	streamOK(t, c, "stream")
	waitIdle(t, b, 1, 1)
	if fd := b.takeIdleUp(time.Now().Add(time.Second).UnixNano(), h.p.cfg.IdleConnTimeout); fd != -1 {
		t.Fatalf("an expired connection was handed out (%d)", fd)
	}
	waitFor(t, func() bool { return s.ended.Load() == 2 }, "the expired connection closed")
	waitIdle(t, b, 0, 0)
}

// A backend leaving the proxy, and Shutdown, close its idle connections;
// every descriptor the streams used is closed by then.
func TestRelayIdleUpstreamClosedOnRemovalAndShutdown(t *testing.T) {
	fds := func() int {
		ents, err := os.ReadDir("/proc/self/fd")
		if err != nil {
			t.Skip("no /proc/self/fd")
		}
		return len(ents)
	}
	s := newPoolStub(t, func(c net.Conn, _, _ int) bool { return sseAnswer(c) })
	other := newPoolStub(t, func(c net.Conn, _, _ int) bool { return sseAnswer(c) })
	h, b := poolHarness(t, s)
	c := newRawClient(t, strings.TrimPrefix(h.url, "http://"))
	streamOK(t, c, "stream")
	waitIdle(t, b, 1, 1)

	r, err := ring.New(ring.DefaultConfig(), []ring.Backend{{ID: "other/", Addr: other.url()}})
	if err != nil {
		t.Fatal(err)
	}
	if err := h.p.SetRing(r, 8); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return s.ended.Load() == 1 }, "the removed backend's idle connection closed")
	waitIdle(t, b, 0, 0)
	// A connection given back to a removed backend is closed at once.
	sp, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	b.relayConns.Add(1)
	b.putIdleUp(sp[0], time.Now().UnixNano(), 64)
	waitIdle(t, b, 0, 0)
	expectClosed(t, sp[1])

	ob := h.p.backends["other/"]
	for range 3 {
		streamOK(t, c, "stream to the other backend")
	}
	waitIdle(t, ob, 1, 1)
	c.c.Close()
	waitFor(t, func() bool { return h.p.open.Load() == 0 }, "the client connection closed")
	before := fds()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := h.p.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return other.ended.Load() == 1 }, "the idle connection closed at Shutdown")
	waitIdle(t, ob, 0, 0)
	// Shutdown closed the idle connection (and the stub its end), the
	// listener and each relay loop's epoll set and eventfd. (At most:
	// what earlier tests left may close meanwhile.)
	want := before - 3 - 2*min(runtime.GOMAXPROCS(0), 8)
	waitFor(t, func() bool { return fds() <= want }, "the descriptors closed")
}

// expectClosed checks that the peer of fd closed its end (a reset when it
// had bytes from fd unread), and closes fd.
func expectClosed(t *testing.T, fd int) {
	t.Helper()
	defer syscall.Close(fd)
	var b [1]byte
	syscall.SetNonblock(fd, false)
	tv := syscall.Timeval{Sec: 5}
	syscall.SetsockoptTimeval(fd, syscall.SOL_SOCKET, syscall.SO_RCVTIMEO, &tv)
	if n, err := syscall.Read(fd, b[:]); (n != 0 || err != nil) && err != syscall.ECONNRESET {
		t.Fatalf("peer not closed: %d, %v", n, err)
	}
}

// A backend keeps at most its bound of idle connections (newest first
// out); the ones over it, and expired ones, are closed and stop counting.
func TestIdleUpstreamBound(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxConnsPerBackend = 2
	b := newBackend("b/", backendspec.Target{HostPort: "127.0.0.1:1"}, &cfg, newMetrics(nil))
	var peers []int
	var mine []int
	for range 4 {
		sp, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		mine, peers = append(mine, sp[0]), append(peers, sp[1])
		b.relayConns.Add(1)
	}
	now := time.Now().UnixNano()
	for i, fd := range mine {
		b.putIdleUp(fd, now+int64(i), cfg.idleUpLimit())
	}
	if n, c := b.idleUps.n.Load(), b.relayConns.Load(); n != 2 || c != 2 {
		t.Fatalf("%d idle, %d counted after 4 given back with a bound of 2", n, c)
	}
	expectClosed(t, peers[2])
	expectClosed(t, peers[3])
	if fd := b.takeIdleUp(now+10, time.Second); fd != mine[1] {
		t.Fatalf("took %d, want the newest (%d)", fd, mine[1])
	}
	b.putIdleUp(mine[1], now+20, cfg.idleUpLimit())
	b.sweepIdleUp(now+int64(time.Second)+10, time.Second) // the first is past the bound, not the second
	if n, c := b.idleUps.n.Load(), b.relayConns.Load(); n != 1 || c != 1 {
		t.Fatalf("%d idle, %d counted after the sweep", n, c)
	}
	expectClosed(t, peers[0])
	// A peer that wrote (or closed) makes its connection unusable.
	syscall.Write(peers[1], []byte("x"))
	if fd := b.takeIdleUp(now+30, time.Second); fd != -1 {
		t.Fatalf("took %d, a connection with unasked-for bytes", fd)
	}
	expectClosed(t, peers[1])
	if n, c := b.idleUps.n.Load(), b.relayConns.Load(); n != 0 || c != 0 {
		t.Fatalf("%d idle, %d counted at the end", n, c)
	}
}
