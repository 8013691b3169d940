package cluster

import (
	"context"
	"errors"
	"fmt"
	"github.com/warmroute/warmroute/ring"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/warmroute/warmroute/gossip"
	"github.com/warmroute/warmroute/internal/testkit"
)

// changes is a fixed sequence of writes every multi-node test applies.
func changes(tag string) []Command {
	r := testRouting()
	r.ConcurrencyThreshold = 32
	r.Strategy = ring.LeastOutstanding
	return []Command{
		UpsertBackend(Backend{ID: "gpu-c-" + tag + "/", URL: "http://127.0.0.1:9003", Zone: "z3", Weight: 2, Labels: map[string]string{"tag": tag}}),
		SetBackendState("gpu-a/", StateDraining),
		SetRouting(r),
		RemoveBackend("gpu-b/"),
		UpsertBackend(Backend{ID: "gpu-b/", URL: "http://127.0.0.1:9012"}),
	}
}

// applyAll applies cmds one by one and checks after each that every node
// reports the same epoch and an identical state.
func applyAll(t *testing.T, nodes []*tnode, cmds []Command) State {
	t.Helper()
	var st State
	for _, cmd := range cmds {
		epoch := applyAny(t, nodes, cmd)
		st = converged(t, nodes, epoch)
	}
	return st
}

func startFormed(t *testing.T, inmem bool, ids []string, expect int, mod func(*Config)) (*testNet, []*tnode) {
	t.Helper()
	tn := newTestNet(t, inmem)
	for _, id := range ids {
		tn.start(id, func(c *Config) {
			c.BootstrapExpect = expect
			if mod != nil {
				mod(c)
			}
		})
	}
	nodes := tn.subset(ids...)
	leader(t, nodes)
	agreed(t, nodes, 1, false) // seeded everywhere
	return tn, nodes
}

func TestThreeNodesAgreeInMemory(t *testing.T) {
	_, nodes := startFormed(t, true, []string{"a", "b", "c"}, 3, nil)
	st, _ := nodes[0].c.State()
	if !st.Seeded || len(st.Backends) != 2 || st.Backends[0].Source != SourceConfig {
		t.Fatalf("seeded state: %+v", st)
	}
	st = applyAll(t, nodes, changes("x"))
	if len(st.Backends) != 3 || st.Routing.Strategy != ring.LeastOutstanding || st.Routing.ConcurrencyThreshold != 32 {
		t.Fatalf("final state: %+v", st)
	}
	if b, _ := st.Backend("gpu-a/"); b.State != StateDraining {
		t.Fatalf("gpu-a: %+v", b)
	}
	for _, n := range nodes {
		if got := raftServers(n.c); len(got) != 3 || !got["a"] || !got["b"] || !got["c"] {
			t.Fatalf("%s configuration: %v", n.id, got)
		}
	}
}

func TestFollowerWritesAreRefused(t *testing.T) {
	_, nodes := startFormed(t, true, []string{"a", "b", "c"}, 3, nil)
	l := leader(t, nodes)
	for _, n := range nodes {
		if n == l {
			continue
		}
		_, err := n.c.Apply(context.Background(), RemoveBackend("gpu-a/"))
		if !errors.Is(err, ErrNotLeader) {
			t.Fatalf("apply on follower %s: %v, want ErrNotLeader", n.id, err)
		}
		if id, addr := n.c.Leader(); id != l.id || addr != l.c.Addr() {
			t.Fatalf("follower %s names leader %s at %s, want %s", n.id, id, addr, l.id)
		}
	}
}

