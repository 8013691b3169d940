package loadtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warmroute/warmroute/loadtest/gpusim"
)

func TestOpenLoopAgainstGpusim(t *testing.T) {
	f, gen, cfg := simRun(t, 3, gpusim.FastConfig()) // spread over the three like an L4 balancer
	cfg.Rate = 200
	cfg.Requests = 60
	cfg.Duration = 0
	cfg.MetricsURLs = metricsURLs(f.URLs())
	cfg.MetricsInterval = 20 * time.Millisecond
	s := mustRun(t, cfg, gen)
	if s.Sent != 60 || s.OK != 60 || s.Failed != 0 || s.Partial {
		t.Fatalf("sent %d ok %d failed %d (%v) partial %v", s.Sent, s.OK, s.Failed, s.Errors, s.Partial)
	}
	// 8 tokens: at most 7 gaps per request (fewer when the server merges
	// tokens that piled up into one chunk)
	if s.TTFT.Count != 60 || s.TTFT.P50Ms <= 0 || s.E2E.P50Ms < s.TTFT.P50Ms || s.ITL.Count == 0 || s.ITL.Count > 60*7 {
		t.Fatalf("latencies: ttft %+v e2e %+v itl %+v", s.TTFT, s.E2E, s.ITL)
	}
	if s.CompletionTokens != 60*8 {
		t.Fatalf("completion tokens %d, want %d", s.CompletionTokens, 60*8)
	}
	// shares are keyed by host:port even without a router (gpusim's own
	// instance names are translated), and round robin over the targets
	// gives each instance exactly a third
	for _, u := range f.URLs() {
		id := strings.TrimPrefix(u, "http://")
		if s.Backends[id] != 20 {
			t.Fatalf("backend %s got %d requests, want 20 (backends %v)", id, s.Backends[id], s.Backends)
		}
	}
	if s.ShareMaxMin != 1 {
		t.Fatalf("max/min share %g, want 1", s.ShareMaxMin)
	}
	// the hit rate from the counters agrees with the responses' usage
	if s.KV == nil || s.KV.QueriedTokens != float64(s.PromptTokens) || s.KV.HitTokens != float64(s.CachedTokens) {
		t.Fatalf("kv %+v, usage prompt %d cached %d", s.KV, s.PromptTokens, s.CachedTokens)
	}
	// four documents over three instances: most prompts hit
	if s.KV.HitRate < 0.5 {
		t.Fatalf("hit rate %.2f with 4 documents and 60 requests", s.KV.HitRate)
	}
	if len(s.KVSeries) == 0 {
		t.Fatal("no hit-rate samples")
	}
	var q float64
	for _, p := range s.KVSeries {
		q += p.QueriedTokens
	}
	if q != s.KV.QueriedTokens {
		t.Fatalf("the series sums to %g queried tokens, the run to %g", q, s.KV.QueriedTokens)
	}
}

func TestClosedLoop(t *testing.T) {
	f, gen, _ := simRun(t, 1, gpusim.FastConfig())
	s := mustRun(t, closedLoop(f.URLs()[0], 4, 25), gen)
	if s.Sent != 25 || s.OK != 25 {
		t.Fatalf("sent %d ok %d", s.Sent, s.OK)
	}
	if s.KV != nil {
		t.Fatal("hit rate without metrics URLs")
	}
	if s.UsageCachedRate <= 0 {
		t.Fatal("no cached tokens reported in usage")
	}
}

// serialServer answers one request at a time, each after d.
func serialServer(t *testing.T, d time.Duration) *httptest.Server {
	var mu sync.Mutex
	return startStub(t, func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		time.Sleep(d)
		mu.Unlock()
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, chunkA+sseDone)
	})
}

func TestOpenLoopMeasuresFromIntendedTime(t *testing.T) {
	// One request in flight at a time against a 20 ms server, offered 100
	// requests/s: requests leave late. Timed from their intended send
	// time, the later ones show the backlog (coordinated omission would
	// report ~20 ms for every one).
	srv := serialServer(t, 20*time.Millisecond)
	gen := ragWorkload(t, "m")
	cfg := DefaultConfig()
	cfg.Targets = []string{srv.URL}
	cfg.Rate = 100
	cfg.MaxInFlight = 1
	cfg.Requests = 30
	cfg.Duration = 0
	s := mustRun(t, cfg, gen)
	if s.OK != 30 {
		t.Fatalf("ok %d", s.OK)
	}
	// 30 x 20 ms of service against ~300 ms of arrivals: the last request
	// waits at least ~250 ms behind its schedule.
	if s.E2E.MaxMs < 200 {
		t.Fatalf("max latency %.0f ms: the backlog is not measured", s.E2E.MaxMs)
	}
}

