package engine

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeEngine serves a vLLM V1 /metrics body whose figures tests change.
type fakeEngine struct {
	mu               sync.Mutex
	running, waiting float64
	queries, hits    float64
	status           int
	delay            time.Duration
	extra            string
	hits_            atomic.Int64 // requests served
}

func (e *fakeEngine) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	e.hits_.Add(1)
	e.mu.Lock()
	body := fmt.Sprintf(`# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} %v
vllm:num_requests_waiting{engine="0",model_name="m"} %v
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5
vllm:prefix_cache_queries_total{engine="0",model_name="m"} %v
vllm:prefix_cache_hits_total{engine="0",model_name="m"} %v
%s`, e.running, e.waiting, e.queries, e.hits, e.extra)
	status, delay := e.status, e.delay
	e.mu.Unlock()
	if delay > 0 {
		select {
		case <-time.After(delay):
		case <-r.Context().Done():
			return
		}
	}
	if status != 0 {
		w.WriteHeader(status)
		return
	}
	_, _ = w.Write([]byte(body))
}

func (e *fakeEngine) set(f func(e *fakeEngine)) {
	e.mu.Lock()
	f(e)
	e.mu.Unlock()
}

type published struct {
	mu  sync.Mutex
	got map[string][]Stats
}

func (p *published) publish(id string, s Stats) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.got == nil {
		p.got = map[string][]Stats{}
	}
	p.got[id] = append(p.got[id], s)
}

func (p *published) last(id string) (Stats, int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	l := p.got[id]
	if len(l) == 0 {
		return Stats{}, 0
	}
	return l[len(l)-1], len(l)
}

func newTestScraper(t *testing.T, cfg Config, targets []Target, owner func(string) bool, pub *published) *Scraper {
	t.Helper()
	s, err := New(cfg, func() []Target { return targets }, owner, pub.publish)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.client.CloseIdleConnections)
	return s
}

func TestScraperRoundAndHitRate(t *testing.T) {
	e1, e2 := &fakeEngine{running: 2, waiting: 1}, &fakeEngine{running: 7}
	s1, s2 := httptest.NewServer(e1), httptest.NewServer(e2)
	defer s1.Close()
	defer s2.Close()
	targets := []Target{{"b1", s1.URL + "/metrics"}, {"b2", s2.URL + "/metrics"}, {"b3", ""}}
	var mine atomic.Value
	mine.Store(map[string]bool{"b1": true, "b3": true})
	var pub published
	cfg := DefaultConfig()
	cfg.HitRateWindow = time.Hour // every sample stays in the window
	s := newTestScraper(t, cfg, targets, func(id string) bool { return mine.Load().(map[string]bool)[id] }, &pub)
	ctx := context.Background()

	s.round(ctx, nil)
	st, n := pub.last("b1")
	if n != 1 || !st.OK || st.Running != 2 || st.Waiting != 1 || st.KVUsage != 0.5 || st.Known != KnownRunning|KnownWaiting|KnownKVUsage {
		t.Fatalf("b1 after first round: %+v (%d)", st, n)
	}
	if st.Scraped.IsZero() || time.Since(st.Scraped) > time.Minute {
		t.Fatalf("scraped at %v", st.Scraped)
	}
	if _, n := pub.last("b2"); n != 0 || e2.hits_.Load() != 0 {
		t.Fatal("scraped a backend another node owns")
	}
	if _, n := pub.last("b3"); n != 0 {
		t.Fatal("published a target without a metrics URL")
	}

	// Hit rate from counter growth: 100 queries, 40 hits since the base.
	e1.set(func(e *fakeEngine) { e.queries, e.hits = 100, 40 })
	s.round(ctx, nil)
	if st, _ := pub.last("b1"); !st.Has(KnownPrefixHitRate) || !near(st.PrefixHitRate, 0.4) {
		t.Fatalf("hit rate %+v", st)
	}
	e1.set(func(e *fakeEngine) { e.queries, e.hits = 200, 130 })
	s.round(ctx, nil)
	if st, _ := pub.last("b1"); !near(st.PrefixHitRate, 0.65) {
		t.Fatalf("hit rate over the window %v, want 130/200", st.PrefixHitRate)
	}
	// No new queries: the last rate stands.
	s.round(ctx, nil)
	if st, _ := pub.last("b1"); !near(st.PrefixHitRate, 0.65) {
		t.Fatalf("idle hit rate %v", st.PrefixHitRate)
	}
	// The engine restarted (counters went back): the window starts over.
	e1.set(func(e *fakeEngine) { e.queries, e.hits = 10, 10 })
	s.round(ctx, nil)
	e1.set(func(e *fakeEngine) { e.queries, e.hits = 20, 15 })
	s.round(ctx, nil)
	if st, _ := pub.last("b1"); !near(st.PrefixHitRate, 0.5) {
		t.Fatalf("hit rate after restart %v, want 5/10", st.PrefixHitRate)
	}

	// Ownership moves: b1 is dropped (and its state), b2 is scraped.
	mine.Store(map[string]bool{"b2": true})
	s.round(ctx, nil)
	if st, n := pub.last("b2"); n != 1 || st.Running != 7 {
		t.Fatalf("b2 after takeover: %+v (%d)", st, n)
	}
	if _, ok := s.state["b1"]; ok {
		t.Fatal("state kept for a backend no longer owned")
	}
}

func (s Stats) Has(bits uint8) bool { return s.OK && s.Known&bits == bits }

