package node

import (
	"context"
	"fmt"
	"maps"
	"net"
	"slices"
	"strconv"
	"time"

	"github.com/hashicorp/go-sockaddr"
	"github.com/warmroute/warmroute/gossip"
	"github.com/warmroute/warmroute/internal/backendspec"
	"github.com/warmroute/warmroute/node/cluster"
	"github.com/warmroute/warmroute/ring"
)

// seedBackends converts the config file's backends to the agreed form.
func (c *Config) seedBackends() ([]cluster.Backend, error) {
	rbs, err := c.RingBackends()
	if err != nil {
		return nil, err
	}
	out := make([]cluster.Backend, len(rbs))
	for i, b := range rbs {
		// RingBackends keeps the config's order.
		if err := checkModels(b.ID, c.Backends[i].Models); err != nil {
			return nil, err
		}
		out[i] = cluster.Backend{ID: b.ID, URL: b.Addr, Zone: b.Zone, Weight: b.Weight,
			State: cluster.StateActive, Source: cluster.SourceConfig, Models: c.Backends[i].Models}
	}
	return out, nil
}

// raftAddrs picks the Raft bind address (a free port when the configured
// port is 0) and the address to advertise through gossip, before gossip
// starts, so the advertisement never changes.
func (n *Node) raftAddrs() (bind, advertise string, err error) {
	cl := &n.cfg.Cluster
	host, port, err := splitHostPort(cl.raftListen())
	if err != nil {
		return "", "", fmt.Errorf("raft-listen: %w", err)
	}
	if port == 0 {
		ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
		if err != nil {
			return "", "", fmt.Errorf("raft-listen: %w", err)
		}
		port = ln.Addr().(*net.TCPAddr).Port
		ln.Close()
	}
	bind = net.JoinHostPort(host, strconv.Itoa(port))
	if cl.RaftAdvertise != "" {
		return bind, cl.RaftAdvertise, nil
	}
	adv := host
	if adv == "" || net.ParseIP(adv).IsUnspecified() {
		adv, _, _ = net.SplitHostPort(cl.GossipAdvertise)
	}
	if adv == "" || net.ParseIP(adv).IsUnspecified() {
		adv, _, _ = net.SplitHostPort(cl.GossipListen)
	}
	if adv == "" || net.ParseIP(adv).IsUnspecified() {
		if adv, err = sockaddr.GetPrivateIP(); err != nil || adv == "" {
			return "", "", fmt.Errorf("cannot tell which address to advertise for Raft: set --raft-advertise")
		}
	}
	return bind, net.JoinHostPort(adv, strconv.Itoa(port)), nil
}

// startAgreement opens this node's Raft member. Alone (no gossip) the node
// is a one-member group on an in-memory transport, so the admin API and
// epochs work the same everywhere.
func (n *Node) startAgreement(raftBind, raftAdvertise string) error {
	cl := &n.cfg.Cluster
	cc := cluster.DefaultConfig()
	cc.NodeID = cl.NodeName
	cc.DataDir = cl.DataDir
	cc.Identity = n.identity
	cc.Logger = n.log
	cc.Registry = n.reg
	var err error
	if cc.SeedBackends, err = n.cfg.seedBackends(); err != nil {
		return err
	}
	cc.SeedRouting = n.cfg.Routing
	t := cl.RaftTimeout
	var members cluster.Membership
	if n.gossip != nil {
		members = departures{n.gossip}
		cc.RaftBind, cc.RaftAdvertise = raftBind, raftAdvertise
		cc.BootstrapExpect = cl.BootstrapExpect
		cc.Voters = cl.Voters
		cc.DeadServerTimeout = cl.DeadNodeTimeout
		if cl.DiscoveryDNS != "" {
			cc.Discovery.Name = cl.DiscoveryDNS
			cc.Discovery.Port = cl.DiscoveryPort
			cc.Discovery.Interval = cl.DiscoveryInterval
			cc.Discovery.Zone = cl.Zone
		}
	} else {
		cc.Network = cluster.NewInmemNetwork()
		cc.BootstrapExpect, cc.Voters = 1, 1
		t = min(t, 50*time.Millisecond) // nobody to wait for
	}
	if err := cl.k8sDiscovery(&cc.Discovery); err != nil {
		return err
	}
	cc.HeartbeatTimeout, cc.ElectionTimeout = t, t
	cc.LeaderLeaseTimeout = t / 2
	cc.CommitTimeout = min(cc.CommitTimeout, max(t/20, time.Millisecond))
	c, err := cluster.Open(cc, members, n.validateState)
	if err != nil {
		return err
	}
	n.agree = c
	return nil
}

// departures adds the routers that left gracefully to gossip's live
// members, with State "left", so the Raft leader removes them from the
// configuration at once instead of after DeadNodeTimeout, as Consul does.
// A router counts as left only when it is not live again.
type departures struct{ *gossip.Mesh }

