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
