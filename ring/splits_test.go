package ring

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

// chainOf extracts body's chain of up to blocks blocks.
func chainOf(t *testing.T, body string, blocks int) KeyInfo {
	t.Helper()
	var info KeyInfo
	if err := Extract(KeyConfig{ChainBlocks: blocks}, Chat, []byte(body), nil, &info); err != nil {
		t.Fatal(err)
	}
	return info
}

func chatWith(system, user string) string {
	return fmt.Sprintf(`{"model":"m","messages":[{"role":"system","content":%q},{"role":"user","content":%q}]}`, system, user)
}

func TestChainBlocks(t *testing.T) {
	pre := strings.Repeat("p", 3000)
	a := chainOf(t, chatWith(pre, "question one"), 8)
	b := chainOf(t, chatWith(pre, "question two, longer"), 8)
	// "system\n" + 3000 bytes + "\nuser\n": the first two blocks are the
	// preamble's, the third holds the question and is not full.
	if a.Blocks != 2 || b.Blocks != 2 {
		t.Fatalf("blocks %d, %d; want 2", a.Blocks, b.Blocks)
	}
	for d := 0; d < 2; d++ {
		if a.KeyAt(d) != b.KeyAt(d) {
			t.Fatalf("shared block %d keys differ", d)
		}
	}
	if a.KeyAt(2) == b.KeyAt(2) {
		t.Fatal("the whole prompts' keys agree")
	}
	if a.KeyAt(0) == a.KeyAt(1) || a.KeyAt(1) == a.KeyAt(2) {
		t.Fatal("keys of different depths agree")
	}
	// The limit: 2 blocks read of a longer prompt.
	c := chainOf(t, chatWith(strings.Repeat("q", 5000), "x"), 2)
	if c.Blocks != 2 || c.PrefixBytes != 2*ChainBlockBytes {
		t.Fatalf("limited read: %d blocks, %d bytes", c.Blocks, c.PrefixBytes)
	}
	// Tenants and models never share a key.
	var t1, t2 KeyInfo
	body := []byte(chatWith(pre, "q"))
	if err := Extract(KeyConfig{ChainBlocks: 4}, Chat, body, []byte("tenant-a"), &t1); err != nil {
		t.Fatal(err)
	}
	if err := Extract(KeyConfig{ChainBlocks: 4}, Chat, body, []byte("tenant-b"), &t2); err != nil {
		t.Fatal(err)
	}
	if t1.Chain[0] != t2.Chain[0] || t1.KeyAt(0) == t2.KeyAt(0) {
		t.Fatal("tenants share a key, or their text hashes differently")
	}
	// Key is the first block's key.
	if a.Key != a.KeyAt(0) {
		t.Fatal("Key is not KeyAt(0)")
	}
}

func TestSplitsDepth(t *testing.T) {
	pre := strings.Repeat("p", 3000)
	a := chainOf(t, chatWith(pre, strings.Repeat("a", 2000)), 8)
	b := chainOf(t, chatWith(pre, strings.Repeat("b", 2000)), 8)
	var none *Splits
	if none.Depth(&a) != 0 || none.ChainBlocks() != 1+SplitLookahead {
		t.Fatalf("empty set: depth %d, chain %d", none.Depth(&a), none.ChainBlocks())
	}
	// Splitting the shared preamble's blocks sends each prompt to its own
	// third block.
	s, err := NewSplits([]Split{{Key: a.KeyAt(1), Depth: 1}, {Key: a.KeyAt(0), Depth: 0}, {Key: a.KeyAt(0), Depth: 0}})
	if err != nil {
		t.Fatal(err)
	}
	if s.Len() != 2 || s.List()[0].Depth != 0 || s.ChainBlocks() != 2+1+SplitLookahead {
		t.Fatalf("set %+v, chain %d", s.List(), s.ChainBlocks())
	}
	da, db := s.Depth(&a), s.Depth(&b)
	if da != 2 || db != 2 || a.KeyAt(da) == b.KeyAt(db) {
		t.Fatalf("depths %d, %d", da, db)
	}
	// A split below an unsplit block is never reached.
	s2, _ := NewSplits([]Split{{Key: a.KeyAt(1), Depth: 1}})
	if s2.Depth(&a) != 0 {
		t.Fatal("an unsplit first block was passed")
	}
	// Every full block split: the whole text.
	short := chainOf(t, chatWith(pre, "x"), 8)
	s3, _ := NewSplits([]Split{{Key: short.KeyAt(0), Depth: 0}, {Key: short.KeyAt(1), Depth: 1}})
	if d := s3.Depth(&short); d != short.Blocks {
		t.Fatalf("depth %d, want the whole text (%d)", d, short.Blocks)
	}
	// The set holds what it was given, key 0 included, and nothing else.
	var many []Split
	for k := uint64(0); k < 1000; k++ {
		many = append(many, Split{Key: k * 0x9e3779b97f4a7c15, Depth: int(k % 7)})
	}
	big, err := NewSplits(many)
	if err != nil || big.Len() != 1000 {
		t.Fatalf("1,000 splits: %v, %d held", err, big.Len())
	}
	for _, sp := range many {
		if !big.Has(sp.Key) || big.Has(sp.Key+1) {
			t.Fatalf("set membership wrong around %x", sp.Key)
		}
	}
	if _, err := NewSplits([]Split{{Depth: MaxChainBlocks}}); !errors.Is(err, ErrConfig) {
		t.Fatalf("depth out of range: %v", err)
	}
	if _, err := NewSplits(make([]Split, MaxSplits+1)); !errors.Is(err, ErrConfig) {
		t.Fatalf("too many: %v", err)
	}
}