func TestInvalidWritesChangeNothingAnywhere(t *testing.T) {
	tn := newTestNet(t, true)
	reject := errors.New("ring would not build")
	for _, id := range []string{"a", "b", "c"} {
		cfg := fastConfig(id)
		cfg.Network = tn.net
		cfg.BootstrapExpect = 3
		c, err := Open(cfg, tn.g.view(id), func(s State) error {
			for _, b := range s.Backends {
				if strings.HasPrefix(b.ID, "bad") {
					return reject
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		n := &tnode{id: id, cfg: cfg, c: c}
		tn.nodes[id] = n
		tn.advertise(n, true)
	}
	nodes := tn.live()
	l := leader(t, nodes)
	st0, e0 := func() (State, uint64) {
		var e uint64
		testkit.WaitFor(t, 10*time.Second, "seed", func() bool { _, e = l.c.State(); return e > 0 })
		return l.c.State()
	}()
	converged(t, nodes, e0)

	// Rejected by the node's validate function on the leader.
	if _, err := l.c.Apply(context.Background(), UpsertBackend(Backend{ID: "bad-1", URL: "http://x:1"})); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), reject.Error()) {
		t.Fatalf("validate rejection: %v", err)
	}
	// Rejected by the state machine's own checks.
	if _, err := l.c.Apply(context.Background(), SetBackendState("gpu-a/", "sideways")); !errors.Is(err, ErrInvalid) {
		t.Fatalf("bad state: %v", err)
	}
	// A bad entry that reaches the log anyway (a raw Raft write) is
	// rejected by the state machine on every node.
	f := l.c.raft.Apply([]byte(`{"op":"upsert_backend","backend":{"id":"x y","url":"http://x:1"}}`), time.Second)
	if err := f.Error(); err != nil {
		t.Fatal(err)
	}
	if res := f.Response().(applyResult); !errors.Is(res.err, ErrInvalid) || res.epoch != e0 {
		t.Fatalf("raw bad entry: %+v", res)
	}
	// A good write after them lands at a later index, and nothing else
	// changed.
	e1 := applyAny(t, nodes, SetBackendState("gpu-a/", StateDown))
	st1 := converged(t, nodes, e1)
	if e1 <= e0 {
		t.Fatalf("epoch %d after %d", e1, e0)
	}
	st0.Backends[0].State, st0.Backends[0].StateBy = StateDown, ByAdmin
	if !st1.equal(&st0) {
		t.Fatalf("state after rejected writes:\n%+v\nwant\n%+v", st1, st0)
	}
	// Unchanged writes commit nothing.
	if e, err := l.c.Apply(context.Background(), SetBackendState("gpu-a/", StateDown)); err != nil || e != e1 {
		t.Fatalf("no-op write: epoch %d err %v, want %d", e, err, e1)
	}
}

// TestLeaderFailover kills the leader of a 5-node cluster (3 voters and 2
// non-voters, or 5 voters) and measures the gap until a write succeeds on
// the new leader.
func TestLeaderFailover(t *testing.T) {
	for _, voters := range []int{3, 5} {
		t.Run(fmt.Sprintf("voters=%d", voters), func(t *testing.T) {
			ids := []string{"a", "b", "c", "d", "e"}
			tn, nodes := startFormed(t, true, ids, 3, func(c *Config) { c.Voters = voters })
			testkit.WaitFor(t, 20*time.Second, "voter target reached", func() bool {
				n := 0
				for _, v := range raftServers(leader(t, nodes).c) {
					if v {
						n++
					}
				}
				return n == voters && len(raftServers(leader(t, nodes).c)) == 5
			})
			applyAll(t, nodes, changes("pre")[:2])
			old := leader(t, nodes)
			_, before := old.c.State()
			start := time.Now()
			tn.stop(old.id, false) // crash: still in gossip
			rest := tn.live()
			e := applyAny(t, rest, RemoveBackend("gpu-c-pre/"))
			gap := time.Since(start)
			st := converged(t, rest, e)
			if e <= before {
				t.Fatalf("epoch went from %d to %d", before, e)
			}
			if _, ok := st.Backend("gpu-c-pre/"); ok {
				t.Fatal("write after failover not applied")
			}
			t.Logf("failover gap (leader closed -> write applied on new leader, election timeout %v): %v",
				old.cfg.ElectionTimeout, gap)
			applyAll(t, rest, changes("post"))
		})
	}
}

func TestPlannedLeaderShutdown(t *testing.T) {
	tn, nodes := startFormed(t, true, []string{"a", "b", "c"}, 3, nil)
	old := leader(t, nodes)
	start := time.Now()
	if err := old.c.TransferLeadership(); err != nil {
		t.Fatal(err)
	}
	tn.stop(old.id, false)
	rest := tn.live()
	e := applyAny(t, rest, SetBackendState("gpu-a/", StateDraining))
	t.Logf("planned handoff gap (transfer + close -> write applied): %v", time.Since(start))
	converged(t, rest, e)
	for _, n := range rest {
		if err := n.c.TransferLeadership(); err != nil && !n.c.IsLeader() {
			t.Fatalf("transfer on follower %s: %v", n.id, err)
		}
	}
}

func TestMinorityPartitionKeepsStateAndCatchesUp(t *testing.T) {
	ids := []string{"a", "b", "c", "d", "e"}
	tn, nodes := startFormed(t, true, ids, 5, func(c *Config) { c.Voters = 5 })
	applyAll(t, nodes, changes("1")[:1])
	old := leader(t, nodes)
	// Cut the leader and one other node off: a minority of 2.
	var other *tnode
	for _, n := range nodes {
		if n != old {
			other = n
			break
		}
	}
	minority := []*tnode{old, other}
	var majority []*tnode
	for _, n := range nodes {
		if n != old && n != other {
			majority = append(majority, n)
		}
	}
	before, e0 := old.c.State()
	tn.net.Partition(old.id, other.id)
	newLeader := leader(t, majority)
	e1 := applyAny(t, majority, SetBackendState("gpu-a/", StateDown))
	converged(t, majority, e1)
	// The minority keeps routing on its last state and cannot write.
	for _, n := range minority {
		st, e := n.c.State()
		if e != e0 || !st.equal(&before) {
			t.Fatalf("minority node %s moved: epoch %d -> %d", n.id, e0, e)
		}
	}
	testkit.WaitFor(t, 10*time.Second, "old leader steps down", func() bool { return !old.c.IsLeader() })
	if _, err := old.c.Apply(context.Background(), RemoveBackend("gpu-a/")); err == nil {
		t.Fatal("minority accepted a write")
	}
	tn.net.Heal()
	converged(t, nodes, e1)
	if l := leader(t, nodes); l.id == old.id && newLeader.id != old.id {
		t.Logf("leadership returned to %s after heal", l.id)
	}
	applyAll(t, nodes, changes("2"))
}

func TestBootstrapExpectAnyOrderAndGrowth(t *testing.T) {
	for run := 0; run < 3; run++ {
		t.Run(fmt.Sprintf("order%d", run), func(t *testing.T) {
			tn := newTestNet(t, true)
			ids := []string{"a", "b", "c"}
			rand.Shuffle(len(ids), func(i, j int) { ids[i], ids[j] = ids[j], ids[i] })
			for _, id := range ids {
				tn.start(id, func(c *Config) { c.BootstrapExpect = 3; c.Voters = 5 })
				// Let the first ones wait alone for a while.
				time.Sleep(time.Duration(rand.IntN(50)) * time.Millisecond)
			}
			nodes := tn.live()
			l := leader(t, nodes)
			for _, n := range nodes {
				testkit.WaitFor(t, 10*time.Second, n.id+" has the configuration a, b, c", func() bool {
					got := raftServers(n.c)
					return len(got) == 3 && got["a"] && got["b"] && got["c"]
				})
			}
			// A 4th node (expect 3 as well, lowest ID so it would be in
			// "its" bootstrap set) must join, not start a second cluster.
			d := tn.start("0", func(c *Config) { c.BootstrapExpect = 3; c.Voters = 5 })
			all := tn.live()
			testkit.WaitFor(t, 20*time.Second, "4th joins as non-voter", func() bool {
				s := raftServers(leader(t, all).c)
				return len(s) == 4 && !s["0"]
			})
			testkit.WaitFor(t, 10*time.Second, "joiner follows the leader", func() bool {
				id, _ := d.c.Leader()
				return id == leader(t, all).id && len(raftServers(d.c)) == 4
			})
			// A 5th makes five voters.
			tn.start("e", func(c *Config) { c.BootstrapExpect = 3; c.Voters = 5 })
			all = tn.live()
			testkit.WaitFor(t, 20*time.Second, "5 voters", func() bool {
				s := raftServers(leader(t, all).c)
				return len(s) == 5 && s["0"] && s["e"] && s["a"] && s["b"] && s["c"]
			})
			applyAll(t, all, changes("g"))
			// A node that leaves is removed, and the voter count goes back
			// to an odd number.
			gone := "e"
			if l.id == gone {
				gone = "0"
			}
			tn.stop(gone, false)
			tn.g.setState(gone, "left")
			rest := tn.live()
			testkit.WaitFor(t, 20*time.Second, "left node removed", func() bool {
				s := raftServers(leader(t, rest).c)
				_, still := s[gone]
				voters := 0
				for _, v := range s {
					if v {
						voters++
					}
				}
				return !still && len(s) == 4 && voters == 3
			})
		})
	}
}

func TestDeadServerRemovedAfterTimeout(t *testing.T) {
	ids := []string{"a", "b", "c", "d"}
	tn, nodes := startFormed(t, true, ids, 3, func(c *Config) { c.DeadServerTimeout = 300 * time.Millisecond })
	testkit.WaitFor(t, 20*time.Second, "d added", func() bool { return len(raftServers(leader(t, nodes).c)) == 4 })
	l := leader(t, nodes)
	var victim *tnode
	for _, n := range nodes {
		if n != l && raftServers(l.c)[n.id] { // a voter
			victim = n
			break
		}
	}
	tn.stop(victim.id, true) // crashed and gone from gossip
	rest := tn.live()
	testkit.WaitFor(t, 20*time.Second, "dead voter removed and replaced", func() bool {
		s := raftServers(leader(t, rest).c)
		_, still := s[victim.id]
		voters := 0
		for _, v := range s {
			if v {
				voters++
			}
		}
		return !still && voters == 3
	})
}

func TestHealthCommits(t *testing.T) {
	_, nodes := startFormed(t, true, []string{"a", "b", "c"}, 3, func(c *Config) {
		c.HealthFailThreshold = 3
		c.HealthRiseThreshold = 2
	})
	l := leader(t, nodes)
	stateOf := func(n *tnode, id string) Backend { st, _ := n.c.State(); b, _ := st.Backend(id); return b }

	// Followers ignore reports.
	for _, n := range nodes {
		if n != l {
			for i := 0; i < 5; i++ {
				n.c.ReportHealth("gpu-a/", false, n.id)
			}
		}
	}
	// Two failures from the leader's probe: below the threshold.
	l.c.ReportHealth("gpu-a/", false, "a")
	l.c.ReportHealth("gpu-a/", false, "a")
	// A second reporter says it is fine: 1 of 2 unhealthy is no majority.
	l.c.ReportHealth("gpu-a/", true, "b")
	l.c.ReportHealth("gpu-a/", false, "a")
	_, e := l.c.State()
	l.c.commitHealth(context.Background()) // decide now rather than wait for the loop
	if b := stateOf(l, "gpu-a/"); b.State != StateActive {
		t.Fatalf("committed down without a majority: %+v", b)
	}
	// The second reporter now fails too.
	for i := 0; i < 3; i++ {
		l.c.ReportHealth("gpu-a/", false, "b")
	}
	testkit.WaitFor(t, 10*time.Second, "down committed", func() bool { return stateOf(l, "gpu-a/").State == StateDown })
	_, e2 := l.c.State()
	converged(t, nodes, e2)
	if e2 <= e {
		t.Fatalf("epoch %d after %d", e2, e)
	}
	if b := stateOf(nodes[0], "gpu-a/"); b.StateBy != ByHealth {
		t.Fatalf("state by: %+v", b)
	}
	// One good report each: below the rise threshold.
	l.c.ReportHealth("gpu-a/", true, "a")
	l.c.ReportHealth("gpu-a/", true, "b")
	l.c.commitHealth(context.Background())
	if b := stateOf(l, "gpu-a/"); b.State != StateDown {
		t.Fatalf("revived before the rise threshold: %+v", b)
	}
	l.c.ReportHealth("gpu-a/", true, "a")
	l.c.ReportHealth("gpu-a/", true, "b")
	testkit.WaitFor(t, 10*time.Second, "active committed", func() bool { return stateOf(l, "gpu-a/").State == StateActive })

	// An operator's drain is never overridden by health.
	applyAny(t, nodes, SetBackendState("gpu-b/", StateDraining))
	for i := 0; i < 5; i++ {
		l.c.ReportHealth("gpu-b/", false, "a")
	}
	l.c.commitHealth(context.Background())
	if b := stateOf(l, "gpu-b/"); b.State != StateDraining {
		t.Fatalf("health overrode a drain: %+v", b)
	}
}

// TestHealthVerdicts: other nodes' verdicts (carried by gossip) count as
// they are, one vote per node, next to the leader's own observations.
func TestHealthVerdicts(t *testing.T) {
	_, nodes := startFormed(t, true, []string{"a", "b", "c"}, 3, func(c *Config) {
		c.HealthFailThreshold = 3
		c.HealthRiseThreshold = 2
	})
	l := leader(t, nodes)
	stateOf := func(id string) Backend { st, _ := l.c.State(); b, _ := st.Backend(id); return b }
	var others []string
	for _, n := range nodes {
		if n != l {
			others = append(others, n.id)
			n.c.ReportVerdict("gpu-a/", n.id, true) // followers ignore verdicts
		}
	}
	// The leader's own probes pass; one other node says failing: 1 of 2.
	l.c.ReportHealth("gpu-a/", true, l.id)
	l.c.ReportVerdict("gpu-a/", others[0], true)
	l.c.ReportVerdict("no-such-backend/", others[0], true)
	l.c.commitHealth(context.Background())
	if b := stateOf("gpu-a/"); b.State != StateActive {
		t.Fatalf("committed down without a majority: %+v", b)
	}
	// A single verdict is enough from a node: it applied its own
	// thresholds. Two of three say failing.
	l.c.ReportVerdict("gpu-a/", others[1], true)
	testkit.WaitFor(t, 10*time.Second, "down committed", func() bool { return stateOf("gpu-a/").State == StateDown })
	if b := stateOf("gpu-a/"); b.StateBy != ByHealth {
		t.Fatalf("state by: %+v", b)
	}
	// Both recover: up again, without waiting for the rise threshold the
	// leader applies to raw observations.
	l.c.ReportVerdict("gpu-a/", others[0], false)
	l.c.ReportVerdict("gpu-a/", others[1], false)
	testkit.WaitFor(t, 10*time.Second, "active committed", func() bool { return stateOf("gpu-a/").State == StateActive })
}

func TestMetricsAndStatus(t *testing.T) {
	tn := newTestNet(t, true)
	regs := map[string]*prometheus.Registry{}
	for _, id := range []string{"a", "b", "c"} {
		reg := prometheus.NewRegistry()
		regs[id] = reg
		tn.start(id, func(c *Config) { c.BootstrapExpect = 3; c.Registry = reg })
	}
	nodes := tn.live()
	l := leader(t, nodes)
	e := applyAny(t, nodes, SetBackendState("gpu-a/", StateDraining))
	converged(t, nodes, e)
	for _, n := range nodes {
		reg := regs[n.id]
		if got := testutil.ToFloat64(gaugeFrom(t, reg, "warmroute_raft_epoch")); got != float64(e) {
			t.Errorf("%s epoch metric %v, want %d", n.id, got, e)
		}
		st := n.c.Status()
		if st.Epoch != e || st.LeaderID != l.id || len(st.Servers) != 3 || !st.Seeded || st.Backends != 2 {
			t.Errorf("%s status: %+v", n.id, st)
		}
	}
	mfs, err := regs[l.id].Gather()
	if err != nil {
		t.Fatal(err)
	}
	found := map[string]bool{}
	for _, mf := range mfs {
		found[mf.GetName()] = true
		if mf.GetName() == "warmroute_raft_state" {
			for _, m := range mf.GetMetric() {
				if m.GetLabel()[0].GetValue() == "leader" && m.GetGauge().GetValue() != 1 {
					t.Error("leader's state gauge is not leader")
				}
			}
		}
	}
	for _, name := range []string{"warmroute_raft_commit_seconds", "warmroute_raft_state", "warmroute_raft_applied_index", "warmroute_raft_leader_changes_total", "warmroute_raft_reconcile_actions_total"} {
		if !found[name] {
			t.Errorf("metric %s missing on the leader", name)
		}
	}
	// Close unregisters, so a reopen can register again.
	tn.stop(l.id, false)
	if mfs, _ := regs[l.id].Gather(); len(mfs) != 0 {
		t.Errorf("%d metric families left after Close", len(mfs))
	}
}

// gaugeFrom returns a collector reading one gauge from a registry.
func gaugeFrom(t *testing.T, reg *prometheus.Registry, name string) prometheus.Collector {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: "copy"}, func() float64 { return mf.GetMetric()[0].GetGauge().GetValue() })
		}
	}
	t.Fatalf("no metric %s", name)
	return nil
}

