package ring

import (
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"sort"
	"strconv"
	"sync/atomic"

	"github.com/buraksezer/consistent"
)

// Ring is an immutable placement snapshot: backends, the owner of every
// partition and every partition's overflow order. Build one with New and
// share it freely; only the round-robin cursor changes after New.
type Ring struct {
	cfg      Config
	backends []Backend
	index    map[string]int
	limits   []int64 // per backend: ConcurrencyThreshold x weight
	parts    uint64
	depth    int
	// order holds depth backend indexes per partition; order[p*depth] is
	// the owner, then the overflow order.
	order []int32
	rr    *atomic.Uint64
	moved int // partitions WithMoves gave another owner
}

// memberName is a backend's member name on the circle. Virtual nodes are
// named fmt.Sprintf("%s%d", name, i), as buraksezer/consistent names them,
// so "gpu-1"+"10" would collide with "gpu-11"+"0"; a trailing '/' makes
// every virtual-node name parse back to exactly one (ID, i), so owners are
// a pure function of the ID set.
func memberName(id string) string { return id + "/" }

// New builds a ring over backends. Backend IDs must be unique and
// non-empty. The result depends only on cfg and the set of backends, never on
// their order. An empty backend set gives a ring whose Pick always returns
// ErrNoBackend.
func New(cfg Config, backends []Backend) (*Ring, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := cfg.CheckFleet(len(backends)); err != nil {
		return nil, err
	}
	bs := slices.Clone(backends)
	slices.SortFunc(bs, func(a, b Backend) int {
		switch {
		case a.ID < b.ID:
			return -1
		case a.ID > b.ID:
			return 1
		}
		return 0
	})
	r := &Ring{
		cfg:      cfg,
		backends: bs,
		index:    make(map[string]int, len(bs)),
		limits:   make([]int64, len(bs)),
		rr:       new(atomic.Uint64),
	}
	for i, b := range bs {
		if b.ID == "" {
			return nil, fmt.Errorf("%w: backend with an empty ID", ErrConfig)
		}
		if _, dup := r.index[b.ID]; dup {
			return nil, fmt.Errorf("%w: duplicate backend ID %q", ErrConfig, b.ID)
		}
		r.index[b.ID] = i
		r.limits[i] = int64(cfg.ConcurrencyThreshold) * b.weight()
	}
	if len(bs) == 0 {
		return r, nil
	}
	parts := cfg.partitions(len(bs))
	r.parts = uint64(parts)
	r.depth = min(cfg.OverflowDepth, len(bs))
	vn := virtualNodes(cfg, bs)
	// One sort serves both tables: by hash, equal hashes by backend index,
	// so the order never depends on the sort algorithm.
	slices.SortFunc(vn, func(a, b vnode) int {
		switch {
		case a.hash < b.hash:
			return -1
		case a.hash > b.hash:
			return 1
		}
		return int(a.backend - b.backend)
	})
	owners, err := partitionOwners(cfg, bs, vn, parts)
	if err != nil {
		return nil, err
	}
	r.order = overflowOrders(cfg, bs, vn, owners, r.depth)
	return r, nil
}

// vnode is one virtual node on the hash circle.
type vnode struct {
	hash    uint64
	backend int32
}

