package engine

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Errors returned by Validate and New.
var (
	ErrInvalidConfig = errors.New("engine: invalid config")
	ErrBodyTooLarge  = errors.New("engine: metrics body too large")

	errRedirect = errors.New("engine: metrics endpoint redirects")
)

// maxHeaderBytes bounds the header of a /metrics answer (net/http's own
// default is 10 MiB).
const maxHeaderBytes = 64 << 10

// Target is one backend whose engine metrics can be scraped.
type Target struct {
	ID         string // backend id
	MetricsURL string // e.g. http://10.0.0.7:8000/metrics
}

// Config configures a Scraper. Start from DefaultConfig.
type Config struct {
	// Interval between scrape rounds. Default 1 s.
	Interval time.Duration
	// Timeout bounds one scrape (connect, headers and body). Default 500 ms.
	Timeout time.Duration
	// Concurrency bounds the scrapes in flight. Default 8.
	Concurrency int
	// MaxBodyBytes bounds a /metrics body. Default 8 MiB.
	MaxBodyBytes int64
	// HitRateWindow is the span over which the prefix-cache hit rate is
	// computed from counters. Default 10 s.
	HitRateWindow time.Duration
	// Mapping from metric names to figures. Default DefaultMapping().
	Mapping Mapping
	// Client scrapes; nil means a client with Timeout and no proxy.
	Client *http.Client
	// Logger; nil discards.
	Logger *slog.Logger
	// Registry, when non-nil, receives the scraper's metrics.
	Registry prometheus.Registerer
}

// DefaultConfig returns the defaults.
func DefaultConfig() Config {
	return Config{
		Interval:      time.Second,
		Timeout:       500 * time.Millisecond,
		Concurrency:   8,
		MaxBodyBytes:  8 << 20,
		HitRateWindow: 10 * time.Second,
		Mapping:       DefaultMapping(),
	}
}

// Validate reports the first problem with c, or nil.
func (c *Config) Validate() error {
	switch {
	case c.Interval <= 0:
		return fmt.Errorf("%w: Interval must be positive", ErrInvalidConfig)
	case c.Timeout <= 0:
		return fmt.Errorf("%w: Timeout must be positive", ErrInvalidConfig)
	case c.Concurrency < 1:
		return fmt.Errorf("%w: Concurrency must be at least 1", ErrInvalidConfig)
	case c.MaxBodyBytes < 1:
		return fmt.Errorf("%w: MaxBodyBytes must be positive", ErrInvalidConfig)
	case c.HitRateWindow < c.Interval:
		return fmt.Errorf("%w: HitRateWindow shorter than Interval", ErrInvalidConfig)
	}
	_, err := NewParser(c.Mapping)
	return err
}

// Scraper scrapes the engine metrics of the backends this node owns.
type Scraper struct {
	cfg     Config
	parser  *Parser
	client  *http.Client
	log     *slog.Logger
	targets func() []Target
	owner   func(id string) bool
	publish func(id string, s Stats)

	// state is only touched by the goroutine running Run.
	state map[string]*targetState
	// triggered holds the backends Trigger asked for (at most
	// maxTriggered), guarded by trigMu; wake tells Run.
	trigMu    sync.Mutex
	triggered map[string]struct{}
	wake      chan struct{}
	bufs      sync.Pool

	scrapes  *prometheus.CounterVec
	duration prometheus.Histogram
}

type targetState struct {
	url     string
	hist    []counterSample // prefix-cache counters within the window
	rate    float64
	hasRate bool
}

type counterSample struct {
	at            time.Time
	queries, hits float64
}

