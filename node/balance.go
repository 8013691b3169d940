package node

import (
	"context"
	"math"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/warmroute/warmroute/node/cluster"
	"github.com/warmroute/warmroute/proxy"
	"github.com/warmroute/warmroute/ring"
)

const (
	// balancePeriod is how often the leader's balancer looks at traffic.
	balancePeriod = time.Second
	// balanceSlack: the busiest and the least busy backend may differ by
	// 2 x (balanceSlack - 1) x the mean share of requests.
	balanceSlack = 1.1
	// balanceMinCount is the least traffic (decayed request count) the
	// balancer acts on: below it shares are noise.
	balanceMinCount = 30
	// balanceMovesPerRound bounds the partitions moved per period, so a
	// burst cannot reshuffle many caches at once.
	balanceMovesPerRound = 4
	// partsMaxAge: other routers' partition counts older than this (two
	// missed periods) are not added.
	partsMaxAge = 2*balancePeriod + balancePeriod/2
	// partsPublishMin is the least count a router publishes for a
	// partition: an eighth of a request, which a partition that saw one
	// request keeps for about 35 s of decay (1/16 a period). A higher floor
	// made a quiet key's partition drop out of other routers' counts a
	// second after its request, so the leader saw it cold and sent its
	// moved keys home, to move them again a few seconds later, recomputing
	// their prefixes each time.
	partsPublishMin = proxy.PartitionUnit / 8
	// balanceKeepCold is how long a moved partition must carry no traffic
	// before its move is dropped: a conversation pausing between turns
	// keeps its new owner.
	balanceKeepCold = 30 * time.Second
	// A backend is pressed when it showed more work than it runs at once
	// (see pressure) in balancePressedSamples of the balancer's samples (one
	// a period) within balancePressedFor: three of the last ten seconds. The
	// demo's chat workload showed one such sample every few runs, which
	// moved conversations (their prefixes recomputed) for no gain.
	balancePressedFor     = 10 * time.Second
	balancePressedSamples = 3
)

// balance evens out PREFIX_AWARE traffic every balancePeriod until ctx
// ends. Consistent hashing gives each backend an equal share of
// partitions, not of traffic: a few busy conversations or documents landing
// together make one backend take far more than its share. The leader counts
// requests per partition (the proxy's PartitionLoads) and, while the
// busiest and the least busy active backends differ clearly (see
// planMoves), hands the busiest one's busiest partition that fits (at most
// half the gap) to the least busy one.
// Moves are committed through Raft (set_moves), so every router routes the
// moved keys alike from the same epoch; a moved key recomputes its prefix
// once, where an overflowing one would recompute it again and again.
// Moves of partitions that carried nothing for a while are dropped.
//
// A move pays only where the busiest backend is pressed: its engine queued
// requests, or the cluster had as many in flight on it as its limit, in
// three of the last ten seconds. Until then an uneven share costs no request
// any time (every engine starts each request at once) while every move
// costs its keys a recomputed prefix, so a fleet with headroom keeps its
// caches where they are. And it pays only onto a backend that had room in
// every one of those samples: moving onto one that queued too shifts a
// queue and adds the moved keys' prefills to it.
//
// Every router publishes its busiest partitions through gossip once a
// period (gossip.Mesh.PublishPartitions), and the leader adds them to its
// own counts: it decides from the whole cluster's traffic, not from the
// share the load balancer happens to send it, so a balancer behind N
// routers sees N times the sample and acts N times sooner.
func (n *Node) balance(ctx context.Context) {
	t := time.NewTicker(balancePeriod)
	defer t.Stop()
	moved := register(n.reg, prometheus.NewCounter(prometheus.CounterOpts{Namespace: "warmroute", Subsystem: "partition",
		Name: "moves_total",
		Help: "Partitions the leader's balancer handed to a new owner (each costs its keys a recomputed prefix), counted when committed."}))
	var (
		buf    []uint32
		remote []uint64
		cold   = coldMoves{}
		press  = newPressure(balancePressedFor, balancePressedSamples)
	)
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		var r *ring.Ring
		buf, r = n.proxy.PartitionLoads(buf)
		now := time.Now()
		press.sample(n.proxy.Status(), now)
		// Balancing comes with ADAPTIVE keys: a state written by an earlier
		// version (FIXED) never gets set_moves entries, which routers of
		// that version could not apply, until an operator opts in.
		if !r.Config().Adaptive() || len(buf) == 0 {
			continue
		}
		if n.gossip != nil {
			n.gossip.PublishPartitions(buf, partsPublishMin)
		}
		if !n.agree.IsLeader() {
			clear(cold) // a new term starts its clocks afresh
			continue
		}
		st, _ := n.agree.State()
		if !st.Seeded {
			continue
		}
		if n.gossip != nil {
			remote = slices.Grow(remote[:0], len(buf))[:len(buf)]
			clear(remote)
			if n.gossip.PartitionLoads(remote, partsMaxAge) > 0 {
				for i, c := range remote {
					buf[i] = uint32(min(uint64(buf[i])+c, math.MaxUint32))
				}
			}
		}
		cold.update(st.Moves, buf, now)
		next := planMoves(r, buf, st.Moves, moveGates{
			stale:   func(p int) bool { return cold.stale(p, now) },
			pressed: func(b int) bool { return press.pressed(r.Backend(b).ID) },
			calm:    func(b int) bool { return press.calm(r.Backend(b).ID) },
		})
		if slices.Equal(next, st.Moves) || (len(next) == 0 && len(st.Moves) == 0) {
			continue
		}
		actx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := n.agree.Apply(actx, cluster.SetMoves(next))
		cancel()
		if err != nil && ctx.Err() == nil {
			n.log.Debug("committing partition moves", "moves", len(next), "err", err)
		} else if err == nil {
			fresh := newMoves(st.Moves, next)
			moved.Add(float64(fresh))
			n.log.Info("partition moves committed", "moves", len(next), "was", len(st.Moves), "new", fresh)
		}
	}
}

