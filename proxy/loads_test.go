package proxy

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warmroute/warmroute/ring"
)

// walkView hides reqState's kept totals: the ring walks the fleet.
type walkView struct{ s *reqState }

func (w walkView) InFlight(b int) int64 { return w.s.InFlight(b) }
func (w walkView) Healthy(b int) bool   { return w.s.Healthy(b) }
func (w walkView) Busy(b int) bool      { return w.s.Busy(b) }

// walkTotals sums what the kept totals stand for: in-flight over the
// backends s reports healthy.
func walkTotals(s *reqState) (total, n int64) {
	for b := range s.t.bs {
		if s.Healthy(b) {
			total += s.InFlight(b)
			n++
		}
	}
	return total, n
}

func totalsBackends(ids []int) []ring.Backend {
	bs := make([]ring.Backend, len(ids))
	for i, id := range ids {
		bs[i] = ring.Backend{ID: fmt.Sprintf("gpu-%d/", id), Addr: fmt.Sprintf("10.0.%d.%d:8000", id/200, id%200+1)}
	}
	return bs
}

func totalsProxy(t testing.TB) *Proxy {
	t.Helper()
	p, err := New(DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func totalsRingConfig() ring.Config {
	cfg := ring.DefaultConfig()
	cfg.ReplicationFactor = 20
	cfg.LoadFactor = 1.25
	cfg.ConcurrencyThreshold = 64
	return cfg
}

func setTotalsRing(t testing.TB, p *Proxy, cfg ring.Config, bs []ring.Backend, epoch uint64) *ring.Ring {
	t.Helper()
	r, err := ring.New(cfg, bs)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.SetRing(r, epoch); err != nil {
		t.Fatal(err)
	}
	return r
}

// TestFleetTotalsMatchWalk changes own and gossiped counts, health-check
// verdicts, ejections (ending and not), tried backends and the ring itself
// (members joining and leaving, draining, moves), and checks after each
// change that a request's kept totals equal a walk over the fleet and that
// Pick decides the same with them as walking.
func TestFleetTotalsMatchWalk(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	p := totalsProxy(t)
	cfg := totalsRingConfig()
	cfg.Overflow = ring.ThresholdOverflow
	ids := []int{}
	for i := 0; i < 40; i++ {
		ids = append(ids, i)
	}
	next := 40
	bs := totalsBackends(ids)
	r := setTotalsRing(t, p, cfg, bs, 1)
	now := time.Unix(1_000_000, 0)
	st := &reqState{}
	checked, kept := 0, 0
	for step := 0; step < 3000; step++ {
		now = now.Add(time.Duration(rng.IntN(3)) * time.Millisecond)
		tab := p.tab.Load()
		b := tab.bs[rng.IntN(len(tab.bs))]
		switch rng.IntN(12) {
		case 0:
			b.probeDown.Store(!b.probeDown.Load())
		case 1:
			// Ejected for 0-4 ms from now: some end before the next checks.
			b.ejectedUntil.Store(now.Add(time.Duration(rng.IntN(5)) * time.Millisecond).UnixNano())
		case 2:
			b.ejectedUntil.Store(0)
		case 3:
			p.SetRemote(b.id, int64(rng.IntN(50)), EngineQueue{})
		case 4:
			if rng.IntN(10) == 0 {
				// A new ring: one backend leaves, one joins, a few drain.
				ids = append(ids[1:], next)
				next++
				bs = totalsBackends(ids)
				for i := range bs {
					if rng.IntN(8) == 0 {
						bs[i].State = ring.Draining
					}
				}
				r = setTotalsRing(t, p, cfg, bs, uint64(step))
				if rng.IntN(2) == 0 {
					moved := r.WithMoves([]ring.Move{{Partition: rng.IntN(r.Partitions()), Backend: bs[0].ID}})
					if err := p.SetRing(moved, uint64(step)); err != nil {
						t.Fatal(err)
					}
					r = moved
				}
			}
		default:
			if b.inflight.Load() > 0 && rng.IntN(2) == 0 {
				b.inflight.Add(-1)
			} else {
				b.inflight.Add(1)
			}
		}
		tab = p.tab.Load()
		st.reset(tab, now)
		for c := rng.IntN(3); c > 0; c-- {
			st.markTried(rng.IntN(len(tab.bs)))
		}
		total, n, ok := st.HealthyTotals()
		if !ok {
			t.Fatalf("step %d: no kept totals for the current table", step)
		}
		kept++
		if wt, wn := walkTotals(st); total != wt || n != wn {
			t.Fatalf("step %d: kept totals %d in flight on %d backends, walk %d on %d", step, total, n, wt, wn)
		}
		for q := 0; q < 5; q++ {
			key := rng.Uint64()
			want, werr := r.Pick(key, walkView{st})
			got, gerr := r.Pick(key, st)
			checked++
			if got != want || (gerr == nil) != (werr == nil) {
				t.Fatalf("step %d key %x: %+v (%v) with kept totals, %+v (%v) walking", step, key, got, gerr, want, werr)
			}
		}
	}
	t.Logf("%d checks of the totals, %d picks compared", kept, checked)
}

// TestFleetTotalsOldTable: a request still routing on a replaced table gets
// totals that match its own table, or none (it walks).
func TestFleetTotalsOldTable(t *testing.T) {
	p := totalsProxy(t)
	cfg := totalsRingConfig()
	setTotalsRing(t, p, cfg, totalsBackends([]int{1, 2, 3, 4, 5}), 1)
	now := time.Unix(2_000_000, 0)
	var tabs []*table
	for gen := 0; gen < totalsPerBackend+2; gen++ {
		tab := p.tab.Load()
		tabs = append(tabs, tab)
		st := &reqState{}
		st.reset(tab, now)
		if _, _, ok := st.HealthyTotals(); !ok {
			t.Fatalf("generation %d: no totals for the current table", gen)
		}
		for i, b := range tab.bs {
			b.inflight.Add(int64(i + gen))
		}
		setTotalsRing(t, p, cfg, totalsBackends([]int{1, 2, 3, 4, 5, 6 + gen}), uint64(gen+2))
	}
	// The newest table with totals feeds them; the one before it too.
	// Older ones walk, and never rebuild totals (which would drop the
	// newer tables').
	for gen := len(tabs) - 1; gen >= 0; gen-- {
		st := &reqState{}
		st.reset(tabs[gen], now)
		total, n, ok := st.HealthyTotals()
		if want := gen >= len(tabs)-totalsPerBackend; ok != want {
			t.Errorf("generation %d: kept totals %v, want %v", gen, ok, want)
		}
		if !ok {
			continue
		}
		if wt, wn := walkTotals(st); total != wt || n != wn {
			t.Errorf("generation %d: kept totals %d on %d, walk %d on %d", gen, total, n, wt, wn)
		}
	}
	st := &reqState{}
	st.reset(tabs[len(tabs)-1], now)
	if _, _, ok := st.HealthyTotals(); !ok {
		t.Error("the newest table lost its totals to older ones")
	}
}

// TestFleetTotalsSubTables: tables in use at once over shared backends
// (a table and its models' sub-tables, of one epoch) never take totals from
// each other: after a first round of picks on each, no backend's totals
// change, and every table either has totals equal to a walk or walks.
func TestFleetTotalsSubTables(t *testing.T) {
	p := totalsProxy(t)
	cfg := totalsRingConfig()
	ids := []int{0, 1, 2, 3, 4, 5, 6, 7}
	setTotalsRing(t, p, cfg, totalsBackends(ids), 3)
	main := p.tab.Load()
	tabs := []*table{main}
	// Sub-tables as models.go builds them: a subset's ring and backends.
	for m := 0; m < totalsPerBackend+2; m++ {
		var sub []int
		for _, id := range ids {
			if id%4 != m%4 || id < 2 { // backends 0 and 1 are in every table
				sub = append(sub, id)
			}
		}
		r, err := ring.New(cfg, totalsBackends(sub))
		if err != nil {
			t.Fatal(err)
		}
		st := &table{ring: r, epoch: main.epoch, epochHdr: main.epochHdr}
		for _, rb := range r.Backends() {
			i, _ := main.ring.Index(rb.ID)
			st.bs = append(st.bs, main.bs[i])
		}
		tabs = append(tabs, st)
	}
	for i, b := range main.bs {
		b.inflight.Add(int64(i + 1))
	}
	now := time.Unix(4_000_000, 0)
	lists := func() []*totalsList {
		var out []*totalsList
		for _, b := range main.bs {
			out = append(out, b.totals.Load())
		}
		return out
	}
	var first []*totalsList
	kept := 0
	for round := 0; round < 3; round++ {
		for k, tab := range tabs {
			st := &reqState{}
			st.reset(tab, now)
			total, n, ok := st.HealthyTotals()
			if round == 0 && ok {
				kept++
			}
			if ok {
				if wt, wn := walkTotals(st); total != wt || n != wn {
					t.Errorf("round %d table %d: kept totals %d on %d, walk %d on %d", round, k, total, n, wt, wn)
				}
			}
		}
		if round == 0 {
			first = lists()
		} else if !slices.Equal(lists(), first) {
			t.Fatalf("round %d: picks on tables in use at once rebuilt totals", round)
		}
	}
	if kept < totalsPerBackend {
		t.Errorf("%d of %d tables keep totals, want at least %d", kept, len(tabs), totalsPerBackend)
	}
}

// TestFleetTotalsEjectionEnds: an ejected backend is counted out until the
// request clock passes the ejection's end, then counted again.
func TestFleetTotalsEjectionEnds(t *testing.T) {
	p := totalsProxy(t)
	setTotalsRing(t, p, totalsRingConfig(), totalsBackends([]int{1, 2, 3}), 1)
	tab := p.tab.Load()
	now := time.Unix(3_000_000, 0)
	st := &reqState{}
	st.reset(tab, now)
	for i, b := range tab.bs {
		b.inflight.Add(int64(10 * (i + 1)))
	}
	if total, n, _ := st.HealthyTotals(); total != 60 || n != 3 {
		t.Fatalf("before the ejection: %d on %d, want 60 on 3", total, n)
	}
	tab.bs[1].ejectedUntil.Store(now.Add(time.Second).UnixNano())
	for _, c := range []struct {
		at       time.Duration
		total, n int64
	}{{0, 40, 2}, {999 * time.Millisecond, 40, 2}, {time.Second, 60, 3}, {2 * time.Second, 60, 3}} {
		st.reset(tab, now.Add(c.at))
		if total, n, _ := st.HealthyTotals(); total != c.total || n != c.n {
			t.Errorf("at +%v: %d on %d, want %d on %d", c.at, total, n, c.total, c.n)
		}
	}
	// A probe success clears the ejection; a failed probe counts it out.
	tab.bs[1].ejectedUntil.Store(0)
	tab.bs[2].probeDown.Store(true)
	if total, n, _ := st.HealthyTotals(); total != 30 || n != 2 {
		t.Errorf("probe down: %d on %d, want 30 on 2", total, n)
	}
}

// TestFleetTotalsConcurrent changes counts, gossip, health and the ring
// from many goroutines while others pick, then checks that the totals
// settle on a walk's figures. Run it with -race.
func TestFleetTotalsConcurrent(t *testing.T) {
	p := totalsProxy(t)
	cfg := totalsRingConfig()
	ids := []int{}
	for i := 0; i < 30; i++ {
		ids = append(ids, i)
	}
	setTotalsRing(t, p, cfg, totalsBackends(ids), 1)
	rounds := 3000
	if testing.Short() {
		rounds = 500
	}
	var wg sync.WaitGroup
	var stop atomic.Bool
	now := time.Now()
	for w := 0; w < 6; w++ {
		wg.Add(1)
		go func(seed uint64) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, 9))
			st := &reqState{}
			for i := 0; i < rounds; i++ {
				tab := p.tab.Load()
				b := tab.bs[rng.IntN(len(tab.bs))]
				switch rng.IntN(10) {
				case 0:
					p.SetRemote(b.id, int64(rng.IntN(20)), EngineQueue{})
				case 1:
					b.probeDown.Store(rng.IntN(2) == 0)
				case 2:
					b.ejectedUntil.Store(now.Add(time.Duration(rng.IntN(3)) * time.Millisecond).UnixNano())
				default:
					b.inflight.Add(1)
					st.reset(tab, now.Add(time.Duration(i)*time.Microsecond))
					if _, err := tab.ring.Pick(rng.Uint64(), st); err != nil && err != ring.ErrNoBackend {
						t.Error(err)
					}
					b.inflight.Add(-1)
				}
			}
		}(uint64(w))
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for gen := 0; !stop.Load() && gen < 50; gen++ {
			next := append([]int(nil), ids...)
			next[gen%len(next)] = 100 + gen
			r, err := ring.New(cfg, totalsBackends(next))
			if err != nil {
				t.Error(err)
				return
			}
			if err := p.SetRing(r, uint64(gen+2)); err != nil {
				t.Error(err)
			}
			time.Sleep(100 * time.Microsecond)
		}
	}()
	wg.Wait()
	stop.Store(true)
	st := &reqState{}
	tab := p.tab.Load()
	st.reset(tab, now.Add(time.Second)) // every ejection over
	total, n, ok := st.HealthyTotals()
	if !ok {
		t.Fatal("no kept totals for the current table")
	}
	if wt, wn := walkTotals(st); total != wt || n != wn {
		t.Fatalf("kept totals %d in flight on %d backends, walk %d on %d", total, n, wt, wn)
	}
}