// New returns a Scraper. Each round it asks targets for the backends,
// scrapes those for which owner returns true, and calls publish with each
// result (failures included, with OK false) from the goroutine running
// Run, after the round's scrapes finished.
func New(cfg Config, targets func() []Target, owner func(id string) bool, publish func(id string, s Stats)) (*Scraper, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if targets == nil || owner == nil || publish == nil {
		return nil, fmt.Errorf("%w: targets, owner and publish are required", ErrInvalidConfig)
	}
	p, err := NewParser(cfg.Mapping)
	if err != nil {
		return nil, err
	}
	s := &Scraper{
		cfg: cfg, parser: p, client: cfg.Client, log: cfg.Logger,
		targets: targets, owner: owner, publish: publish,
		state:     make(map[string]*targetState),
		triggered: make(map[string]struct{}),
		wake:      make(chan struct{}, 1),
		bufs:      sync.Pool{New: func() any { return new(bytes.Buffer) }},
		scrapes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "warmroute", Subsystem: "engine", Name: "scrapes_total",
			Help: "Engine metrics scrapes by result (ok, error, empty: no known metric).",
		}, []string{"result"}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "warmroute", Subsystem: "engine", Name: "scrape_duration_seconds",
			Help:    "Time to fetch and parse one engine's metrics.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1},
		}),
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if s.client == nil {
		s.client = &http.Client{
			Transport: &http.Transport{
				Proxy:                  nil,
				DialContext:            (&net.Dialer{Timeout: cfg.Timeout}).DialContext,
				MaxIdleConnsPerHost:    1,
				IdleConnTimeout:        max(3*cfg.Interval, 10*time.Second),
				ResponseHeaderTimeout:  cfg.Timeout,
				MaxResponseHeaderBytes: maxHeaderBytes,
			},
			// A backend's metrics URL is where it is scraped: a redirect
			// elsewhere (another host, a cloud metadata address) is a
			// failed scrape, not a request the router makes for it.
			CheckRedirect: func(*http.Request, []*http.Request) error { return errRedirect },
		}
	}
	if cfg.Registry != nil {
		for _, c := range []prometheus.Collector{s.scrapes, s.duration} {
			if err := cfg.Registry.Register(c); err != nil {
				return nil, fmt.Errorf("engine: register metrics: %w", err)
			}
		}
	}
	return s, nil
}

// Run scrapes every Interval until ctx is done, then returns nil. It must
// not be called twice at once.
func (s *Scraper) Run(ctx context.Context) error {
	defer s.client.CloseIdleConnections()
	t := time.NewTicker(s.cfg.Interval)
	defer t.Stop()
	for {
		s.round(ctx, nil)
		for again := true; again; {
			select {
			case <-ctx.Done():
				return nil
			case <-t.C:
				again = false
			case <-s.wake:
				s.round(ctx, s.takeTriggered())
			}
		}
	}
}

// maxTriggered bounds the backends waiting for a triggered scrape.
const maxTriggered = 4096

// Trigger asks for a scrape of backend's engine now, before the next
// round, if this scraper owns it. It never blocks; a backend asked for
// twice before the scrape is scraped once. The caller bounds how often
// (the proxy asks when a backend's in-flight count passes the highest
// level seen without a queue, at most every 250 ms).
func (s *Scraper) Trigger(backend string) {
	s.trigMu.Lock()
	if len(s.triggered) < maxTriggered {
		s.triggered[backend] = struct{}{}
	}
	s.trigMu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// TriggerScrape is Trigger, for proxy.ScrapeTrigger.
func (s *Scraper) TriggerScrape(backend string) { s.Trigger(backend) }

// takeTriggered returns and clears the backends Trigger asked for.
func (s *Scraper) takeTriggered() map[string]struct{} {
	s.trigMu.Lock()
	defer s.trigMu.Unlock()
	if len(s.triggered) == 0 {
		return map[string]struct{}{}
	}
	out := s.triggered
	s.triggered = make(map[string]struct{}, len(out))
	return out
}

// round scrapes the owned targets once (only those in only, when only is
// not nil) and publishes the results.
func (s *Scraper) round(ctx context.Context, only map[string]struct{}) {
	var owned []Target
	seen := make(map[string]bool)
	for _, t := range s.targets() {
		if t.MetricsURL == "" || seen[t.ID] || !s.owner(t.ID) {
			continue
		}
		seen[t.ID] = true
		if only != nil {
			if _, ok := only[t.ID]; !ok {
				continue
			}
		}
		owned = append(owned, t)
	}
	// Forget targets we no longer own: if one comes back its hit-rate
	// window starts over.
	for id := range s.state {
		if !seen[id] {
			delete(s.state, id)
		}
	}
	if len(owned) == 0 {
		return
	}
	results := make([]scrapeResult, len(owned))
	sem := make(chan struct{}, s.cfg.Concurrency)
	var wg sync.WaitGroup
	for i, t := range owned {
		wg.Go(func() {
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				results[i] = scrapeResult{at: time.Now(), err: ctx.Err()}
				return
			}
			defer func() { <-sem }()
			results[i] = s.fetch(ctx, t.MetricsURL)
		})
	}
	wg.Wait()
	if ctx.Err() != nil {
		return // shutting down: results are cancellations, not news
	}
	for i, t := range owned {
		st := s.state[t.ID]
		if st == nil || st.url != t.MetricsURL {
			st = &targetState{url: t.MetricsURL}
			s.state[t.ID] = st
		}
		r := results[i]
		stats := Stats{Scraped: r.at}
		switch {
		case r.err != nil:
			s.scrapes.WithLabelValues("error").Inc()
			s.log.Debug("engine scrape failed", "backend", t.ID, "url", t.MetricsURL, "err", r.err)
		case r.sample.Known == 0 && !r.sample.HasCounters:
			s.scrapes.WithLabelValues("empty").Inc()
		default:
			s.scrapes.WithLabelValues("ok").Inc()
			stats = st.stats(r.sample, r.at, s.cfg.HitRateWindow)
		}
		s.publish(t.ID, stats)
	}
}

