package node

import (
	"cmp"
	"context"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/warmroute/warmroute/gossip"
	"github.com/warmroute/warmroute/node/cluster"
	"github.com/warmroute/warmroute/proxy"
	"github.com/warmroute/warmroute/ring"
)

const (
	// splitPeriod is how often a router closes a counting period of its
	// hot prefixes (the proxy's counts decay by a quarter each time, so
	// they follow about the last two seconds of traffic).
	splitPeriod = 500 * time.Millisecond
	// hotMaxAge is how long the leader counts what another router
	// published: four counting periods, so a lost publish or two changes
	// nothing, and a router that stops calling for a prefix is forgotten
	// within two seconds.
	hotMaxAge = 4 * splitPeriod
	// splitMinCount is the least traffic, added up over the routers, that
	// a new split needs: four requests (decayed), so that a request or two
	// never splits anything.
	splitMinCount = 4 * proxy.HotUnit
	// A prefix's owner is pressed for a split when it was pressed (see
	// proxy.BackendStatus.Pressed) in splitPressedSamples of the samples
	// (one a period) within splitPressedFor: a queue that lasts a second,
	// not one scrape's blip.
	splitPressedFor     = 2 * time.Second
	splitPressedSamples = 2
	// splitMinLife is the least time a split lasts, and splitCooldown the
	// least time before a prefix whose split ended is split again: a
	// prefix flips between its owner and the fleet at most once in
	// splitMinLife + splitCooldown, whoever asks.
	splitMinLife  = 10 * time.Second
	splitCooldown = 10 * time.Second
	// splitCalm is how long a split prefix's demand must fit its owner
	// (see planSplits) before the split ends.
	splitCalm = 10 * time.Second
	// splitNewPerRouter bounds the new splits one router's claims may
	// start in one commit, and splitNewPerCommit all of them.
	splitNewPerRouter = 8
	splitNewPerCommit = 32
	// splitCommitGap is the least time between two set_splits commits.
	splitCommitGap = time.Second
)

// learnSplits closes a counting period every splitPeriod until ctx ends.
// Every router shares the candidates its own traffic shows (hot prefixes
// with their counts) through gossip; the leader adds them up with its own
// and commits the splits planSplits keeps and starts, at most once every
// splitCommitGap. A prefix is split only while its owner is pressed: an
// uneven share of a fleet with room costs nothing, while a split scatters
// the prefix's continuations and their caches. Every router installs the
// agreed splits when it applies them (applyAgreed), so all route on the
// same splits from the same epoch.
func (n *Node) learnSplits(ctx context.Context) {
	t := time.NewTicker(splitPeriod)
	defer t.Stop()
	var (
		hot        []gossip.HotPrefix
		reports    []gossip.HotReport
		press      = newPressure(splitPressedFor, splitPressedSamples)
		plan       = newSplitPlanner()
		lastCommit time.Time
	)
	refused := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "warmroute", Subsystem: "prefix_splits",
		Name: "refused_total",
		Help: "Prefixes with enough traffic for a split that the leader left whole, by reason (not_pressed: the owner keeps up; not_carried: only routers whose published request counts do not carry them claimed them; budget: over a router's or a commit's new splits; cooldown: a split of it ended within 10 s), counted once per planning round."},
		[]string{"reason"})
	refused = register(n.reg, refused)
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		r, _ := n.proxy.Ring()
		total, own := n.proxy.HotPrefixes()
		now := time.Now()
		status := n.proxy.Status()
		press.sample(status, now)
		if !r.Config().Adaptive() {
			continue
		}
		if n.gossip != nil {
			hot = toHot(hot[:0], own)
			n.gossip.PublishHot(total, r.Partitions(), hot)
		}
		if !n.agree.IsLeader() {
			plan.reset() // a new term starts its clocks afresh
			continue
		}
		st, _ := n.agree.State()
		if !st.Seeded || now.Sub(lastCommit) < splitCommitGap {
			continue
		}
		reports = append(reports[:0], gossip.HotReport{Node: "", Total: total, Partitions: uint64(r.Partitions()), Prefixes: toHot(nil, own)})
		if n.gossip != nil {
			reports = n.gossip.HotReports(reports, hotMaxAge, partsMaxAge)
		}
		in := splitInput{ring: r, cur: st.Splits, reports: reports, status: status,
			pressed: func(id string) bool { return press.pressed(id) }}
		next := plan.plan(in, now)
		for reason, k := range plan.refused {
			refused.WithLabelValues(reason).Add(float64(k))
		}
		if slices.Equal(st.Splits, next) || (len(st.Splits) == 0 && len(next) == 0) {
			continue
		}
		actx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := n.agree.Apply(actx, cluster.SetSplits(next))
		cancel()
		if err != nil {
			plan.reset() // not committed: forget what this round decided
			if ctx.Err() == nil {
				n.log.Debug("committing prefix splits", "splits", len(next), "err", err)
			}
			continue
		}
		lastCommit = now
		n.log.Info("prefix splits committed", "splits", len(next), "was", len(st.Splits))
	}
}

