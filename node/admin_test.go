package node

import (
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/warmroute/warmroute/internal/testkit"
	"github.com/warmroute/warmroute/ring"
)

type adminResp struct {
	status int
	body   map[string]any
	raw    string
}

func adminDo(t *testing.T, method, url, token, body string) adminResp {
	t.Helper()
	req, _ := http.NewRequest(method, url, strings.NewReader(body))
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	out := adminResp{status: resp.StatusCode, raw: string(b)}
	json.Unmarshal(b, &out.body)
	return out
}

func (a adminResp) errCode() string {
	e, _ := a.body["error"].(map[string]any)
	c, _ := e["code"].(string)
	return c
}

func waitAgreed(t *testing.T, n *Node) {
	t.Helper()
	testkit.WaitFor(t, 10*time.Second, "the agreed ring", func() bool { _, ep := n.proxy.Ring(); return ep > 0 })
}

func TestAdminAPIStandalone(t *testing.T) {
	a, b := newHoldEngine(t, 0), newHoldEngine(t, 0)
	cfg := testConfig([]string{a.srv.URL})
	cfg.Admin.Token = "s3cret"
	n := runNode(t, cfg)
	waitAgreed(t, n)
	admin := "http://" + n.AdminAddr().String()

	// Writes need the token even from loopback.
	if r := adminDo(t, "POST", admin+"/v1/backends", "", `{"url":"`+b.srv.URL+`"}`); r.status != 401 || r.errCode() != "unauthorized" {
		t.Fatalf("no token: %d %s", r.status, r.raw)
	}
	if r := adminDo(t, "POST", admin+"/v1/backends", "wrong", `{"url":"`+b.srv.URL+`"}`); r.status != 401 {
		t.Fatalf("wrong token: %d", r.status)
	}
	// Reads from loopback do not.
	if r := adminDo(t, "GET", admin+"/v1/backends", "", ""); r.status != 200 {
		t.Fatalf("list: %d %s", r.status, r.raw)
	}

	r := adminDo(t, "POST", admin+"/v1/backends", "s3cret", `{"url":"`+b.srv.URL+`","zone":"z1","weight":2}`)
	if r.status != 200 {
		t.Fatalf("add: %d %s", r.status, r.raw)
	}
	epoch := uint64(r.body["epoch"].(float64))
	testkit.WaitFor(t, 5*time.Second, "the new ring", func() bool { rr, ep := n.proxy.Ring(); return ep >= epoch && rr.Len() == 2 })
	rr, _ := n.proxy.Ring()
	if i, ok := rr.Index(b.id()); !ok || rr.Backend(i).Weight != 2 || rr.Backend(i).Zone != "z1" {
		t.Fatalf("added backend not in the ring as sent: %+v", rr.Backends())
	}
	if got := rr.Limit(func() int { i, _ := rr.Index(b.id()); return i }()); got != 32 {
		t.Errorf("weight 2 limit = %d, want 32", got)
	}

	// Drain a: new requests go to b only.
	if r := adminDo(t, "POST", admin+"/v1/backends/"+a.id()+"/drain", "s3cret", ""); r.status != 200 {
		t.Fatalf("drain: %d %s", r.status, r.raw)
	}
	testkit.WaitFor(t, 5*time.Second, "a drained", func() bool {
		rr, _ := n.proxy.Ring()
		i, _ := rr.Index(a.id())
		return rr.Backend(i).State == ring.Draining
	})
	for i := 0; i < 20; i++ {
		if got, err := send("http://"+n.TrafficAddr().String(), chat(fmt.Sprintf("p%d", i))); err != nil || got != b.id() {
			t.Fatalf("after draining a: %q %v", got, err)
		}
	}

	// Routing config: patch, with validation.
	if r := adminDo(t, "PATCH", admin+"/v1/config", "s3cret", `{"prefix_length": 100}`); r.status != 400 || !strings.Contains(r.raw, "PrefixLength 100 out of range") {
		t.Fatalf("bad prefix length: %d %s", r.status, r.raw)
	}
	if r := adminDo(t, "PATCH", admin+"/v1/config", "s3cret", `{"prefix_lenght": 2048}`); r.status != 400 || !strings.Contains(r.raw, "unknown routing field") {
		t.Fatalf("typo: %d %s", r.status, r.raw)
	}
	if r := adminDo(t, "PATCH", admin+"/v1/config", "s3cret", `{"PrefixLength": 2048, "strategy": "round-robin"}`); r.status != 200 {
		t.Fatalf("patch: %d %s", r.status, r.raw)
	}
	testkit.WaitFor(t, 5*time.Second, "new routing", func() bool {
		rr, _ := n.proxy.Ring()
		return rr.Config().PrefixLength == 2048 && rr.Config().Strategy == ring.RoundRobin
	})
	if r := adminDo(t, "GET", admin+"/v1/config", "", ""); !strings.Contains(r.raw, `"strategy": "ROUND_ROBIN"`) {
		t.Fatalf("get config: %s", r.raw)
	}

	// Validation errors.
	for _, c := range []struct {
		method, path, body string
		status             int
		code               string
	}{
		{"POST", "/v1/backends", `{"url":"ftp://x:1"}`, 400, "invalid_backend"},
		{"POST", "/v1/backends", `{"url":"http://h:1","colour":"red"}`, 400, "invalid_backend"},
		{"POST", "/v1/backends", `{"url":"http://h:1","weight":5000}`, 400, "invalid_backend"},
		{"POST", "/v1/backends", `not json`, 400, "invalid_backend"},
		{"DELETE", "/v1/backends/nope:1", ``, 404, "unknown_backend"},
		{"POST", "/v1/backends/nope:1/drain", ``, 404, "unknown_backend"},
		{"POST", "/v1/backends/" + a.id() + "/explode", ``, 404, "not_found"},
	} {
		if r := adminDo(t, c.method, admin+c.path, "s3cret", c.body); r.status != c.status || r.errCode() != c.code {
			t.Errorf("%s %s %s: %d %s, want %d %s", c.method, c.path, c.body, r.status, r.raw, c.status, c.code)
		}
	}

	// Remove b; the ring follows.
	if r := adminDo(t, "DELETE", admin+"/v1/backends/"+b.id(), "s3cret", ""); r.status != 200 {
		t.Fatalf("remove: %d %s", r.status, r.raw)
	}
	testkit.WaitFor(t, 5*time.Second, "b removed", func() bool { rr, _ := n.proxy.Ring(); _, ok := rr.Index(b.id()); return !ok })
}

