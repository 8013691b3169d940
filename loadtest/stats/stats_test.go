package stats

import (
	"encoding/json"
	"fmt"
	"math"
	"sync"
	"testing"
	"time"
)

func within(got, want, rel float64) bool {
	return math.Abs(got-want) <= rel*math.Abs(want)
}

func TestPercentiles(t *testing.T) {
	r := NewRecorder()
	// TTFT 1..1000 ms, E2E ten times that, one ITL gap of 5 ms each
	for i := 1; i <= 1000; i++ {
		r.Record(&Outcome{
			TTFT: time.Duration(i) * time.Millisecond,
			E2E:  time.Duration(10*i) * time.Millisecond,
			ITL:  []time.Duration{5 * time.Millisecond, 7 * time.Millisecond},
		})
	}
	s := r.Summarize(10*time.Second, nil)
	checks := []struct {
		name      string
		got, want float64
	}{
		{"ttft p50", s.TTFT.P50Ms, 500},
		{"ttft p90", s.TTFT.P90Ms, 900},
		{"ttft p99", s.TTFT.P99Ms, 990},
		{"ttft max", s.TTFT.MaxMs, 1000},
		{"ttft mean", s.TTFT.MeanMs, 500.5},
		{"e2e p50", s.E2E.P50Ms, 5000},
		{"e2e p99", s.E2E.P99Ms, 9900},
		{"itl p50", s.ITL.P50Ms, 5},
		{"itl p99", s.ITL.P99Ms, 7},
	}
	for _, c := range checks {
		// three significant digits
		if !within(c.got, c.want, 0.001) {
			t.Errorf("%s = %g, want %g", c.name, c.got, c.want)
		}
	}
	if s.TTFT.Count != 1000 || s.ITL.Count != 2000 {
		t.Errorf("counts: ttft %d, itl %d", s.TTFT.Count, s.ITL.Count)
	}
	if s.RequestsPerSec != 100 {
		t.Errorf("requests/s = %g, want 100", s.RequestsPerSec)
	}
	// the CDF is monotone and ends at the maximum
	prev := Point{}
	for _, p := range s.TTFTCDF {
		if p.Ms < prev.Ms || p.Quantile < prev.Quantile {
			t.Fatalf("CDF not monotone at %+v after %+v", p, prev)
		}
		prev = p
	}
	if last := s.TTFTCDF[len(s.TTFTCDF)-1]; last.Quantile != 1 || !within(last.Ms, 1000, 0.001) {
		t.Errorf("CDF ends at %+v", last)
	}
}

func TestEmptyRecorder(t *testing.T) {
	s := NewRecorder().Summarize(0, []string{"a"})
	if s.Requests != 0 || s.TTFT != (Latency{}) || s.TTFTCDF != nil || s.Shares != nil || s.ShareMaxMin != 0 || s.RequestsPerSec != 0 {
		t.Fatalf("empty summary not zero: %+v", s)
	}
	if _, err := json.Marshal(s); err != nil {
		t.Fatal(err)
	}
}

func TestErrorsTokensAndThroughput(t *testing.T) {
	r := NewRecorder()
	for i := 0; i < 30; i++ {
		r.Record(&Outcome{TTFT: time.Millisecond, E2E: time.Millisecond, Backend: "b1", Decision: "affinity",
			PromptTokens: 100, CompletionTokens: 10, CachedTokens: 75})
	}
	r.Record(&Outcome{Err: "http_503", Backend: "b2", Decision: "overflow", TTFT: time.Hour})
	r.Record(&Outcome{Err: "connect"})
	r.Record(&Outcome{Err: "connect"})
	ok, failed := r.Counts()
	if ok != 30 || failed != 3 {
		t.Fatalf("counts %d/%d", ok, failed)
	}
	s := r.Summarize(2*time.Second, nil)
	if s.Requests != 33 || s.Errors["connect"] != 2 || s.Errors["http_503"] != 1 {
		t.Fatalf("errors %+v", s)
	}
	if s.TTFT.MaxMs != 1 {
		t.Fatalf("a failed request's latency was recorded: max %g", s.TTFT.MaxMs)
	}
	if s.RequestsPerSec != 15 || s.OutputTokensPerSec != 150 || s.PromptTokensPerSec != 1500 {
		t.Fatalf("throughput %g req/s %g out/s %g prompt/s", s.RequestsPerSec, s.OutputTokensPerSec, s.PromptTokensPerSec)
	}
	if s.UsageCachedRate != 0.75 {
		t.Fatalf("usage cached rate %g", s.UsageCachedRate)
	}
	if s.Decisions["affinity"] != 30 || s.Decisions["overflow"] != 1 || s.Backends["b2"] != 1 {
		t.Fatalf("decisions %v backends %v", s.Decisions, s.Backends)
	}
}

