package ring

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// fakeLoads is a Loads over plain slices.
type fakeLoads struct {
	inflight []int64
	down     []bool
	busy     []bool
}

func newLoads(n int) *fakeLoads {
	return &fakeLoads{inflight: make([]int64, n), down: make([]bool, n), busy: make([]bool, n)}
}

func (f *fakeLoads) InFlight(b int) int64 { return f.inflight[b] }
func (f *fakeLoads) Healthy(b int) bool   { return !f.down[b] }
func (f *fakeLoads) Busy(b int) bool      { return f.busy[b] }

var _ Loads = (*fakeLoads)(nil)

func gpus(n int) []Backend {
	bs := make([]Backend, n)
	for i := range bs {
		bs[i] = Backend{ID: fmt.Sprintf("gpu-%d", i+1), Addr: fmt.Sprintf("10.0.0.%d:8000", i+1)}
	}
	return bs
}

func mustRing(t testing.TB, cfg Config, bs []Backend) *Ring {
	t.Helper()
	r, err := New(cfg, bs)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// ownersByID is the owner ID of every partition.
func ownersByID(r *Ring) []string {
	out := make([]string, r.Partitions())
	for p := range out {
		out[p] = r.Backend(int(r.Order(p)[0])).ID
	}
	return out
}

func TestOwnersIndependentOfInsertionOrder(t *testing.T) {
	// gpu-1 .. gpu-12 collide inside buraksezer/consistent unless member
	// names are made unambiguous.
	bs := gpus(12)
	want := ownersByID(mustRing(t, DefaultConfig(), bs))
	wantOrders := mustRing(t, DefaultConfig(), bs).order
	rng := rand.New(rand.NewPCG(1, 2))
	for trial := 0; trial < 50; trial++ {
		shuffled := append([]Backend(nil), bs...)
		rng.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
		r := mustRing(t, DefaultConfig(), shuffled)
		got := ownersByID(r)
		for p := range want {
			if got[p] != want[p] {
				t.Fatalf("trial %d: partition %d owned by %s, want %s", trial, p, got[p], want[p])
			}
		}
		for i := range wantOrders {
			if r.order[i] != wantOrders[i] {
				t.Fatalf("trial %d: overflow order differs at %d", trial, i)
			}
		}
	}
	// Every backend owns partitions, and none more than the bound.
	counts := map[string]int{}
	for _, o := range want {
		counts[o]++
	}
	if len(counts) != 12 {
		t.Fatalf("%d backends own partitions, want 12", len(counts))
	}
	maxLoad := int(math.Ceil(float64(7919/12) * DefaultConfig().PartitionLoad))
	for id, c := range counts {
		if c > maxLoad {
			t.Errorf("%s owns %d partitions, above the bound %d", id, c, maxLoad)
		}
	}
}

func TestAddBackendMovesAboutOneNth(t *testing.T) {
	for _, n := range []int{3, 7, 12, 30} {
		bs := gpus(n + 1)
		before := mustRing(t, DefaultConfig(), bs[:n])
		after := mustRing(t, DefaultConfig(), bs)
		rng := rand.New(rand.NewPCG(uint64(n), 7))
		const keys = 100000
		moved := 0
		for k := 0; k < keys; k++ {
			key := rng.Uint64()
			if before.Backend(before.Owner(key)).ID != after.Backend(after.Owner(key)).ID {
				moved++
			}
		}
		frac := float64(moved) / keys
		ideal := 1 / float64(n+1)
		t.Logf("n=%d: adding one moved %.4f of keys (ideal %.4f)", n, frac, ideal)
		if frac < ideal*0.8 || frac > ideal*1.2 {
			t.Errorf("n=%d: moved %.4f, want within 20%% of %.4f", n, frac, ideal)
		}
		// Removing it again restores the previous owners exactly.
		restored := mustRing(t, DefaultConfig(), bs[:n])
		a, b := ownersByID(before), ownersByID(restored)
		for p := range a {
			if a[p] != b[p] {
				t.Fatalf("n=%d: partition %d not restored", n, p)
			}
		}
	}
}

func TestOverflowSpreads(t *testing.T) {
	r := mustRing(t, DefaultConfig(), gpus(7))
	hot := 0 // every key owned by backend 0 overflows when 0 is full
	loads := newLoads(7)
	loads.inflight[hot] = 1000
	spread := map[int]int{}
	rng := rand.New(rand.NewPCG(3, 4))
	for k := 0; k < 20000; k++ {
		key := rng.Uint64()
		if r.Owner(key) != hot {
			continue
		}
		d, err := r.Pick(key, loads)
		if err != nil {
			t.Fatal(err)
		}
		if d.Reason != ReasonOverflow || d.Rank != 1 {
			t.Fatalf("decision %+v, want overflow rank 1", d)
		}
		spread[d.Backend]++
	}
	t.Logf("overflow of one hot owner: %v", spread)
	if len(spread) < 3 {
		t.Fatalf("overflow of a hot owner went to %d instances, want >= 3", len(spread))
	}
	for b, c := range spread {
		if b == hot {
			t.Fatal("overflow went to the full owner")
		}
		_ = c
	}
}

func TestPickPrefixAware(t *testing.T) {
	cfg := DefaultConfig()
	cfg.ConcurrencyThreshold = 2
	cfg.Overflow, cfg.BusyIsFull = ThresholdOverflow, true
	r := mustRing(t, cfg, gpus(5))
	loads := newLoads(5)
	key := uint64(12345)
	order := r.Order(r.Partition(key))

	d, err := r.Pick(key, loads)
	if err != nil || d.Backend != int(order[0]) || d.Reason != ReasonAffinity || d.Rank != 0 {
		t.Fatalf("idle pick = %+v, %v; want affinity to %d", d, err, order[0])
	}
	// Below the threshold: still the owner.
	loads.inflight[order[0]] = 1
	if d, _ = r.Pick(key, loads); d.Backend != int(order[0]) {
		t.Fatalf("owner under threshold not picked: %+v", d)
	}
	// At the threshold: overflow to rank 1.
	loads.inflight[order[0]] = 2
	if d, _ = r.Pick(key, loads); d.Backend != int(order[1]) || d.Reason != ReasonOverflow || d.Rank != 1 {
		t.Fatalf("owner at threshold: %+v, want overflow to %d", d, order[1])
	}
	// Rank 1 full too: rank 2.
	loads.inflight[order[1]] = 2
	if d, _ = r.Pick(key, loads); d.Backend != int(order[2]) || d.Rank != 2 {
		t.Fatalf("ranks 0-1 full: %+v, want %d", d, order[2])
	}
	// Unhealthy owner is skipped even when idle.
	loads.inflight[order[0]], loads.inflight[order[1]] = 0, 0
	loads.down[order[0]] = true
	if d, _ = r.Pick(key, loads); d.Backend != int(order[1]) || d.Reason != ReasonOverflow {
		t.Fatalf("down owner: %+v", d)
	}
	loads.down[order[0]] = false
	// Busy owner (engine queueing) overflows with BusyIsFull.
	loads.busy[order[0]] = true
	if d, _ = r.Pick(key, loads); d.Backend != int(order[1]) {
		t.Fatalf("busy owner: %+v", d)
	}
	loads.busy[order[0]] = false
	// Everything full: fallback to the least loaded.
	for i := range loads.inflight {
		loads.inflight[i] = 5
	}
	loads.inflight[order[3]] = 3
	if d, _ = r.Pick(key, loads); d.Backend != int(order[3]) || d.Reason != ReasonFallback {
		t.Fatalf("all full: %+v, want fallback to %d", d, order[3])
	}
	// Everything down: ErrNoBackend, no panic.
	for i := range loads.down {
		loads.down[i] = true
	}
	if _, err := r.Pick(key, loads); !errors.Is(err, ErrNoBackend) {
		t.Fatalf("all down: err = %v", err)
	}
}

func TestPickLoadFactor(t *testing.T) {
	cfg := DefaultConfig()
	cfg.ConcurrencyThreshold = 100
	cfg.LoadFactor = 1.25
	r := mustRing(t, cfg, gpus(4))
	loads := newLoads(4)
	key := uint64(99)
	order := r.Order(r.Partition(key))
	// Fleet total 8, owner has 5: avg with this request = 9/4, bound ceil(1.25*2.25)=3.
	loads.inflight[order[0]] = 5
	loads.inflight[order[1]] = 3
	if d, _ := r.Pick(key, loads); d.Backend != int(order[2]) || d.Reason != ReasonOverflow {
		t.Fatalf("load factor: %+v, want overflow to %d", d, order[2])
	}
}

func TestDrainingAndDownKeepPlacement(t *testing.T) {
	bs := gpus(6)
	r := mustRing(t, DefaultConfig(), bs)
	bs[2].State = Draining
	bs[4].State = Down
	r2 := mustRing(t, DefaultConfig(), bs)
	a, b := ownersByID(r), ownersByID(r2)
	for p := range a {
		if a[p] != b[p] {
			t.Fatal("a state change moved partitions")
		}
	}
	loads := newLoads(6)
	rng := rand.New(rand.NewPCG(5, 6))
	for k := 0; k < 5000; k++ {
		d, err := r2.Pick(rng.Uint64(), loads)
		if err != nil {
			t.Fatal(err)
		}
		if id := r2.Backend(d.Backend).ID; id == "gpu-3" || id == "gpu-5" {
			t.Fatalf("picked %s in state %s", id, r2.Backend(d.Backend).State)
		}
	}
}

func TestLoadBlindStrategies(t *testing.T) {
	for _, s := range []Strategy{Random, RoundRobin, LeastOutstanding, ConsistentHash} {
		cfg := DefaultConfig()
		cfg.Strategy = s
		r := mustRing(t, cfg, gpus(4))
		loads := newLoads(4)
		loads.down[1] = true
		counts := make([]int, 4)
		for k := 0; k < 4000; k++ {
			d, err := r.Pick(uint64(k)*2654435761, loads)
			if err != nil {
				t.Fatal(err)
			}
			counts[d.Backend]++
			if s == LeastOutstanding {
				loads.inflight[d.Backend]++
			}
		}
		if counts[1] != 0 {
			t.Errorf("%s picked an unhealthy backend", s)
		}
		for _, b := range []int{0, 2, 3} {
			if counts[b] < 800 {
				t.Errorf("%s: backend %d got %d of 4000: %v", s, b, counts[b], counts)
			}
		}
	}
	// CONSISTENT_HASH ignores load: the owner even when swamped.
	cfg := DefaultConfig()
	cfg.Strategy = ConsistentHash
	r := mustRing(t, cfg, gpus(4))
	loads := newLoads(4)
	key := uint64(777)
	loads.inflight[r.Owner(key)] = 1 << 20
	if d, _ := r.Pick(key, loads); d.Backend != r.Owner(key) || d.Reason != ReasonConsistentHash {
		t.Fatalf("consistent hash left a loaded owner: %+v", d)
	}
	// ROUND_ROBIN cycles in order.
	cfg.Strategy = RoundRobin
	r = mustRing(t, cfg, gpus(3))
	loads = newLoads(3)
	for k := 0; k < 6; k++ {
		if d, _ := r.Pick(0, loads); d.Backend != k%3 {
			t.Fatalf("round robin step %d picked %d", k, d.Backend)
		}
	}
}

func TestNewErrors(t *testing.T) {
	cfg := DefaultConfig()
	if _, err := New(cfg, []Backend{{ID: "a"}, {ID: "a"}}); !errors.Is(err, ErrConfig) {
		t.Errorf("duplicate IDs: %v", err)
	}
	if _, err := New(cfg, []Backend{{ID: ""}}); !errors.Is(err, ErrConfig) {
		t.Errorf("empty ID: %v", err)
	}
	cfg.PartitionCount = 3
	if _, err := New(cfg, gpus(5)); !errors.Is(err, ErrConfig) {
		t.Errorf("too few partitions: %v", err)
	}
	for _, mut := range []func(*Config){
		func(c *Config) { c.PrefixLength = 10 },
		func(c *Config) { c.ConcurrencyThreshold = -1 },
		func(c *Config) { c.LoadFactor = 0.5 },
		func(c *Config) { c.PartitionLoad = 1 },
		func(c *Config) { c.Hash = nil },
	} {
		c := DefaultConfig()
		mut(&c)
		if _, err := New(c, gpus(2)); !errors.Is(err, ErrConfig) {
			t.Errorf("bad config accepted: %v", err)
		}
	}
	r, err := New(DefaultConfig(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Pick(1, newLoads(0)); !errors.Is(err, ErrNoBackend) {
		t.Errorf("empty ring: %v", err)
	}
}

func TestParseStrategy(t *testing.T) {
	for in, want := range map[string]Strategy{
		"PREFIX_AWARE": PrefixAware, "prefix-aware": PrefixAware, "RANDOM": Random,
		"least_outstanding_requests": LeastOutstanding, "LOR": LeastOutstanding,
		"ROUND_ROBIN": RoundRobin, "consistent_hash": ConsistentHash,
	} {
		got, err := ParseStrategy(in)
		if err != nil || got != want {
			t.Errorf("ParseStrategy(%q) = %v, %v", in, got, err)
		}
	}
	if _, err := ParseStrategy("FASTEST"); err == nil {
		t.Error("unknown strategy accepted")
	}
}

func TestPickAllocations(t *testing.T) {
	r := mustRing(t, DefaultConfig(), gpus(7))
	loads := newLoads(7)
	allocs := testing.AllocsPerRun(500, func() {
		if _, err := r.Pick(0xdeadbeef, loads); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Fatalf("Pick allocates %.1f times, want 0", allocs)
	}
}

func TestExplain(t *testing.T) {
	r := mustRing(t, DefaultConfig(), gpus(3))
	loads := newLoads(3)
	e := r.Explain(42, loads)
	if e.Reason != "affinity" || e.Backend != e.Candidates[0].ID || len(e.Candidates) != 3 || e.Strategy != "PREFIX_AWARE" {
		t.Fatalf("explanation %+v", e)
	}
}

// ExplainCost shows the recompute cost it weighed (at least 1) and, with a
// Loads that knows the queues, each candidate's queue.
func TestExplainCostShowsItsInputs(t *testing.T) {
	r := mustRing(t, DefaultConfig(), gpus(3))
	plain := r.ExplainCost(42, 0, newLoads(3))
	if plain.Recompute != 1 {
		t.Errorf("recompute %d for 0, want 1", plain.Recompute)
	}
	for _, c := range plain.Candidates {
		if c.Queued != 0 {
			t.Errorf("queue %d shown without Queues: %+v", c.Queued, c)
		}
	}
	q := queueLoads{fakeLoads: newLoads(3), queued: []int64{4, 0, 2}}
	e := r.ExplainCost(42, 5, q)
	if e.Recompute != 5 {
		t.Errorf("recompute %d, want 5", e.Recompute)
	}
	for _, c := range e.Candidates {
		i := -1
		for b, rb := range r.Backends() {
			if rb.ID == c.ID {
				i = b
			}
		}
		if i < 0 {
			t.Fatalf("candidate %s is not a backend of the ring", c.ID)
		}
		if c.Queued != q.queued[i] {
			t.Errorf("candidate %s: queued %d, want %d", c.ID, c.Queued, q.queued[i])
		}
	}
}

func TestZoneAwareOverflow(t *testing.T) {
	bs := gpus(8)
	for i := range bs {
		bs[i].Zone = []string{"a", "b"}[i%2]
	}
	cfg := DefaultConfig()
	cfg.ConcurrencyThreshold = 1
	cfg.ZoneAware, cfg.LocalZone = true, "a"
	r := mustRing(t, cfg, bs)
	plain := DefaultConfig()
	plain.ConcurrencyThreshold = 1
	rp := mustRing(t, plain, bs)
	loads := newLoads(8)
	rng := rand.New(rand.NewPCG(9, 9))
	crossZone := 0
	for k := 0; k < 2000; k++ {
		key := rng.Uint64()
		owner := r.Owner(key)
		if r.Owner(key) != rp.Owner(key) {
			t.Fatal("zone awareness changed an owner")
		}
		// The owner is taken whatever its zone.
		if d, _ := r.Pick(key, loads); d.Backend != owner || d.Reason != ReasonAffinity {
			t.Fatalf("idle owner not picked: %+v", d)
		}
		loads.inflight[owner] = 1
		d, err := r.Pick(key, loads)
		if err != nil || d.Reason != ReasonOverflow {
			t.Fatalf("full owner: %+v %v", d, err)
		}
		if r.Backend(d.Backend).Zone != "a" {
			t.Fatalf("overflow to zone %s while zone a had room", r.Backend(d.Backend).Zone)
		}
		if dp, _ := rp.Pick(key, loads); r.Backend(dp.Backend).Zone != "a" {
			crossZone++
		}
		loads.inflight[owner] = 0
	}
	if crossZone == 0 {
		t.Fatal("without zone awareness overflow never left zone a: the test shows nothing")
	}
	// Zone a full: overflow goes to zone b rather than falling back.
	for i := range bs {
		if bs[i].Zone == "a" {
			loads.inflight[r.mustIndex(t, bs[i].ID)] = 1
		}
	}
	key := rng.Uint64()
	for r.Backend(r.Owner(key)).Zone != "a" {
		key = rng.Uint64()
	}
	d, _ := r.Pick(key, loads)
	if d.Reason != ReasonOverflow || r.Backend(d.Backend).Zone != "b" {
		t.Fatalf("zone a full: %+v in zone %s", d, r.Backend(d.Backend).Zone)
	}
}

func (r *Ring) mustIndex(t *testing.T, id string) int {
	t.Helper()
	i, ok := r.Index(id)
	if !ok {
		t.Fatalf("no backend %s", id)
	}
	return i
}

// countingLoads counts InFlight calls.
type countingLoads struct {
	*fakeLoads
	calls int
}

func (c *countingLoads) InFlight(b int) int64 { c.calls++; return c.fakeLoads.InFlight(b) }

// With LoadFactor, an idle owner is taken without summing the fleet's
// in-flight (the cap is never below 1); a busy one still gets the cap.
func TestLoadFactorIdleOwnerSkipsFleetSum(t *testing.T) {
	cfg := DefaultConfig()
	cfg.LoadFactor = 1.25
	r := mustRing(t, cfg, gpus(1000))
	loads := &countingLoads{fakeLoads: newLoads(1000)}
	d, err := r.Pick(7, loads)
	if err != nil || d.Reason != ReasonAffinity {
		t.Fatalf("%+v %v", d, err)
	}
	if loads.calls != 1 {
		t.Fatalf("%d InFlight calls for an idle owner, want 1", loads.calls)
	}
	loads.inflight[d.Backend] = 1
	loads.calls = 0
	if _, err := r.Pick(7, loads); err != nil {
		t.Fatal(err)
	}
	if loads.calls < 1000 {
		t.Fatalf("%d InFlight calls for a busy owner: the cap was not computed", loads.calls)
	}
}

// Over random loads, PREFIX_AWARE with LoadFactor picks the first backend
// in the partition's order that is eligible, under its limit, not busy
// and within ceil(LoadFactor x (total+1) / eligible), computed here the
// plain way.
func TestLoadFactorPickMatchesDefinition(t *testing.T) {
	cfg := DefaultConfig()
	cfg.LoadFactor = 1.25
	cfg.ConcurrencyThreshold = 6
	cfg.Overflow, cfg.BusyIsFull = ThresholdOverflow, true
	const n = 12
	r := mustRing(t, cfg, gpus(n))
	rng := rand.New(rand.NewPCG(3, 4))
	loads := newLoads(n)
	for k := 0; k < 20000; k++ {
		for b := 0; b < n; b++ {
			loads.inflight[b] = int64(rng.IntN(8))
			if rng.IntN(3) == 0 {
				loads.inflight[b] = 0
			}
			loads.down[b] = rng.IntN(10) == 0
			loads.busy[b] = rng.IntN(10) == 0
		}
		var total, eligible int64
		for b := 0; b < n; b++ {
			if !loads.down[b] {
				total += loads.inflight[b]
				eligible++
			}
		}
		bound := int64(math.MaxInt64)
		if eligible > 0 {
			bound = int64(math.Ceil(1.25 * float64(total+1) / float64(eligible)))
		}
		key := rng.Uint64()
		want := -1
		for _, b32 := range r.Order(r.Partition(key)) {
			b := int(b32)
			if loads.down[b] || loads.inflight[b] >= r.Limit(b) || loads.busy[b] || loads.inflight[b]+1 > bound {
				continue
			}
			want = b
			break
		}
		d, err := r.Pick(key, loads)
		if want < 0 {
			if err == nil && d.Reason != ReasonFallback {
				t.Fatalf("round %d: no candidate qualifies, got %+v", k, d)
			}
			continue
		}
		if err != nil || d.Backend != want {
			t.Fatalf("round %d: got %+v %v, want backend %d", k, d, err, want)
		}
	}
}

// TestThresholdNotSet: ConcurrencyThreshold 0 means not set: no hard cap
// (Limit is NoLimit), so PREFIX_AWARE keeps a key on its owner however
// many requests it has in flight, unless the engine queues.
func TestThresholdNotSet(t *testing.T) {
	cfg := DefaultConfig()
	cfg.ConcurrencyThreshold = 0
	r, err := New(cfg, gpus(3))
	if err != nil {
		t.Fatal(err)
	}
	for i := range r.Backends() {
		if r.Limit(i) != NoLimit {
			t.Fatalf("backend %d: limit %d, want NoLimit", i, r.Limit(i))
		}
	}
	loads := newLoads(3)
	owner := int(r.Order(r.Partition(42))[0])
	loads.inflight[owner] = 1 << 20
	d, err := r.Pick(42, loads)
	if err != nil || d.Backend != owner || d.Reason != ReasonAffinity {
		t.Fatalf("owner with 2^20 in flight and no threshold: %+v, %v", d, err)
	}
}
