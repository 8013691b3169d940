package ring

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"math"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"sync/atomic"

	"github.com/buraksezer/consistent"
	"github.com/cespare/xxhash/v2"
)

// Ring is an immutable placement snapshot: backends, the owner of every
// partition and every partition's overflow order. Build one with New (or,
// after a membership change, with the last ring's Rebuild) and share it
// freely; only the round-robin cursor changes after New.
type Ring struct {
	cfg      Config
	backends []Backend
	index    map[string]int
	limits   []int64 // per backend: ConcurrencyThreshold x weight
	inactive []int32 // backends whose State is not Active
	parts    uint64
	depth    int
	// order holds depth backend indexes per partition; order[p*depth] is
	// the owner, then the overflow order.
	order []int32
	rr    *atomic.Uint64
	moved int // partitions WithMoves gave another owner
	// circle is the sorted virtual-node circle the ring was placed on,
	// kept so that Rebuild merges a membership change into it instead of
	// hashing and sorting every virtual node again.
	circle *circle
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
	return build(cfg, backends, nil)
}

// Rebuild returns what New(cfg, backends) returns, reusing r's circle of
// virtual nodes when cfg places them as r's config did (the same
// ReplicationFactor and the default hash): the virtual nodes of backends
// that left are dropped, those of backends that joined are hashed and
// merged in, and the rest are neither hashed nor sorted again. A
// membership change at 1,000 backends then costs a fraction of a build
// from scratch (BenchmarkRebuild). TestRebuildMatchesNew checks that the
// rings are the same.
func (r *Ring) Rebuild(cfg Config, backends []Backend) (*Ring, error) {
	if r == nil || r.circle == nil || r.cfg.ReplicationFactor != cfg.ReplicationFactor ||
		!isDefaultHash(r.cfg.Hash) || !isDefaultHash(cfg.Hash) {
		return New(cfg, backends)
	}
	return build(cfg, backends, r)
}

// isDefaultHash reports whether h is xxhash.Sum64, the hash ConfigFor
// sets: a plain function, so equal pointers mean equal hashes (a test's
// closure could share its code with another that hashes differently).
func isDefaultHash(h func([]byte) uint64) bool {
	return h != nil && reflect.ValueOf(h).Pointer() == reflect.ValueOf(xxhash.Sum64).Pointer()
}

// build is New, merging into prev's circle when prev is not nil.
func build(cfg Config, backends []Backend, prev *Ring) (*Ring, error) {
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
		if cfg.ConcurrencyThreshold == 0 {
			r.limits[i] = NoLimit // not set: the engines' own capacity
		}
		if b.State != Active {
			r.inactive = append(r.inactive, int32(i))
		}
	}
	if len(bs) == 0 {
		return r, nil
	}
	parts := cfg.partitions(len(bs))
	r.parts = uint64(parts)
	r.depth = min(cfg.OverflowDepth, len(bs))
	var c *circle
	if prev != nil {
		c = prev.circle.merge(cfg, prev.backends, bs)
	} else {
		c = newCircle(virtualNodes(cfg, bs), cfg.ReplicationFactor)
	}
	starts := c.starts(cfg, parts)
	owners, err := partitionOwners(cfg, bs, c, starts)
	if err != nil {
		return nil, err
	}
	r.order = overflowOrders(len(bs), c, starts, owners, r.depth)
	// Rebuild needs only the sorted virtual nodes; merge re-indexes them.
	r.circle = &circle{hash: c.hash, backend: c.backend}
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
// Hash i is backend i / ReplicationFactor's.
func virtualNodes(cfg Config, bs []Backend) []uint64 {
	// The replica numbers' decimal forms, written once: sufs[off[v]:off[v+1]].
	off := make([]int, cfg.ReplicationFactor+1)
	var sufs []byte
	for v := 0; v < cfg.ReplicationFactor; v++ {
		sufs = strconv.AppendInt(sufs, int64(v), 10)
		off[v+1] = len(sufs)
	}
	hashes := make([]uint64, len(bs)*cfg.ReplicationFactor)
	var key []byte
	k := 0
	for _, b := range bs {
		key = append(key[:0], memberName(b.ID)...)
		n := len(key)
		for v := 0; v < cfg.ReplicationFactor; v++ {
			key = append(key[:n], sufs[off[v]:off[v+1]]...)
			hashes[k] = cfg.Hash(key)
			k++
		}
	}
	return hashes
}

