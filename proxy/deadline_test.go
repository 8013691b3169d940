package proxy

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/warmroute/warmroute/ring"
)

// Client read deadlines reach the poller lazily (rawio.Socket.SetReadDeadline);
// these tests pin down that the timeouts still hold, and that a deadline
// left behind never fails a later read.

// readStatus reads one answer from br and returns its status.
func readStatus(t *testing.T, br *bufio.Reader) int {
	t.Helper()
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("reading the answer: %v", err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// waitClosed returns how long after start the proxy closed c.
func waitClosed(t *testing.T, c net.Conn, br *bufio.Reader, start time.Time, limit time.Duration) time.Duration {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(limit))
	b, err := br.ReadByte()
	if err == nil {
		t.Fatalf("unexpected byte %q", b)
	}
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatalf("the connection is still open %v later", limit)
	}
	return time.Since(start)
}

// A keep-alive connection is closed IdleTimeout after its last answer,
// not before, also after several requests moved the deadline.
func TestIdleClientConnectionClosed(t *testing.T) {
	a := newStub(t, "a", nil)
	cfg := testProxyConfig()
	cfg.IdleTimeout = 400 * time.Millisecond
	h := startProxy(t, cfg, ring.DefaultConfig(), a)
	c := h.dial(t)
	br := bufio.NewReader(c)
	for i := range 5 {
		rawRequest(t, c, fmt.Sprint("p", i))
		if s := readStatus(t, br); s != 200 {
			t.Fatalf("request %d: status %d", i, s)
		}
		time.Sleep(100 * time.Millisecond)
	}
	rawRequest(t, c, "last")
	if s := readStatus(t, br); s != 200 {
		t.Fatalf("status %d", s)
	}
	last := time.Now()
	took := waitClosed(t, c, br, last, 5*time.Second)
	// The wait may end up to 1/64 of the timeout early (see
	// rawio.Socket.SetReadDeadline).
	if min := cfg.IdleTimeout - cfg.IdleTimeout/64 - 10*time.Millisecond; took < min {
		t.Fatalf("closed %v after the last answer; IdleTimeout is %v", took, cfg.IdleTimeout)
	}
	t.Logf("closed %v after the last answer (IdleTimeout %v)", took, cfg.IdleTimeout)
}

// A client that sends part of a request and stops is cut after
// ReadTimeout, though the request began right away (its first bytes never
// waited, so the deadline was only applied when the read for the rest
// had to wait).
func TestReadTimeoutCutsStalledRequest(t *testing.T) {
	a := newStub(t, "a", nil)
	cfg := testProxyConfig()
	cfg.ReadTimeout = 300 * time.Millisecond
	cfg.IdleTimeout = 10 * time.Second
	h := startProxy(t, cfg, ring.DefaultConfig(), a)
	c := h.dial(t)
	br := bufio.NewReader(c)
	rawRequest(t, c, "first")
	if s := readStatus(t, br); s != 200 {
		t.Fatalf("status %d", s)
	}
	start := time.Now()
	if _, err := io.WriteString(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"model\":"); err != nil {
		t.Fatal(err)
	}
	// The router may answer 408 before closing; either way it must not wait
	// for the idle timeout.
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.Copy(io.Discard, br); err != nil {
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			t.Fatal("a stalled request was still waited for after 5 s")
		}
	}
	took := time.Since(start)
	if took < cfg.ReadTimeout-cfg.ReadTimeout/64-10*time.Millisecond || took > 3*time.Second {
		t.Fatalf("cut after %v; ReadTimeout is %v", took, cfg.ReadTimeout)
	}
}

// A request that takes longer than both timeouts (a long generation) must
// not leave a lapsed deadline on the poller that fails the connection's
// next request: the poller fails a read whose deadline has passed even
// when data is waiting.
func TestKeepAliveAfterRequestLongerThanTimeouts(t *testing.T) {
	a := newStub(t, "a", func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		if strings.Contains(r.Header.Get("X-Test"), "slow") {
			time.Sleep(2500 * time.Millisecond)
		}
		io.WriteString(w, `{"id":"x"}`)
	})
	cfg := testProxyConfig()
	cfg.ProbePath = ""
	cfg.ReadTimeout = 1200 * time.Millisecond
	cfg.IdleTimeout = 1500 * time.Millisecond
	cfg.FirstByteTimeout = 10 * time.Second
	h := startProxy(t, cfg, ring.DefaultConfig(), a)
	c := h.dial(t)
	br := bufio.NewReader(c)
	// Let the router wait for the first request, so a deadline is on the
	// poller when the long request begins.
	time.Sleep(100 * time.Millisecond)
	io.WriteString(c, chatRaw("X-Test: slow\r\n", chatReq("long", "")))
	if s := readStatus(t, br); s != 200 {
		t.Fatalf("long request: status %d", s)
	}
	rawRequest(t, c, "next")
	if s := readStatus(t, br); s != 200 {
		t.Fatalf("next request: status %d", s)
	}
}
