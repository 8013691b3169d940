package proxy

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/warmroute/warmroute/ring"
)

// TestHoldRefusesUntilLifted: a held router answers every request bound
// for a backend with 503 not_ready and the reason (the backend sees
// none), /readyz and /ping say why, /healthz still answers; lifting the
// hold routes again.
func TestHoldRefusesUntilLifted(t *testing.T) {
	a := newStub(t, "a", nil)
	h := startProxy(t, testProxyConfig(), ring.DefaultConfig(), a)
	const why = "not ready: waiting for a Raft leader"
	h.p.Hold(why)
	if h.p.Ready() {
		t.Fatal("Ready while held")
	}
	for path, req := range map[string]string{
		"/v1/chat/completions": chatReq("hello", ""),
		"/v1/completions":      `{"model":"m","prompt":"hello"}`,
		"/invocations":         chatReq("hello", ""),
	} {
		resp, body := post(t, h.url+path, req)
		if resp.StatusCode != 503 || !strings.Contains(string(body), `"code":"not_ready"`) || !strings.Contains(string(body), why) {
			t.Errorf("%s while held: %d %s", path, resp.StatusCode, body)
		}
	}
	for _, path := range []string{"/v1/models", "/readyz", "/ping"} {
		resp, err := http.Get(h.url + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 503 || !strings.Contains(string(body), why) {
			t.Errorf("GET %s while held: %d %s", path, resp.StatusCode, body)
		}
	}
	if resp, err := http.Get(h.url + "/healthz"); err != nil || resp.StatusCode != 200 {
		t.Errorf("/healthz while held: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
	if n := a.hits.Load(); n != 0 {
		t.Fatalf("the backend got %d requests from a held router", n)
	}

	h.p.Hold("")
	if resp, body := post(t, h.url+"/v1/chat/completions", chatReq("hello", "")); resp.StatusCode != 200 {
		t.Fatalf("after the hold: %d %s", resp.StatusCode, body)
	}
	if !h.p.Ready() {
		t.Error("not Ready after the hold")
	}
}

// TestHoldFollowsAdmits: hold keeps a decision exactly when the ring
// admits it with the count the request's slot made (ring.Admits); when it
// does not, the slot goes back and the request is picked again. The
// table has both answers, for the owner, an overflow backend, a fallback
// and a strategy without limits, counts from this router and from others.
func TestHoldFollowsAdmits(t *testing.T) {
	const key = 42
	for _, tc := range []struct {
		name      string
		strategy  ring.Strategy
		threshold int
		own, rem  [3]int64    // in flight per backend, in the ring's order for key
		rank      int         // the decision's backend, by rank in key's order
		why       ring.Reason // the decision's reason
		keep      bool
	}{
		{"owner with room", ring.PrefixAware, 2, [3]int64{1, 0, 0}, [3]int64{}, 0, ring.ReasonAffinity, true},
		{"owner with room, others' requests counted", ring.PrefixAware, 2, [3]int64{}, [3]int64{1, 0, 0}, 0, ring.ReasonAffinity, true},
		{"owner filled here", ring.PrefixAware, 2, [3]int64{2, 0, 0}, [3]int64{}, 0, ring.ReasonAffinity, false},
		{"owner filled by other routers", ring.PrefixAware, 2, [3]int64{1, 0, 0}, [3]int64{1, 0, 0}, 0, ring.ReasonAffinity, false},
		{"overflow with room", ring.PrefixAware, 2, [3]int64{2, 1, 0}, [3]int64{}, 1, ring.ReasonOverflow, true},
		{"overflow filled", ring.PrefixAware, 2, [3]int64{2, 1, 0}, [3]int64{0, 1, 0}, 1, ring.ReasonOverflow, false},
		{"fallback over the limit", ring.PrefixAware, 2, [3]int64{5, 5, 5}, [3]int64{}, 2, ring.ReasonFallback, true},
		{"consistent hash over the limit", ring.ConsistentHash, 2, [3]int64{9, 0, 0}, [3]int64{}, 0, ring.ReasonConsistentHash, true},
		{"no threshold", ring.PrefixAware, 0, [3]int64{1 << 20, 0, 0}, [3]int64{}, 0, ring.ReasonAffinity, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.ProbePath = ""
			cfg.StreamRelay = false
			p, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			var bs []ring.Backend
			for i := range 3 {
				addr := fmt.Sprintf("10.0.0.%d:8000", i+1)
				bs = append(bs, ring.Backend{ID: addr, Addr: "http://" + addr})
			}
			rcfg := ring.DefaultConfig()
			rcfg.Strategy, rcfg.ConcurrencyThreshold = tc.strategy, tc.threshold
			r, err := ring.New(rcfg, bs)
			if err != nil {
				t.Fatal(err)
			}
			if err := p.SetRing(r, 1); err != nil {
				t.Fatal(err)
			}
			tab := p.tab.Load()
			order := r.Order(r.Partition(key))
			for rank := range 3 {
				b := tab.bs[order[rank]]
				b.inflight.Store(tc.own[rank])
				b.remote.Store(tc.rem[rank])
			}
			d := ring.Decision{Backend: int(order[tc.rank]), Reason: tc.why, Rank: tc.rank}
			b := tab.bs[d.Backend]
			admits := r.Admits(d, b.globalInFlight()+1)
			if admits != tc.keep {
				t.Fatalf("the ring admits %+v with %d in flight: %v; the table says %v", d, b.globalInFlight()+1, admits, tc.keep)
			}

			st := &reqState{}
			st.reset(tab, time.Now())
			st.info.Key, st.recompute = key, 1
			got, err := p.hold(st, d)
			if err != nil {
				t.Fatal(err)
			}
			if kept := got == d; kept != admits {
				t.Fatalf("hold gave %+v for %+v: kept %v, the ring admits it %v", got, d, kept, admits)
			}
			// The request holds one slot, on the backend it goes to.
			for rank := range 3 {
				i := int(order[rank])
				want := tc.own[rank]
				if i == got.Backend {
					want++
				}
				if n := tab.bs[i].inflight.Load(); n != want {
					t.Errorf("backend at rank %d: %d in flight here, want %d", rank, n, want)
				}
			}
			if !admits && !r.Admits(got, tab.bs[got.Backend].globalInFlight()) {
				t.Errorf("picked again to %+v, which the ring does not admit either", got)
			}
		})
	}
}
