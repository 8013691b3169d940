package trace_test

import (
	"context"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/warmroute/warmroute/loadtest"
	"github.com/warmroute/warmroute/loadtest/gpusim"
	"github.com/warmroute/warmroute/loadtest/trace"
	"github.com/warmroute/warmroute/loadtest/workload"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

var _ loadtest.Scheduled = (*trace.Replay)(nil)

// startFleet starts n fast gpusim instances of kvBlocks blocks each and
// returns them with a Config that sends to all of them in turn and scrapes
// their counters.
func startFleet(t *testing.T, n, kvBlocks int) (*gpusim.Fleet, loadtest.Config) {
	t.Helper()
	sim := gpusim.FastConfig()
	sim.KVCacheBlocks = kvBlocks
	f, err := gpusim.StartFleet(context.Background(), gpusim.FleetConfig{N: n, Instance: sim})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.Close() })
	cfg := loadtest.DefaultConfig()
	cfg.Targets = f.URLs()
	for _, u := range f.URLs() {
		cfg.MetricsURLs = append(cfg.MetricsURLs, u+"/metrics")
	}
	cfg.MetricsInterval = 50 * time.Millisecond
	cfg.Duration = 0
	cfg.Bounds.KVBlocks = kvBlocks
	return f, cfg
}

// A small generated trace replayed against three gpusim instances: every
// request is sent at its (compressed) time, gpusim counts exactly the
// prompt tokens the bounds computed, and the measured hit rate stays under
// the infinite cache's.
func TestReplayAgainstGpusim(t *testing.T) {
	recs, err := trace.Generate(trace.GenConfig{Seed: 5, Requests: 120, Rate: 100, BlockTokens: 64,
		MeanInputTokens: 600, MeanOutputTokens: 20, Turns: 4, Think: 200 * time.Millisecond, DocShare: 0.3, Documents: 4})
	if err != nil {
		t.Fatal(err)
	}
	_, cfg := startFleet(t, 3, 20000)
	rc := trace.DefaultReplayConfig()
	rc.BlockTokens = 64
	rc.MaxTokens = 4
	rc.TimeScale = 2 // 1.2 s of trace in 0.6 s
	rc.Model = gpusim.FastConfig().Model
	replay, err := trace.NewReplay(recs, rc)
	if err != nil {
		t.Fatal(err)
	}
	span := replay.Span()
	cfg.Requests = replay.Len()
	start := time.Now()
	s, err := loadtest.Run(context.Background(), cfg, replay)
	if err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took < span {
		t.Fatalf("the replay took %v, less than its last send time %v", took, span)
	}
	if s.Sent != 120 || s.OK != 120 || s.Failed != 0 {
		t.Fatalf("sent %d ok %d failed %d (%v)", s.Sent, s.OK, s.Failed, s.Errors)
	}
	if s.CompletionTokens > 120*4 {
		t.Fatalf("%d completion tokens past max_tokens 4", s.CompletionTokens)
	}
	b := s.Bounds
	if s.KV == nil || b == nil {
		t.Fatalf("kv %v bounds %v", s.KV, b)
	}
	t.Logf("measured %.3f, bound %.3f, fleet bound %.3f (%+v)", s.KV.HitRate, b.HitRate, b.FleetHitRate, *b)
	if b.Requests != 120 || b.Skipped != 0 || b.Caches != 3 || b.CacheBlocks != 20000 || b.BlockTokens != 16 {
		t.Fatalf("bounds over %+v", *b)
	}
	if float64(b.QueriedTokens) != s.KV.QueriedTokens || b.QueriedTokens != s.PromptTokens {
		t.Fatalf("bounds counted %d prompt tokens, gpusim %g, usage %d", b.QueriedTokens, s.KV.QueriedTokens, s.PromptTokens)
	}
	if b.HitRate <= 0.3 || s.KV.HitRate > b.HitRate || b.FleetHitRate > b.HitRate {
		t.Fatalf("measured %g, bound %g, fleet bound %g", s.KV.HitRate, b.HitRate, b.FleetHitRate)
	}
}

// The bounds are computed for generated workloads too, and a warm-up
// counts as earlier requests without being measured.
func TestBoundsOfAGeneratedWorkload(t *testing.T) {
	_, cfg := startFleet(t, 2, 20000)
	w := workload.DefaultConfig()
	w.Model = gpusim.FastConfig().Model
	w.MaxTokens = 4
	w.RAG.Documents = 4
	w.RAG.DocumentTokens = 400
	gen, err := workload.New(w)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Rate = 200
	cfg.Warmup = 100 * time.Millisecond
	cfg.Duration = 200 * time.Millisecond
	s, err := loadtest.Run(context.Background(), cfg, gen)
	if err != nil {
		t.Fatal(err)
	}
	b := s.Bounds
	if b == nil || s.KV == nil {
		t.Fatalf("kv %v bounds %v", s.KV, b)
	}
	t.Logf("measured %.3f, bound %.3f, fleet bound %.3f (%+v)", s.KV.HitRate, b.HitRate, b.FleetHitRate, *b)
	if b.Requests != s.Requests+s.Canceled || b.Unmeasured != s.WarmupRequests || b.Caches != 2 {
		t.Fatalf("bounds over %d requests (%d unmeasured); the run measured %d, warmed %d", b.Requests, b.Unmeasured, s.Requests, s.WarmupRequests)
	}
	// four documents, warmed up: nearly every prompt is cached but for
	// its question
	if b.HitRate < 0.8 || s.KV.HitRate > b.HitRate+0.02 {
		t.Fatalf("measured %g, bound %g", s.KV.HitRate, b.HitRate)
	}
}

// A replay ends after its last request in either loop, whatever
// cfg.Requests allows; the closed loop ignores the times.
func TestReplayEndsWithTheTrace(t *testing.T) {
	recs, err := trace.Generate(trace.GenConfig{Seed: 9, Requests: 30, Rate: 1, BlockTokens: 64,
		MeanInputTokens: 300, MeanOutputTokens: 4, Turns: 3, Think: time.Second, DocShare: 0.2, Documents: 2})
	if err != nil {
		t.Fatal(err)
	}
	_, cfg := startFleet(t, 1, 20000)
	rc := trace.DefaultReplayConfig()
	rc.BlockTokens = 64
	rc.Model = gpusim.FastConfig().Model
	for _, mode := range []loadtest.Mode{loadtest.OpenLoop, loadtest.ClosedLoop} {
		if mode == loadtest.OpenLoop {
			rc.TimeScale = 100 // 30 s of trace in 0.3 s
		} else {
			rc.TimeScale = 1
		}
		replay, err := trace.NewReplay(recs, rc)
		if err != nil {
			t.Fatal(err)
		}
		c := cfg
		c.Mode, c.Concurrency, c.Requests = mode, 4, 1000
		start := time.Now()
		s, err := loadtest.Run(context.Background(), c, replay)
		if err != nil {
			t.Fatal(err)
		}
		// 30 s of trace: the closed loop does not wait for it
		if s.Sent != 30 || s.OK != 30 || s.Bounds == nil || s.Bounds.Requests != 30 || time.Since(start) > 20*time.Second {
			t.Fatalf("%s loop: sent %d ok %d bounds %+v in %v", mode, s.Sent, s.OK, s.Bounds, time.Since(start))
		}
	}
}
