package proxy

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// Helpers shared by the package's tests: loopback listeners and servers,
// raw HTTP/1.1 exchanges with the router, and waits with a deadline.

// listen returns a listener on a free loopback port, closed when the test
// ends.
func listen(t testing.TB) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

// refusedAddr returns a loopback address nothing listens on: dials to it
// are refused.
func refusedAddr(t testing.TB) string {
	t.Helper()
	return refusedAddrs(t, 1)[0]
}

// refusedAddrs returns n distinct such addresses: all are bound before any
// is closed (a port closed and bound again at once can come back the same).
func refusedAddrs(t testing.TB, n int) []string {
	t.Helper()
	lns := make([]net.Listener, n)
	for i := range lns {
		lns[i] = listen(t)
	}
	addrs := make([]string, n)
	for i, ln := range lns {
		addrs[i] = ln.Addr().String()
		ln.Close()
	}
	return addrs
}

// serve runs p.Serve(ln) until the test ends, then shuts p down and waits
// for Serve to return.
func serve(t testing.TB, p *Proxy, ln net.Listener) {
	done := make(chan error, 1)
	go func() { done <- p.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		p.Shutdown(ctx)
		<-done
	})
}

// serveConns accepts connections on a new loopback listener and runs
// handle on each, in a goroutine of its own, until the test ends; then it
// closes the listener and every connection and waits for the handlers.
func serveConns(t testing.TB, handle func(c net.Conn)) net.Listener {
	t.Helper()
	ln := listen(t)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				handle(c)
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln
}

// chatRaw is a raw chat request with the extra header lines and body.
func chatRaw(extra string, body string) string {
	return fmt.Sprintf("POST /v1/chat/completions HTTP/1.1\r\nHost: router\r\nContent-Type: application/json\r\n%sContent-Length: %d\r\n\r\n%s", extra, len(body), body)
}

// rawRequest writes one chat request on c.
func rawRequest(t *testing.T, c net.Conn, prompt string) {
	t.Helper()
	if _, err := io.WriteString(c, chatRaw("", chatReq(prompt, ""))); err != nil {
		t.Fatal(err)
	}
}

// exchange writes req on c and reads one response, within 20 s.
func exchange(t *testing.T, c net.Conn, req string) (*http.Response, []byte) {
	t.Helper()
	c.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := io.WriteString(c, req); err != nil {
		t.Fatalf("writing the request: %v", err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("reading the answer: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, b
}

// rawExchange writes req on a new connection and reads one response.
func rawExchange(t *testing.T, h *harness, req string) (*http.Response, []byte) {
	t.Helper()
	return exchange(t, h.dial(t), req)
}

// released returns when release is closed or sent on, or after 10 s: a
// stub handler holding the rest of its answer back.
func released(release <-chan struct{}) {
	select {
	case <-release:
	case <-time.After(10 * time.Second):
	}
}

// waitChan waits until ch is closed or sent on, failing the test with msg
// after d.
func waitChan(t *testing.T, ch <-chan struct{}, d time.Duration, msg string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(d):
		t.Fatal(msg)
	}
}

// waitAbortCounted waits until the router counted a client abort on stub
// a's backend and has nothing in flight.
func waitAbortCounted(t *testing.T, h *harness, a *stub) {
	t.Helper()
	id := a.srv.Listener.Addr().String()
	waitFor(t, func() bool { return testutil.ToFloat64(h.p.m.aborts.WithLabelValues(id)) == 1 }, "the client abort counted")
	waitFor(t, func() bool { return h.p.Status()[0].InFlight == 0 }, "in-flight back to 0")
}

// maxRequestAllocs is what a proxied request with a complete answer may
// allocate: the proxy's own part nothing, and fasthttp's server one
// object for a request with a body (bodyDiscardAllocs). Under the race
// detector sync.Pool drops objects on purpose, and 2 to 3 allocations per
// request then come from refilling pools, the body buffers' included
// (AllocsPerRun truncates).
func maxRequestAllocs() float64 {
	if raceEnabled {
		return racePoolAllocs + bodyDiscardAllocs
	}
	return bodyDiscardAllocs
}

// racePoolAllocs is what refilling the pools costs a request under the race
// detector.
const racePoolAllocs = 3

// bodyDiscardAllocs is what fasthttp's server allocates for a request
// whose body the handler read itself (Server.StreamRequestBody, which
// readBody needs): after the handler, it discards what is left of the body
// with io.CopyN, whose LimitedReader escapes, even when nothing is left.
const bodyDiscardAllocs = 1

// allocsPerRequest sends req over c 200 times, to warm the pools and
// connections, then returns the allocations per request over 1,000; ok
// checks each answer.
func allocsPerRequest(t *testing.T, c *rawClient, req []byte, ok func(head, body []byte) bool) float64 {
	t.Helper()
	do := func() {
		head, body, err := c.do(req)
		if err != nil || !ok(head, body) {
			t.Fatalf("answer %q %q %v", head, body, err)
		}
	}
	for range 200 {
		do()
	}
	return testing.AllocsPerRun(1000, do)
}
