package cluster

import (
	"context"
	"sync"
	"time"
)

// ReportHealth records one health observation of a backend by reporter (a
// node name: the node's own probes, or another node's passive report
// carried by gossip). Only the leader acts on reports; elsewhere this is a
// cheap no-op. It never blocks: commits happen on the leader loop.
//
// Each reporter sees a backend as unhealthy after HealthFailThreshold
// consecutive failures and healthy again after HealthRiseThreshold
// consecutive successes. The leader commits the backend down when most
// reporters with a recent report see it unhealthy, and active again when
// most see it healthy; it never overrides a state an operator set
// (draining, or down by admin).
func (c *Agreement) ReportHealth(backend string, ok bool, reporter string) {
	if !c.IsLeader() || c.closed.Load() {
		return
	}
	b, known := c.fsm.load().state.Backend(backend)
	if !known {
		return
	}
	if c.health.report(backend, reporter, ok, b.State == StateDown, time.Now()) {
		wake(c.healthWake)
	}
}

// ReportVerdict records reporter's own verdict on backend, reached with
// the reporter's own thresholds: another node's health checks and passive
// ejections, carried to the leader by gossip. Unlike ReportHealth it sets
// the reporter's verdict directly instead of counting observations, and
// refreshes it, so callers repeat it at least every HealthReportTTL. Only
// the leader acts on it; it never blocks.
func (c *Agreement) ReportVerdict(backend, reporter string, unhealthy bool) {
	if !c.IsLeader() || c.closed.Load() {
		return
	}
	if _, known := c.fsm.load().state.Backend(backend); !known {
		return
	}
	if c.health.set(backend, reporter, unhealthy, time.Now()) {
		wake(c.healthWake)
	}
}

// commitHealth commits the state changes the health reports call for.
func (c *Agreement) commitHealth(ctx context.Context) {
	now := time.Now()
	st := c.fsm.load().state
	c.health.prune(&st, now)
	for _, b := range st.Backends {
		var to string
		switch c.health.verdict(b.ID, now) {
		case verdictDown:
			if b.State == StateActive {
				to = StateDown
			}
		case verdictUp:
			if b.State == StateDown && b.StateBy == ByHealth {
				to = StateActive
			}
		}
		if to == "" {
			continue
		}
		cmd := Command{Op: OpSetBackendState, ID: b.ID, State: to, By: ByHealth}
		if _, err := c.write(ctx, cmd); err != nil {
			c.log.Warn("health commit failed", "backend", b.ID, "to", to, "err", err)
			return
		}
		c.met.healthCommits.WithLabelValues(to).Inc()
		c.log.Info("backend health committed", "backend", b.ID, "state", to)
	}
}

type verdict int

const (
	verdictNone verdict = iota
	verdictDown
	verdictUp
)

// healthTracker holds, per backend and reporter, a hysteresis verdict.
type healthTracker struct {
	fail, rise int
	ttl        time.Duration

	mu       sync.Mutex
	backends map[string]map[string]*reporterState
}

type reporterState struct {
	fails, oks int
	unhealthy  bool
	last       time.Time
}

func newHealthTracker(fail, rise int, ttl time.Duration) *healthTracker {
	return &healthTracker{fail: fail, rise: rise, ttl: ttl, backends: map[string]map[string]*reporterState{}}
}

// reporters returns backend's reporters, adding an empty set for a
// backend not seen yet. The caller holds h.mu.
func (h *healthTracker) reporters(backend string) map[string]*reporterState {
	rs := h.backends[backend]
	if rs == nil {
		rs = map[string]*reporterState{}
		h.backends[backend] = rs
	}
	return rs
}

// report records one observation and reports whether the reporter's
// verdict flipped. A reporter's first verdict is the backend's current
// health (down or not), so a new leader keeps the hysteresis.
func (h *healthTracker) report(backend, reporter string, ok, down bool, now time.Time) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	rs := h.reporters(backend)
	r := rs[reporter]
	if r == nil {
		r = &reporterState{unhealthy: down}
		rs[reporter] = r
	}
	r.last = now
	was := r.unhealthy
	if ok {
		r.fails = 0
		r.oks++
		if r.unhealthy && r.oks >= h.rise {
			r.unhealthy = false
		}
	} else {
		r.oks = 0
		r.fails++
		if !r.unhealthy && r.fails >= h.fail {
			r.unhealthy = true
		}
	}
	return was != r.unhealthy
}

// set records a reporter's verdict as it is and reports whether it
// flipped or is the reporter's first (either can change the majority).
func (h *healthTracker) set(backend, reporter string, unhealthy bool, now time.Time) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	rs := h.reporters(backend)
	r, seen := rs[reporter]
	if !seen {
		r = &reporterState{}
		rs[reporter] = r
	}
	r.last = now
	r.fails, r.oks = 0, 0
	was := r.unhealthy
	r.unhealthy = unhealthy
	return !seen || was != unhealthy
}

// verdict is the majority of fresh reporters' verdicts.
func (h *healthTracker) verdict(backend string, now time.Time) verdict {
	h.mu.Lock()
	defer h.mu.Unlock()
	fresh, bad := 0, 0
	for _, r := range h.backends[backend] {
		if now.Sub(r.last) > h.ttl {
			continue
		}
		fresh++
		if r.unhealthy {
			bad++
		}
	}
	switch {
	case fresh == 0:
		return verdictNone
	case 2*bad > fresh:
		return verdictDown
	case 2*(fresh-bad) > fresh:
		return verdictUp
	}
	return verdictNone
}

// reset forgets everything (a new term of leadership starts afresh).
func (h *healthTracker) reset() {
	h.mu.Lock()
	defer h.mu.Unlock()
	clear(h.backends)
}

// prune forgets backends that no longer exist and reporters silent for
// longer than the TTL.
func (h *healthTracker) prune(st *State, now time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for id, rs := range h.backends {
		if _, ok := st.Backend(id); !ok {
			delete(h.backends, id)
			continue
		}
		for name, r := range rs {
			if now.Sub(r.last) > h.ttl {
				delete(rs, name)
			}
		}
	}
}