// newMoves counts the moves in next that cur does not hold: partitions
// given an owner they did not have.
func newMoves(cur, next []ring.Move) int {
	had := make(map[ring.Move]struct{}, len(cur))
	for _, m := range cur {
		had[m] = struct{}{}
	}
	n := 0
	for _, m := range next {
		if _, ok := had[m]; !ok {
			n++
		}
	}
	return n
}

// coldMoves remembers since when each moved partition has carried no
// traffic in the cluster's counts.
type coldMoves map[int]time.Time

// update starts the clock of each move in moves whose partition counts
// nothing in loads, stops it for the others, and forgets partitions no
// longer moved.
func (c coldMoves) update(moves []ring.Move, loads []uint32, now time.Time) {
	live := make(map[int]bool, len(moves))
	for _, m := range moves {
		live[m.Partition] = true
		if m.Partition < len(loads) && loads[m.Partition] != 0 {
			delete(c, m.Partition)
		} else if _, ok := c[m.Partition]; !ok {
			c[m.Partition] = now
		}
	}
	for p := range c {
		if !live[p] {
			delete(c, p)
		}
	}
}

// stale reports whether partition p's move has carried nothing for
// balanceKeepCold.
func (c coldMoves) stale(p int, now time.Time) bool {
	t, ok := c[p]
	return ok && now.Sub(t) >= balanceKeepCold
}

// pressure remembers when each backend showed more work than it runs at
// once (proxy.BackendStatus.Pressed: its engine queued, or the cluster's
// in-flight count reached its limit or learned capacity), and calls it
// pressed when that was so in need of the samples within window.
type pressure struct {
	window time.Duration
	need   int
	at     map[string][]time.Time
	// first and last are the times of the first and the latest sample.
	first, last time.Time
}

func newPressure(window time.Duration, need int) *pressure {
	return &pressure{window: window, need: need, at: map[string][]time.Time{}}
}

// sample records the backends pressed in st at now, and forgets what is
// older than the window.
func (p *pressure) sample(st []proxy.BackendStatus, now time.Time) {
	if p.first.IsZero() {
		p.first = now
	}
	p.last = now
	for _, b := range st {
		if b.Pressed || b.Busy || (b.Limit > 0 && b.InFlight+b.RemoteInFlight >= b.Limit) {
			p.at[b.ID] = append(p.at[b.ID], now)
		}
	}
	for id, ts := range p.at {
		i := 0
		for i < len(ts) && now.Sub(ts[i]) >= p.window {
			i++
		}
		if i == len(ts) {
			delete(p.at, id)
		} else if i > 0 {
			p.at[id] = append(ts[:0], ts[i:]...)
		}
	}
}

// pressed reports whether backend id was pressed in at least need samples
// within the window: a queue that lasts, not one burst.
func (p *pressure) pressed(id string) bool {
	return len(p.at[id]) >= p.need
}

