package proxy

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/warmroute/warmroute/ring"
)

// holdingStub answers a streamed request with the SSE head and one event,
// then holds the stream until release is closed (or the proxy closes the
// connection), then ends it; other requests get rawAnswer. closed hears
// each connection's end.
type holdingStub struct {
	ln      net.Listener
	release chan struct{}
	closed  chan struct{}
}

func newHoldingStub(t *testing.T) *holdingStub {
	s := &holdingStub{release: make(chan struct{}), closed: make(chan struct{}, 16)}
	s.ln = serveConns(t, func(c net.Conn) {
		defer func() { s.closed <- struct{}{} }()
		br := bufio.NewReaderSize(c, 64<<10)
		buf := make([]byte, 0, 256<<10)
		for {
			_, body, err := readMessage(br, buf)
			if err != nil {
				return
			}
			if !bytes.Contains(body, streamTrue) {
				if _, err := c.Write(rawAnswer); err != nil {
					return
				}
				continue
			}
			c.Write(rawSSEHead)
			c.Write(chunked("data: {\"t\":1}\n\n")[:len(chunked("data: {\"t\":1}\n\n"))-5])
			gone := make(chan struct{})
			go func() {
				var b [1]byte
				c.Read(b[:]) // the proxy closing the connection
				close(gone)
			}()
			select {
			case <-s.release:
			case <-gone:
				return
			}
			if _, err := c.Write(chunked("data: [DONE]\n\n")); err != nil {
				return
			}
			<-gone
			return
		}
	})
	return s
}

func relayHarness(t *testing.T, stubURL string) *harness {
	cfg := noProbes()
	cfg.StreamRelay = true
	return startProxyBackends(t, cfg, ring.DefaultConfig(), []ring.Backend{{ID: "b/", Addr: stubURL}})
}

// A relayed stream ends cleanly and its client connection serves the next
// requests, pipelined ones included; the connection counts open from
// first to last.
func TestRelayedStreamKeepsTheConnection(t *testing.T) {
	stub := newRawStub(t)
	h := relayHarness(t, stub.url())
	c := newRawClient(t, strings.TrimPrefix(h.url, "http://"))
	stream, plain := chatRequest(1<<10, true), chatRequest(1<<10, false)
	for i := range 3 {
		head, body, err := c.do(stream)
		if err != nil || !bytes.HasPrefix(head, []byte("HTTP/1.1 200")) || !bytes.Contains(body, []byte("data: [DONE]")) {
			t.Fatalf("stream %d: %v %q %q", i, err, head, body)
		}
		head, body, err = c.do(plain)
		if err != nil || !bytes.HasPrefix(head, []byte("HTTP/1.1 200")) || !bytes.Equal(body, rawAnswer[len(rawAnswer)-48:]) {
			t.Fatalf("plain %d: %v %q %q", i, err, head, body)
		}
	}
	// A stream and a plain request sent together: both answered, in order.
	if _, err := c.c.Write(append(append([]byte(nil), stream...), plain...)); err != nil {
		t.Fatal(err)
	}
	_, body, err := readMessage(c.br, c.buf)
	if err != nil || !bytes.Contains(body, []byte("data: [DONE]")) {
		t.Fatalf("pipelined stream: %v %q", err, body)
	}
	_, body, err = readMessage(c.br, c.buf)
	if err != nil || !bytes.Equal(body, rawAnswer[len(rawAnswer)-48:]) {
		t.Fatalf("pipelined plain request after a stream: %v %q", err, body)
	}
	if n := h.p.open.Load(); n != 1 {
		t.Fatalf("open connections %d, want 1", n)
	}
	c.c.Close()
	waitFor(t, func() bool { return h.p.open.Load() == 0 && h.p.relay.Active() == 0 }, "the connection counted closed")
	if n := h.p.backends["b/"].inflight.Load(); n != 0 {
		t.Fatalf("in flight %d after the streams", n)
	}
}

