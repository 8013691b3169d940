package node

import (
	"slices"
	"testing"
	"time"

	"github.com/warmroute/warmroute/gossip"
	"github.com/warmroute/warmroute/proxy"
	"github.com/warmroute/warmroute/ring"
)

// planFixture is a ring of 4 backends, their status, and which of them
// are pressed.
type planFixture struct {
	r       *ring.Ring
	status  []proxy.BackendStatus
	pressed map[string]bool
}

func newPlanFixture(t *testing.T) *planFixture {
	r := balanceRing(t, 4)
	f := &planFixture{r: r, pressed: map[string]bool{}}
	for _, b := range r.Backends() {
		f.status = append(f.status, proxy.BackendStatus{ID: b.ID, State: "active", Limit: 16, Capacity: 8})
	}
	return f
}

func (f *planFixture) input(cur []ring.Split, reports ...gossip.HotReport) splitInput {
	return splitInput{ring: f.r, cur: cur, reports: reports, status: f.status,
		pressed: func(id string) bool { return f.pressed[id] }}
}

// owner returns the id of the owner of key's partition.
func (f *planFixture) owner(key uint64) string {
	return f.r.Backend(int(f.r.Order(f.r.Partition(key))[0])).ID
}

// own is the leader's own report of one prefix with share of 1,000
// requests.
func (f *planFixture) own(key uint64, depth int, count uint64) gossip.HotReport {
	return gossip.HotReport{Total: 1000 * proxy.HotUnit, Partitions: uint64(f.r.Partitions()),
		Prefixes: []gossip.HotPrefix{{Key: key, Depth: uint32(depth), Count: count * proxy.HotUnit, Part: uint32(f.r.Partition(key))}}}
}

// TestPlanSplitsNeedsPressure: a prefix with every request is split only
// while the owner of the partition its requests route on is pressed.
func TestPlanSplitsNeedsPressure(t *testing.T) {
	f := newPlanFixture(t)
	p := newSplitPlanner()
	now := time.Unix(1000, 0)
	const key = 0xabcdef
	rep := f.own(key, 0, 1000)
	if got := p.plan(f.input(nil, rep), now); len(got) != 0 || p.refused["not_pressed"] != 1 {
		t.Fatalf("split %v with no backend pressed (refused %v)", got, p.refused)
	}
	for _, b := range f.r.Backends() {
		if b.ID != f.owner(key) {
			f.pressed[b.ID] = true
		}
	}
	if got := p.plan(f.input(nil, rep), now); len(got) != 0 {
		t.Fatalf("split %v with every backend but its owner pressed", got)
	}
	f.pressed[f.owner(key)] = true
	if got := p.plan(f.input(nil, rep), now); !slices.Equal(got, []ring.Split{{Key: key}}) {
		t.Fatalf("owner pressed: splits %v, want the prefix", got)
	}
	// A small prefix (under a fair share of 1/4) stays whole even then.
	p = newSplitPlanner()
	if got := p.plan(f.input(nil, f.own(key, 0, 200)), now); len(got) != 0 {
		t.Fatalf("a 20%% prefix split on 4 backends: %v", got)
	}
	// As does one with three requests in all.
	small := f.own(key, 0, 3)
	small.Total = 3 * proxy.HotUnit
	if got := p.plan(f.input(nil, small), now); len(got) != 0 {
		t.Fatalf("three requests split %v", got)
	}
}

// splitOne plans, at t0, the split of prefix splitKey (every request of the
// leader's) with its owner pressed, and returns the fixture, the planner,
// the report and the splits.
func splitOne(t *testing.T, t0 time.Time) (*planFixture, *splitPlanner, gossip.HotReport, []ring.Split) {
	t.Helper()
	f := newPlanFixture(t)
	p := newSplitPlanner()
	rep := f.own(splitKey, 0, 1000)
	f.pressed[f.owner(splitKey)] = true
	cur := p.plan(f.input(nil, rep), t0)
	if len(cur) != 1 {
		t.Fatalf("splits %v", cur)
	}
	return f, p, rep, cur
}

// splitKey is the prefix splitOne splits.
const splitKey = 0x5eed

// TestPlanSplitsEndsWithPressure: a split lasts at least splitMinLife, then
// ends once its demand has fit the backend it returns to for splitCalm,
// and is not split again within splitCooldown.
func TestPlanSplitsEndsWithPressure(t *testing.T) {
	t0 := time.Unix(1000, 0)
	const key = splitKey
	f, p, rep, cur := splitOne(t, t0)
	// Demand: all of the fleet's 40 requests in flight; the home backend
	// runs 8 at once: it does not fit, whatever the pressure says.
	for i := range f.status {
		f.status[i].InFlight = 10
	}
	clear(f.pressed)
	for s := time.Duration(0); s <= splitMinLife+2*splitCalm; s += time.Second {
		if got := p.plan(f.input(cur, rep), t0.Add(s)); !slices.Equal(got, cur) {
			t.Fatalf("after %v: %v; a prefix with 40 in flight fits no backend running 8", s, got)
		}
	}
	// The load falls to 2 in flight in all: the demand fits, so the split
	// ends splitCalm later.
	for i := range f.status {
		f.status[i].InFlight = 0
	}
	f.status[0].InFlight = 2
	t1 := t0.Add(splitMinLife + 3*splitCalm)
	if got := p.plan(f.input(cur, rep), t1); !slices.Equal(got, cur) {
		t.Fatalf("ended at once: %v", got)
	}
	if got := p.plan(f.input(cur, rep), t1.Add(splitCalm/2)); !slices.Equal(got, cur) {
		t.Fatalf("ended before splitCalm: %v", got)
	}
	if got := p.plan(f.input(cur, rep), t1.Add(splitCalm)); len(got) != 0 {
		t.Fatalf("still split %v after splitCalm of calm", got)
	}
	// Pressed again at once: not split again within the cooldown.
	f.pressed[f.owner(key)] = true
	if got := p.plan(f.input(nil, rep), t1.Add(splitCalm+time.Second)); len(got) != 0 {
		t.Fatalf("split again within the cooldown: %v", got)
	}
	if got := p.plan(f.input(nil, rep), t1.Add(splitCalm+splitCooldown)); len(got) != 1 {
		t.Fatalf("not split again after the cooldown: %v", got)
	}
	// A split nobody counts any more goes home after splitMinLife, under
	// pressure or not.
	cur = []ring.Split{{Key: 77}}
	p = newSplitPlanner()
	if got := p.plan(f.input(cur, rep), t0); !slices.Contains(got, cur[0]) {
		t.Fatalf("a cold split ended before splitMinLife: %v", got)
	}
	if got := p.plan(f.input(cur, rep), t0.Add(splitMinLife)); slices.Contains(got, cur[0]) {
		t.Fatalf("a cold split kept: %v", got)
	}
}

