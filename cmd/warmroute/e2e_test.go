package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warmroute/warmroute/loadtest/proc"
)

// The end-to-end tests run the real binary against stub engines on
// loopback. Set WARMROUTE_SKIP_E2E=1 to skip them, or WARMROUTE_E2E_BIN to
// a warmroute binary to run them against that build instead of this tree's
// (an older release, say, to see which tests it fails).

var binPath string

func TestMain(m *testing.M) {
	code := func() int {
		if os.Getenv("WARMROUTE_SKIP_E2E") != "" {
			return m.Run()
		}
		dir, err := os.MkdirTemp("", "warmroute-e2e")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		if binPath, err = proc.Binary(dir); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		return m.Run()
	}()
	os.Exit(code)
}

func needBinary(t *testing.T) {
	t.Helper()
	if binPath == "" {
		t.Skip("WARMROUTE_SKIP_E2E is set")
	}
}

// freeAddr returns a loopback address free right now.
func freeAddr(t *testing.T) string {
	t.Helper()
	for range 100 {
		addrs, err := proc.FreeAddrs("127.0.0.1", 1)
		if err != nil {
			t.Fatal(err)
		}
		if handOut(addrs[0]) {
			return addrs[0]
		}
	}
	t.Fatal("freeAddr: every free port drawn was handed out before")
	return ""
}

// handedOut holds the addresses freeAddr gave this test binary's tests.
// FreeAddrs draws free ports at random, so two tests running in parallel
// could each get one that was free when they asked, and the second process
// to bind it fail; handing each address out once rules that out between
// the tests of this binary.
var handedOut = struct {
	sync.Mutex
	m map[string]bool
}{m: map[string]bool{}}

// handOut records addr as handed out, and reports whether it was not
// before.
func handOut(addr string) bool {
	handedOut.Lock()
	defer handedOut.Unlock()
	if handedOut.m[addr] {
		return false
	}
	handedOut.m[addr] = true
	return true
}

// sseEngine is a stub engine: after firstDelay it streams n SSE events gap
// apart. It reports finished and cancelled streams.
type sseEngine struct {
	srv                 *httptest.Server
	firstDelay, gap     time.Duration
	n                   int
	hits, done, aborted atomic.Int64
	hold                atomic.Pointer[chan struct{}] // when set, answers wait for it
	cur, peak           atomic.Int64
}

func newEngine(t *testing.T, firstDelay, gap time.Duration, n int) *sseEngine {
	e := &sseEngine{firstDelay: firstDelay, gap: gap, n: n}
	e.srv = httptest.NewServer(http.HandlerFunc(e.serve))
	t.Cleanup(e.srv.Close)
	return e
}

func (e *sseEngine) addr() string { return strings.TrimPrefix(e.srv.URL, "http://") }

