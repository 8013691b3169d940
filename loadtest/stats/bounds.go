package stats

import (
	"errors"
	"fmt"
	"math"
)

// ErrBadBounds wraps an invalid BoundsConfig.
var ErrBadBounds = errors.New("stats: invalid bounds config")

// DefaultMaxBoundBlocks is the default BoundsConfig.MaxBlocks: 2^21 distinct
// blocks (33.5 M tokens at 16 per block), some 60 MB of bookkeeping.
const DefaultMaxBoundBlocks = 1 << 21

// DefaultBoundLoadFactor is the default BoundsConfig.LoadFactor.
const DefaultBoundLoadFactor = 1.25

// BoundsConfig sizes Bounds.
type BoundsConfig struct {
	// Caches is the number of finite caches of the fleet bound (the
	// fleet's backends), 1-1024.
	Caches int
	// CacheBlocks is the capacity of each in blocks (gpusim --kv-blocks),
	// 1 to 2^24.
	CacheBlocks int
	// BlockTokens is the number of tokens per block (gpusim --block-size).
	BlockTokens int
	// LoadFactor caps each cache's share of the requests at this multiple
	// of the average, as a router's bounded-load placement does (0:
	// DefaultBoundLoadFactor; at least 1). Without a cap, longest-prefix
	// placement sends everything to the first cache holding a prefix all
	// requests share (a system prompt).
	LoadFactor float64
	// MaxBlocks bounds the distinct blocks the infinite cache remembers
	// (0: DefaultMaxBoundBlocks). A run that sends more stops counting
	// there: its result is Truncated and covers the requests before.
	MaxBlocks int
}

// Validate reports the first problem with c.
func (c BoundsConfig) Validate() error {
	switch {
	case c.Caches < 1 || c.Caches > 1024:
		return fmt.Errorf("%w: %d caches (want 1-1024)", ErrBadBounds, c.Caches)
	case c.CacheBlocks < 1 || c.CacheBlocks > 1<<24:
		return fmt.Errorf("%w: %d blocks per cache (want 1-%d)", ErrBadBounds, c.CacheBlocks, 1<<24)
	case c.BlockTokens < 1 || c.BlockTokens > 1<<16:
		return fmt.Errorf("%w: block of %d tokens", ErrBadBounds, c.BlockTokens)
	case c.MaxBlocks < 0:
		return fmt.Errorf("%w: max blocks %d < 0", ErrBadBounds, c.MaxBlocks)
	case c.LoadFactor != 0 && !(c.LoadFactor >= 1 && c.LoadFactor <= 100):
		return fmt.Errorf("%w: load factor %g outside [1, 100]", ErrBadBounds, c.LoadFactor)
	}
	return nil
}

// BoundsResult is what Bounds found. Rates are shares of the measured
// requests' prompt tokens, as the backends' counters give the KV hit rate
// (hit tokens over queried tokens), so the two compare directly.
type BoundsResult struct {
	// HitRate is the infinite cache's: every measured request hits the
	// longest prefix of its block chain that any earlier request sent.
	HitRate float64 `json:"bound_hit_rate"`
	// FleetHitRate is the fleet's: Caches LRU caches of CacheBlocks
	// blocks, every request placed on the one with the longest cached
	// prefix of its chain among those under LoadFactor x the average
	// number of requests.
	FleetHitRate float64 `json:"bound_fleet_hit_rate"`
	Caches       int     `json:"caches"`
	CacheBlocks  int     `json:"cache_blocks"`
	BlockTokens  int     `json:"block_tokens"`
	LoadFactor   float64 `json:"load_factor"`
	// Requests, QueriedTokens, HitTokens and FleetHitTokens count the
	// measured requests; Unmeasured the earlier ones (warm-up) that
	// filled the caches without being counted.
	Requests       int64 `json:"requests"`
	Unmeasured     int64 `json:"unmeasured,omitempty"`
	QueriedTokens  int64 `json:"queried_tokens"`
	HitTokens      int64 `json:"hit_tokens"`
	FleetHitTokens int64 `json:"fleet_hit_tokens"`
	// DistinctBlocks counts the different blocks of all requests: the
	// working set, in blocks of BlockTokens.
	DistinctBlocks int64 `json:"distinct_blocks"`
	// Skipped counts requests whose blocks could not be computed (not a
	// prompt gpusim would accept) or that came after truncation.
	Skipped int64 `json:"skipped,omitempty"`
	// Truncated is set when the distinct blocks reached MaxBlocks: the
	// requests after were not counted.
	Truncated bool `json:"truncated,omitempty"`
}

// Bounds computes two offline references for a KV-cache hit rate from the
// block chains of the requests a run sent, in the order it sent them:
//
//   - an infinite cache (the strict bound: no placement and no memory
//     limit can do better on this request order, as long as each request
//     only finds blocks of requests sent before it);
//   - a fleet of Caches finite LRU caches of CacheBlocks blocks each,
//     where every request goes to the cache holding the longest prefix of
//     its chain among the caches that have received fewer than
//     ceil(LoadFactor x (requests so far + 1) / Caches) requests (ties:
//     the cache that least recently received a request, then the lowest
//     index). It is what perfect prefix affinity with balanced load
//     reaches with the fleet's real memory, and a reference rather than a
//     strict bound: LRU and greedy placement are not optimal.
//
// A request hits at most (tokens-1)/BlockTokens blocks, as in vLLM and
// gpusim, where the last prompt token is always computed. After a request
// its blocks are the most recently used of its cache, its first block
// most of all (gpusim and vLLM free a finished request's blocks last one
// first, so deeper blocks are evicted first). Requests are instantaneous:
// blocks of requests still running do not take room.
//
// Bounds is not safe for concurrent use.
type Bounds struct {
	cfg    BoundsConfig
	seen   map[uint64]struct{}
	caches []*lruBlocks
	used   []uint64 // logical time each cache last received a request
	load   []int64  // requests each cache received
	clock  uint64
	res    BoundsResult
}

