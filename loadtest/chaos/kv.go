package chaos

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/warmroute/warmroute/loadtest/kvmetrics"
	"github.com/warmroute/warmroute/loadtest/stats"
)

// kvScraper scrapes the backends' prefix-cache counters.
type kvScraper struct {
	cfg *Config
	hc  *http.Client
	t0  time.Time

	mu      sync.Mutex
	targets map[string]string // backend id -> metrics URL
	points  []KVPoint
}

func newKVScraper(cfg *Config, backends []Backend, t0 time.Time) *kvScraper {
	tr := &http.Transport{
		Proxy:               nil,
		DialContext:         (&net.Dialer{Timeout: 500 * time.Millisecond}).DialContext,
		MaxIdleConnsPerHost: 2,
		IdleConnTimeout:     30 * time.Second,
	}
	s := &kvScraper{cfg: cfg, hc: &http.Client{Transport: tr, Timeout: cfg.KVInterval}, t0: t0}
	s.setTargets(backends)
	return s
}

// setTargets replaces the scraped backends (their addresses may change
// after a restart).
func (s *kvScraper) setTargets(backends []Backend) {
	m := make(map[string]string, len(backends))
	for _, b := range backends {
		if b.MetricsURL != "" {
			m[b.ID] = b.MetricsURL
		}
	}
	s.mu.Lock()
	s.targets = m
	s.mu.Unlock()
}

// Points returns a copy of the scrapes so far.
func (s *kvScraper) Points() []KVPoint {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]KVPoint(nil), s.points...)
}

// Run scrapes every KVInterval until ctx ends.
func (s *kvScraper) Run(ctx context.Context) {
	defer s.hc.CloseIdleConnections()
	t := time.NewTicker(s.cfg.KVInterval)
	defer t.Stop()
	for {
		p := s.scrape(ctx)
		if ctx.Err() != nil {
			return
		}
		s.mu.Lock()
		s.points = append(s.points, p)
		s.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// scrape reads every backend at once; the point is stamped when the last
// answer is in.
func (s *kvScraper) scrape(ctx context.Context) KVPoint {
	s.mu.Lock()
	targets := make(map[string]string, len(s.targets))
	for k, v := range s.targets {
		targets[k] = v
	}
	s.mu.Unlock()
	p := KVPoint{Counters: make(map[string]stats.CacheCounters, len(targets))}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for id, url := range targets {
		wg.Add(1)
		go func(id, url string) {
			defer wg.Done()
			c, err := s.one(ctx, url)
			if err != nil {
				return
			}
			mu.Lock()
			p.Counters[id] = c
			mu.Unlock()
		}(id, url)
	}
	wg.Wait()
	p.At = time.Since(s.t0)
	return p
}

func (s *kvScraper) one(ctx context.Context, url string) (stats.CacheCounters, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return stats.CacheCounters{}, err
	}
	resp, err := s.hc.Do(req)
	if err != nil {
		return stats.CacheCounters{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return stats.CacheCounters{}, fmt.Errorf("%s: HTTP %d", url, resp.StatusCode)
	}
	return kvmetrics.Parse(resp.Body)
}
