package proxy

import (
	"slices"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/warmroute/warmroute/ring"
)

// TestRequestsByReason walks ring's reason table: every reason has its
// cached counters (counting it allocates nothing once resolved) and is
// counted under its label.
func TestRequestsByReason(t *testing.T) {
	reasons := ring.Reasons()
	if len(reasons) != int(ring.NumReasons) {
		t.Fatalf("%d reasons in the table, %d counted", len(reasons), ring.NumReasons)
	}
	m := newMetrics(prometheus.NewRegistry())
	bm := m.forBackend("b/")
	for _, info := range reasons {
		m.countRequest(bm, routeChat, info.Reason, 200)
		if got := testutil.ToFloat64(m.requests.WithLabelValues("chat", info.Label, "b/", "200")); got != 1 {
			t.Errorf("%s: %v requests counted, want 1", info.Label, got)
		}
		if bm.reqs[routeChat][info.Reason][codeSlot(200)].Load() == nil {
			t.Errorf("%s: no cached counter", info.Label)
		}
		if n := testing.AllocsPerRun(50, func() { m.countRequest(bm, routeChat, info.Reason, 200) }); n != 0 {
			t.Errorf("%s: counting a request allocates %v times", info.Label, n)
		}
	}
	if n := testutil.CollectAndCount(m.requests); n != len(reasons) {
		t.Errorf("%d series for %d reasons", n, len(reasons))
	}
}

// TestDecisionPerStrategy: under every strategy of ring's table a request
// is answered with a decision of the reason table, in its header and in
// warmroute_requests_total.
func TestDecisionPerStrategy(t *testing.T) {
	labels := make([]string, 0, ring.NumReasons)
	for _, info := range ring.Reasons() {
		labels = append(labels, info.Label)
	}
	a, b := newStub(t, "a", nil), newStub(t, "b", nil)
	for _, info := range ring.Strategies() {
		rc := ring.DefaultConfig()
		rc.Strategy = info.Strategy
		h := startProxy(t, testProxyConfig(), rc, a, b)
		resp, body := post(t, h.url+"/v1/chat/completions", chatReq("hello "+info.Name, ""))
		if resp.StatusCode != 200 {
			t.Fatalf("%s: status %d: %s", info.Name, resp.StatusCode, body)
		}
		got := resp.Header.Get(HeaderDecision)
		if !slices.Contains(labels, got) || got == ring.ReasonNone.String() {
			t.Errorf("%s: decision %q, not a reason of the table", info.Name, got)
			continue
		}
		backend := resp.Header.Get(HeaderBackend)
		if n := testutil.ToFloat64(h.p.m.requests.WithLabelValues("chat", got, backend, "200")); n != 1 {
			t.Errorf("%s: %v requests counted under %s, %s", info.Name, n, got, backend)
		}
	}
}