// circle is the hash circle: every virtual node sorted by hash, equal
// hashes by backend index, and an index from a hash's top bits to the
// first virtual node of that bucket, so finding where a partition starts
// is a table read and a scan of a bucket of one or two entries instead of
// a binary search over the whole circle.
type circle struct {
	// hash and backend are the virtual nodes, in circle order.
	hash    []uint64
	backend []int32
	// bucket[k] is the index of the first virtual node whose hash >> shift
	// is at least k; bucket[len-1] is len(hash).
	bucket []int32
	shift  uint
	// dups: some virtual nodes share a hash.
	dups bool
}

// newCircle sorts the virtual nodes whose hashes virtualNodes returned,
// rf per backend in backend order. Hashes are spread evenly by design, so
// a counting sort on the top bits (stable, hence backend order within
// equal hashes) followed by a sort of each bucket, one or two entries on
// average, costs a few passes over the slice; a weak hash that puts many
// virtual nodes in one bucket is still sorted correctly, only slower. The
// order is the same as sorting by (hash, backend).
func newCircle(hashes []uint64, rf int) *circle {
	n := len(hashes)
	bits := circleBits(n)
	c := &circle{
		hash:    make([]uint64, n),
		backend: make([]int32, n),
		bucket:  make([]int32, 1<<bits+1),
		shift:   64 - bits,
	}
	bucket := c.bucket
	for _, h := range hashes {
		bucket[h>>c.shift+1]++
	}
	big := false // a bucket holds more than 16 virtual nodes
	for k := 1; k < len(bucket); k++ {
		big = big || bucket[k] > 16
		bucket[k] += bucket[k-1]
	}
	// Scatter, using bucket[k] as bucket k's cursor: afterwards bucket[k]
	// is where bucket k+1 starts, so shift by one.
	for b, i := int32(0), 0; i < n; b++ {
		for end := i + rf; i < end; i++ {
			h := hashes[i]
			k := h >> c.shift
			c.hash[bucket[k]] = h
			c.backend[bucket[k]] = b
			bucket[k]++
		}
	}
	copy(bucket[1:], bucket[:len(bucket)-1])
	bucket[0] = 0
	if big {
		for k := 0; k+1 < len(bucket); k++ {
			if lo, hi := int(bucket[k]), int(bucket[k+1]); hi-lo > 16 {
				c.sortRange(lo, hi)
			}
		}
	}
	// One insertion sort over the whole circle finishes the small
	// buckets: an entry never moves past the start of its bucket, whose
	// hashes are all larger than the previous bucket's, and equal hashes
	// keep their (backend) order. An entry equal to another ends next to
	// it, after it, which is where dups are noticed.
	hs, bs := c.hash, c.backend
	for i := 1; i < n; i++ {
		h := hs[i]
		if h >= hs[i-1] {
			c.dups = c.dups || h == hs[i-1]
			continue
		}
		b, j := bs[i], i
		for ; j > 0 && h < hs[j-1]; j-- {
			hs[j], bs[j] = hs[j-1], bs[j-1]
		}
		hs[j], bs[j] = h, b
		c.dups = c.dups || (j > 0 && hs[j-1] == h)
	}
	return c
}

