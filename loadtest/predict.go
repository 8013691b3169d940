package loadtest

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/warmroute/warmroute/loadtest/kvmetrics"
	"github.com/warmroute/warmroute/loadtest/stats"
)

// predictions reads the routers' cache prediction counters (their admin
// /metrics) at the start of the measured window and at its end, for
// Summary.Predictions. A router read at the start but not at the end (or
// the other way round) is left out of the figures.
type predictions struct {
	hc   *http.Client
	urls []string

	mu    sync.Mutex
	start map[string]stats.PredictionCounters // by URL
}

func newPredictions(urls []string) *predictions {
	return &predictions{
		hc:   &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 1, DisableCompression: true}},
		urls: urls,
	}
}

func (p *predictions) close() {
	if t, ok := p.hc.Transport.(*http.Transport); ok {
		t.CloseIdleConnections()
	}
}

// scrape reads every router in parallel and returns the counters of those
// that answered.
func (p *predictions) scrape(ctx context.Context) map[string]stats.PredictionCounters {
	out := make(map[string]stats.PredictionCounters, len(p.urls))
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, u := range p.urls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := p.one(ctx, u)
			if err != nil {
				return
			}
			mu.Lock()
			out[u] = c
			mu.Unlock()
		}()
	}
	wg.Wait()
	return out
}

func (p *predictions) one(ctx context.Context, u string) (stats.PredictionCounters, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "text/plain;version=0.0.4")
	resp, err := p.hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		return nil, fmt.Errorf("HTTP %d", resp.StatusCode)
	}
	return kvmetrics.ParsePredictions(io.LimitReader(resp.Body, 32<<20))
}

// begin takes the counters the window starts from.
func (p *predictions) begin(ctx context.Context) {
	cur := p.scrape(ctx)
	p.mu.Lock()
	p.start = cur
	p.mu.Unlock()
}

// end reads the counters again and returns what the window counted, per
// kind (nil when no router was read at both ends).
func (p *predictions) end(ctx context.Context) []stats.Prediction {
	cur := p.scrape(ctx)
	p.mu.Lock()
	defer p.mu.Unlock()
	from, to := stats.PredictionCounters{}, stats.PredictionCounters{}
	n := 0
	for u, c := range cur {
		s, ok := p.start[u]
		if !ok {
			continue
		}
		n++
		from.Add(s)
		to.Add(c)
	}
	if n == 0 {
		return nil
	}
	return stats.PredictionDelta(from, to)
}
