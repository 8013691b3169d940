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

// scraper reads the backends' prefix-cache counters.
type scraper struct {
	hc   *http.Client
	urls []string
	ids  []string // host:port of each URL

	mu sync.Mutex
	// aliases maps a backend's own name (its X-Gpusim-Instance header) to
	// its id, so shares of a fleet driven without a router are keyed like
	// the router's X-Warmroute-Backend.
	aliases map[string]string
}

func newScraper(urls []string) *scraper {
	s := &scraper{
		hc:      &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 2, DisableCompression: true}},
		urls:    urls,
		aliases: map[string]string{},
	}
	for _, u := range urls {
		s.ids = append(s.ids, hostPort(u))
	}
	return s
}

func (s *scraper) close() {
	if t, ok := s.hc.Transport.(*http.Transport); ok {
		t.CloseIdleConnections()
	}
}

// scrape reads every backend in parallel. It returns the counters of those
// that answered and the first error.
func (s *scraper) scrape(ctx context.Context) (map[string]stats.CacheCounters, error) {
	out := make(map[string]stats.CacheCounters, len(s.urls))
	var (
		mu       sync.Mutex
		wg       sync.WaitGroup
		firstErr error
	)
	for i := range s.urls {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			c, err := s.one(ctx, i)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				if firstErr == nil {
					firstErr = fmt.Errorf("%w: %s: %v", ErrMetrics, s.urls[i], err)
				}
				return
			}
			out[s.ids[i]] = c
		}(i)
	}
	wg.Wait()
	return out, firstErr
}

func (s *scraper) one(ctx context.Context, i int) (stats.CacheCounters, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.urls[i], nil)
	if err != nil {
		return stats.CacheCounters{}, err
	}
	req.Header.Set("Accept", "text/plain;version=0.0.4")
	resp, err := s.hc.Do(req)
	if err != nil {
		return stats.CacheCounters{}, err
	}
	defer resp.Body.Close()
	if name := resp.Header.Get(HeaderGpusimInstance); name != "" {
		s.mu.Lock()
		s.aliases[name] = s.ids[i]
		s.mu.Unlock()
	}
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		return stats.CacheCounters{}, fmt.Errorf("HTTP %d", resp.StatusCode)
	}
	return kvmetrics.Parse(io.LimitReader(resp.Body, 32<<20))
}

// aliasMap returns a copy of the name-to-id aliases learnt so far.
func (s *scraper) aliasMap() map[string]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := make(map[string]string, len(s.aliases))
	for k, v := range s.aliases {
		m[k] = v
	}
	return m
}
