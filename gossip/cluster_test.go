package gossip

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// crash stops a node the hard way: no goodbye, no leave, sockets closed.
func (c *Mesh) crash() {
	c.closeOnce.Do(func() {
		close(c.stopPub)
		<-c.pubDone
		_ = c.ml.Shutdown()
		c.halt()
	})
}

func TestPropagation3Nodes(t *testing.T) {
	nodes := startNodes(t, 3, nil)
	a := nodes[0]
	var lat []time.Duration
	for i := range 60 {
		v := int64(i + 1)
		backend := fmt.Sprintf("gpu-%d/", i%7)
		start := time.Now()
		a.src.set(backend, v)
		for _, nd := range nodes[1:] {
			waitFor(t, 10*time.Second, func() bool { return nd.c.View().RemoteInFlight(backend) == v },
				"%s sees %s=%d", nd.c.Name(), backend, v)
			lat = append(lat, time.Since(start))
		}
		// Decorrelate from the publish tick.
		time.Sleep(rand.N(a.c.cfg.PublishInterval))
	}
	t.Logf("propagation A->B,C over %d samples, publish interval %v: p50 %v p99 %v max %v",
		len(lat), a.c.cfg.PublishInterval, percentile(lat, 0.5), percentile(lat, 0.99), percentile(lat, 1))
	// Global in-flight is own + remote: with B also loading gpu-0/, A sees
	// B's share and B sees A's.
	nodes[1].src.set("gpu-0/", 4)
	waitFor(t, 10*time.Second, func() bool { return a.c.View().RemoteInFlight("gpu-0/") == 4 }, "A sees B's 4")
	waitFor(t, 10*time.Second, func() bool {
		return nodes[2].c.View().RemoteInFlight("gpu-0/") == 4+a.src.m["gpu-0/"]
	}, "C sees A's and B's figures summed")
	st := a.c.Stats()
	if st.MessagesSent == 0 || st.BytesSent == 0 || st.MessagesReceived == 0 || st.WirePacketBytes < st.BytesSent {
		t.Fatalf("stats %+v", st)
	}
}

func TestCrashedNodeShareDisappears(t *testing.T) {
	// Figures never expire here: only failure detection can drop them.
	nodes := startNodes(t, 5, func(c *Config) { c.ExpireAfter = time.Hour })
	for i, nd := range nodes {
		nd.src.set("shared", int64(1+i))
	}
	// Remote view of node i = total (15) minus its own.
	waitFor(t, 10*time.Second, func() bool {
		for i, nd := range nodes {
			if nd.c.View().RemoteInFlight("shared") != int64(15-(1+i)) {
				return false
			}
		}
		return true
	}, "all nodes see the others' figures")
	victim := nodes[4] // contributes 5
	start := time.Now()
	victim.c.crash()
	for _, nd := range nodes[:4] {
		want := int64(15-5) - nd.src.m["shared"]
		waitFor(t, 20*time.Second, func() bool { return nd.c.View().RemoteInFlight("shared") == want },
			"%s drops the crashed node's share", nd.c.Name())
	}
	t.Logf("crashed node's share gone on all 4 survivors after %v (probe %v, timeout %v, suspicion mult %d)",
		time.Since(start), victim.c.cfg.ProbeInterval, victim.c.cfg.ProbeTimeout, victim.c.cfg.SuspicionMult)
	waitMembers(t, nodes[:4], 4)
	// A crash is not a leave: the survivors keep retrying the crashed
	// node's address (so split halves find each other after a partition).
	for _, nd := range nodes[:4] {
		if l := nd.c.RecentlyLeft(); len(l) != 0 {
			t.Errorf("%s reports a crashed node as left: %+v", nd.c.Name(), l)
		}
		if addrs := nd.c.failedAddrs(time.Now()); !slices.Contains(addrs, victim.c.Addr()) {
			t.Errorf("%s does not retry the crashed node %s: %v", nd.c.Name(), victim.c.Addr(), addrs)
		}
	}
}

