package loadtest

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/warmroute/warmroute/loadtest/gpusim"
	"github.com/warmroute/warmroute/loadtest/stats"
	"github.com/warmroute/warmroute/loadtest/workload"
)

// Scheduled is a workload whose requests carry their own send times (a
// trace replay, trace.Replay). When the generator given to Run implements
// it, the open loop sends each request at its time instead of drawing
// Poisson arrivals at Rate, and the run ends after the last request; the
// closed loop sends the requests in order, back to back, ignoring their
// times.
type Scheduled interface {
	workload.Generator
	// NextAt renders the next request into r, reusing r.Body's storage,
	// and returns its send time from the start of the run; false after
	// the last request.
	NextAt(r *workload.Request) (at time.Duration, ok bool)
}

// Models returns the ids of the models target serves (GET /v1/models). An
// unreachable target gives an error wrapping ErrUnreachable.
func Models(ctx context.Context, target string) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, trimBase(target)+"/v1/models", nil)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadConfig, err)
	}
	hc := &http.Client{Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true}}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrUnreachable, target, rootCause(err))
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		return nil, fmt.Errorf("%s/v1/models: HTTP %d", target, resp.StatusCode)
	}
	var v struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&v); err != nil {
		return nil, fmt.Errorf("%s/v1/models: %v", target, err)
	}
	ids := make([]string, 0, len(v.Data))
	for _, d := range v.Data {
		ids = append(ids, d.ID)
	}
	return ids, nil
}

// rootCause returns the system error under a transport error ("connection
// refused"), or err itself.
func rootCause(err error) error {
	var se *os.SyscallError
	if errors.As(err, &se) {
		return se.Err
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return errors.New("timed out")
	}
	return err
}

// Run drives cfg.Targets with the requests of gen until cfg.Duration has
// passed or cfg.Requests were sent (or, when gen is Scheduled, its last
// request was), waits for the answers, and returns the Summary (Label and
// Workload are left to the caller), with the offline hit-rate bounds of
// the requests sent unless cfg.Bounds.Off. When ctx is cancelled, requests
// in flight are cancelled and Run returns the partial Summary (Partial
// set) with an error wrapping ErrInterrupted.
func Run(ctx context.Context, cfg Config, gen workload.Generator) (stats.Summary, error) {
	if err := cfg.Validate(); err != nil {
		return stats.Summary{}, err
	}
	for i := range cfg.Targets {
		cfg.Targets[i] = trimBase(cfg.Targets[i])
	}
	for _, t := range cfg.Targets {
		if _, err := Models(ctx, t); errors.Is(err, ErrUnreachable) {
			if ctx.Err() != nil {
				return stats.Summary{Partial: true}, fmt.Errorf("%w before the start", ErrInterrupted)
			}
			return stats.Summary{}, err
		}
	}
	r := &run{cfg: cfg, gen: gen, rec: stats.NewRecorder()}
	r.sched, _ = gen.(Scheduled)
	conns := cfg.MaxInFlight
	if cfg.Mode == ClosedLoop {
		conns = cfg.Concurrency
	}
	r.client = newClient(&cfg, conns)
	defer r.client.close()
	if len(cfg.MetricsURLs) > 0 {
		r.scraper = newScraper(cfg.MetricsURLs)
		defer r.scraper.close()
		first, err := r.scraper.scrape(ctx)
		if err != nil {
			return stats.Summary{}, err
		}
		r.kvPrev = first
		r.kvStart = make(map[string]stats.CacheCounters, len(first))
		for k, v := range first {
			r.kvStart[k] = v
		}
		r.client.aliases = r.scraper.aliasMap()
	}
	if len(cfg.RouterMetricsURLs) > 0 {
		r.pred = newPredictions(cfg.RouterMetricsURLs)
		defer r.pred.close()
		r.pred.begin(ctx)
	}
	return r.execute(ctx)
}