// TestClusterAgreementAndForwarding: three routers agree on every change;
// a write sent to a follower is forwarded to the leader; all nodes route
// 10,000 random prompts identically.
func TestClusterAgreementAndForwarding(t *testing.T) {
	var urls []string
	for i := 0; i < 4; i++ {
		urls = append(urls, newHoldEngine(t, 0).srv.URL)
	}
	nodes := startCluster(t, 3, func(i int, c *Config) {
		*c = testConfig(urls[:3])
		c.Admin.Token = "tok"
	})
	for _, n := range nodes {
		waitAgreed(t, n)
	}
	var follower *Node
	for _, n := range nodes {
		if !n.agree.IsLeader() {
			follower = n
			break
		}
	}
	r := adminDo(t, "POST", "http://"+follower.AdminAddr().String()+"/v1/backends", "tok", `{"url":"`+urls[3]+`"}`)
	if r.status != 200 {
		t.Fatalf("write through a follower: %d %s", r.status, r.raw)
	}
	epoch := uint64(r.body["epoch"].(float64))
	// The follower answered after applying it itself.
	if _, e := follower.proxy.Ring(); e < epoch {
		t.Errorf("follower at epoch %d after acknowledging %d", e, epoch)
	}
	for _, n := range nodes {
		testkit.WaitFor(t, 5*time.Second, "every node at the new epoch", func() bool { rr, e := n.proxy.Ring(); return e == epoch && rr.Len() == 4 })
	}
	assertAgreement(t, nodes, 10000)
}

// assertAgreement checks that every node picks the same backend for the
// same prompts, with no load.
func assertAgreement(t *testing.T, nodes []*Node, prompts int) {
	t.Helper()
	rng := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < prompts; i++ {
		body := []byte(chat(fmt.Sprintf("prompt %d %d", i, rng.Uint64())))
		var first string
		for j, n := range nodes {
			_, e, err := n.proxy.Explain(ring.Chat, body, nil)
			if err != nil {
				t.Fatal(err)
			}
			if j == 0 {
				first = e.Backend
			} else if e.Backend != first {
				t.Fatalf("prompt %d: node 0 picks %s, node %d picks %s", i, first, j, e.Backend)
			}
		}
	}
}
