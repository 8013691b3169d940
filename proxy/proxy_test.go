package proxy

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/warmroute/warmroute/internal/backendspec"
	"github.com/warmroute/warmroute/internal/testkit"
	"github.com/warmroute/warmroute/ring"
)

// stub is a fake engine: it records requests and answers with handler.
type stub struct {
	name string
	srv  *httptest.Server
	hits atomic.Int64
}

func newStub(t *testing.T, name string, h http.HandlerFunc) *stub {
	t.Helper()
	s := &stub{name: name}
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" {
			return
		}
		s.hits.Add(1)
		w.Header().Set("X-Stub", name)
		if h != nil {
			h(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		io.Copy(io.Discard, r.Body)
		fmt.Fprintf(w, `{"id":"x","object":"chat.completion","backend":%q}`, name)
	}))
	t.Cleanup(s.srv.Close)
	return s
}

type harness struct {
	p    *Proxy
	url  string
	reg  *prometheus.Registry
	ring *ring.Ring
}

func startProxy(t *testing.T, pcfg Config, rcfg ring.Config, stubs ...*stub) *harness {
	t.Helper()
	var bs []ring.Backend
	for _, s := range stubs {
		tg, err := backendspec.ParseTarget(s.srv.URL)
		if err != nil {
			t.Fatal(err)
		}
		bs = append(bs, ring.Backend{ID: tg.HostPort, Addr: s.srv.URL})
	}
	return startProxyBackends(t, pcfg, rcfg, bs)
}

func startProxyBackends(t testing.TB, pcfg Config, rcfg ring.Config, bs []ring.Backend) *harness {
	t.Helper()
	reg := prometheus.NewRegistry()
	pcfg.Registry = reg
	p, err := New(pcfg)
	if err != nil {
		t.Fatal(err)
	}
	r, err := ring.New(rcfg, bs)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.SetRing(r, 7); err != nil {
		t.Fatal(err)
	}
	ln := listen(t)
	serve(t, p, ln)
	return &harness{p: p, url: "http://" + ln.Addr().String(), reg: reg, ring: r}
}

// dial opens a raw client connection to the router, closed when the test
// ends.
func (h *harness) dial(t *testing.T) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(h.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func testProxyConfig() Config {
	c := DefaultConfig()
	c.ProbeInterval = 50 * time.Millisecond
	c.ProbeTimeout = 500 * time.Millisecond
	c.EjectFor = time.Minute
	return c
}

func chatReq(prompt string, extra string) string {
	return fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":%q}]%s}`, prompt, extra)
}

func post(t *testing.T, url, body string, hdr ...string) (*http.Response, []byte) {
	t.Helper()
	req, _ := http.NewRequest("POST", url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, b
}

func TestForwardAndHeaders(t *testing.T) {
	a := newStub(t, "a", nil)
	h := startProxy(t, testProxyConfig(), ring.DefaultConfig(), a)
	resp, body := post(t, h.url+"/v1/chat/completions", chatReq("hello", ""))
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	if !strings.Contains(string(body), `"backend":"a"`) {
		t.Fatalf("body %s", body)
	}
	if got := resp.Header.Get(HeaderBackend); got != strings.TrimPrefix(a.srv.URL, "http://") {
		t.Errorf("%s = %q", HeaderBackend, got)
	}
	if got := resp.Header.Get(HeaderDecision); got != "affinity" {
		t.Errorf("%s = %q", HeaderDecision, got)
	}
	if got := resp.Header.Get(HeaderEpoch); got != "7" {
		t.Errorf("%s = %q", HeaderEpoch, got)
	}
	if resp.Header.Get("X-Stub") != "a" {
		t.Error("backend headers not passed through")
	}
	if n := testutil.ToFloat64(h.p.m.requests.WithLabelValues("chat", "affinity", strings.TrimPrefix(a.srv.URL, "http://"), "200")); n != 1 {
		t.Errorf("requests_total = %v", n)
	}
}

func TestBackendErrorsPassThrough(t *testing.T) {
	a := newStub(t, "a", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(429)
		io.WriteString(w, `{"error":{"message":"slow down","type":"rate_limit_error","code":"x"}}`)
	})
	h := startProxy(t, testProxyConfig(), ring.DefaultConfig(), a)
	resp, body := post(t, h.url+"/v1/completions", `{"model":"m","prompt":"x"}`)
	if resp.StatusCode != 429 || string(body) != `{"error":{"message":"slow down","type":"rate_limit_error","code":"x"}}` {
		t.Fatalf("got %d %s", resp.StatusCode, body)
	}
}

func TestStreamingIsUnbuffered(t *testing.T) {
	release := make(chan struct{})
	a := newStub(t, "a", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fl := w.(http.Flusher)
		io.WriteString(w, "data: {\"n\":1}\n\n")
		fl.Flush()
		released(release) // the second event only after the client saw the first
		for i := 2; i <= 5; i++ {
			fmt.Fprintf(w, "data: {\"n\":%d}\n\n", i)
			fl.Flush()
		}
		io.WriteString(w, "data: [DONE]\n\n")
	})
	h := startProxy(t, testProxyConfig(), ring.DefaultConfig(), a)
	req, _ := http.NewRequest("POST", h.url+"/v1/chat/completions", strings.NewReader(chatReq("stream me", `,"stream":true`)))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Errorf("content type %q", ct)
	}
	br := bufio.NewReader(resp.Body)
	got := make(chan string, 1)
	go func() {
		line, _ := br.ReadString('\n')
		got <- line
	}()
	select {
	case line := <-got:
		if line != "data: {\"n\":1}\n" {
			t.Fatalf("first line %q", line)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("first SSE event did not arrive before the stream ended: the proxy buffers")
	}
	close(release)
	rest, _ := io.ReadAll(br)
	if !strings.HasSuffix(string(rest), "data: [DONE]\n\n") || strings.Count(string(rest), "data: ") != 5 {
		t.Fatalf("rest of stream %q", rest)
	}
	waitFor(t, func() bool { return h.p.Status()[0].InFlight == 0 }, "in-flight back to 0")
}