// toHot appends list to dst as gossip's hot prefixes.
func toHot(dst []gossip.HotPrefix, list []proxy.HotPrefix) []gossip.HotPrefix {
	for _, h := range list {
		dst = append(dst, gossip.HotPrefix{Key: h.Key, Depth: uint32(h.Depth), Count: h.Count, Part: h.Part})
	}
	return dst
}

// splitInput is what one round of planSplits looks at.
type splitInput struct {
	ring *ring.Ring
	cur  []ring.Split
	// reports are the routers' candidates: the leader's own first (Node
	// ""), then the others' (gossip.Mesh.HotReports).
	reports []gossip.HotReport
	// status is the leader's view of the backends (proxy.Status).
	status []proxy.BackendStatus
	// pressed reports whether a backend has been pressed lately.
	pressed func(id string) bool
}

// splitPlanner keeps the clocks of the leader's splits between rounds.
type splitPlanner struct {
	added map[uint64]time.Time // when each split was started (or first seen)
	calm  map[uint64]time.Time // since when a split's demand fits its owner
	ended map[uint64]time.Time // when each split ended, for splitCooldown
	// refused counts, by reason, the prefixes with enough traffic for a
	// split that the last round left whole.
	refused map[string]int
}

func newSplitPlanner() *splitPlanner {
	return &splitPlanner{added: map[uint64]time.Time{}, calm: map[uint64]time.Time{}, ended: map[uint64]time.Time{}, refused: map[string]int{}}
}

func (p *splitPlanner) reset() {
	clear(p.added)
	clear(p.calm)
	clear(p.ended)
}

// splitClaim is one prefix's counts added up over the routers.
type splitClaim struct {
	depth int
	// count is the prefix's count over every router that reported it;
	// carried only over those whose own traffic carries it: the leader,
	// and routers whose published partition counts include the partition
	// they say its requests route on.
	count, carried uint64
	// share is the prefix's largest share of one router's requests, and
	// carriedShare the same over the routers that carry it. Shares are
	// taken router by router, so that one router's total, however large,
	// never dilutes what the others count.
	share, carriedShare float64
	// part is the routing partition of the largest carried claim, and by
	// the router that made it (its index in reports).
	part, by int
}

