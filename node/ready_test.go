package node

import (
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/warmroute/warmroute/gossip"
	"github.com/warmroute/warmroute/node/cluster"
)

// TestWaitingSaysWhatTheRouterWaitsFor: every phase of a router that has
// not applied an agreed state yet names what it waits for, in words an
// operator can act on; a router with a seeded state applied under a named
// leader waits for nothing.
func TestWaitingSaysWhatTheRouterWaitsFor(t *testing.T) {
	self := gossip.Member{Name: "r1", Self: true, Meta: gossip.Meta{Voter: true, RaftAddr: "127.0.0.1:7947"}}
	peer := func(name string, voter bool) gossip.Member {
		return gossip.Member{Name: name, Meta: gossip.Meta{Voter: voter, RaftAddr: "127.0.0.1:1" + name[1:]}}
	}
	agreed := cluster.Status{Seeded: true, LeaderID: "r2", CommitIndex: 7, AppliedIndex: 7, Epoch: 5}
	for _, c := range []struct {
		name string
		v    waitView
		want []string // substrings; none means agreed
	}{
		{"agreed under a leader", waitView{raft: agreed}, nil},
		{"agreed as the leader", waitView{raft: cluster.Status{ID: "r1", Seeded: true, LeaderID: "r1", CommitIndex: 3, AppliedIndex: 4}}, nil},
		{"not caught up", waitView{raft: cluster.Status{Seeded: true, LeaderID: "r2", CommitIndex: 9, AppliedIndex: 4}},
			[]string{"agreed state from the Raft leader r2", "applied 4 of 9"}},
		{"leader named before it told what is committed", waitView{raft: cluster.Status{Seeded: true, LeaderID: "r2"}},
			[]string{"leader r2"}},
		{"seeded from the cache, no leader", waitView{members: []gossip.Member{self, peer("r2", true)},
			raft: cluster.Status{Seeded: true, CommitIndex: 4, AppliedIndex: 4, RaftState: "Follower", Term: 3,
				Servers: []cluster.Server{{ID: "r1"}, {ID: "r2"}, {ID: "r3"}}}},
			[]string{"waiting for a Raft leader", "r1, r2, r3", "follower at term 3"}},
		{"bootstrap-expect 3 alone, no seeds", waitView{self: "r1", expect: 3, members: []gossip.Member{self}},
			[]string{"no other router in gossip", "no --join seeds", "--bootstrap-expect 3 needs 3 routers"}},
		{"seeds unreachable", waitView{self: "r1", seeds: []string{"10.0.0.2:7946", "10.0.0.3:7946"}, members: []gossip.Member{self}},
			[]string{"none of the --join seeds (10.0.0.2:7946, 10.0.0.3:7946)"}},
		{"bootstrap-expect 3, two of three", waitView{self: "r1", expect: 3, seeds: []string{"x"}, members: []gossip.Member{self, peer("r2", true), peer("r9", false)}},
			[]string{"waiting for 3 routers to form a new cluster (--bootstrap-expect 3)", "gossip shows 2 that may vote: r1, r2"}},
		{"bootstrap-expect 3, three that do not agree", waitView{self: "r1", expect: 3, seeds: []string{"x"}, tls: true,
			members: []gossip.Member{self, peer("r2", true), peer("r3", true)}, probed: true,
			failed: map[string]string{"r3": "at 127.0.0.1:13: x509: certificate signed by unknown authority"}},
			[]string{"3 routers that may vote are in gossip (r1, r2, r3) but have not formed a cluster",
				"the identity probe of r3 failed: at 127.0.0.1:13: x509: certificate signed by unknown authority", "--cluster-tls-ca-file"}},
		{"single seed", waitView{self: "r1", expect: 1, members: []gossip.Member{self}}, []string{"bootstrapping a new cluster alone"}},
		{"kept out, another CA", waitView{self: "r2", seeds: []string{"r1"}, tls: true, members: []gossip.Member{peer("r1", true), {Name: "r2", Self: true}},
			probed: true, failed: map[string]string{"r1": "at 127.0.0.1:11: identity: certificate not signed by the cluster CA"}},
			[]string{"waiting to be added to the Raft configuration by the cluster's leader; gossip shows r1",
				"the identity probe of r1 failed", "not signed by the cluster CA", "do not share a cluster CA"}},
		{"kept out, no cluster TLS", waitView{self: "r2", seeds: []string{"r1"}, members: []gossip.Member{peer("r1", true), {Name: "r2", Self: true}},
			probed: true, failed: map[string]string{"r1": "at 127.0.0.1:11: cluster: raft preamble from 127.0.0.1:11: EOF"}},
			[]string{"no cluster TLS", "--cluster-tls-cert-file"}},
		{"kept out though every probe passes", waitView{self: "r2", seeds: []string{"r1"}, tls: true,
			members: []gossip.Member{peer("r1", true), {Name: "r2", Self: true}}, probed: true},
			[]string{"probes of its peers pass", "the leader's log"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := c.v.waiting()
			if c.want == nil {
				if got != "" {
					t.Fatalf("waiting = %q, want agreed", got)
				}
				return
			}
			if got == "" {
				t.Fatal("waiting = agreed, want a reason")
			}
			for _, w := range c.want {
				if !strings.Contains(got, w) {
					t.Errorf("waiting = %q\nwant it to say %q", got, w)
				}
			}
		})
	}
}

// TestWaitingBounded: a reason lists at most maxNamesListed routers
// however large the cluster, and cuts long probe errors.
func TestWaitingBounded(t *testing.T) {
	var ms []gossip.Member
	var servers []cluster.Server
	for i := range 500 {
		ms = append(ms, gossip.Member{Name: fmt.Sprintf("r%03d", i), Meta: gossip.Meta{RaftAddr: "127.0.0.1:1"}})
		servers = append(servers, cluster.Server{ID: fmt.Sprintf("r%03d", i)})
	}
	v := waitView{self: "me", seeds: []string{"x"}, members: ms}
	got := v.waiting()
	if !strings.Contains(got, "and 492 more") || len(got) > 400 {
		t.Errorf("%d bytes: %q", len(got), got)
	}
	v.raft.Servers = servers
	if got := v.waiting(); !strings.Contains(got, "and 492 more") || len(got) > 400 {
		t.Errorf("%d bytes: %q", len(got), got)
	}
	if n := len(v.probeTargets()); n != maxWaitProbes {
		t.Errorf("%d probe targets, want %d", n, maxWaitProbes)
	}
	var p fakeProber
	p.err = errors.New(strings.Repeat("x", 10_000))
	failed := probePeers(&p, v.probeTargets())
	if len(failed) != maxWaitProbes || p.calls.Load() != maxWaitProbes {
		t.Fatalf("%d failures of %d probes", len(failed), p.calls.Load())
	}
	for _, f := range failed {
		if len(f) > maxErrText+40 {
			t.Errorf("a probe error of %d bytes kept", len(f))
		}
	}
}

type fakeProber struct {
	err   error
	calls atomic.Int64
}

func (p *fakeProber) ProbePeer(id, addr string) error {
	p.calls.Add(1)
	return p.err
}
