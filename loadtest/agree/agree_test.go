package agree

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warmroute/warmroute/internal/testkit"
)

// explainer is a stub route explainer: it answers every request with the
// backend pick(body) names, owner b0 at epoch 7, and counts the calls.
func explainer(t *testing.T, pick func(body string) (backend, reason string), calls *atomic.Int64) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		if r.Method != http.MethodPost || r.URL.Path != "/debug/route/v1/chat/completions" {
			http.Error(w, "wrong call "+r.Method+" "+r.URL.Path, http.StatusNotFound)
			return
		}
		b, _ := io.ReadAll(r.Body)
		backend, reason := pick(string(b))
		json.NewEncoder(w).Encode(map[string]any{
			"epoch": 7, "backend": backend, "reason": reason, "rank": 1, "recompute": 2,
			"candidates": []map[string]any{{"id": "b0", "state": "active", "healthy": true, "in_flight": 5, "queued": 3}, {"id": "b1", "state": "active", "healthy": true, "in_flight": 2, "busy": true}},
		})
	}))
	t.Cleanup(srv.Close)
	return srv
}

// Three routers, two requests: all pick alike for the first; for the
// second one router overflows, so picks disagree while owners agree. A
// fourth router that always fails only counts as unanswered calls.
func TestRunCountsAgreement(t *testing.T) {
	var calls atomic.Int64
	same := func(string) (string, string) { return "b0", "affinity" }
	overflow := func(body string) (string, string) {
		if strings.Contains(body, "second") {
			return "b1", "overflow"
		}
		return "b0", "affinity"
	}
	down := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, `{"error":"no"}`, http.StatusServiceUnavailable)
	}))
	defer down.Close()
	cfg := Config{
		Routers: []Router{
			{Name: "a", AdminURL: explainer(t, same, &calls).URL},
			{Name: "b", AdminURL: explainer(t, same, &calls).URL},
			{Name: "c", AdminURL: explainer(t, overflow, &calls).URL},
			{Name: "d", AdminURL: down.URL},
		},
		Requests: []Request{
			{Path: "/v1/chat/completions", Body: []byte(`{"first":1}`)},
			{Path: "/v1/chat/completions", Body: []byte(`{"second":1}`)},
		},
		Every: 10 * time.Millisecond,
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		defer cancel()
		for deadline := time.Now().Add(10 * time.Second); calls.Load() < 30 && time.Now().Before(deadline); {
			time.Sleep(5 * time.Millisecond)
		}
	}()
	got := Run(ctx, cfg)
	if got.Rounds < 1 || got.Routers != 4 {
		t.Fatalf("%+v: want rounds and 4 routers", got)
	}
	if got.Compared != 2*got.Rounds || got.Picks != got.Rounds || got.Owners != got.Compared || got.SameEpoch != got.Rounds {
		t.Errorf("%+v: want every request compared, the first's picks agreeing, every owner and epoch agreeing", got)
	}
	if got.Failed != 2*got.Rounds {
		t.Errorf("failed %d, want the down router's 2 per round (%d rounds)", got.Failed, got.Rounds)
	}
	if !strings.Contains(got.First, "request 1:") || !strings.Contains(got.First, "c->b1 (overflow rank 1; owner in flight 5, queued 3; recompute 2; then b1 2/0b)") || !strings.Contains(got.First, "a->b0 (affinity; owner in flight 5, queued 3; recompute 2; then b1 2/0b)") {
		t.Errorf("first disagreement %q", got.First)
	}
	if got.SteadyCompared != got.Compared || got.SteadyPicks != got.Picks || got.FirstSteady != got.First {
		t.Errorf("%+v: every round at one epoch, want the steady counts and first disagreement the same as the run's", got)
	}
}

