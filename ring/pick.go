package ring

import (
	"iter"
	"math"
	"math/rand/v2"
	"sync/atomic"
)

// Loads is what Pick needs to know about live load. Backend indexes are
// those of Ring.Backends. Implementations must be cheap and must not block:
// Pick calls them on every request. The proxy implements it from its own
// atomics plus the cluster's gossiped figures.
type Loads interface {
	// InFlight is backend b's in-flight request count across the cluster.
	InFlight(b int) int64
	// Healthy reports whether b may be picked at all (not failing, not
	// ejected, not already tried for this request).
	Healthy(b int) bool
	// Busy reports whether b's engine has queued requests; with
	// Config.BusyIsFull, PREFIX_AWARE treats a busy backend as over its
	// limit.
	Busy(b int) bool
}

// Queues is what a Loads may also implement so that the COST overflow
// rule weighs what a request would wait for on its owner (the requests
// the owner's engine queues) rather than how many it has in flight: an
// engine runs many requests at once, and only the queued ones are ahead
// of a new one.
type Queues interface {
	// Queued is the number of b's requests its engine is taken to queue
	// now (0 when it does not queue).
	Queued(b int) int64
}

// LoadTotals is what a Loads may also implement so that the bounded-loads
// cap (Config.LoadFactor) costs O(1) instead of a walk over the fleet: the
// fleet's in-flight total, kept as counts change (a Tally does the
// keeping).
type LoadTotals interface {
	// HealthyTotals returns the sum of InFlight(b) over every backend b of
	// the ring for which Healthy(b) holds, whatever its State, and how
	// many such backends there are. ok false means the implementation
	// cannot tell now; Pick then sums over the fleet itself.
	HealthyTotals() (inflight, healthy int64, ok bool)
}

// Tally keeps the sums LoadTotals reports for the backends of one ring,
// as their counts change. It is safe for concurrent use: call Update for
// a backend after every change of its in-flight count or health, from
// whichever goroutine made the change. Whatever the interleaving, once
// changes stop and their Updates return, the sums equal a walk over the
// fleet; while counts change they are, like such a walk, a recent view.
type Tally struct {
	inflight atomic.Int64
	healthy  atomic.Int64
	// share[b] is what backend b adds to the sums as of its last Update:
	// 0 when it is not healthy, else its in-flight count times 2, plus 1.
	share []atomic.Int64
}

// NewTally returns a Tally for n backends, all of them unhealthy until
// their first Update.
func NewTally(n int) *Tally { return &Tally{share: make([]atomic.Int64, n)} }

// Update brings backend b's share of the sums up to date with
// src.InFlight(b) and src.Healthy(b), read afresh until the share it
// records matches what it reads: an Update that raced with another and
// recorded older figures repairs them before it returns, so the last
// Update after the last change always leaves the right share.
func (t *Tally) Update(b int, src Loads) {
	share := &t.share[b]
	for {
		want := int64(0)
		if src.Healthy(b) {
			want = src.InFlight(b)<<1 | 1
		}
		old := share.Load()
		if old == want {
			return
		}
		if share.CompareAndSwap(old, want) {
			if d := want>>1 - old>>1; d != 0 {
				t.inflight.Add(d)
			}
			if d := want&1 - old&1; d != 0 {
				t.healthy.Add(d)
			}
		}
	}
}

// Totals returns the sum of the in-flight counts of the healthy backends
// and how many they are.
func (t *Tally) Totals() (inflight, healthy int64) {
	return t.inflight.Load(), t.healthy.Load()
}

// Share returns what backend b adds to Totals: its in-flight count and
// whether it is counted as healthy (a backend that is not adds nothing).
// A caller that must leave a few backends out of the sums, such as those
// a request already tried, subtracts their shares.
func (t *Tally) Share(b int) (inflight int64, healthy bool) {
	s := t.share[b].Load()
	return s >> 1, s&1 == 1
}