// mustPickCost is r.PickCost, failing t on an error.
func mustPickCost(t *testing.T, r *Ring, key uint64, recompute int64, loads Loads) Decision {
	t.Helper()
	d, err := r.PickCost(key, recompute, loads)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestPickCost(t *testing.T) {
	cfg := DefaultConfig()
	cfg.ConcurrencyThreshold = 16
	cfg.LoadFactor = 1.25
	r := mustRing(t, cfg, gpus(5))
	loads := newLoads(5)
	key := uint64(12345)
	order := r.Order(r.Partition(key))
	o, alt := int(order[0]), int(order[1])
	pick := func(recompute int64) Decision {
		t.Helper()
		return mustPickCost(t, r, key, recompute, loads)
	}
	set := func(owner, others int64) {
		for b := range loads.inflight {
			loads.inflight[b] = others
		}
		loads.inflight[o] = owner
	}
	// A loaded owner within the bounded-loads cap, no queue: kept.
	set(6, 5) // cap ceil(1.25 x 27 / 5) = 7
	if d := pick(1); d.Backend != o || d.Reason != ReasonAffinity {
		t.Fatalf("owner within the cap: %+v", d)
	}
	// A queueing owner: overflow to the first alternative that does not
	// queue and is less loaded by more than the recompute.
	loads.busy[o] = true
	loads.inflight[alt] = 2
	if d := pick(1); d.Backend != alt || d.Reason != ReasonOverflow || d.Rank != 1 {
		t.Fatalf("queueing owner: %+v, want %d", d, alt)
	}
	// A long prompt (recompute 6 mean requests) waits on the owner.
	if d := pick(6); d.Backend != o {
		t.Fatalf("long prompt left a queueing owner: %+v", d)
	}
	// Every alternative queues: wait on the warm owner.
	for b := range loads.busy {
		loads.busy[b] = true
	}
	if d := pick(1); d.Backend != o || d.Reason != ReasonAffinity {
		t.Fatalf("busy fleet: %+v", d)
	}
	clear(loads.busy)
	// Over the cap: the first backend under it takes the key...
	set(12, 2) // cap ceil(1.25 x 21 / 5) = 6
	if d := pick(1); d.Backend != alt || d.Reason != ReasonOverflow {
		t.Fatalf("owner over the cap: %+v", d)
	}
	// ...unless the prompt's recompute outweighs the excess.
	if d := pick(8); d.Backend != o {
		t.Fatalf("a long prompt left an owner 7 over the cap: %+v", d)
	}
	// Without LoadFactor a loaded owner that does not queue keeps its keys.
	cfg.LoadFactor = 0
	r = mustRing(t, cfg, gpus(5))
	if d := pick(1); d.Backend != o {
		t.Fatalf("no LoadFactor, owner 10 above the others: %+v", d)
	}
	// The threshold stays a hard cap, whatever the recompute.
	set(16, 15)
	if d := pick(100); d.Backend == o {
		t.Fatalf("owner at its hard cap kept the key: %+v", d)
	}
	// An unhealthy owner is left as before.
	set(0, 0)
	loads.down[o] = true
	if d := pick(1); d.Backend == o {
		t.Fatalf("down owner picked: %+v", d)
	}
}

// queueLoads is a fakeLoads that knows its engines' queues (Queues).
type queueLoads struct {
	*fakeLoads
	queued []int64
}

func (q queueLoads) Queued(b int) int64 { return q.queued[b] }

var _ Queues = queueLoads{}

// With Queues the COST rule weighs the owner's queue beside the gap in
// in-flight counts: an engine that runs many requests at once and queues
// few keeps its keys however idle the others look.
func TestPickCostWeighsQueue(t *testing.T) {
	cfg := DefaultConfig()
	cfg.ConcurrencyThreshold = 64
	r := mustRing(t, cfg, gpus(5))
	loads := queueLoads{newLoads(5), make([]int64, 5)}
	key := uint64(12345)
	order := r.Order(r.Partition(key))
	o, alt := int(order[0]), int(order[1])
	pick := func(recompute int64) Decision {
		t.Helper()
		return mustPickCost(t, r, key, recompute, loads)
	}
	// The owner runs 20 and queues 2; the others run 1 each.
	for b := range loads.inflight {
		loads.inflight[b] = 1
	}
	loads.inflight[o], loads.busy[o], loads.queued[o] = 20, true, 2
	if d := pick(2); d.Backend != o || d.Reason != ReasonAffinity {
		t.Fatalf("owner queueing 2, recompute 2: %+v, want the owner", d)
	}
	// The same counts without Queues: 19 fewer in flight elsewhere.
	if d, _ := r.PickCost(key, 2, loads.fakeLoads); d.Backend != alt {
		t.Fatalf("without Queues: %+v, want the first alternative %d", d, alt)
	}
	// A queue longer than the recompute: the first alternative that does
	// not queue takes it.
	loads.queued[o] = 3
	if d := pick(2); d.Backend != alt || d.Reason != ReasonOverflow || d.Rank != 1 {
		t.Fatalf("owner queueing 3, recompute 2: %+v, want %d", d, alt)
	}
	loads.busy[alt] = true
	if d := pick(2); d.Backend == alt || d.Backend == o || d.Reason != ReasonOverflow {
		t.Fatalf("first alternative queues too: %+v", d)
	}
	// Every alternative queues: wait on the warm owner.
	for b := range loads.busy {
		loads.busy[b] = true
	}
	if d := pick(2); d.Backend != o {
		t.Fatalf("busy fleet: %+v", d)
	}
}
