package cluster

import (
	"context"
	"errors"
	"fmt"
	"github.com/warmroute/warmroute/ring"
	"log/slog"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/warmroute/warmroute/gossip"
	"github.com/warmroute/warmroute/internal/notify"
	"github.com/warmroute/warmroute/internal/testkit"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// A configuration change that Raft never answers leaves its waiter
	// behind (configChangeError): what it costs instead of a leader loop
	// and a Close that never end.
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/warmroute/warmroute/node/cluster.configChangeError.func1"))
}

// fakeGossip is a shared membership table standing in for memberlist: each
// node gets a view of it (with its own Self flag).
type fakeGossip struct {
	mu      sync.Mutex
	members map[string]gossip.Member
	subs    notify.Hub
}

func newFakeGossip() *fakeGossip {
	return &fakeGossip{members: map[string]gossip.Member{}}
}

func (g *fakeGossip) set(m gossip.Member) {
	g.mu.Lock()
	if m.State == "" {
		m.State = "alive"
	}
	g.members[m.Name] = m
	g.mu.Unlock()
	g.subs.Notify()
}

func (g *fakeGossip) setState(name, state string) {
	g.mu.Lock()
	m := g.members[name]
	m.State = state
	g.members[name] = m
	g.mu.Unlock()
	g.subs.Notify()
}

func (g *fakeGossip) remove(name string) {
	g.mu.Lock()
	delete(g.members, name)
	g.mu.Unlock()
	g.subs.Notify()
}

func (g *fakeGossip) view(self string) Membership { return gossipView{g, self} }

type gossipView struct {
	g    *fakeGossip
	self string
}

func (v gossipView) Members() []gossip.Member {
	v.g.mu.Lock()
	defer v.g.mu.Unlock()
	out := make([]gossip.Member, 0, len(v.g.members))
	for _, m := range v.g.members {
		m.Self = m.Name == v.self
		out = append(out, m)
	}
	return out
}

func (v gossipView) Subscribe() (<-chan struct{}, func()) { return v.g.subs.Subscribe() }

