package node

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

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
	waitFor(t, 10*time.Second, "the failing backend committed down", func() bool { return state() == ring.Down })
	st, _ := n.agree.State()
	b, _ := st.Backend(id)
	if b.StateBy != "health" {
		t.Errorf("state set by %q, want health", b.StateBy)
	}
	healthy.Store(true)
	waitFor(t, 10*time.Second, "the backend committed active again", func() bool { return state() == ring.Active })

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
