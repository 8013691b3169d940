package proxy

import (
	"math"
	"math/bits"
	"sync/atomic"

	"github.com/warmroute/warmroute/ring"
)

// Fleet totals for bounded loads.
//
// With LoadFactor set, PREFIX_AWARE caps a busy backend at LoadFactor x the
// fleet's average in flight, which needs the in-flight total of every
// backend a request may go to. Instead of a walk over the fleet on each
// such pick (5 us at 1,000 backends), a table keeps that total in a
// ring.Tally as counts change, and the request's load view hands it to the
// ring (ring.LoadTotals). The backends feed it: every change of a
// backend's own or gossiped in-flight count, of its health-check verdict
// or of its ejection updates its share in the totals of the tables it is
// in (loadCount, healthFlag, healthTime), from whichever goroutine made
// the change.
//
// A table's totals are built by the first pick that needs them (O(fleet)
// and two allocations, once per table); a backend feeds the totals of at
// most totalsPerBackend tables, newer ones replacing older ones, so a
// request on a table replaced several times since, or on one of more
// tables in use at once than that, walks (see mayKeepTotals). An ejection ends with the clock,
// not with a change: the totals count ejected backends out until the
// latest request time they have seen passes the ejection's end, then
// count them again. So they are exact for a request whose arrival time is
// the latest seen; one that arrived microseconds earlier may count a
// backend whose ejection ended in between, which its walk would not.

// totalsPerBackend is how many tables' totals a backend feeds at most:
// the table in use and its models' sub-tables, and the tables they
// replaced while requests still route on them.
const totalsPerBackend = 4

// totalsSlot is one table's totals a backend feeds, and its index there.
type totalsSlot struct {
	f *fleetTotals
	i int
}

// totalsList is the totals a backend feeds, oldest first. A published list
// is never changed; joining new totals publishes a new one.
type totalsList struct {
	slots [totalsPerBackend]totalsSlot
	n     int
}

// fleetTotals are one table's kept totals.
type fleetTotals struct {
	t     *table
	tally *ring.Tally
	// lists are the backends' totals lists that name these totals, one
	// per backend, allocated together.
	lists []totalsList
	// now is the latest request time seen (unix nanos): the clock that
	// ejections end by.
	now atomic.Int64
	// wake is the earliest end of an ejection that counts a backend out
	// (MaxInt64 for none): when now passes it, shares are recomputed.
	wake atomic.Int64
	// ready: every backend of t feeds the totals.
	ready atomic.Bool
	// dropped: a backend of t stopped feeding them (it feeds newer
	// tables'); picks on t walk.
	dropped atomic.Bool
}

// fleetView is what the tally reads: a backend's cluster-wide in-flight
// count, and whether it passes its health checks and is not ejected as of
// the totals' clock.
type fleetView fleetTotals

func (v *fleetView) InFlight(i int) int64 { return v.t.bs[i].globalInFlight() }
func (v *fleetView) Healthy(i int) bool   { return v.t.bs[i].available(v.now.Load()) }
func (v *fleetView) Busy(int) bool        { return false }

var _ ring.Loads = (*fleetView)(nil)

// update brings backend i's share up to date, and makes sure the end of
// its ejection, if any, is noticed.
func (f *fleetTotals) update(i int) {
	view := (*fleetView)(f)
	f.tally.Update(i, view)
	until := f.t.bs[i].ejectedUntil.Load()
	if until == 0 {
		return
	}
	if until > f.now.Load() {
		f.wakeBy(until)
	}
	// The clock may have passed the ejection's end after the share was
	// computed and before wake covered it; then no one else recomputes it.
	if until <= f.now.Load() {
		f.tally.Update(i, view)
	}
}

func (f *fleetTotals) wakeBy(until int64) {
	for {
		w := f.wake.Load()
		if until >= w || f.wake.CompareAndSwap(w, until) {
			return
		}
	}
}

// advance moves the clock to now, if later, and recomputes every share
// once it passes the end of an ejection.
func (f *fleetTotals) advance(now int64) {
	for {
		c := f.now.Load()
		if now <= c || f.now.CompareAndSwap(c, now) {
			break
		}
	}
	if f.now.Load() >= f.wake.Load() {
		f.refresh()
	}
}

// refresh recomputes every share. Each update after the reset of wake
// lowers it again for a backend still ejected.
func (f *fleetTotals) refresh() {
	f.wake.Store(math.MaxInt64)
	for i := range f.t.bs {
		f.update(i)
	}
}

