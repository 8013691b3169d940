package proxy

import (
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/warmroute/warmroute/ring"
)

// TestProbeEndsEjection: a backend ejected after connect failures is taken
// back as soon as an active probe passes, not only when EjectFor runs out.
func TestProbeEndsEjection(t *testing.T) {
	good := newStub(t, "good", nil)
	addr := refusedAddr(t) // nothing listens: dials are refused
	cfg := testProxyConfig()
	cfg.EjectAfter, cfg.EjectFor = 1, time.Hour
	h := startProxyBackends(t, cfg, ring.DefaultConfig(), []ring.Backend{
		{ID: addr, Addr: "http://" + addr},
		{ID: strings.TrimPrefix(good.srv.URL, "http://"), Addr: good.srv.URL},
	})
	status := func() BackendStatus {
		for _, s := range h.p.Status() {
			if s.ID == addr {
				return s
			}
		}
		t.Fatal("backend missing")
		return BackendStatus{}
	}
	for i := 0; i < 20 && !status().Ejected; i++ {
		post(t, h.url+"/v1/chat/completions", chatReq(string(rune('a'+i)), ""))
	}
	if !status().Ejected {
		t.Fatal("the unreachable backend was never ejected")
	}
	// The backend comes back on its address.
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Skipf("port %s taken meanwhile: %v", addr, err)
	}
	back := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	back.Listener.Close()
	back.Listener = ln
	back.Start()
	defer back.Close()
	waitFor(t, func() bool { s := status(); return !s.Ejected && s.Healthy }, "a passing probe to end the ejection")
}

// TestProbeTimeoutOnSilentBackend: a backend that accepts connections but
// never answers its health check is marked down within the probe timeout,
// not after the first-byte timeout of ordinary requests.
func TestProbeTimeoutOnSilentBackend(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	silent := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" {
			select {
			case <-release:
			case <-r.Context().Done():
			}
		}
	}))
	defer silent.Close()
	cfg := testProxyConfig()
	cfg.ProbeTimeout = 200 * time.Millisecond
	cfg.FirstByteTimeout = time.Hour
	id := strings.TrimPrefix(silent.URL, "http://")
	h := startProxyBackends(t, cfg, ring.DefaultConfig(), []ring.Backend{{ID: id, Addr: silent.URL}})
	waitFor(t, func() bool { return h.p.Status()[0].ProbeDown }, "the silent backend to fail its health checks")
}
