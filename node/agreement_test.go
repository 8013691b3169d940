package node

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warmroute/warmroute/internal/testkit"
	"github.com/warmroute/warmroute/ring"
)

// TestAgreementWhileBackendsChange asks every node where 1,000 prompts go,
// over and over, while backends are added and removed under load. Nodes at
// the same epoch must agree on every prompt; the test reports how often
// nodes were at different epochs and how much they disagreed then.
func TestAgreementWhileBackendsChange(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-node test")
	}
	var urls []string
	for i := 0; i < 6; i++ {
		urls = append(urls, newHoldEngine(t, 5*time.Millisecond).srv.URL)
	}
	// Raft timeouts of 500 ms, not 100: with six clients loading the
	// routers (and the rest of the suite the machine), 100 ms heartbeats
	// were missed often enough for leadership to flap past the 10 s an
	// admin write may take. Agreement, not failover, is under test.
	nodes := startClusterRaft(t, 3, 500*time.Millisecond, func(i int, c *Config) { *c = testConfig(urls[:5]) })
	for _, n := range nodes {
		waitAgreed(t, n)
	}
	// Background load through every node.
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var sent, failed atomic.Int64
	for c := 0; c < 6; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ctx.Err() == nil; i++ {
				if _, err := send("http://"+nodes[c%3].TrafficAddr().String(), chat(fmt.Sprintf("load %d %d", c, i%50))); err != nil {
					failed.Add(1)
				}
				sent.Add(1)
			}
		}()
	}
	prompts := make([][]byte, 1000)
	rng := rand.New(rand.NewPCG(7, 7))
	for i := range prompts {
		prompts[i] = []byte(chat(fmt.Sprintf("agreement prompt %d", rng.Uint64())))
	}
	var rounds, sameEpochRounds, sameEpochMismatch, splitRounds, splitMismatch int
	sample := func() {
		epochs := map[uint64]bool{}
		for _, n := range nodes {
			_, e := n.proxy.Ring()
			epochs[e] = true
		}
		mismatch := 0
		for _, p := range prompts {
			var first string
			for j, n := range nodes {
				_, e, err := n.proxy.Explain(ring.Chat, p, nil)
				if err != nil {
					t.Fatal(err)
				}
				if j == 0 {
					first = e.Backend
				} else if e.Backend != first {
					mismatch++
					break
				}
			}
		}
		// Re-read: the epoch may have moved while sampling.
		for _, n := range nodes {
			_, e := n.proxy.Ring()
			epochs[e] = true
		}
		rounds++
		if len(epochs) == 1 {
			sameEpochRounds++
			sameEpochMismatch += mismatch
		} else {
			splitRounds++
			splitMismatch += mismatch
		}
	}
	admin := "http://" + nodes[1].AdminAddr().String()
	for step := 0; step < 6; step++ {
		sample()
		var r adminResp
		if step%2 == 0 {
			r = adminDo(t, "POST", admin+"/v1/backends", "", `{"url":"`+urls[5]+`"}`)
		} else {
			r = adminDo(t, "DELETE", admin+"/v1/backends/"+urls[5][len("http://"):], "", "")
		}
		if r.status != 200 {
			t.Fatalf("step %d: %d %s", step, r.status, r.raw)
		}
		for i := 0; i < 3; i++ {
			sample()
		}
	}
	stop()
	wg.Wait()
	t.Logf("%d sampling rounds of 1,000 prompts on 3 nodes: %d at one epoch with %d disagreements; %d straddled a change with %d disagreeing prompts; load: %d requests, %d failed",
		rounds, sameEpochRounds, sameEpochMismatch, splitRounds, splitMismatch, sent.Load(), failed.Load())
	if sameEpochMismatch != 0 {
		t.Errorf("nodes at the same epoch disagreed on %d prompts", sameEpochMismatch)
	}
	if failed.Load() != 0 {
		t.Errorf("%d requests failed while backends changed", failed.Load())
	}
}

// TestLeaderLossWritesResume stops the Raft leader's node and measures how
// long until a write through another node succeeds.
func TestLeaderLossWritesResume(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-node test")
	}
	e := newHoldEngine(t, 0)
	var nodes []*Node
	var cancels []context.CancelFunc
	var dones []chan error
	for i := 0; i < 3; i++ {
		cfg := testConfig([]string{e.srv.URL})
		cfg.Cluster.NodeName = fmt.Sprintf("router-%d", i)
		cfg.Cluster.GossipListen = "127.0.0.1:0"
		cfg.Cluster.RaftListen = "127.0.0.1:0"
		cfg.Cluster.RaftTimeout = 100 * time.Millisecond
		cfg.Cluster.BootstrapExpect = 3
		if i > 0 {
			cfg.Cluster.Join = []string{nodes[0].GossipAddr()}
		}
		n, err := New(cfg, Options{})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- n.Run(ctx) }()
		nodes, cancels, dones = append(nodes, n), append(cancels, cancel), append(dones, done)
	}
	stopped := make([]bool, 3)
	defer func() {
		for i := range nodes {
			if !stopped[i] {
				cancels[i]()
				<-dones[i]
			}
		}
	}()
	for _, n := range nodes {
		waitAgreed(t, n)
	}
	leader := -1
	testkit.WaitFor(t, 10*time.Second, "a leader", func() bool {
		for i, n := range nodes {
			if n.agree.IsLeader() {
				leader = i
				return true
			}
		}
		return false
	})
	survivor := nodes[(leader+1)%3]
	start := time.Now()
	cancels[leader]()
	<-dones[leader]
	stopped[leader] = true
	took := time.Since(start)
	start = time.Now()
	r := adminDo(t, "PATCH", "http://"+survivor.AdminAddr().String()+"/v1/config", "", `{"concurrency_threshold": 9}`)
	gap := time.Since(start)
	if r.status != 200 {
		t.Fatalf("write after losing the leader: %d %s", r.status, r.raw)
	}
	t.Logf("leader %s stopped (drain and leadership transfer took %v); the next write through %s succeeded %v later",
		nodes[leader].name, took, survivor.name, gap)
	for i, n := range nodes {
		if i == leader {
			continue
		}
		testkit.WaitFor(t, 5*time.Second, "the new config everywhere", func() bool { r, _ := n.proxy.Ring(); return r.Config().ConcurrencyThreshold == 9 })
	}
}
