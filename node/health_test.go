package node

import (
	"encoding/json"
	"fmt"
	"github.com/warmroute/warmroute/node/admin"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warmroute/warmroute/internal/testkit"
	"github.com/warmroute/warmroute/ring"
)

// TestHealthCommitsDownAndUp: a backend failing its health checks is
// committed down through Raft (every router stops using it at one epoch),
// and active again once it recovers.
func TestHealthCommitsDownAndUp(t *testing.T) {
	var healthy atomic.Bool
	healthy.Store(true)
	sick := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" && !healthy.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		io.WriteString(w, `{}`)
	}))
	defer sick.Close()
	ok := newHoldEngine(t, 0)
	cfg := testConfig([]string{sick.URL, ok.srv.URL})
	cfg.Health.ProbeInterval = 30 * time.Millisecond
	n := runNode(t, cfg)
	waitAgreed(t, n)
	id := strings.TrimPrefix(sick.URL, "http://")
	state := func() ring.State {
		r, _ := n.proxy.Ring()
		i, _ := r.Index(id)
		return r.Backend(i).State
	}
	healthy.Store(false)
	testkit.WaitFor(t, 10*time.Second, "the failing backend committed down", func() bool { return state() == ring.Down })
	st, _ := n.agree.State()
	b, _ := st.Backend(id)
	if b.StateBy != "health" {
		t.Errorf("state set by %q, want health", b.StateBy)
	}
	healthy.Store(true)
	testkit.WaitFor(t, 10*time.Second, "the backend committed active again", func() bool { return state() == ring.Active })

	// An operator's drain is never undone by health.
	r := adminDo(t, "POST", "http://"+n.AdminAddr().String()+"/v1/backends/"+id+"/drain", "", "")
	if r.status != 200 {
		t.Fatalf("drain: %d %s", r.status, r.raw)
	}
	time.Sleep(300 * time.Millisecond) // several probe rounds, all healthy
	if s := state(); s != ring.Draining {
		t.Fatalf("health changed an operator's drain to %s", s)
	}
}

// TestPassiveReportsThroughGossip: with active health checks off, the
// routers that see connect failures eject the backend locally; their
// verdicts reach the Raft leader through gossip, which commits the backend
// down for every router, and active again once the routers stop seeing it
// fail.
func TestPassiveReportsThroughGossip(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-node test")
	}
	// A backend address with nothing listening (connections are refused).
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadAddr := ln.Addr().String()
	ln.Close()
	ok := newHoldEngine(t, 0)
	nodes := startCluster(t, 3, func(i int, c *Config) {
		*c = testConfig([]string{"http://" + deadAddr, ok.srv.URL})
		c.Health.ProbePath = "" // passive only: nobody probes
		c.Health.EjectAfter = 2
		c.Health.EjectFor = 2 * time.Second
	})
	for _, n := range nodes {
		waitAgreed(t, n)
	}
	var leader *Node
	testkit.WaitFor(t, 10*time.Second, "a leader", func() bool {
		for _, n := range nodes {
			if n.agree.IsLeader() {
				leader = n
				return true
			}
		}
		return false
	})
	stateOn := func(n *Node) ring.State {
		r, _ := n.proxy.Ring()
		i, _ := r.Index(deadAddr)
		return r.Backend(i).State
	}
	// Traffic only through the followers: the leader sees no failure
	// itself, so only the gossiped verdicts can bring the backend down.
	var failed int
	deadline := time.Now().Add(10 * time.Second)
	for i := 0; stateOn(leader) != ring.Down; i++ {
		if time.Now().After(deadline) {
			t.Fatalf("backend not committed down; leader's view: %+v", leader.gossip.View().Health(deadAddr))
		}
		for _, n := range nodes {
			if n != leader {
				if _, err := send("http://"+n.TrafficAddr().String(), chat(fmt.Sprintf("passive %d", i))); err != nil {
					failed++
				}
			}
		}
		time.Sleep(2 * time.Millisecond)
	}
	if failed != 0 {
		t.Errorf("%d requests failed; connect failures must fall over to the healthy backend", failed)
	}
	if p := leader.proxy.Status(); p[0].Ejected || p[1].Ejected {
		t.Errorf("the leader ejected a backend itself: %+v", p)
	}
	st, _ := leader.agree.State()
	if b, _ := st.Backend(deadAddr); b.StateBy != "health" {
		t.Errorf("state set by %q, want health", b.StateBy)
	}
	for _, n := range nodes {
		testkit.WaitFor(t, 5*time.Second, "every router at the down state", func() bool { return stateOn(n) == ring.Down })
	}
	// The admin API names the nodes that see it failing.
	r := adminDo(t, "GET", "http://"+leader.AdminAddr().String()+"/v1/backends/"+deadAddr, "", "")
	var got struct {
		Backend admin.BackendView `json:"backend"`
	}
	if err := json.Unmarshal([]byte(r.raw), &got); r.status != 200 || err != nil || len(got.Backend.FailingOn) == 0 {
		t.Errorf("backend view (%v): %d %s", err, r.status, r.raw)
	}
	for _, name := range got.Backend.FailingOn {
		if name == leader.name {
			t.Errorf("the leader is among the nodes that see the backend failing: %v", got.Backend.FailingOn)
		}
	}

	// The backend comes back. Nothing is routed to a down backend, so the
	// routers' ejections run out, their verdicts turn healthy, and the
	// leader commits it active again.
	srv := &http.Server{Handler: ok.srv.Config.Handler}
	back, err := net.Listen("tcp", deadAddr)
	if err != nil {
		t.Skipf("cannot listen on %s again: %v", deadAddr, err)
	}
	go srv.Serve(back)
	defer srv.Close()
	for _, n := range nodes {
		testkit.WaitFor(t, 10*time.Second, "the backend active again", func() bool { return stateOn(n) == ring.Active })
	}
}