// Reason says why Pick chose a backend; reasonTable (registry.go)
// describes each.
type Reason uint8

const (
	// ReasonNone: nothing was picked.
	ReasonNone Reason = iota
	// ReasonAffinity: the partition's owner, under its limit.
	ReasonAffinity
	// ReasonOverflow: the owner was full or unhealthy; a later backend in
	// the partition's overflow order (Decision.Rank says which).
	ReasonOverflow
	// ReasonFallback: every backend in the overflow order was full; the
	// least loaded healthy backend.
	ReasonFallback
	// ReasonRandom, ReasonRoundRobin, ReasonLeastOutstanding and
	// ReasonConsistentHash name the load-blind or key-blind strategies.
	ReasonRandom
	ReasonRoundRobin
	ReasonLeastOutstanding
	ReasonConsistentHash

	// NumReasons counts the reasons: every Reason is below it. A new one
	// goes above it, with its row in reasonTable (registry.go).
	NumReasons
)

func (r Reason) String() string {
	if int(r) < len(reasonTable) {
		return reasonTable[r].Label
	}
	return "unknown"
}

// Decision is the outcome of Pick.
type Decision struct {
	// Backend is an index into Ring.Backends, or -1.
	Backend int
	Reason  Reason
	// Rank is the backend's position in the partition's overflow order (0
	// = owner), or -1 when the pick did not come from that order.
	Rank int
}

var noDecision = Decision{Backend: -1, Rank: -1}

func (r *Ring) eligible(b int, loads Loads) bool {
	return r.backends[b].State == Active && loads.Healthy(b)
}

// Pick chooses a backend for key under the ring's strategy. It never panics
// and never blocks; with no eligible backend it returns ErrNoBackend. The
// same ring, key and loads give the same decision on every node, except
// for RANDOM, ROUND_ROBIN and the tie-break of LEAST_OUTSTANDING_REQUESTS.
func (r *Ring) Pick(key uint64, loads Loads) (Decision, error) {
	return r.PickCost(key, 1, loads)
}

// PickCost is Pick for a request whose prefill, redone on a backend that
// does not hold its prefix, costs about recompute average requests (the
// proxy weighs its prompt's length against the mean and the share of
// prompts the owners' caches serve): the COST overflow rule leaves the
// owner only when the owner is that much more loaded than the alternative.
func (r *Ring) PickCost(key uint64, recompute int64, loads Loads) (Decision, error) {
	if len(r.backends) == 0 {
		return noDecision, ErrNoBackend
	}
	switch r.cfg.Strategy {
	case PrefixAware:
		if r.cfg.Overflow == CostOverflow {
			if d, ok := r.pickByCost(key, recompute, loads); ok {
				return d, nil
			}
		}
		return r.pickPrefixAware(key, loads)
	case ConsistentHash:
		p := r.Partition(key)
		for rank, b := range r.Order(p) {
			if r.eligible(int(b), loads) {
				return Decision{Backend: int(b), Reason: ReasonConsistentHash, Rank: rank}, nil
			}
		}
		return r.pickLeast(p, loads, ReasonConsistentHash, false)
	case Random:
		return r.pickFrom(int(rand.Uint64N(uint64(len(r.backends)))), loads, ReasonRandom)
	case RoundRobin:
		return r.pickFrom(int((r.rr.Add(1)-1)%uint64(len(r.backends))), loads, ReasonRoundRobin)
	case LeastOutstanding:
		return r.pickLeast(-1, loads, ReasonLeastOutstanding, true)
	}
	return noDecision, ErrNoBackend
}

// pickFrom returns the first eligible backend at or after start.
func (r *Ring) pickFrom(start int, loads Loads, why Reason) (Decision, error) {
	n := len(r.backends)
	for k := 0; k < n; k++ {
		b := (start + k) % n
		if r.eligible(b, loads) {
			return Decision{Backend: b, Reason: why, Rank: -1}, nil
		}
	}
	return noDecision, ErrNoBackend
}

