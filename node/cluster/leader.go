package cluster

import (
	"context"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/raft"
)

// monitorLeadership starts the leader loop when this node becomes leader
// and stops it (waiting for it) when leadership ends.
func (c *Agreement) monitorLeadership() {
	defer c.wg.Done()
	var run *leaderRun
	stop := func() {
		if run == nil {
			return
		}
		run.stop()
		run = nil
		// Wake writers waiting for this term's setup (they then see
		// ErrNotLeader) and start the next term unready.
		c.readyMu.Lock()
		select {
		case <-c.ready:
		default:
			close(c.ready)
		}
		c.ready = make(chan struct{})
		c.readyMu.Unlock()
	}
	defer stop()
	for {
		select {
		case <-c.shutdownCh:
			return
		case leader := <-c.notifyCh:
			switch {
			case leader && run == nil:
				run = c.startLeaderLoop()
				c.log.Info("raft leadership acquired", "term", c.raft.CurrentTerm())
			case !leader && run != nil:
				stop()
				c.log.Info("raft leadership lost")
			}
		}
	}
}

// leaderRun is one running leader loop.
type leaderRun struct {
	cancel context.CancelFunc
	done   chan struct{}
}

func (c *Agreement) startLeaderLoop() *leaderRun {
	ctx, cancel := context.WithCancel(context.Background())
	r := &leaderRun{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		c.leaderLoop(ctx)
	}()
	return r
}

func (r *leaderRun) stop() {
	r.cancel()
	<-r.done
}

// observe counts leader changes as Raft reports them on every node.
func (c *Agreement) observe() {
	defer c.wg.Done()
	last := ""
	for {
		select {
		case <-c.shutdownCh:
			return
		case o := <-c.observerCh:
			lo, ok := o.Data.(raft.LeaderObservation)
			if !ok {
				continue
			}
			if id := string(lo.LeaderID); id != "" && id != last {
				last = id
				c.met.leaderChanges.Inc()
				c.log.Debug("raft leader", "leader", id)
			}
		}
	}
}

// leaderLoop runs while this node leads, in the shape of Consul's: a
// barrier so the state is current, one-time leadership setup (seed,
// discovery), a full reconcile of gossip membership into the Raft
// configuration, then reconciles on every membership change and on a timer,
// plus health commits.
func (c *Agreement) leaderLoop(ctx context.Context) {
	var (
		established bool
		gone        = map[string]time.Time{} // servers missing from gossip, since
		wg          sync.WaitGroup
	)
	defer wg.Wait()
	c.health.reset()
	retry := min(c.cfg.ReconcileInterval, time.Second)
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		case <-c.leaderWake:
		case <-c.healthWake:
			if established {
				c.commitHealth(ctx)
			}
			continue
		}
		if !established {
			if err := c.raft.Barrier(c.cfg.ApplyTimeout).Error(); err != nil {
				c.log.Warn("leader barrier failed", "err", err)
				timer.Reset(retry)
				continue
			}
			if err := c.establish(ctx); err != nil {
				c.log.Warn("leader setup failed", "err", err)
				timer.Reset(retry)
				continue
			}
			established = true
			if c.cfg.Discovery.Name != "" {
				wg.Add(1)
				go func() {
					defer wg.Done()
					c.discoveryLoop(ctx)
				}()
			}
		}
		next := c.reconcile(ctx, gone)
		c.commitHealth(ctx)
		timer.Reset(next)
	}
}

// establish seeds the state when it was never seeded and opens the node
// for writes.
func (c *Agreement) establish(ctx context.Context) error {
	switch st := c.fsm.load().state; {
	case !st.Seeded:
		cmd := Seed(c.cfg.SeedBackends, c.cfg.SeedRouting)
		if cmd.ClusterID = c.currentClusterID(); cmd.ClusterID == "" {
			cmd.ClusterID = newClusterID()
		}
		if _, err := c.write(ctx, cmd); err != nil {
			return err
		}
		c.log.Info("state seeded", "backends", len(c.cfg.SeedBackends), "cluster_id", cmd.ClusterID)
	case st.ClusterID == "":
		// Seeded before cluster IDs existed.
		id := c.currentClusterID()
		if id == "" {
			id = newClusterID()
		}
		if _, err := c.write(ctx, SetClusterID(id)); err != nil {
			return err
		}
		c.log.Info("cluster ID set", "cluster_id", id)
	}
	c.readyMu.Lock()
	select {
	case <-c.ready:
	default:
		close(c.ready)
	}
	c.readyMu.Unlock()
	return nil
}

