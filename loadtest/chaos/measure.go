package chaos

import (
	"math"
	"sort"
	"time"

	"github.com/warmroute/warmroute/loadtest/stats"
)

// NoPick stands for a router's answer that named no backend (the
// explainer found none): it agrees only with another NoPick.
const NoPick = "-"

// Agree compares the routers' picks for a set of prompts: picks[r][p] is
// router r's backend for prompt p, "" when router r gave no answer for it.
// A prompt counts when at least one router answered it; it agrees when
// every router that answered picked the same backend.
func Agree(picks [][]string) (agreeing, compared int) {
	if len(picks) == 0 {
		return 0, 0
	}
	n := 0
	for _, p := range picks {
		n = max(n, len(p))
	}
	for i := 0; i < n; i++ {
		first, ok, same := "", false, true
		for _, p := range picks {
			if i >= len(p) || p[i] == "" {
				continue
			}
			if !ok {
				first, ok = p[i], true
			} else if p[i] != first {
				same = false
			}
		}
		if ok {
			compared++
			if same {
				agreeing++
			}
		}
	}
	return agreeing, compared
}

// Tick is one agreement sample across the routers.
type Tick struct {
	At        time.Duration `json:"t"`         // since the start of the run (end of the sample)
	Answering int           `json:"answering"` // routers that answered at least one prompt
	Compared  int           `json:"compared"`  // prompts answered by at least one router
	Agreeing  int           `json:"agreeing"`  // prompts on which every answering router picked the same backend
	// OwnersAgreeing counts the prompts on which the routers agreed on the
	// load-blind owner: the first active backend each router counts as
	// healthy in the partition's order. Picks can differ where owners do
	// not when gossiped load or busy flags send a prompt to overflow.
	OwnersAgreeing int      `json:"owners_agreeing"`
	Epochs         []uint64 `json:"epochs"` // each answering router's epoch
	// Sample describes one prompt the picks disagreed on.
	Sample string `json:"sample,omitempty"`
}

// Level selects what agreement compares.
type Level int

// The agreement levels.
const (
	Picks  Level = iota // the backend each router would send the prompt to
	Owners              // the load-blind owner (ring and health)
)

func (l Level) String() string {
	if l == Owners {
		return "owners"
	}
	return "picks"
}

func (t Tick) agreeing(l Level) int {
	if l == Owners {
		return t.OwnersAgreeing
	}
	return t.Agreeing
}

// Agreement is the fraction of compared prompts on which the routers
// agreed at level l; 1 when nothing was compared (no disagreement seen).
func (t Tick) Agreement(l Level) float64 {
	if t.Compared == 0 {
		return 1
	}
	return float64(t.agreeing(l)) / float64(t.Compared)
}

// Full reports whether every compared prompt agreed at level l.
func (t Tick) Full(l Level) bool { return t.agreeing(l) == t.Compared }

// MaxEpoch is the highest epoch any router answered with.
func (t Tick) MaxEpoch() uint64 {
	var m uint64
	for _, e := range t.Epochs {
		m = max(m, e)
	}
	return m
}

// MinAgreement returns the lowest agreement of the ticks in [from, until]
// and whether there was a tick with two or more routers answering there.
func MinAgreement(ticks []Tick, l Level, from, until time.Duration) (float64, bool) {
	lo, seen := 1.0, false
	for _, t := range ticks {
		if t.At < from || t.At > until || t.Answering < 2 {
			continue
		}
		seen = true
		lo = math.Min(lo, t.Agreement(l))
	}
	return lo, seen
}

// Reconverge finds when agreement came back to 100% for good after a
// change that settled at settle, looking at the ticks up to until: the
// first tick at or after settle from which every later tick up to until
// agrees fully. It returns that tick's time minus settle (an upper bound,
// at the resolution of the sampling) and false when the last tick before
// until still disagreed or no tick fell in the window.
func Reconverge(ticks []Tick, l Level, settle, until time.Duration) (time.Duration, bool) {
	first := -1
	for i, t := range ticks {
		if t.At < settle || t.At > until {
			continue
		}
		if !t.Full(l) {
			first = -1 // a disagreement: look for the next full tick
			continue
		}
		if first < 0 {
			first = i
		}
	}
	if first < 0 {
		return 0, false
	}
	return ticks[first].At - settle, true
}

// StableSince returns how long agreement has been 100% at the last tick:
// the time from the earliest tick of the final run of full ticks to the
// last tick (0 when the last tick disagrees or there is none). Ticks with
// fewer than minAnswering routers answering end a run.
func StableSince(ticks []Tick, l Level, minAnswering int) time.Duration {
	if len(ticks) == 0 {
		return 0
	}
	last := ticks[len(ticks)-1]
	start := -1
	for i := len(ticks) - 1; i >= 0; i-- {
		t := ticks[i]
		if !t.Full(l) || t.Answering < minAnswering {
			break
		}
		start = i
	}
	if start < 0 {
		return 0
	}
	return last.At - ticks[start].At
}

