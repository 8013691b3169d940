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
	"syscall"
	"testing"
	"time"

	"github.com/warmroute/warmroute/loadtest/proc"
)

// The bad-input matrix and the limits, end to end: the real binary in front
// of real gpusim instances (`warmroute gpusim`), spoken to over raw
// sockets so that every byte on the wire is the test's. docs/hardening.md
// holds the same matrix as a table.

// exchange is one raw HTTP exchange's outcome.
type exchange struct {
	resps  []*http.Response
	bodies [][]byte
	// closed: the router closed the connection after the responses (EOF
	// or reset on the next read).
	closed bool
	err    error
}

func (e exchange) status() int {
	if len(e.resps) == 0 {
		return 0
	}
	return e.resps[0].StatusCode
}

// errorCode returns the OpenAI error code of the first response, or "".
func (e exchange) errorCode() string {
	if len(e.bodies) == 0 {
		return ""
	}
	var v struct {
		Error struct {
			Code any    `json:"code"`
			Type string `json:"type"`
		} `json:"error"`
	}
	if json.Unmarshal(e.bodies[0], &v) != nil {
		return ""
	}
	switch c := v.Error.Code.(type) {
	case string:
		return c
	case float64:
		return strconv.Itoa(int(c))
	}
	return ""
}

// rawDo writes req (from a goroutine, so a large body and an early answer
// do not deadlock) and reads want responses, then checks whether the
// connection was closed.
func rawDo(t *testing.T, addr string, req []byte, want int, method string) exchange {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second))
	werr := make(chan error, 1)
	go func() {
		_, err := c.Write(req)
		werr <- err
	}()
	var ex exchange
	br := bufio.NewReader(c)
	for i := 0; i < want; i++ {
		resp, err := http.ReadResponse(br, &http.Request{Method: method})
		if err != nil {
			ex.err = err
			break
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		ex.resps = append(ex.resps, resp)
		ex.bodies = append(ex.bodies, b)
		if err != nil {
			ex.err = err
			break
		}
	}
	if ex.err == nil {
		c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
		var one [1]byte
		_, err := br.Read(one[:])
		var ne net.Error
		ex.closed = !(errors_As(err, &ne) && ne.Timeout())
	}
	return ex
}

func errors_As(err error, target *net.Error) bool {
	if err == nil {
		return false
	}
	ne, ok := err.(net.Error)
	if ok {
		*target = ne
	}
	return ok
}

func httpReq(method, path string, hdrs []string, body []byte) []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, "%s %s HTTP/1.1\r\nHost: router\r\n", method, path)
	hasCT, hasLen := false, false
	for _, h := range hdrs {
		b.WriteString(h + "\r\n")
		lh := strings.ToLower(h)
		hasCT = hasCT || strings.HasPrefix(lh, "content-type:") || strings.HasPrefix(lh, "x-no-ct")
		hasLen = hasLen || strings.HasPrefix(lh, "content-length:") || strings.HasPrefix(lh, "transfer-encoding:")
	}
	if !hasCT {
		b.WriteString("Content-Type: application/json\r\n")
	}
	if !hasLen && body != nil {
		fmt.Fprintf(&b, "Content-Length: %d\r\n", len(body))
	}
	b.WriteString("\r\n")
	b.Write(body)
	return b.Bytes()
}

func chatJSON(model, content string) []byte {
	b, _ := json.Marshal(map[string]any{"model": model, "max_tokens": 4,
		"messages": []map[string]any{{"role": "user", "content": content}}})
	return b
}