// Reconcile actions.
const (
	actAddNonvoter = "add_nonvoter"
	actPromote     = "promote"
	actDemote      = "demote"
	actRemove      = "remove"
	actUpdateAddr  = "update_addr"
)

type action struct {
	kind  string
	id    string
	addr  string
	voter bool // for update_addr: keep the suffrage
}

// reconcile brings the Raft configuration in line with gossip and returns
// when to run again.
func (c *Agreement) reconcile(ctx context.Context, gone map[string]time.Time) time.Duration {
	next := c.cfg.ReconcileInterval
	if c.members == nil {
		return next
	}
	f := c.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		c.log.Warn("read raft configuration", "err", err)
		return min(next, time.Second)
	}
	now := time.Now()
	servers := f.Configuration().Servers
	acts, wait := plan(servers, c.trusted(c.view.Load(), servers), gone, now, c.cfg.NodeID, c.cfg.Voters, c.cfg.DeadServerTimeout)
	if wait > 0 && wait < next {
		next = wait
	}
	for _, a := range acts {
		if ctx.Err() != nil {
			return next
		}
		var fut raft.IndexFuture
		to := c.cfg.ApplyTimeout
		switch a.kind {
		case actAddNonvoter:
			fut = c.raft.AddNonvoter(raft.ServerID(a.id), raft.ServerAddress(a.addr), 0, to)
		case actPromote:
			fut = c.raft.AddVoter(raft.ServerID(a.id), raft.ServerAddress(a.addr), 0, to)
		case actDemote:
			fut = c.raft.DemoteVoter(raft.ServerID(a.id), 0, to)
		case actRemove:
			fut = c.raft.RemoveServer(raft.ServerID(a.id), 0, to)
		case actUpdateAddr:
			if a.voter {
				fut = c.raft.AddVoter(raft.ServerID(a.id), raft.ServerAddress(a.addr), 0, to)
			} else {
				fut = c.raft.AddNonvoter(raft.ServerID(a.id), raft.ServerAddress(a.addr), 0, to)
			}
		}
		if err := configChangeError(ctx, fut); err != nil {
			if ctx.Err() != nil {
				return next
			}
			c.log.Warn("reconcile failed", "action", a.kind, "server", a.id, "err", err)
			return min(next, time.Second)
		}
		if a.kind == actRemove {
			delete(gone, a.id)
		}
		c.met.reconcileActions.WithLabelValues(a.kind).Inc()
		c.log.Info("raft membership changed", "action", a.kind, "server", a.id, "addr", a.addr)
	}
	return next
}

