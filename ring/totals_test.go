package ring

import (
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
)

// keptLoads is a Loads whose fleet totals a Tally keeps: the way the proxy
// serves LoadTotals, with counts and health that change under it from many
// goroutines. Every setter updates the Tally after its change.
type keptLoads struct {
	inflight []atomic.Int64
	down     []atomic.Bool
	busy     []atomic.Bool
	tally    *Tally
	// off makes HealthyTotals answer !ok.
	off bool
}

func newKeptLoads(n int) *keptLoads {
	k := &keptLoads{
		inflight: make([]atomic.Int64, n),
		down:     make([]atomic.Bool, n),
		busy:     make([]atomic.Bool, n),
		tally:    NewTally(n),
	}
	for b := 0; b < n; b++ {
		k.tally.Update(b, k)
	}
	return k
}

func (k *keptLoads) InFlight(b int) int64 { return k.inflight[b].Load() }
func (k *keptLoads) Healthy(b int) bool   { return !k.down[b].Load() }
func (k *keptLoads) Busy(b int) bool      { return k.busy[b].Load() }

func (k *keptLoads) HealthyTotals() (int64, int64, bool) {
	if k.off {
		return 0, 0, false
	}
	total, n := k.tally.Totals()
	return total, n, true
}

func (k *keptLoads) add(b int, d int64) {
	k.inflight[b].Add(d)
	k.tally.Update(b, k)
}

func (k *keptLoads) set(b int, v int64) {
	k.inflight[b].Store(v)
	k.tally.Update(b, k)
}

func (k *keptLoads) setDown(b int, down bool) {
	k.down[b].Store(down)
	k.tally.Update(b, k)
}

var (
	_ Loads      = (*keptLoads)(nil)
	_ LoadTotals = (*keptLoads)(nil)
)

// walkedLoads hides keptLoads' LoadTotals, so Pick walks the fleet.
type walkedLoads struct{ k *keptLoads }

func (w walkedLoads) InFlight(b int) int64 { return w.k.InFlight(b) }
func (w walkedLoads) Healthy(b int) bool   { return w.k.Healthy(b) }
func (w walkedLoads) Busy(b int) bool      { return w.k.Busy(b) }

// TestLoadTotalsSameDecisions checks that Pick decides exactly as it does
// when it walks the fleet to sum the in-flight counts, when the totals come
// from a Tally: over random fleets (sizes, states, zones, weights), both
// overflow rules, load factors, recompute costs, and loads that change
// between picks.
func TestLoadTotalsSameDecisions(t *testing.T) {
	rng := rand.New(rand.NewPCG(41, 43))
	rounds := 150
	if testing.Short() {
		rounds = 30
	}
	overflowed, picks := 0, 0
	for round := 0; round < rounds; round++ {
		n := 1 + rng.IntN(60)
		bs := gpus(n)
		for i := range bs {
			bs[i].Zone = []string{"a", "b", "c"}[rng.IntN(3)]
			bs[i].Weight = rng.IntN(3)
			if rng.IntN(5) == 0 {
				bs[i].State = State(1 + rng.IntN(2))
			}
		}
		cfg := DefaultConfig()
		cfg.ReplicationFactor = 20
		cfg.LoadFactor = []float64{1, 1.1, 1.25, 2, 5}[rng.IntN(5)]
		cfg.Overflow = []OverflowRule{ThresholdOverflow, CostOverflow}[rng.IntN(2)]
		cfg.BusyIsFull = rng.IntN(2) == 0
		cfg.ConcurrencyThreshold = 1 + rng.IntN(12)
		cfg.OverflowDepth = 1 + rng.IntN(8)
		if rng.IntN(2) == 0 {
			cfg.ZoneAware, cfg.LocalZone = true, "a"
		}
		r := mustRing(t, cfg, bs)
		k := newKeptLoads(n)
		for step := 0; step < 40; step++ {
			for c := rng.IntN(4); c >= 0; c-- {
				b := rng.IntN(n)
				switch rng.IntN(4) {
				case 0:
					k.setDown(b, rng.IntN(4) == 0)
				case 1:
					k.busy[b].Store(rng.IntN(3) == 0)
				default:
					k.set(b, int64(rng.IntN(2*cfg.ConcurrencyThreshold+2)))
				}
			}
			for q := 0; q < 10; q++ {
				key := rng.Uint64()
				recompute := int64(1 + rng.IntN(4))
				want, werr := r.PickCost(key, recompute, walkedLoads{k})
				got, gerr := r.PickCost(key, recompute, k)
				picks++
				if want.Reason == ReasonOverflow {
					overflowed++
				}
				if got != want || (gerr == nil) != (werr == nil) {
					t.Fatalf("round %d step %d key %x: with totals %+v (%v), walking %+v (%v)", round, step, key, got, gerr, want, werr)
				}
			}
		}
	}
	t.Logf("%d picks, %d overflowed", picks, overflowed)
	if overflowed == 0 {
		t.Error("no pick overflowed: the cases do not exercise the cap")
	}
}