// waitFor is testkit.WaitFor with a 10 s timeout.
func waitFor(t *testing.T, cond func() bool, what string) {
	t.Helper()
	testkit.WaitFor(t, 10*time.Second, what, cond)
}

func TestAffinity(t *testing.T) {
	stubs := []*stub{newStub(t, "a", nil), newStub(t, "b", nil), newStub(t, "c", nil), newStub(t, "d", nil)}
	h := startProxy(t, testProxyConfig(), ring.DefaultConfig(), stubs...)
	seen := map[string]string{}
	for i := 0; i < 40; i++ {
		prompt := fmt.Sprintf("conversation %d", i%8)
		// different sampling fields and suffix-free bodies: same key
		resp, _ := post(t, h.url+"/v1/chat/completions", chatReq(prompt, fmt.Sprintf(`,"temperature":0.%d`, i%10)))
		be := resp.Header.Get(HeaderBackend)
		if prev, ok := seen[prompt]; ok && prev != be {
			t.Fatalf("prompt %q went to %s then %s", prompt, prev, be)
		}
		seen[prompt] = be
	}
	distinct := map[string]bool{}
	for _, b := range seen {
		distinct[b] = true
	}
	if len(distinct) < 2 {
		t.Errorf("8 prompts all on %d backend(s)", len(distinct))
	}
}

// holdStub answers after release is closed; it counts concurrent requests.
func holdStub(t *testing.T, name string, release chan struct{}, cur *atomic.Int64) *stub {
	return newStub(t, name, func(w http.ResponseWriter, r *http.Request) {
		cur.Add(1)
		defer cur.Add(-1)
		select {
		case <-release:
		case <-r.Context().Done():
		}
		io.WriteString(w, `{}`)
	})
}