type run struct {
	cfg     Config
	gen     workload.Generator
	sched   Scheduled // gen, when it carries send times
	rec     *stats.Recorder
	client  *client
	scraper *scraper
	pred    *predictions // nil without RouterMetricsURLs
	bounds  *boundsFeed  // nil when off

	start    time.Time
	measure  time.Time // start + Warmup: outcomes before it are not recorded
	sent     atomic.Int64
	warm     *warmup
	warmed   atomic.Int64 // warm-up requests finished (not recorded)
	inFlight atomic.Int64
	canceled atomic.Int64
	lastDone atomic.Int64 // unix nanos of the latest answer

	reqPool sync.Pool // *workload.Request
	outPool sync.Pool // *stats.Outcome

	kvMu     sync.Mutex
	kvStart  map[string]stats.CacheCounters
	kvPrev   map[string]stats.CacheCounters
	kvSeries []stats.KVSample
}

func (r *run) execute(ctx context.Context) (stats.Summary, error) {
	r.reqPool.New = func() any { return new(workload.Request) }
	r.outPool.New = func() any { return new(stats.Outcome) }

	if !r.cfg.Bounds.Off {
		feed, err := startBounds(r.boundsConfig())
		if err != nil {
			return stats.Summary{}, err
		}
		r.bounds = feed
		defer feed.close() // idempotent: normally closed after the drain
	}
	// reqCtx is the parent of every request: cancelled on interruption or
	// when the drain time runs out.
	reqCtx, cancelReqs := context.WithCancel(context.Background())
	defer cancelReqs()
	bgCtx, stopBg := context.WithCancel(context.Background())
	defer stopBg()
	var bg sync.WaitGroup

	r.start = time.Now()
	r.measure = r.start.Add(r.cfg.Warmup)
	r.lastDone.Store(r.measure.UnixNano())
	r.warm = newWarmup(r.measure, r.cfg.Warmup > 0)
	if r.cfg.Warmup > 0 {
		bg.Add(1)
		go func() { defer bg.Done(); r.warm.closeAt(bgCtx) }()
	}
	if r.scraper != nil {
		bg.Add(1)
		go func() { defer bg.Done(); r.sample(bgCtx) }()
		if r.cfg.Warmup > 0 {
			bg.Add(1)
			go func() { defer bg.Done(); r.warmupScrape(bgCtx) }()
		}
	}
	if r.pred != nil && r.cfg.Warmup > 0 {
		bg.Add(1)
		go func() { defer bg.Done(); r.predictionsFromMeasure(bgCtx) }()
	}
	if r.cfg.Progress != nil {
		bg.Add(1)
		go func() { defer bg.Done(); r.progress(bgCtx) }()
	}

	var wg sync.WaitGroup
	if r.cfg.Mode == OpenLoop {
		r.openLoop(ctx, reqCtx, &wg)
	} else {
		r.closedLoop(ctx, reqCtx, &wg)
	}

	// drain
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	drain := time.NewTimer(r.cfg.Drain)
	select {
	case <-done:
	case <-ctx.Done():
	case <-drain.C:
	}
	drain.Stop()
	cancelReqs()
	<-done
	stopBg()
	bg.Wait()
	var bounds *stats.BoundsResult
	if r.bounds != nil {
		if b := r.bounds.close(); b.Requests > 0 {
			bounds = &b
		}
	}

	interrupted := ctx.Err() != nil
	end := time.Unix(0, r.lastDone.Load())
	s := r.rec.Summarize(max(end.Sub(r.measure), 0), r.expected())
	s.Label = r.cfg.Label
	s.Workload = r.cfg.Workload
	if len(r.cfg.Targets) == 1 {
		s.Target = r.cfg.Targets[0]
	} else {
		s.Target = fmt.Sprintf("%s (+%d more)", r.cfg.Targets[0], len(r.cfg.Targets)-1)
	}
	s.StartedAt = r.start.UTC()
	s.Sent = r.sent.Load()
	s.Canceled = r.canceled.Load()
	s.WarmupSeconds = r.cfg.Warmup.Seconds()
	s.WarmupRequests = r.warmed.Load()
	s.Partial = interrupted
	if r.scraper != nil {
		// a fresh context: the final scrape must run even after Ctrl-C
		sctx, cancel := context.WithTimeout(context.Background(), scrapeTimeout)
		last, _ := r.scraper.scrape(sctx)
		cancel()
		r.addSample(last, time.Since(r.start))
		r.kvMu.Lock()
		kv := stats.HitRate(r.kvStart, last)
		r.kvMu.Unlock()
		s.KV = &kv
		s.KVSeries = r.kvSeries
	}
	if r.pred != nil {
		sctx, cancel := context.WithTimeout(context.Background(), scrapeTimeout)
		s.Predictions = r.pred.end(sctx)
		cancel()
	}
	s.Bounds = bounds
	if interrupted {
		return s, fmt.Errorf("%w after %.1fs", ErrInterrupted, time.Since(r.start).Seconds())
	}
	return s, nil
}