func TestScraperWindowSlides(t *testing.T) {
	var st targetState
	now := time.Now()
	w := 10 * time.Second
	for i, c := range []struct{ q, h float64 }{{0, 0}, {100, 100}, {200, 100}, {300, 100}} {
		st.stats(Sample{HasCounters: true, PrefixQueries: c.q, PrefixHits: c.h}, now.Add(time.Duration(i)*5*time.Second), w)
	}
	// At t=15 s the base is the newest sample at least 10 s old (t=5 s:
	// 100/100): (100-100)/(300-100) = 0.
	if !st.hasRate || st.rate != 0 {
		t.Fatalf("rate %v", st.rate)
	}
	if len(st.hist) != 3 {
		t.Fatalf("kept %d samples, want 3", len(st.hist))
	}
}

func TestScraperFailures(t *testing.T) {
	bad := &fakeEngine{status: http.StatusServiceUnavailable}
	slow := &fakeEngine{delay: 5 * time.Second}
	big := &fakeEngine{extra: strings.Repeat("# padding\n", 2000)}
	empty := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte("<html>hello</html>")) })
	var servers []*httptest.Server
	var targets []Target
	for i, h := range []http.Handler{bad, slow, big, empty} {
		srv := httptest.NewServer(h)
		servers = append(servers, srv)
		targets = append(targets, Target{fmt.Sprint("t", i), srv.URL})
	}
	targets = append(targets, Target{"down", "http://127.0.0.1:1/metrics"})
	defer func() {
		for _, s := range servers {
			s.CloseClientConnections()
			s.Close()
		}
	}()
	reg := prometheus.NewRegistry()
	cfg := DefaultConfig()
	cfg.Timeout = 200 * time.Millisecond
	cfg.MaxBodyBytes = 4096
	cfg.Registry = reg
	var pub published
	s := newTestScraper(t, cfg, targets, func(string) bool { return true }, &pub)
	start := time.Now()
	s.round(context.Background(), nil)
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("round took %v with a 200 ms timeout", d)
	}
	for _, tg := range targets {
		st, n := pub.last(tg.ID)
		if n != 1 || st.OK || st.Known != 0 || st.Scraped.IsZero() {
			t.Errorf("%s: %+v (%d)", tg.ID, st, n)
		}
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	counts := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() == "warmroute_engine_scrapes_total" {
			for _, m := range mf.GetMetric() {
				counts[m.GetLabel()[0].GetValue()] = m.GetCounter().GetValue()
			}
		}
	}
	if counts["error"] != 4 || counts["empty"] != 1 {
		t.Fatalf("scrape counts %v", counts)
	}
}

func TestScraperRunStops(t *testing.T) {
	e := &fakeEngine{running: 1}
	srv := httptest.NewServer(e)
	defer srv.Close()
	cfg := DefaultConfig()
	cfg.Interval = 20 * time.Millisecond
	cfg.HitRateWindow = time.Second
	var pub published
	s := newTestScraper(t, cfg, []Target{{"b", srv.URL}}, func(string) bool { return true }, &pub)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, n := pub.last("b"); n >= 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("Run did not scrape repeatedly")
		}
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run returned %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not stop")
	}
}

func TestConfigValidate(t *testing.T) {
	for name, mod := range map[string]func(*Config){
		"interval":    func(c *Config) { c.Interval = 0 },
		"timeout":     func(c *Config) { c.Timeout = -1 },
		"concurrency": func(c *Config) { c.Concurrency = 0 },
		"body":        func(c *Config) { c.MaxBodyBytes = 0 },
		"window":      func(c *Config) { c.HitRateWindow = c.Interval / 2 },
		"mapping":     func(c *Config) { c.Mapping.PrefixHits = nil },
	} {
		c := DefaultConfig()
		mod(&c)
		if err := c.Validate(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	c := DefaultConfig()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if _, err := New(c, nil, nil, nil); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("nil callbacks: %v", err)
	}
}

// TestTrigger: with rounds an hour apart, Trigger scrapes the backend
// asked for (and only it) at once; a backend this scraper does not own is
// not scraped; Trigger never blocks, even with Run not running.
func TestTrigger(t *testing.T) {
	a, b, c := &fakeEngine{}, &fakeEngine{}, &fakeEngine{}
	srvs := []*httptest.Server{httptest.NewServer(a), httptest.NewServer(b), httptest.NewServer(c)}
	for _, s := range srvs {
		defer s.Close()
	}
	targets := []Target{{ID: "a", MetricsURL: srvs[0].URL}, {ID: "b", MetricsURL: srvs[1].URL}, {ID: "c", MetricsURL: srvs[2].URL}}
	cfg := DefaultConfig()
	cfg.Interval, cfg.HitRateWindow = time.Hour, time.Hour
	var mu sync.Mutex
	got := map[string]int{}
	s, err := New(cfg, func() []Target { return targets }, func(id string) bool { return id != "c" }, func(id string, _ Stats) {
		mu.Lock()
		got[id]++
		mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 100; i++ {
		s.Trigger("b") // Run is not running: none of these may block
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = s.Run(ctx) }()
	defer func() { cancel(); <-done }()
	count := func(id string) int {
		mu.Lock()
		defer mu.Unlock()
		return got[id]
	}
	wait := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: scrapes a=%d b=%d c=%d", what, count("a"), count("b"), count("c"))
			}
		}
	}
	wait("the first round", func() bool { return count("a") == 1 && count("b") >= 1 })
	before := count("b")
	s.Trigger("b")
	s.Trigger("c")
	wait("a triggered scrape of b", func() bool { return count("b") > before })
	time.Sleep(50 * time.Millisecond)
	if count("a") != 1 || count("c") != 0 {
		t.Fatalf("a triggered scrape of b scraped a %d times and c (not owned) %d", count("a"), count("c"))
	}
}
