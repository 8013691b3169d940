package node

import (
	"github.com/warmroute/warmroute/gossip"
	"github.com/warmroute/warmroute/internal/backendspec"
	"github.com/warmroute/warmroute/node/admin"
	"github.com/warmroute/warmroute/node/cluster"
)

// newAdmin builds the admin API over this router's Raft member, proxy and
// gossip.
func (n *Node) newAdmin() *admin.Server {
	cfg := admin.Config{
		Name: n.name, Token: n.adminToken, PublicMetrics: n.cfg.Admin.PublicMetrics, Metrics: n.reg,
		Agreement: n.agree, Router: n.proxy, Identity: n.identity,
		ParseBackend: ParseBackend, Logger: n.log.With("component", "admin"),
	}
	if n.gossip != nil {
		cfg.Members = gossipMembers{n.gossip}
	}
	if n.scraper != nil {
		cfg.Engines = nodeEngines{n}
	}
	return admin.New(cfg)
}

// nodeEngines gives the admin API the engines' figures: gossip's view in a
// cluster (this router's scrapes and its peers'), else this router's own.
type nodeEngines struct{ n *Node }

func (e nodeEngines) Engine(backend string) (gossip.EngineStats, bool) {
	if g := e.n.gossip; g != nil {
		return g.View().Engine(backend)
	}
	es := e.n.engines
	if es == nil {
		return gossip.EngineStats{}, false
	}
	es.mu.Lock()
	s, ok := es.m[backend]
	es.mu.Unlock()
	return toGossip(s), ok
}

var _ admin.Engines = nodeEngines{}

// gossipMembers adapts gossip to admin.Members.
type gossipMembers struct{ *gossip.Mesh }

func (g gossipMembers) Failing(backend string) []string { return g.View().Health(backend).Failing }

var _ admin.Members = gossipMembers{}

// ParseBackend checks an admin API backend request with the config file's
// rules for ids and addresses and returns the backend to add. The ID
// defaults to the URL's host:port.
func ParseBackend(req admin.BackendRequest) (cluster.Backend, error) {
	rb, err := ringBackend(backendspec.Spec{ID: req.ID, URL: req.URL, Zone: req.Zone, Weight: req.Weight})
	if err != nil {
		return cluster.Backend{}, err
	}
	if err := checkModels(rb.ID, req.Models); err != nil {
		return cluster.Backend{}, err
	}
	return cluster.Backend{ID: rb.ID, URL: rb.Addr, Zone: rb.Zone, Weight: rb.Weight, State: req.State, Labels: req.Labels, Models: req.Models}, nil
}