func TestErrorsByKind(t *testing.T) {
	var n atomic.Int64
	srv := startStub(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set(HeaderBackend, "127.0.0.1:9")
		w.Header().Set(HeaderDecision, "overflow")
		switch n.Add(1) % 4 {
		case 0:
			w.WriteHeader(http.StatusServiceUnavailable)
		case 1:
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprint(w, chunkA) // no [DONE]
		case 2:
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprint(w, "data: {\"error\":{\"message\":\"engine died\"}}\n\n")
		case 3:
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprint(w, chunkA+sseDone)
		}
	})
	s := mustRun(t, closedLoop(srv.URL, 1, 20), ragWorkload(t, "m"))
	want := map[string]int64{"http_503": 5, ErrKindStream: 5, ErrKindSSEError: 5}
	for k, v := range want {
		if s.Errors[k] != v {
			t.Fatalf("errors %v, want %v", s.Errors, want)
		}
	}
	if s.OK != 5 || s.Decisions["overflow"] != 20 || s.Backends["127.0.0.1:9"] != 20 {
		t.Fatalf("ok %d decisions %v backends %v", s.OK, s.Decisions, s.Backends)
	}
}

func TestUnreachableTarget(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	gen := ragWorkload(t, "m")
	cfg := DefaultConfig()
	cfg.Targets = []string{"http://" + addr}
	start := time.Now()
	_, err = Run(context.Background(), cfg, gen)
	if !errors.Is(err, ErrUnreachable) || !strings.Contains(err.Error(), addr) {
		t.Fatalf("error %v, want ErrUnreachable naming %s", err, addr)
	}
	if time.Since(start) > 10*time.Second {
		t.Fatal("unreachable target took long to report")
	}
	cfg.Targets = []string{"http://10.1.2.3:80"}
	if _, err := Run(context.Background(), cfg, gen); !errors.Is(err, ErrNotLoopback) {
		t.Fatalf("remote target: %v", err)
	}
}

func TestBadMetricsURL(t *testing.T) {
	f, gen, cfg := simRun(t, 1, gpusim.FastConfig())
	cfg.MetricsURLs = []string{f.URLs()[0] + "/nope"}
	if _, err := Run(context.Background(), cfg, gen); !errors.Is(err, ErrMetrics) {
		t.Fatalf("error %v, want ErrMetrics", err)
	}
}