func (r *Ring) pickPrefixAware(key uint64, loads Loads) (Decision, error) {
	p := r.Partition(key)
	order := r.Order(p)
	c := candidate{bound: math.MaxInt64, boundDone: r.cfg.LoadFactor == 0}
	// The owner wherever it is (its cache is the point), then the overflow
	// order (zone-aware: this router's zone first).
	if d, ok := r.tryCandidate(int(order[0]), 0, loads, &c); ok {
		return d, nil
	}
	for rank, b := range r.overflowWalk(order) {
		if d, ok := r.tryCandidate(b, rank, loads, &c); ok {
			return d, nil
		}
	}
	return r.pickLeast(p, loads, ReasonFallback, false)
}

// overflowWalk yields the backends of a partition's order after its owner,
// as (rank, backend index): in order or, zone-aware, those in this
// router's zone first and then the others, each group in order.
func (r *Ring) overflowWalk(order []int32) iter.Seq2[int, int] {
	return func(yield func(int, int) bool) {
		passes := 1
		if r.zoneAware() {
			passes = 2
		}
		for pass := 0; pass < passes; pass++ {
			for rank := 1; rank < len(order); rank++ {
				b := int(order[rank])
				if passes == 2 && (r.backends[b].Zone == r.cfg.LocalZone) != (pass == 0) {
					continue
				}
				if !yield(rank, b) {
					return
				}
			}
		}
	}
}

// pickByCost applies the COST rule. The owner keeps the key unless
//   - with LoadFactor set, its in-flight count exceeds the bounded-loads
//     cap (LoadFactor x the fleet's average) by more than recompute - 1:
//     the request would redo recompute mean requests' worth of prefill
//     elsewhere, so a long prompt tolerates a more loaded owner; or
//   - its engine queues (Busy), by more than recompute requests when the
//     Loads knows the queue (Queues), and an alternative is less loaded
//     by more than recompute.
//
// It then takes the first backend in the key's order that is eligible,
// under its limit, not queueing and under the cap (for the second case:
// less loaded by more than recompute). With none, the request waits on the
// warm owner: overflow never adds prefill work to a fleet that is busy
// everywhere. It reports !ok when the owner is over its hard cap or not
// eligible: the threshold walk decides then.
func (r *Ring) pickByCost(key uint64, recompute int64, loads Loads) (Decision, bool) {
	p := r.Partition(key)
	order := r.Order(p)
	o := int(order[0])
	if !r.eligible(o, loads) {
		return Decision{}, false
	}
	no := loads.InFlight(o)
	if !r.hasRoom(o, no) {
		return Decision{}, false
	}
	affinity := Decision{Backend: o, Reason: ReasonAffinity, Rank: 0}
	recompute = max(recompute, 1)
	bound := int64(math.MaxInt64)
	over := false
	if no > 0 && r.cfg.LoadFactor > 0 {
		bound = r.loadBound(loads)
		over = no+1 > bound+recompute-1
	}
	busy := loads.Busy(o)
	if !over && !busy {
		return affinity, true
	}
	// The owner's queue, when the Loads knows it, is what a request
	// would wait behind there: no more than recompute, and it stays.
	if q, ok := loads.(Queues); ok && !over && q.Queued(o) <= recompute {
		return affinity, true
	}
	for rank, b := range r.overflowWalk(order) {
		if !r.eligible(b, loads) || loads.Busy(b) {
			continue
		}
		n := loads.InFlight(b)
		if !r.hasRoom(b, n) || n+1 > bound {
			continue
		}
		if !over && no-n <= recompute {
			continue
		}
		return Decision{Backend: b, Reason: ReasonOverflow, Rank: rank}, true
	}
	// Every alternative queues too, or is not enough less loaded: wait on
	// the warm owner.
	return affinity, true
}

