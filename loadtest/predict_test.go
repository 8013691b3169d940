package loadtest

import (
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"
)

// TestRunReadsPredictions: a run that names routers' metrics reports
// what their prediction counters counted while it ran, and not what they
// had counted before.
func TestRunReadsPredictions(t *testing.T) {
	var answered atomic.Int64
	target := startStub(t, func(w http.ResponseWriter, r *http.Request) {
		answered.Add(1) // before the answer, which the run waits for
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, chunkA+sseDone)
	})
	// A router that had counted 100 answers before the run, and counts
	// each answer of the run as predicted and delivered warm.
	router := startStub(t, func(w http.ResponseWriter, r *http.Request) {
		n := 100 + answered.Load()
		fmt.Fprintf(w, "warmroute_cache_answers_total{backend=\"a\",kind=\"affinity\",predicted=\"warm\",delivered=\"warm\"} %d\n", n)
		fmt.Fprintf(w, "warmroute_cache_prompt_tokens_total{backend=\"a\",kind=\"affinity\",predicted=\"warm\"} %d\n", 1000*n)
		fmt.Fprintf(w, "warmroute_cache_cached_tokens_total{backend=\"a\",kind=\"affinity\",predicted=\"warm\"} %d\n", 900*n)
	})
	cfg := closedLoop(target.URL, 2, 12)
	cfg.RouterMetricsURLs = []string{router.URL + "/metrics"}
	s := mustRun(t, cfg, ragWorkload(t, "m"))
	if s.OK != 12 || len(s.Predictions) != 1 {
		t.Fatalf("ok %d, predictions %+v", s.OK, s.Predictions)
	}
	p := s.Predictions[0]
	if p.Kind != "affinity" || p.Answers != 12 || p.Reported != 12 || p.BothWarm != 12 || p.PromptTokens != 12000 || p.TokenHitRate != 0.9 {
		t.Fatalf("predictions %+v", p)
	}

	// Without router metrics, none.
	if s := mustRun(t, closedLoop(target.URL, 1, 2), ragWorkload(t, "m")); s.Predictions != nil {
		t.Fatalf("predictions without routers: %+v", s.Predictions)
	}
}
