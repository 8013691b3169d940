package proxy

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/warmroute/warmroute/ring"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// hostile is a backend on 127.0.0.1 that answers each request with the
// raw bytes its answer function writes: it is how a test plays a backend
// that lies about lengths, switches protocols or floods the router. It
// records the request heads it received and counts connections.
type hostile struct {
	ln    net.Listener
	conns atomic.Int64
	mu    sync.Mutex
	heads []string
}

// answer writes the response to a request (head without its final CRLF,
// and body) received as the n-th (from 0) on connection c; returning false
// closes the connection.
type answer func(c net.Conn, n int, head string, body []byte) bool

func newHostile(t testing.TB, ans answer) *hostile {
	t.Helper()
	h := &hostile{}
	h.ln = serveConns(t, func(c net.Conn) {
		h.conns.Add(1)
		c.SetDeadline(time.Now().Add(30 * time.Second))
		br := bufio.NewReader(c)
		for n := 0; ; n++ {
			head, body, err := readRawRequest(br)
			if err != nil {
				return
			}
			h.mu.Lock()
			h.heads = append(h.heads, head)
			h.mu.Unlock()
			if !ans(c, n, head, body) {
				return
			}
		}
	})
	return h
}

func (h *hostile) url() string { return "http://" + h.ln.Addr().String() }

// requests returns how many requests the backend received.
func (h *hostile) requests() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.heads)
}

// lastHead returns the last request head received for path, or "".
func (h *hostile) lastHead(path string) string {
	h.mu.Lock()
	defer h.mu.Unlock()
	for i := len(h.heads) - 1; i >= 0; i-- {
		if strings.Contains(strings.SplitN(h.heads[i], "\r\n", 2)[0], path) {
			return h.heads[i]
		}
	}
	return ""
}

// readRawRequest reads a request head and its Content-Length body.
func readRawRequest(br *bufio.Reader) (string, []byte, error) {
	var head strings.Builder
	n := 0
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			return "", nil, err
		}
		if line == "\r\n" {
			break
		}
		head.WriteString(line)
		if k, v, ok := strings.Cut(line, ":"); ok && strings.EqualFold(k, "Content-Length") {
			n, _ = strconv.Atoi(strings.TrimSpace(v))
		}
	}
	body := make([]byte, n)
	_, err := io.ReadFull(br, body)
	return head.String(), body, err
}

// headerOf returns the value of field k in a raw head, and whether it is
// there.
func headerOf(head, k string) (string, bool) {
	for _, line := range strings.Split(head, "\r\n")[1:] {
		if name, v, ok := strings.Cut(line, ":"); ok && strings.EqualFold(name, k) {
			return strings.TrimSpace(v), true
		}
	}
	return "", false
}

const okAnswer = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n{\"ok\":true}"

// hostileProxy serves a proxy in front of one hostile backend.
func hostileProxy(t *testing.T, cfg Config, ans answer) (*harness, *hostile) {
	t.Helper()
	b := newHostile(t, ans)
	return startProxyBackends(t, cfg, ring.DefaultConfig(), []ring.Backend{{ID: "hostile/", Addr: b.url()}}), b
}

func noProbes() Config {
	c := testProxyConfig()
	c.ProbePath = ""
	return c
}

func expectError(t *testing.T, what string, resp *http.Response, body []byte, status int, code string) {
	t.Helper()
	if resp.StatusCode != status || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("%s: %d %q %s, want %d %s", what, resp.StatusCode, resp.Header.Get("Content-Type"), body, status, code)
	}
	if e := decodeError(t, body); e.Code != code {
		t.Fatalf("%s: code %q (%s), want %s", what, e.Code, e.Message, code)
	}
}

// absurdLength answers with a Content-Length of 4 EiB, which fasthttp
// would allocate a buffer for if nothing bounded it.
func absurdLength(c net.Conn, _ int, _ string, _ []byte) bool {
	io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 4611686018427387904\r\n\r\n{\"partial\":")
	return false
}