func (e *sseEngine) serve(w http.ResponseWriter, r *http.Request) {
	// Health probes, the router's engine-metrics scrapes and its model-list
	// polls are answered at once and not counted: a held poll would pass
	// for a held request (TestE2EUpstreamLimits waits for one before it
	// sends the next), and a counted one for a routed request
	// (TestE2ENotReadyWhenRefused).
	if r.URL.Path == "/health" || r.URL.Path == "/metrics" || r.URL.Path == "/v1/models" {
		return
	}
	e.hits.Add(1)
	if c := e.cur.Add(1); c > e.peak.Load() {
		e.peak.Store(c)
	}
	defer e.cur.Add(-1)
	body, _ := io.ReadAll(r.Body)
	if h := e.hold.Load(); h != nil {
		select {
		case <-*h:
		case <-r.Context().Done():
			return
		}
	}
	if !strings.Contains(string(body), `"stream":true`) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"object":"chat.completion","choices":[{"message":{"content":"ok"}}]}`)
		e.done.Add(1)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	fl := w.(http.Flusher)
	select {
	case <-time.After(e.firstDelay):
	case <-r.Context().Done():
		e.aborted.Add(1)
		return
	}
	for i := 0; i < e.n; i++ {
		if i > 0 {
			select {
			case <-time.After(e.gap):
			case <-r.Context().Done():
				e.aborted.Add(1)
				return
			}
		}
		if _, err := fmt.Fprintf(w, "data: {\"choices\":[{\"delta\":{\"content\":\"t%d\"}}]}\n\n", i); err != nil {
			e.aborted.Add(1)
			return
		}
		fl.Flush()
	}
	io.WriteString(w, "data: [DONE]\n\n")
	e.done.Add(1)
}

// waitAborted waits until the engine saw a stream cut off, and fails the
// test with msg if it does not within 30 s.
func waitAborted(t *testing.T, e *sseEngine, msg string) {
	t.Helper()
	if _, err := pollUntil(30*time.Second, func() (bool, error) { return e.aborted.Load() > 0, nil }); err != nil {
		t.Fatalf("%s: %v", msg, err)
	}
}

func chatBody(prompt string, stream bool) string {
	return fmt.Sprintf(`{"model":"m","stream":%v,"messages":[{"role":"user","content":%q}]}`, stream, prompt)
}

// firstChunk sends a streamed request and returns the time to the first
// SSE event, the events' arrival times and the response headers.
func firstChunk(t *testing.T, url, prompt string) (time.Duration, []time.Duration, http.Header) {
	t.Helper()
	start := time.Now()
	resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(chatBody(prompt, true)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	var arrivals []time.Duration
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "data: ") {
			arrivals = append(arrivals, time.Since(start))
		}
	}
	return arrivals[0], arrivals, resp.Header
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

// TestE2EStreamingThroughRouter runs alone (not in parallel): it compares
// first-event latency with and without the router.
func TestE2EStreamingThroughRouter(t *testing.T) {
	needBinary(t)
	e := newEngine(t, 40*time.Millisecond, 20*time.Millisecond, 10)
	r := startRouter(t, proc.ServeArgs{Backends: []string{e.srv.URL}})
	var direct, routed []time.Duration
	for i := 0; i < 15; i++ {
		d, _, _ := firstChunk(t, e.srv.URL, fmt.Sprintf("prompt %d", i))
		direct = append(direct, d)
		f, arrivals, hdr := firstChunk(t, r.url, fmt.Sprintf("prompt %d", i))
		routed = append(routed, f)
		if hdr.Get("X-Warmroute-Backend") != e.addr() {
			t.Fatalf("backend header %q", hdr.Get("X-Warmroute-Backend"))
		}
		// Chunk by chunk: events arrive spread over the stream, not at once.
		if len(arrivals) != 11 || arrivals[len(arrivals)-1]-arrivals[0] < 150*time.Millisecond {
			t.Fatalf("events arrived together (buffered): %v", arrivals)
		}
	}
	dm, rm := median(direct), median(routed)
	t.Logf("first SSE event: direct p50 %v, through the router p50 %v (delta %v)", dm, rm, rm-dm)
	if rm-dm > 5*time.Millisecond {
		t.Errorf("router adds %v to the first chunk, want < 5ms", rm-dm)
	}
}

func TestE2EAffinityOverflowAndFailover(t *testing.T) {
	t.Parallel()
	needBinary(t)
	var engines []*sseEngine
	var urls []string
	for i := 0; i < 4; i++ {
		e := newEngine(t, 0, 0, 1)
		engines = append(engines, e)
		urls = append(urls, e.srv.URL)
	}
	r := startRouter(t, proc.ServeArgs{Backends: urls, ConcurrencyThreshold: 3})

	// Affinity: each prompt always lands on the same backend, whatever the
	// sampling fields.
	where := map[string]string{}
	for round := 0; round < 3; round++ {
		for p := 0; p < 16; p++ {
			prompt := fmt.Sprintf("shared document %d", p)
			body := fmt.Sprintf(`{"temperature":0.%d,"messages":[{"role":"user","content":%q}],"model":"m"}`, round, prompt)
			resp, err := http.Post(r.url+"/v1/chat/completions", "application/json", strings.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			b := resp.Header.Get("X-Warmroute-Backend")
			if prev, ok := where[prompt]; ok && prev != b {
				t.Fatalf("%q moved from %s to %s", prompt, prev, b)
			}
			where[prompt] = b
			if d := resp.Header.Get("X-Warmroute-Decision"); d != "affinity" {
				t.Fatalf("decision %q on an idle fleet", d)
			}
		}
	}

	// Overflow: hold requests open; the owner takes exactly the threshold.
	hold := make(chan struct{})
	for _, e := range engines {
		e.hold.Store(&hold)
	}
	prompt := "shared document 0"
	owner := where[prompt]
	type res struct{ backend, decision string }
	results := make(chan res, 6)
	var wg sync.WaitGroup
	for i := 0; i < 6; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := http.Post(r.url+"/v1/chat/completions", "application/json", strings.NewReader(chatBody(prompt, false)))
			if err != nil {
				t.Error(err)
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			results <- res{resp.Header.Get("X-Warmroute-Backend"), resp.Header.Get("X-Warmroute-Decision")}
		}()
		waitHeld(t, engines, int64(i+1)) // this request is held by an engine
	}
	for _, e := range engines {
		if e.addr() == owner && e.cur.Load() != 3 {
			t.Errorf("owner holds %d requests, want the threshold 3", e.cur.Load())
		}
	}
	close(hold)
	wg.Wait()
	close(results)
	counts := map[string]int{}
	for x := range results {
		switch {
		case x.backend == owner && x.decision == "affinity":
			counts["affinity"]++
		case x.backend != owner && x.decision == "overflow":
			counts["overflow"]++
		default:
			t.Errorf("unexpected %+v", x)
		}
	}
	if counts["affinity"] != 3 || counts["overflow"] != 3 {
		t.Errorf("decisions %v, want 3 affinity and 3 overflow", counts)
	}
	for _, e := range engines {
		e.hold.Store(nil)
	}

	// Failover: kill the owner; every request still succeeds elsewhere.
	for _, e := range engines {
		if e.addr() == owner {
			e.srv.Close()
		}
	}
	for i := 0; i < 40; i++ {
		resp, err := http.Post(r.url+"/v1/chat/completions", "application/json", strings.NewReader(chatBody(fmt.Sprintf("shared document %d", i%16), false)))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("after killing a backend: %d %s", resp.StatusCode, b)
		}
		if resp.Header.Get("X-Warmroute-Backend") == owner {
			t.Fatal("routed to the killed backend")
		}
	}
}

func TestE2EClientDisconnectStopsUpstream(t *testing.T) {
	t.Parallel()
	needBinary(t)
	e := newEngine(t, 0, 20*time.Millisecond, 100000)
	r := startRouter(t, proc.ServeArgs{Backends: []string{e.srv.URL}})
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "POST", r.url+"/v1/chat/completions", strings.NewReader(chatBody("endless", true)))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(resp.Body)
	for i := 0; i < 3; i++ {
		if _, err := br.ReadString('\n'); err != nil {
			t.Fatal(err)
		}
	}
	cancel()
	resp.Body.Close()
	waitAborted(t, e, "the engine kept streaming after the client left")
	// The router counted it.
	if _, err := pollUntil(10*time.Second, func() (bool, error) {
		n, err := adminMetric(http.DefaultClient, r.admin, fmt.Sprintf(`warmroute_client_aborts_total{backend=%q}`, e.addr()))
		return n == 1, err
	}); err != nil {
		t.Fatalf("abort not counted: %v", err)
	}
}

func runCLI(t *testing.T, args ...string) (string, error) {
	t.Helper()
	out, err := exec.Command(binPath, args...).CombinedOutput()
	return string(out), err
}

func TestE2EAdminCLI(t *testing.T) {
	t.Parallel()
	needBinary(t)
	a, b := newEngine(t, 0, 0, 1), newEngine(t, 0, 0, 1)
	r := startRouter(t, proc.ServeArgs{Backends: []string{a.srv.URL}})
	admin := strings.TrimPrefix(r.admin, "http://")
	out, err := runCLI(t, "backends", "--admin", admin, "--zone", "z2", "add", b.srv.URL)
	if err != nil || !strings.Contains(out, `"epoch"`) {
		t.Fatalf("backends add: %v\n%s", err, out)
	}
	out, err = runCLI(t, "config", "--admin", admin, "set", "prefix_length=2048", "ConcurrencyThreshold=7")
	if err != nil {
		t.Fatalf("config set: %v\n%s", err, out)
	}
	out, err = runCLI(t, "config", "--admin", admin, "get")
	if err != nil || !strings.Contains(out, `"prefix_length": 2048`) || !strings.Contains(out, `"concurrency_threshold": 7`) {
		t.Fatalf("config get: %v\n%s", err, out)
	}
	out, err = runCLI(t, "status", "--admin", admin)
	if err != nil || !strings.Contains(out, b.addr()) || !strings.Contains(out, "Leader") || !strings.Contains(out, "z2") {
		t.Fatalf("status: %v\n%s", err, out)
	}
	out, err = runCLI(t, "config", "--admin", admin, "set", "prefix_length=10")
	if err == nil || !strings.Contains(out, "PrefixLength 10 out of range") {
		t.Fatalf("bad config accepted: %v\n%s", err, out)
	}
	out, err = runCLI(t, "backends", "--admin", admin, "drain", "nope:1")
	if err == nil || !strings.Contains(out, "unknown backend") {
		t.Fatalf("drain unknown: %v\n%s", err, out)
	}
	// The router answers with the epoch of the change.
	resp, err := http.Post(r.url+"/v1/chat/completions", "application/json", strings.NewReader(chatBody("x", false)))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if e := resp.Header.Get("X-Warmroute-Epoch"); e == "" || e == "0" {
		t.Fatalf("epoch header %q", e)
	}
}

// TestE2EThreeProcessCluster runs three router processes on loopback: they
// gossip, bootstrap Raft together, share in-flight counts and agree on
// changes made through any of them.
func TestE2EThreeProcessCluster(t *testing.T) {
	t.Parallel()
	needBinary(t)
	hold := newEngine(t, 0, 0, 1)
	held := make(chan struct{})
	hold.hold.Store(&held)
	other := newEngine(t, 0, 0, 1)
	// None is ready before all three have formed the cluster; a router
	// whose port another test took meanwhile starts them all again.
	routers := spawnCluster(t, 3, proc.ServeArgs{Backends: []string{hold.srv.URL}}, nil)
	// A leader is elected and every router routes on the agreed ring.
	waitAgreed(t, &http.Client{Timeout: 5 * time.Second}, routers, 20*time.Second)

	// In-flight opened through router 0 shows in router 2's global count.
	var cl clients
	cl.open(routers[0].url, "held")
	var remote loads
	d, err := pollUntil(10*time.Second, func() (bool, error) {
		var err error
		_, remote, err = liveLoads(http.DefaultClient, routers[2])
		return len(remote) == 1 && remote[hold.addr()] == 1, err
	})
	if err != nil {
		t.Fatalf("router 2 never saw router 0's request: remote in-flight %v: %v", remote, err)
	}
	t.Logf("in-flight from router 0 visible on router 2 after %v (polling every 2 ms)", d)
	close(held)
	cl.wg.Wait()

	// A change made through router 1 reaches every router at one epoch.
	out, err := runCLI(t, "backends", "--admin", strings.TrimPrefix(routers[1].admin, "http://"), "add", other.srv.URL)
	if err != nil {
		t.Fatalf("add through router 1: %v\n%s", err, out)
	}
	var ack struct{ Epoch float64 }
	json.Unmarshal([]byte(out), &ack)
	for _, r := range routers {
		var epoch string
		if _, err := pollUntil(10*time.Second, func() (bool, error) {
			resp, err := http.Post(r.url+"/v1/chat/completions", "application/json", strings.NewReader(chatBody("after", false)))
			if err != nil {
				return false, err
			}
			resp.Body.Close()
			epoch = resp.Header.Get("X-Warmroute-Epoch")
			e, _ := strconv.ParseFloat(epoch, 64)
			return e >= ack.Epoch, nil
		}); err != nil {
			t.Fatalf("router %s still at epoch %s, want %v: %v", r.url, epoch, ack.Epoch, err)
		}
	}
}