func TestCloseIsIdempotentAndStateStaysReadable(t *testing.T) {
	tn, nodes := startFormed(t, true, []string{"a"}, 1, nil)
	n := nodes[0]
	st, e := n.c.State()
	c := n.c
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	n.c = nil
	if st2, e2 := c.State(); e2 != e || !st2.equal(&st) {
		t.Fatal("state changed by Close")
	}
	if _, err := c.Apply(context.Background(), RemoveBackend("gpu-a/")); !errors.Is(err, ErrClosed) {
		t.Fatalf("apply after close: %v", err)
	}
	ch, cancel := c.Subscribe()
	defer cancel()
	if _, ok := <-ch; ok {
		t.Fatal("subscription after Close not closed")
	}
	_ = tn
}

func TestSubscribeNotifiesOnApply(t *testing.T) {
	_, nodes := startFormed(t, true, []string{"a"}, 1, nil)
	c := nodes[0].c
	ch, cancel := c.Subscribe()
	defer cancel()
	e := applyAny(t, nodes, SetBackendState("gpu-b/", StateDown))
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatal("no notification")
	}
	if _, got := c.State(); got != e {
		t.Fatalf("epoch %d, want %d", got, e)
	}
}

func TestConfigValidate(t *testing.T) {
	good := fastConfig("a")
	if err := good.Validate(); err != nil {
		t.Fatal(err)
	}
	for name, mod := range map[string]func(*Config){
		"no id":          func(c *Config) { c.NodeID = "" },
		"even voters":    func(c *Config) { c.Voters = 4 },
		"expect > voter": func(c *Config) { c.BootstrapExpect = 5 },
		"bad bind":       func(c *Config) { c.RaftBind = "nope" },
		"bad seed":       func(c *Config) { c.SeedBackends = []Backend{{ID: "x"}} },
		"bad routing":    func(c *Config) { c.SeedRouting.PrefixLength = 1 },
		"bad discovery":  func(c *Config) { c.Discovery.Name = "svc.local"; c.Discovery.Port = 0 },
		"zero threshold": func(c *Config) { c.HealthFailThreshold = 0 },
	} {
		c := fastConfig("a")
		mod(&c)
		if err := c.Validate(); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// TestVersionSkewRefused: the leader writes a command only when every
// router can apply it. A router advertising an earlier command level (an
// old version, mid rolling upgrade), or missing from gossip, makes level-2
// writes fail with ErrVersionSkew and change nothing, while level-1 writes
// still commit; once every router advertises the level they commit.
func TestVersionSkewRefused(t *testing.T) {
	tn := newTestNet(t, true)
	nodes := tn.startGroup([]string{"a", "b", "c"}, nil)
	l := leader(t, nodes)
	var e0 uint64
	testkit.WaitFor(t, 10*time.Second, "seed", func() bool { _, e0 = l.c.State(); return e0 > 0 })
	converged(t, nodes, e0)
	var old *tnode
	for _, n := range nodes {
		if n != l {
			old = n
			break
		}
	}
	ctx := context.Background()
	splits := SetSplits([]ring.Split{{Key: 42, Depth: 1}})
	adaptive := testRouting()
	fixed := testRouting()
	fixed.KeyDepth, fixed.Overflow = ring.FixedDepth, ring.ThresholdOverflow
	// seen waits until the leader's view of gossip shows router id with
	// ops (present false: missing).
	seen := func(id string, ops uint8, present bool) {
		t.Helper()
		testkit.WaitFor(t, 5*time.Second, "the leader's view of "+id, func() bool {
			m, ok := l.c.view.Load().get(id)
			return ok == present && (!ok || m.Ops == ops)
		})
	}
	wantSkew := func(what string, cmd Command, contains string) {
		t.Helper()
		_, err := l.c.Apply(ctx, cmd)
		if !errors.Is(err, ErrVersionSkew) {
			t.Fatalf("%s: %v, want ErrVersionSkew", what, err)
		}
		if !strings.Contains(err.Error(), contains) {
			t.Fatalf("%s: %v, want it to name %q", what, err, contains)
		}
	}

	// Level 1 (FIXED keys, THRESHOLD overflow) commits whatever runs.
	tn.advertiseOps(old, true, 0)
	seen(old.id, 0, true)
	wantSkew("splits beside an old router", splits, "router "+old.id+" runs an earlier version")
	e1 := applyAny(t, nodes, SetRouting(fixed))
	st := converged(t, nodes, e1)
	if st.Routing.KeyDepth != ring.FixedDepth || len(st.Splits) != 0 {
		t.Fatalf("after refused splits and a FIXED write: %+v", st)
	}
	wantSkew("ADAPTIVE beside an old router", SetRouting(adaptive), "upgrade it first")
	if got, _ := l.c.State(); got.Routing.KeyDepth != ring.FixedDepth {
		t.Fatalf("refused write changed the routing: %+v", got.Routing)
	}

	// A router joining gossip with an earlier version counts too, before
	// it is in the Raft configuration.
	tn.advertise(old, true)
	tn.g.set(gossip.Member{Name: "d", Addr: "gossip-d", Meta: gossip.Meta{RaftAddr: "127.0.0.1:1", Voter: true, Ops: 1}})
	seen(old.id, CommandLevel, true)
	seen("d", 1, true)
	wantSkew("splits beside a joining level-1 router", splits, "router d applies commands up to level 1")
	tn.g.remove("d")
	seen("d", 0, false)

	// A configured router missing from gossip may come back old.
	tn.g.remove(old.id)
	seen(old.id, 0, false)
	wantSkew("splits with a router missing", splits, "not in gossip")
	tn.advertise(old, true)
	seen(old.id, CommandLevel, true)

	// Every router upgraded: both commit, everywhere, once d (added to
	// the configuration while it was in gossip) is removed for good.
	var e2 uint64
	testkit.WaitFor(t, 10*time.Second, "splits to commit once every router advertises the level", func() bool {
		var err error
		e2, err = l.c.Apply(ctx, splits)
		if err != nil && !errors.Is(err, ErrVersionSkew) {
			t.Fatalf("splits: %v", err)
		}
		return err == nil
	})
	e3 := applyAny(t, nodes, SetRouting(adaptive))
	st = converged(t, nodes, max(e2, e3))
	if len(st.Splits) != 1 || st.Routing.KeyDepth != ring.AdaptiveDepth {
		t.Fatalf("after the upgrade: splits %v routing %+v", st.Splits, st.Routing)
	}
}