// A backend declaring an absurd Content-Length, to a request or to the
// health check, is refused without a buffer of that size: 502 for a
// complete answer, a failed check for the probe (which once panicked the
// prober: makeslice: len out of range).
func TestAbsurdContentLength(t *testing.T) {
	h, _ := hostileProxy(t, noProbes(), absurdLength)
	resp, body := post(t, h.url+"/v1/chat/completions", chatReq("x", ""))
	if e := decodeError(t, body); resp.StatusCode != 502 || e.Code != "upstream_response_too_large" {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	// A streamed answer is passed through as it comes: the client sees the
	// length, then the cut.
	c := h.dial(t)
	c.SetDeadline(time.Now().Add(10 * time.Second))
	io.WriteString(c, chatRaw("", chatReq("x", `,"stream":true`)))
	r, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil || r.StatusCode != 200 || r.ContentLength != 4611686018427387904 {
		t.Fatalf("streamed: %v %+v", err, r)
	}
	if b, err := io.ReadAll(r.Body); err == nil {
		t.Fatalf("streamed body %q ended cleanly, want a cut", b)
	}

	// The probe: the backend is found failing, and nothing crashed.
	cfg := testProxyConfig()
	hp, _ := hostileProxy(t, cfg, absurdLength)
	waitFor(t, func() bool { return hp.p.Status()[0].ProbeDown }, "the backend failing its health checks")
}

// streamBody writes an HTTP response of size body bytes generated on the
// fly, framed by Content-Length, chunked, or by the close.
func streamBody(framing string, size int) answer {
	return func(c net.Conn, _ int, head string, _ []byte) bool {
		if strings.HasPrefix(head, "GET /health") {
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
			return true
		}
		chunk := bytes.Repeat([]byte("x"), 64<<10)
		switch framing {
		case "length":
			fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", size)
		case "chunked":
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
			chunk = append([]byte(fmt.Sprintf("%x\r\n", len(chunk))), append(chunk, "\r\n"...)...)
		case "close":
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n")
		}
		for sent := 0; sent < size; sent += 64 << 10 {
			if _, err := c.Write(chunk); err != nil {
				return false
			}
		}
		if framing == "chunked" {
			io.WriteString(c, "0\r\n\r\n")
		}
		return framing != "close"
	}
}

// A complete (not streamed) answer over MaxBufferedResponse is refused
// with 502 whatever its framing, and the router allocates a few times the
// limit at most, not the body; one within the limit passes.
func TestBufferedResponseBounded(t *testing.T) {
	const size = 64 << 20
	for _, framing := range []string{"length", "chunked", "close"} {
		t.Run(framing, func(t *testing.T) {
			cfg := noProbes()
			cfg.MaxBufferedResponse = 1 << 20
			h, _ := hostileProxy(t, cfg, streamBody(framing, size))
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			resp, body := post(t, h.url+"/v1/chat/completions", chatReq("big", ""))
			runtime.ReadMemStats(&after)
			if e := decodeError(t, body); resp.StatusCode != 502 || e.Code != "upstream_response_too_large" || !strings.Contains(e.Message, "stream") {
				t.Fatalf("%d %.200s", resp.StatusCode, body)
			}
			if grew := after.TotalAlloc - before.TotalAlloc; grew > 16<<20 {
				t.Fatalf("a refused %d MiB answer allocated %d MiB", size>>20, grew>>20)
			}
			id := h.p.Status()[0].ID
			if n := testutil.ToFloat64(h.p.m.upErrors.WithLabelValues(id, "protocol")); n != 1 {
				t.Fatalf("protocol errors counted %v, want 1", n)
			}
		})
	}
	cfg := noProbes()
	cfg.MaxBufferedResponse = 1 << 20
	h, _ := hostileProxy(t, cfg, streamBody("chunked", 1<<20-64<<10))
	resp, body := post(t, h.url+"/v1/chat/completions", chatReq("fits", ""))
	if resp.StatusCode != 200 || len(body) != 1<<20-64<<10 {
		t.Fatalf("an answer within the limit: %d, %d bytes", resp.StatusCode, len(body))
	}
}

// A response header larger than the upstream read buffer (16 KiB) is a
// clean 502 at once, neither a hang nor a panic.
func TestResponseHeaderTooLarge(t *testing.T) {
	h, _ := hostileProxy(t, noProbes(), func(c net.Conn, _ int, _ string, _ []byte) bool {
		io.WriteString(c, "HTTP/1.1 200 OK\r\nX-Big: "+strings.Repeat("b", 20<<10)+"\r\nContent-Length: 2\r\n\r\n{}")
		return true
	})
	resp, body := post(t, h.url+"/v1/chat/completions", chatReq("x", ""))
	if e := decodeError(t, body); resp.StatusCode != 502 || e.Code != "upstream_error" {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
}

// switcher answers a request whose body asks for it with 101 Switching
// Protocols, and then, on that connection, anything it receives with a
// forged answer. Other requests get okAnswer.
func switcher(c net.Conn, _ int, head string, body []byte) bool {
	switch {
	case bytes.Contains(body, []byte("switch-now")):
		io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
		br := bufio.NewReader(c)
		for {
			// What follows on an upgraded connection is the backend's to
			// say: a forged answer for whoever is sent there next.
			if _, err := br.ReadByte(); err != nil {
				return false
			}
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\nPOISONED")
		}
	case bytes.Contains(body, []byte("continue-first")):
		io.WriteString(c, "HTTP/1.1 100 Continue\r\n\r\n"+okAnswer)
		return true
	}
	io.WriteString(c, okAnswer)
	return true
}

// A backend that switches protocols gets its connection closed and the
// client 502; later requests never see what it sends on that connection.
// Requests asking for an upgrade are refused before any backend sees them.
func TestUpgradeNeverPooled(t *testing.T) {
	h, b := hostileProxy(t, noProbes(), switcher)
	resp, body := rawExchange(t, h, chatRaw("Connection: Upgrade\r\nUpgrade: websocket\r\n", chatReq("hi", "")))
	expectError(t, "Upgrade: websocket", resp, body, 400, "upgrade_not_supported")
	if b.lastHead("/v1/chat") != "" {
		t.Fatal("the upgrade request reached the backend")
	}
	for _, stream := range []string{"", `,"stream":true`} {
		resp, body := post(t, h.url+"/v1/chat/completions", chatReq("switch-now", stream))
		if e := decodeError(t, body); resp.StatusCode != 502 || e.Code != "upstream_switched_protocols" {
			t.Fatalf("a 101 (stream %q): %d %s", stream, resp.StatusCode, body)
		}
		for i := 0; i < 5; i++ {
			resp, body := post(t, h.url+"/v1/chat/completions", chatReq("after", stream))
			if resp.StatusCode != 200 || string(body) != `{"ok":true}` {
				t.Fatalf("after a 101: %d %q", resp.StatusCode, body)
			}
		}
	}
	// An interim 100 before the answer passes; its connection is not
	// reused either.
	conns := b.conns.Load()
	if resp, body := post(t, h.url+"/v1/chat/completions", chatReq("continue-first", "")); resp.StatusCode != 200 || string(body) != `{"ok":true}` {
		t.Fatalf("100 then 200: %d %q", resp.StatusCode, body)
	}
	if resp, _ := post(t, h.url+"/v1/chat/completions", chatReq("next", "")); resp.StatusCode != 200 {
		t.Fatalf("after a 100: %d", resp.StatusCode)
	}
	if n := b.conns.Load(); n < conns+1 {
		t.Fatalf("backend connections %d, then %d: the connection with an interim answer was reused", conns, n)
	}
	// HTTP/2 over cleartext is declined the HTTP way: the request is
	// served over HTTP/1.1, without the upgrade fields.
	resp, body = rawExchange(t, h, chatRaw("Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA\r\n", chatReq("h2c", "")))
	if resp.StatusCode != 200 {
		t.Fatalf("h2c: %d %s", resp.StatusCode, body)
	}
	head := b.lastHead("/v1/chat")
	for _, k := range []string{"Upgrade", "HTTP2-Settings", "Connection"} {
		if _, ok := headerOf(head, k); ok {
			t.Fatalf("%s forwarded:\n%s", k, head)
		}
	}
}

// Hop-by-hop fields (RFC 9110 section 7.6.1), and those a Connection field
// names, go no further than the connection they came on, both ways.
func TestHopByHopFieldsStripped(t *testing.T) {
	h, b := hostileProxy(t, noProbes(), func(c net.Conn, _ int, head string, body []byte) bool {
		extra := "Connection: X-Secret-Hop\r\nX-Secret-Hop: s\r\nKeep-Alive: timeout=5\r\nProxy-Authenticate: Basic\r\nUpgrade: foo\r\nX-Kept: k\r\n"
		if bytes.Contains(body, []byte(`"stream":true`)) {
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTrailer: X-T\r\n"+extra+"Transfer-Encoding: chunked\r\n\r\n"+
				"e\r\ndata: {\"a\":1}\n\n\r\n0\r\nX-T: 1\r\n\r\n")
			return true
		}
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"+extra+"Content-Length: 2\r\n\r\n{}")
		return true
	})
	for _, stream := range []string{"", `,"stream":true`} {
		req := chatRaw("Connection: keep-alive, X-Client-Hop\r\nX-Client-Hop: c\r\nKeep-Alive: timeout=5\r\nProxy-Authorization: Basic eA==\r\n"+
			"Proxy-Connection: keep-alive\r\nTE: trailers\r\nX-Kept: k\r\n", chatReq("hop", stream))
		resp, body := rawExchange(t, h, req)
		if resp.StatusCode != 200 {
			t.Fatalf("%d %s", resp.StatusCode, body)
		}
		for _, k := range []string{"X-Secret-Hop", "Keep-Alive", "Proxy-Authenticate", "Upgrade", "Trailer"} {
			if v := resp.Header.Get(k); v != "" {
				t.Errorf("stream %q: response field %s: %q passed to the client", stream, k, v)
			}
		}
		if resp.Header.Get("X-Kept") != "k" {
			t.Errorf("stream %q: an end-to-end response field was dropped: %v", stream, resp.Header)
		}
		head := b.lastHead("/v1/chat")
		for _, k := range []string{"Connection", "X-Client-Hop", "Keep-Alive", "Proxy-Authorization", "Proxy-Connection", "TE"} {
			if v, ok := headerOf(head, k); ok {
				t.Errorf("stream %q: request field %s: %q forwarded", stream, k, v)
			}
		}
		if v, _ := headerOf(head, "X-Kept"); v != "k" {
			t.Errorf("stream %q: an end-to-end request field was dropped:\n%s", stream, head)
		}
		if v, _ := headerOf(head, HeaderHops); v != "1" {
			t.Errorf("stream %q: %s %q, want 1", stream, HeaderHops, v)
		}
	}
	// The client's Connection: close still closes its connection.
	c := h.dial(t)
	c.SetDeadline(time.Now().Add(10 * time.Second))
	io.WriteString(c, chatRaw("Connection: close\r\n", chatReq("bye", "")))
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != 200 || !resp.Close {
		t.Fatalf("Connection: close: %v %+v", err, resp)
	}
	io.ReadAll(resp.Body)
	if _, err := br.ReadByte(); err != io.EOF {
		t.Fatalf("connection left open after Connection: close (%v)", err)
	}
}

// A Connection field listing more options than the bound is refused.
func TestConnectionOptionsBounded(t *testing.T) {
	h, b := hostileProxy(t, noProbes(), func(c net.Conn, _ int, _ string, _ []byte) bool {
		io.WriteString(c, okAnswer)
		return true
	})
	opts := make([]string, maxConnectionOptions+1)
	for i := range opts {
		opts[i] = fmt.Sprintf("X-O%d", i)
	}
	resp, body := rawExchange(t, h, chatRaw("Connection: "+strings.Join(opts, ",")+"\r\n", chatReq("x", "")))
	expectError(t, "too many options", resp, body, 400, "invalid_connection_header")
	if b.lastHead("/v1/chat") != "" {
		t.Fatal("forwarded")
	}
}

// A router whose backend leads back to itself answers 508 once the request
// passed MaxHops routers; the hop count a client sends is checked.
func TestLoopDetected(t *testing.T) {
	cfg := noProbes()
	cfg.MaxConnsPerBackend = 16
	cfg.MaxConnWait = 100 * time.Millisecond
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ln := listen(t)
	r, err := ring.New(ring.DefaultConfig(), []ring.Backend{{ID: "self/", Addr: "http://" + ln.Addr().String()}})
	if err != nil {
		t.Fatal(err)
	}
	p.SetRing(r, 1)
	serve(t, p, ln)
	url := "http://" + ln.Addr().String()
	resp, body := post(t, url+"/v1/chat/completions", chatReq("loop", ""))
	if e := decodeError(t, body); resp.StatusCode != 508 || e.Code != "loop_detected" || !strings.Contains(e.Message, "passed 4") {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	if n := testutil.ToFloat64(p.m.requests.WithLabelValues("chat", "none", "", "508")); n != 1 {
		t.Fatalf("508s counted %v, want 1 (the router that saw the 4th hop)", n)
	}
	h := &harness{p: p, url: url}
	for _, tc := range []struct {
		hops   string
		status int
		code   string
	}{{"4", 508, "loop_detected"}, {"999", 508, "loop_detected"}, {"x", 400, "invalid_hops"}, {"-1", 400, "invalid_hops"}, {"1000", 400, "invalid_hops"}} {
		resp, body := rawExchange(t, h, chatRaw(HeaderHops+": "+tc.hops+"\r\n", chatReq("x", "")))
		expectError(t, "hops "+tc.hops, resp, body, tc.status, tc.code)
	}
}

// The backend always sees its own address as Host and an origin-form
// target, whatever the client's request line said.
func TestAbsoluteFormTarget(t *testing.T) {
	h, b := hostileProxy(t, noProbes(), func(c net.Conn, _ int, _ string, _ []byte) bool {
		io.WriteString(c, okAnswer)
		return true
	})
	own := strings.TrimPrefix(b.url(), "http://")
	for _, target := range []string{"http://evil.example/v1/chat/completions?x=1", "HTTP://evil.example:80/v1/chat/completions?x=1", "/v1/chat/completions?x=1"} {
		body := chatReq("abs", "")
		req := fmt.Sprintf("POST %s HTTP/1.1\r\nHost: evil.example\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", target, len(body), body)
		resp, got := rawExchange(t, h, req)
		if resp.StatusCode != 200 {
			t.Fatalf("%s: %d %s", target, resp.StatusCode, got)
		}
		head := b.lastHead("/v1/chat/completions")
		line := strings.SplitN(head, "\r\n", 2)[0]
		if host, _ := headerOf(head, "Host"); host != own || line != "POST /v1/chat/completions?x=1 HTTP/1.1" {
			t.Fatalf("%s: the backend saw %q with Host %q, want origin form and %q", target, line, host, own)
		}
	}
}

// forwardPaths are forward's three ways of passing an answer on: read
// whole, streamed by a goroutine (StreamRelay off), streamed on the relay.
var forwardPaths = []struct {
	name   string
	stream string // the request body's extra field
	relay  bool   // Config.StreamRelay
}{
	{"buffered", "", true},
	{"streamed", `,"stream":true`, false},
	{"relayed", `,"stream":true`, true},
}

// headAnswers answers "switch-now" with a 101, a streamed request with a
// chunked event stream and others with JSON, each with hop-by-hop fields.
func headAnswers(c net.Conn, n int, head string, body []byte) bool {
	if bytes.Contains(body, []byte("switch-now")) {
		return switcher(c, n, head, body)
	}
	hop := "Connection: X-Secret-Hop\r\nX-Secret-Hop: s\r\nKeep-Alive: timeout=5\r\nProxy-Authenticate: Basic\r\nX-Kept: k\r\n"
	if bytes.Contains(body, []byte(`"stream":true`)) {
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"+hop+"Transfer-Encoding: chunked\r\n\r\n"+
			"f\r\ndata: {\"a\":1}\n\n\r\n0\r\n\r\n")
		return true
	}
	io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"+hop+"Content-Length: 2\r\n\r\n{}")
	return true
}

// TestUpstreamHeadOnEveryPath: whichever way its answer is passed on, a
// request reaches the backend with the same head (the backend's own Host,
// an origin-form target, no hop-by-hop field, the hop count one up, the
// router's upstream span as traceparent, in the caller's trace), the
// answer's hop-by-hop fields stop at the router, a 101 is refused with
// 502, and a backend that cannot be reached gets 502: each with the
// backend's in-flight slot given back.
func TestUpstreamHeadOnEveryPath(t *testing.T) {
	const traceID, clientSpan = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	heads := map[string]string{}
	for _, path := range forwardPaths {
		cfg := noProbes()
		cfg.StreamRelay = path.relay
		cfg.Tracer = sdktrace.NewTracerProvider().Tracer("test")
		h, b := hostileProxy(t, cfg, headAnswers)
		// fasthttp counts a connection busy for its first 5 s, one the
		// relay gave back too: closed, it does not hold Shutdown up.
		t.Cleanup(http.DefaultClient.CloseIdleConnections)
		bk := h.p.backends["hostile/"]
		body := chatReq("head", path.stream)
		req := fmt.Sprintf("POST http://evil.example/v1/chat/completions?x=1 HTTP/1.1\r\nHost: evil.example\r\nUser-Agent: client\r\n"+
			"Content-Type: application/json\r\nConnection: keep-alive, X-Client-Hop\r\nX-Client-Hop: c\r\nKeep-Alive: timeout=5\r\n"+
			"Proxy-Authorization: Basic eA==\r\nTE: trailers\r\n%s: 2\r\nTraceparent: 00-%s-%s-01\r\nX-Kept: k\r\nContent-Length: %d\r\n\r\n%s",
			HeaderHops, traceID, clientSpan, len(body), body)
		resp, got := rawExchange(t, h, req)
		if resp.StatusCode != 200 {
			t.Fatalf("%s: %d %s", path.name, resp.StatusCode, got)
		}
		for _, k := range []string{"X-Secret-Hop", "Keep-Alive", "Proxy-Authenticate"} {
			if v := resp.Header.Get(k); v != "" {
				t.Errorf("%s: response field %s: %q passed to the client", path.name, k, v)
			}
		}
		if resp.Header.Get("X-Kept") != "k" || resp.Header.Get(HeaderBackend) != "hostile/" {
			t.Errorf("%s: response fields %v", path.name, resp.Header)
		}
		waitFor(t, func() bool { return bk.inflight.Load() == 0 }, path.name+": the exchange over")
		// A relayed stream leaves its connection among the relay's idle
		// ones; no other path opens one.
		if relayed := bk.relayConns.Load() > 0; relayed != (path.name == "relayed") {
			t.Fatalf("%s: relay connections %d: the request took another path", path.name, bk.relayConns.Load())
		}

		head := b.lastHead("/v1/chat/completions")
		line := strings.SplitN(head, "\r\n", 2)[0]
		if host, _ := headerOf(head, "Host"); line != "POST /v1/chat/completions?x=1 HTTP/1.1" || host != strings.TrimPrefix(b.url(), "http://") {
			t.Errorf("%s: the backend saw %q with Host %q", path.name, line, host)
		}
		for _, k := range []string{"Connection", "X-Client-Hop", "Keep-Alive", "Proxy-Authorization", "TE"} {
			if v, ok := headerOf(head, k); ok {
				t.Errorf("%s: request field %s: %q forwarded", path.name, k, v)
			}
		}
		if v, _ := headerOf(head, "Content-Length"); v != strconv.Itoa(len(body)) {
			t.Errorf("%s: Content-Length %q, want %d", path.name, v, len(body))
		}
		if v, _ := headerOf(head, HeaderHops); v != "3" {
			t.Errorf("%s: %s %q, want 3", path.name, HeaderHops, v)
		}
		tp, _ := headerOf(head, "Traceparent")
		parts := strings.Split(tp, "-")
		if len(parts) != 4 || parts[1] != traceID || parts[2] == clientSpan || strings.Count(head, "raceparent:") != 1 {
			t.Errorf("%s: traceparent %q, want one of a span of the router's in trace %s", path.name, tp, traceID)
		} else {
			head = strings.Replace(head, parts[2], "<span>", 1)
		}
		// The heads compared: the same but for the backend's address and
		// the body's length.
		head = strings.Replace(head, "Host: "+strings.TrimPrefix(b.url(), "http://"), "Host: <backend>", 1)
		heads[path.name] = strings.Replace(head, "Content-Length: "+strconv.Itoa(len(body)), "Content-Length: <n>", 1)

		resp, got = post(t, h.url+"/v1/chat/completions", chatReq("switch-now", path.stream))
		if e := decodeError(t, got); resp.StatusCode != 502 || e.Code != "upstream_switched_protocols" {
			t.Errorf("%s: a 101: %d %s", path.name, resp.StatusCode, got)
		}
		waitFor(t, func() bool { return bk.inflight.Load() == 0 }, path.name+": the 101's slot given back")
		if resp, got := post(t, h.url+"/v1/chat/completions", chatReq("after", path.stream)); resp.StatusCode != 200 {
			t.Errorf("%s: after a 101: %d %s", path.name, resp.StatusCode, got)
		}

		cfg.Registry = nil
		gone := startProxyBackends(t, cfg, ring.DefaultConfig(), []ring.Backend{{ID: "gone/", Addr: "http://" + refusedAddr(t)}})
		resp, got = post(t, gone.url+"/v1/chat/completions", chatReq("nobody", path.stream))
		if e := decodeError(t, got); resp.StatusCode != 502 || e.Code != "backend_unreachable" {
			t.Errorf("%s: a refused connection: %d %s", path.name, resp.StatusCode, got)
		}
		if n := gone.p.backends["gone/"].inflight.Load(); n != 0 {
			t.Errorf("%s: %d in flight after a refused connection", path.name, n)
		}
	}
	for _, path := range forwardPaths[1:] {
		if heads[path.name] != heads["buffered"] {
			t.Errorf("the backend saw\n%s\nfrom the %s path and\n%s\nfrom the buffered one", heads[path.name], path.name, heads["buffered"])
		}
	}
}

// A request head with bare-LF line ends, and TLS on the plain port, are
// answered 400 at once (not at the 30 s read timeout) and closed.
func TestMalformedFramingAnsweredAtOnce(t *testing.T) {
	cfg := noProbes()
	cfg.ReadTimeout = 30 * time.Second
	h, b := hostileProxy(t, cfg, func(c net.Conn, _ int, _ string, _ []byte) bool {
		io.WriteString(c, okAnswer)
		return true
	})
	body := chatReq("lf", "")
	// The first bytes of a TLS 1.2/1.3 ClientHello.
	hello := []byte{0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03, 0x03}
	hello = append(hello, bytes.Repeat([]byte{0xab}, 100)...)
	for _, tc := range []struct {
		name, req, code, msg string
	}{
		{"bare LF", fmt.Sprintf("POST /v1/chat/completions HTTP/1.1\nHost: x\nContent-Type: application/json\nContent-Length: %d\n\n%s", len(body), body), "bad_request", "bare LF"},
		{"bare LF, first line only", fmt.Sprintf("POST /v1/chat/completions HTTP/1.1\nHost: x\r\nContent-Length: %d\r\n", len(body)), "bad_request", "bare LF"},
		{"TLS ClientHello", string(hello), "tls_on_plain_http_port", "plain HTTP"},
	} {
		c := h.dial(t)
		c.SetDeadline(time.Now().Add(20 * time.Second))
		start := time.Now()
		io.WriteString(c, tc.req)
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("%s: %v after %v", tc.name, err, time.Since(start))
		}
		got, _ := io.ReadAll(resp.Body)
		if took := time.Since(start); took > 10*time.Second {
			t.Fatalf("%s: answered after %v", tc.name, took)
		}
		expectError(t, tc.name, resp, got, 400, tc.code)
		if e := decodeError(t, got); !strings.Contains(e.Message, tc.msg) {
			t.Fatalf("%s: message %q", tc.name, e.Message)
		}
		if _, err := br.ReadByte(); err != io.EOF {
			t.Fatalf("%s: connection not closed (%v)", tc.name, err)
		}
	}
	if n := b.requests(); n != 0 {
		t.Fatalf("%d malformed requests reached the backend", n)
	}
	// A well-formed request on a connection still works, and so does one
	// with a bare LF in its body.
	resp, got := rawExchange(t, h, chatRaw("", "{\n\"model\":\"m\",\n\n\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}"))
	if resp.StatusCode != 200 {
		t.Fatalf("bare LF in the body: %d %s", resp.StatusCode, got)
	}
}

