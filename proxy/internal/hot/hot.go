package hot

import (
	"cmp"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/warmroute/warmroute/ring"
)

const (
	width = 1 << 13 // counters per row
	mask  = width - 1
	// Unit is what one request adds to a count: counts are fixed-point,
	// so that decaying a count of a few requests does not round it away.
	Unit = 16
	// minCount is the smallest decayed count a Counter reports a prefix
	// at: one request. Its reports are candidates, not splits: the leader
	// adds up every router's counts and splits only a prefix whose owner
	// is pressed (node/splits.go), so a router that sees a prefix at one
	// request a second, an eighth of a fleet behind eight routers, still
	// counts.
	minCount = Unit
	// maxCandidates bounds the prefixes tracked by name.
	maxCandidates = 2048
	// MaxReport bounds what Rotate reports.
	MaxReport = 1024
)

// Candidate is a prefix a Counter reports: its key and depth, its decayed
// request count (in Unit per request) and the ring partition its requests
// were last routed on.
type Candidate struct {
	Key   uint64
	Depth int
	Count uint64
	Part  uint32
}

// cand is what the Counter remembers of a prefix by name.
type cand struct {
	depth int
	part  uint32
}

// Counter estimates each prefix key's share of the requests. Add and
// Request may be called concurrently with each other and with Rotate; Rotate
// must not be called concurrently with itself.
type Counter struct {
	rows  [2][width]atomic.Uint32
	total atomic.Uint64 // requests, decayed like the rows
	// trigger is the estimate from which Add remembers a key by name.
	trigger atomic.Uint32

	mu   sync.Mutex
	cand map[uint64]cand
}

// New returns an empty Counter.
func New() *Counter {
	c := &Counter{cand: make(map[uint64]cand)}
	c.trigger.Store(minCount)
	return c
}

func slots(key uint64) (uint64, uint64) {
	return key & mask, (key>>32 ^ key*0x9e3779b97f4a7c15>>40) & mask
}

// Request counts one routed request: the denominator of every share.
func (c *Counter) Request() { c.total.Add(Unit) }

// Add counts one request's prefix key at depth; part is the ring partition
// the request routes on.
func (c *Counter) Add(key uint64, depth int, part uint32) {
	i, j := slots(key)
	est := min(c.rows[0][i].Add(Unit), c.rows[1][j].Add(Unit))
	// Remember a key by name once it reaches the trigger, and again every
	// 8 requests past it (a key already above a lowered trigger is caught
	// too); the lock is taken only then.
	if t := c.trigger.Load(); est >= t && (est-t)%(8*Unit) < Unit {
		c.mu.Lock()
		if _, ok := c.cand[key]; ok || len(c.cand) < maxCandidates {
			c.cand[key] = cand{depth: depth, part: part}
		}
		c.mu.Unlock()
	}
}

func (c *Counter) estimate(key uint64) uint32 {
	i, j := slots(key)
	return min(c.rows[0][i].Load(), c.rows[1][j].Load())
}

// Rotate closes a counting period on a fleet of backends eligible
// backends, given the splits in use, cur. It returns the requests counted
// (decayed, in Unit per request) and the candidates: every prefix of cur
// still counted, with its count, and every other prefix whose share of
// the requests reached a backend's fair share (1/backends) and at least
// one request. Then it decays every count by a quarter. The candidates
// are the busiest first, at most MaxReport.
func (c *Counter) Rotate(backends int, cur []ring.Split) (uint64, []Candidate) {
	backends = max(backends, 1)
	total := c.total.Load()
	share := max(uint64(minCount), total/uint64(backends))
	out := make([]Candidate, 0, len(cur))
	seen := make(map[uint64]bool, len(cur))
	c.mu.Lock()
	for _, sp := range cur {
		if est := uint64(c.estimate(sp.Key)); est > 0 {
			out = append(out, Candidate{Key: sp.Key, Depth: sp.Depth, Count: est, Part: c.cand[sp.Key].part})
			seen[sp.Key] = true
		}
	}
	for k, cd := range c.cand {
		est := uint64(c.estimate(k))
		switch {
		case est < share/4:
			delete(c.cand, k) // cold: forget it
		case !seen[k] && est >= share:
			out = append(out, Candidate{Key: k, Depth: cd.depth, Count: est, Part: cd.part})
			seen[k] = true
		}
	}
	c.mu.Unlock()
	// Decay by a quarter: an Add racing with this may lose its count,
	// which an estimate can afford.
	for r := range c.rows {
		for i := range c.rows[r] {
			if v := c.rows[r][i].Load(); v != 0 {
				c.rows[r][i].Store(v - (v+3)/4)
			}
		}
	}
	c.total.Store(total - (total+3)/4)
	c.trigger.Store(uint32(min(max(uint64(minCount), share/4), 1<<31)))
	slices.SortFunc(out, func(a, b Candidate) int {
		switch {
		case a.Count != b.Count:
			return cmp.Compare(b.Count, a.Count)
		case a.Depth != b.Depth:
			return a.Depth - b.Depth
		}
		return cmp.Compare(a.Key, b.Key)
	})
	if len(out) > MaxReport {
		out = out[:MaxReport]
	}
	return total, out
}