// TestPickWithFleetTotalsAllocations: with LoadFactor and every backend
// busy, a pick on the proxy's load view, and the count changes around a
// request, allocate nothing once the table's totals are built.
func TestPickWithFleetTotalsAllocations(t *testing.T) {
	p := totalsProxy(t)
	ids := make([]int, 100)
	for i := range ids {
		ids[i] = i
	}
	r := setTotalsRing(t, p, totalsRingConfig(), totalsBackends(ids), 1)
	tab := p.tab.Load()
	for _, b := range tab.bs {
		b.inflight.Add(2)
	}
	st := &reqState{}
	now := time.Now()
	key := uint64(0)
	allocs := testing.AllocsPerRun(1000, func() {
		st.reset(tab, now)
		key += 0x9e3779b97f4a7c15
		d, err := r.Pick(key, st)
		if err != nil {
			t.Fatal(err)
		}
		tab.bs[d.Backend].inflight.Add(1)
		tab.bs[d.Backend].inflight.Add(-1)
	})
	if allocs != 0 {
		t.Errorf("%v allocations per pick", allocs)
	}
}

// BenchmarkPickFleetTotals is Pick on the proxy's load view with
// LoadFactor and every backend busy: the cap reads the table's kept
// totals (totals=kept) or walks the fleet (totals=walk).
func BenchmarkPickFleetTotals(b *testing.B) {
	for _, n := range []int{7, 100, 1000} {
		p := totalsProxy(b)
		ids := make([]int, n)
		for i := range ids {
			ids[i] = i
		}
		r := setTotalsRing(b, p, totalsRingConfig(), totalsBackends(ids), 1)
		tab := p.tab.Load()
		for _, be := range tab.bs {
			be.inflight.Add(2)
		}
		for _, totals := range []string{"walk", "kept"} {
			b.Run(fmt.Sprintf("backends=%d/totals=%s", n, totals), func(b *testing.B) {
				b.ReportAllocs()
				st := &reqState{}
				st.reset(tab, time.Now())
				var loads ring.Loads = st
				if totals == "walk" {
					loads = walkView{st}
				}
				key := uint64(0)
				for b.Loop() {
					key += 0x9e3779b97f4a7c15
					if _, err := r.Pick(key, loads); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// BenchmarkInFlightChange is what a request's count changes cost (one up,
// one down) on a backend whose table keeps no totals, and on one whose
// table keeps them.
func BenchmarkInFlightChange(b *testing.B) {
	for _, totals := range []string{"none", "kept"} {
		b.Run("totals="+totals, func(b *testing.B) {
			p := totalsProxy(b)
			setTotalsRing(b, p, totalsRingConfig(), totalsBackends([]int{1, 2, 3, 4, 5, 6, 7}), 1)
			tab := p.tab.Load()
			if totals == "kept" {
				if tab.totals(time.Now().UnixNano()) == nil {
					b.Fatal("no totals")
				}
			}
			be := tab.bs[3]
			b.ReportAllocs()
			for b.Loop() {
				be.inflight.Add(1)
				be.inflight.Add(-1)
			}
		})
	}
}
