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
// collects and returns free memory to the system (debug.FreeOSMemory): at
// most once per trimInterval, and only after a burst.

const (
	trimInterval = 5 * time.Second
	trimMinPeak  = 256
)

// trimmer decides when to return memory, from connection counts sampled
// every trimInterval.
type trimmer struct{ peak int64 }

// sample takes the open connection count and reports whether to return
// memory now.
func (t *trimmer) sample(open int64) bool {
	if open > t.peak {
		t.peak = open
		return false
	}
	if t.peak >= trimMinPeak && open <= t.peak/4 {
		t.peak = open
		return true
	}
	return false
}

// startTrimmer runs the memory return until Shutdown.
func (p *Proxy) startTrimmer() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.trimStarted || p.shutdown {
		return
	}
	p.trimStarted = true
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		tick := time.NewTicker(trimInterval)
		defer tick.Stop()
		var t trimmer
		for {
			select {
			case <-p.stop:
				return
			case <-tick.C:
			}
			if t.sample(p.open.Load()) {
				debug.FreeOSMemory()
				p.m.memReturns.Inc()
			}
		}
	}()
}