// TestPlanSplitsBoundsOtherRouters: another router's claims count only for
// the partitions its own published request counts carry, and start at
// most splitNewPerRouter splits per commit; the leader's own traffic
// counts whole. A router claiming 64 random prefixes with every backend
// pressed starts at most splitNewPerRouter splits, and none when its
// partition counts do not carry them.
func TestPlanSplitsBoundsOtherRouters(t *testing.T) {
	f := newPlanFixture(t)
	for _, b := range f.r.Backends() {
		f.pressed[b.ID] = true
	}
	now := time.Unix(1000, 0)
	hostile := gossip.HotReport{Node: "r9", Total: 1 << 30, Partitions: uint64(f.r.Partitions())}
	for i := 0; i < 64; i++ {
		key := uint64(i+1) * 0x9e3779b97f4a7c15
		hostile.Prefixes = append(hostile.Prefixes, gossip.HotPrefix{Key: key, Count: 1 << 30, Part: uint32(f.r.Partition(key))})
	}
	p := newSplitPlanner()
	if got := p.plan(f.input(nil, hostile), now); len(got) != 0 || p.refused["not_carried"] != 64 {
		t.Fatalf("claims its partition counts do not carry split %d prefixes (refused %v)", len(got), p.refused)
	}
	for _, h := range hostile.Prefixes {
		hostile.Parts = append(hostile.Parts, gossip.PartLoad{Partition: h.Part, Count: 16})
	}
	if got := p.plan(f.input(nil, hostile), now); len(got) != splitNewPerRouter || p.refused["budget"] != 64-splitNewPerRouter {
		t.Fatalf("one router's claims split %d prefixes in one commit, want %d (refused %v)", len(got), splitNewPerRouter, p.refused)
	}
	// The leader's own hot prefix is split beside them, and the wrong
	// partition count makes a report count for nothing.
	own := f.own(0x1234, 0, 1000)
	if got := newSplitPlanner().plan(f.input(nil, own, hostile), now); len(got) != splitNewPerRouter+1 || !slices.Contains(got, ring.Split{Key: 0x1234}) {
		t.Fatalf("with the leader's own prefix: %d splits %v", len(got), got)
	}
	hostile.Partitions++
	if got := newSplitPlanner().plan(f.input(nil, hostile), now); len(got) != 0 {
		t.Fatalf("a report for a ring of another size split %v", got)
	}
}

// TestPlanSplitsHomeNeverQueued: the backend a split prefix would return
// to never queued (it got none of the prefix's traffic), so it learned no
// capacity: the split weighs its demand against what the other backends
// learned, not against the home's limit, and holds while the fleet runs
// more than that; at idle it ends as any split does.
func TestPlanSplitsHomeNeverQueued(t *testing.T) {
	t0 := time.Unix(1000, 0)
	const key = splitKey
	f, p, rep, cur := splitOne(t, t0)
	clear(f.pressed)
	for i := range f.status {
		f.status[i].Limit = 32
		f.status[i].InFlight = 3 // 12 in the fleet, all of them the prefix's
		if f.status[i].ID == f.owner(key) {
			f.status[i].Capacity = 0
		}
	}
	// Against the limit, 12 fits in half of 32; against the others' 8,
	// it does not.
	for s := time.Duration(0); s <= splitMinLife+2*splitCalm; s += time.Second {
		if got := p.plan(f.input(cur, rep), t0.Add(s)); !slices.Equal(got, cur) {
			t.Fatalf("after %v: %v; 12 in flight fit no backend that runs 8, which the home never showed otherwise", s, got)
		}
	}
	// Idle: the split ends splitCalm later.
	for i := range f.status {
		f.status[i].InFlight = 0
	}
	t1 := t0.Add(splitMinLife + 3*splitCalm)
	p.plan(f.input(cur, rep), t1)
	if got := p.plan(f.input(cur, rep), t1.Add(splitCalm)); len(got) != 0 {
		t.Fatalf("still split %v after splitCalm at idle", got)
	}
	// With no capacity learned anywhere, the limit is all there is.
	if c := poolCapacity([]proxy.BackendStatus{{Capacity: 0}, {Capacity: 0}}); c != 0 {
		t.Fatalf("pool capacity %d with none learned", c)
	}
	if c := poolCapacity([]proxy.BackendStatus{{Capacity: 3}, {Capacity: 0}, {Capacity: 8}, {Capacity: 5}, {Capacity: 4}}); c != 4 {
		t.Fatalf("pool capacity %d of 3, 4, 5, 8; want 4 (the lower middle)", c)
	}
}
