package admin

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/warmroute/warmroute/gossip"
	"github.com/warmroute/warmroute/node/cluster"
	"github.com/warmroute/warmroute/ring"
)

// fakeEngines reports fixed figures per backend.
type fakeEngines map[string]gossip.EngineStats

func (f fakeEngines) Engine(id string) (gossip.EngineStats, bool) { s, ok := f[id]; return s, ok }

// TestEngineFigures: the KV usage, queue and hit rate scraped from a
// backend's engine show in /status and /v1/backends, with the figures the
// engine does not export left out, and as metrics.
func TestEngineFigures(t *testing.T) {
	r, err := ring.New(ring.DefaultConfig(), []ring.Backend{{ID: "gpu-1", Addr: "http://127.0.0.1:9001"}})
	if err != nil {
		t.Fatal(err)
	}
	a := &fakeAgreement{st: cluster.State{Seeded: true, Routing: ring.DefaultSettings(),
		Backends: []cluster.Backend{{ID: "gpu-1", URL: "http://127.0.0.1:9001", State: cluster.StateActive}}}, epoch: 4}
	reg := prometheus.NewRegistry()
	// A TGI-like engine: a queue, no KV-cache or hit-rate figure.
	eng := fakeEngines{"gpu-1": {OK: true, Known: gossip.EngineRunning | gossip.EngineWaiting, Running: 12, Waiting: 3, Scraped: time.Now()}}
	s := New(Config{Name: "r0", Metrics: reg, Agreement: a, Router: fakeRouter{r, a}, Engines: eng})
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)
	c, err := NewClient(srv.URL, "", nil, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	st, err := c.Status(ctx)
	if err != nil || len(st.Backends) != 1 {
		t.Fatalf("Status: %+v %v", st, err)
	}
	e := st.Backends[0].Engine
	if e == nil || !e.OK || e.Running == nil || *e.Running != 12 || e.Waiting == nil || *e.Waiting != 3 || e.KVUsage != nil || e.PrefixHitRate != nil {
		t.Fatalf("/status engine figures %+v", e)
	}
	if st.Backends[0].ID != "gpu-1" || st.Backends[0].Limit != 16 {
		t.Fatalf("/status lost the live view: %+v", st.Backends[0])
	}
	list, err := c.Backends(ctx)
	if err != nil || len(list.Backends) != 1 || list.Backends[0].Engine == nil || *list.Backends[0].Engine.Waiting != 3 {
		t.Fatalf("/v1/backends: %+v %v", list, err)
	}

	// vLLM: every figure.
	eng["gpu-1"] = gossip.EngineStats{OK: true, Known: gossip.EngineKVUsage | gossip.EngineRunning | gossip.EngineWaiting | gossip.EnginePrefixHitRate,
		KVUsage: 0.25, Running: 4, Waiting: 0, PrefixHitRate: 0.875}
	resp, err := http.Get(srv.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		`warmroute_backend_engine_kv_usage{backend="gpu-1"} 0.25`,
		`warmroute_backend_engine_running{backend="gpu-1"} 4`,
		`warmroute_backend_engine_waiting{backend="gpu-1"} 0`,
		`warmroute_backend_engine_prefix_hit_rate{backend="gpu-1"} 0.875`,
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}

	// A failed scrape: no figure, in either place.
	eng["gpu-1"] = gossip.EngineStats{OK: false, Known: gossip.EngineKVUsage, KVUsage: 0.5}
	if st, err = c.Status(ctx); err != nil || st.Backends[0].Engine == nil || st.Backends[0].Engine.OK || st.Backends[0].Engine.KVUsage != nil {
		t.Fatalf("failed scrape in /status: %+v %v", st.Backends[0].Engine, err)
	}
	if n, err := testutilCount(reg, "warmroute_backend_engine_kv_usage"); err != nil || n != 0 {
		t.Fatalf("failed scrape exported %d kv_usage series (%v)", n, err)
	}
}

func testutilCount(reg *prometheus.Registry, name string) (int, error) {
	mfs, err := reg.Gather()
	if err != nil {
		return 0, err
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return len(mf.GetMetric()), nil
		}
	}
	return 0, nil
}