// virtualNodes hashes every backend's virtual-node names in the order
// buraksezer/consistent inserts them: backends in slice order, replicas
// 0..ReplicationFactor-1, named fmt.Sprintf("%s%d", memberName(id), i).
func virtualNodes(cfg Config, bs []Backend) []vnode {
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

// errNoRoom is buraksezer/consistent's panic message for a layout it
// cannot place.
const errNoRoom = "not enough room to distribute partitions"

// libraryMaxVnodes is the largest circle (backends x ReplicationFactor)
// whose owners come from buraksezer/consistent itself; the library's New
// re-sorts the circle after every member, so above it circleOwners computes
// the same table.
const libraryMaxVnodes = 4096

// partitionOwners returns the bounded-load owner of every partition:
// buraksezer/consistent's placement, computed by the library for circles of
// up to libraryMaxVnodes virtual nodes and by circleOwners, which reproduces
// it exactly, above that.
func partitionOwners(cfg Config, bs []Backend, vn []vnode, parts int) ([]int32, error) {
	if len(vn) <= libraryMaxVnodes {
		return consistentOwners(cfg, bs, parts)
	}
	return circleOwners(cfg, bs, vn, parts)
}

// member adapts a ring member name to consistent.Member.
type member string

func (m member) String() string { return string(m) }

type hasher func([]byte) uint64

func (h hasher) Sum64(b []byte) uint64 { return h(b) }

// consistentOwners asks buraksezer/consistent for the owners. The library
// panics on layouts it cannot place; that becomes an error.
func consistentOwners(cfg Config, bs []Backend, parts int) (owners []int32, err error) {
	defer func() {
		if p := recover(); p != nil {
			owners, err = nil, fmt.Errorf("%w: cannot place %d backends on %d partitions: %v", ErrConfig, len(bs), parts, p)
		}
	}()
	members := make([]consistent.Member, len(bs))
	index := make(map[string]int32, len(bs))
	for i, b := range bs {
		members[i] = member(memberName(b.ID))
		index[memberName(b.ID)] = int32(i)
	}
	c := consistent.New(members, consistent.Config{
		Hasher:            hasher(cfg.Hash),
		PartitionCount:    parts,
		ReplicationFactor: cfg.ReplicationFactor,
		Load:              cfg.PartitionLoad,
	})
	owners = make([]int32, parts)
	for p := range owners {
		owners[p] = index[c.GetPartitionOwner(p).String()]
	}
	return owners, nil
}

// circleOwners computes the bounded-load owner of every partition exactly
// as buraksezer/consistent v0.10.0's New does for the members bs (in slice
// order), without its cost: the library re-sorts its whole virtual-node
// slice after every member it adds (O(n^2 log n); ~0.5 s at 1,000
// backends), while the result only depends on the final sorted circle.
// The steps below mirror the library's:
//   - the circle is every virtual-node hash, sorted, duplicates kept; a
//     hash maps to the member inserted last with that hash (its map is
//     overwritten), i.e. the highest backend index;
//   - the bound is ceil(float64(PartitionCount / n) x PartitionLoad), with
//     integer division first;
//   - partition p starts at the first hash >= Hash(uint64 p little-endian),
//     wrapping to 0, and takes the first member whose count+1 is within the
//     bound, looking at no more than len(circle)-1 entries (the library
//     panics past that; here it is an error).
//
// TestOwnersMatchLibrary compares the two on many sets and configs.
func circleOwners(cfg Config, bs []Backend, vn []vnode, parts int) ([]int32, error) {
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

// overflowOrders gives each partition its owner followed by the next
// distinct backends met walking the virtual-node circle clockwise from the
// partition's position: the same circle and walk buraksezer/consistent
// uses to place partitions. Two things follow. One owner's partitions sit
// at many points on the circle, so its overflow spreads over many backends
// rather than one neighbour (GetClosestN hashes member names and gives every
// partition of an owner the same successor list). And when a backend leaves,
// its partitions mostly go to the backend that was already their first
// overflow, whose cache is warm for them.
func overflowOrders(cfg Config, bs []Backend, vn []vnode, owners []int32, depth int) []int32 {
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

// Config returns the config the ring was built with.
func (r *Ring) Config() Config { return r.cfg }

// Len is the number of backends.
func (r *Ring) Len() int { return len(r.backends) }

// Backends returns the backends sorted by ID; indexes in a Decision and in
// Loads refer to this order. The slice must not be modified.
func (r *Ring) Backends() []Backend { return r.backends }

// Backend returns backend i.
func (r *Ring) Backend(i int) *Backend { return &r.backends[i] }

// Index returns the index of the backend with the given ID.
func (r *Ring) Index(id string) (int, bool) {
	i, ok := r.index[id]
	return i, ok
}

// Limit is backend i's concurrency limit: ConcurrencyThreshold x weight.
func (r *Ring) Limit(i int) int64 { return r.limits[i] }

// Partitions is the number of partitions (0 for an empty ring).
func (r *Ring) Partitions() int { return int(r.parts) }

// Partition maps a routing key to its partition, as buraksezer/consistent
// does: key mod PartitionCount.
func (r *Ring) Partition(key uint64) int {
	if r.parts == 0 {
		return 0
	}
	return int(key % r.parts)
}

// Owner returns the owner of a key's partition, or -1 for an empty ring.
func (r *Ring) Owner(key uint64) int {
	if r.parts == 0 {
		return -1
	}
	return int(r.order[r.Partition(key)*r.depth])
}

// Order returns partition p's owner and overflow order (backend indexes).
// The slice must not be modified.
func (r *Ring) Order(p int) []int32 {
	if r.parts == 0 {
		return nil
	}
	return r.order[p*r.depth : (p+1)*r.depth]
}