// totals returns t's kept totals, building them on first use, or nil when
// picks on t must walk: another goroutine is building them, they were
// dropped, or they may not be built (mayKeepTotals).
func (t *table) totals(now int64) *fleetTotals {
	if len(t.bs) == 0 {
		return nil
	}
	b0 := t.bs[0]
	if f := b0.totalsFor(t); f != nil {
		return f.usable()
	}
	if !t.mayKeepTotals() {
		return nil
	}
	b0.totalsMu.Lock()
	defer b0.totalsMu.Unlock()
	if f := b0.totalsFor(t); f != nil {
		return f.usable()
	}
	if !t.mayKeepTotals() {
		return nil
	}
	f := &fleetTotals{t: t, tally: ring.NewTally(len(t.bs)), lists: make([]totalsList, len(t.bs))}
	f.now.Store(now)
	for i, b := range t.bs {
		b.join(f, i)
	}
	// Every change from here on reaches f; the shares computed now read
	// everything before.
	f.refresh()
	f.ready.Store(true)
	return f
}

// mayKeepTotals reports whether t's totals may be built: every backend of
// t reports its changes, and none feeds as many totals as it may unless
// the oldest of them is of an older table (by epoch), which would be
// dropped. So tables in use at once (a table and its models' sub-tables,
// of one epoch) never drop each other's totals: the first
// totalsPerBackend of them a backend is in keep totals, the others walk,
// and a replaced table never takes totals back from its successors.
func (t *table) mayKeepTotals() bool {
	for _, b := range t.bs {
		if b.inflight.b != b {
			return false // not made by newBackend: its counters feed nothing
		}
		if l := b.totals.Load(); l != nil && l.n == totalsPerBackend && l.slots[0].f.t.epoch >= t.epoch {
			return false
		}
	}
	return true
}

func (f *fleetTotals) usable() *fleetTotals {
	if !f.ready.Load() || f.dropped.Load() {
		return nil
	}
	return f
}

// totalsFor returns the totals of t that b feeds, or nil.
func (b *backend) totalsFor(t *table) *fleetTotals {
	if l := b.totals.Load(); l != nil {
		for _, s := range l.slots[:l.n] {
			if s.f.t == t {
				return s.f
			}
		}
	}
	return nil
}

// join makes b feed f as its backend i, and stop feeding the oldest
// totals beyond totalsPerBackend, which are dropped.
func (b *backend) join(f *fleetTotals, i int) {
	next := &f.lists[i]
	for {
		old := b.totals.Load()
		var keep []totalsSlot
		if old != nil {
			keep = old.slots[:old.n]
			if len(keep) >= totalsPerBackend {
				keep = keep[len(keep)-(totalsPerBackend-1):]
			}
		}
		// next is not published until the swap succeeds.
		next.n = copy(next.slots[:], keep)
		next.slots[next.n] = totalsSlot{f: f, i: i}
		next.n++
		if b.totals.CompareAndSwap(old, next) {
			if old != nil {
				for _, s := range old.slots[:old.n-len(keep)] {
					s.f.dropped.Store(true)
				}
			}
			return
		}
	}
}

// recount brings b's share in every totals it feeds up to date. It is
// called after every change of b's counts or health; b is nil for a
// backend not made by newBackend.
func (b *backend) recount() {
	if b == nil {
		return
	}
	if l := b.totals.Load(); l != nil {
		for _, s := range l.slots[:l.n] {
			s.f.update(s.i)
		}
	}
}

// loadCount is an in-flight count whose changes reach the totals b feeds.
type loadCount struct {
	v atomic.Int64
	b *backend
}

func (c *loadCount) Load() int64 { return c.v.Load() }

func (c *loadCount) Add(d int64) int64 {
	n := c.v.Add(d)
	c.b.recount()
	return n
}

func (c *loadCount) Store(v int64) {
	c.v.Store(v)
	c.b.recount()
}

// healthFlag is a health verdict whose changes reach the totals b feeds.
type healthFlag struct {
	v atomic.Bool
	b *backend
}

func (h *healthFlag) Load() bool { return h.v.Load() }

func (h *healthFlag) Store(v bool) {
	h.v.Store(v)
	h.b.recount()
}

// healthTime is an ejection's end (unix nanos) whose changes reach the
// totals b feeds.
type healthTime struct {
	v atomic.Int64
	b *backend
}

func (h *healthTime) Load() int64 { return h.v.Load() }

func (h *healthTime) Store(v int64) {
	h.v.Store(v)
	h.b.recount()
}

// HealthyTotals implements ring.LoadTotals for a request: the table's
// kept totals, less the backends the request already tried (which Healthy
// reports unhealthy).
func (s *reqState) HealthyTotals() (inflight, healthy int64, ok bool) {
	f := s.t.totals(s.now)
	if f == nil {
		return 0, 0, false
	}
	f.advance(s.now)
	inflight, healthy = f.tally.Totals()
	for w, word := range s.tried {
		for word != 0 {
			i := w<<6 | bits.TrailingZeros64(word)
			word &= word - 1
			if n, counted := f.tally.Share(i); counted {
				inflight -= n
				healthy--
			}
		}
	}
	return inflight, healthy, true
}

var _ ring.LoadTotals = (*reqState)(nil)
