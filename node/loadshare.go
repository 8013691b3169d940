package node

import (
	"context"
	"fmt"
	"math"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/warmroute/warmroute/gossip"
	"github.com/warmroute/warmroute/internal/identity"
	"github.com/warmroute/warmroute/node/cluster"
	"github.com/warmroute/warmroute/proxy"
	"github.com/warmroute/warmroute/proxy/engine"
)

// A router's cluster certificate signs its gossip.
var _ gossip.Identity = (*identity.Bundle)(nil)

// localLoads adapts the proxy's own in-flight counts to gossip.LocalSource.
// gossip calls it from one goroutine.
type localLoads struct {
	p   *proxy.Proxy
	buf []proxy.BackendLoad
}

func (l *localLoads) AppendInFlight(dst []gossip.BackendLoad) []gossip.BackendLoad {
	l.buf = l.p.AppendInFlight(l.buf[:0])
	for _, b := range l.buf {
		dst = append(dst, gossip.BackendLoad{Backend: b.Backend, InFlight: b.InFlight, Failing: b.Failing})
	}
	return dst
}

// startGossip joins the cluster. The admin and Raft addresses other nodes
// need travel in the node metadata.
func (n *Node) startGossip(raftAddr string, voter bool) error {
	cl := &n.cfg.Cluster
	gc := gossip.DefaultConfig()
	gc.NodeName = cl.NodeName
	host, port, err := splitHostPort(cl.GossipListen)
	if err != nil {
		return fmt.Errorf("gossip-listen: %w", err)
	}
	gc.BindAddr, gc.BindPort = host, port
	if cl.GossipAdvertise != "" {
		if gc.AdvertiseAddr, gc.AdvertisePort, err = splitHostPort(cl.GossipAdvertise); err != nil {
			return fmt.Errorf("gossip-advertise: %w", err)
		}
	}
	gc.Join = cl.Join
	gc.PublishInterval = cl.PublishInterval
	// Changed figures (a request started or ended) travel at the next
	// read of the proxy's counters, every ChangeDelay; a publish interval
	// shorter than that makes every read a publish.
	gc.ChangeDelay = min(gc.ChangeDelay, gc.PublishInterval)
	if gc.RefreshInterval < 10*gc.PublishInterval {
		gc.RefreshInterval = 10 * gc.PublishInterval
	}
	if gc.ExpireAfter <= gc.RefreshInterval {
		gc.ExpireAfter = 4 * gc.RefreshInterval
	}
	if gc.SecretKey, err = cl.gossipKey(); err != nil {
		return err
	}
	gc.AllowPlaintext = cl.AllowPlaintextGossip
	if n.identity != nil {
		// Figures, engine metrics and health verdicts are then signed by
		// each router's certificate and accepted only from the router
		// they name.
		gc.Identity = n.identity
	}
	gc.Meta = gossip.Meta{AdminAddr: n.advertisedAdmin(), RaftAddr: raftAddr, Zone: cl.Zone, Voter: voter, Version: n.version, Ops: cluster.CommandLevel}
	gc.Logger = n.log.With("component", "gossip")
	gc.Registry = n.reg
	g, err := gossip.New(gc, &localLoads{p: n.proxy})
	if err != nil {
		return err
	}
	n.gossip = g
	return nil
}

// advertisedAdmin is the admin address other nodes should use: the admin
// port on the gossip advertise (or bind) host.
func (n *Node) advertisedAdmin() string {
	_, port, _ := net.SplitHostPort(n.AdminAddr().String())
	host, _, _ := net.SplitHostPort(n.cfg.Cluster.GossipAdvertise)
	if host == "" {
		host, _, _ = net.SplitHostPort(n.cfg.Cluster.GossipListen)
	}
	if ah, _, _ := net.SplitHostPort(n.cfg.AdminListen); ah != "" && !net.ParseIP(ah).IsUnspecified() {
		host = ah
	}
	if host == "" || net.ParseIP(host).IsUnspecified() {
		if g := n.gossip; g != nil {
			host, _, _ = net.SplitHostPort(g.Addr())
		}
	}
	return net.JoinHostPort(host, port)
}