// Run leaves no goroutine behind: its rounds end with it and its own
// client's connections are closed.
func TestRunLeavesNothing(t *testing.T) {
	var calls atomic.Int64
	pick := func(string) (string, string) { return "b0", "affinity" }
	a, b := explainer(t, pick, &calls), explainer(t, pick, &calls)
	defer testkit.VerifyNoLeaks(t, testkit.IgnoreCurrent())
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	got := Run(ctx, Config{Routers: []Router{{Name: "a", AdminURL: a.URL}, {Name: "b", AdminURL: b.URL}},
		Requests: []Request{{Path: "/v1/chat/completions", Body: []byte(`{}`)}}, Every: 10 * time.Millisecond})
	if got.Rounds == 0 || got.Picks != got.Rounds {
		t.Fatalf("%+v", got)
	}
}

// Fewer than two routers, or nothing to ask: nothing is asked.
func TestRunNeedsTwoRouters(t *testing.T) {
	var calls atomic.Int64
	srv := explainer(t, func(string) (string, string) { return "b0", "affinity" }, &calls)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	got := Run(ctx, Config{Routers: []Router{{Name: "a", AdminURL: srv.URL}}, Requests: []Request{{Path: "/v1/chat/completions", Body: []byte(`{}`)}}})
	if got.Rounds != 0 || calls.Load() != 0 {
		t.Fatalf("one router: %+v after %d calls", got, calls.Load())
	}
}

// Routers at different epochs in a round: the round does not count as at
// one epoch.
func TestTallyEpochs(t *testing.T) {
	rs := []Router{{Name: "a"}, {Name: "b"}}
	answers := [][]Explanation{{{Epoch: 3, Backend: "x"}}, {{Epoch: 4, Backend: "x"}}}
	ok := [][]bool{{true}, {true}}
	got := tally(rs, answers, ok)
	if got.SameEpoch != 0 || got.Picks != 1 || got.Compared != 1 || got.SteadyCompared != 0 || got.SteadyPicks != 0 {
		t.Fatalf("%+v", got)
	}
	// At one epoch the round is the steady state's, its disagreements too.
	answers = [][]Explanation{{{Epoch: 4, Backend: "x"}, {Epoch: 4, Backend: "x"}}, {{Epoch: 4, Backend: "x"}, {Epoch: 4, Backend: "y"}}}
	ok = [][]bool{{true, true}, {true, true}}
	got = tally(rs, answers, ok)
	if got.SameEpoch != 1 || got.Compared != 2 || got.Picks != 1 || got.SteadyCompared != 2 || got.SteadyPicks != 1 {
		t.Fatalf("one epoch: %+v", got)
	}
}

// An oversized or malformed answer is an unanswered call, not a pick.
func TestExplainBoundsAnswer(t *testing.T) {
	for name, body := range map[string]string{
		"too large": `{"backend":"` + strings.Repeat("x", maxAnswer) + `"}`,
		"not json":  `backend: b0`,
	} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, body) }))
		_, err := explain(context.Background(), srv.Client(), time.Second, srv.URL, Request{Path: "/v1/chat/completions", Body: []byte(`{}`)})
		srv.Close()
		if err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

// A hostile explainer's answer (a far rank, many candidates, long names)
// gives a description of bounded length.
func TestDescribeBounded(t *testing.T) {
	long := strings.Repeat("x", 10000)
	var e Explanation
	e.Backend, e.Reason, e.Rank = long, long, 1<<40
	for range 1000 {
		e.Candidates = append(e.Candidates, Candidate{ID: long})
	}
	rs := []Router{{Name: "a"}, {Name: "b"}}
	d := describe(rs, [][]Explanation{{e}, {{Backend: "b0", Reason: "affinity"}}}, [][]bool{{true}, {true}}, 0)
	if len(d) > 2000 {
		t.Fatalf("description of %d bytes", len(d))
	}
	if !strings.Contains(d, "a->"+long[:describedName]+"...") || strings.Count(d, long[:describedName]) != 2+describedAfter {
		t.Errorf("description %q: want the backend, reason and %d candidates cut to %d bytes", d, describedAfter, describedName)
	}
}