// TestThresholdHardCapWhenRacing sends as many requests for one key at
// once as the fleet has room under ConcurrencyThreshold, many times over:
// requests picked at the same moment must not both take the owner's last
// slot. Every backend ends at exactly the threshold and none falls back.
func TestThresholdHardCapWhenRacing(t *testing.T) {
	const threshold, rounds = 2, 30
	var (
		release   = make(chan struct{})
		mu        sync.Mutex
		cur, peak = map[string]int{}, map[string]int{}
		started   atomic.Int64
		stubs     []*stub
	)
	for _, name := range []string{"a", "b", "c"} {
		stubs = append(stubs, newStub(t, name, func(w http.ResponseWriter, r *http.Request) {
			io.Copy(io.Discard, r.Body)
			mu.Lock()
			cur[name]++
			peak[name] = max(peak[name], cur[name])
			rel := release
			mu.Unlock()
			started.Add(1)
			select {
			case <-rel:
			case <-r.Context().Done():
			}
			mu.Lock()
			cur[name]--
			mu.Unlock()
			io.WriteString(w, `{}`)
		}))
	}
	rcfg := ring.DefaultConfig()
	rcfg.ConcurrencyThreshold = threshold
	h := startProxy(t, testProxyConfig(), rcfg, stubs...)
	body := chatReq("one key for every request", "")
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 3 * threshold}}
	for round := 0; round < rounds; round++ {
		mu.Lock()
		release = make(chan struct{})
		mu.Unlock()
		started.Store(0)
		gate := make(chan struct{})
		decisions := make(chan string, 3*threshold)
		var wg sync.WaitGroup
		for i := 0; i < 3*threshold; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-gate
				resp, err := client.Post(h.url+"/v1/chat/completions", "application/json", strings.NewReader(body))
				if err != nil {
					decisions <- err.Error()
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				decisions <- resp.Header.Get(HeaderDecision)
			}()
		}
		close(gate)
		waitFor(t, func() bool { return started.Load() == 3*threshold }, "every request at a backend")
		mu.Lock()
		for name, n := range cur {
			if n != threshold {
				t.Errorf("round %d: %s has %d in flight, want the threshold %d (all: %v)", round, name, n, threshold, cur)
			}
		}
		close(release)
		mu.Unlock()
		wg.Wait()
		close(decisions)
		for d := range decisions {
			if d != "affinity" && d != "overflow" {
				t.Fatalf("round %d: decision %q, want affinity or overflow", round, d)
			}
		}
	}
	if t.Failed() {
		return
	}
	for name, n := range peak {
		if n > threshold {
			t.Errorf("%s peaked at %d concurrent requests, over the threshold %d", name, n, threshold)
		}
	}
}

func TestOverflowAtThreshold(t *testing.T) {
	release := make(chan struct{})
	var curs [3]atomic.Int64
	stubs := []*stub{holdStub(t, "a", release, &curs[0]), holdStub(t, "b", release, &curs[1]), holdStub(t, "c", release, &curs[2])}
	rcfg := ring.DefaultConfig()
	rcfg.ConcurrencyThreshold = 2
	h := startProxy(t, testProxyConfig(), rcfg, stubs...)
	body := chatReq("the shared prefix", "")

	type result struct{ backend, decision string }
	results := make(chan result, 4)
	var wg sync.WaitGroup
	send := func() {
		defer wg.Done()
		resp, _ := post(t, h.url+"/v1/chat/completions", body)
		results <- result{resp.Header.Get(HeaderBackend), resp.Header.Get(HeaderDecision)}
	}
	owner := func() (int, int64) {
		for i, s := range h.p.Status() {
			if s.InFlight > 0 {
				return i, s.InFlight
			}
		}
		return -1, 0
	}
	for i := 0; i < 2; i++ {
		wg.Add(1)
		go send()
	}
	waitFor(t, func() bool { _, n := owner(); return n == 2 }, "2 in flight on the owner")
	ownerIdx, _ := owner()
	ownerID := h.p.Status()[ownerIdx].ID
	wg.Add(1)
	go send()
	waitFor(t, func() bool {
		n := int64(0)
		for _, s := range h.p.Status() {
			n += s.InFlight
		}
		return n == 3
	}, "third request in flight")
	if st := h.p.Status()[ownerIdx]; st.InFlight != 2 {
		t.Fatalf("owner has %d in flight, want 2 (threshold)", st.InFlight)
	}
	close(release)
	wg.Wait()
	close(results)
	var aff, over int
	for r := range results {
		switch {
		case r.backend == ownerID && r.decision == "affinity":
			aff++
		case r.backend != ownerID && r.decision == "overflow":
			over++
		default:
			t.Errorf("unexpected result %+v (owner %s)", r, ownerID)
		}
	}
	if aff != 2 || over != 1 {
		t.Fatalf("affinity %d overflow %d, want 2 and 1", aff, over)
	}
}

