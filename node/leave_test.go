package node

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/warmroute/warmroute/internal/testkit"
)

// TestGracefulLeaveLeavesRaft: a router that shuts down cleanly says
// goodbye, and the Raft leader removes it from the configuration at once
// (well before DeadNodeTimeout) and promotes a non-voter in its place; a
// router that comes back under the same name is added again.
func TestGracefulLeaveLeavesRaft(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-node test")
	}
	e := newHoldEngine(t, 0)
	type proc struct {
		n      *Node
		cancel context.CancelFunc
		done   chan error
	}
	start := func(i int, seed string) proc {
		cfg := testConfig([]string{e.srv.URL})
		cfg.Cluster.NodeName = fmt.Sprintf("router-%d", i)
		cfg.Cluster.GossipListen = "127.0.0.1:0"
		cfg.Cluster.RaftListen = "127.0.0.1:0"
		cfg.Cluster.RaftTimeout = 100 * time.Millisecond
		cfg.Cluster.DeadNodeTimeout = 5 * time.Minute // only a leave can explain a prompt removal
		if i < 3 {
			cfg.Cluster.BootstrapExpect = 3
		}
		if seed != "" {
			cfg.Cluster.Join = []string{seed}
		}
		n, err := New(cfg, Options{})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- n.Run(ctx) }()
		return proc{n, cancel, done}
	}
	var ps []proc
	for i := 0; i < 4; i++ {
		seed := ""
		if i > 0 {
			seed = ps[0].n.GossipAddr()
		}
		ps = append(ps, start(i, seed))
	}
	stopped := map[int]bool{}
	stop := func(i int) {
		ps[i].cancel()
		if err := <-ps[i].done; err != nil {
			t.Errorf("router-%d: %v", i, err)
		}
		stopped[i] = true
	}
	defer func() {
		for i := range ps {
			if !stopped[i] {
				stop(i)
			}
		}
	}()
	servers := func(n *Node) map[string]bool {
		out := map[string]bool{}
		for _, s := range n.agree.Status().Servers {
			out[s.ID] = s.Voter
		}
		return out
	}
	var leader *Node
	testkit.WaitFor(t, 20*time.Second, "3 voters and 1 non-voter", func() bool {
		for _, p := range ps {
			if p.n.agree.IsLeader() {
				leader = p.n
				s := servers(p.n)
				voters := 0
				for _, v := range s {
					if v {
						voters++
					}
				}
				return len(s) == 4 && voters == 3
			}
		}
		return false
	})
	// Stop a voter that does not lead.
	victim := -1
	for i, p := range ps {
		if p.n != leader && servers(leader)[p.n.name] {
			victim = i
			break
		}
	}
	name := ps[victim].n.name
	began := time.Now()
	stop(victim)
	testkit.WaitFor(t, 15*time.Second, "the leaver removed and a non-voter promoted", func() bool {
		s := servers(leader)
		if _, still := s[name]; still {
			return false
		}
		voters := 0
		for _, v := range s {
			if v {
				voters++
			}
		}
		return voters == 3
	})
	t.Logf("%s left; removed from Raft and replaced by a promoted non-voter %v after it began shutting down (DeadNodeTimeout 5m)",
		name, time.Since(began).Round(time.Millisecond))

	// It comes back under the same name and is added again.
	ps[victim] = start(victim, leader.GossipAddr())
	delete(stopped, victim)
	testkit.WaitFor(t, 20*time.Second, "the returning router added again", func() bool {
		_, back := servers(leader)[name]
		return back
	})
}
