package cluster

import (
	"errors"
	"strings"
	"time"

	"github.com/hashicorp/raft"
)

// bootstrapLoop runs on a node with no Raft state and BootstrapExpect > 0
// until the node is part of a configuration (it bootstrapped, or a leader
// added it) or it learns that a cluster already exists.
func (c *Agreement) bootstrapLoop() {
	defer c.wg.Done()
	tick := time.NewTicker(c.cfg.BootstrapInterval)
	defer tick.Stop()
	for {
		if c.tryBootstrap() {
			return
		}
		select {
		case <-c.shutdownCh:
			return
		case <-c.bootstrapWake:
		case <-tick.C:
		}
	}
}

// bootstrapSet is the configuration a node bootstraps with, computed the
// same way on every node from what gossip shows: with expect 1, this node
// alone; with expect N, the N voter-eligible servers with the lowest IDs,
// once at least N are alive. ok is false while fewer are seen, or when this
// node is not among the N (it then waits to be added by the leader).
func bootstrapSet(view *memberView, self string, expect int) (servers []server, ok bool) {
	if expect == 1 {
		s, found := view.get(self)
		return []server{s}, found
	}
	var eligible []server
	for _, s := range view.servers {
		if s.Eligible && s.alive() {
			eligible = append(eligible, s)
		}
	}
	if len(eligible) < expect {
		return nil, false
	}
	set := eligible[:expect] // view.servers is sorted by ID
	for _, s := range set {
		if s.ID == self {
			return set, true
		}
	}
	return nil, false
}

// tryBootstrap reports whether bootstrapping is settled (done, or not this
// node's job any more).
func (c *Agreement) tryBootstrap() bool {
	f := c.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return errors.Is(err, raft.ErrRaftShutdown)
	}
	if len(f.Configuration().Servers) > 0 {
		return true // bootstrapped or added by a leader
	}
	view := c.view.Load()
	set, ok := bootstrapSet(view, c.cfg.NodeID, c.cfg.BootstrapExpect)
	if !ok {
		return false
	}
	// Like Consul, refuse to bootstrap when any server gossip shows already
	// has Raft state: a node that arrives after the cluster formed must be
	// added by its leader, never start a second cluster. Every member of
	// the set must answer; others are asked but may be unreachable.
	inSet := map[string]bool{}
	for _, s := range set {
		inSet[s.ID] = true
	}
	for _, s := range view.servers {
		if s.ID == c.cfg.NodeID || !s.alive() {
			continue
		}
		term, err := c.probe(s)
		switch {
		case err != nil && inSet[s.ID]:
			c.log.Debug("bootstrap: peer did not answer", "peer", s.ID, "err", err)
			return false
		case err == nil && term > 0:
			c.log.Info("bootstrap: a cluster already exists; waiting to be added", "peer", s.ID, "term", term)
			return true
		}
	}
	cfg := raft.Configuration{}
	ids := make([]string, 0, len(set))
	for _, s := range set {
		cfg.Servers = append(cfg.Servers, raft.Server{Suffrage: raft.Voter, ID: raft.ServerID(s.ID), Address: raft.ServerAddress(s.Addr)})
		ids = append(ids, s.ID)
	}
	if err := c.raft.BootstrapCluster(cfg).Error(); err != nil {
		if errors.Is(err, raft.ErrCantBootstrap) {
			return true
		}
		c.log.Warn("bootstrap failed", "err", err)
		return false
	}
	c.met.reconcileActions.WithLabelValues("bootstrap").Inc()
	c.log.Info("bootstrapped raft cluster", "voters", strings.Join(ids, ","))
	return true
}

// probe asks a server for its Raft term with a pre-vote request, which
// changes nothing on the receiver. A server that never joined a cluster
// answers term 0.
func (c *Agreement) probe(s server) (uint64, error) {
	pv, ok := c.trans.(raft.WithPreVote)
	if !ok {
		return 0, errors.New("transport cannot probe")
	}
	req := &raft.RequestPreVoteRequest{
		RPCHeader: raft.RPCHeader{
			ProtocolVersion: raft.ProtocolVersionMax,
			ID:              []byte(c.cfg.NodeID),
			Addr:            c.trans.EncodePeer(raft.ServerID(c.cfg.NodeID), raft.ServerAddress(c.addr)),
		},
	}
	var resp raft.RequestPreVoteResponse
	if err := pv.RequestPreVote(raft.ServerID(s.ID), raft.ServerAddress(s.Addr), req, &resp); err != nil {
		return 0, err
	}
	return resp.Term, nil
}
