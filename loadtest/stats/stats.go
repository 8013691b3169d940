package stats

import (
	"math"
	"sort"
	"sync"
	"time"

	hdrhistogram "github.com/HdrHistogram/hdrhistogram-go"
)

// Histogram range: 1 microsecond to one hour, three significant digits.
const (
	histLowest  = 1
	histHighest = int64(time.Hour / time.Microsecond)
	histDigits  = 3
)

// Outcome is what one request produced.
type Outcome struct {
	// Err is the error kind; "" means the request succeeded.
	Err string
	// TTFT is the time to the first streamed chunk with content (or the
	// whole response when not streaming), E2E the time to the last byte;
	// both measured from the request's intended send time.
	TTFT, E2E time.Duration
	// ITL holds the gaps between consecutive content chunks.
	ITL []time.Duration
	// Backend and Decision come from the response headers ("" if absent).
	Backend, Decision string
	// Token counts from the response's usage ("cached" is
	// usage.prompt_tokens_details.cached_tokens).
	PromptTokens, CompletionTokens, CachedTokens int
}

// maxDecisionKinds bounds the decisions DecisionTokens splits by: a
// target's header is outside input.
const maxDecisionKinds = 32

// Recorder accumulates Outcomes. It is safe for concurrent use.
type Recorder struct {
	mu                        sync.Mutex
	ttft, itl, e2e            *hdrhistogram.Histogram
	ok, failed                int64
	errs, backends, decisions map[string]int64
	byDecision                map[string]*DecisionTokens
	prompt, completion        int64
	cached, usageReports      int64
}

// NewRecorder returns an empty Recorder.
func NewRecorder() *Recorder {
	return &Recorder{
		ttft:       hdrhistogram.New(histLowest, histHighest, histDigits),
		itl:        hdrhistogram.New(histLowest, histHighest, histDigits),
		e2e:        hdrhistogram.New(histLowest, histHighest, histDigits),
		errs:       map[string]int64{},
		backends:   map[string]int64{},
		decisions:  map[string]int64{},
		byDecision: map[string]*DecisionTokens{},
	}
}

// DecisionTokens is what the requests of one router decision (affinity,
// overflow, ...) were sent and found cached: the offline split of a run's
// hit rate by decision, which shows which decisions lose the hit.
type DecisionTokens struct {
	Requests     int64 `json:"requests"`
	PromptTokens int64 `json:"prompt_tokens"`
	CachedTokens int64 `json:"cached_tokens"`
}

// CachedRate is cached over prompt tokens (0 without prompt tokens).
func (d DecisionTokens) CachedRate() float64 {
	if d.PromptTokens == 0 {
		return 0
	}
	return float64(d.CachedTokens) / float64(d.PromptTokens)
}

func micros(d time.Duration) int64 {
	v := d.Microseconds()
	if v < histLowest {
		return histLowest
	}
	if v > histHighest {
		return histHighest
	}
	return v
}

// Record adds one outcome. Latencies of failed requests are not recorded;
// their error kind is counted. Backend shares and decisions count every
// response that named them, failed or not.
func (r *Recorder) Record(o *Outcome) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if o.Backend != "" {
		r.backends[o.Backend]++
	}
	if o.Decision != "" {
		r.decisions[o.Decision]++
	}
	if o.Err != "" {
		r.failed++
		r.errs[o.Err]++
		return
	}
	r.ok++
	_ = r.ttft.RecordValue(micros(o.TTFT))
	_ = r.e2e.RecordValue(micros(o.E2E))
	for _, d := range o.ITL {
		_ = r.itl.RecordValue(micros(d))
	}
	r.prompt += int64(o.PromptTokens)
	r.completion += int64(o.CompletionTokens)
	r.cached += int64(o.CachedTokens)
	if o.Decision != "" && o.PromptTokens > 0 {
		d := r.byDecision[o.Decision]
		if d == nil {
			if len(r.byDecision) >= maxDecisionKinds {
				return
			}
			d = &DecisionTokens{}
			r.byDecision[o.Decision] = d
		}
		d.Requests++
		d.PromptTokens += int64(o.PromptTokens)
		d.CachedTokens += int64(o.CachedTokens)
	}
	if o.PromptTokens > 0 {
		r.usageReports++
	}
}

// Counts returns the succeeded and failed requests so far.
func (r *Recorder) Counts() (ok, failed int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.ok, r.failed
}

// Latency summarises one histogram, in milliseconds.
type Latency struct {
	Count  int64   `json:"count"`
	MeanMs float64 `json:"mean_ms"`
	P50Ms  float64 `json:"p50_ms"`
	P90Ms  float64 `json:"p90_ms"`
	P99Ms  float64 `json:"p99_ms"`
	MaxMs  float64 `json:"max_ms"`
}

// Point is one point of a cumulative distribution: the value (ms) at a
// quantile (0-1).
type Point struct {
	Ms       float64 `json:"ms"`
	Quantile float64 `json:"q"`
}