// merge returns the circle of backends bs (sorted by ID) from c, the
// circle of backends prev (sorted by ID), both placed by cfg: c's virtual
// nodes of backends still in bs, renumbered, merged with the new backends'
// (hashed and sorted here). Renumbering keeps the old backends' relative
// order, so the merged circle is sorted by (hash, backend) as newCircle
// sorts it, and equal to it.
func (c *circle) merge(cfg Config, prev, bs []Backend) *circle {
	rf := cfg.ReplicationFactor
	renum := make([]int32, len(prev)) // prev index -> bs index, -1 if gone
	var joined []Backend
	var joinedAt []int32
	left := 0
	for i, j := 0, 0; i < len(prev) || j < len(bs); {
		switch {
		case j == len(bs) || (i < len(prev) && prev[i].ID < bs[j].ID):
			renum[i] = -1
			left++
			i++
		case i == len(prev) || bs[j].ID < prev[i].ID:
			joined = append(joined, bs[j])
			joinedAt = append(joinedAt, int32(j))
			j++
		default:
			renum[i] = int32(j)
			i++
			j++
		}
	}
	fresh := make([]vnode, 0, len(joined)*rf)
	for k, h := range virtualNodes(cfg, joined) {
		fresh = append(fresh, vnode{hash: h, backend: joinedAt[k/rf]})
	}
	slices.SortFunc(fresh, func(x, y vnode) int {
		if x.hash != y.hash {
			return cmp.Compare(x.hash, y.hash)
		}
		return cmp.Compare(x.backend, y.backend)
	})
	n := len(c.hash) - left*rf + len(fresh)
	out := &circle{hash: make([]uint64, n), backend: make([]int32, n)}
	bits := circleBits(n)
	out.shift = 64 - bits
	out.bucket = make([]int32, 1<<bits+1)
	hs, bk, count := out.hash, out.backend, out.bucket
	k, f := 0, 0
	put := func(h uint64, b int32) {
		hs[k], bk[k] = h, b
		count[h>>out.shift+1]++
		k++
	}
	for i, h := range c.hash {
		b := renum[c.backend[i]]
		if b < 0 {
			continue
		}
		for f < len(fresh) && (fresh[f].hash < h || fresh[f].hash == h && fresh[f].backend < b) {
			put(fresh[f].hash, fresh[f].backend)
			f++
		}
		put(h, b)
	}
	for ; f < len(fresh); f++ {
		put(fresh[f].hash, fresh[f].backend)
	}
	for i := 1; i < n; i++ {
		if hs[i] == hs[i-1] {
			out.dups = true
			break
		}
	}
	for b := 1; b < len(count); b++ {
		count[b] += count[b-1]
	}
	return out
}

// circleBits is how many top bits of a hash index a circle of n virtual
// nodes: about one virtual node per bucket, at most 2^20 buckets.
func circleBits(n int) uint {
	bits := uint(1)
	for bits < 20 && 2<<bits < n {
		bits++
	}
	return bits
}

// sortRange sorts virtual nodes lo..hi-1 by (hash, backend).
func (c *circle) sortRange(lo, hi int) {
	vn := make([]vnode, hi-lo)
	for i := range vn {
		vn[i] = vnode{hash: c.hash[lo+i], backend: c.backend[lo+i]}
	}
	slices.SortFunc(vn, func(x, y vnode) int {
		if x.hash != y.hash {
			return cmp.Compare(x.hash, y.hash)
		}
		return cmp.Compare(x.backend, y.backend)
	})
	for i, v := range vn {
		c.hash[lo+i], c.backend[lo+i] = v.hash, v.backend
	}
}

// search returns the index of the first virtual node whose hash is at
// least h, or len(hash) when there is none.
func (c *circle) search(h uint64) int {
	k := h >> c.shift
	lo, hi := int(c.bucket[k]), int(c.bucket[k+1])
	if hi-lo > 8 {
		return lo + sort.Search(hi-lo, func(i int) bool { return c.hash[lo+i] >= h })
	}
	for lo < hi && c.hash[lo] < h {
		lo++
	}
	return lo
}