func TestShares(t *testing.T) {
	counts := map[string]int64{"a": 20, "b": 30, "c": 50}
	sh, ratio := trafficShares(counts, nil)
	if sh["a"] != 0.2 || sh["b"] != 0.3 || sh["c"] != 0.5 || ratio != 2.5 {
		t.Fatalf("shares %v ratio %g", sh, ratio)
	}
	// an expected backend with no traffic makes the ratio unbounded (0)
	sh, ratio = trafficShares(counts, []string{"a", "b", "c", "d"})
	if ratio != 0 || sh["d"] != 0 || len(sh) != 4 {
		t.Fatalf("with an idle backend: shares %v ratio %g", sh, ratio)
	}
	// traffic to an unexpected backend counts in the shares but not the ratio
	sh, ratio = trafficShares(map[string]int64{"a": 10, "b": 12, "x": 78}, []string{"a", "b"})
	if !within(ratio, 1.2, 1e-12) || sh["x"] != 0.78 {
		t.Fatalf("shares %v ratio %g", sh, ratio)
	}
	// seven instances at 13.3%-15.4% (the seed's figures) give 1.16
	seven := map[string]int64{"1": 133, "2": 154, "3": 140, "4": 145, "5": 143, "6": 142, "7": 143}
	if _, ratio = trafficShares(seven, nil); !within(ratio, 154.0/133, 1e-12) {
		t.Fatalf("seven: ratio %g", ratio)
	}
	if sh, ratio := trafficShares(nil, []string{"a"}); sh != nil || ratio != 0 {
		t.Fatal("no traffic gives shares")
	}
}

func TestHitRateFromDeltas(t *testing.T) {
	before := map[string]CacheCounters{
		"a":    {Queries: 1000, Hits: 100},
		"b":    {Queries: 500, Hits: 500},
		"c":    {Queries: 9000, Hits: 8000}, // restarts during the window
		"gone": {Queries: 7, Hits: 7},       // not scraped at the end
	}
	after := map[string]CacheCounters{
		"a":   {Queries: 3000, Hits: 1600}, // +2000, +1500
		"b":   {Queries: 500, Hits: 500},   // idle
		"c":   {Queries: 400, Hits: 100},   // reset: counts as +400, +100
		"new": {Queries: 600, Hits: 300},   // appeared: +600, +300
	}
	r := HitRate(before, after)
	if r.QueriedTokens != 3000 || r.HitTokens != 1900 {
		t.Fatalf("totals %g/%g, want 1900/3000", r.HitTokens, r.QueriedTokens)
	}
	if !within(r.HitRate, 1900.0/3000, 1e-12) {
		t.Fatalf("hit rate %g", r.HitRate)
	}
	want := map[string]float64{"a": 0.75, "b": 0, "c": 0.25, "new": 0.5}
	for k, v := range want {
		if r.ByBackend[k] != v {
			t.Errorf("backend %s rate %g, want %g", k, r.ByBackend[k], v)
		}
	}
	if _, ok := r.ByBackend["gone"]; ok {
		t.Error("a backend missing from the last scrape has a rate")
	}
	if z := HitRate(nil, nil); z.HitRate != 0 || z.QueriedTokens != 0 {
		t.Fatalf("empty: %+v", z)
	}
}

func TestRecorderConcurrent(t *testing.T) {
	r := NewRecorder()
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 500; i++ {
				r.Record(&Outcome{TTFT: time.Millisecond, E2E: 2 * time.Millisecond, Backend: "x"})
				r.Counts()
			}
		}()
	}
	wg.Wait()
	if s := r.Summarize(time.Second, nil); s.OK != 4000 || s.Backends["x"] != 4000 || s.ShareMaxMin != 1 {
		t.Fatalf("summary %+v", s)
	}
}

// TestDecisionTokens: successful requests' prompt and cached tokens are
// split by decision; failures and requests without usage are not; the
// kinds are bounded.
func TestDecisionTokens(t *testing.T) {
	r := NewRecorder()
	r.Record(&Outcome{Decision: "affinity", PromptTokens: 100, CachedTokens: 90})
	r.Record(&Outcome{Decision: "affinity", PromptTokens: 100, CachedTokens: 70})
	r.Record(&Outcome{Decision: "overflow", PromptTokens: 200, CachedTokens: 0})
	r.Record(&Outcome{Decision: "overflow", Err: "timeout", PromptTokens: 50})
	r.Record(&Outcome{Decision: "fallback"})
	s := r.Summarize(time.Second, nil)
	want := map[string]DecisionTokens{"affinity": {2, 200, 160}, "overflow": {1, 200, 0}}
	if len(s.DecisionTokens) != len(want) {
		t.Fatalf("decision tokens %+v, want %+v", s.DecisionTokens, want)
	}
	for k, w := range want {
		if s.DecisionTokens[k] != w {
			t.Fatalf("%s: %+v, want %+v", k, s.DecisionTokens[k], w)
		}
	}
	if got := s.DecisionTokens["affinity"].CachedRate(); got != 0.8 {
		t.Fatalf("affinity cached rate %v", got)
	}
	for i := 0; i < 2*maxDecisionKinds; i++ {
		r.Record(&Outcome{Decision: fmt.Sprint("kind", i), PromptTokens: 1})
	}
	if n := len(r.Summarize(time.Second, nil).DecisionTokens); n != maxDecisionKinds {
		t.Fatalf("%d decision kinds kept, want at most %d", n, maxDecisionKinds)
	}
}