type scrapeResult struct {
	at     time.Time
	sample Sample
	err    error
}

// fetch GETs url and parses the body.
func (s *Scraper) fetch(ctx context.Context, url string) scrapeResult {
	start := time.Now()
	defer func() { s.duration.Observe(time.Since(start).Seconds()) }()
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return scrapeResult{at: start, err: err}
	}
	// Text exposition, not protobuf.
	req.Header.Set("Accept", "text/plain;version=0.0.4;q=1,*/*;q=0.1")
	resp, err := s.client.Do(req)
	if err != nil {
		return scrapeResult{at: start, err: err}
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		return scrapeResult{at: start, err: fmt.Errorf("engine: %s: status %d", url, resp.StatusCode)}
	}
	if resp.ContentLength > s.cfg.MaxBodyBytes {
		return scrapeResult{at: start, err: fmt.Errorf("%w (%d bytes declared, the limit is %d)", ErrBodyTooLarge, resp.ContentLength, s.cfg.MaxBodyBytes)}
	}
	buf := s.bufs.Get().(*bytes.Buffer)
	defer func() {
		if buf.Cap() <= 1<<20 {
			buf.Reset()
			s.bufs.Put(buf)
		}
	}()
	buf.Reset()
	if _, err := buf.ReadFrom(io.LimitReader(resp.Body, s.cfg.MaxBodyBytes+1)); err != nil {
		return scrapeResult{at: start, err: err}
	}
	if int64(buf.Len()) > s.cfg.MaxBodyBytes {
		return scrapeResult{at: start, err: fmt.Errorf("%w (over %d bytes)", ErrBodyTooLarge, s.cfg.MaxBodyBytes)}
	}
	return scrapeResult{at: start, sample: s.parser.Parse(buf.Bytes())}
}

// stats turns a parsed sample into Stats, deriving the prefix-cache hit
// rate from counter growth over the window when the engine has counters.
// When no queries arrived within the window the last rate is kept.
func (st *targetState) stats(sm Sample, at time.Time, window time.Duration) Stats {
	out := Stats{
		KVUsage: sm.KVUsage, Running: sm.Running, Waiting: sm.Waiting,
		PrefixHitRate: sm.PrefixHitRate,
		Known:         sm.Known, Scraped: at, OK: true,
	}
	if !sm.HasCounters {
		st.hist = st.hist[:0]
		return out
	}
	if n := len(st.hist); n > 0 {
		last := st.hist[n-1]
		if sm.PrefixQueries < last.queries || sm.PrefixHits < last.hits {
			st.hist = st.hist[:0] // the engine restarted
		}
	}
	st.hist = append(st.hist, counterSample{at: at, queries: sm.PrefixQueries, hits: sm.PrefixHits})
	// Keep as base the newest sample at least `window` old.
	drop := 0
	for drop+1 < len(st.hist) && at.Sub(st.hist[drop+1].at) >= window {
		drop++
	}
	if drop > 0 {
		st.hist = append(st.hist[:0], st.hist[drop:]...)
	}
	base := st.hist[0]
	if dq := sm.PrefixQueries - base.queries; dq > 0 {
		st.rate = min(max((sm.PrefixHits-base.hits)/dq, 0), 1)
		st.hasRate = true
	}
	out.PrefixHitRate, out.Known = 0, out.Known&^KnownPrefixHitRate
	if st.hasRate {
		out.PrefixHitRate = st.rate
		out.Known |= KnownPrefixHitRate
	}
	return out
}