// starts returns, per partition, the index on the circle where its walk
// starts: the first virtual node whose hash is at least the partition's
// (the hash of its number, uint64 little-endian), wrapping to 0, as
// buraksezer/consistent places it. Owners and overflow orders both walk
// from there.
func (c *circle) starts(cfg Config, parts int) []int32 {
	out := make([]int32, parts)
	var pb [8]byte
	for p := range out {
		binary.LittleEndian.PutUint64(pb[:], uint64(p))
		i := c.search(cfg.Hash(pb[:]))
		if i >= len(c.hash) {
			i = 0
		}
		out[p] = int32(i)
	}
	return out
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
func partitionOwners(cfg Config, bs []Backend, c *circle, starts []int32) ([]int32, error) {
	if len(c.hash) <= libraryMaxVnodes {
		return consistentOwners(cfg, bs, len(starts))
	}
	return circleOwners(cfg, len(bs), c, starts)
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
// as buraksezer/consistent v0.10.0's New does for n members (in backend
// index order), without its cost: the library re-sorts its whole
// virtual-node slice after every member it adds (O(n^2 log n); ~0.5 s at
// 1,000 backends), while the result only depends on the final sorted
// circle. The steps below mirror the library's:
//   - the circle is every virtual-node hash, sorted, duplicates kept; a
//     hash maps to the member inserted last with that hash (its map is
//     overwritten), i.e. the highest backend index;
//   - the bound is ceil(float64(PartitionCount / n) x PartitionLoad), with
//     integer division first;
//   - partition p starts at the first hash >= Hash(uint64 p little-endian),
//     wrapping to 0 (starts), and takes the first member whose count+1 is
//     within the bound, looking at no more than len(circle)-1 entries (the
//     library panics past that; here it is an error).
//
// TestOwnersMatchLibrary compares the two on many sets and configs.
func circleOwners(cfg Config, n int, c *circle, starts []int32) ([]int32, error) {
	// A hash belongs to the member inserted last with it: with equal
	// hashes, every copy maps to the highest backend index, which the sort
	// put last.
	owner := c.backend
	if c.dups {
		owner = slices.Clone(c.backend)
		for i := len(owner) - 2; i >= 0; i-- {
			if c.hash[i+1] == c.hash[i] {
				owner[i] = owner[i+1]
			}
		}
	}
	avg := math.Ceil(float64(len(starts)/n) * cfg.PartitionLoad)
	loads := make([]int, n)
	owners := make([]int32, len(starts))
	for p, start := range starts {
		idx := int(start)
		placed := false
		for count := 1; count < len(owner); count++ {
			b := owner[idx]
			if float64(loads[b]+1) <= avg {
				owners[p] = b
				loads[b]++
				placed = true
				break
			}
			if idx++; idx >= len(owner) {
				idx = 0
			}
		}
		if !placed {
			return nil, fmt.Errorf("%w: cannot place %d backends on %d partitions: %v", ErrConfig, n, len(starts), errNoRoom)
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
func overflowOrders(n int, c *circle, starts []int32, owners []int32, depth int) []int32 {
	order := make([]int32, len(owners)*depth)
	seen := make([]uint32, n) // partition+1 that last saw the backend
	vn := c.backend
	for p, o := range owners {
		row := order[p*depth : (p+1)*depth]
		row[0] = o
		mark := uint32(p + 1)
		seen[o] = mark
		k, i := 1, int(starts[p])
		for steps := 0; k < depth && steps < len(vn); steps++ {
			b := vn[i]
			if seen[b] != mark {
				seen[b] = mark
				row[k] = b
				k++
			}
			if i++; i == len(vn) {
				i = 0
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

// NoLimit is Limit's answer when ConcurrencyThreshold is not set (0).
const NoLimit = math.MaxInt64

// Limit is backend i's concurrency limit: ConcurrencyThreshold x weight,
// or NoLimit when ConcurrencyThreshold is not set.
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