// expected returns the backends traffic should reach.
func (r *run) expected() []string {
	if len(r.cfg.Backends) > 0 {
		return r.cfg.Backends
	}
	if r.scraper != nil {
		return r.scraper.ids
	}
	return nil
}

func (r *run) openLoop(ctx, reqCtx context.Context, wg *sync.WaitGroup) {
	rng := rand.New(rand.NewPCG(r.cfg.Seed, 0x6f70656e))
	sem := make(chan struct{}, r.cfg.MaxInFlight)
	timer := time.NewTimer(0)
	defer timer.Stop()
	<-timer.C
	intended := r.start
	// A scheduled workload renders each request first, to learn its time.
	var req *workload.Request
	defer func() {
		if req != nil {
			r.reqPool.Put(req)
		}
	}()
	for i := 0; r.cfg.Requests == 0 || i < r.cfg.Requests; i++ {
		if r.sched != nil {
			req = r.reqPool.Get().(*workload.Request)
			at, ok := r.sched.NextAt(req)
			if !ok {
				return
			}
			intended = r.start.Add(at)
		}
		if r.cfg.Duration > 0 && intended.Sub(r.measure) >= r.cfg.Duration {
			return
		}
		if d := time.Until(intended); d > 0 {
			timer.Reset(d)
			select {
			case <-ctx.Done():
				return
			case <-timer.C:
			}
		}
		select {
		case <-ctx.Done():
			return
		case sem <- struct{}{}:
		}
		if r.sched == nil {
			req = r.reqPool.Get().(*workload.Request)
			r.gen.Next(req)
		}
		warm := r.warm.start(intended)
		r.bounds.add(req, !warm)
		target := r.cfg.Targets[i%len(r.cfg.Targets)]
		wg.Add(1)
		r.sent.Add(1)
		r.inFlight.Add(1)
		go func(req *workload.Request, at time.Time) {
			defer wg.Done()
			r.send(reqCtx, target, req, at, warm)
			<-sem
		}(req, intended)
		req = nil
		if r.sched == nil {
			gap := rng.ExpFloat64() / r.cfg.Rate
			intended = intended.Add(time.Duration(gap * float64(time.Second)))
		}
	}
}

func (r *run) closedLoop(ctx, reqCtx context.Context, wg *sync.WaitGroup) {
	var (
		mu sync.Mutex
		n  int
	)
	deadline := r.measure.Add(r.cfg.Duration)
	// next hands out the next request, whether it is a warm-up one, and
	// its start, or nil when the run is over.
	next := func() (*workload.Request, string, bool, time.Time) {
		mu.Lock()
		defer mu.Unlock()
		now := time.Now()
		if ctx.Err() != nil || (r.cfg.Requests > 0 && n >= r.cfg.Requests) ||
			(r.cfg.Duration > 0 && !now.Before(deadline)) {
			return nil, "", false, now
		}
		req := r.reqPool.Get().(*workload.Request)
		if r.sched == nil {
			r.gen.Next(req)
		} else if _, ok := r.sched.NextAt(req); !ok {
			r.reqPool.Put(req)
			return nil, "", false, now
		}
		warm := r.warm.start(now)
		r.bounds.add(req, !warm)
		target := r.cfg.Targets[n%len(r.cfg.Targets)]
		n++
		r.sent.Add(1)
		r.inFlight.Add(1)
		return req, target, warm, now
	}
	for w := 0; w < r.cfg.Concurrency; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				req, target, warm, at := next()
				if req == nil {
					return
				}
				r.send(reqCtx, target, req, at, warm)
			}
		}()
	}
	// the workers stop by themselves; the caller waits for them
}