func TestGracefulLeaveShareDisappearsAtOnce(t *testing.T) {
	// Failure detection is made slow (tens of seconds) and figures never
	// expire, so only the goodbye and the leave can drop the share within
	// the deadline below.
	slow := func(c *Config) {
		c.ExpireAfter = time.Hour
		c.ProbeInterval = 5 * time.Second
		c.ProbeTimeout = 2 * time.Second
		c.SuspicionMult = 10
	}
	nodes := startNodes(t, 3, slow)
	for _, nd := range nodes {
		nd.src.set("shared", 10)
	}
	waitFor(t, 10*time.Second, func() bool {
		return nodes[0].c.View().RemoteInFlight("shared") == 20 && nodes[1].c.View().RemoteInFlight("shared") == 20
	}, "A and B see 20 remote")
	// Watch A's view while C closes.
	dropped := make(chan time.Duration, 1)
	start := time.Now()
	go func() {
		deadline := start.Add(10 * time.Second)
		for nodes[0].c.View().RemoteInFlight("shared") != 10 && time.Now().Before(deadline) {
			time.Sleep(100 * time.Microsecond)
		}
		dropped <- time.Since(start)
	}()
	if err := nodes[2].c.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	closeTook := time.Since(start)
	for _, nd := range nodes[:2] {
		waitFor(t, 10*time.Second, func() bool { return nd.c.View().RemoteInFlight("shared") == 10 },
			"%s drops the leaving node's share", nd.c.Name())
	}
	t.Logf("leaving node's share gone on A %v after Close began (Close took %v)", <-dropped, closeTook)
	waitMembers(t, nodes[:2], 2)
	// The others report it as recently left (the Raft leader removes such
	// a server at once), with its metadata, and do not retry it.
	for _, nd := range nodes[:2] {
		if addrs := nd.c.failedAddrs(time.Now()); len(addrs) != 0 {
			t.Errorf("%s retries a node that left: %v", nd.c.Name(), addrs)
		}
		waitFor(t, 10*time.Second, func() bool {
			l := nd.c.RecentlyLeft()
			return len(l) == 1 && l[0].Name == "node-c" && l[0].State == "left" && l[0].Meta.Wire == wireVersion
		}, "%s reports node-c as left", nd.c.Name())
	}
	if err := nodes[2].c.Close(); err != nil {
		t.Fatalf("second close: %v", err)
	}
}

func TestLateJoinerConverges(t *testing.T) {
	// Unchanged figures are re-sent only every minute, so a node joining
	// after the first publishes can learn them only through push/pull.
	quiet := func(c *Config) {
		c.RefreshInterval = time.Minute
		c.ExpireAfter = time.Hour
		c.PushPullInterval = time.Hour
	}
	nodes := startNodes(t, 3, quiet)
	for i, nd := range nodes {
		nd.src.set("x", int64(1+i))
		nd.src.set(fmt.Sprintf("only-%d", i), 7)
	}
	waitFor(t, 10*time.Second, func() bool { return nodes[0].c.View().RemoteInFlight("x") == 5 }, "A sees B+C")
	// Let the resend window pass so nothing more is sent.
	waitResendsDone(t, nodes)

	late := startNode(t, "node-late", nodes, quiet)
	start := time.Now()
	waitFor(t, 10*time.Second, func() bool {
		v := late.c.View()
		return v.RemoteInFlight("x") == 6 && v.RemoteInFlight("only-0") == 7 &&
			v.RemoteInFlight("only-1") == 7 && v.RemoteInFlight("only-2") == 7
	}, "the late joiner converges")
	t.Logf("late joiner converged %v after New returned", time.Since(start))
	// And the others count the late joiner's figures.
	late.src.set("x", 100)
	waitFor(t, 10*time.Second, func() bool { return nodes[1].c.View().RemoteInFlight("x") == 104 }, "B sees the late joiner")
}

func TestEngineStatsOwnershipAndSharing(t *testing.T) {
	nodes := startNodes(t, 3, nil)
	backends := make([]string, 30)
	for i := range backends {
		backends[i] = fmt.Sprintf("gpu-%d/", i)
	}
	owners := func(nodes []*testNode) map[string]*testNode {
		own := map[string]*testNode{}
		for _, b := range backends {
			for _, nd := range nodes {
				if nd.c.IsScraper(b) {
					if prev := own[b]; prev != nil {
						t.Fatalf("%s owned by %s and %s", b, prev.c.Name(), nd.c.Name())
					}
					own[b] = nd
				}
			}
			if own[b] == nil {
				t.Fatalf("%s has no scraper", b)
			}
		}
		return own
	}
	own := owners(nodes)
	perNode := map[string]int{}
	for i, b := range backends {
		o := own[b]
		perNode[o.c.Name()]++
		o.c.PublishEngine(b, EngineStats{OK: true, Known: EngineWaiting | EngineKVUsage, Waiting: float64(i), KVUsage: 0.5})
	}
	if len(perNode) != 3 {
		t.Fatalf("scraping not spread: %v", perNode)
	}
	for _, nd := range nodes {
		waitFor(t, 10*time.Second, func() bool {
			v := nd.c.View()
			for i, b := range backends {
				if s, ok := v.Engine(b); !ok || !s.Has(EngineWaiting) || s.Waiting != float64(i) {
					return false
				}
			}
			return true
		}, "%s sees every backend's engine stats", nd.c.Name())
	}
	// When a scraper dies, its backends move to the survivors.
	nodes[0].c.crash()
	waitMembers(t, nodes[1:], 2)
	own2 := owners(nodes[1:])
	for _, b := range backends {
		if own[b] != nodes[0] && own2[b] != own[b] {
			t.Errorf("%s moved from %s to %s though its owner lives", b, own[b].c.Name(), own2[b].c.Name())
		}
	}
}