// Admits reports whether decision d, made by this ring's PickCost, stands
// once its request is counted: inflight is d's backend's in-flight count
// across the cluster, that request included. This is the overflow rule's
// hard part, and the one place it is written: a request goes to a partition's owner
// (ReasonAffinity), or past it along the overflow order (ReasonOverflow),
// only while that backend has room for it under its concurrency limit
// (Limit: ConcurrencyThreshold x weight). Every other decision stands
// whatever the count: ReasonFallback is what is left when every candidate
// is full, and CONSISTENT_HASH and the key-blind strategies ignore
// limits. The bounded-loads cap (LoadFactor) and a queueing engine (Busy)
// steer PickCost too, but are not a cap: Admits does not ask them again.
//
// PickCost applies the rule to the counts it reads. A caller that then
// takes a slot of the backend's count, as other requests take theirs at
// once, asks Admits with the count its slot made and, on false, gives the
// slot back and picks again, seeing those requests: so the limit holds
// against every request the caller sees, with no lock around the pick.
func (r *Ring) Admits(d Decision, inflight int64) bool {
	switch d.Reason {
	case ReasonAffinity, ReasonOverflow:
		return r.hasRoom(d.Backend, inflight-1)
	}
	return true
}

// hasRoom reports whether backend b, with n requests in flight, has room
// for one more under its limit (see Admits).
func (r *Ring) hasRoom(b int, n int64) bool { return n < r.limits[b] }

// candidate carries the lazily computed bounded-loads cap through a walk.
type candidate struct {
	bound     int64
	boundDone bool
}

// tryCandidate reports whether backend b at rank can take the request:
// eligible, under its concurrency limit, not busy (with BusyIsFull) and
// within the bounded-loads cap (with LoadFactor).
func (r *Ring) tryCandidate(b, rank int, loads Loads, c *candidate) (Decision, bool) {
	if !r.eligible(b, loads) {
		return Decision{}, false
	}
	n := loads.InFlight(b)
	if !r.hasRoom(b, n) || (r.cfg.BusyIsFull && loads.Busy(b)) {
		return Decision{}, false
	}
	// The cap is at least 1 (LoadFactor >= 1), so an idle backend is always
	// within it: the fleet's total is only needed for a busy one (a read
	// of LoadTotals, or a walk over the fleet without them).
	if n > 0 && !c.boundDone {
		c.bound = r.loadBound(loads)
		c.boundDone = true
	}
	if n+1 > c.bound {
		return Decision{}, false
	}
	why := ReasonOverflow
	if rank == 0 {
		why = ReasonAffinity
	}
	return Decision{Backend: b, Reason: why, Rank: rank}, true
}

func (r *Ring) zoneAware() bool { return r.cfg.ZoneAware && r.cfg.LocalZone != "" }

// loadBound is the bounded-loads cap: ceil(LoadFactor x (total+1) / n) over
// eligible backends, the +1 counting the request being placed (as HAProxy's
// hash-balance-factor does). With LoadTotals, total and n are the healthy
// backends' totals less the few that are not Active in this ring;
// otherwise a walk over the fleet sums them.
func (r *Ring) loadBound(loads Loads) int64 {
	total, n, ok := r.kept(loads)
	if !ok {
		for b := range r.backends {
			if r.backends[b].State == Active && loads.Healthy(b) {
				total += loads.InFlight(b)
				n++
			}
		}
	}
	if n <= 0 {
		return math.MaxInt64
	}
	return int64(math.Ceil(r.cfg.LoadFactor * float64(total+1) / float64(n)))
}

// kept returns the eligible backends' in-flight total and number from
// loads' LoadTotals, or !ok when loads keeps none or when most backends
// are not Active (then a walk is as cheap as the correction).
func (r *Ring) kept(loads Loads) (total, n int64, ok bool) {
	lt, has := loads.(LoadTotals)
	if !has || 2*len(r.inactive) > len(r.backends) {
		return 0, 0, false
	}
	if total, n, ok = lt.HealthyTotals(); !ok {
		return 0, 0, false
	}
	for _, b := range r.inactive {
		if loads.Healthy(int(b)) {
			total -= loads.InFlight(int(b))
			n--
		}
	}
	return total, n, true
}

