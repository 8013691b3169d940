package cluster

import (
	"net"
	"testing"
	"time"

	"github.com/warmroute/warmroute/gossip"
	"github.com/warmroute/warmroute/internal/testkit"
)

// TestWithRealGossip forms a cluster through memberlist on loopback:
// bootstrap-expect 3 from gossip metadata, and removal of a node that leaves
// gossip.
func TestWithRealGossip(t *testing.T) {
	var (
		gs    []*gossip.Mesh
		nodes []*tnode
	)
	t.Cleanup(func() {
		for _, n := range nodes {
			if n.c != nil {
				_ = n.c.Close()
			}
		}
		for _, g := range gs {
			if g != nil {
				_ = g.Close()
			}
		}
	})
	for i, id := range []string{"ga", "gb", "gc"} {
		// The Raft port is chosen first and advertised from the start:
		// SetMeta after the fact races with Members (gossip.Mesh.Members
		// reads memberlist's node structs outside its lock).
		raftAddr := freeAddr(t)
		gcfg := gossip.DefaultConfig()
		gcfg.NodeName = id
		gcfg.BindAddr = "127.0.0.1"
		gcfg.BindPort = 0
		gcfg.Meta = gossip.Meta{RaftAddr: raftAddr, Voter: true, Ops: CommandLevel}
		if i > 0 {
			gcfg.Join = []string{gs[0].Addr()}
		}
		g, err := gossip.New(gcfg, nil)
		if err != nil {
			t.Fatal(err)
		}
		gs = append(gs, g)
		cfg := fastConfig(id)
		cfg.RaftBind = raftAddr
		cfg.BootstrapExpect = 3
		cfg.DeadServerTimeout = 500 * time.Millisecond
		c, err := Open(cfg, g, nil)
		if err != nil {
			t.Fatal(err)
		}
		nodes = append(nodes, &tnode{id: id, cfg: cfg, c: c})
	}
	l := leader(t, nodes)
	agreed(t, nodes, 1, false)
	for _, n := range nodes {
		if s := raftServers(n.c); len(s) != 3 || !s["ga"] || !s["gb"] || !s["gc"] {
			t.Fatalf("%s: configuration %v", n.id, s)
		}
	}
	applyAll(t, nodes, changes("gossip")[:2])

	// A follower leaves: Raft stops, gossip says goodbye; the leader
	// removes it.
	var gone int
	for i, n := range nodes {
		if n != l {
			gone = i
			break
		}
	}
	_ = nodes[gone].c.Close()
	nodes[gone].c = nil
	_ = gs[gone].Close()
	gs[gone] = nil
	var rest []*tnode
	for _, n := range nodes {
		if n.c != nil {
			rest = append(rest, n)
		}
	}
	testkit.WaitFor(t, 20*time.Second, "departed node removed", func() bool {
		_, still := raftServers(leader(t, rest).c)[nodes[gone].id]
		return !still
	})
	applyAll(t, rest, changes("gossip")[2:3])
}

// freeAddr returns a loopback TCP address that was free a moment ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}
