package loadtest

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"go.uber.org/goleak"

	"github.com/warmroute/warmroute/loadtest/gpusim"
	"github.com/warmroute/warmroute/loadtest/stats"
	"github.com/warmroute/warmroute/loadtest/workload"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// simRun starts n gpusim instances of model sim and returns them, a RAG
// workload for their model and a Config sending to all of them.
func simRun(t *testing.T, n int, sim gpusim.Config) (*gpusim.Fleet, workload.Generator, Config) {
	t.Helper()
	f, err := gpusim.StartFleet(context.Background(), gpusim.FleetConfig{N: n, Instance: sim})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.Close() })
	cfg := DefaultConfig()
	cfg.Targets = f.URLs()
	return f, ragWorkload(t, sim.Model), cfg
}

// ragWorkload is a small RAG workload for model: four documents of 400
// tokens, 8 output tokens.
func ragWorkload(t *testing.T, model string) workload.Generator {
	t.Helper()
	w := workload.DefaultConfig()
	w.Model = model
	w.MaxTokens = 8
	w.RAG.Documents = 4
	w.RAG.DocumentTokens = 400
	g, err := workload.New(w)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func metricsURLs(urls []string) []string {
	out := make([]string, len(urls))
	for i, u := range urls {
		out[i] = u + "/metrics"
	}
	return out
}

// closedLoop is a closed-loop Config of workers sending requests in all
// to target.
func closedLoop(target string, workers, requests int) Config {
	cfg := DefaultConfig()
	cfg.Targets = []string{target}
	cfg.Mode = ClosedLoop
	cfg.Concurrency = workers
	cfg.Requests = requests
	cfg.Duration = 0
	return cfg
}

// mustRun runs cfg with gen and fails the test on an error.
func mustRun(t *testing.T, cfg Config, gen workload.Generator) stats.Summary {
	t.Helper()
	s, err := Run(context.Background(), cfg, gen)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// Streamed answers of the stub servers.
const (
	chunkA  = "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n"
	sseDone = "data: [DONE]\n\n"
)

// newStub returns an unstarted server that lists model "m" on /v1/models
// and answers every other request with h once it has read the body.
func newStub(h http.HandlerFunc) *httptest.Server {
	return httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/models" {
			fmt.Fprint(w, `{"data":[{"id":"m"}]}`)
			return
		}
		_, _ = io.Copy(io.Discard, r.Body)
		h(w, r)
	}))
}

// startStub starts newStub(h) and closes it when the test ends.
func startStub(t *testing.T, h http.HandlerFunc) *httptest.Server {
	srv := newStub(h)
	srv.Start()
	t.Cleanup(srv.Close)
	return srv
}

// writerFunc adapts a function to io.Writer (a Progress that watches the
// lines as they are written).
type writerFunc func(p []byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
