package cluster

import (
	"crypto/tls"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/warmroute/warmroute/gossip"
	"github.com/warmroute/warmroute/internal/identity"
	"github.com/warmroute/warmroute/internal/testkit"
)

// raftAddrOf is server id's address in n's Raft configuration.
func raftAddrOf(n *tnode, id string) string {
	for _, s := range n.c.Status().Servers {
		if s.ID == id {
			return s.Addr
		}
	}
	return ""
}

// plainListener accepts connections, reads a little and closes them, as
// the Raft port of a router without cluster TLS answers a TLS client.
func plainListener(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_ = c.SetDeadline(time.Now().Add(time.Second))
			_, _ = c.Read(make([]byte, 16))
			c.Close()
		}
	}()
	return ln.Addr().String()
}

// TestImpostorGetsNoSeat: router c is down; a process without a
// certificate appears in gossip under c's name at another address.
// Before, the leader moved c's voter seat to the impostor's address
// (update_addr) and Raft dialled it there, so the real c, back at its own
// address, stayed a candidate. Now the seat keeps c's configured address,
// the impostor is listed as refused with the reason, and the real c
// rejoins and applies the cluster's writes.
func TestImpostorGetsNoSeat(t *testing.T) {
	ca := testCA(t)
	tn := newTestNet(t, false)
	nodes := startTLS(t, tn, ca, "a", "b", "c")
	leader(t, nodes)
	cAddr := tn.nodes["c"].c.Addr()
	tn.stop("c", false)

	impostor := plainListener(t)
	tn.g.set(gossip.Member{Name: "c", Addr: "gossip-impostor", Meta: gossip.Meta{RaftAddr: impostor, Voter: true, Zone: "c", Ops: CommandLevel}})
	live := tn.subset("a", "b")
	l := leader(t, live)
	testkit.WaitFor(t, 10*time.Second, "the leader to refuse the impostor", func() bool {
		for _, r := range l.c.Refused() {
			if r.Name == "c" && r.Addr == impostor && r.Reason != "" {
				return true
			}
		}
		return false
	})
	// Reconcile runs every 200 ms: it has had time to move the seat.
	time.Sleep(time.Second)
	for _, n := range live {
		if got := raftAddrOf(n, "c"); got != cAddr {
			t.Fatalf("%s: c's seat is at %q, want its own address %s (impostor at %s)", n.id, got, cAddr, impostor)
		}
	}
	if counterValue(l.c.met.probeRefused) == 0 {
		t.Error("refused probes not counted")
	}

	// The real c comes back at its address; gossip still shows the
	// impostor under its name. c follows the leader and applies writes.
	c := tn.start("c", func(cfg *Config) {
		cfg.BootstrapExpect = 3
		cfg.RaftBind = cAddr
		cfg.Identity = testIdentity(t, ca, "c")
	})
	tn.g.set(gossip.Member{Name: "c", Addr: "gossip-impostor", Meta: gossip.Meta{RaftAddr: impostor, Voter: true, Zone: "c", Ops: CommandLevel}})
	e := applyAny(t, live, UpsertBackend(Backend{ID: "after-impostor/", URL: "http://127.0.0.1:9200"}))
	converged(t, append(live, c), e)
	if got := raftAddrOf(l, "c"); got != cAddr {
		t.Fatalf("c's seat moved to %q", got)
	}
}

// attackTransport is a Raft transport that dials with cert (TLS) and
// speaks the preamble of cluster clusterID first, as a router would.
func attackTransport(t *testing.T, cert *identity.Bundle, clusterID string) *raft.NetworkTransport {
	t.Helper()
	st := &dialStream{dial: func(addr string) (net.Conn, error) {
		c, err := tls.DialWithDialer(&net.Dialer{Timeout: 2 * time.Second}, "tcp", addr, cert.ClientConfig(nil))
		if err != nil {
			return nil, err
		}
		if _, err := c.Write(appendPreamble(nil, modeRaft, clusterID)); err != nil {
			c.Close()
			return nil, err
		}
		if _, _, err := readPreamble(c); err != nil {
			c.Close()
			return nil, err
		}
		return c, nil
	}, done: make(chan struct{})}
	tr := raft.NewNetworkTransport(st, 1, 2*time.Second, io.Discard)
	t.Cleanup(func() { tr.Close() })
	return tr
}

type dialStream struct {
	dial func(string) (net.Conn, error)
	done chan struct{}
	once sync.Once
}

func (s *dialStream) Accept() (net.Conn, error) { <-s.done; return nil, net.ErrClosed }
func (s *dialStream) Close() error              { s.once.Do(func() { close(s.done) }); return nil }
func (s *dialStream) Addr() net.Addr            { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 1} }
func (s *dialStream) Dial(addr raft.ServerAddress, _ time.Duration) (net.Conn, error) {
	return s.dial(string(addr))
}

