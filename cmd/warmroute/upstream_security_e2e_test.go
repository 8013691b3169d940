package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warmroute/warmroute/loadtest/proc"
)

// The router against hostile backends and malformed framing, end to end:
// the real binary, backends that are raw listeners on 127.0.0.1 writing
// bytes of the test's choosing, clients on raw sockets. Each test names
// what the router did before it was hardened against the case.

// rawBackend answers each request (head and Content-Length body) with what
// its answer function writes. It counts connections and requests by path.
type rawBackend struct {
	ln    net.Listener
	conns atomic.Int64
	mu    sync.Mutex
	heads []string
}

type rawAnswerFunc func(c net.Conn, head string, body []byte) bool

func newRawBackend(t *testing.T, ans rawAnswerFunc) *rawBackend {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &rawBackend{ln: ln}
	var wg sync.WaitGroup
	var cmu sync.Mutex
	var open []net.Conn
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			b.conns.Add(1)
			cmu.Lock()
			open = append(open, c)
			cmu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				c.SetDeadline(time.Now().Add(60 * time.Second))
				br := bufio.NewReader(c)
				for {
					head, body, err := readHeadBody(br)
					if err != nil {
						return
					}
					b.mu.Lock()
					b.heads = append(b.heads, head)
					b.mu.Unlock()
					if !ans(c, head, body) {
						return
					}
				}
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		cmu.Lock()
		for _, c := range open {
			c.Close()
		}
		cmu.Unlock()
		wg.Wait()
	})
	return b
}

func (b *rawBackend) url() string { return "http://" + b.ln.Addr().String() }

// count returns how many requests for path the backend received.
func (b *rawBackend) count(path string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := 0
	for _, h := range b.heads {
		if strings.Contains(strings.SplitN(h, "\r\n", 2)[0], " "+path) {
			n++
		}
	}
	return n
}

// last returns the last request head for path.
func (b *rawBackend) last(path string) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	for i := len(b.heads) - 1; i >= 0; i-- {
		if strings.Contains(strings.SplitN(b.heads[i], "\r\n", 2)[0], " "+path) {
			return b.heads[i]
		}
	}
	return ""
}