func (d departures) Members() []gossip.Member {
	live := d.Mesh.Members()
	n := len(live)
	for _, m := range d.Mesh.RecentlyLeft() {
		if !slices.ContainsFunc(live[:n], func(l gossip.Member) bool { return l.Name == m.Name }) {
			live = append(live, m)
		}
	}
	return live
}

// validateState rejects a state this node could not route on.
func (n *Node) validateState(s cluster.State) error {
	rc := ring.ConfigFor(s.Routing)
	rc.LocalZone = n.cfg.Cluster.Zone
	rbs := s.RingBackends()
	for _, b := range rbs {
		if _, err := backendspec.ParseTarget(b.Addr); err != nil {
			return fmt.Errorf("backend %s: %w", b.ID, err)
		}
	}
	n.ringMu.Lock()
	base := n.baseRing
	n.ringMu.Unlock()
	if base != nil && sameRing(base, rc, rbs) {
		return nil // the ring this node routes on
	}
	_, err := base.Rebuild(rc, rbs)
	return err
}

// applyAgreed installs the agreed state's ring, once the state was seeded.
// A router whose state machine halted (a damaged or foreign log entry)
// keeps its last ring but reports not ready.
func (n *Node) applyAgreed() {
	if err := n.agree.Halted(); err != nil {
		n.proxy.SetUnready("this router stopped applying the cluster's Raft log (" + err.Error() + "); see its log")
	}
	st, epoch := n.agree.State()
	if !st.Seeded {
		return
	}
	if err := n.proxy.SetSplits(st.Splits); err != nil {
		n.log.Error("cannot install the agreed prefix splits; keeping the last ones", "epoch", epoch, "err", err)
	}
	n.proxy.SetRecomputeUnit(st.RecomputeUnit)
	if models := servedModels(&st); !maps.EqualFunc(models, n.models, slices.Equal) {
		n.models = models
		n.proxy.SetModels(models)
	}
	if _, cur := n.proxy.Ring(); cur == epoch {
		return
	}
	rc := ring.ConfigFor(st.Routing)
	rc.LocalZone = n.cfg.Cluster.Zone
	rebuilt, err := n.installRing(rc, st.RingBackends(), st.Moves, epoch)
	if err != nil {
		// validateState runs on the leader before every write, so this
		// means a node of another version: keep routing on the last ring.
		n.log.Error("cannot build the agreed ring; keeping the last one", "epoch", epoch, "err", err)
		return
	}
	if rebuilt {
		n.log.Info("ring updated", "epoch", epoch, "backends", len(st.Backends), "strategy", st.Routing.Strategy)
	} else {
		n.log.Debug("agreed state applied", "epoch", epoch, "splits", len(st.Splits), "moves", len(st.Moves))
	}
}

// followAgreement rebuilds the ring after every applied change until ctx
// ends. Routing never waits on it: the proxy keeps the last ring.
func (n *Node) followAgreement(ctx context.Context) {
	follow(ctx, n.agree.Subscribe, 0, func(time.Time) time.Time {
		n.applyAgreed()
		return time.Time{}
	})
}

// follow calls apply once, then again after every notification from
// subscribe, every that long when every is positive, and at the time
// apply last returned when it is not zero, until ctx ends or the
// notifications stop. apply gets the time it is called at.
func follow(ctx context.Context, subscribe func() (<-chan struct{}, func()), every time.Duration, apply func(now time.Time) time.Time) {
	ch, cancel := subscribe()
	defer cancel()
	var tick <-chan time.Time
	if every > 0 {
		t := time.NewTicker(every)
		defer t.Stop()
		tick = t.C
	}
	wake := time.NewTimer(time.Hour)
	defer wake.Stop()
	for {
		now := time.Now()
		if at := apply(now); !at.IsZero() {
			wake.Reset(at.Sub(now))
		}
		select {
		case <-ctx.Done():
			return
		case _, ok := <-ch:
			if !ok {
				return
			}
		case <-tick:
		case <-wake.C:
		}
	}
}

// stopAgreement hands leadership over when this node leads, then closes
// Raft.
func (n *Node) stopAgreement() {
	if n.agree == nil {
		return
	}
	if n.gossip != nil && n.agree.IsLeader() && otherVoters(n.agree.Status()) {
		if err := n.agree.TransferLeadership(); err != nil {
			n.log.Warn("leadership transfer", "err", err)
		}
	}
	if err := n.agree.Close(); err != nil {
		n.log.Warn("closing raft", "err", err)
	}
}

// otherVoters reports whether a Raft group has a voter besides this node,
// someone to hand leadership to.
func otherVoters(s cluster.Status) bool {
	for _, srv := range s.Servers {
		if srv.Voter && srv.ID != s.ID {
			return true
		}
	}
	return false
}
