package node

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warmroute/warmroute/internal/testkit"
	"github.com/warmroute/warmroute/ring"
)

// TestSplitsAgreedAcrossRouters loads three clustered routers with
// conversations that share a 3 KiB preamble, in front of engines that
// report a queue. The leader must split the preamble, every router must install the same splits at the same epoch,
// the conversations must then spread over the backends while each stays on
// one, and routers at one epoch must agree on every decision.
func TestSplitsAgreedAcrossRouters(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-node test")
	}
	nodes := startSplitCluster(t, true)
	if r, _ := nodes[0].proxy.Ring(); !r.Config().Adaptive() {
		t.Fatal("the default settings do not use ADAPTIVE keys")
	}
	stop := loadConversations(t, func(c, i int) *Node { return nodes[(c+i)%3] })
	// The preamble fills three blocks: all three must be split.
	waitSplit(t, nodes, 3)
	stop()
	// Settled: the same splits and epoch everywhere.
	testkit.WaitFor(t, 10*time.Second, "one epoch and one split set", func() bool {
		_, e0 := nodes[0].proxy.Ring()
		for _, n := range nodes[1:] {
			if _, e := n.proxy.Ring(); e != e0 || !slices.Equal(n.proxy.Splits(), nodes[0].proxy.Splits()) {
				return false
			}
		}
		return true
	})
	st, epoch := nodes[0].agree.State()
	if !slices.Equal(st.Splits, nodes[0].proxy.Splits()) {
		t.Fatalf("installed splits %v differ from the agreed %v at epoch %d", nodes[0].proxy.Splits(), st.Splits, epoch)
	}
	backends := map[string]int{}
	for conv := 0; conv < 120; conv++ {
		body := []byte(conversation(conv))
		var first string
		for j, n := range nodes {
			info, e, err := n.proxy.Explain(ring.Chat, body, nil)
			if err != nil {
				t.Fatal(err)
			}
			if info.PrefixBytes <= len(splitPreamble) {
				t.Fatalf("conversation %d routes on %d bytes, inside the preamble", conv, info.PrefixBytes)
			}
			if j == 0 {
				first = e.Backend
			} else if e.Backend != first {
				t.Fatalf("conversation %d: %s says %s, router 0 says %s", conv, n.name, e.Backend, first)
			}
		}
		backends[first]++
	}
	if len(backends) < 4 {
		t.Fatalf("120 conversations on a split preamble went to %d of 5 backends: %v", len(backends), backends)
	}
	t.Logf("120 conversations over the split preamble: %v", backends)
}