func TestDeadBackendSkipped(t *testing.T) {
	a := newStub(t, "a", nil)
	b := newStub(t, "b", nil)
	c := newStub(t, "c", nil)
	cfg := testProxyConfig()
	cfg.ProbePath = "" // passive ejection only
	cfg.EjectAfter = 1
	h := startProxy(t, cfg, ring.DefaultConfig(), a, b, c)
	dead := strings.TrimPrefix(b.srv.URL, "http://")
	b.srv.Close()
	for i := 0; i < 60; i++ {
		resp, body := post(t, h.url+"/v1/chat/completions", chatReq(fmt.Sprintf("prompt %d", i), ""))
		if resp.StatusCode != 200 {
			t.Fatalf("request %d: %d %s", i, resp.StatusCode, body)
		}
		if resp.Header.Get(HeaderBackend) == dead {
			t.Fatal("routed to the dead backend")
		}
	}
	for _, s := range h.p.Status() {
		if s.ID == dead && !s.Ejected {
			t.Error("dead backend not ejected")
		}
	}
	if n := testutil.ToFloat64(h.p.m.retries.WithLabelValues(dead)); n < 1 {
		t.Errorf("retries on the dead backend = %v, want >= 1", n)
	}
}

func TestActiveHealthCheck(t *testing.T) {
	var healthy atomic.Bool
	healthy.Store(true)
	a := newStub(t, "a", nil)
	b := &stub{name: "b"}
	b.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" && !healthy.Load() {
			w.WriteHeader(503)
			return
		}
		b.hits.Add(1)
		io.WriteString(w, `{}`)
	}))
	defer b.srv.Close()
	h := startProxy(t, testProxyConfig(), ring.DefaultConfig(), a, b)
	bid := strings.TrimPrefix(b.srv.URL, "http://")
	healthy.Store(false)
	waitFor(t, func() bool {
		for _, s := range h.p.Status() {
			if s.ID == bid {
				return s.ProbeDown
			}
		}
		return false
	}, "probe to mark b down")
	b.hits.Store(0)
	for i := 0; i < 30; i++ {
		if resp, _ := post(t, h.url+"/v1/chat/completions", chatReq(fmt.Sprintf("p%d", i), "")); resp.StatusCode != 200 {
			t.Fatal(resp.StatusCode)
		}
	}
	if b.hits.Load() != 0 {
		t.Fatalf("unhealthy backend got %d requests", b.hits.Load())
	}
	healthy.Store(true)
	waitFor(t, func() bool {
		for _, s := range h.p.Status() {
			if s.ID == bid {
				return !s.ProbeDown
			}
		}
		return false
	}, "probe to mark b up")
}

func TestClientDisconnectStopsUpstream(t *testing.T) {
	upstreamDone := make(chan struct{})
	a := newStub(t, "a", func(w http.ResponseWriter, r *http.Request) {
		defer close(upstreamDone)
		w.Header().Set("Content-Type", "text/event-stream")
		fl := w.(http.Flusher)
		for i := 0; i < 100000; i++ {
			if _, err := fmt.Fprintf(w, "data: {\"token\":%d}\n\n", i); err != nil {
				return
			}
			fl.Flush()
			select {
			case <-r.Context().Done():
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
		t.Error("upstream stream ran to the end: the client disconnect did not reach it")
	})
	h := startProxy(t, testProxyConfig(), ring.DefaultConfig(), a)
	conn := h.dial(t)
	io.WriteString(conn, chatRaw("", chatReq("long generation", `,"stream":true`)))
	br := bufio.NewReader(conn)
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasPrefix(line, "data: ") {
			break
		}
	}
	conn.Close()
	waitChan(t, upstreamDone, 10*time.Second, "upstream kept streaming after the client left")
	waitAbortCounted(t, h, a)
}

func decodeError(t *testing.T, body []byte) apiErrorBody {
	t.Helper()
	var e apiError
	if err := json.Unmarshal(body, &e); err != nil || e.Error.Message == "" || e.Error.Type == "" {
		t.Fatalf("not an OpenAI error: %s (%v)", body, err)
	}
	return e.Error
}

func TestErrors(t *testing.T) {
	a := newStub(t, "a", nil)
	cfg := testProxyConfig()
	cfg.MaxBodySize = 64 << 10
	h := startProxy(t, cfg, ring.DefaultConfig(), a)
	cases := []struct {
		method, path, body string
		hdr                []string
		status             int
		code               string
	}{
		{"POST", "/v1/chat/completions", `{"model":`, nil, 400, "invalid_json"},
		{"POST", "/v1/chat/completions", `{"model":"m","messages":"x"}`, nil, 400, "invalid_request"},
		{"POST", "/v1/chat/completions", chatReq("x", ""), []string{HeaderTenant, strings.Repeat("t", 65)}, 400, "invalid_prefix_aware_id"},
		{"GET", "/v1/chat/completions", "", nil, 405, "method_not_allowed"},
		{"POST", "/v1/nope", "{}", nil, 404, "not_found"},
		{"POST", "/v1/chat/completions", chatReq(strings.Repeat("x", 70<<10), ""), nil, 413, "body_too_large"},
	}
	for _, c := range cases {
		req, _ := http.NewRequest(c.method, h.url+c.path, strings.NewReader(c.body))
		for i := 0; i+1 < len(c.hdr); i += 2 {
			req.Header.Set(c.hdr[i], c.hdr[i+1])
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", c.method, c.path, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != c.status {
			t.Errorf("%s %s: status %d, want %d (%s)", c.method, c.path, resp.StatusCode, c.status, body)
			continue
		}
		if e := decodeError(t, body); e.Code != c.code {
			t.Errorf("%s %s: code %q, want %q", c.method, c.path, e.Code, c.code)
		}
		if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
			t.Errorf("%s %s: content type %q", c.method, c.path, ct)
		}
	}
	if a.hits.Load() != 0 {
		t.Errorf("bad requests reached the backend %d times", a.hits.Load())
	}
}

