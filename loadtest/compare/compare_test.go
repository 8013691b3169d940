package compare

import (
	"bytes"
	"context"
	"errors"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warmroute/warmroute/loadtest"
	"github.com/warmroute/warmroute/loadtest/fleet"
	"github.com/warmroute/warmroute/loadtest/internal/fakefleet"
	"github.com/warmroute/warmroute/loadtest/stats"
	"github.com/warmroute/warmroute/loadtest/workload"
)

// The test binary doubles as gpusim and the router (see fakefleet).
func TestMain(m *testing.M) { fakefleet.TestMain(m) }

func testPlan(t *testing.T, requests int) Plan {
	t.Helper()
	fc := fleet.DefaultConfig()
	fc.Exe = os.Args[0]
	fc.Env = []string{fakefleet.Env + "=ok"}
	fc.Instances = 4
	fc.LogDir = t.TempDir()
	rag := workload.DefaultConfig()
	rag.MaxTokens = 4
	rag.RAG.Documents = 4
	rag.RAG.DocumentTokens = 300
	none := rag
	none.Kind = workload.KindNoReuse
	none.NoReuse.PromptTokens = 300
	load := loadtest.DefaultConfig()
	load.Mode = loadtest.ClosedLoop
	load.Concurrency = 2
	load.Requests = requests
	return Plan{
		Cases: []Case{
			{Name: "rag", Workload: rag, Load: load},
			{Name: "noreuse", Workload: none, Load: load},
		},
		Strategies: []string{"RANDOM", "PREFIX_AWARE"},
		Fleet:      fc,
	}
}

func TestExecuteComparesStrategies(t *testing.T) {
	p := testPlan(t, 60)
	var mu sync.Mutex
	var seen []string
	p.OnResult = func(s stats.Summary) {
		mu.Lock()
		seen = append(seen, s.Workload+"/"+s.Label)
		mu.Unlock()
	}
	var progress strings.Builder
	p.Progress = &progress
	runs, err := Execute(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"rag/RANDOM", "rag/PREFIX_AWARE", "noreuse/RANDOM", "noreuse/PREFIX_AWARE"}
	if strings.Join(seen, " ") != strings.Join(want, " ") || len(runs) != 4 {
		t.Fatalf("runs %v, want %v", seen, want)
	}
	for _, r := range runs {
		if r.OK != 60 || r.KV == nil || len(r.Shares) != 4 {
			t.Fatalf("%s/%s: ok %d kv %v shares %v", r.Workload, r.Label, r.OK, r.KV, r.Shares)
		}
	}
	random, prefix := runs[0], runs[1]
	// every run starts cold and sends the same requests: the prompt
	// tokens are identical, and prefix routing misses each document once
	if random.PromptTokens != prefix.PromptTokens {
		t.Fatalf("different traffic: %d vs %d prompt tokens", random.PromptTokens, prefix.PromptTokens)
	}
	if prefix.KV.HitRate <= random.KV.HitRate {
		t.Fatalf("prefix-aware hit rate %.3f not above random's %.3f", prefix.KV.HitRate, random.KV.HitRate)
	}
	if prefix.Decisions["affinity"] == 0 || random.Decisions["random"] != 60 {
		t.Fatalf("decisions %v / %v", prefix.Decisions, random.Decisions)
	}
	// the no-reuse control hits nothing beyond the chat template's blocks
	if runs[2].KV.HitRate > 0.05 || runs[3].KV.HitRate > 0.05 {
		t.Fatalf("no-reuse hit rates %.3f %.3f", runs[2].KV.HitRate, runs[3].KV.HitRate)
	}
	if !strings.Contains(progress.String(), "cold fleet") {
		t.Fatalf("progress: %q", progress.String())
	}
}

func TestInterruptReturnsPartialRuns(t *testing.T) {
	p := testPlan(t, 0)
	for i := range p.Cases {
		p.Cases[i].Load.Duration = time.Minute
	}
	// interrupt at the first progress line of a run that counts an answer
	// (at the latest after 30 s)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	progress := writerFunc(func(line []byte) (int, error) {
		if bytes.Contains(line, []byte("in flight")) && !bytes.Contains(line, []byte(" ok 0 ")) {
			cancel()
		}
		return len(line), nil
	})
	p.Progress = progress
	for i := range p.Cases {
		p.Cases[i].Load.Progress = progress
		p.Cases[i].Load.ProgressInterval = 100 * time.Millisecond
	}
	runs, err := Execute(ctx, p)
	if !errors.Is(err, loadtest.ErrInterrupted) {
		t.Fatalf("error %v", err)
	}
	if len(runs) != 1 || !runs[0].Partial || runs[0].OK == 0 {
		t.Fatalf("runs %+v", runs)
	}
}

func TestValidatePlan(t *testing.T) {
	p := testPlan(t, 10)
	p.Strategies = []string{"NOPE"}
	if err := p.Validate(); err == nil {
		t.Fatal("unknown strategy accepted")
	}
	p = testPlan(t, 10)
	p.Cases = nil
	if err := p.Validate(); !errors.Is(err, ErrBadPlan) {
		t.Fatalf("no cases: %v", err)
	}
	p = testPlan(t, 10)
	p.Cases[0].Workload.RAG.Documents = 0
	if err := p.Validate(); err == nil {
		t.Fatal("bad workload accepted")
	}
}

// writerFunc adapts a function to io.Writer (a Progress that watches the
// lines as they are written).
type writerFunc func(p []byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