// plan returns the splits after one round, and records what it started
// and ended. A split is kept while it is younger than splitMinLife, or
// while its prefix still has half a fair share of some router's requests
// and its demand (that share times the fleet's in-flight count) has not
// fit, for splitCalm, in half of what the backend it would return to runs
// at once (its learned capacity or limit), with that backend not pressed.
// A prefix is split when, over the routers whose traffic carries it, it
// has at least splitMinCount requests and a fair share (1/active
// backends) of one router's requests, the owner of the partition its requests route on is
// pressed, it did not end within splitCooldown, and the per-router and
// per-commit budgets have room; the busiest prefixes first.
func (p *splitPlanner) plan(in splitInput, now time.Time) []ring.Split {
	r := in.ring
	active := 0
	for i := range r.Len() {
		if r.Backend(i).State == ring.Active {
			active++
		}
	}
	active = max(active, 1)
	var fleet int64
	for _, b := range in.status {
		fleet += max(0, b.InFlight+b.RemoteInFlight)
	}
	pool := poolCapacity(in.status)
	claims := map[uint64]*splitClaim{}
	for ri, rep := range in.reports {
		self := rep.Node == ""
		published := map[uint32]bool{}
		for _, pl := range rep.Parts {
			if pl.Count > 0 {
				published[pl.Partition] = true
			}
		}
		for _, h := range rep.Prefixes {
			if int(h.Depth) >= ring.MaxChainBlocks {
				continue
			}
			c := claims[h.Key]
			if c == nil {
				c = &splitClaim{depth: int(h.Depth), part: -1, by: -1}
				claims[h.Key] = c
			}
			share := 0.0
			if rep.Total > 0 {
				share = float64(h.Count) / float64(rep.Total)
			}
			c.count += h.Count
			c.share = max(c.share, share)
			if rep.Partitions != uint64(r.Partitions()) || (!self && !published[h.Part]) {
				continue
			}
			if c.part < 0 || h.Count > c.carried {
				c.part, c.by = int(h.Part), ri
			}
			c.carried += h.Count
			c.carriedShare = max(c.carriedShare, share)
		}
	}
	for k, t := range p.ended {
		if now.Sub(t) >= splitCooldown {
			delete(p.ended, k)
		}
	}

	next := make([]ring.Split, 0, len(in.cur)+splitNewPerCommit)
	split := make(map[uint64]bool, len(in.cur))
	for _, sp := range in.cur {
		split[sp.Key] = true
		added, ok := p.added[sp.Key]
		if !ok {
			added = now // a split this leader did not start: its clock starts now
			p.added[sp.Key] = added
		}
		var share float64
		if c := claims[sp.Key]; c != nil {
			share = c.share
		}
		cold := share*float64(2*active) < 1
		if p.fits(in, sp.Key, share, fleet, pool) {
			if _, ok := p.calm[sp.Key]; !ok {
				p.calm[sp.Key] = now
			}
		} else {
			delete(p.calm, sp.Key)
		}
		calm, isCalm := p.calm[sp.Key]
		if now.Sub(added) >= splitMinLife && (cold || (isCalm && now.Sub(calm) >= splitCalm)) {
			delete(p.added, sp.Key)
			delete(p.calm, sp.Key)
			p.ended[sp.Key] = now
			continue
		}
		next = append(next, sp)
	}
	for k := range p.added {
		if !split[k] {
			delete(p.added, k)
			delete(p.calm, k)
		}
	}

	type cand struct {
		key uint64
		c   *splitClaim
	}
	clear(p.refused)
	var cands []cand
	for k, c := range claims {
		if split[k] {
			continue
		}
		if c.part < 0 || c.carried < splitMinCount || c.carriedShare*float64(active) < 1 {
			if c.count >= splitMinCount && c.share*float64(active) >= 1 {
				p.refused["not_carried"]++
			}
			continue
		}
		if _, cooling := p.ended[k]; cooling {
			p.refused["cooldown"]++
			continue
		}
		cands = append(cands, cand{k, c})
	}
	slices.SortFunc(cands, func(a, b cand) int {
		if a.c.carried != b.c.carried {
			return cmp.Compare(b.c.carried, a.c.carried)
		}
		return cmp.Compare(a.key, b.key)
	})
	perRouter := map[int]int{}
	started := 0
	for _, cd := range cands {
		owner := r.Order(cd.c.part)[0]
		if !in.pressed(r.Backend(int(owner)).ID) {
			p.refused["not_pressed"]++
			continue // the owner keeps up: the prefix stays whole
		}
		if started == splitNewPerCommit || len(next) >= ring.MaxSplits || perRouter[cd.c.by] >= splitNewPerRouter {
			p.refused["budget"]++
			continue
		}
		perRouter[cd.c.by]++
		started++
		next = append(next, ring.Split{Key: cd.key, Depth: cd.c.depth})
		p.added[cd.key] = now
	}
	ring.SortSplits(next)
	return next
}

// fits reports whether a split prefix with share of the requests would
// fit the backend it returns to (the owner of its own key's partition):
// that backend is not pressed, and the prefix's share of the fleet's
// fleet in-flight requests is at most half of what the backend runs at
// once (its learned capacity, or its limit when lower; with neither
// known, the backend not being pressed is all there is to go by).
//
// A backend learns its capacity when its engine queues, and the home of a
// split prefix gets none of the prefix's traffic, so it may never have
// queued: its capacity is then taken to be pool, what the other backends
// learned (poolCapacity: their median; the engines of one pool are
// alike), not its limit. Taking the limit ended the splits of an agent workload's shared
// system prompt (six blocks, every request) while the fleet ran 10-16
// requests on engines that queue at 3-8: the prefix returned whole to one
// engine, queued there, and was split again after the cooldown, its
// sessions' caches scattered twice (docs/loadtest.md).
func (p *splitPlanner) fits(in splitInput, key uint64, share float64, fleet, pool int64) bool {
	r := in.ring
	if r.Partitions() == 0 {
		return true
	}
	home := int(r.Order(r.Partition(key))[0])
	id := r.Backend(home).ID
	if in.pressed(id) {
		return false
	}
	if home >= len(in.status) || in.status[home].ID != id {
		return true // a status of another ring: the pressure is all there is
	}
	b := in.status[home]
	capacity := b.Capacity
	if capacity <= 0 {
		capacity = pool
	}
	if b.Limit > 0 && b.Limit != ring.NoLimit && (capacity == 0 || b.Limit < capacity) {
		capacity = b.Limit
	}
	if capacity <= 0 {
		return true
	}
	return 2*share*float64(fleet) <= float64(capacity)
}

// poolCapacity returns the median of the capacities the backends of
// status have learned (the lower of the two middle ones), 0 when none has.
func poolCapacity(status []proxy.BackendStatus) int64 {
	var cs []int64
	for _, b := range status {
		if b.Capacity > 0 {
			cs = append(cs, b.Capacity)
		}
	}
	if len(cs) == 0 {
		return 0
	}
	slices.Sort(cs)
	return cs[(len(cs)-1)/2]
}