// TestRPCHeadersTiedToCertificate: a router certificate of the cluster's
// CA for r9, a router that never joined, committed a backend with an
// AppendEntries that claimed the leader's name (before). Now an RPC must
// name the router its connection's certificate proves, give no address
// of another router, and an AppendEntries must come from a member of the
// Raft configuration: each forgery is refused and counted, and the
// follower's term, log and state stay as they were.
func TestRPCHeadersTiedToCertificate(t *testing.T) {
	ca := testCA(t)
	tn := newTestNet(t, false)
	nodes := startTLS(t, tn, ca, "a", "b", "c")
	l := leader(t, nodes)
	e := applyAny(t, nodes, UpsertBackend(Backend{ID: "real/", URL: "http://127.0.0.1:9300"}))
	converged(t, nodes, e)
	var f *tnode
	for _, n := range nodes {
		if n != l {
			f = n
			break
		}
	}
	before := f.c.Status()
	tr := attackTransport(t, testIdentity(t, ca, "r9"), f.c.currentClusterID())
	cmd, err := encodeCommand(UpsertBackend(Backend{ID: "forged/", URL: "http://127.0.0.1:9"}))
	if err != nil {
		t.Fatal(err)
	}
	entries := func() *raft.AppendEntriesRequest {
		return &raft.AppendEntriesRequest{Term: before.Term + 5, PrevLogEntry: before.LastIndex, PrevLogTerm: before.Term,
			Entries:           []*raft.Log{{Index: before.LastIndex + 1, Term: before.Term + 5, Type: raft.LogCommand, Data: cmd}},
			LeaderCommitIndex: before.LastIndex + 1}
	}
	header := func(id, addr string) raft.RPCHeader {
		return raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte(id), Addr: []byte(addr)}
	}
	target := raft.ServerAddress(f.c.Addr())
	for _, c := range []struct {
		what, reason string
		send         func() error
	}{
		{"AppendEntries claiming the leader's name", "rpc_id", func() error {
			req := entries()
			req.RPCHeader = header(l.id, l.c.Addr())
			return tr.AppendEntries("f", target, req, &raft.AppendEntriesResponse{})
		}},
		{"AppendEntries from r9 at the leader's address", "rpc_addr", func() error {
			req := entries()
			req.RPCHeader = header("r9", l.c.Addr())
			return tr.AppendEntries("f", target, req, &raft.AppendEntriesResponse{})
		}},
		{"AppendEntries from r9, outside the configuration", "not_member", func() error {
			req := entries()
			req.RPCHeader = header("r9", "127.0.0.1:1")
			return tr.AppendEntries("f", target, req, &raft.AppendEntriesResponse{})
		}},
		{"RequestVote claiming the leader's name", "rpc_id", func() error {
			req := &raft.RequestVoteRequest{RPCHeader: header(l.id, l.c.Addr()), Term: before.Term + 5, LastLogIndex: before.LastIndex + 10, LastLogTerm: before.Term}
			return tr.RequestVote("f", target, req, &raft.RequestVoteResponse{})
		}},
		{"TimeoutNow from r9", "not_member", func() error {
			return tr.TimeoutNow("f", target, &raft.TimeoutNowRequest{RPCHeader: header("r9", "127.0.0.1:1")}, &raft.TimeoutNowResponse{})
		}},
	} {
		refused := counterValue(f.c.met.rpcRefused.WithLabelValues(c.reason))
		if err := c.send(); err == nil {
			t.Errorf("%s: answered; want the connection closed", c.what)
		}
		if got := counterValue(f.c.met.rpcRefused.WithLabelValues(c.reason)); got != refused+1 {
			t.Errorf("%s: %s refusals %v -> %v, want one more", c.what, c.reason, refused, got)
		}
	}
	after := f.c.Status()
	if after.Term != before.Term || after.LastIndex < before.LastIndex {
		t.Errorf("term %d -> %d, last index %d -> %d", before.Term, after.Term, before.LastIndex, after.LastIndex)
	}
	if st, _ := f.c.State(); hasID(st.Backends, "forged/") {
		t.Fatal("the forged backend was applied")
	}
	// The cluster still agrees and commits.
	e = applyAny(t, nodes, UpsertBackend(Backend{ID: "after/", URL: "http://127.0.0.1:9301"}))
	converged(t, nodes, e)
}

func hasID(bs []Backend, id string) bool {
	for _, b := range bs {
		if b.ID == id {
			return true
		}
	}
	return false
}

// TestRevokedRouterLeaves: revoking router c by name (a command agreed
// through Raft) makes every router refuse its certificate: the leader
// removes it from the Raft configuration, the probes list it as refused,
// and the others keep committing. Taken off the list, c proves itself
// again and is added back.
func TestRevokedRouterLeaves(t *testing.T) {
	ca := testCA(t)
	tn := newTestNet(t, false)
	nodes := startTLS(t, tn, ca, "a", "b", "c")
	leader(t, nodes)
	live := tn.subset("a", "b")
	applyAny(t, nodes, Revoke([]string{"c"}, nil)) // c may lead: it commits its own revocation
	testkit.WaitFor(t, 10*time.Second, "c to leave the Raft configuration", func() bool {
		l := leader(t, live)
		_, in := raftServers(l.c)["c"]
		return !in
	})
	l := leader(t, live)
	if st := l.c.Status(); len(st.RevokedNames) != 1 || st.RevokedNames[0] != "c" {
		t.Fatalf("status revoked names %v", st.RevokedNames)
	}
	testkit.WaitFor(t, 10*time.Second, "c refused as revoked", func() bool {
		for _, r := range l.c.Refused() {
			if r.Name == "c" && r.Reason == "its certificate is revoked" {
				return true
			}
		}
		return false
	})
	e := applyAny(t, live, UpsertBackend(Backend{ID: "without-c/", URL: "http://127.0.0.1:9400"}))
	converged(t, live, e)

	applyAny(t, live, Unrevoke([]string{"c"}, nil))
	testkit.WaitFor(t, 15*time.Second, "c back in the Raft configuration", func() bool {
		_, in := raftServers(leader(t, live).c)["c"]
		return in
	})
}