func readHeadBody(br *bufio.Reader) (string, []byte, error) {
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

func fieldOf(head, k string) (string, bool) {
	for _, line := range strings.Split(head, "\r\n")[1:] {
		if name, v, ok := strings.Cut(line, ":"); ok && strings.EqualFold(name, k) {
			return strings.TrimSpace(v), true
		}
	}
	return "", false
}

const healthyAnswer = "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"
const jsonAnswer = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n{\"ok\":true}"

// codeOf returns the OpenAI error code of a JSON error body.
func codeOf(body []byte) string {
	var v struct {
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	json.Unmarshal(body, &v)
	return v.Error.Code
}

// Before: a backend answering Content-Length: 4611686018427387904 made
// fasthttp allocate a buffer of that size and the router panicked
// (makeslice: len out of range); the health probe alone did it, so routers
// crash-looped with no client traffic. Now the probe fails, the request
// gets 502, and the router lives.
func TestE2EAbsurdContentLength(t *testing.T) {
	t.Parallel()
	needBinary(t)
	be := newRawBackend(t, func(c net.Conn, _ string, _ []byte) bool {
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 4611686018427387904\r\n\r\n{\"partial\":")
		return false
	})
	// The probe alone.
	probed := startRouterNoWait(t, proc.ServeArgs{Backends: []string{be.url()}, ProbeInterval: 100 * time.Millisecond})
	if _, err := pollUntil(15*time.Second, func() (bool, error) { return be.count("/health") >= 5, probed.Alive() }); err != nil {
		t.Fatalf("only %d health checks in 15 s: %v", be.count("/health"), err)
	}
	alive(t, probed)

	// A request.
	r := startRouterNoWait(t, proc.ServeArgs{Backends: []string{be.url()}, NoProbes: true})
	resp, body := postChat(t, r.url, chatBody("x", false))
	if resp.StatusCode != 502 || codeOf(body) != "upstream_response_too_large" {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	alive(t, r)
	for _, rr := range []*router{probed, r} {
		if hwm := procStatus(t, rr.Pid(), "VmHWM"); hwm > 100<<10 {
			t.Errorf("router peak RSS %d MiB", hwm>>10)
		}
	}
}

// Before: a complete (not streamed) answer was read whole into memory: 512
// MiB took the router to 548 MB RSS, 10 GiB (or 3 GiB chunked) got it
// OOM-killed. Now one over --max-buffered-response (8 MiB) is refused with
// 502 and the router's memory stays far below the body's size.
func TestE2ELargeResponseNotBuffered(t *testing.T) {
	t.Parallel()
	needBinary(t)
	const size = 256 << 20
	chunk := bytes.Repeat([]byte("x"), 64<<10)
	be := newRawBackend(t, func(c net.Conn, head string, _ []byte) bool {
		if strings.HasPrefix(head, "GET /health") {
			io.WriteString(c, healthyAnswer)
			return true
		}
		framed := chunk
		if strings.Contains(head, "chunked-please") {
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
			framed = append([]byte(fmt.Sprintf("%x\r\n", len(chunk))), append(chunk, "\r\n"...)...)
		} else {
			fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", size)
		}
		// Generated as it goes: nothing of this size is allocated here.
		for sent := 0; sent < size; sent += len(chunk) {
			if _, err := c.Write(framed); err != nil {
				return false
			}
		}
		return false
	})
	r := startRouter(t, proc.ServeArgs{Backends: []string{be.url()}})
	addr := strings.TrimPrefix(r.url, "http://")
	before := procStatus(t, r.Pid(), "VmRSS")
	for _, framing := range []string{"length", "chunked"} {
		var hdrs []string
		if framing == "chunked" {
			hdrs = []string{"X-Test: chunked-please"}
		}
		ex := rawDo(t, addr, httpReq("POST", "/v1/chat/completions", hdrs, []byte(chatBody("big", false))), 1, "POST")
		if ex.err != nil || ex.status() != 502 || ex.errorCode() != "upstream_response_too_large" {
			t.Fatalf("%s: %d %q %v", framing, ex.status(), ex.errorCode(), ex.err)
		}
	}
	alive(t, r)
	rss, hwm := procStatus(t, r.Pid(), "VmRSS"), procStatus(t, r.Pid(), "VmHWM")
	t.Logf("router RSS %d MiB before, %d MiB after two %d MiB answers (peak %d MiB)", before>>10, rss>>10, size>>20, hwm>>10)
	if hwm > 96<<10 {
		t.Fatalf("router peak RSS %d MiB for a %d MiB answer it refused", hwm>>10, size>>20)
	}
}

// Before: Upgrade: websocket was forwarded, and after the backend's 101 the
// upgraded connection went back to the pool: later clients received what
// the backend sent on it. Hop-by-hop fields were forwarded both ways. Now
// an upgrade is refused, a 101 the backend sends anyway closes its
// connection (502), and hop-by-hop fields stay on their hop.
func TestE2EUpgradeAndHopByHop(t *testing.T) {
	t.Parallel()
	needBinary(t)
	be := newRawBackend(t, func(c net.Conn, head string, body []byte) bool {
		switch {
		case strings.HasPrefix(head, "GET /health"):
			io.WriteString(c, healthyAnswer)
		case bytes.Contains(body, []byte("switch-now")):
			io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
			// Whatever comes next on this connection gets a forged answer.
			br := bufio.NewReader(c)
			for {
				if _, err := br.ReadByte(); err != nil {
					return false
				}
				io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\nPOISONED")
			}
		default:
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: X-Hop\r\nX-Hop: secret\r\nKeep-Alive: timeout=5\r\nProxy-Authenticate: Basic\r\nX-Kept: 1\r\nContent-Length: 11\r\n\r\n{\"ok\":true}")
		}
		return true
	})
	r := startRouter(t, proc.ServeArgs{Backends: []string{be.url()}, MaxConnsPerBackend: 1})
	addr := strings.TrimPrefix(r.url, "http://")
	ok := []byte(chatBody("x", false))

	ex := rawDo(t, addr, httpReq("POST", "/v1/chat/completions", []string{"Connection: Upgrade", "Upgrade: websocket"}, ok), 1, "POST")
	if ex.status() != 400 || ex.errorCode() != "upgrade_not_supported" {
		t.Fatalf("Upgrade: websocket: %d %q %v", ex.status(), ex.errorCode(), ex.err)
	}
	resp, body := postChat(t, r.url, chatBody("switch-now", false))
	if resp.StatusCode != 502 || codeOf(body) != "upstream_switched_protocols" {
		t.Fatalf("a backend's 101: %d %s", resp.StatusCode, body)
	}
	// One upstream connection at most: were the switched one pooled, every
	// request below would be written to it.
	for i := 0; i < 5; i++ {
		ex := rawDo(t, addr, httpReq("POST", "/v1/chat/completions", []string{"Connection: keep-alive, X-Client-Hop", "X-Client-Hop: c",
			"Keep-Alive: timeout=5", "Proxy-Authorization: Basic eA==", "TE: trailers"}, ok), 1, "POST")
		if ex.err != nil || ex.status() != 200 || string(ex.bodies[0]) != `{"ok":true}` {
			t.Fatalf("request %d after the 101: %d %q %v", i, ex.status(), ex.bodies, ex.err)
		}
		h := ex.resps[0].Header
		if h.Get("X-Hop") != "" || h.Get("Keep-Alive") != "" || h.Get("Proxy-Authenticate") != "" || h.Get("X-Kept") != "1" {
			t.Fatalf("response fields passed to the client: %v", h)
		}
	}
	head := be.last("/v1/chat/completions")
	for _, k := range []string{"Connection", "X-Client-Hop", "Keep-Alive", "Proxy-Authorization", "TE", "Upgrade"} {
		if v, ok := fieldOf(head, k); ok {
			t.Fatalf("request field %s: %q forwarded:\n%s", k, v, head)
		}
	}
	if v, _ := fieldOf(head, "X-Warmroute-Hops"); v != "1" {
		t.Fatalf("X-Warmroute-Hops %q, want 1", v)
	}
}

// Before: a backend address pointing at the router itself made each
// request go round about a thousand times. Now the router counts the
// routers a request passed (X-Warmroute-Hops) and answers 508 past
// --max-hops (4).
func TestE2ELoopDetected(t *testing.T) {
	t.Parallel()
	needBinary(t)
	listen := freeAddr(t)
	// Ready once its /status names listen, its only backend.
	r := startRouterUntil(t, proc.ServeArgs{Listen: listen, Backends: []string{"http://" + listen}, NoProbes: true,
		MaxConnsPerBackend: 16, MaxConnWait: 100 * time.Millisecond}, func(r *router) bool { return statusContains(r, listen) })
	start := time.Now()
	resp, body := postChat(t, r.url, chatBody("loop", false))
	if resp.StatusCode != 508 || codeOf(body) != "loop_detected" {
		t.Fatalf("%d %s after %v", resp.StatusCode, body, time.Since(start))
	}
	alive(t, r)
}

// Before: a request line in absolute form (POST http://evil.example/...)
// set the Host the backend saw. Now the backend always sees its own
// address as Host and an origin-form target.
func TestE2EAbsoluteFormTarget(t *testing.T) {
	t.Parallel()
	needBinary(t)
	be := newRawBackend(t, func(c net.Conn, head string, _ []byte) bool {
		if strings.HasPrefix(head, "GET /health") {
			io.WriteString(c, healthyAnswer)
		} else {
			io.WriteString(c, jsonAnswer)
		}
		return true
	})
	r := startRouter(t, proc.ServeArgs{Backends: []string{be.url()}})
	body := []byte(chatBody("abs", false))
	req := fmt.Sprintf("POST http://evil.example/v1/chat/completions?x=1 HTTP/1.1\r\nHost: evil.example\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	ex := rawDo(t, strings.TrimPrefix(r.url, "http://"), []byte(req), 1, "POST")
	if ex.status() != 200 {
		t.Fatalf("%d %v", ex.status(), ex.err)
	}
	head := be.last("/v1/chat/completions")
	line := strings.SplitN(head, "\r\n", 2)[0]
	host, _ := fieldOf(head, "Host")
	if host != strings.TrimPrefix(be.url(), "http://") || line != "POST /v1/chat/completions?x=1 HTTP/1.1" {
		t.Fatalf("the backend saw %q with Host %q", line, host)
	}
}

// Before: a request head with bare-LF line ends, or the bytes of a TLS
// ClientHello sent to the plain-HTTP port, got no answer until the 30 s
// read timeout (fasthttp waits for a CRLFCRLF that never comes). Now both
// are answered 400 at once and the connection closed.
func TestE2EMalformedFramingAnsweredAtOnce(t *testing.T) {
	t.Parallel()
	needBinary(t)
	be := newRawBackend(t, func(c net.Conn, head string, _ []byte) bool {
		io.WriteString(c, healthyAnswer)
		return true
	})
	r := startRouter(t, proc.ServeArgs{Backends: []string{be.url()}})
	addr := strings.TrimPrefix(r.url, "http://")
	body := chatBody("lf", false)
	hello := append([]byte{0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03, 0x03}, bytes.Repeat([]byte{0x5a}, 200)...)
	for _, tc := range []struct {
		name, req, code string
	}{
		{"bare LF", fmt.Sprintf("POST /v1/chat/completions HTTP/1.1\nHost: x\nContent-Type: application/json\nContent-Length: %d\n\n%s", len(body), body), "bad_request"},
		{"TLS ClientHello", string(hello), "tls_on_plain_http_port"},
	} {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		// Far below the 30 s read timeout.
		c.SetDeadline(time.Now().Add(5 * time.Second))
		start := time.Now()
		io.WriteString(c, tc.req)
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			c.Close()
			t.Fatalf("%s: no answer after %v: %v", tc.name, time.Since(start), err)
		}
		got, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 400 || codeOf(got) != tc.code || resp.Header.Get("Content-Type") != "application/json" {
			t.Fatalf("%s: %d %s", tc.name, resp.StatusCode, got)
		}
		if _, err := br.ReadByte(); err != io.EOF {
			t.Fatalf("%s: connection not closed: %v", tc.name, err)
		}
		c.Close()
		t.Logf("%s: 400 %s after %v", tc.name, codeOf(got), time.Since(start))
	}
	if n := be.count("/v1/chat/completions"); n != 0 {
		t.Fatalf("%d malformed requests reached the backend", n)
	}
}