func TestFirstHead(t *testing.T) {
	for _, tc := range []struct {
		in   string
		err  error
		done bool
	}{
		{"GET / HTTP/1.1\r\nHost: x\r\n\r\n", nil, true},
		{"GET / HTTP/1.1\r\nHost: x\r\n\r\nbody\n\n", nil, true},
		{"GET / HTTP/1.1\r\nHost: x\r\n", nil, false},
		{"GET / HTTP/1.1\nHost: x\r\n\r\n", errBareLF, true},
		{"GET / HTTP/1.1\r\nHost: x\n\n", errBareLF, true},
		{"\x16\x03\x01", errTLSOnPlainPort, true},
		{"G\x16", nil, false},
	} {
		// Every split in two reads gives the same verdict.
		for cut := 0; cut <= len(tc.in); cut++ {
			var h firstHead
			h.inspect([]byte(tc.in[:cut]))
			if !h.done {
				h.inspect([]byte(tc.in[cut:]))
			}
			if h.err != tc.err || h.done != tc.done {
				t.Fatalf("%q cut at %d: err %v done %v, want %v %v", tc.in, cut, h.err, h.done, tc.err, tc.done)
			}
		}
	}
}

func TestHopField(t *testing.T) {
	for k, want := range map[string]hopSet{
		"Connection": hopConnection, "connection": hopConnection, "CONNECTION": hopConnection,
		"Keep-Alive": hopKeepAlive, "Proxy-Authorization": hopProxy, "proxy-connection": hopProxy,
		"Proxy-Anything": hopProxy, "Proxy-": 0, "TE": hopTE, "te": hopTE, "Trailer": hopTrailer,
		"Transfer-Encoding": hopTransferEncoding, "Upgrade": hopUpgrade, "Expect": hopExpect,
		"x-warmroute-hops": hopHops, "Content-Type": 0, "Connectio": 0, "Connectiom": 0, "T": 0, "": 0,
		"X-Warmroute-Backend": 0, "Cookie": 0,
	} {
		if got := hopField([]byte(k)); got != want {
			t.Errorf("hopField(%q) = %b, want %b", k, got, want)
		}
	}
}