// testLogger logs to stderr when WARMROUTE_TEST_LOG is set, else nowhere.
func testLogger() *slog.Logger {
	if os.Getenv("WARMROUTE_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

func testRouting() ring.Settings {
	r := ring.DefaultSettings()
	r.PrefixLength = 2048
	return r
}

func testSeed() []Backend {
	return []Backend{
		{ID: "gpu-a/", URL: "http://127.0.0.1:9001", Zone: "z1"},
		{ID: "gpu-b/", URL: "http://127.0.0.1:9002", Zone: "z2"},
	}
}

// fastConfig is a test node's config: short Raft timeouts (elections in
// ~100 ms) and a fast reconcile.
func fastConfig(id string) Config {
	cfg := DefaultConfig()
	cfg.NodeID = id
	cfg.RaftBind = "127.0.0.1:0"
	cfg.HeartbeatTimeout = 100 * time.Millisecond
	cfg.ElectionTimeout = 100 * time.Millisecond
	cfg.LeaderLeaseTimeout = 100 * time.Millisecond
	cfg.CommitTimeout = 5 * time.Millisecond
	cfg.ReconcileInterval = 200 * time.Millisecond
	cfg.BootstrapInterval = 20 * time.Millisecond
	cfg.DeadServerTimeout = 2 * time.Second
	cfg.SeedBackends = testSeed()
	cfg.SeedRouting = testRouting()
	cfg.Logger = testLogger()
	return cfg
}

// tnode is one test node.
type tnode struct {
	id  string
	cfg Config
	c   *Agreement
}

// testNet is a set of nodes sharing fake gossip.
type testNet struct {
	t     *testing.T
	g     *fakeGossip
	net   *InmemNetwork // nil: TCP
	nodes map[string]*tnode
}

func newTestNet(t *testing.T, inmem bool) *testNet {
	tn := &testNet{t: t, g: newFakeGossip(), nodes: map[string]*tnode{}}
	if inmem {
		tn.net = NewInmemNetwork()
	}
	t.Cleanup(tn.closeAll)
	return tn
}

func (tn *testNet) closeAll() {
	for _, n := range tn.nodes {
		if n.c != nil {
			_ = n.c.Close()
		}
	}
}

// start opens a node and advertises it in gossip (after Open, as a node
// with a port-0 Raft listener does with SetMeta).
func (tn *testNet) start(id string, mod func(*Config)) *tnode {
	tn.t.Helper()
	cfg := fastConfig(id)
	cfg.Network = tn.net
	if mod != nil {
		mod(&cfg)
	}
	c, err := Open(cfg, tn.g.view(id), nil)
	if err != nil {
		tn.t.Fatalf("open %s: %v", id, err)
	}
	n := &tnode{id: id, cfg: cfg, c: c}
	tn.nodes[id] = n
	tn.advertise(n, true)
	return n
}

// startGroup starts the nodes ids, which bootstrap together
// (BootstrapExpect is len(ids)), and returns them in that order. mod, when
// not nil, adjusts each one's config.
func (tn *testNet) startGroup(ids []string, mod func(id string, c *Config)) []*tnode {
	tn.t.Helper()
	nodes := make([]*tnode, 0, len(ids))
	for _, id := range ids {
		nodes = append(nodes, tn.start(id, func(c *Config) {
			c.BootstrapExpect = len(ids)
			if mod != nil {
				mod(id, c)
			}
		}))
	}
	return nodes
}

func (tn *testNet) advertise(n *tnode, voter bool) { tn.advertiseOps(n, voter, CommandLevel) }

// advertiseOps advertises n with CommandLevel ops (0: as an earlier
// version, which advertises none).
func (tn *testNet) advertiseOps(n *tnode, voter bool, ops uint8) {
	tn.g.set(gossip.Member{Name: n.id, Addr: "gossip-" + n.id, Meta: gossip.Meta{RaftAddr: n.c.Addr(), Voter: voter, Zone: n.cfg.NodeID[:1], Ops: ops}})
}

// stop closes a node and, when gone is set, drops it from gossip.
func (tn *testNet) stop(id string, gone bool) {
	tn.t.Helper()
	n := tn.nodes[id]
	if err := n.c.Close(); err != nil {
		tn.t.Errorf("close %s: %v", id, err)
	}
	n.c = nil
	if gone {
		tn.g.remove(id)
	}
}

func (tn *testNet) live() []*tnode {
	var out []*tnode
	for _, n := range tn.nodes {
		if n.c != nil {
			out = append(out, n)
		}
	}
	slices.SortFunc(out, func(a, b *tnode) int {
		if a.id < b.id {
			return -1
		}
		return 1
	})
	return out
}

func (tn *testNet) subset(ids ...string) []*tnode {
	var out []*tnode
	for _, id := range ids {
		out = append(out, tn.nodes[id])
	}
	return out
}

// leader waits until exactly one of nodes leads and all of them agree.
func leader(t *testing.T, nodes []*tnode) *tnode {
	t.Helper()
	var l *tnode
	testkit.WaitFor(t, 45*time.Second, "one agreed leader", func() bool {
		l = nil
		for _, n := range nodes {
			if n.c.IsLeader() {
				if l != nil {
					return false
				}
				l = n
			}
		}
		if l == nil {
			return false
		}
		for _, n := range nodes {
			if id, _ := n.c.Leader(); id != l.id {
				return false
			}
		}
		return true
	})
	return l
}

// applyAny applies cmd on whichever node leads, retrying while leadership
// moves.
func applyAny(t *testing.T, nodes []*tnode, cmd Command) uint64 {
	t.Helper()
	var epoch uint64
	testkit.WaitFor(t, 20*time.Second, fmt.Sprintf("apply %s", cmd.Op), func() bool {
		for _, n := range nodes {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			e, err := n.c.Apply(ctx, cmd)
			cancel()
			if err == nil {
				epoch = e
				return true
			}
			if !errors.Is(err, ErrNotLeader) && !errors.Is(err, ErrNoLeader) && !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("apply %s on %s: %v", cmd.Op, n.id, err)
			}
		}
		return false
	})
	return epoch
}

// converged waits until every node reports epoch and the same state.
func converged(t *testing.T, nodes []*tnode, epoch uint64) State {
	t.Helper()
	st, _ := agreed(t, nodes, epoch, true)
	return st
}

// agreed waits until every node reports the same epoch, at least min (or
// exactly min), and the same state.
func agreed(t *testing.T, nodes []*tnode, epoch uint64, exact bool) (State, uint64) {
	t.Helper()
	min := epoch
	var st State
	defer func() {
		if t.Failed() {
			for _, n := range nodes {
				s, e := n.c.State()
				t.Logf("%s: epoch %d status %+v backends %s", n.id, e, n.c.Status(), ids(s.Backends))
			}
		}
	}()
	testkit.WaitFor(t, 20*time.Second, fmt.Sprintf("all nodes at epoch %d (exact %v)", min, exact), func() bool {
		for i, n := range nodes {
			s, e := n.c.State()
			if i == 0 {
				st, epoch = s, e
				if e < min || (exact && e != min) {
					return false
				}
			} else if e != epoch || !s.equal(&st) {
				return false
			}
		}
		return true
	})
	return st, epoch
}

// raftServers is a node's Raft configuration as "id:voter|nonvoter".
func raftServers(c *Agreement) map[string]bool {
	out := map[string]bool{}
	for _, s := range c.Status().Servers {
		out[s.ID] = s.Voter
	}
	return out
}

func counterValue(c prometheus.Collector) float64 { return testutil.ToFloat64(c) }