// TestBalanceFromFollowersTraffic sends skewed traffic through the two
// followers only. The leader's own counts stay empty, so it can balance
// only from the counts the followers publish through gossip: it must move
// partitions off the overloaded backend, and every router must route the
// moved keys alike. The engines report queued requests, so that every
// backend is pressed (a backend that keeps up gives nothing away:
// TestPlanMovesEvensTraffic).
func TestBalanceFromFollowersTraffic(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-node test")
	}
	// The first engine queues; the others have room (a move goes only to
	// a backend that had room all along).
	var urls []string
	var hot string
	for i := 0; i < 4; i++ {
		metrics := "vllm:num_requests_running 1\nvllm:num_requests_waiting 0\n"
		if i == 0 {
			metrics = "vllm:num_requests_running 8\nvllm:num_requests_waiting 2\n"
		}
		e := newHoldEngineMetrics(t, time.Millisecond, metrics)
		if i == 0 {
			hot = e.id()
		}
		urls = append(urls, e.srv.URL)
	}
	nodes := startClusterRaft(t, 3, 300*time.Millisecond, func(i int, c *Config) {
		*c = testConfig(urls)
		c.Engine.MetricsPath = "/metrics"
	})
	for _, n := range nodes {
		waitAgreed(t, n)
	}
	var leader *Node
	var followers []*Node
	for _, n := range nodes {
		if n.agree.IsLeader() {
			leader = n
		} else {
			followers = append(followers, n)
		}
	}
	if leader == nil || len(followers) != 2 {
		t.Fatal("no single leader")
	}
	// Conversations of which 16 are owned by the queueing backend (hot)
	// and 16 spread over the others: the hot backend gets half the
	// traffic.
	var hotPrompts, rest []string
	for i := 0; len(hotPrompts) < 16 || len(rest) < 16; i++ {
		if i > 100000 {
			t.Fatal("no prompts found")
		}
		p := chat(fmt.Sprintf("conversation %d: tell me about item %d", i, i*13))
		_, e, err := leader.proxy.Explain(ring.Chat, []byte(p), nil)
		if err != nil {
			t.Fatal(err)
		}
		if len(e.Candidates) == 0 {
			t.Fatalf("no candidates for %q", p)
		}
		switch owner := e.Candidates[0].ID; {
		case owner == hot && len(hotPrompts) < 16:
			hotPrompts = append(hotPrompts, p)
		case owner != hot && len(rest) < 16:
			rest = append(rest, p)
		}
	}
	prompts := append(hotPrompts, rest...)
	ctx, stop := context.WithTimeout(context.Background(), 40*time.Second)
	defer stop()
	var wg sync.WaitGroup
	for c := 0; c < 4; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ctx.Err() == nil && i < 50000; i++ {
				_, _ = send("http://"+followers[(c+i)%2].TrafficAddr().String(), prompts[(c*7+i)%len(prompts)])
			}
		}()
	}
	start := time.Now()
	testkit.WaitFor(t, 35*time.Second, "the leader to move partitions off the hot backend", func() bool {
		st, _ := leader.agree.State()
		return len(st.Moves) > 0
	})
	t.Logf("partitions moved %v after the load started", time.Since(start).Round(time.Millisecond))
	stop()
	leaderSawNothing(t, leader)
	st, _ := leader.agree.State()
	// Whichever router led when they were committed counted them.
	counted := 0.0
	for _, n := range nodes {
		counted += movesCounted(t, n)
	}
	if counted < 1 {
		t.Errorf("warmroute_partition_moves_total %v over the routers after %d moves", counted, len(st.Moves))
	}
	for _, m := range st.Moves {
		if m.Backend == hot {
			t.Fatalf("a partition moved onto the hot backend %s: %+v", hot, m)
		}
	}
	// Once the load has stopped, the routers must settle on one epoch and
	// route every prompt alike. Right after it they need not: requests
	// still open count on some routers until their end is gossiped (22-47
	// ms in ten runs), and the leader may commit one more round of moves,
	// so agreement is awaited, for at most 2 s, not sampled once.
	var diff string
	agree := func() bool {
		_, e0 := nodes[0].proxy.Ring()
		for _, p := range prompts {
			var first string
			for j, n := range nodes {
				_, e, err := n.proxy.Explain(ring.Chat, []byte(p), nil)
				if err != nil {
					t.Fatal(err)
				}
				if j == 0 {
					first = e.Backend
				} else if e.Backend != first {
					diff = fmt.Sprintf("%s routes %q to %s, router 0 to %s", n.name, p, e.Backend, first)
					return false
				}
			}
		}
		for _, n := range nodes {
			if _, e := n.proxy.Ring(); e != e0 {
				diff = fmt.Sprintf("%s is at epoch %d, router 0 at %d", n.name, e, e0)
				return false
			}
		}
		return true
	}
	settle := time.Now()
	for deadline := settle.Add(2 * time.Second); !agree(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("2 s after the load stopped the routers still disagree: %s", diff)
		}
	}
	if diff != "" {
		t.Logf("the routers agreed %v after the load stopped; before: %s", time.Since(settle).Round(time.Millisecond), diff)
	}
}

// splitPreamble is the split tests' shared preamble: 3,240 bytes, three
// chain blocks.
var splitPreamble = strings.Repeat("Shared operating manual, version 7. ", 90)

// startSplitCluster starts three clustered routers with default settings
// in front of five engines that answer in a millisecond and, with queued,
// report 8 requests waiting (so that an owner with requests in flight is
// pressed), else none; and waits until each has applied the agreed state.
func startSplitCluster(t *testing.T, queued bool) []*Node {
	t.Helper()
	metrics := "vllm:num_requests_running 1\nvllm:num_requests_waiting 0\n"
	if queued {
		metrics = "vllm:num_requests_running 8\nvllm:num_requests_waiting 8\n"
	}
	var urls []string
	for i := 0; i < 5; i++ {
		urls = append(urls, newHoldEngineMetrics(t, time.Millisecond, metrics).srv.URL)
	}
	nodes := startClusterRaft(t, 3, 300*time.Millisecond, func(i int, c *Config) {
		*c = testConfig(urls)
		c.Engine.MetricsPath = "/metrics"
	})
	for _, n := range nodes {
		waitAgreed(t, n)
	}
	return nodes
}