// send performs one request and records its outcome, unless it is a
// warm-up one.
func (r *run) send(reqCtx context.Context, target string, req *workload.Request, intended time.Time, warm bool) {
	o := r.outPool.Get().(*stats.Outcome)
	*o = stats.Outcome{ITL: o.ITL[:0]}
	ctx, cancel := context.WithTimeout(reqCtx, r.cfg.Timeout)
	r.client.do(ctx, reqCtx, target, req, intended, o)
	cancel()
	r.inFlight.Add(-1)
	if warm {
		defer r.warm.finish()
	}
	switch {
	case o.Err == ErrKindCanceled:
		r.canceled.Add(1)
	case warm:
		r.warmed.Add(1)
	default:
		r.rec.Record(o)
		now := time.Now().UnixNano()
		for {
			prev := r.lastDone.Load()
			if now <= prev || r.lastDone.CompareAndSwap(prev, now) {
				break
			}
		}
	}
	r.outPool.Put(o)
	r.reqPool.Put(req)
}

// scrapeTimeout bounds the scrapes a run takes on a context of their own
// (the warm-up's and the end's counters): they must run even when the run's
// context has ended, and must not hold it up for long.
const scrapeTimeout = 5 * time.Second

// warmupScrape takes the counters the hit rate starts from once the
// warm-up is over.
func (r *run) warmupScrape(ctx context.Context) {
	if !r.afterWarmup(ctx) {
		return
	}
	sctx, cancel := context.WithTimeout(context.Background(), scrapeTimeout)
	defer cancel()
	cur, _ := r.scraper.scrape(sctx)
	r.kvMu.Lock()
	defer r.kvMu.Unlock()
	for k, v := range cur {
		r.kvStart[k] = v
	}
}

// predictionsFromMeasure takes the routers' prediction counters again at
// the end of the warm-up, so that the figures cover the measured window.
func (r *run) predictionsFromMeasure(ctx context.Context) {
	if !r.afterWarmup(ctx) {
		return
	}
	sctx, cancel := context.WithTimeout(context.Background(), scrapeTimeout)
	defer cancel()
	r.pred.begin(sctx)
}

// afterWarmup waits until the warm-up is over and reports true, or false
// when ctx ends first with the warm-up not over. The run ends ctx once
// every request is answered, which may be the moment the last warm-up
// request was (a loaded machine): that warm-up is over, and its counters
// must still be taken, or the engines' figures would count the warm-up
// as measured.
func (r *run) afterWarmup(ctx context.Context) bool {
	select {
	case <-r.warm.over():
		return true
	case <-ctx.Done():
		select {
		case <-r.warm.over():
			return true
		default:
			return false
		}
	}
}

// sample scrapes the backends every MetricsInterval for the hit rate over
// time.
func (r *run) sample(ctx context.Context) {
	t := time.NewTicker(r.cfg.MetricsInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			cur, _ := r.scraper.scrape(ctx)
			if ctx.Err() != nil {
				return
			}
			r.addSample(cur, time.Since(r.start))
		}
	}
}

// addSample appends the hit rate since the previous scrape. Backends that
// did not answer keep their previous counters.
func (r *run) addSample(cur map[string]stats.CacheCounters, at time.Duration) {
	r.kvMu.Lock()
	defer r.kvMu.Unlock()
	if len(cur) == 0 {
		return
	}
	merged := make(map[string]stats.CacheCounters, len(r.kvPrev))
	for k, v := range r.kvPrev {
		merged[k] = v
	}
	for k, v := range cur {
		merged[k] = v
	}
	d := stats.HitRate(r.kvPrev, merged)
	r.kvSeries = append(r.kvSeries, stats.KVSample{
		Seconds: at.Seconds(), HitRate: d.HitRate, QueriedTokens: d.QueriedTokens,
	})
	r.kvPrev = merged
}

