package ring

import (
	"math/rand/v2"
	"testing"
)

// TestAdmits pins the overflow rule's hard part: an affinity or overflow
// decision stands while its backend's in-flight count, its request
// included, is at most the backend's limit (ConcurrencyThreshold x
// weight); every other decision stands whatever the count.
func TestAdmits(t *testing.T) {
	cfg := DefaultConfig()
	cfg.ConcurrencyThreshold = 2
	bs := gpus(2)
	bs[1].Weight = 3 // limit 6
	r := mustRing(t, cfg, bs)
	unset := DefaultConfig()
	unset.ConcurrencyThreshold = 0
	free := mustRing(t, unset, gpus(2))

	for _, tc := range []struct {
		name     string
		r        *Ring
		backend  int
		inflight int64
		limited  bool // what an affinity or overflow decision gets
	}{
		{"idle", r, 0, 1, true},
		{"at the limit", r, 0, 2, true},
		{"one over", r, 0, 3, false},
		{"far over", r, 0, 1 << 40, false},
		{"weight 3, at 6", r, 1, 6, true},
		{"weight 3, at 7", r, 1, 7, false},
		{"no threshold", free, 0, 1 << 40, true},
	} {
		for why := Reason(0); why < NumReasons; why++ {
			want := true
			if why == ReasonAffinity || why == ReasonOverflow {
				want = tc.limited
			}
			d := Decision{Backend: tc.backend, Reason: why, Rank: 0}
			if got := tc.r.Admits(d, tc.inflight); got != want {
				t.Errorf("%s: Admits(%s on backend %d, %d in flight) = %v, want %v", tc.name, why, tc.backend, tc.inflight, got, want)
			}
		}
	}
}

// TestPickAgreesWithAdmits: over random loads and both overflow rules,
// with and without the bounded-loads cap and BusyIsFull, every affinity
// or overflow decision PickCost makes is one Admits admits with its
// request counted, and a backend Admits would refuse one more request is
// never picked by affinity or overflow.
func TestPickAgreesWithAdmits(t *testing.T) {
	const n = 8
	rng := rand.New(rand.NewPCG(11, 12))
	for _, overflow := range []OverflowRule{CostOverflow, ThresholdOverflow} {
		for _, lf := range []float64{0, 1.25} {
			for _, busyIsFull := range []bool{false, true} {
				cfg := DefaultConfig()
				cfg.ConcurrencyThreshold = 3
				cfg.Overflow, cfg.LoadFactor, cfg.BusyIsFull = overflow, lf, busyIsFull
				bs := gpus(n)
				bs[2].Weight = 2
				r := mustRing(t, cfg, bs)
				loads := newLoads(n)
				limited, full := 0, 0
				for k := 0; k < 5000; k++ {
					for b := range n {
						loads.inflight[b] = int64(rng.IntN(int(r.Limit(b)) + 3))
						loads.down[b] = rng.IntN(10) == 0
						loads.busy[b] = rng.IntN(5) == 0
					}
					key := rng.Uint64()
					d, err := r.PickCost(key, 1+int64(rng.IntN(4)), loads)
					if err != nil || (d.Reason != ReasonAffinity && d.Reason != ReasonOverflow) {
						continue
					}
					limited++
					if !r.Admits(d, loads.InFlight(d.Backend)+1) {
						t.Fatalf("%v/%v/%v round %d: picked %+v with %d in flight (limit %d), which Admits refuses",
							overflow, lf, busyIsFull, k, d, loads.InFlight(d.Backend), r.Limit(d.Backend))
					}
					// Full: one more request would be one over.
					loads.inflight[d.Backend] = r.Limit(d.Backend)
					if r.Admits(d, loads.InFlight(d.Backend)+1) {
						t.Fatalf("Admits takes a request past the limit %d", r.Limit(d.Backend))
					}
					e, err := r.PickCost(key, 1, loads)
					if err == nil && e.Backend == d.Backend && (e.Reason == ReasonAffinity || e.Reason == ReasonOverflow) {
						t.Fatalf("%v/%v/%v round %d: a full backend picked again: %+v", overflow, lf, busyIsFull, k, e)
					}
					full++
				}
				if limited < 1000 || full < 1000 {
					t.Fatalf("%v/%v/%v: %d affinity or overflow picks, %d checked full: too few for the check", overflow, lf, busyIsFull, limited, full)
				}
			}
		}
	}
}
