package proxy

import (
	"runtime/debug"
	"time"
)

// Returning memory after a burst.
//
// Thousands of streams opened at once leave garbage and goroutine stacks
// behind when they end, and the Go runtime collects only when something
// allocates (or after two minutes): a router that goes quiet after a burst
// would keep its peak memory. So the proxy watches its client connections
// and, when they fell to a quarter of a peak of at least trimMinPeak,
// collects and returns free memory to the system (debug.FreeOSMemory),
// twice: the second collection frees what the first left in sync.Pool
// caches. It does so again trimAgain intervals later, for what was still
// held then (idle server workers exit after 10 s). Only after a burst, and
// at most once per trimInterval.
//
// Large request bodies (body.go) are left to the garbage collector too: when
// at least trimMinBodies of them were held in an interval and a quarter or
// less is held now, the memory is returned the same way.

const (
	trimInterval = 5 * time.Second
	trimMinPeak  = 256
	trimAgain    = 3

	trimMinBodies = 16 << 20
)

// trimmer decides when to return memory, from connection counts sampled
// every trimInterval.
type trimmer struct {
	peak  int64
	again int // intervals until the second return; 0: none due
}

// sample takes the open connection count and reports whether to return
// memory now.
func (t *trimmer) sample(open int64) bool {
	if open > t.peak {
		t.peak, t.again = open, 0
		return false
	}
	if t.peak >= trimMinPeak && open <= t.peak/4 {
		t.peak, t.again = open, trimAgain
		return true
	}
	if t.again > 0 {
		t.again--
		return t.again == 0
	}
	return false
}

// startTrimmer runs the memory return until Shutdown.
func (p *Proxy) startTrimmer() {
	var t trimmer
	p.every(&p.trimStarted, trimInterval, func() {
		_, large := p.bodies.held()
		peak := max(p.bodies.peakLarge.Swap(large), large)
		if t.sample(p.open.Load()) || (peak >= trimMinBodies && large <= peak/4) {
			debug.FreeOSMemory()
			debug.FreeOSMemory()
			p.m.memReturns.Inc()
		}
	})
}
