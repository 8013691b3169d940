package ring

import (
	"encoding/binary"
	"fmt"
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
}

// member adapts a backend ID to consistent.Member. The library names
// virtual nodes fmt.Sprintf("%s%d", name, i), so "gpu-1"+"10" collides
// with "gpu-11"+"0"; a trailing '/' makes every virtual-node name parse back
// to exactly one (ID, i), so owners are a pure function of the ID set.
type member string

func (m member) String() string { return string(m) }

func memberName(id string) string { return id + "/" }

type hasher func([]byte) uint64

func (h hasher) Sum64(b []byte) uint64 { return h(b) }

// New builds a ring over backends. Backend IDs must be unique and
// non-empty. The result depends only on cfg and the set of backends, never on
// their order. An empty backend set gives a ring whose Pick always returns
// ErrNoBackend.
func New(cfg Config, backends []Backend) (*Ring, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if len(backends) > MaxBackends {
		return nil, fmt.Errorf("%w: %d backends, at most %d", ErrConfig, len(backends), MaxBackends)
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
	if parts < len(bs) {
		return nil, fmt.Errorf("%w: PartitionCount %d is below the backend count %d", ErrConfig, parts, len(bs))
	}
	r.parts = uint64(parts)
	r.depth = min(cfg.OverflowDepth, len(bs))
	owners, err := partitionOwners(cfg, bs, r.index, parts)
	if err != nil {
		return nil, err
	}
	r.order = overflowOrders(cfg, bs, owners, r.depth)
	return r, nil
}

// partitionOwners asks buraksezer/consistent for the bounded-load owner of
// every partition. The library panics on impossible layouts; that becomes an
// error here.
func partitionOwners(cfg Config, bs []Backend, index map[string]int, parts int) (owners []int32, err error) {
	defer func() {
		if p := recover(); p != nil {
			owners, err = nil, fmt.Errorf("%w: cannot place %d backends on %d partitions: %v", ErrConfig, len(bs), parts, p)
		}
	}()
	members := make([]consistent.Member, len(bs))
	for i, b := range bs {
		members[i] = member(memberName(b.ID))
	}
	c := consistent.New(members, consistent.Config{
		Hasher:            hasher(cfg.Hash),
		PartitionCount:    parts,
		ReplicationFactor: cfg.ReplicationFactor,
		Load:              cfg.PartitionLoad,
	})
	owners = make([]int32, parts)
	for p := range owners {
		name := c.GetPartitionOwner(p).String()
		owners[p] = int32(index[name[:len(name)-1]])
	}
	return owners, nil
}

type vnode struct {
	hash    uint64
	backend int32
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
func overflowOrders(cfg Config, bs []Backend, owners []int32, depth int) []int32 {
	vn := make([]vnode, 0, len(bs)*cfg.ReplicationFactor)
	var key []byte
	for i, b := range bs {
		name := memberName(b.ID)
		for v := 0; v < cfg.ReplicationFactor; v++ {
			key = strconv.AppendInt(append(key[:0], name...), int64(v), 10)
			vn = append(vn, vnode{hash: cfg.Hash(key), backend: int32(i)})
		}
	}
	sort.Slice(vn, func(i, j int) bool { return vn[i].hash < vn[j].hash })

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
