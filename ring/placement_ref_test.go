package ring

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"strconv"
	"testing"

	"github.com/cespare/xxhash/v2"
)

// This file keeps the ring's placement as it was built before the
// rebuild was made fast (commit 2e74417), as a reference: New must give
// every partition the same owner and overflow order, and refuse the same
// layouts.

// refOrder is the reference partition table for bs: backend indexes (IDs
// sorted) per partition, depth per row, or the reference's error.
func refOrder(cfg Config, bs []Backend) ([]int32, error) {
	sorted := slices.SortedFunc(slices.Values(bs), func(a, b Backend) int { return cmp.Compare(a.ID, b.ID) })
	parts := cfg.partitions(len(sorted))
	depth := min(cfg.OverflowDepth, len(sorted))
	vn := refVirtualNodes(cfg, sorted)
	slices.SortFunc(vn, func(a, b vnode) int {
		switch {
		case a.hash < b.hash:
			return -1
		case a.hash > b.hash:
			return 1
		}
		return int(a.backend - b.backend)
	})
	var owners []int32
	var err error
	if len(vn) <= libraryMaxVnodes {
		owners, err = refLibraryOwners(cfg, sorted, parts)
	} else {
		owners, err = refCircleOwners(cfg, sorted, vn, parts)
	}
	if err != nil {
		return nil, err
	}
	return refOverflowOrders(cfg, sorted, vn, owners, depth), nil
}

// refLibraryOwners is buraksezer/consistent's own placement as owner
// indexes, or an error where it panics.
func refLibraryOwners(cfg Config, sorted []Backend, parts int) ([]int32, error) {
	ids, ok := libraryOwners(cfg, sorted)
	if !ok {
		return nil, fmt.Errorf("%w: cannot place %d backends on %d partitions: %v", ErrConfig, len(sorted), parts, errNoRoom)
	}
	index := make(map[string]int32, len(sorted))
	for i, b := range sorted {
		index[b.ID] = int32(i)
	}
	owners := make([]int32, len(ids))
	for p, id := range ids {
		owners[p] = index[id]
	}
	return owners, nil
}

func refVirtualNodes(cfg Config, bs []Backend) []vnode {
	vn := make([]vnode, 0, len(bs)*cfg.ReplicationFactor)
	var key []byte
	for i, b := range bs {
		name := memberName(b.ID)
		for v := 0; v < cfg.ReplicationFactor; v++ {
			key = strconv.AppendInt(append(key[:0], name...), int64(v), 10)
			vn = append(vn, vnode{hash: cfg.Hash(key), backend: int32(i)})
		}
	}
	return vn
}

func refCircleOwners(cfg Config, bs []Backend, vn []vnode, parts int) ([]int32, error) {
	circle := slices.Clone(vn) // vn is sorted by hash (see New)
	// Equal hashes: every copy maps to the last inserted member, which is
	// the highest backend index (backends are inserted in index order).
	for i := 0; i < len(circle); {
		j, top := i+1, circle[i].backend
		for j < len(circle) && circle[j].hash == circle[i].hash {
			top = max(top, circle[j].backend)
			j++
		}
		for k := i; k < j; k++ {
			circle[k].backend = top
		}
		i = j
	}
	avg := math.Ceil(float64(parts/len(bs)) * cfg.PartitionLoad)
	loads := make([]int, len(bs))
	owners := make([]int32, parts)
	var pb [8]byte
	for p := range owners {
		binary.LittleEndian.PutUint64(pb[:], uint64(p))
		h := cfg.Hash(pb[:])
		idx, _ := slices.BinarySearchFunc(circle, h, func(v vnode, h uint64) int {
			if v.hash < h {
				return -1
			}
			if v.hash > h {
				return 1
			}
			return 0
		})
		if idx >= len(circle) {
			idx = 0
		}
		placed := false
		for count := 1; count < len(circle); count++ {
			b := circle[idx].backend
			if float64(loads[b]+1) <= avg {
				owners[p] = b
				loads[b]++
				placed = true
				break
			}
			if idx++; idx >= len(circle) {
				idx = 0
			}
		}
		if !placed {
			return nil, fmt.Errorf("%w: cannot place %d backends on %d partitions: %v", ErrConfig, len(bs), parts, errNoRoom)
		}
	}
	return owners, nil
}

func refOverflowOrders(cfg Config, bs []Backend, vn []vnode, owners []int32, depth int) []int32 {
	// vn is sorted by hash (see New).

	order := make([]int32, len(owners)*depth)
	seen := make([]uint32, len(bs)) // partition+1 that last saw the backend
	var pb [8]byte
	for p := range owners {
		row := order[p*depth : (p+1)*depth]
		row[0] = owners[p]
		seen[owners[p]] = uint32(p + 1)
		n := 1
		binary.LittleEndian.PutUint64(pb[:], uint64(p))
		h := cfg.Hash(pb[:])
		start := sort.Search(len(vn), func(i int) bool { return vn[i].hash >= h })
		for k := 0; n < depth && k < len(vn); k++ {
			b := vn[(start+k)%len(vn)].backend
			if seen[b] != uint32(p+1) {
				seen[b] = uint32(p + 1)
				row[n] = b
				n++
			}
		}
	}
	return order
}

