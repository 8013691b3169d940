package node

import (
	"testing"

	"github.com/warmroute/warmroute/node/cluster"
	"github.com/warmroute/warmroute/ring"
)

// TestValidateState checks what a leader refuses to commit: the state its
// own ring was built from passes without a rebuild, a membership change
// passes through Rebuild, and a duplicate ID, settings out of range or an
// address the proxy cannot dial are refused.
func TestValidateState(t *testing.T) {
	n, err := New(testConfig([]string{"http://127.0.0.1:9001", "http://127.0.0.1:9002", "http://127.0.0.1:9003"}), Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Close() })
	n.ringMu.Lock()
	base := n.baseRing
	n.ringMu.Unlock()
	var own cluster.State
	own.Routing = base.Config().Settings
	for _, b := range base.Backends() {
		own.Backends = append(own.Backends, cluster.Backend{ID: b.ID, URL: b.Addr, Zone: b.Zone, Weight: b.Weight, State: b.State.String()})
	}
	rc := ring.ConfigFor(own.Routing)
	rc.LocalZone = n.cfg.Cluster.Zone
	if !sameRing(base, rc, own.RingBackends()) {
		t.Fatal("the state built from the node's ring does not match it")
	}
	if err := n.validateState(own); err != nil {
		t.Fatalf("the node's own state: %v", err)
	}
	grown := own.Clone()
	grown.Backends = append(grown.Backends, cluster.Backend{ID: "127.0.0.1:9004", URL: "http://127.0.0.1:9004", State: "active"})
	if err := n.validateState(grown); err != nil {
		t.Fatalf("a backend more: %v", err)
	}
	dup := own.Clone()
	dup.Backends = append(dup.Backends, dup.Backends[0])
	badSettings := own.Clone()
	badSettings.Routing.ConcurrencyThreshold = 2000
	badAddr := own.Clone()
	badAddr.Backends = append(badAddr.Backends, cluster.Backend{ID: "x", URL: "ftp://127.0.0.1:9005", State: "active"})
	for name, s := range map[string]cluster.State{"duplicate ID": dup, "threshold 2000": badSettings, "ftp URL": badAddr} {
		if err := n.validateState(s); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}
