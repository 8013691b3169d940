package hot

import (
	"sync"
	"sync/atomic"

	"github.com/warmroute/warmroute/ring"
)

const (
	width = 1 << 13 // counters per row
	mask  = width - 1
	// unit is what one request adds to a count: counts are fixed-point,
	// so that decaying a count of a few requests does not round it away.
	unit = 16
	// minCount is the smallest decayed count that splits a prefix: four
	// requests, about one a rotation in steady state (a router routing a
	// few requests a second still learns within seconds), so that a
	// request or two never splits anything.
	minCount = 4 * unit
	// maxCandidates bounds the prefixes tracked by name.
	maxCandidates = 2048
	// MaxSplits bounds what Rotate proposes.
	MaxSplits = 1024
)

// Counter estimates each prefix key's share of the requests. Add and
// Request may be called concurrently with each other and with Rotate; Rotate
// must not be called concurrently with itself.
type Counter struct {
	rows  [2][width]atomic.Uint32
	total atomic.Uint64 // requests, decayed like the rows
	// trigger is the estimate from which Add remembers a key by name.
	trigger atomic.Uint32

	mu   sync.Mutex
	cand map[uint64]int // key -> depth
}

// New returns an empty Counter.
func New() *Counter {
	c := &Counter{cand: make(map[uint64]int)}
	c.trigger.Store(minCount / 2)
	return c
}

func slots(key uint64) (uint64, uint64) {
	return key & mask, (key>>32 ^ key*0x9e3779b97f4a7c15>>40) & mask
}

// Request counts one routed request: the denominator of every share.
func (c *Counter) Request() { c.total.Add(unit) }

// Add counts one request's prefix key at depth.
func (c *Counter) Add(key uint64, depth int) {
	i, j := slots(key)
	est := min(c.rows[0][i].Add(unit), c.rows[1][j].Add(unit))
	// Remember a key by name once it reaches the trigger, and again every
	// 8 requests past it (a key already above a lowered trigger is caught
	// too); the lock is taken only then.
	if t := c.trigger.Load(); est >= t && (est-t)%(8*unit) < unit {
		c.mu.Lock()
		if _, ok := c.cand[key]; ok || len(c.cand) < maxCandidates {
			c.cand[key] = depth
		}
		c.mu.Unlock()
	}
}

func (c *Counter) estimate(key uint64) uint32 {
	i, j := slots(key)
	return min(c.rows[0][i].Load(), c.rows[1][j].Load())
}

// Rotate returns the splits for a fleet of backends eligible backends,
// given the current ones: the current splits whose share is still at least
// half a backend's fair share, and the prefixes whose share reached a fair
// share. Then it decays every count by a quarter. The result is in
// canonical order and holds at most MaxSplits splits, the shallowest first.
func (c *Counter) Rotate(backends int, cur []ring.Split) []ring.Split {
	backends = max(backends, 1)
	total := c.total.Load()
	split := max(uint64(minCount), total/uint64(backends))
	keep := split / 2
	out := make([]ring.Split, 0, len(cur))
	seen := make(map[uint64]bool, len(cur))
	for _, sp := range cur {
		if uint64(c.estimate(sp.Key)) >= keep {
			out = append(out, sp)
			seen[sp.Key] = true
		}
	}
	c.mu.Lock()
	for k, d := range c.cand {
		est := uint64(c.estimate(k))
		switch {
		case est < keep/2:
			delete(c.cand, k) // cold: forget it
		case !seen[k] && est >= split:
			out = append(out, ring.Split{Key: k, Depth: d})
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
	c.trigger.Store(uint32(min(max(uint64(minCount/2), split/4), 1<<31)))
	ring.SortSplits(out)
	if len(out) > MaxSplits {
		out = out[:MaxSplits]
	}
	return out
}