func TestValidate(t *testing.T) {
	bad := []func(*Config){
		func(c *Config) { c.Targets = nil },
		func(c *Config) { c.Targets = []string{"ftp://127.0.0.1:1"} },
		func(c *Config) { c.Targets = []string{"127.0.0.1:80"} },
		func(c *Config) { c.Rate = 0 },
		func(c *Config) { c.Mode = "sideways" },
		func(c *Config) { c.Mode = ClosedLoop; c.Concurrency = 0 },
		func(c *Config) { c.Duration = 0; c.Requests = 0 },
		func(c *Config) { c.Timeout = 0 },
		func(c *Config) { c.MetricsURLs = []string{"http://192.168.1.1/metrics"} },
		func(c *Config) { c.BackendHeader = "" },
	}
	for i, mut := range bad {
		c := DefaultConfig()
		mut(&c)
		if err := c.Validate(); err == nil {
			t.Errorf("case %d accepted", i)
		}
	}
	c := DefaultConfig()
	c.Targets = []string{"http://localhost:1", "http://127.0.0.9:2/"}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	c.Targets = []string{"https://example.com"}
	c.AllowRemote = true
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestInterruptGivesPartialSummary(t *testing.T) {
	sim := gpusim.FastConfig()
	sim.ITLBase = 20 * time.Millisecond // requests last ~0.6 s
	f, gen, cfg := simRun(t, 2, sim)
	cfg.Rate = 50
	cfg.Duration = time.Minute
	cfg.MetricsURLs = metricsURLs(f.URLs())
	// interrupt once a few requests have finished (at the latest after 30 s)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var progressed atomic.Bool
	cfg.Progress = writerFunc(func(line []byte) (int, error) {
		if bytes.Contains(line, []byte("in flight")) {
			progressed.Store(true)
		}
		if bytes.Contains(line, []byte("ok 3")) {
			cancel()
		}
		return len(line), nil
	})
	cfg.ProgressInterval = 50 * time.Millisecond
	start := time.Now()
	s, err := Run(ctx, cfg, gen)
	if !errors.Is(err, ErrInterrupted) {
		t.Fatalf("error %v, want ErrInterrupted", err)
	}
	if time.Since(start) > 45*time.Second {
		t.Fatal("the interrupt did not stop the run")
	}
	if !s.Partial || s.OK < 3 || s.Sent != s.OK+s.Failed+s.Canceled || s.KV == nil {
		t.Fatalf("partial summary: partial %v sent %d ok %d failed %d canceled %d kv %v",
			s.Partial, s.Sent, s.OK, s.Failed, s.Canceled, s.KV)
	}
	if s.Failed != 0 {
		t.Fatalf("cancelled requests counted as failures: %v", s.Errors)
	}
	if !progressed.Load() {
		t.Fatal("no progress line")
	}
}

func TestModels(t *testing.T) {
	sim := gpusim.FastConfig()
	f, _, _ := simRun(t, 1, sim)
	ids, err := Models(context.Background(), f.URLs()[0])
	if err != nil || len(ids) != 1 || ids[0] != sim.Model {
		t.Fatalf("models %v, %v", ids, err)
	}
}

func TestWarmupIsNotMeasured(t *testing.T) {
	f, gen, cfg := simRun(t, 1, gpusim.FastConfig())
	cfg.MetricsURLs = metricsURLs(f.URLs())
	// Closed loop: at most Concurrency warm-up requests straddle the
	// warm-up's end, however slow a loaded machine makes each (an open
	// loop at 100/s queued the whole warm-up there in CI runs, and it was
	// answered only as the run ended).
	cfg.Mode = ClosedLoop
	cfg.Concurrency = 4
	cfg.Warmup = 500 * time.Millisecond
	cfg.Duration = time.Second
	s := mustRun(t, cfg, gen)
	if s.WarmupRequests == 0 || s.OK == 0 || s.Sent != s.WarmupRequests+s.OK+s.Failed+s.Canceled {
		t.Fatalf("sent %d = warm-up %d + ok %d + failed %d + canceled %d?", s.Sent, s.WarmupRequests, s.OK, s.Failed, s.Canceled)
	}
	// the four documents were first seen during the warm-up: what is
	// measured afterwards hits
	if s.KV.HitRate < 0.85 || s.UsageCachedRate < 0.85 {
		t.Fatalf("hit rate after warm-up %.2f (usage %.2f)", s.KV.HitRate, s.UsageCachedRate)
	}
	// the engines' counters start once the last warm-up request is
	// answered: what they count afterwards is measured requests only
	if s.KV.QueriedTokens > float64(s.PromptTokens)*1.02 {
		t.Fatalf("queried tokens %g include the warm-up (measured prompt tokens %d)", s.KV.QueriedTokens, s.PromptTokens)
	}
}

// A client that falls behind sends warm-up requests after the warm-up's
// nominal end, and an engine queues them: they must be neither recorded
// nor counted in the engines' figures for the measured window.
func TestWarmupBacklogIsNotMeasured(t *testing.T) {
	sim := gpusim.FastConfig()
	sim.ITLBase = 5 * time.Millisecond // 8 tokens: about 40 ms a request
	f, gen, cfg := simRun(t, 1, sim)
	cfg.MetricsURLs = metricsURLs(f.URLs())
	cfg.Rate = 200
	cfg.MaxInFlight = 2 // at most about 50 a second: the sender falls behind
	cfg.Warmup = 300 * time.Millisecond
	cfg.Duration = 300 * time.Millisecond
	cfg.Drain = 30 * time.Second
	s := mustRun(t, cfg, gen)
	if s.WarmupRequests == 0 || s.OK == 0 || s.Sent != s.WarmupRequests+s.OK+s.Failed+s.Canceled {
		t.Fatalf("sent %d = warm-up %d + ok %d + failed %d + canceled %d?", s.Sent, s.WarmupRequests, s.OK, s.Failed, s.Canceled)
	}
	if s.KV.QueriedTokens > float64(s.PromptTokens)*1.02 {
		t.Fatalf("queried tokens %g include the warm-up (measured prompt tokens %d, %d warm-up requests)",
			s.KV.QueriedTokens, s.PromptTokens, s.WarmupRequests)
	}
}

func TestConnectionsAreReused(t *testing.T) {
	var conns atomic.Int64
	srv := newStub(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, chunkA)
		w.(http.Flusher).Flush()
		fmt.Fprint(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":1}}\n\n"+sseDone)
		// the end of the chunked body comes a little after [DONE]
		w.(http.Flusher).Flush()
		time.Sleep(5 * time.Millisecond)
	})
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	defer srv.Close()
	if s := mustRun(t, closedLoop(srv.URL, 2, 40), ragWorkload(t, "m")); s.OK != 40 {
		t.Fatalf("ok %d errors %v", s.OK, s.Errors)
	}
	// one connection per worker (plus the /v1/models probe), not one per request
	if n := conns.Load(); n > 4 {
		t.Fatalf("%d connections for 40 requests from 2 workers", n)
	}
}

func TestStreamLeftOpenAfterDone(t *testing.T) {
	srv := startStub(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, chunkA+sseDone)
		w.(http.Flusher).Flush()
		select { // never ends the body by itself
		case <-r.Context().Done():
		case <-time.After(30 * time.Second):
		}
	})
	start := time.Now()
	if s := mustRun(t, closedLoop(srv.URL, 1, 3), ragWorkload(t, "m")); s.OK != 3 {
		t.Fatalf("ok %d errors %v", s.OK, s.Errors)
	}
	if d := time.Since(start); d > 20*time.Second {
		t.Fatalf("three requests took %v: the open stream held them", d)
	}
}