// progress prints a status line every ProgressInterval.
func (r *run) progress(ctx context.Context) {
	t := time.NewTicker(r.cfg.ProgressInterval)
	defer t.Stop()
	label := r.cfg.Label
	if r.cfg.Workload != "" {
		label = r.cfg.Workload + " " + label
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			el := time.Since(r.start)
			ok, failed := r.rec.Counts()
			line := fmt.Sprintf("%-24s %5.0fs", label, el.Seconds())
			if r.cfg.Duration > 0 {
				line += fmt.Sprintf("/%.0fs", r.cfg.Duration.Seconds())
			}
			line += fmt.Sprintf("  sent %d  ok %d  failed %d  in flight %d  %.1f req/s",
				r.sent.Load(), ok, failed, r.inFlight.Load(), float64(ok)/el.Seconds())
			r.kvMu.Lock()
			if n := len(r.kvSeries); n > 0 {
				line += fmt.Sprintf("  kv hit %.0f%%", 100*r.kvSeries[n-1].HitRate)
			}
			r.kvMu.Unlock()
			fmt.Fprintln(r.cfg.Progress, line)
		}
	}
}

// boundsConfig resolves cfg.Bounds against gpusim's defaults and the
// expected backends.
func (r *run) boundsConfig() (stats.BoundsConfig, int) {
	c := r.cfg.Bounds
	def := gpusim.DefaultConfig()
	n := c.Instances
	if n == 0 {
		n = len(r.expected())
	}
	if n == 0 {
		n = len(r.cfg.Targets)
	}
	return stats.BoundsConfig{
		Caches:      n,
		CacheBlocks: cmp.Or(c.KVBlocks, def.KVCacheBlocks),
		BlockTokens: cmp.Or(c.BlockSize, def.BlockSize),
	}, cmp.Or(c.BytesPerToken, def.BytesPerToken)
}

// boundsQueue is how many requests the bounds may lag behind the sender
// before it waits for them.
const boundsQueue = 1024

// boundsFeed computes the offline hit-rate bounds in a goroutine of its
// own, fed a copy of every request sent, so that the sender only copies
// a body. Its methods are called by the sender, one at a time; add on a
// nil feed does nothing.
type boundsFeed struct {
	ch            chan boundsItem
	done          chan struct{}
	bytesPerToken int
	b             *stats.Bounds
	once          sync.Once
}

type boundsItem struct {
	path     string
	body     []byte
	measured bool
}

func startBounds(c stats.BoundsConfig, bytesPerToken int) (*boundsFeed, error) {
	b, err := stats.NewBounds(c)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadConfig, err)
	}
	f := &boundsFeed{ch: make(chan boundsItem, boundsQueue), done: make(chan struct{}), bytesPerToken: bytesPerToken, b: b}
	go f.loop(c.BlockTokens)
	return f, nil
}

func (f *boundsFeed) loop(blockTokens int) {
	defer close(f.done)
	for it := range f.ch {
		chain, tokens, err := gpusim.PromptBlocks(it.path, it.body, f.bytesPerToken, blockTokens)
		if err != nil {
			f.b.Skip()
			continue
		}
		f.b.Add(chain, tokens, it.measured)
	}
}

// add queues a copy of req (waiting when the queue is full).
func (f *boundsFeed) add(req *workload.Request, measured bool) {
	if f == nil {
		return
	}
	f.ch <- boundsItem{path: req.Path, body: append([]byte(nil), req.Body...), measured: measured}
}

// close waits for the queued requests and returns the bounds. Calling it
// again returns the same.
func (f *boundsFeed) close() stats.BoundsResult {
	f.once.Do(func() { close(f.ch) })
	<-f.done
	return f.b.Result()
}
