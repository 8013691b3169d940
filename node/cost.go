package node

import (
	"cmp"
	"context"
	"slices"
	"time"

	"github.com/warmroute/warmroute/gossip"
	"github.com/warmroute/warmroute/node/cluster"
)

const (
	// costPeriod is how often a router publishes its own recompute work
	// unit and the leader looks at everyone's.
	costPeriod = time.Second
	// costMaxAge: other routers' figures older than this (three missed
	// periods) are not counted.
	costMaxAge = 3*costPeriod + costPeriod/2
	// costCommitGap is the least time between two set_recompute_unit
	// commits, and costChange the relative change of the routers' unit
	// that calls for one: the unit follows the traffic's mix within a few
	// seconds without a commit for every wobble of a running mean.
	costCommitGap = 5 * time.Second
	costChange    = 0.1
)

// learnCost shares this router's recompute work unit every costPeriod
// until ctx ends, and on the leader commits the routers' median when it has
// moved. Each router learns the unit (the prompt bytes an average request
// makes its backend prefill) from its own traffic, and the COST overflow
// rule weighs a move off an owner in it: routers that learn it apart
// part ways on the same request (an 8-router fleet whose routers saw the
// same queues agreed on three picks in four). With the unit agreed
// through Raft (applyAgreed installs it), every router weighs every
// request alike from the same epoch on.
func (n *Node) learnCost(ctx context.Context) {
	t := time.NewTicker(costPeriod)
	defer t.Stop()
	var (
		prev       uint64
		weight     float64 // requests, halved every period
		reports    []gossip.CostReport
		lastCommit time.Time
	)
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		f := n.proxy.RecomputeFigures()
		weight = weight/2 + float64(f.Requests-prev)
		prev = f.Requests
		own := gossip.CostFigure{Unit: uint64(max(f.Unit, 0)), Requests: uint64(weight + 0.5), FromAnswers: f.FromAnswers}
		if n.gossip != nil && own.Unit > 0 {
			n.gossip.PublishCost(own)
		}
		if !n.agree.IsLeader() {
			continue
		}
		now := time.Now()
		st, _ := n.agree.State()
		if !st.Seeded || now.Sub(lastCommit) < costCommitGap {
			continue
		}
		reports = append(reports[:0], gossip.CostReport{CostFigure: own})
		if n.gossip != nil {
			reports = n.gossip.CostReports(reports, costMaxAge)
		}
		unit := agreedUnit(reports)
		if unit == 0 || !unitMoved(st.RecomputeUnit, unit) {
			continue
		}
		lastCommit = now
		actx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := n.agree.Apply(actx, cluster.SetRecomputeUnit(unit))
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				n.log.Debug("committing the recompute unit", "unit", unit, "err", err)
			}
			continue
		}
		n.log.Debug("recompute unit committed", "unit", unit, "was", st.RecomputeUnit, "routers", len(reports))
	}
}

// agreedUnit returns the unit the leader commits from the routers'
// figures: their median, each router weighing by its requests but no more
// than the median router, over those whose cached share came from
// answers' usage reports when any did (the engines' hit rate errs low); 0
// when no router has traffic. A median rather than a mean, and capped
// weights, so that one router (a compromised one, or one whose clients
// send odd traffic) cannot pull the cluster's unit outside the others'
// figures when there are three or more.
func agreedUnit(reports []gossip.CostReport) int64 {
	answers := false
	for _, r := range reports {
		if r.Unit > 0 && r.Requests > 0 && r.FromAnswers {
			answers = true
		}
	}
	in := make([]gossip.CostFigure, 0, len(reports))
	for _, r := range reports {
		if r.Unit == 0 || r.Requests == 0 || r.Unit > cluster.MaxRecomputeUnit || (answers && !r.FromAnswers) {
			continue
		}
		in = append(in, r.CostFigure)
	}
	if len(in) == 0 {
		return 0
	}
	slices.SortFunc(in, func(a, b gossip.CostFigure) int { return cmp.Compare(a.Requests, b.Requests) })
	limit := in[(len(in)-1)/2].Requests
	var total uint64
	for i := range in {
		in[i].Requests = min(in[i].Requests, limit)
		total += in[i].Requests
	}
	slices.SortFunc(in, func(a, b gossip.CostFigure) int { return cmp.Compare(a.Unit, b.Unit) })
	var acc uint64
	for _, f := range in {
		acc += f.Requests
		if 2*acc >= total {
			return int64(f.Unit)
		}
	}
	return int64(in[len(in)-1].Unit)
}

// unitMoved reports whether next differs from the agreed cur enough for a
// commit: none agreed yet, or by more than costChange.
func unitMoved(cur, next int64) bool {
	if cur <= 0 {
		return true
	}
	d := float64(next-cur) / float64(cur)
	return d > costChange || d < -costChange
}