func TestNoBackendAndUnreachable(t *testing.T) {
	h := startProxyBackends(t, testProxyConfig(), ring.DefaultConfig(), nil)
	resp, body := post(t, h.url+"/v1/chat/completions", chatReq("x", ""))
	if resp.StatusCode != 503 || decodeError(t, body).Code != "no_healthy_backend" {
		t.Fatalf("empty ring: %d %s", resp.StatusCode, body)
	}
	for _, path := range []string{"/readyz", "/ping"} {
		r, err := http.Get(h.url + path)
		if err != nil {
			t.Fatal(err)
		}
		r.Body.Close()
		if r.StatusCode != 503 {
			t.Errorf("%s with no backend: %d", path, r.StatusCode)
		}
	}

	// Two backends that refuse connections: 502 after trying both.
	var bs []ring.Backend
	for _, addr := range refusedAddrs(t, 2) {
		bs = append(bs, ring.Backend{ID: addr, Addr: "http://" + addr})
	}
	cfg := testProxyConfig()
	cfg.ProbePath = ""
	h2 := startProxyBackends(t, cfg, ring.DefaultConfig(), bs)
	resp, body = post(t, h2.url+"/v1/chat/completions", chatReq("x", ""))
	if resp.StatusCode != 502 || decodeError(t, body).Code != "backend_unreachable" {
		t.Fatalf("unreachable: %d %s", resp.StatusCode, body)
	}
}

func TestFirstByteTimeout(t *testing.T) {
	a := newStub(t, "a", func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body) // net/http notices a closed client only after the body was read
		select {
		case <-r.Context().Done():
		case <-time.After(10 * time.Second):
		}
	})
	cfg := testProxyConfig()
	cfg.FirstByteTimeout = 200 * time.Millisecond
	cfg.ProbePath = ""
	h := startProxy(t, cfg, ring.DefaultConfig(), a)
	resp, body := post(t, h.url+"/v1/chat/completions", chatReq("x", ""))
	if resp.StatusCode != 504 || decodeError(t, body).Code != "upstream_timeout" {
		t.Fatalf("got %d %s", resp.StatusCode, body)
	}
	if a.hits.Load() != 1 {
		t.Fatalf("a timed-out request was retried: %d hits", a.hits.Load())
	}
}

func TestHealthEndpoints(t *testing.T) {
	a := newStub(t, "a", nil)
	h := startProxy(t, testProxyConfig(), ring.DefaultConfig(), a)
	for path, want := range map[string]int{"/healthz": 200, "/readyz": 200, "/ping": 200} {
		r, err := http.Get(h.url + path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(r.Body)
		r.Body.Close()
		if r.StatusCode != want {
			t.Errorf("%s: %d", path, r.StatusCode)
		}
		if path == "/ping" && len(b) != 0 {
			t.Errorf("/ping body %q, want empty", b)
		}
	}
	r, err := http.Get(h.url + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	r.Body.Close()
	if r.StatusCode != 200 || r.Header.Get(HeaderBackend) == "" {
		t.Fatalf("/v1/models: %v", r)
	}
}