// Movement compares two snapshots of the owner (picked backend) of the
// same prompts.
type Movement struct {
	Prompts int `json:"prompts"` // answered in both snapshots
	Moved   int `json:"moved"`   // picked a different backend after
	// FromBackend and ToBackend count the moved prompts that left or
	// reached the changed backend.
	FromBackend int `json:"from_backend"`
	ToBackend   int `json:"to_backend"`
	// OwnedBefore and OwnedAfter count the prompts the changed backend
	// owned in each snapshot.
	OwnedBefore int `json:"owned_before"`
	OwnedAfter  int `json:"owned_after"`
}

// Fraction is Moved / Prompts (0 with no prompts).
func (m Movement) Fraction() float64 {
	if m.Prompts == 0 {
		return 0
	}
	return float64(m.Moved) / float64(m.Prompts)
}

// Unneeded counts moves that did not involve the changed backend: neither
// leaving it nor reaching it. Ideal consistent hashing moves none.
func (m Movement) Unneeded() int { return m.Moved - m.FromBackend - m.ToBackend }

// Move compares snapshots before and after (same prompts, same order; ""
// means no answer and the prompt is skipped); backend is the backend that
// changed ("" when none did).
func Move(before, after []string, backend string) Movement {
	var m Movement
	for i := 0; i < len(before) && i < len(after); i++ {
		b, a := before[i], after[i]
		if b == "" || a == "" {
			continue
		}
		m.Prompts++
		if backend != "" {
			if b == backend {
				m.OwnedBefore++
			}
			if a == backend {
				m.OwnedAfter++
			}
		}
		if a == b {
			continue
		}
		m.Moved++
		switch {
		case backend != "" && b == backend:
			m.FromBackend++
		case backend != "" && a == backend:
			m.ToBackend++
		}
	}
	return m
}

// KVPoint is one scrape of the fleet's cumulative prefix-cache counters,
// keyed by backend; a backend whose scrape failed is absent.
type KVPoint struct {
	At       time.Duration
	Counters map[string]stats.CacheCounters
}

// HitRateBetween is the fleet's hit rate from a to b: for each backend, the
// increase of its counters between its last scrape at or before a and its
// last scrape at or before b (one after a; a backend not scraped since a is
// left out, one first scraped after a counts from zero, a counter reset
// counts from the reset). It returns the rate and the queried tokens.
func HitRateBetween(points []KVPoint, a, b time.Duration) (rate, queried float64) {
	before := map[string]stats.CacheCounters{}
	after := map[string]stats.CacheCounters{}
	afterAt := map[string]time.Duration{}
	for _, p := range points {
		if p.At > b {
			break
		}
		for k, c := range p.Counters {
			if p.At <= a {
				before[k] = c
			}
			after[k], afterAt[k] = c, p.At
		}
	}
	for k, at := range afterAt {
		if at <= a {
			delete(after, k)
		}
	}
	r := stats.HitRate(before, after)
	return r.HitRate, r.QueriedTokens
}

// Dip is the KV-cache hit rate around a fault.
type Dip struct {
	Before float64 `json:"before"` // over the pre-fault window
	Min    float64 `json:"min"`    // lowest sliding-window rate from the fault on
	// MinAt is when the lowest window ended, from the fault.
	MinAt time.Duration `json:"min_at_ns"`
	// Recovered is the time from the fault to the end of the first window
	// after the last one below Before - tolerance; 0 when none was below.
	Recovered   time.Duration `json:"recovered_ns"`
	RecoveredOK bool          `json:"recovered"` // false: still below at the end
	Measured    bool          `json:"measured"`  // false: no tokens queried
}

// HitDip measures the hit rate over [pre, fault] and over windows of
// length window (clipped to start no earlier than the fault) ending every
// step from fault+step to end. Windows that queried nothing are skipped.
func HitDip(points []KVPoint, pre, fault, end, window, step time.Duration, tolerance float64) Dip {
	var d Dip
	before, q := HitRateBetween(points, pre, fault)
	if q <= 0 || step <= 0 {
		return d
	}
	d.Before, d.Min, d.Measured, d.RecoveredOK = before, before, true, true
	threshold := before - tolerance
	lastLow := time.Duration(-1)
	var ends []time.Duration
	for t := fault + step; t <= end; t += step {
		ends = append(ends, t)
	}
	for _, t := range ends {
		from := max(fault, t-window)
		r, q := HitRateBetween(points, from, t)
		if q <= 0 {
			continue
		}
		if r < d.Min {
			d.Min, d.MinAt = r, t-fault
		}
		if r < threshold {
			lastLow = t
		}
	}
	if lastLow < 0 {
		return d
	}
	i := sort.Search(len(ends), func(i int) bool { return ends[i] > lastLow })
	if i == len(ends) {
		d.RecoveredOK = false
		d.Recovered = end - fault
		return d
	}
	d.Recovered = ends[i] - fault
	return d
}

