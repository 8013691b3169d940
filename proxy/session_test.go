package proxy

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/warmroute/warmroute/ring"
)

// TestSessionHeaderKeys: with a session header configured, the requests of
// one session land on one backend however their prompts differ, other
// sessions spread, SageMaker's NEW_SESSION and requests without the header
// are keyed by their prompt, and a bad session id gets 400.
func TestSessionHeaderKeys(t *testing.T) {
	var stubs []*stub
	for i := 0; i < 5; i++ {
		stubs = append(stubs, newStub(t, fmt.Sprintf("s%d", i), nil))
	}
	rc := ring.DefaultConfig()
	rc.SessionHeader = "X-Session-Id"
	h := startProxy(t, testProxyConfig(), rc, stubs...)
	url := h.url + "/v1/chat/completions"
	backendOf := func(prompt string, hdr ...string) string {
		t.Helper()
		resp, body := post(t, url, chatReq(prompt, ""), hdr...)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%d %s", resp.StatusCode, body)
		}
		return resp.Header.Get("X-Warmroute-Backend")
	}
	used := map[string]bool{}
	for s := 0; s < 20; s++ {
		id := fmt.Sprintf("session-%d", s)
		first := backendOf("turn 0 of a long conversation", "X-Session-Id", id)
		for turn := 1; turn < 4; turn++ {
			if got := backendOf(fmt.Sprintf("a prompt that changes early %d/%d", s, turn), "X-Session-Id", id); got != first {
				t.Fatalf("%s turn %d on %s, turn 0 on %s", id, turn, got, first)
			}
		}
		used[first] = true
	}
	if len(used) < 3 {
		t.Fatalf("20 sessions on %d of 5 backends", len(used))
	}
	// Keyed by the prompt: the same as without the header.
	for i := 0; i < 10; i++ {
		p := fmt.Sprintf("prompt %d", i)
		if a, b := backendOf(p), backendOf(p, "X-Session-Id", ring.NewSession); a != b {
			t.Fatalf("NEW_SESSION routed %q to %s, the prompt's key to %s", p, b, a)
		}
	}
	resp, body := post(t, url, chatReq("x", ""), "X-Session-Id", "tab\there")
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), `"code":"invalid_session_id"`) {
		t.Fatalf("bad session id: %d %s", resp.StatusCode, body)
	}
	info, _, err := h.p.ExplainSession(ring.Chat, []byte(chatReq("x", "")), nil, []byte("session-1"))
	if err != nil || !info.Session || info.PrefixBytes != 0 {
		t.Fatalf("explain with a session: %+v %v", info, err)
	}
}
