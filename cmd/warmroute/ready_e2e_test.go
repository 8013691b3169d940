package main

import (
	"encoding/base64"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/warmroute/warmroute/loadtest/proc"
)

// A router that never joined its cluster (--bootstrap-expect 3 with no
// peers, a certificate of another CA, no cluster TLS) answered /readyz 200
// and routed on its own config file at epoch 0, with nothing logged for
// 11 s (before). Now a cluster router is not ready, and refuses to route
// with 503 not_ready, until it has applied the state agreed under a
// leader it names; it says what it waits for at once and warns while it
// waits. Once ready it stays ready without a leader: the last agreed ring
// keeps routing.

// notReady checks that r is not ready and refuses a request with 503
// not_ready, each naming want, and that engine e saw nothing.
func notReady(t *testing.T, r *router, e *sseEngine, want string) {
	t.Helper()
	get := func(path string) (int, string) {
		resp, err := http.Get(r.url + path)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp.StatusCode, string(b)
	}
	if code, body := get("/readyz"); code != 503 || !strings.Contains(body, "not ready: ") || !strings.Contains(body, want) {
		t.Errorf("%s /readyz: %d %q, want 503 naming %q", r.name, code, body, want)
	}
	if code, body := get("/ping"); code != 503 || !strings.Contains(body, `"code":"not_ready"`) {
		t.Errorf("%s /ping: %d %s, want 503 not_ready", r.name, code, body)
	}
	hits := e.hits.Load()
	resp, body := postChat(t, r.url, chatBody("where would this go", false))
	if resp.StatusCode != 503 || !strings.Contains(string(body), `"code":"not_ready"`) || !strings.Contains(string(body), want) {
		t.Errorf("%s routed before agreeing: %d %s", r.name, resp.StatusCode, body)
	}
	if n := e.hits.Load() - hits; n != 0 {
		t.Errorf("%s sent %d requests to a backend before agreeing", r.name, n)
	}
}

// waitServing waits until r answers /healthz.
func waitServing(t *testing.T, r *router) {
	t.Helper()
	if _, err := pollUntil(15*time.Second, func() (bool, error) {
		resp, err := http.Get(r.url + "/healthz")
		if err != nil {
			return false, r.Alive()
		}
		resp.Body.Close()
		return true, nil
	}); err != nil {
		t.Fatalf("%s: %v\n%s", r.name, err, r.Logs())
	}
}

// waitWarned waits until r's log holds a WARN saying it is not ready and
// containing every want; the router warns after 10 s.
func waitWarned(t *testing.T, r *router, want ...string) {
	t.Helper()
	warn := regexp.MustCompile(`(?m)^.*level=WARN msg="not ready: .*$`)
	var lines []string
	if _, err := pollUntil(25*time.Second, func() (bool, error) {
		lines = warn.FindAllString(r.Logs(), -1)
		for _, l := range lines {
			ok := true
			for _, w := range want {
				ok = ok && strings.Contains(l, w)
			}
			if ok {
				return true, nil
			}
		}
		return false, r.Alive()
	}); err != nil {
		t.Errorf("%s never warned that it is not ready naming %q: %v\n%s", r.name, want, err, r.Logs())
	}
}

func TestE2ENotReadyUntilAgreed(t *testing.T) {
	t.Parallel()
	needCluster(t)
	e := newEngine(t, 0, 0, 1)
	backends := []string{e.srv.URL}

	// One router of three with --bootstrap-expect 3 and nobody to join.
	r0 := spawnRouter(t, proc.ServeArgs{NodeName: "r0", Backends: backends, BootstrapExpect: 3})
	waitServing(t, r0)
	notReady(t, r0, e, "--bootstrap-expect 3")
	if !strings.Contains(r0.Logs(), "not ready until this router applies the state agreed under a Raft leader") {
		t.Errorf("nothing said at start:\n%s", r0.Logs())
	}
	waitWarned(t, r0, "--bootstrap-expect 3")
	notReady(t, r0, e, "--bootstrap-expect 3")

	// Its peers arrive: all three agree and route.
	r1 := spawnRouter(t, proc.ServeArgs{NodeName: "r1", Backends: backends, BootstrapExpect: 3, Join: []string{r0.gossip}})
	r2 := spawnRouter(t, proc.ServeArgs{NodeName: "r2", Backends: backends, BootstrapExpect: 3, Join: []string{r0.gossip}})
	for _, r := range []*router{r0, r1, r2} {
		if err := r.waitReady(); err != nil {
			t.Fatalf("%s: %v\n%s", r.name, err, r.Logs())
		}
		if resp, body := postChat(t, r.url, chatBody("agreed", false)); resp.StatusCode != 200 {
			t.Fatalf("%s after agreeing: %d %s", r.name, resp.StatusCode, body)
		}
	}
	if !strings.Contains(r0.Logs(), "router ready: it routes on the agreed state") {
		t.Errorf("r0 did not say it is ready:\n%s", r0.Logs())
	}

	// Both peers killed: no quorum, no leader. The survivor keeps
	// routing on the last agreed ring and stays ready.
	r1.Kill()
	r2.Kill()
	for end := time.Now().Add(4 * time.Second); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
		resp, err := http.Get(r0.url + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("r0 without a leader: /readyz %d %s", resp.StatusCode, b)
		}
		if resp, body := postChat(t, r0.url, chatBody("no leader", false)); resp.StatusCode != 200 {
			t.Fatalf("r0 without a leader: %d %s", resp.StatusCode, body)
		}
	}
}

