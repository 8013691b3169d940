package ring

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/cespare/xxhash/v2"
)

// sameRing fails t unless got and want place and order alike: backends,
// limits, partitions, every partition's order and the circle itself.
func sameRing(t *testing.T, step string, got, want *Ring) {
	t.Helper()
	switch {
	case !slices.Equal(got.backends, want.backends):
		t.Fatalf("%s: backends differ", step)
	case !slices.Equal(got.limits, want.limits) || !slices.Equal(got.inactive, want.inactive):
		t.Fatalf("%s: limits or inactive backends differ", step)
	case got.parts != want.parts || got.depth != want.depth:
		t.Fatalf("%s: %d partitions of depth %d, want %d of %d", step, got.parts, got.depth, want.parts, want.depth)
	case !slices.Equal(got.order, want.order):
		t.Fatalf("%s: partition orders differ", step)
	}
	if (got.circle == nil) != (want.circle == nil) {
		t.Fatalf("%s: one ring has no circle", step)
	}
	if got.circle == nil {
		return
	}
	g, w := got.circle, want.circle
	if !slices.Equal(g.hash, w.hash) || !slices.Equal(g.backend, w.backend) {
		t.Fatalf("%s: circles differ", step)
	}
}

// TestRebuildMatchesNew walks random membership changes (backends joining
// and leaving, one or many at a time, states, weights and settings
// changing) through Rebuild, each step from the last step's ring, and
// checks every ring against New's over the same backends. Sizes cross
// the point where owners stop coming from buraksezer/consistent.
func TestRebuildMatchesNew(t *testing.T) {
	rng := rand.New(rand.NewPCG(41, 43))
	pool := make([]Backend, 120)
	for i := range pool {
		pool[i] = Backend{ID: fmt.Sprintf("gpu-%d", rng.IntN(1000)*1000+i), Addr: fmt.Sprintf("10.0.%d.%d:8000", i/250, i%250+1)}
	}
	steps := 60
	if testing.Short() {
		steps = 20
	}
	cfg := DefaultConfig()
	cfg.ReplicationFactor = 60 // 4,096 virtual nodes at 68 backends
	in := map[int]bool{}
	for i := range 10 {
		in[i] = true
	}
	members := func() []Backend {
		var bs []Backend
		for i := range pool {
			if in[i] {
				b := pool[i]
				b.Weight = 1 + rng.IntN(3)
				b.State = []State{Active, Active, Active, Draining, Down}[rng.IntN(5)]
				bs = append(bs, b)
			}
		}
		rng.Shuffle(len(bs), func(i, j int) { bs[i], bs[j] = bs[j], bs[i] })
		return bs
	}
	cur, err := New(cfg, members())
	if err != nil {
		t.Fatal(err)
	}
	for step := range steps {
		// Up to 30 backends join or leave, so the fleet grows past the
		// library's limit and back.
		for range 1 + rng.IntN(30) {
			i := rng.IntN(len(pool))
			if step < steps/2 {
				in[i] = true
			} else {
				in[i] = !in[i]
			}
		}
		if rng.IntN(4) == 0 {
			cfg.OverflowDepth = 1 + rng.IntN(8)
		}
		bs := members()
		want, err := New(cfg, bs)
		if err != nil {
			t.Fatal(err)
		}
		got, err := cur.Rebuild(cfg, bs)
		if err != nil {
			t.Fatal(err)
		}
		sameRing(t, fmt.Sprintf("step %d (%d backends)", step, len(bs)), got, want)
		cur = got
	}
}

// TestRebuildFallsBack checks Rebuild when it cannot merge: another
// replication factor, a hash that is not the default, no backends, and a
// nil ring. Each gives New's ring.
func TestRebuildFallsBack(t *testing.T) {
	base := mustRing(t, DefaultConfig(), gpus(7))
	rf := DefaultConfig()
	rf.ReplicationFactor = 50
	other := DefaultConfig()
	other.Hash = func(b []byte) uint64 { return xxhash.Sum64(b) ^ 0x9e3779b97f4a7c15 }
	var none *Ring
	for _, c := range []struct {
		name string
		from *Ring
		cfg  Config
		bs   []Backend
	}{
		{"replication factor", base, rf, gpus(8)},
		{"another hash", base, other, gpus(8)},
		{"to no backends", base, DefaultConfig(), nil},
		{"from no backends", mustRing(t, DefaultConfig(), nil), DefaultConfig(), gpus(8)},
		{"from a nil ring", none, DefaultConfig(), gpus(8)},
	} {
		got, err := c.from.Rebuild(c.cfg, c.bs)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		sameRing(t, c.name, got, mustRing(t, c.cfg, c.bs))
	}
	// Errors are New's.
	if _, err := base.Rebuild(DefaultConfig(), append(gpus(3), gpus(1)...)); err == nil {
		t.Fatal("a duplicate ID: no error")
	}
}

// TestCircleMergeDuplicates merges into a circle whose hashes collide: the
// merged circle must order equal hashes by backend and note the
// duplicates, as newCircle does.
func TestCircleMergeDuplicates(t *testing.T) {
	cfg := DefaultConfig()
	cfg.ReplicationFactor = 3
	// The joining backend's virtual nodes collide with the others' too.
	joining := map[string]uint64{"b/0": 5, "b/1": 9, "b/2": 1 << 63}
	cfg.Hash = func(k []byte) uint64 { return joining[string(k)] }
	// A circle built from virtual nodes whose hashes collide across
	// backends: merge must keep equal hashes in backend order.
	hashes := []uint64{5, 9, 1 << 63, 5, 7, 1 << 63, 9, 9, 3}
	prev := []Backend{{ID: "a"}, {ID: "c"}, {ID: "e"}}
	c := newCircle(hashes, 3)
	if !c.dups {
		t.Fatal("newCircle missed the duplicates")
	}
	bs := []Backend{{ID: "a"}, {ID: "b"}, {ID: "e"}} // c left, b joined
	m := c.merge(cfg, prev, bs)
	bHashes := virtualNodes(cfg, bs[1:2])
	want := newCircle(slices.Concat(hashes[0:3], bHashes, hashes[6:9]), 3)
	if !slices.Equal(m.hash, want.hash) || !slices.Equal(m.backend, want.backend) || !slices.Equal(m.bucket, want.bucket) || m.shift != want.shift || m.dups != want.dups {
		t.Fatalf("merged circle %v/%v, want %v/%v", m.hash, m.backend, want.hash, want.backend)
	}
}