// calm reports whether backend id was pressed in none of the samples
// within the window, and the samples span the whole window: it had room
// all along. (A fleet that has just started, or a router that has just
// come up, has not watched long enough to call any backend calm: at the
// start of a run its first seconds' splits are still coming and every
// backend that has not queued yet would pass.)
func (p *pressure) calm(id string) bool {
	return !p.first.IsZero() && p.last.Sub(p.first) >= p.window && len(p.at[id]) == 0
}

// moveGates say which partitions and backends a balancing round may
// move, by ring index.
type moveGates struct {
	// stale reports the moved partitions that have been cold long enough
	// to go home.
	stale func(p int) bool
	// pressed reports the backends that recently had more work than they
	// run at once: only those give partitions away.
	pressed func(b int) bool
	// calm reports the backends that had room all along lately: only
	// those take partitions. A backend that queued too, even briefly,
	// would queue the moved keys' requests besides recomputing their
	// prefixes: on a fleet where bursts queue every backend now and then
	// (Mooncake's conversation trace at the load that keeps it busy),
	// moving onto any of them cost a point of hit rate and bought no
	// TTFT.
	calm func(b int) bool
}

// planMoves returns the moves after one balancing round on ring r (which
// has cur applied) with per-partition request counts loads, in
// proxy.PartitionUnit per request, under gates g.
func planMoves(r *ring.Ring, loads []uint32, cur []ring.Move, g moveGates) []ring.Move {
	next := make([]ring.Move, 0, len(cur)+balanceMovesPerRound)
	at := make(map[int]int, len(cur)) // partition -> index in next
	for _, m := range cur {
		b, ok := r.Index(m.Backend)
		if !ok || r.Backend(b).State != ring.Active || m.Partition >= len(loads) || g.stale(m.Partition) {
			continue // gone, drained, or cold for long: let it go home
		}
		at[m.Partition] = len(next)
		next = append(next, m)
	}
	load := make([]uint64, r.Len())
	var total uint64
	active := 0
	for b := range r.Backends() {
		if r.Backend(b).State == ring.Active {
			active++
		}
	}
	for p, c := range loads {
		if c == 0 {
			continue
		}
		o := r.Order(p)[0]
		load[o] += uint64(c)
		total += uint64(c)
	}
	if active < 2 || total < balanceMinCount*proxy.PartitionUnit {
		return next
	}
	mean := float64(total) / float64(active)
	// The noise of a count of requests, in the loads' unit.
	noise := 2 * math.Sqrt(2*mean/proxy.PartitionUnit) * proxy.PartitionUnit
	owner := make([]int32, len(loads)) // owner after this round's moves
	for p := range loads {
		owner[p] = r.Order(p)[0]
	}
	for k := 0; k < balanceMovesPerRound; k++ {
		hot, cold := -1, -1
		for b := range load {
			if r.Backend(b).State != ring.Active {
				continue
			}
			if hot < 0 || load[b] > load[hot] {
				hot = b
			}
			if g.calm(b) && (cold < 0 || load[b] < load[cold]) {
				cold = b
			}
		}
		if cold < 0 {
			break // every backend queued lately: a move only shifts a queue
		}
		// The busiest and the least busy differ by more than the slack
		// and clearly so (two standard deviations of the difference of two
		// Poisson counts at the mean), so that a small sample's noise moves
		// little.
		if gap := float64(load[hot]) - float64(load[cold]); gap <= max(2*(balanceSlack-1)*mean, noise) {
			break
		}
		if !g.pressed(hot) {
			break // the busiest keeps up: moving would only cost prefixes
		}
		budget := (load[hot] - load[cold]) / 2
		best, bestC := -1, uint64(0)
		for p, c := range loads {
			if owner[p] == int32(hot) && uint64(c) <= budget && uint64(c) > bestC {
				best, bestC = p, uint64(c)
			}
		}
		if best < 0 {
			break
		}
		load[hot] -= bestC
		load[cold] += bestC
		owner[best] = int32(cold)
		m := ring.Move{Partition: best, Backend: r.Backends()[cold].ID}
		if i, ok := at[best]; ok {
			next[i] = m
		} else {
			at[best] = len(next)
			next = append(next, m)
		}
	}
	if len(next) > ring.MaxMoves {
		next = next[:ring.MaxMoves]
	}
	ring.SortMoves(next)
	return next
}
