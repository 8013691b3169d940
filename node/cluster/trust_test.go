package cluster

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/warmroute/warmroute/gossip"
	"github.com/warmroute/warmroute/internal/identity"
	"github.com/warmroute/warmroute/internal/limit"
	"github.com/warmroute/warmroute/internal/testkit"
)

// testIdentity issues a router certificate for name from ca.
func testIdentity(t testing.TB, ca *identity.CA, name string) *identity.Bundle {
	t.Helper()
	b, err := ca.Bundle(identity.Request{Name: name, Validity: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// startTLS starts routers ids that bootstrap together, each with a
// certificate of ca.
func startTLS(t *testing.T, tn *testNet, ca *identity.CA, ids ...string) []*tnode {
	t.Helper()
	return tn.startGroup(ids, func(id string, c *Config) { c.Identity = testIdentity(t, ca, id) })
}

func testCA(t testing.TB) *identity.CA {
	t.Helper()
	ca, err := identity.NewCA("test", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

// TestTCPMutualTLS: routers with certificates of one CA form a cluster
// over TCP and agree; a router whose certificate comes from another CA is
// in gossip but never enters the Raft configuration; a router whose
// certificate names another router than its NodeID does not start.
func TestTCPMutualTLS(t *testing.T) {
	ca := testCA(t)
	tn := newTestNet(t, false)
	nodes := startTLS(t, tn, ca, "a", "b", "c")
	l := leader(t, nodes)
	e := applyAny(t, nodes, UpsertBackend(Backend{ID: "over-tls/", URL: "http://127.0.0.1:9100"}))
	st := converged(t, nodes, e)
	if st.ClusterID == "" || len(st.ClusterID) != 32 {
		t.Fatalf("cluster ID %q", st.ClusterID)
	}
	for _, n := range nodes {
		if got := n.c.currentClusterID(); got != st.ClusterID {
			t.Fatalf("%s: cluster ID %q, state %q", n.id, got, st.ClusterID)
		}
	}

	// Another CA's router joins gossip, as a voter-eligible member.
	d := tn.start("d", func(c *Config) { c.Identity = testIdentity(t, testCA(t), "d") })
	testkit.WaitFor(t, 10*time.Second, "the others' probes of d to fail", func() bool {
		return counterValue(d.c.met.raftRefused.WithLabelValues("tls")) > 0
	})
	// What must not happen has had time to: reconcile runs every 200 ms.
	time.Sleep(time.Second)
	if _, in := raftServers(l.c)["d"]; in || l.c.verified.okAnywhere("d", time.Now()) {
		t.Fatalf("a router of another CA passed its probe or entered the Raft configuration: %v", raftServers(l.c))
	}

	// A certificate for another name than NodeID.
	cfg := fastConfig("e")
	cfg.Identity = testIdentity(t, ca, "not-e")
	if _, err := Open(cfg, tn.g.view("e"), nil); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("Open with another router's certificate: %v, want ErrInvalidConfig", err)
	}
}

// TestTCPImpostorAddress: gossip, which a holder of the gossip key can
// write, places router b at router c's Raft address. The leader dialling
// "b" there meets c's certificate and refuses to talk, instead of taking
// c for b.
func TestTCPImpostorAddress(t *testing.T) {
	ca := testCA(t)
	tn := newTestNet(t, false)
	nodes := startTLS(t, tn, ca, "a", "b", "c")
	leader(t, nodes)
	st := tn.nodes["a"].c.stream
	expect := st.expectAt(tn.nodes["c"].c.Addr())
	if expect == nil {
		t.Fatal("no name check on dials")
	}
	if err := expect("c"); err != nil {
		t.Fatalf("c at its own address: %v", err)
	}
	if err := expect("b"); err == nil {
		t.Fatal("b accepted at c's address")
	}
	// Gossip now says b lives at c's address.
	tn.g.set(gossip.Member{Name: "b", Addr: "gossip-b", Meta: gossip.Meta{RaftAddr: tn.nodes["c"].c.Addr(), Voter: true, Zone: "b", Ops: CommandLevel}})
	testkit.WaitFor(t, 5*time.Second, "a's view to follow gossip", func() bool {
		s, ok := tn.nodes["a"].c.view.Load().get("b")
		return ok && s.Addr == tn.nodes["c"].c.Addr()
	})
	if err := st.probe(tn.nodes["c"].c.Addr(), identity.ExpectName("b")); !errors.Is(err, identity.ErrWrongPeer) {
		t.Fatalf("probing b at c's address: %v, want ErrWrongPeer", err)
	}
}

// TestRaftListenerBounds: connections over the caps are closed at once,
// a connection that never completes its handshake is closed after the
// handshake timeout, and an idle Raft connection after the idle timeout.
func TestRaftListenerBounds(t *testing.T) {
	ca := testCA(t)
	tn := newTestNet(t, false)
	n := tn.start("a", func(c *Config) {
		c.BootstrapExpect = 1
		c.Identity = testIdentity(t, ca, "a")
		c.RaftMaxConns, c.RaftMaxConnsPerIP = 8, 4
		c.RaftHandshakeTimeout = time.Second
		c.RaftIdleTimeout = 500 * time.Millisecond
	})
	leader(t, []*tnode{n})
	addr := n.c.Addr()
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for range 10 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	closedBy := func(c net.Conn, d time.Duration) bool {
		c.SetReadDeadline(time.Now().Add(d))
		_, err := c.Read(make([]byte, 1))
		var ne net.Error
		return err != nil && !(errors.As(err, &ne) && ne.Timeout())
	}
	// The four held (per-IP cap) end at the handshake timeout; the six
	// others at once.
	start := time.Now()
	ends := make(chan time.Duration, len(conns))
	for _, c := range conns {
		go func() {
			if closedBy(c, 3*time.Second) {
				ends <- time.Since(start)
			} else {
				ends <- -1
			}
		}()
	}
	refused, held := 0, 0
	for range conns {
		switch d := <-ends; {
		case d < 0:
		case d < 500*time.Millisecond:
			refused++
		default:
			held++
		}
	}
	if refused != 6 || held != 4 {
		t.Fatalf("refused %d at once and %d at the handshake timeout, of 10 (cap 4 per address)", refused, held)
	}
	if v := counterValue(n.c.met.raftRefused.WithLabelValues("limit_per_ip")); v < 6 {
		t.Fatalf("refusals counted: %v", v)
	}

	// A Raft connection that proves itself, then sends nothing, is closed
	// after the idle timeout.
	other := testIdentity(t, ca, "b")
	c, err := tls.Dial("tcp", addr, other.ClientConfig(identity.ExpectName("a")))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write(appendPreamble(nil, modeRaft, "")); err != nil {
		t.Fatal(err)
	}
	if _, _, err := readPreamble(c); err != nil {
		t.Fatal(err)
	}
	if !closedBy(c, 5*time.Second) {
		t.Fatal("an idle Raft connection was not closed")
	}
}

// TestRaftSlotsNotHeldByNeighbours: idle connections from addresses
// that proved nothing fill every slot of the Raft listener (before, a
// router was then refused until they timed out); a router dialling now
// still completes its handshake, its connection moves to the proven pool,
// and the neighbours' oldest connections are the ones closed.
func TestRaftSlotsNotHeldByNeighbours(t *testing.T) {
	ca := testCA(t)
	tn := newTestNet(t, false)
	n := tn.start("a", func(c *Config) {
		c.BootstrapExpect = 1
		c.Identity = testIdentity(t, ca, "a")
		c.RaftMaxConns, c.RaftMaxConnsPerIP = 8, 4
		c.RaftHandshakeTimeout = 5 * time.Second
	})
	leader(t, []*tnode{n})
	addr := n.c.Addr()
	var flood []net.Conn
	defer func() {
		for _, c := range flood {
			c.Close()
		}
	}()
	for _, ip := range []string{"127.0.0.2", "127.0.0.3", "127.0.0.4"} {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
		for range 4 {
			c, err := d.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			flood = append(flood, c)
		}
	}
	testkit.WaitFor(t, 5*time.Second, "the flood to fill the pending pool", func() bool {
		return n.c.stream.ln.(*limit.Listener).Pending() == 8
	})
	other := testIdentity(t, ca, "b")
	for i := range 3 {
		start := time.Now()
		c, err := n.c.stream.dialFor(t, addr, other)
		if err != nil {
			t.Fatalf("router connection %d with every slot held by neighbours: %v", i, err)
		}
		defer c.Close()
		if d := time.Since(start); d > time.Second {
			t.Errorf("router connection %d took %v", i, d)
		}
	}
	// The listener promotes after answering the preamble.
	testkit.WaitFor(t, 5*time.Second, "three proven connections", func() bool {
		return n.c.stream.ln.(*limit.Listener).Proven() == 3
	})
}

// TestForeignClusterRefused: two clusters' routers never exchange Raft
// messages, and a router outnumbered by routers of another cluster stops
// with an error naming both.
func TestForeignClusterRefused(t *testing.T) {
	root := t.TempDir()
	tn := newTestNet(t, false)
	nodes := tn.startGroup([]string{"a", "b", "c"}, func(id string, c *Config) { c.DataDir = filepath.Join(root, id) })
	leader(t, nodes)
	e := applyAny(t, nodes, UpsertBackend(Backend{ID: "in-a/", URL: "http://127.0.0.1:9100"}))
	st := converged(t, nodes, e)

	// x's data belong to another cluster (written by hand: a cluster ID
	// and nothing else is enough for the preamble).
	other := newClusterID()
	xdir := filepath.Join(root, "x")
	if err := os.MkdirAll(xdir, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(xdir, clusterIDFile), []byte(other+"\n"), 0o640); err != nil {
		t.Fatal(err)
	}
	x := tn.start("x", func(c *Config) { c.DataDir = xdir })
	select {
	case err := <-x.c.Fatal():
		if !errors.Is(err, ErrForeignData) || !strings.Contains(err.Error(), other) || !strings.Contains(err.Error(), st.ClusterID) {
			t.Fatalf("fatal error %v, want ErrForeignData naming %s and %s", err, other, st.ClusterID)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the router with another cluster's data did not stop")
	}
	l := leader(t, nodes)
	if _, in := raftServers(l.c)["x"]; in {
		t.Fatal("the foreign router entered the Raft configuration")
	}
	// x stopped because routers of the other cluster outnumbered its own
	// word: it exchanged preambles with at least two of them, and each
	// side counts every exchange. Which ones depends on who dialled whom
	// before x stopped (the leader's dial to x can come after), so the
	// count is over the three.
	testkit.WaitFor(t, 5*time.Second, "the cluster's routers to count the foreign peer", func() bool {
		var sum float64
		for _, n := range nodes {
			sum += counterValue(n.c.met.raftForeign)
		}
		return sum >= 1
	})
}

// TestCorruptEntryHalts: a damaged committed entry halts the state
// machine, which keeps its last good state and reports it.
func TestCorruptEntryHalts(t *testing.T) {
	f := newFSM(func() {}, nil, nil)
	var halted []uint64
	f.onHalt = func(i uint64, err error) { halted = append(halted, i) }
	seed, _ := encodeCommand(Seed(testSeed(), testRouting()))
	f.Apply(&raft.Log{Index: 1, Type: raft.LogCommand, Data: seed})
	good := f.view()
	up, _ := encodeCommand(UpsertBackend(Backend{ID: "gpu-c/", URL: "http://127.0.0.1:9003"}))
	up[len(up)-10] ^= 1
	res := f.Apply(&raft.Log{Index: 2, Type: raft.LogCommand, Data: up}).(applyResult)
	if !errors.Is(res.err, ErrCorrupt) || f.halted.Load() == nil || !slices.Equal(halted, []uint64{2}) {
		t.Fatalf("damaged entry: result %+v, halted %v", res, halted)
	}
	ok, _ := encodeCommand(UpsertBackend(Backend{ID: "gpu-d/", URL: "http://127.0.0.1:9004"}))
	res = f.Apply(&raft.Log{Index: 3, Type: raft.LogCommand, Data: ok}).(applyResult)
	if !errors.Is(res.err, ErrHalted) || f.view() != good {
		t.Fatalf("after the halt: %+v, state moved: %v", res, f.view() != good)
	}
	// An entry of a newer version halts too; a command that is invalid
	// on every node alike does not.
	f2 := newFSM(func() {}, nil, nil)
	f2.Apply(&raft.Log{Index: 1, Type: raft.LogCommand, Data: seed})
	bad, _ := encodeCommand(RemoveBackend("no-such"))
	if res := f2.Apply(&raft.Log{Index: 2, Type: raft.LogCommand, Data: bad}).(applyResult); !errors.Is(res.err, ErrUnknownBackend) || f2.halted.Load() != nil {
		t.Fatalf("an invalid command: %+v halted=%v", res, f2.halted.Load() != nil)
	}
	newer := []byte(fmt.Sprintf(`{"op":"%s"}`, "reticulate"))
	f2.Apply(&raft.Log{Index: 3, Type: raft.LogCommand, Data: newer})
	if f2.halted.Load() == nil {
		t.Fatal("an unknown op did not halt")
	}
}

// TestCommitLatency measures Raft commit latency (Apply on the leader,
// until it applied the entry) over loopback TCP with raft-wal, three
// nodes, in plaintext and with mutual TLS, in alternating rounds. It is a
// measurement, not a check: WARMROUTE_COMMIT_LATENCY=1 runs it.
//
//	WARMROUTE_COMMIT_LATENCY=1 go test -run TestCommitLatency -v ./node/cluster
func TestCommitLatency(t *testing.T) {
	if os.Getenv("WARMROUTE_COMMIT_LATENCY") == "" {
		t.Skip("set WARMROUTE_COMMIT_LATENCY=1 to measure")
	}
	ca := testCA(t)
	open := func(secure bool) (*testNet, []*tnode) {
		root := t.TempDir()
		tn := newTestNet(t, false)
		nodes := tn.startGroup([]string{"a", "b", "c"}, func(id string, c *Config) {
			c.DataDir = filepath.Join(root, id)
			if secure {
				c.Identity = testIdentity(t, ca, id)
			}
		})
		return tn, nodes
	}
	const rounds, perRound = 5, 200
	lat := map[bool][]time.Duration{}
	for r := range rounds {
		for _, secure := range []bool{r%2 == 0, r%2 != 0} {
			tn, nodes := open(secure)
			l := leader(t, nodes)
			applyAny(t, nodes, UpsertBackend(Backend{ID: "warm/", URL: "http://127.0.0.1:9100"}))
			for i := range perRound {
				cmd := SetBackendState("warm/", []string{StateDraining, StateActive}[i%2])
				start := time.Now()
				if _, err := l.c.Apply(context.Background(), cmd); err != nil {
					t.Fatal(err)
				}
				lat[secure] = append(lat[secure], time.Since(start))
			}
			tn.closeAll()
			for _, n := range tn.nodes {
				n.c = nil
			}
		}
	}
	for _, secure := range []bool{false, true} {
		ds := lat[secure]
		slices.Sort(ds)
		t.Logf("mutual TLS %-5v: %d commits, p50 %v, p90 %v, p99 %v", secure, len(ds),
			ds[len(ds)/2], ds[len(ds)*9/10], ds[len(ds)*99/100])
	}
}

// dialFor dials the Raft listener at addr as the router of id: TLS and
// the Raft preamble, as another router's stream does.
func (s *tcpStream) dialFor(t *testing.T, addr string, id *identity.Bundle) (net.Conn, error) {
	t.Helper()
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, id.ClientConfig(nil))
	if err != nil {
		return nil, err
	}
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write(appendPreamble(nil, modeRaft, s.cfg.clusterID())); err != nil {
		c.Close()
		return nil, err
	}
	if _, _, err := readPreamble(c); err != nil {
		c.Close()
		return nil, err
	}
	_ = c.SetDeadline(time.Time{})
	return c, nil
}