// Record is one client request of the steady load.
type Record struct {
	Seq    int           `json:"seq"`
	Router string        `json:"router"` // "" when not sent (no router up)
	Start  time.Duration `json:"start"`  // since the start of the run
	End    time.Duration `json:"end"`
	Status int           `json:"status"` // HTTP status, 0 without a response
	// Err is the failure kind ("" when the request succeeded): connect,
	// reset, eof, timeout, http_5xx, incomplete, no_router, ...
	Err      string `json:"err,omitempty"`
	Backend  string `json:"backend,omitempty"`
	Decision string `json:"decision,omitempty"`
	Epoch    uint64 `json:"epoch,omitempty"`
	// Redispatched: a connection to the first router was refused and the
	// request went to the next one.
	Redispatched bool `json:"redispatched,omitempty"`
	// Detail is the error message of a failed answer (at most 200 bytes).
	Detail string `json:"detail,omitempty"`
}

// Failed reports whether the request failed.
func (r Record) Failed() bool { return r.Err != "" }

// inFlight reports whether r was in flight at some moment of [from, to].
func (r Record) inFlight(from, to time.Duration) bool { return r.Start <= to && r.End >= from }

// Outage is a moment a failure is unavoidable for the requests in flight:
// a router (Router set) or a backend (Backend set) was killed or stopped
// between From and To.
type Outage struct {
	Router  string        `json:"router,omitempty"`
	Backend string        `json:"backend,omitempty"`
	From    time.Duration `json:"from"`
	To      time.Duration `json:"to"`
}

// Errors counts a fault's failed requests by cause.
type Errors struct {
	Requests int `json:"requests"`
	// Unavoidable: in flight on a router or backend at the moment it was
	// killed or stopped, or not sent because no router was up.
	Unavoidable int `json:"unavoidable"`
	// Faulted: other failures on the router the fault hit.
	Faulted int `json:"faulted_router"`
	// Other: failures on the other routers.
	Other        int            `json:"other"`
	Redispatched int            `json:"redispatched"`
	ByKind       map[string]int `json:"by_kind,omitempty"`
	// Examples are the first failures that were not unavoidable, to tell
	// what happened to them.
	Examples []Record `json:"examples,omitempty"`
}

// maxExamples bounds Errors.Examples.
const maxExamples = 8

// Classify sorts the records' failures: victims are the routers the fault
// hit; outages the moments requests in flight could not survive. A
// failure in flight on a killed backend counts as unavoidable when the
// response named that backend or named none (the router could not say
// where it had sent the request before the stream broke).
func Classify(recs []Record, victims []string, outages []Outage) Errors {
	e := Errors{ByKind: map[string]int{}}
	victim := map[string]bool{}
	for _, v := range victims {
		victim[v] = true
	}
	for _, r := range recs {
		e.Requests++
		if r.Redispatched {
			e.Redispatched++
		}
		if !r.Failed() {
			continue
		}
		e.ByKind[r.Err]++
		switch {
		case unavoidable(r, outages):
			e.Unavoidable++
			continue
		case victim[r.Router]:
			e.Faulted++
		default:
			e.Other++
		}
		if len(e.Examples) < maxExamples {
			e.Examples = append(e.Examples, r)
		}
	}
	return e
}

func unavoidable(r Record, outages []Outage) bool {
	if r.Router == "" {
		return true // not sent: no router was up
	}
	for _, o := range outages {
		if !r.inFlight(o.From, o.To) {
			continue
		}
		if o.Router != "" && o.Router == r.Router {
			return true
		}
		if o.Backend != "" && (r.Backend == o.Backend || r.Backend == "") {
			return true
		}
	}
	return false
}

// LateRouted counts the requests served by backend (removed at epoch
// epoch, acknowledged at ack) with an epoch header at or past the removal
// (byEpoch: must be 0) and those started after the acknowledgement
// (byTime: routers that had not applied it yet).
func LateRouted(recs []Record, backend string, epoch uint64, ack time.Duration) (byEpoch, byTime int) {
	for _, r := range recs {
		if r.Backend != backend {
			continue
		}
		if r.Epoch >= epoch {
			byEpoch++
		}
		if r.Start > ack {
			byTime++
		}
	}
	return byEpoch, byTime
}