// pickLeast returns the eligible backend with the fewest in-flight
// requests. Ties go, deterministically, to the earliest in partition p's
// overflow order, then the lowest index; with randomTie they go to a random
// one instead (p < 0).
func (r *Ring) pickLeast(p int, loads Loads, why Reason, randomTie bool) (Decision, error) {
	best, bestN, bestRank := -1, int64(math.MaxInt64), -1
	if p >= 0 {
		for rank, b32 := range r.Order(p) {
			b := int(b32)
			if r.eligible(b, loads) {
				if n := loads.InFlight(b); n < bestN {
					best, bestN, bestRank = b, n, rank
				}
			}
		}
	}
	nb := len(r.backends)
	start := 0
	if randomTie {
		start = int(rand.Uint64N(uint64(nb)))
	}
	for k := 0; k < nb; k++ {
		b := (start + k) % nb
		if r.eligible(b, loads) {
			if n := loads.InFlight(b); n < bestN {
				best, bestN, bestRank = b, n, -1
			}
		}
	}
	if best < 0 {
		return noDecision, ErrNoBackend
	}
	if why == ReasonFallback || why == ReasonConsistentHash {
		return Decision{Backend: best, Reason: why, Rank: bestRank}, nil
	}
	return Decision{Backend: best, Reason: why, Rank: -1}, nil
}

// Candidate is one backend in an Explanation.
type Candidate struct {
	ID       string `json:"id"`
	Rank     int    `json:"rank"`
	InFlight int64  `json:"in_flight"`
	Limit    int64  `json:"limit"`
	State    string `json:"state"`
	Healthy  bool   `json:"healthy"`
	Busy     bool   `json:"busy"`
	// Queued is what the COST rule takes the backend's engine to queue
	// (Queues), when the Loads knows it.
	Queued int64 `json:"queued,omitempty"`
}

// Explanation is what the route explainer shows: the key's partition, the
// partition's candidates in order with their live state, and the pick.
type Explanation struct {
	Strategy   string      `json:"strategy"`
	Partition  int         `json:"partition"`
	Candidates []Candidate `json:"candidates"`
	Backend    string      `json:"backend,omitempty"`
	Reason     string      `json:"reason"`
	Rank       int         `json:"rank"`
	// Recompute is the request's recompute cost in average requests, as
	// the COST overflow rule weighed it (ExplainCost).
	Recompute int64  `json:"recompute"`
	Error     string `json:"error,omitempty"`
}

// Explain runs Pick and reports how it got there. For RANDOM and
// ROUND_ROBIN the pick shown is one draw; it allocates and is meant for the
// admin API, not the request path.
func (r *Ring) Explain(key uint64, loads Loads) Explanation {
	return r.ExplainCost(key, 1, loads)
}

// ExplainCost is Explain for PickCost.
func (r *Ring) ExplainCost(key uint64, recompute int64, loads Loads) Explanation {
	e := Explanation{Strategy: r.cfg.Strategy.String(), Partition: r.Partition(key), Rank: -1, Recompute: max(recompute, 1)}
	q, _ := loads.(Queues)
	for rank, b32 := range r.Order(e.Partition) {
		b := int(b32)
		c := Candidate{
			ID:       r.backends[b].ID,
			Rank:     rank,
			InFlight: loads.InFlight(b),
			Limit:    r.limits[b],
			State:    r.backends[b].State.String(),
			Healthy:  loads.Healthy(b),
			Busy:     loads.Busy(b),
		}
		if q != nil {
			c.Queued = q.Queued(b)
		}
		e.Candidates = append(e.Candidates, c)
	}
	d, err := r.PickCost(key, recompute, loads)
	e.Reason = d.Reason.String()
	e.Rank = d.Rank
	if err != nil {
		e.Error = err.Error()
	} else {
		e.Backend = r.backends[d.Backend].ID
	}
	return e
}