func TestParseHops(t *testing.T) {
	for in, want := range map[string]int{"0": 0, "1": 1, "04": 4, "999": 999, "": -1, "1000": -1, "x": -1, "-1": -1, " 1": -1, "1.0": -1} {
		n, ok := parseHops([]byte(in))
		if (want < 0) == ok || ok && n != want {
			t.Errorf("parseHops(%q) = %d %v, want %d", in, n, ok, want)
		}
	}
}

func TestPlainFinalStatus(t *testing.T) {
	for in, want := range map[string]bool{
		"HTTP/1.1 200": true, "HTTP/1.0 404": true, "HTTP/1.1 599": true, "HTTP/1.1 101": false,
		"HTTP/1.1 100": false, "HTTP/1.1 099": false, "HTTP/1.1 600": false, "HTTP/1.1  20": false,
		"\r\nHTTP/1.1 ": false, "HTTP/2.0 200": false, "http/1.1 200": false,
	} {
		if got := plainFinalStatus([]byte(in)[:10]); got != want {
			t.Errorf("plainFinalStatus(%q) = %v, want %v", in, got, want)
		}
	}
}

// The request path stays free of allocations with the hop-by-hop fields
// common clients send (Python's clients send Connection: keep-alive).
func TestRequestPathAllocationsWithConnectionField(t *testing.T) {
	c := newRawClient(t, allocProxy(t, 1))
	req := chatRequest(4<<10, false)
	req = bytes.Replace(req, []byte("Host: bench\r\n"), []byte("Host: bench\r\nConnection: keep-alive\r\nKeep-Alive: timeout=5\r\n"), 1)
	n := allocsPerRequest(t, c, req, func(head, _ []byte) bool { return bytes.HasPrefix(head, []byte("HTTP/1.1 200")) })
	if want := maxRequestAllocs(); n > want {
		t.Errorf("a proxied request with a Connection field allocates %.2f times, want %v", n, want)
	}
}
