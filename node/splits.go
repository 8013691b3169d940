package node

import (
	"context"
	"slices"
	"time"

	"github.com/warmroute/warmroute/node/cluster"
)

// splitPeriod is how often a router closes a counting period of its hot
// prefixes (the proxy's counts decay by a quarter each time, so they follow
// about the last two seconds of traffic).
const splitPeriod = 500 * time.Millisecond

// learnSplits closes a counting period every splitPeriod until ctx ends.
// The leader commits the splits its traffic calls for when they differ
// from the agreed ones; every router installs the agreed ones when it
// applies them (applyAgreed), so all route on the same splits from the same
// epoch. Followers only keep their counts current, in case they lead next.
func (n *Node) learnSplits(ctx context.Context) {
	t := time.NewTicker(splitPeriod)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		r, _ := n.proxy.Ring()
		next := n.proxy.HotSplits()
		if !r.Config().Adaptive() || !n.agree.IsLeader() {
			continue
		}
		st, _ := n.agree.State()
		if !st.Seeded || slices.Equal(st.Splits, next) || (len(st.Splits) == 0 && len(next) == 0) {
			continue
		}
		actx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := n.agree.Apply(actx, cluster.SetSplits(next))
		cancel()
		if err != nil && ctx.Err() == nil {
			n.log.Debug("committing prefix splits", "splits", len(next), "err", err)
		}
	}
}