func ms(us int64) float64 { return float64(us) / 1000 }

func latency(h *hdrhistogram.Histogram) Latency {
	if h.TotalCount() == 0 {
		return Latency{}
	}
	return Latency{
		Count:  h.TotalCount(),
		MeanMs: h.Mean() / 1000,
		P50Ms:  ms(h.ValueAtPercentile(50)),
		P90Ms:  ms(h.ValueAtPercentile(90)),
		P99Ms:  ms(h.ValueAtPercentile(99)),
		MaxMs:  ms(h.Max()),
	}
}

// cdf samples the distribution at every percent, plus the far tail.
func cdf(h *hdrhistogram.Histogram) []Point {
	if h.TotalCount() == 0 {
		return nil
	}
	qs := make([]float64, 0, 104)
	for p := 0; p <= 100; p++ {
		qs = append(qs, float64(p))
	}
	qs = append(qs, 99.5, 99.9)
	sort.Float64s(qs)
	pts := make([]Point, len(qs))
	for i, q := range qs {
		pts[i] = Point{Ms: ms(h.ValueAtPercentile(q)), Quantile: q / 100}
	}
	return pts
}

// Summary is the result of one run. KV-cache fields are filled by the
// caller from the backends' counters (see HitRate).
type Summary struct {
	// Label names the run in a comparison, e.g. the routing strategy.
	Label    string `json:"label"`
	Workload string `json:"workload"`
	Target   string `json:"target,omitempty"`
	// Partial is set when the run was interrupted.
	Partial   bool      `json:"partial,omitempty"`
	StartedAt time.Time `json:"started_at"`
	// Seconds is the measured window (first intended send after the
	// warm-up to last answer).
	Seconds float64 `json:"seconds"`
	// WarmupSeconds of traffic came first; its WarmupRequests are not in
	// any figure below.
	WarmupSeconds  float64 `json:"warmup_seconds,omitempty"`
	WarmupRequests int64   `json:"warmup_requests,omitempty"`

	// Sent counts requests sent; Requests those that finished (OK +
	// Failed); Canceled those still running when the run stopped.
	Sent           int64            `json:"sent"`
	Requests       int64            `json:"requests"`
	OK             int64            `json:"ok"`
	Failed         int64            `json:"failed"`
	Canceled       int64            `json:"canceled,omitempty"`
	Errors         map[string]int64 `json:"errors,omitempty"`
	RequestsPerSec float64          `json:"requests_per_sec"`
	// Output (completion) and prompt tokens per second, from usage.
	OutputTokensPerSec float64 `json:"output_tokens_per_sec"`
	PromptTokensPerSec float64 `json:"prompt_tokens_per_sec"`
	PromptTokens       int64   `json:"prompt_tokens"`
	CompletionTokens   int64   `json:"completion_tokens"`
	CachedTokens       int64   `json:"cached_tokens"`
	// UsageCachedRate is cached / prompt tokens as the responses' usage
	// reported them (0 when the target reports no usage).
	UsageCachedRate float64 `json:"usage_cached_rate"`

	TTFT    Latency `json:"ttft"`
	ITL     Latency `json:"itl"`
	E2E     Latency `json:"e2e"`
	TTFTCDF []Point `json:"ttft_cdf,omitempty"`

	// Backends counts responses per backend header value; Shares is each
	// backend's fraction of them. ShareMaxMin is max/min share over the
	// expected backends (0 when a backend got nothing or none is known).
	Backends    map[string]int64   `json:"backends,omitempty"`
	Shares      map[string]float64 `json:"shares,omitempty"`
	ShareMaxMin float64            `json:"share_max_min"`
	// ShareFloor is the max/min of as many requests each sent to one of
	// as many backends at random (EvenShareFloor): a key-affine router's
	// ShareMaxMin cannot be expected below it on a finite sample.
	ShareFloor float64          `json:"share_max_min_floor,omitempty"`
	Decisions  map[string]int64 `json:"decisions,omitempty"`
	// DecisionTokens splits the successful requests' prompt and cached
	// tokens (from usage) by decision.
	DecisionTokens map[string]DecisionTokens `json:"decision_tokens,omitempty"`

	// KV is the hit rate from the backends' counters; nil when no metrics
	// were scraped.
	KV *KVResult `json:"kv,omitempty"`
	// KVSeries is the fleet hit rate per scrape interval.
	KVSeries []KVSample `json:"kv_series,omitempty"`
	// Bounds are the offline references for KV: the hit rates an infinite
	// cache and the fleet's caches under perfect prefix affinity would
	// give the measured requests (see Bounds); nil when not computed.
	Bounds *BoundsResult `json:"bounds,omitempty"`
	// Predictions are the routers' cache predictions against what their
	// answers delivered, per decision kind, over the measured window; nil
	// when the routers' metrics were not read (or have none).
	Predictions []Prediction `json:"predictions,omitempty"`
	// Agreement is how often the routers chose alike over the measured
	// window, when the run asked them (demo --agreement); nil otherwise.
	Agreement *Agreement `json:"agreement,omitempty"`
}