// conversation is conversation conv's prompt over the split tests'
// shared preamble.
func conversation(conv int) string {
	return chat(splitPreamble + fmt.Sprintf("conversation %d asks about item %d", conv, conv*7))
}

// loadConversations sends 120 conversations over the shared preamble from
// three clients, request i of client c to route(c, i), until the returned
// stop is called (or 20,000 requests per client); stop waits for them.
func loadConversations(t *testing.T, route func(c, i int) *Node) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for c := 0; c < 3; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ctx.Err() == nil && i < 20000; i++ {
				_, _ = send("http://"+route(c, i).TrafficAddr().String(), conversation((c*40+i)%120))
			}
		}()
	}
	stop = func() { cancel(); wg.Wait() }
	t.Cleanup(stop)
	return stop
}

// leaderSawNothing fails the test if the leader counted a request: the
// tests that call it send their traffic through the followers only.
func leaderSawNothing(t *testing.T, leader *Node) {
	t.Helper()
	own, _ := leader.proxy.PartitionLoads(nil)
	for p, c := range own {
		if c != 0 {
			t.Fatalf("the leader counted partition %d (%d); the test sends nothing through it", p, c)
		}
	}
}

// waitSplit waits until every router has at least n splits installed (a
// preamble of n blocks split whole) and logs how long that took.
func waitSplit(t *testing.T, nodes []*Node, n int) {
	t.Helper()
	start := time.Now()
	testkit.WaitFor(t, 30*time.Second, "the preamble split on every router", func() bool {
		for _, nd := range nodes {
			if len(nd.proxy.Splits()) < n {
				return false
			}
		}
		return true
	})
	t.Logf("preamble split on all %d routers %v after the load started", len(nodes), time.Since(start).Round(time.Millisecond))
}

// TestSplitsFromFollowerTraffic sends conversations over a shared preamble
// through one follower only, as clients pinned to one router by their
// connections do, in front of engines that report a queue. The leader's own
// counts stay empty: it must split the preamble from the counts the
// follower shares through gossip, and every router must install them.
func TestSplitsFromFollowerTraffic(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-node test")
	}
	nodes := startSplitCluster(t, true)
	var leader, follower *Node
	for _, n := range nodes {
		switch {
		case n.agree.IsLeader():
			leader = n
		case follower == nil:
			follower = n
		}
	}
	if leader == nil || follower == nil {
		t.Fatal("no leader and follower")
	}
	stop := loadConversations(t, func(int, int) *Node { return follower })
	waitSplit(t, nodes, 3)
	stop()
	leaderSawNothing(t, leader)
	st, _ := leader.agree.State()
	if len(st.Splits) < 3 {
		t.Fatalf("agreed splits %v", st.Splits)
	}
}

// TestNoSplitWithoutPressure: the same conversations over the shared
// preamble, in front of engines that never queue, split nothing: the
// preamble carries every request, but its owner keeps up.
func TestNoSplitWithoutPressure(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-node test")
	}
	nodes := startSplitCluster(t, false)
	stop := loadConversations(t, func(c, i int) *Node { return nodes[(c+i)%3] })
	// Every router's counts call the preamble hot within a second
	// (TestSplitsAgreedAcrossRouters); give the leader five.
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		for _, n := range nodes {
			if s := n.proxy.Splits(); len(s) > 0 {
				t.Fatalf("%s split %v in front of engines that never queue", n.name, s)
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	stop()
	var counted uint64
	for _, n := range nodes {
		loads, _ := n.proxy.PartitionLoads(nil)
		for _, c := range loads {
			counted += uint64(c)
		}
	}
	if counted == 0 {
		t.Fatal("no request was counted: the load did not run")
	}
	st, _ := nodes[0].agree.State()
	if len(st.Splits) != 0 {
		t.Fatalf("agreed splits %v", st.Splits)
	}
}

// movesCounted reads warmroute_partition_moves_total from n's registry.
func movesCounted(t *testing.T, n *Node) float64 {
	t.Helper()
	fams, err := n.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() == "warmroute_partition_moves_total" && len(f.GetMetric()) == 1 {
			return f.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatal("no warmroute_partition_moves_total")
	return 0
}