func TestEncryption(t *testing.T) {
	key := []byte("0123456789abcdef")
	withKey := func(k []byte) func(*Config) {
		return func(c *Config) { c.SecretKey = k }
	}
	nodes := startNodes(t, 2, withKey(key))
	nodes[0].src.set("x", 3)
	waitFor(t, 10*time.Second, func() bool { return nodes[1].c.View().RemoteInFlight("x") == 3 }, "encrypted figures arrive")

	// A node with another key cannot join.
	cfg := testConfig("intruder")
	cfg.SecretKey = []byte("fedcba9876543210")
	cfg.Join = []string{nodes[0].c.Addr()}
	cfg.RejoinInterval = time.Hour
	var logs syncBuffer
	cfg.Logger = logs.debugLogger()
	c, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// New tried once; a retry in the background fails as well.
	waitFor(t, 10*time.Second, func() bool { return joinFailures(&logs) >= 2 }, "the intruder's retry fails")
	if n := len(c.View().members); n != 1 {
		t.Fatalf("intruder sees %d members", n)
	}
	if n := len(nodes[0].c.Members()); n != 2 {
		t.Fatalf("cluster has %d members after intrusion attempt", n)
	}
	// Plaintext on a non-loopback address needs an explicit opt-in.
	cfg = DefaultConfig()
	cfg.NodeName = "lan"
	if _, err := New(cfg, nil); !errors.Is(err, ErrPlaintext) {
		t.Fatalf("plaintext on 0.0.0.0: err = %v", err)
	}
}

