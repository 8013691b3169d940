package fleet

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
)

// adminStub serves GET /v1/cluster as a router named node that sees leader.
func adminStub(t *testing.T, node, leader string, servers ...string) Router {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/cluster" {
			http.NotFound(w, r)
			return
		}
		var v clusterView
		v.Node, v.Leader = node, leader
		for _, s := range servers {
			v.Raft.Servers = append(v.Raft.Servers, raftServer{ID: s})
		}
		_ = json.NewEncoder(w).Encode(v)
	}))
	t.Cleanup(srv.Close)
	return Router{URL: srv.URL, AdminURL: srv.URL}
}

// TestStopOrder: a follower goes before the leader; routers that are not
// one cluster, or that do not answer, are not ordered.
func TestStopOrder(t *testing.T) {
	f := &Fleet{routers: []Router{
		adminStub(t, "r0", "r1"), adminStub(t, "r1", "r1", "r0", "r1", "r2"), adminStub(t, "r2", "r1"),
	}}
	next, leader, name, err := f.nextToStop([]int{0, 1, 2})
	if err != nil || leader != 1 || next == leader || name != []string{"r0", "r1", "r2"}[next] {
		t.Fatalf("nextToStop = %d, %d, %q, %v; want a follower, the leader at 1", next, leader, name, err)
	}
	if _, leader, _, err = f.nextToStop([]int{2, 1}); err != nil || leader != 1 {
		t.Fatalf("of routers 2 and 1, leader at %d (%v), want 1", leader, err)
	}

	alone := &Fleet{routers: []Router{adminStub(t, "r0", "r0"), adminStub(t, "r1", "r1")}}
	if _, _, _, err := alone.nextToStop([]int{0, 1}); err == nil || errors.Is(err, errNoLeader) {
		t.Fatalf("two single routers: %v, want not one cluster", err)
	}
	electing := &Fleet{routers: []Router{adminStub(t, "r0", ""), adminStub(t, "r1", "r1")}}
	if _, _, _, err := electing.nextToStop([]int{0, 1}); !errors.Is(err, errNoLeader) {
		t.Fatalf("during an election: %v, want errNoLeader", err)
	}
	silent := &Fleet{routers: []Router{adminStub(t, "r0", "r0"), {AdminURL: "http://127.0.0.1:1"}}}
	if _, _, _, err := silent.nextToStop([]int{0, 1}); err == nil || errors.Is(err, errNoLeader) {
		t.Fatalf("a router that does not answer: %v, want an error", err)
	}
}