// TestOrderMatchesReference builds random memberships and configs, on
// both sides of the size where the library stops computing owners, and
// checks that New's partition table equals the reference's row for row,
// and that both refuse the same layouts.
func TestOrderMatchesReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(29, 31))
	weak := func(b []byte) uint64 { return xxhash.Sum64(b) & 0xffff }
	cases := 120
	if testing.Short() {
		cases = 20
	}
	refused := 0
	for c := 0; c < cases; c++ {
		n := []int{1, 2, 5, 9, 20, 21, 40, 200, 700, 1000}[rng.IntN(10)]
		cfg := DefaultConfig()
		cfg.ReplicationFactor = []int{1, 3, 20, 100, 200, 400}[rng.IntN(6)]
		if n*cfg.ReplicationFactor > 400000 {
			cfg.ReplicationFactor = 200
		}
		cfg.PartitionCount = []int{0, 0, n, 3 * n, 20011}[rng.IntN(5)]
		cfg.PartitionLoad = []float64{1.01, 1.05, 1.1, 1.25, 1.5, 3}[rng.IntN(6)]
		cfg.OverflowDepth = 1 + rng.IntN(12)
		if rng.IntN(6) == 0 {
			cfg.Hash = weak
		}
		bs := gpus(n)
		for i := range bs {
			switch rng.IntN(3) {
			case 0:
				bs[i].ID = fmt.Sprintf("b%x", rng.Uint64())
			case 1:
				bs[i].ID = strconv.Itoa(rng.IntN(1 << 20))
			}
		}
		slices.SortFunc(bs, func(a, b Backend) int { return cmp.Compare(a.ID, b.ID) })
		bs = slices.CompactFunc(bs, func(a, b Backend) bool { return a.ID == b.ID })
		rng.Shuffle(len(bs), func(i, j int) { bs[i], bs[j] = bs[j], bs[i] })
		name := fmt.Sprintf("case %d: n=%d rf=%d parts=%d load=%g depth=%d", c, len(bs), cfg.ReplicationFactor, cfg.PartitionCount, cfg.PartitionLoad, cfg.OverflowDepth)
		want, werr := refOrder(cfg, bs)
		r, err := New(cfg, bs)
		switch {
		case werr != nil && err == nil:
			t.Errorf("%s: the reference refuses (%v), New builds", name, werr)
			continue
		case werr == nil && err != nil:
			t.Errorf("%s: New refuses (%v), the reference builds", name, err)
			continue
		case err != nil:
			refused++
			if err.Error() != werr.Error() {
				t.Errorf("%s: New's error %q, the reference's %q", name, err, werr)
			}
			continue
		}
		if !slices.Equal(r.order, want) {
			for p := 0; p < r.Partitions(); p++ {
				if got, w := r.Order(p), want[p*r.depth:(p+1)*r.depth]; !slices.Equal(got, w) {
					t.Errorf("%s: partition %d order %v, reference %v", name, p, got, w)
					break
				}
			}
		}
	}
	t.Logf("%d cases, %d refused by both", cases, refused)
}

// TestCircleOrderAndDups checks newCircle on hand-made hashes: sorted by
// hash, equal hashes by backend, and equal hashes noticed whether or not
// the insertion pass had to move one of them.
func TestCircleOrderAndDups(t *testing.T) {
	for _, c := range []struct {
		hashes   []uint64
		rf       int
		hash     []uint64
		backends []int32
		dups     bool
	}{
		{[]uint64{5, 3, 1, 3}, 2, []uint64{1, 3, 3, 5}, []int32{1, 0, 1, 0}, true},
		{[]uint64{3, 5, 3, 1}, 2, []uint64{1, 3, 3, 5}, []int32{1, 0, 1, 0}, true},
		{[]uint64{5, 3, 1, 4}, 2, []uint64{1, 3, 4, 5}, []int32{1, 0, 1, 0}, false},
		{[]uint64{1 << 63, 7, 1<<63 + 1, 7}, 1, []uint64{7, 7, 1 << 63, 1<<63 + 1}, []int32{1, 3, 0, 2}, true},
	} {
		got := newCircle(c.hashes, c.rf)
		if !slices.Equal(got.hash, c.hash) || !slices.Equal(got.backend, c.backends) || got.dups != c.dups {
			t.Errorf("%v: hashes %v, backends %v, dups %v; want %v, %v, %v", c.hashes, got.hash, got.backend, got.dups, c.hash, c.backends, c.dups)
		}
		for _, h := range []uint64{0, 2, 3, 6, 1 << 63, 1<<64 - 1} {
			want, _ := slices.BinarySearch(got.hash, h)
			if i := got.search(h); i != want {
				t.Errorf("%v: search(%d) = %d, want %d", c.hashes, h, i, want)
			}
		}
	}
}