func TestMembersMetaAndSubscribe(t *testing.T) {
	reg := prometheus.NewRegistry()
	nodes := startNodes(t, 2, func(c *Config) {
		c.Meta = Meta{AdminAddr: "127.0.0.1:9" + c.NodeName[len(c.NodeName)-1:], RaftAddr: "127.0.0.1:7000", Zone: "z1", Voter: true}
		if c.NodeName == "node-a" {
			c.Registry = reg
		}
	})
	a := nodes[0]
	ch, cancel := a.c.Subscribe()
	defer cancel()
	ms := a.c.Members()
	if len(ms) != 2 {
		t.Fatalf("members %+v", ms)
	}
	for _, m := range ms {
		if m.State != "alive" || m.Meta.RaftAddr != "127.0.0.1:7000" || m.Meta.Wire != wireVersion || m.Self != (m.Name == "node-a") {
			t.Errorf("member %+v", m)
		}
		if m.Name == "node-b" && m.Meta.AdminAddr != "127.0.0.1:9b" {
			t.Errorf("node-b admin %q", m.Meta.AdminAddr)
		}
	}
	// A change wakes the subscriber.
	for len(ch) > 0 {
		<-ch
	}
	nodes[1].src.set("x", 1)
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatal("no notification after a change")
	}
	waitFor(t, 10*time.Second, func() bool { return a.c.View().RemoteInFlight("x") == 1 }, "A sees x=1")
	// A subscriber that does not read holds one pending notification and
	// never stalls the Mesh.
	for i := range 50 {
		nodes[1].src.set("x", int64(i+2))
		time.Sleep(time.Millisecond)
	}
	waitFor(t, 10*time.Second, func() bool { return a.c.View().RemoteInFlight("x") == 51 }, "A sees x=51")
	if n := len(ch); n != 1 {
		t.Fatalf("%d pending notifications, want 1", n)
	}
	// Meta updates reach the others.
	if err := nodes[1].c.SetMeta(Meta{Zone: "z2"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, func() bool {
		for _, m := range a.c.Members() {
			if m.Name == "node-b" {
				return m.Meta.Zone == "z2"
			}
		}
		return false
	}, "A sees node-b's new zone")

	mfs, err := reg.Gather()
	if err != nil || len(mfs) < 10 {
		t.Fatalf("registry holds %d metrics (%v)", len(mfs), err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "warmroute_gossip_members" {
			if got := mf.GetMetric()[0].GetGauge().GetValue(); got != 2 {
				t.Errorf("members gauge = %v", got)
			}
		}
	}
	if err := a.c.Close(); err != nil {
		t.Fatal(err)
	}
	if _, ok := <-ch; ok {
		// drain a pending notification, then expect close
		if _, ok := <-ch; ok {
			t.Fatal("subscriber channel not closed by Close")
		}
	}
	if mfs, _ := reg.Gather(); len(mfs) != 0 {
		t.Fatalf("%d metrics left registered after Close", len(mfs))
	}
	ch2, _ := a.c.Subscribe()
	if _, ok := <-ch2; ok {
		t.Fatal("Subscribe after Close returned an open channel")
	}
}

func TestJoinRetriesUntilSeedIsUp(t *testing.T) {
	// Reserve a port for A, start B with A as its seed, then A.
	port := freeLoopbackPort(t, "127.0.0.1")
	// A name, not an address: every A/AAAA record of localhost is a seed.
	var logs syncBuffer
	b := startNode(t, "node-b", nil, func(c *Config) {
		c.Join = []string{fmt.Sprintf("localhost:%d", port)}
		c.Logger = logs.debugLogger()
	})
	if n := len(b.c.View().members); n != 1 {
		t.Fatalf("node-b sees %d members before its seed is up", n)
	}
	// New tried once; let a retry in the background fail as well.
	waitFor(t, 10*time.Second, func() bool { return joinFailures(&logs) >= 2 }, "node-b retries its seed")
	// A seed that comes up within joinWarnAfter is no problem to warn about.
	if strings.Contains(logs.String(), `level=WARN msg="gossip join failed`) {
		t.Fatalf("a join failing for less than %v logged as a warning:\n%s", joinWarnAfter, logs.String())
	}
	a := startNode(t, "node-a", nil, func(c *Config) { c.BindPort = port })
	waitMembers(t, []*testNode{a, b}, 2)
	// A seed that is this node itself is skipped.
	if addrs := a.c.resolveSeeds(); len(addrs) != 0 {
		t.Fatalf("node-a would join %v", addrs)
	}
}

// partition cuts traffic between the two groups (both ways).
func partition(a, b []*testNode) {
	set := func(from, to []*testNode) {
		blocked := map[netip.AddrPort]bool{}
		for _, n := range to {
			blocked[netip.MustParseAddrPort(n.c.Addr())] = true
		}
		f := func(ap netip.AddrPort) bool { return blocked[ap] }
		for _, n := range from {
			n.c.tr.drop.Store(&f)
		}
	}
	set(a, b)
	set(b, a)
}

func heal(nodes []*testNode) {
	for _, n := range nodes {
		n.c.tr.drop.Store(nil)
	}
}

func TestPartitionHeals(t *testing.T) {
	fast := func(c *Config) { c.RejoinInterval = 300 * time.Millisecond }
	nodes := startNodes(t, 3, fast)
	for _, nd := range nodes {
		nd.src.set("x", 1)
	}
	waitFor(t, 10*time.Second, func() bool { return nodes[0].c.View().RemoteInFlight("x") == 2 }, "A sees B and C")
	// A (the seed, which has no seeds itself) is cut off from B and C.
	partition(nodes[:1], nodes[1:])
	waitFor(t, 20*time.Second, func() bool {
		return len(nodes[0].c.View().members) == 1 && len(nodes[1].c.View().members) == 2 && len(nodes[2].c.View().members) == 2
	}, "both sides see the partition")
	if got := nodes[0].c.View().RemoteInFlight("x"); got != 0 {
		t.Fatalf("isolated A still counts %d remote", got)
	}
	heal(nodes)
	start := time.Now()
	waitMembers(t, nodes, 3)
	waitFor(t, 10*time.Second, func() bool { return nodes[0].c.View().RemoteInFlight("x") == 2 }, "A counts B and C again")
	t.Logf("merged %v after the partition healed", time.Since(start))
}
