package admin

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/warmroute/warmroute/node/cluster"
	"github.com/warmroute/warmroute/proxy"
	"github.com/warmroute/warmroute/ring"
)

// cacheRouter is fakeRouter with backends of its own.
type cacheRouter struct {
	fakeRouter
	bs []proxy.BackendStatus
}

func (c cacheRouter) Status() []proxy.BackendStatus { return c.bs }

func figures(kind string, answers, reported, predicted, delivered, both, prompt, cached, predictedTokens int64) proxy.CacheFigures {
	f := proxy.CacheFigures{Kind: kind}
	f.Add(proxy.CacheFigures{Answers: answers, Reported: reported, PredictedWarm: predicted, DeliveredWarm: delivered, BothWarm: both,
		PromptTokens: prompt, CachedTokens: cached, PredictedTokens: predictedTokens})
	return f
}

// TestCacheFigures: /status shows each backend's cache predictions
// against what was delivered, per decision kind, and their sum per kind
// in kind order; /v1/backends shows each backend's in its live view.
func TestCacheFigures(t *testing.T) {
	r, err := ring.New(ring.DefaultConfig(), []ring.Backend{{ID: "gpu-1", Addr: "http://127.0.0.1:9001"}, {ID: "gpu-2", Addr: "http://127.0.0.1:9002"}})
	if err != nil {
		t.Fatal(err)
	}
	a := &fakeAgreement{st: cluster.State{Seeded: true, Routing: ring.DefaultSettings(), Backends: []cluster.Backend{
		{ID: "gpu-1", URL: "http://127.0.0.1:9001", State: cluster.StateActive},
		{ID: "gpu-2", URL: "http://127.0.0.1:9002", State: cluster.StateActive}}}, epoch: 4}
	bs := []proxy.BackendStatus{
		{ID: "gpu-1", State: "active", Healthy: true, Limit: 16, Cache: []proxy.CacheFigures{
			figures("affinity", 10, 8, 6, 6, 5, 8000, 5000, 1536),
			figures("overflow", 2, 2, 0, 1, 0, 2000, 900, 0)}},
		{ID: "gpu-2", State: "active", Healthy: true, Limit: 16, Cache: []proxy.CacheFigures{
			figures("overflow", 1, 1, 1, 0, 0, 1000, 0, 256),
			figures("affinity", 4, 4, 3, 3, 3, 4000, 3000, 768)}},
	}
	s := New(Config{Name: "r0", Metrics: prometheus.NewRegistry(), Agreement: a, Router: cacheRouter{fakeRouter{r, a}, bs}})
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)
	c, err := NewClient(srv.URL, "", nil, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	st, err := c.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	want := []proxy.CacheFigures{
		figures("affinity", 14, 12, 9, 9, 8, 12000, 8000, 2304),
		figures("overflow", 3, 3, 1, 1, 0, 3000, 900, 256),
	}
	if !reflect.DeepEqual(st.Cache, want) {
		t.Fatalf("/status cache %+v, want %+v", st.Cache, want)
	}
	if f := st.Cache[0]; f.PredictedHitRate != 0.75 || f.DeliveredHitRate != 0.75 || f.TokenHitRate != 8000.0/12000 {
		t.Fatalf("rates %+v", f)
	}
	if len(st.Backends) != 2 || !reflect.DeepEqual(st.Backends[1].Cache, bs[1].Cache) {
		t.Fatalf("/status backends %+v", st.Backends)
	}
	list, err := c.Backends(context.Background())
	if err != nil || len(list.Backends) != 2 || list.Backends[0].Live == nil || !reflect.DeepEqual(list.Backends[0].Live.Cache, bs[0].Cache) {
		t.Fatalf("/v1/backends %+v %v", list, err)
	}

	// The JSON names, as documented.
	resp, err := http.Get(srv.URL + "/status")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var raw struct {
		Cache []map[string]any `json:"cache"`
	}
	if err := json.Unmarshal(body, &raw); err != nil || len(raw.Cache) != 2 {
		t.Fatalf("/status: %v %s", err, body)
	}
	for _, k := range []string{"kind", "answers", "reported", "predicted_warm", "delivered_warm", "both_warm", "prompt_tokens",
		"cached_tokens", "predicted_tokens", "predicted_hit_rate", "delivered_hit_rate", "token_hit_rate"} {
		if _, ok := raw.Cache[0][k]; !ok {
			t.Errorf("/status cache has no %s: %s", k, body)
		}
	}

	// No answers yet: no cache field.
	s = New(Config{Name: "r0", Metrics: prometheus.NewRegistry(), Agreement: a, Router: fakeRouter{r, a}})
	if got := s.Status().Cache; got != nil {
		t.Fatalf("cache figures without answers: %+v", got)
	}
}
