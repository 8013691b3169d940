package gossiptest_test

import (
	"crypto/x509"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/warmroute/warmroute/gossip"
	"github.com/warmroute/warmroute/gossip/gossiptest"
	"github.com/warmroute/warmroute/internal/identity"
	"github.com/warmroute/warmroute/internal/testkit"
)

var key = []byte("0123456789abcdef")

type source struct {
	mu sync.Mutex
	m  map[string]int64
}

func (s *source) AppendInFlight(dst []gossip.BackendLoad) []gossip.BackendLoad {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, v := range s.m {
		dst = append(dst, gossip.BackendLoad{Backend: k, InFlight: v})
	}
	return dst
}

func (s *source) set(k string, v int64) {
	s.mu.Lock()
	s.m[k] = v
	s.mu.Unlock()
}

type node struct {
	c   *gossip.Mesh
	src *source
	id  *identity.Bundle
}

// cluster starts routers node-a, node-b, ... on 127.0.0.1, with
// certificates from ca when it is not nil.
func cluster(t *testing.T, n int, ca *testCA) []node {
	t.Helper()
	var nodes []node
	for i := range n {
		cfg := gossip.DefaultConfig()
		cfg.NodeName = fmt.Sprintf("node-%c", 'a'+i)
		cfg.BindAddr, cfg.BindPort = "127.0.0.1", 0
		cfg.SecretKey = key
		if ca != nil {
			cfg.Identity = ca.bundle(t, cfg.NodeName)
		}
		if i > 0 {
			cfg.Join = []string{nodes[0].c.Addr()}
		}
		src := &source{m: map[string]int64{}}
		c, err := gossip.New(cfg, src)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		nd := node{c: c, src: src}
		if ca != nil {
			nd.id = cfg.Identity.(*identity.Bundle)
		}
		nodes = append(nodes, nd)
	}
	for _, nd := range nodes {
		waitFor(t, func() bool { return len(nd.c.View().Members()) == n }, "%s sees %d members", nd.c.Name(), n)
	}
	return nodes
}

func waitFor(t *testing.T, cond func() bool, format string, args ...any) {
	t.Helper()
	testkit.WaitFor(t, 10*time.Second, fmt.Sprintf(format, args...), cond)
}

type testCA struct {
	ca   *identity.CA
	pool *x509.CertPool
}

func newCA(t *testing.T) *testCA {
	ca, err := identity.NewCA("test", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	return &testCA{ca, pool}
}

func (ca *testCA) bundle(t *testing.T, name string) *identity.Bundle {
	b, err := ca.ca.Bundle(identity.Request{Name: name, Validity: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func send(t *testing.T, addr string, pkt []byte, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	if err := gossiptest.Send(addr, pkt); err != nil {
		t.Fatal(err)
	}
}

// Without an Identity a key holder speaks for any member: the forged
// packets here are what such a router takes (which also checks their
// encoding).
func TestForgedFiguresCountWithoutIdentity(t *testing.T) {
	nodes := cluster(t, 2, nil)
	a := nodes[0].c
	loads := []gossip.BackendLoad{{Backend: "gpu-1/", InFlight: 1000, Failing: true}}
	eng := gossiptest.Engine{Backend: "gpu-1/", Stats: gossip.EngineStats{OK: true, Known: gossip.EngineWaiting, Waiting: 42}}
	pkt, err := gossiptest.ForgePublish(key, "node-b", uint64(time.Now().UnixNano())+1e12, 1, loads, eng)
	send(t, a.Addr(), pkt, err)
	waitFor(t, func() bool {
		v := a.View()
		e, _ := v.Engine("gpu-1/")
		h := v.Health("gpu-1/")
		return v.RemoteInFlight("gpu-1/") == 1000 && e.Waiting == 42 && len(h.Failing) == 1 && h.Failing[0] == "node-b"
	}, "A takes the forged figures")
	pkt, err = gossiptest.ForgeBye(key, "node-b", uint64(time.Now().UnixNano())+2e12, 1)
	send(t, a.Addr(), pkt, err)
	waitFor(t, func() bool { return a.View().RemoteInFlight("gpu-1/") == 0 }, "A drops node-b's figures after a forged goodbye")
}

func TestForgedFiguresRefusedWithIdentity(t *testing.T) {
	ca := newCA(t)
	nodes := cluster(t, 2, ca)
	a, b := nodes[0], nodes[1]
	b.src.set("gpu-1/", 1)
	waitFor(t, func() bool { return a.c.View().RemoteInFlight("gpu-1/") == 1 }, "A sees B")
	rejected := func(why string) uint64 { return a.c.Stats().Rejected[why] }
	loads := []gossip.BackendLoad{{Backend: "gpu-1/", InFlight: 1000, Failing: true}}
	instance := uint64(time.Now().UnixNano()) + 1e12

	before := rejected("unsigned")
	pkt, err := gossiptest.ForgePublish(key, "node-b", instance, 1, loads)
	send(t, a.c.Addr(), pkt, err)
	waitFor(t, func() bool { return rejected("unsigned") > before }, "A refuses an unsigned publish")

	other := newCA(t).bundle(t, "node-b")
	before = rejected("bad_chain")
	pkt, err = gossiptest.ForgeChain(key, "node-b", other.Chain(), false)
	send(t, a.c.Addr(), pkt, err)
	waitFor(t, func() bool { return rejected("bad_chain") > before }, "A refuses a chain from another CA")
	before = rejected("unknown_key")
	pkt, err = gossiptest.ForgeSigned(key, other, "node-b", instance, 1, loads)
	send(t, a.c.Addr(), pkt, err)
	waitFor(t, func() bool { return rejected("unknown_key") > before }, "A refuses figures signed by another CA's certificate")

	if v := a.c.View(); v.RemoteInFlight("gpu-1/") != 1 || len(v.Health("gpu-1/").Failing) != 0 {
		t.Fatalf("forged figures counted: %d, %+v", v.RemoteInFlight("gpu-1/"), v.Health("gpu-1/"))
	}
	// The same packet signed with B's own key counts: the refusals above
	// are the signatures', not the encoding's.
	pkt, err = gossiptest.ForgeSigned(key, b.id, "node-b", instance, 1, loads)
	send(t, a.c.Addr(), pkt, err)
	waitFor(t, func() bool { return a.c.View().RemoteInFlight("gpu-1/") == 1000 }, "B's own key speaks for B")
}

func TestMemberRecordsAndReplays(t *testing.T) {
	ca := newCA(t)
	nodes := cluster(t, 2, ca)
	a, b := nodes[0], nodes[1]
	m, err := gossiptest.Join(key, "mallory", a.c.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	waitFor(t, func() bool { return len(b.c.Members()) == 3 }, "B sees mallory")
	b.src.set("x", 50)
	waitFor(t, func() bool { return a.c.View().RemoteInFlight("x") == 50 && len(m.Packets("node-b")) > 0 }, "mallory records B's publishes")
	old := m.Packets("node-b")
	b.src.set("x", 1)
	waitFor(t, func() bool { return a.c.View().RemoteInFlight("x") == 1 }, "A sees x=1")
	stale := a.c.Stats().Stale
	if err := gossiptest.Send(a.c.Addr(), old...); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return a.c.Stats().Stale >= stale+uint64(len(old)) }, "A refuses %d replayed packets", len(old))
	if got := a.c.View().RemoteInFlight("x"); got != 1 {
		t.Fatalf("replay changed A's view: x=%d", got)
	}
	for _, mb := range a.c.Members() {
		if mb.Name == "mallory" && mb.Proven {
			t.Fatal("mallory counts as proven")
		}
	}
}