// TestLoadTotalsFallsBack checks that Pick walks when the totals are not
// available, and when most backends are not Active.
func TestLoadTotalsFallsBack(t *testing.T) {
	cfg := DefaultConfig()
	cfg.LoadFactor = 1.25
	cfg.Overflow = ThresholdOverflow
	bs := gpus(8)
	for i := 0; i < 5; i++ {
		bs[i].State = Draining
	}
	r := mustRing(t, cfg, bs)
	k := newKeptLoads(8)
	for b := 0; b < 8; b++ {
		k.set(b, int64(b))
	}
	for key := uint64(0); key < 2000; key++ {
		want, _ := r.Pick(key, walkedLoads{k})
		if got, _ := r.Pick(key, k); got != want {
			t.Fatalf("key %d: %+v with totals, %+v walking", key, got, want)
		}
		k.off = true
		if got, _ := r.Pick(key, k); got != want {
			t.Fatalf("key %d: %+v with totals off, %+v walking", key, got, want)
		}
		k.off = false
	}
}

// TestTallyConcurrent changes counts and health from many goroutines at
// once, each change followed by its Update, and checks that the Tally ends
// equal to a walk over the fleet. Run it with -race.
func TestTallyConcurrent(t *testing.T) {
	const n, workers = 64, 8
	rounds := 20000
	if testing.Short() {
		rounds = 2000
	}
	for trial := 0; trial < 5; trial++ {
		k := newKeptLoads(n)
		var wg sync.WaitGroup
		for w := 0; w < workers; w++ {
			wg.Add(1)
			go func(seed uint64) {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(seed, 7))
				for i := 0; i < rounds; i++ {
					b := rng.IntN(8) // few backends: many races on each
					switch rng.IntN(8) {
					case 0:
						k.setDown(b, !k.down[b].Load())
					case 1:
						k.set(b, int64(rng.IntN(100)))
					default:
						k.add(b, 1)
						k.add(b, -1+int64(rng.IntN(2)))
					}
				}
			}(uint64(trial*workers + w))
		}
		wg.Wait()
		var total, healthy int64
		for b := 0; b < n; b++ {
			if k.Healthy(b) {
				total += k.InFlight(b)
				healthy++
			}
		}
		gt, gh := k.tally.Totals()
		if gt != total || gh != healthy {
			t.Fatalf("trial %d: tally says %d in flight on %d healthy, the fleet %d on %d", trial, gt, gh, total, healthy)
		}
	}
}

// TestPickWithTotalsAllocations: the O(1) cap allocates nothing.
func TestPickWithTotalsAllocations(t *testing.T) {
	cfg := DefaultConfig()
	cfg.LoadFactor = 1.25
	for _, rule := range []OverflowRule{ThresholdOverflow, CostOverflow} {
		cfg.Overflow = rule
		r := mustRing(t, cfg, gpus(100))
		k := newKeptLoads(100)
		for b := 0; b < 100; b++ {
			k.set(b, 2)
		}
		key := uint64(0)
		allocs := testing.AllocsPerRun(1000, func() {
			key += 0x9e3779b97f4a7c15
			if _, err := r.Pick(key, k); err != nil {
				t.Fatal(err)
			}
			k.add(int(key%100), 1)
			k.add(int(key%100), -1)
		})
		if allocs != 0 {
			t.Errorf("%v: %v allocations per pick with kept totals", rule, allocs)
		}
	}
}