// A client that asked to close its connection after a relayed stream gets
// Connection: close on the answer, and the connection ends with the
// stream instead of serving again.
func TestRelayedStreamClientClose(t *testing.T) {
	stub := newRawStub(t)
	h := relayHarness(t, stub.url())
	c := newRawClient(t, strings.TrimPrefix(h.url, "http://"))
	req := bytes.Replace(chatRequest(1<<10, true), []byte("Host: bench\r\n"), []byte("Host: bench\r\nConnection: close\r\n"), 1)
	head, body, err := c.do(req)
	if err != nil || !bytes.HasPrefix(head, []byte("HTTP/1.1 200")) || !bytes.Contains(body, []byte("data: [DONE]")) {
		t.Fatalf("stream: %v %q %q", err, head, body)
	}
	if !bytes.Contains(bytes.ToLower(head), []byte("connection: close")) {
		t.Errorf("answer head lacks Connection: close: %q", head)
	}
	c.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if n, err := c.br.Read(make([]byte, 1)); err != io.EOF {
		t.Errorf("after the stream the connection read %d bytes, %v; want it closed (EOF)", n, err)
	}
	waitFor(t, func() bool { return h.p.open.Load() == 0 && h.p.relay.Active() == 0 }, "the connection counted closed")
}

// While a stream is open it is on the relay, not a goroutine; when the
// client leaves, the backend's connection is closed (the engine stops).
func TestRelayedStreamClientLeaves(t *testing.T) {
	stub := newHoldingStub(t)
	h := relayHarness(t, "http://"+stub.ln.Addr().String())
	c := h.dial(t)
	c.Write(chatRequest(1<<10, true))
	br := bufio.NewReader(c)
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	line, err := br.ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "HTTP/1.1 200") {
		t.Fatalf("%q %v", line, err)
	}
	waitFor(t, func() bool { return h.p.relay.Active() == 1 }, "the stream on the relay")
	c.Close()
	select {
	case <-stub.closed:
	case <-time.After(10 * time.Second):
		t.Fatal("the backend's connection stayed open after the client left")
	}
	waitFor(t, func() bool {
		return h.p.relay.Active() == 0 && h.p.open.Load() == 0 && h.p.backends["b/"].inflight.Load() == 0
	}, "the stream ended and counted")
}

// A stream to a backend at MaxConnsPerBackend, with no idle relay
// connection, takes the goroutine path, is counted in
// warmroute_streams_off_relay_total, and still gets its whole answer.
func TestStreamOffRelayAtConnBound(t *testing.T) {
	stub := newHoldingStub(t)
	cfg := noProbes()
	cfg.StreamRelay = true
	cfg.MaxConnsPerBackend = 1
	cfg.MaxConnWait = 5 * time.Second
	h := startProxyBackends(t, cfg, ring.DefaultConfig(), []ring.Backend{{ID: "b/", Addr: "http://" + stub.ln.Addr().String()}})
	first := h.dial(t)
	first.Write(chatRequest(1<<10, true))
	waitFor(t, func() bool { return h.p.relay.Active() == 1 }, "the first stream on the relay")
	if n := testutil.ToFloat64(h.p.m.offRelay); n != 0 {
		t.Fatalf("off-relay count %v with one stream", n)
	}
	second := h.dial(t)
	second.Write(chatRequest(1<<10, true))
	waitFor(t, func() bool { return testutil.ToFloat64(h.p.m.offRelay) == 1 }, "the second stream counted off the relay")
	close(stub.release)
	for i, c := range []net.Conn{first, second} {
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("stream %d: %v", i, err)
		}
		body, err := io.ReadAll(resp.Body)
		if err != nil || !bytes.Contains(body, []byte("data: [DONE]")) {
			t.Fatalf("stream %d body %q, %v", i, body, err)
		}
	}
	// The client can read the last byte before the relay has counted its
	// stream done.
	waitFor(t, func() bool { return h.p.relay.Active() == 0 }, "no stream left on the relay")
}

// Shutdown waits for relayed streams until its context ends, then ends
// them; a stream that finishes in time ends cleanly.
func TestRelayedStreamShutdown(t *testing.T) {
	stub := newHoldingStub(t)
	h := relayHarness(t, "http://"+stub.ln.Addr().String())
	c := h.dial(t)
	c.Write(chatRequest(1<<10, true))
	waitFor(t, func() bool { return h.p.relay.Active() == 1 }, "the stream on the relay")

	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	if err := h.p.Shutdown(ctx); err == nil {
		t.Fatal("Shutdown returned nil with a stream open past its context")
	}
	if d := time.Since(start); d < 250*time.Millisecond {
		t.Fatalf("Shutdown gave up after %v, before its context ended", d)
	}
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadAll(c); err != nil {
		t.Fatalf("client connection not closed: %v", err)
	}
	if h.p.relay.Active() != 0 {
		t.Fatalf("active %d after Shutdown", h.p.relay.Active())
	}
}

