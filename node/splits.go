package node

import (
	"context"
	"slices"
	"time"

	"github.com/warmroute/warmroute/gossip"
	"github.com/warmroute/warmroute/node/cluster"
	"github.com/warmroute/warmroute/ring"
)

// splitPeriod is how often a router closes a counting period of its hot
// prefixes (the proxy's counts decay by a quarter each time, so they follow
// about the last two seconds of traffic).
const splitPeriod = 500 * time.Millisecond

// hotMaxAge is how long the leader counts a split another router's
// traffic called for: four counting periods, so a lost publish or two
// changes nothing, and a router that stops calling for it is forgotten
// within two seconds.
const hotMaxAge = 4 * splitPeriod

// learnSplits closes a counting period every splitPeriod until ctx ends.
// Every router shares the splits its own traffic calls for through gossip;
// the leader commits the union of its own and those others shared within
// hotMaxAge when it differs from the agreed splits, so a prefix that is hot
// only in traffic reaching other routers (clients pinned to one router by
// their connections) is split too. Every router installs the agreed splits
// when it applies them (applyAgreed), so all route on the same splits from
// the same epoch.
func (n *Node) learnSplits(ctx context.Context) {
	t := time.NewTicker(splitPeriod)
	defer t.Stop()
	var hot []gossip.HotPrefix
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		r, _ := n.proxy.Ring()
		next := n.proxy.HotSplits()
		if !r.Config().Adaptive() {
			continue
		}
		if n.gossip != nil {
			hot = toHot(hot[:0], next)
			n.gossip.PublishHot(hot)
		}
		if !n.agree.IsLeader() {
			continue
		}
		if n.gossip != nil {
			hot = n.gossip.HotPrefixes(hot, hotMaxAge)
			next = unionSplits(next, hot[len(next):])
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

// toHot appends list to dst as gossip's hot prefixes.
func toHot(dst []gossip.HotPrefix, list []ring.Split) []gossip.HotPrefix {
	for _, sp := range list {
		dst = append(dst, gossip.HotPrefix{Key: sp.Key, Depth: uint32(sp.Depth)})
	}
	return dst
}

// unionSplits returns own plus others, the prefixes other routers called
// to split that own does not hold (Mesh.HotPrefixes leaves those out), in
// canonical order, at most ring.MaxSplits (shallowest first). A depth
// past ring.MaxChainBlocks, which gossip's bound rules out, is dropped.
func unionSplits(own []ring.Split, others []gossip.HotPrefix) []ring.Split {
	if len(others) == 0 {
		return own
	}
	out := slices.Clone(own)
	for _, h := range others {
		if int(h.Depth) < ring.MaxChainBlocks {
			out = append(out, ring.Split{Key: h.Key, Depth: int(h.Depth)})
		}
	}
	ring.SortSplits(out)
	if len(out) > ring.MaxSplits {
		out = out[:ring.MaxSplits]
	}
	return out
}