// metric reads one sample from the router's admin /metrics.
func metric(t *testing.T, r *router, name string) float64 {
	t.Helper()
	v, err := adminMetric(http.DefaultClient, r.admin, name)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// secret is sent inside malformed requests; it must never appear in the
// router's logs.
const secret = "sk-TESTSECRET-5e1f"

// badCase is one row of the bad-input matrix (docs/hardening.md).
type badCase struct {
	name   string
	req    []byte
	n      int    // responses expected (pipelining)
	status int    // expected status of every response
	code   string // expected OpenAI error code ("" for a success)
	closed bool   // the router closes the connection after answering
}

func badInputCases() []badCase {
	ok := chatJSON(gpusimModel, "hello "+secret)
	post := func(body []byte, hdrs ...string) []byte { return httpReq("POST", "/v1/chat/completions", hdrs, body) }
	nested := `{"model":"m","messages":[{"role":"user","content":"hi"}],"x":` + strings.Repeat("[", 100000) + strings.Repeat("]", 100000) + `}`
	big10 := chatJSON(gpusimModel, strings.Repeat("a", 10<<20))
	big100 := make([]byte, 100<<20)
	copy(big100, `{"model":"m","messages":[{"role":"user","content":"`)
	for i := 52; i < len(big100)-4; i++ {
		big100[i] = 'a'
	}
	copy(big100[len(big100)-4:], `"}]}`)
	chunked := fmt.Sprintf("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n%x\r\n%s\r\n0\r\n\r\n", 10, ok[:10], len(ok)-10, ok[10:])
	manyHeaders := make([]string, 0, 1000)
	for i := 0; i < 1000; i++ {
		manyHeaders = append(manyHeaders, fmt.Sprintf("X-H%d: %s", i, secret))
	}
	return []badCase{
		{"valid request", post(ok), 1, 200, "", false},
		{"malformed JSON", post([]byte(`{"messages":[{"role":"user",}],"k":"` + secret + `"}`)), 1, 400, "invalid_json", false},
		{"truncated JSON", post(ok[:len(ok)/2]), 1, 400, "invalid_json", false},
		{"empty body", post([]byte{}), 1, 400, "invalid_json", false},
		{"body not an object", post([]byte(`["` + secret + `"]`)), 1, 400, "invalid_request", false},
		{"messages not an array", post([]byte(`{"model":"m","messages":"` + secret + `"}`)), 1, 400, "invalid_request", false},
		{"content an object", post([]byte(`{"model":"m","messages":[{"role":"user","content":{"k":"` + secret + `"}}]}`)), 1, 400, "invalid_request", false},
		{"empty messages", post([]byte(`{"model":"m","messages":[]}`)), 1, 400, "invalid_request", false},
		{"message without role", post([]byte(`{"model":"m","messages":[{"content":"hi"}]}`)), 1, 400, "invalid_request", false},
		{"invalid UTF-8 in content", post([]byte("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"caf\xe9 " + secret + "\"}]}")), 1, 400, "invalid_json", false},
		{"invalid escape in content", post([]byte(`{"model":"m","messages":[{"role":"user","content":"\q"}]}`)), 1, 400, "invalid_json", false},
		{"nested 100000 deep", post([]byte(nested)), 1, 400, "json_too_deep", false},
		{"10 MB body (engine refuses its length)", post(big10), 1, 400, "400", false},
		{"100 MB body", post(big100), 1, 413, "body_too_large", true},
		{"missing Content-Type", post(ok, "X-No-Ct: 1"), 1, 200, "", false},
		{"chunked request body", []byte(chunked), 1, 200, "", false},
		{"20 KiB header", post(ok, "X-Big: "+strings.Repeat("b", 20<<10)), 1, 431, "headers_too_large", true},
		{"1000 headers", post(ok, manyHeaders...), 1, 431, "headers_too_large", true},
		{"header line without colon", post(ok, "X-"+secret+" broken"), 1, 400, "bad_request", true},
		{"Prefix-Aware-Id of 65 chars", post(ok, "X-Amzn-SageMaker-Prefix-Aware-Id: "+strings.Repeat("t", 65)), 1, 400, "invalid_prefix_aware_id", false},
		{"Prefix-Aware-Id non-ASCII", post(ok, "X-Amzn-SageMaker-Prefix-Aware-Id: t\xc3\xa9"), 1, 400, "invalid_prefix_aware_id", false},
		{"Prefix-Aware-Id with DEL", post(ok, "X-Amzn-SageMaker-Prefix-Aware-Id: t\x7f"), 1, 400, "bad_request", true},
		{"Prefix-Aware-Id with a control char", post(ok, "X-Amzn-SageMaker-Prefix-Aware-Id: t\x01"), 1, 400, "bad_request", true},
		{"empty Prefix-Aware-Id", post(ok, "X-Amzn-SageMaker-Prefix-Aware-Id:"), 1, 400, "invalid_prefix_aware_id", false},
		{"prompt_cache_key not a string", post([]byte(`{"model":"m","prompt_cache_key":1,"messages":[{"role":"user","content":"hi"}]}`)), 1, 400, "invalid_request", false},
		{"unknown model (the router's 404)", post(chatJSON("no-such-model", "hi")), 1, 404, "model_not_found", false},
		{"HTTP/1.0", []byte(fmt.Sprintf("POST /v1/chat/completions HTTP/1.0\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(ok), ok)), 1, 200, "", true},
		{"3 pipelined requests", bytes.Repeat(post(ok), 3), 3, 200, "", false},
		{"pipelined, the 2nd malformed", append(append(post(ok), post([]byte(`{"messages":`))...), post(ok)...), 3, 0, "", false},
		{"Content-Length and chunked", []byte(fmt.Sprintf("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n", len(ok), ok)), 1, 200, "", true},
		{"Content-Length not a number", []byte("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + secret + "\r\nContent-Length: zz\r\n\r\n"), 1, 400, "bad_request", true},
		{"not HTTP", []byte(secret + "\r\n\r\n"), 1, 400, "bad_request", true},
		{"GET on a POST route", httpReq("GET", "/v1/chat/completions", nil, nil), 1, 405, "method_not_allowed", false},
		{"unknown path", httpReq("POST", "/v2/"+secret, nil, ok), 1, 404, "not_found", false},
	}
}

// TestE2EBadInputMatrix sends every case of the matrix to the real binary
// and checks the status, the OpenAI error code and whether the connection
// is closed; then that the router still serves, that its goroutines are
// back to where they were, and that nothing of the requests reached its
// logs.
func TestE2EBadInputMatrix(t *testing.T) {
	t.Parallel()
	needBinary(t)
	be := startGpusim(t)
	// The logs are read once the router has stopped: this cleanup runs
	// after startRouter's, which waits for the process and its output.
	var r *router
	t.Cleanup(func() {
		if r == nil {
			return
		}
		if n := r.Output().Dropped(); n > 0 {
			t.Errorf("%d bytes of the router's logs were not kept, so not searched", n)
		}
		if strings.Contains(r.Logs(), secret) {
			t.Errorf("request bytes reached the router's logs:\n%s", r.Logs())
		}
	})
	r = startRouter(t, proc.ServeArgs{Backends: []string{be}})
	addr := strings.TrimPrefix(r.url, "http://")
	ok := chatJSON(gpusimModel, "warm up")
	if ex := rawDo(t, addr, httpReq("POST", "/v1/chat/completions", nil, ok), 1, "POST"); ex.status() != 200 {
		t.Fatalf("warm-up: %d %v", ex.status(), ex.err)
	}
	// The router answers an unknown model itself once it has read what
	// the backend serves (its /v1/models, within a second or so).
	if _, err := pollUntil(15*time.Second, func() (bool, error) {
		ex := rawDo(t, addr, httpReq("POST", "/v1/chat/completions", nil, chatJSON("no-such-model", "hi")), 1, "POST")
		return ex.errorCode() == "model_not_found", nil
	}); err != nil {
		t.Fatalf("the router never learned its backend's models: %v", err)
	}
	base := metric(t, r, "go_goroutines")
	var rows []string
	for _, c := range badInputCases() {
		method := "POST"
		if bytes.HasPrefix(c.req, []byte("GET")) {
			method = "GET"
		}
		ex := rawDo(t, addr, c.req, c.n, method)
		if ex.err != nil || len(ex.resps) != c.n {
			t.Errorf("%s: %d responses, want %d (%v)", c.name, len(ex.resps), c.n, ex.err)
			continue
		}
		var sts []string
		for i, resp := range ex.resps {
			sts = append(sts, strconv.Itoa(resp.StatusCode))
			want := c.status
			if c.status == 0 { // the pipelined mix: 200, 400, 200
				want = []int{200, 400, 200}[i]
			}
			if resp.StatusCode != want {
				t.Errorf("%s: response %d status %d, want %d: %s", c.name, i, resp.StatusCode, want, ex.bodies[i])
			}
			if resp.StatusCode >= 400 && resp.Header.Get("Content-Type") != "application/json" {
				t.Errorf("%s: error content type %q", c.name, resp.Header.Get("Content-Type"))
			}
		}
		if got := ex.errorCode(); got != c.code {
			t.Errorf("%s: code %q, want %q: %.300s", c.name, got, c.code, ex.bodies[0])
		}
		if ex.closed != c.closed {
			t.Errorf("%s: connection closed %v, want %v", c.name, ex.closed, c.closed)
		}
		code := ex.errorCode()
		if code == "" {
			code = "-"
		}
		rows = append(rows, fmt.Sprintf("| %s | %s | %s | %v |", c.name, strings.Join(sts, ", "), code, ex.closed))
	}
	t.Logf("the matrix as observed:\n| case | status | error code | closed |\n|---|---|---|---|\n%s", strings.Join(rows, "\n"))

	// Still serving, and nothing left running.
	if ex := rawDo(t, addr, httpReq("POST", "/v1/chat/completions", nil, ok), 1, "POST"); ex.status() != 200 {
		t.Fatalf("after the matrix: %d %v", ex.status(), ex.err)
	}
	var n float64
	if _, err := pollUntil(20*time.Second, func() (bool, error) {
		n = metric(t, r, "go_goroutines")
		return n <= base+2, nil
	}); err != nil {
		t.Fatalf("router goroutines %v, want at most %v (a leak): %v", n, base+2, err)
	}
	t.Logf("router goroutines: %v before the matrix, %v after", base, n)
}

// trickle writes p one byte every gap until the router answers (done
// closes) or p ends; it reports whether the router answered first.
func trickle(c net.Conn, p []byte, gap time.Duration, done <-chan struct{}) bool {
	for i := range p {
		select {
		case <-done:
			return true
		case <-time.After(gap):
		}
		if _, err := c.Write(p[i : i+1]); err != nil {
			return true
		}
	}
	select {
	case <-done:
		return true
	default:
		return false
	}
}

// readAnswer reads one response from c in the background.
func readAnswer(c net.Conn) (<-chan struct{}, *exchange) {
	done := make(chan struct{})
	ex := &exchange{}
	go func() {
		defer close(done)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			ex.err = err
			return
		}
		b, _ := io.ReadAll(resp.Body)
		ex.resps, ex.bodies = append(ex.resps, resp), append(ex.bodies, b)
	}()
	return done, ex
}

// A client trickling its headers, or its body, is cut at --read-timeout
// with 408; an idle keep-alive connection is closed at --idle-timeout.
func TestE2ESlowClientsCut(t *testing.T) {
	t.Parallel()
	needBinary(t)
	e := newEngine(t, 0, 0, 1)
	r := startRouter(t, proc.ServeArgs{Backends: []string{e.srv.URL}, ReadTimeout: time.Second, IdleTimeout: time.Second})
	addr := strings.TrimPrefix(r.url, "http://")
	body := []byte(chatBody("slow", false))
	head := fmt.Sprintf("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n", len(body))
	for _, tc := range []struct {
		name        string
		first, rest []byte
	}{
		{"headers", []byte("POST /v1/chat/completions HTTP/1.1\r\n"), []byte(head[len("POST /v1/chat/completions HTTP/1.1\r\n"):] + strings.Repeat("X-Slow: 1\r\n", 20))},
		{"body", []byte(head + "\r\n"), body},
	} {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(60 * time.Second))
		c.Write(tc.first)
		done, ex := readAnswer(c)
		// 100 ms a byte: the trickle lasts far longer than the 1 s limit.
		if !trickle(c, tc.rest, 100*time.Millisecond, done) {
			t.Fatalf("slow %s: the router waited for all %d trickled bytes", tc.name, len(tc.rest))
		}
		<-done
		c.Close()
		if ex.status() != 408 || ex.errorCode() != "request_timeout" {
			t.Fatalf("slow %s: %d %q %v", tc.name, ex.status(), ex.errorCode(), ex.err)
		}
	}

	// Idle keep-alive: closed after about --idle-timeout, long before the
	// 30 s read deadline here.
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second))
	c.Write(httpReq("POST", "/v1/chat/completions", nil, body))
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	io.ReadAll(resp.Body)
	if _, err := br.ReadByte(); err != io.EOF {
		t.Fatalf("idle connection: %v, want EOF from the router closing it", err)
	}
}

// Connections over --max-conns get an OpenAI-style 503.
func TestE2EMaxConns(t *testing.T) {
	t.Parallel()
	needBinary(t)
	e := newEngine(t, 0, 0, 1)
	r := startRouter(t, proc.ServeArgs{Backends: []string{e.srv.URL}, MaxConns: 3})
	addr := strings.TrimPrefix(r.url, "http://")
	// The readiness checks' connections count until the router sees them
	// closed.
	if _, err := pollUntil(10*time.Second, func() (bool, error) {
		return metric(t, r, "warmroute_client_connections") == 0, nil
	}); err != nil {
		t.Fatalf("client connections still open: %v", err)
	}
	req := httpReq("POST", "/v1/chat/completions", nil, []byte(chatBody("x", false)))
	var held []net.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	for i := 0; i < 3; i++ {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
		c.SetDeadline(time.Now().Add(10 * time.Second))
		c.Write(req)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("connection %d within the limit: %v %v", i, err, resp)
		}
		io.ReadAll(resp.Body)
	}
	for i := 0; i < 3; i++ {
		ex := rawDo(t, addr, req, 1, "POST")
		if ex.status() != 503 || ex.errorCode() != "too_many_connections" || !ex.closed {
			t.Fatalf("over the limit: %d %q closed=%v %v", ex.status(), ex.errorCode(), ex.closed, ex.err)
		}
	}
	if n := metric(t, r, "warmroute_client_connections_rejected_total"); n != 3 {
		t.Errorf("rejections counted %v, want 3", n)
	}
}

// blackhole returns a loopback address whose accept queue is full, so a
// connect to it hangs until the dialler gives up (SYNs are dropped).
func blackhole(t *testing.T) string {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Skip("no raw sockets:", err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	sa, _ := syscall.Getsockname(fd)
	addr := fmt.Sprintf("127.0.0.1:%d", sa.(*syscall.SockaddrInet4).Port)
	for i := 0; i < 16; i++ {
		c, err := net.DialTimeout("tcp", addr, 300*time.Millisecond)
		if err != nil {
			return addr // the queue is full
		}
		t.Cleanup(func() { c.Close() })
	}
	t.Skip("could not fill the accept queue")
	return ""
}

// Upstream limits: a backend that cannot be connected to is given up at
// --connect-timeout (502); one that does not answer at --first-byte-timeout
// (504); a stream that stalls is cut at --stream-idle-timeout (with an
// error event); a backend
// at --max-conns-per-backend makes requests wait --max-conn-wait, then 503.
func TestE2EUpstreamLimits(t *testing.T) {
	t.Parallel()
	needBinary(t)
	t.Run("connect timeout", func(t *testing.T) {
		r := startRouterNoWait(t, proc.ServeArgs{Backends: []string{"http://" + blackhole(t)}, ConnectTimeout: 200 * time.Millisecond, NoProbes: true})
		start := time.Now()
		resp, b := postChat(t, r.url, chatBody("x", false))
		// The default connect timeout is 2 s: well above what is allowed.
		if took := time.Since(start); resp.StatusCode != 502 || took > 1900*time.Millisecond {
			t.Fatalf("%d %s after %v", resp.StatusCode, b, took)
		}
	})
	t.Run("first byte timeout", func(t *testing.T) {
		e := newEngine(t, 0, 0, 1)
		h := make(chan struct{})
		e.hold.Store(&h)
		defer close(h)
		r := startRouter(t, proc.ServeArgs{Backends: []string{e.srv.URL}, FirstByteTimeout: 300 * time.Millisecond})
		resp, b := postChat(t, r.url, chatBody("x", false))
		if resp.StatusCode != 504 || !strings.Contains(string(b), "upstream_timeout") {
			t.Fatalf("%d %s", resp.StatusCode, b)
		}
	})
	t.Run("stream idle timeout", func(t *testing.T) {
		e := newEngine(t, 0, 5*time.Second, 3)
		r := startRouter(t, proc.ServeArgs{Backends: []string{e.srv.URL}, StreamIdleTimeout: 300 * time.Millisecond})
		start := time.Now()
		resp, err := http.Post(r.url+"/v1/chat/completions", "application/json", strings.NewReader(chatBody("s", true)))
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		// Cut after the first event, well before the 5 s gap: the client
		// gets an OpenAI-style error event and a clean end, no [DONE].
		if resp.StatusCode != 200 || err != nil || strings.Count(string(b), "data: ") != 2 ||
			!strings.Contains(string(b), `"code":"upstream_stream_failed"`) || strings.Contains(string(b), "[DONE]") ||
			time.Since(start) > 4*time.Second {
			t.Fatalf("%d %q %v after %v", resp.StatusCode, b, err, time.Since(start))
		}
		waitAborted(t, e, "the engine was not told the stream was cut")
	})
	t.Run("connections per backend", func(t *testing.T) {
		e := newEngine(t, 0, 0, 1)
		h := make(chan struct{})
		e.hold.Store(&h)
		r := startRouter(t, proc.ServeArgs{Backends: []string{e.srv.URL}, MaxConnsPerBackend: 1, MaxConnWait: 300 * time.Millisecond})
		heldDone := make(chan struct{})
		go func() {
			defer close(heldDone)
			if resp, err := http.Post(r.url+"/v1/chat/completions", "application/json", strings.NewReader(chatBody("a", false))); err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}()
		defer func() { close(h); <-heldDone }()
		waitHeld(t, []*sseEngine{e}, 1)
		start := time.Now()
		resp, b := postChat(t, r.url, chatBody("b", false))
		if took := time.Since(start); resp.StatusCode != 503 || !strings.Contains(string(b), "backends_saturated") || took < 300*time.Millisecond {
			t.Fatalf("%d %s after %v", resp.StatusCode, b, took)
		}
	})
}

func postChat(t *testing.T, url, body string) (*http.Response, []byte) {
	t.Helper()
	resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, b
}

// A client that stops reading a stream is cut at --write-timeout and the
// engine is told.
func TestE2EClientStopsReading(t *testing.T) {
	t.Parallel()
	needBinary(t)
	e := newEngine(t, 0, 0, 1<<30)
	r := startRouter(t, proc.ServeArgs{Backends: []string{e.srv.URL}, WriteTimeout: 500 * time.Millisecond})
	c, err := net.Dial("tcp", strings.TrimPrefix(r.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Write(httpReq("POST", "/v1/chat/completions", nil, []byte(chatBody("s", true))))
	waitAborted(t, e, "the engine still streams to a client that stopped reading")
}

// Two tenants with the same prompt get different routing keys, whether the
// tenant comes from the Prefix-Aware-Id header or prompt_cache_key; the
// same tenant by either means gets the same key.
func TestE2ETenantsRoutedIndependently(t *testing.T) {
	t.Parallel()
	needBinary(t)
	be := startGpusim(t)
	r := startRouter(t, proc.ServeArgs{Backends: []string{be}})
	prompt := strings.Repeat("The same long system prompt for every tenant. ", 50)
	explain := func(body, tenant string) string {
		t.Helper()
		req, _ := http.NewRequest("POST", r.admin+"/debug/route/v1/chat/completions", strings.NewReader(body))
		if tenant != "" {
			req.Header.Set("X-Amzn-SageMaker-Prefix-Aware-Id", tenant)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var v struct {
			Key string `json:"key"`
		}
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 || json.Unmarshal(b, &v) != nil || v.Key == "" {
			t.Fatalf("explain: %d %s", resp.StatusCode, b)
		}
		return v.Key
	}
	body := func(cacheKey string) string {
		m := map[string]any{"model": gpusimModel, "messages": []map[string]string{{"role": "user", "content": prompt}}}
		if cacheKey != "" {
			m["prompt_cache_key"] = cacheKey
		}
		b, _ := json.Marshal(m)
		return string(b)
	}
	none := explain(body(""), "")
	aHdr, bHdr := explain(body(""), "tenant-a"), explain(body(""), "tenant-b")
	aKey, bKey := explain(body("tenant-a"), ""), explain(body("tenant-b"), "")
	t.Logf("routing keys: no tenant %s, A %s / %s, B %s / %s", none, aHdr, aKey, bHdr, bKey)
	if aHdr == bHdr || aKey == bKey || aHdr == none || bHdr == none {
		t.Fatalf("tenants share a key: none %s A %s B %s (header), A %s B %s (prompt_cache_key)", none, aHdr, bHdr, aKey, bKey)
	}
	if aHdr != aKey || bHdr != bKey {
		t.Fatalf("the same tenant by header and by prompt_cache_key differs: %s/%s %s/%s", aHdr, aKey, bHdr, bKey)
	}
	// The header wins over prompt_cache_key, as SageMaker documents.
	if k := explain(body("tenant-b"), "tenant-a"); k != aHdr {
		t.Fatalf("header and prompt_cache_key together: %s, want the header's %s", k, aHdr)
	}
	// And real requests of both tenants are served.
	for _, tenant := range []string{"tenant-a", "tenant-b"} {
		req, _ := http.NewRequest("POST", r.url+"/v1/chat/completions", strings.NewReader(body("")))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Amzn-SageMaker-Prefix-Aware-Id", tenant)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || resp.Header.Get("X-Warmroute-Decision") == "" {
			t.Fatalf("tenant %s: %d", tenant, resp.StatusCode)
		}
	}
}