func splitHostPort(s string) (string, int, error) {
	h, p, err := net.SplitHostPort(s)
	if err != nil {
		return "", 0, err
	}
	port, err := strconv.Atoi(p)
	if err != nil || port < 0 || port > 65535 {
		return "", 0, fmt.Errorf("bad port in %q", s)
	}
	return h, port, nil
}

// engineState keeps what this node scraped itself when it runs alone.
type engineState struct {
	mu sync.Mutex
	m  map[string]engine.Stats
}

// engineQueue is what this node's own scrape says about the engine's
// queue: the same as the scrape shared through gossip would say.
func engineQueue(s engine.Stats) proxy.EngineQueue { return gossipQueue(toGossip(s)) }

// gossipQueue is what a scrape says about the engine's queue, for the
// proxy's busy estimate and learned capacity: nothing when the scrape
// failed or the engine exports no queue figure; the running count when it
// exports one; and its prefix-cache hit rate when it exports one.
func gossipQueue(s gossip.EngineStats) proxy.EngineQueue {
	if !s.Has(gossip.EngineWaiting) {
		return proxy.EngineQueue{}
	}
	q := proxy.EngineQueue{Waiting: queued(s.Waiting), Scraped: s.Scraped}
	if s.Has(gossip.EngineRunning) {
		q.Running = queued(s.Running)
	}
	if s.Has(gossip.EnginePrefixHitRate) && s.PrefixHitRate >= 0 && s.PrefixHitRate <= 1 {
		q.PrefixHit, q.HasPrefixHit = s.PrefixHitRate, true
	}
	return q
}

// queued turns an engine's queue (or running) figure into a request count: rounded up,
// and bounded, whatever the engine sent.
func queued(w float64) int64 {
	if !(w > 0) {
		return 0
	}
	return int64(math.Ceil(min(w, gossip.MaxEngineRequests)))
}

func toGossip(s engine.Stats) gossip.EngineStats {
	return gossip.EngineStats{KVUsage: s.KVUsage, Running: s.Running, Waiting: s.Waiting,
		PrefixHitRate: s.PrefixHitRate, Known: s.Known, Scraped: s.Scraped, OK: s.OK}
}

// newScraper scrapes the engines' metrics. In a cluster each backend is
// scraped by one node and shared through gossip; alone, the node scrapes
// every backend and applies the result directly.
func (n *Node) newScraper() (*engine.Scraper, error) {
	ec := engine.DefaultConfig()
	ec.Interval, ec.Timeout = n.cfg.Engine.Interval, n.cfg.Engine.Timeout
	ec.Logger = n.log.With("component", "engine-scraper")
	ec.Registry = n.reg
	path := n.cfg.Engine.MetricsPath
	targets := func() []engine.Target {
		r, _ := n.proxy.Ring()
		out := make([]engine.Target, 0, r.Len())
		for _, b := range r.Backends() {
			out = append(out, engine.Target{ID: b.ID, MetricsURL: b.Addr + path})
		}
		return out
	}
	if n.gossip != nil {
		g := n.gossip
		return engine.New(ec, targets, g.IsScraper, func(id string, s engine.Stats) { g.PublishEngine(id, toGossip(s)) })
	}
	es := &engineState{m: map[string]engine.Stats{}}
	n.engines = es
	return engine.New(ec, targets, func(string) bool { return true }, func(id string, s engine.Stats) {
		es.mu.Lock()
		es.m[id] = s
		es.mu.Unlock()
		n.proxy.SetRemote(id, 0, engineQueue(s))
	})
}

