package proxy

import (
	"io"
	"net/http"
	"strings"
	"testing"

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