// Summarize returns the Summary of everything recorded. window is the
// measured duration; expected lists the backends traffic should reach (nil:
// those that were seen).
func (r *Recorder) Summarize(window time.Duration, expected []string) Summary {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := Summary{
		Seconds:          window.Seconds(),
		Requests:         r.ok + r.failed,
		OK:               r.ok,
		Failed:           r.failed,
		Errors:           copyMap(r.errs),
		PromptTokens:     r.prompt,
		CompletionTokens: r.completion,
		CachedTokens:     r.cached,
		TTFT:             latency(r.ttft),
		ITL:              latency(r.itl),
		E2E:              latency(r.e2e),
		TTFTCDF:          cdf(r.ttft),
		Backends:         copyMap(r.backends),
		Decisions:        copyMap(r.decisions),
	}
	if len(r.byDecision) > 0 {
		s.DecisionTokens = make(map[string]DecisionTokens, len(r.byDecision))
		for k, d := range r.byDecision {
			s.DecisionTokens[k] = *d
		}
	}
	if sec := window.Seconds(); sec > 0 {
		s.RequestsPerSec = float64(r.ok) / sec
		s.OutputTokensPerSec = float64(r.completion) / sec
		s.PromptTokensPerSec = float64(r.prompt) / sec
	}
	if r.prompt > 0 {
		s.UsageCachedRate = float64(r.cached) / float64(r.prompt)
	}
	s.Shares, s.ShareMaxMin = trafficShares(r.backends, expected)
	if len(s.Shares) > 0 {
		var n int64
		for _, c := range r.backends {
			n += c
		}
		s.ShareFloor = EvenShareFloor(n, len(s.Shares))
	}
	return s
}

func copyMap[V any](m map[string]V) map[string]V {
	if len(m) == 0 {
		return nil
	}
	c := make(map[string]V, len(m))
	for k, v := range m {
		c[k] = v
	}
	return c
}

// trafficShares returns each backend's fraction of counts and the ratio of the
// largest to the smallest share over expected (or, when expected is empty,
// over the backends in counts). The ratio is 0 when some expected backend
// got no traffic or there is none at all.
func trafficShares(counts map[string]int64, expected []string) (map[string]float64, float64) {
	var total int64
	for _, n := range counts {
		total += n
	}
	if total == 0 {
		return nil, 0
	}
	shares := make(map[string]float64, len(counts)+len(expected))
	for k, n := range counts {
		shares[k] = float64(n) / float64(total)
	}
	names := expected
	if len(names) == 0 {
		for k := range counts {
			names = append(names, k)
		}
	}
	lo, hi := math.Inf(1), 0.0
	for _, k := range names {
		v := shares[k]
		if _, ok := shares[k]; !ok {
			shares[k] = 0
		}
		lo = math.Min(lo, v)
		hi = math.Max(hi, v)
	}
	if lo == 0 {
		return shares, 0
	}
	return shares, hi / lo
}

// Agreement is how often the routers of one cluster, asked about the same
// requests at the same moment, chose alike (loadtest/agree): over Rounds
// rounds, Compared requests were answered by two routers or more, of
// which Picks were sent to the same backend by all of them and Owners had
// the same load-blind owner; SameEpoch rounds had every answer at one
// epoch, and in them SteadyCompared requests were compared, of which
// SteadyPicks agreed: the steady state, without the rounds that caught
// the routers applying a new epoch (a split or a move committed a moment
// before, which routers apply milliseconds apart). Failed counts
// explainer calls that got no answer.
type Agreement struct {
	Routers        int    `json:"routers"`
	Rounds         int    `json:"rounds"`
	Compared       int    `json:"compared"`
	Picks          int    `json:"picks_agreeing"`
	Owners         int    `json:"owners_agreeing"`
	SameEpoch      int    `json:"same_epoch_rounds"`
	SteadyCompared int    `json:"steady_compared"`
	SteadyPicks    int    `json:"steady_picks_agreeing"`
	Failed         int    `json:"failed_calls"`
	First          string `json:"first_disagreement,omitempty"`
	// FirstSteady is the first disagreement of a round at one epoch.
	FirstSteady string `json:"first_steady_disagreement,omitempty"`
}

// Add adds round r's counts (Routers and the first disagreement stay).
func (a *Agreement) Add(r Agreement) {
	if a.Routers == 0 {
		a.Routers = r.Routers
	}
	a.Rounds += r.Rounds
	a.Compared += r.Compared
	a.Picks += r.Picks
	a.Owners += r.Owners
	a.SameEpoch += r.SameEpoch
	a.SteadyCompared += r.SteadyCompared
	a.SteadyPicks += r.SteadyPicks
	a.Failed += r.Failed
	if a.First == "" {
		a.First = r.First
	}
	if a.FirstSteady == "" {
		a.FirstSteady = r.FirstSteady
	}
}