// configChangeError waits for a configuration change's answer, or for ctx
// (the leader loop's) to end. hashicorp/raft v1.8.0 gives these futures no
// shutdown channel, as it does its restore futures: one that a Raft shut
// down at the wrong moment never answers held the leader loop, and Close
// with it, for good (TestBootstrapExpectAnyOrderAndGrowth hung so once in
// four runs of the gate). Its waiter then stays blocked on the future and
// holds nothing else.
func configChangeError(ctx context.Context, fut raft.Future) error {
	done := make(chan error, 1)
	go func() { done <- fut.Error() }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// plan computes the configuration changes that reconcile gossip membership
// into the Raft configuration, in the order to apply them, and how soon a
// missing server's timeout runs out (0: none pending). gone records when
// each configured server was first seen missing; plan updates it.
//
// Rules: servers gossip reports as left are removed at once, servers
// missing (or dead) for deadTimeout are removed; servers in gossip but not
// in the configuration are added as non-voters; then voters are chosen in
// this order until there are `voters` of them: the leader, current voters
// that are alive and eligible, current voters that are missing but not yet
// timed out, eligible non-voters (spreading zones, then by ID), current
// voters that no longer want a vote. When that makes an even number, the
// lowest ranked is left out (an even count tolerates no more failures than
// one fewer, and a clean split leaves neither half a majority). Promotions
// come before demotions, and no step leaves the alive voters without a
// majority (TestPlanNeverLosesQuorum).
func plan(cfg []raft.Server, view *memberView, gone map[string]time.Time, now time.Time, self string, voters int, deadTimeout time.Duration) ([]action, time.Duration) {
	var acts []action
	var wait time.Duration
	type entry struct {
		id, addr, zone string
		voter          bool // in the configuration as a voter
		inConfig       bool
		alive          bool
		eligible       bool
	}
	var servers []entry
	inCfg := map[string]bool{}
	for _, s := range cfg {
		id := string(s.ID)
		inCfg[id] = true
		e := entry{id: id, addr: string(s.Address), voter: s.Suffrage == raft.Voter, inConfig: true}
		m, ok := view.get(id)
		switch {
		case id == self:
			e.alive, e.eligible, e.zone = true, true, m.Zone
			delete(gone, id)
			if ok && m.Addr != e.addr {
				acts = append(acts, action{kind: actUpdateAddr, id: id, addr: m.Addr, voter: e.voter})
				e.addr = m.Addr
			}
		case ok && m.alive():
			e.alive, e.eligible, e.zone = true, m.Eligible, m.Zone
			delete(gone, id)
			if m.Addr != e.addr {
				acts = append(acts, action{kind: actUpdateAddr, id: id, addr: m.Addr, voter: e.voter})
				e.addr = m.Addr
			}
		case ok && m.State == "left":
			acts = append(acts, action{kind: actRemove, id: id})
			delete(gone, id)
			continue
		default: // missing or dead
			since, seen := gone[id]
			if !seen {
				since = now
				gone[id] = now
			}
			if left := deadTimeout - now.Sub(since); left <= 0 {
				acts = append(acts, action{kind: actRemove, id: id})
				continue
			} else if wait == 0 || left < wait {
				wait = left
			}
		}
		servers = append(servers, e)
	}
	for id := range gone {
		if !inCfg[id] {
			delete(gone, id)
		}
	}
	for _, m := range view.servers {
		if inCfg[m.ID] || !m.alive() {
			continue
		}
		acts = append(acts, action{kind: actAddNonvoter, id: m.ID, addr: m.Addr})
		servers = append(servers, entry{id: m.ID, addr: m.Addr, zone: m.Zone, alive: true, eligible: m.Eligible})
	}

	// Rank voter candidates.
	tier := func(e entry) int {
		switch {
		case e.id == self:
			return 0
		case e.voter && e.alive && e.eligible:
			return 1
		case e.voter && !e.alive:
			return 2
		case !e.voter && e.alive && e.eligible:
			return 3
		case e.voter:
			return 4
		}
		return -1 // not a candidate
	}
	var ranked []entry
	for t := 0; t <= 4; t++ {
		var group []entry
		for _, e := range servers {
			if tier(e) == t {
				group = append(group, e)
			}
		}
		slices.SortFunc(group, func(a, b entry) int { return strings.Compare(a.id, b.id) })
		if t == 3 {
			// Spread promotions over zones: repeatedly take the candidate
			// whose zone has the fewest voters chosen so far.
			zones := map[string]int{}
			for _, e := range ranked {
				zones[e.zone]++
			}
			for len(group) > 0 {
				best := 0
				for i, e := range group {
					if zones[e.zone] < zones[group[best].zone] {
						best = i
					}
				}
				zones[group[best].zone]++
				ranked = append(ranked, group[best])
				group = slices.Delete(group, best, best+1)
			}
			continue
		}
		ranked = append(ranked, group...)
	}
	chosen := ranked[:min(voters, len(ranked))]
	if len(chosen)%2 == 0 && len(chosen) > 0 {
		// An even count tolerates no more failures than one fewer, and a
		// clean split leaves neither side a majority: drop the lowest
		// ranked (never the leader, which ranks first).
		chosen = chosen[:len(chosen)-1]
	}
	want := map[string]bool{}
	for _, e := range chosen {
		want[e.id] = true
		if !e.voter {
			acts = append(acts, action{kind: actPromote, id: e.id, addr: e.addr})
		}
	}
	for _, e := range servers {
		if e.voter && !want[e.id] {
			acts = append(acts, action{kind: actDemote, id: e.id})
		}
	}
	return acts, wait
}