// TestE2ENotReadyWhenRefused: routers that the cluster refuses (a
// certificate of another CA; no cluster TLS at all) are not ready and say
// which peer they could not prove and why.
func TestE2ENotReadyWhenRefused(t *testing.T) {
	t.Parallel()
	needCluster(t)
	e := newEngine(t, 0, 0, 1)
	backends := []string{e.srv.URL}
	pki := newClusterPKI(t)
	seed := spawnRouter(t, proc.ServeArgs{NodeName: "r1", Backends: backends, BootstrapExpect: 1, ClusterTLS: pki.files(t, "r1")})
	if err := seed.waitReady(); err != nil {
		t.Fatalf("%v\n%s", err, seed.Logs())
	}

	other := newClusterPKI(t)
	foreign := spawnRouter(t, proc.ServeArgs{NodeName: "r2", Backends: backends, Join: []string{seed.gossip}, ClusterTLS: other.files(t, "r2")})
	plain := spawnRouter(t, proc.ServeArgs{NodeName: "r3", Backends: backends, Join: []string{seed.gossip}})
	for _, r := range []*router{foreign, plain} {
		waitServing(t, r)
		notReady(t, r, e, "waiting to be added to the Raft configuration")
	}
	waitWarned(t, foreign, "identity probe of r1 failed", "do not share a cluster CA")
	waitWarned(t, plain, "identity probe of r1 failed", "no cluster TLS")
	for _, r := range []*router{foreign, plain} {
		notReady(t, r, e, "identity probe of r1 failed")
	}
}

// TestE2EJoinFailuresNamed: a router whose seeds cannot be joined (one
// runs with another gossip key, the other address has nobody listening)
// warns about each seed on a line of its own, with what the failure
// usually means; before, one line held every error and no hint.
func TestE2EJoinFailuresNamed(t *testing.T) {
	t.Parallel()
	needCluster(t)
	e := newEngine(t, 0, 0, 1)
	backends := []string{e.srv.URL}
	key := func(name, k string) string {
		return writeSecret(t, name, base64.StdEncoding.EncodeToString([]byte(k)))
	}
	seed := spawnRouter(t, proc.ServeArgs{NodeName: "r1", Backends: backends, BootstrapExpect: 1,
		GossipKeyFile: key("a.key", "0123456789abcdef")})
	if err := seed.waitReady(); err != nil {
		t.Fatalf("%v\n%s", err, seed.Logs())
	}
	closed := freeAddr(t)
	r := spawnRouter(t, proc.ServeArgs{NodeName: "r2", Backends: backends, Join: []string{seed.gossip, closed},
		GossipKeyFile: key("b.key", "fedcba9876543210")})
	waitServing(t, r)
	notReady(t, r, e, "none of the --join seeds")
	lines := func() []string {
		return regexp.MustCompile(`(?m)^.*level=WARN msg="gossip join failed.*$`).FindAllString(r.Logs(), -1)
	}
	if _, err := pollUntil(25*time.Second, func() (bool, error) { return len(lines()) >= 2, r.Alive() }); err != nil {
		t.Fatalf("no warning for each seed: %v\n%s", err, r.Logs())
	}
	var keyLine, refusedLine bool
	for _, l := range lines() {
		keyLine = keyLine || strings.Contains(l, seed.gossip) && strings.Contains(l, "hint=") && strings.Contains(l, "gossip key") &&
			!strings.Contains(l, closed)
		refusedLine = refusedLine || strings.Contains(l, closed) && strings.Contains(l, "hint=") && strings.Contains(l, "nothing listens") &&
			!strings.Contains(l, seed.gossip)
	}
	if !keyLine || !refusedLine {
		t.Errorf("want one warning naming the seed with another key and one naming the closed address, each with a hint:\n%s",
			strings.Join(lines(), "\n"))
	}
	waitWarned(t, r, "none of the --join seeds")
}