// NewBounds returns empty caches sized by c.
func NewBounds(c BoundsConfig) (*Bounds, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	if c.MaxBlocks == 0 {
		c.MaxBlocks = DefaultMaxBoundBlocks
	}
	if c.LoadFactor == 0 {
		c.LoadFactor = DefaultBoundLoadFactor
	}
	b := &Bounds{
		cfg:    c,
		seen:   make(map[uint64]struct{}),
		caches: make([]*lruBlocks, c.Caches),
		used:   make([]uint64, c.Caches),
		load:   make([]int64, c.Caches),
		res:    BoundsResult{Caches: c.Caches, CacheBlocks: c.CacheBlocks, BlockTokens: c.BlockTokens, LoadFactor: c.LoadFactor},
	}
	for i := range b.caches {
		b.caches[i] = newLRUBlocks(c.CacheBlocks)
	}
	return b, nil
}

// Add accounts one request: chain holds the chained hashes of its prompt's
// full blocks, in order, and tokens its prompt length. Unmeasured requests
// (warm-up) fill the caches but are not counted.
func (b *Bounds) Add(chain []uint64, tokens int, measured bool) {
	if b.res.Truncated {
		b.res.Skipped++
		return
	}
	if len(b.seen)+len(chain) > b.cfg.MaxBlocks {
		fresh := 0
		for _, h := range chain {
			if _, ok := b.seen[h]; !ok {
				fresh++
			}
		}
		if len(b.seen)+fresh > b.cfg.MaxBlocks {
			b.res.Truncated = true
			b.res.Skipped++
			return
		}
	}
	limit := 0
	if tokens > 0 {
		limit = min(len(chain), (tokens-1)/b.cfg.BlockTokens)
	}
	inf := 0
	for inf < limit {
		if _, ok := b.seen[chain[inf]]; !ok {
			break
		}
		inf++
	}
	// The least loaded cache is always under the cap: it is at most the
	// average, below ceil(LoadFactor x (clock + 1) / Caches).
	limitLoad := int64(math.Ceil(b.cfg.LoadFactor * float64(b.clock+1) / float64(len(b.caches))))
	best, bestHit := -1, -1
	for i, c := range b.caches {
		if b.load[i] >= limitLoad {
			continue
		}
		h := c.prefix(chain, limit)
		if h > bestHit || h == bestHit && b.used[i] < b.used[best] {
			best, bestHit = i, h
		}
	}
	b.clock++
	b.used[best] = b.clock
	b.load[best]++
	b.caches[best].touch(chain)
	for _, h := range chain {
		b.seen[h] = struct{}{}
	}
	b.res.DistinctBlocks = int64(len(b.seen))
	if !measured {
		b.res.Unmeasured++
		return
	}
	b.res.Requests++
	b.res.QueriedTokens += int64(tokens)
	b.res.HitTokens += int64(inf * b.cfg.BlockTokens)
	b.res.FleetHitTokens += int64(bestHit * b.cfg.BlockTokens)
}

// Skip counts a request whose chain could not be computed.
func (b *Bounds) Skip() { b.res.Skipped++ }

// Result returns the bounds of the requests added so far.
func (b *Bounds) Result() BoundsResult {
	r := b.res
	r.HitRate = rate(float64(r.HitTokens), float64(r.QueriedTokens))
	r.FleetHitRate = rate(float64(r.FleetHitTokens), float64(r.QueriedTokens))
	return r
}

// lruBlocks is a set of at most capacity block hashes that forgets the
// least recently used first.
type lruBlocks struct {
	capacity   int
	m          map[uint64]*lruNode
	head, tail *lruNode // head: least recently used
}

type lruNode struct {
	hash       uint64
	prev, next *lruNode
}

func newLRUBlocks(capacity int) *lruBlocks {
	return &lruBlocks{capacity: capacity, m: make(map[uint64]*lruNode)}
}

// prefix returns how many leading hashes of chain are held, at most limit.
func (c *lruBlocks) prefix(chain []uint64, limit int) int {
	n := 0
	for n < limit {
		if _, ok := c.m[chain[n]]; !ok {
			break
		}
		n++
	}
	return n
}

// touch makes every hash of chain held and recently used, the first most
// recently, evicting the least recently used beyond capacity.
func (c *lruBlocks) touch(chain []uint64) {
	for i := len(chain) - 1; i >= 0; i-- {
		h := chain[i]
		if n, ok := c.m[h]; ok {
			c.unlink(n)
			c.push(n)
			continue
		}
		var n *lruNode
		if len(c.m) >= c.capacity {
			n = c.head
			c.unlink(n)
			delete(c.m, n.hash)
		} else {
			n = new(lruNode)
		}
		n.hash = h
		c.m[h] = n
		c.push(n)
	}
}

func (c *lruBlocks) push(n *lruNode) {
	n.prev, n.next = c.tail, nil
	if c.tail != nil {
		c.tail.next = n
	} else {
		c.head = n
	}
	c.tail = n
}

func (c *lruBlocks) unlink(n *lruNode) {
	if n.prev != nil {
		n.prev.next = n.next
	} else {
		c.head = n.next
	}
	if n.next != nil {
		n.next.prev = n.prev
	} else {
		c.tail = n.prev
	}
	n.prev, n.next = nil, nil
}