// An HTTP/1.0 client cannot read chunked framing (RFC 9112 section 6.1):
// a streamed answer goes to it as the events themselves, with no
// Transfer-Encoding, and the connection's close ends it, whether or not
// the client asked to keep it alive, on the relay and off it.
func TestStreamToHTTP10Client(t *testing.T) {
	want := "data: {\"t\":1}\n\ndata: {\"t\":2}\n\ndata: [DONE]\n\n"
	for _, relayOn := range []bool{true, false} {
		for _, keepAlive := range []bool{true, false} {
			stub := newRawStub(t)
			cfg := noProbes()
			cfg.StreamRelay = relayOn
			h := startProxyBackends(t, cfg, ring.DefaultConfig(), []ring.Backend{{ID: "b/", Addr: stub.url()}})
			req := bytes.Replace(chatRequest(1<<10, true), []byte(" HTTP/1.1\r\n"), []byte(" HTTP/1.0\r\n"), 1)
			if keepAlive {
				req = bytes.Replace(req, []byte("Host: bench\r\n"), []byte("Host: bench\r\nConnection: keep-alive\r\n"), 1)
			}
			c, err := net.Dial("tcp", strings.TrimPrefix(h.url, "http://"))
			if err != nil {
				t.Fatal(err)
			}
			c.SetDeadline(time.Now().Add(10 * time.Second))
			if _, err := c.Write(req); err != nil {
				t.Fatal(err)
			}
			all, err := io.ReadAll(c) // to the connection's close
			c.Close()
			if err != nil {
				t.Fatalf("relay %v, keep-alive %v: %v after %q", relayOn, keepAlive, err, all)
			}
			head, body, ok := bytes.Cut(all, crlfcrlf)
			if !ok || !bytes.HasPrefix(head, []byte("HTTP/1.")) || !bytes.Contains(head, []byte(" 200 ")) {
				t.Fatalf("relay %v, keep-alive %v: answer %q", relayOn, keepAlive, all)
			}
			if bytes.Contains(bytes.ToLower(head), []byte("transfer-encoding")) {
				t.Errorf("relay %v, keep-alive %v: head has Transfer-Encoding: %q", relayOn, keepAlive, head)
			}
			if string(body) != want {
				t.Errorf("relay %v, keep-alive %v: body %q, want %q", relayOn, keepAlive, body, want)
			}
			waitFor(t, func() bool { return h.p.backends["b/"].inflight.Load() == 0 }, "the stream ended")
		}
	}
}

// An HTTP/1.0 client's stream goes through the relay too (it is on an
// event loop while open), without chunked framing.
func TestRelayedStreamToHTTP10Client(t *testing.T) {
	stub := newHoldingStub(t)
	h := relayHarness(t, "http://"+stub.ln.Addr().String())
	req := bytes.Replace(chatRequest(1<<10, true), []byte(" HTTP/1.1\r\n"), []byte(" HTTP/1.0\r\n"), 1)
	c, err := net.Dial("tcp", strings.TrimPrefix(h.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write(req); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return h.p.relay.Active() == 1 }, "the stream on the relay")
	close(stub.release)
	all, err := io.ReadAll(c)
	if err != nil {
		t.Fatalf("%v after %q", err, all)
	}
	head, body, _ := bytes.Cut(all, crlfcrlf)
	if bytes.Contains(bytes.ToLower(head), []byte("transfer-encoding")) || !bytes.Contains(bytes.ToLower(head), []byte("connection: close")) {
		t.Errorf("head %q: want no Transfer-Encoding and Connection: close", head)
	}
	if want := "data: {\"t\":1}\n\ndata: [DONE]\n\n"; string(body) != want {
		t.Errorf("body %q, want %q", body, want)
	}
}