// followGossip pushes remote in-flight counts and engine figures into the
// proxy's atomics whenever the cluster's view changes and, on the Raft
// leader, hands the other nodes' health verdicts to the health tracker,
// until ctx ends.
func (n *Node) followGossip(ctx context.Context) {
	var (
		fed  verdictFeed
		held = map[string]gossip.EngineStats{}
	)
	follow(ctx, n.gossip.Subscribe, verdictRefresh, func(now time.Time) time.Time {
		due := n.applyView(held, now)
		n.feedVerdicts(&fed, now)
		return due
	})
}

// engineSettle is how old an engine scrape must be before this router
// routes on it. Every router takes a scrape through gossip at its own
// moment (the router that scraped it at once, the others a publish or so
// later); routing on it from the same age on, every router sees the
// owner's queue change together, within a clock tick of each other
// rather than a gossip hop, and picks alike. A queue is known this much
// later: a fifth of the default scrape interval.
const engineSettle = 200 * time.Millisecond

// settledEngine returns the engine figures of a backend to route on now:
// es once it is engineSettle old, else the last settled figures held
// (none before the first), and when es will be settled (zero: it is).
// held keeps the settled figures by backend.
func settledEngine(held map[string]gossip.EngineStats, id string, es gossip.EngineStats, now time.Time) (gossip.EngineStats, time.Time) {
	if due := es.Scraped.Add(engineSettle); !es.Scraped.IsZero() && due.After(now) {
		return held[id], due
	}
	held[id] = es
	return es, time.Time{}
}

// verdictRefresh is how often the leader repeats the other nodes'
// verdicts to its health tracker even when none changed: well inside the
// tracker's report TTL, and soon after this node becomes leader (the
// tracker starts empty with each term).
const verdictRefresh = time.Second

// verdictFeed remembers what feedVerdicts last passed on.
type verdictFeed struct {
	version uint64
	at      time.Time
}

// feedVerdicts passes, on the leader, every other node's verdict on every
// backend (failing after its own health checks or passive ejection, as
// gossip carries it) to the health tracker: when any changed, and every
// verdictRefresh.
func (n *Node) feedVerdicts(f *verdictFeed, now time.Time) {
	a := n.agree
	if a == nil || !a.IsLeader() {
		f.at = time.Time{}
		return
	}
	v := n.gossip.View()
	if v.HealthVersion() == f.version && now.Sub(f.at) < verdictRefresh/2 {
		return
	}
	f.version, f.at = v.HealthVersion(), now
	r, _ := n.proxy.Ring()
	for _, b := range r.Backends() {
		h := v.Health(b.ID)
		for _, name := range h.Failing {
			a.ReportVerdict(b.ID, name, true)
		}
		for _, name := range h.Healthy {
			a.ReportVerdict(b.ID, name, false)
		}
	}
}

// applyView copies the current gossip view into the proxy: the in-flight
// counts as they are, the engine figures once settled (settledEngine,
// held by backend). It returns when the next held figures settle (zero:
// none waits).
func (n *Node) applyView(held map[string]gossip.EngineStats, now time.Time) time.Time {
	v := n.gossip.View()
	r, _ := n.proxy.Ring()
	var next time.Time
	bs := r.Backends()
	for _, b := range bs {
		es, _ := v.Engine(b.ID)
		es, due := settledEngine(held, b.ID, es, now)
		if !due.IsZero() && (next.IsZero() || due.Before(next)) {
			next = due
		}
		n.proxy.SetRemote(b.ID, v.RemoteInFlight(b.ID), gossipQueue(es))
	}
	if len(held) > 2*len(bs)+16 {
		// backends gone from the ring
		for id := range held {
			if _, ok := r.Index(id); !ok {
				delete(held, id)
			}
		}
	}
	return next
}

// GossipAddr is the bound gossip address, or "" when running alone.
func (n *Node) GossipAddr() string {
	if n.gossip == nil {
		return ""
	}
	return n.gossip.Addr()
}
