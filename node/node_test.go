package node

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warmroute/warmroute/internal/backendspec"
	"github.com/warmroute/warmroute/internal/testkit"
)

// holdEngine answers every request after hold; it tracks concurrency.
type holdEngine struct {
	srv       *httptest.Server
	hold      time.Duration
	cur, peak atomic.Int64
	hits      atomic.Int64
}

func newHoldEngine(t *testing.T, hold time.Duration) *holdEngine {
	return newHoldEngineMetrics(t, hold, "")
}

// newHoldEngineMetrics is newHoldEngine serving metrics (Prometheus text)
// on /metrics.
func newHoldEngineMetrics(t *testing.T, hold time.Duration, metrics string) *holdEngine {
	e := &holdEngine{hold: hold}
	e.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/metrics" && metrics != "" {
			io.WriteString(w, metrics)
			return
		}
		if r.URL.Path != "/v1/chat/completions" {
			return
		}
		io.Copy(io.Discard, r.Body)
		e.hits.Add(1)
		c := e.cur.Add(1)
		for {
			p := e.peak.Load()
			if c <= p || e.peak.CompareAndSwap(p, c) {
				break
			}
		}
		time.Sleep(e.hold)
		e.cur.Add(-1)
		io.WriteString(w, `{"object":"chat.completion"}`)
	}))
	t.Cleanup(e.srv.Close)
	return e
}

func (e *holdEngine) id() string { return strings.TrimPrefix(e.srv.URL, "http://") }

func testConfig(backends []string) Config {
	c := DefaultConfig()
	c.Listen, c.AdminListen = "127.0.0.1:0", "127.0.0.1:0"
	for _, b := range backends {
		c.Backends = append(c.Backends, backendspec.Spec{URL: b})
	}
	c.Health.ProbeInterval = 100 * time.Millisecond
	c.Engine.MetricsPath = ""
	c.ShutdownTimeout = 2 * time.Second
	return c
}

// runNode starts a node and stops it at the end of the test.
func runNode(t *testing.T, cfg Config) *Node {
	t.Helper()
	n, err := New(cfg, Options{})
	if err != nil {
		t.Fatal(err)
	}
	return runBuilt(t, n)
}

// runBuilt runs a node New returned and stops it at the end of the test.
func runBuilt(t *testing.T, n *Node) *Node {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- n.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("node %s: %v", n.name, err)
			}
		case <-time.After(15 * time.Second):
			t.Errorf("node %s did not stop", n.name)
		}
	})
	return n
}

// cluster starts n nodes that gossip on loopback, with Raft timeouts of
// 100 ms.
func startCluster(t *testing.T, size int, mutate func(i int, c *Config)) []*Node {
	t.Helper()
	return startClusterRaft(t, size, 100*time.Millisecond, mutate)
}

// startClusterRaft is startCluster with the given Raft timeout scale.
func startClusterRaft(t *testing.T, size int, raftTimeout time.Duration, mutate func(i int, c *Config)) []*Node {
	t.Helper()
	var nodes []*Node
	for i := 0; i < size; i++ {
		cfg := DefaultConfig()
		mutate(i, &cfg)
		cfg.Cluster.NodeName = fmt.Sprintf("router-%d", i)
		cfg.Cluster.GossipListen = "127.0.0.1:0"
		cfg.Cluster.RaftListen = "127.0.0.1:0"
		cfg.Cluster.RaftTimeout = raftTimeout
		if cfg.Cluster.BootstrapExpect == 0 && i < 3 {
			cfg.Cluster.BootstrapExpect = min(size, 3)
		}
		if i > 0 {
			cfg.Cluster.Join = []string{nodes[0].GossipAddr()}
		}
		nodes = append(nodes, runNode(t, cfg))
	}
	testkit.WaitFor(t, 10*time.Second, "every node to see the others", func() bool {
		for _, n := range nodes {
			if len(n.gossip.Members()) != size {
				return false
			}
		}
		return true
	})
	// A cluster router refuses requests until it routes on the agreed
	// state.
	testkit.WaitFor(t, 10*time.Second, "every node to apply the agreed state", func() bool {
		for _, n := range nodes {
			if !n.agreed.Load() {
				return false
			}
		}
		return true
	})
	return nodes
}

func chat(prompt string) string {
	return fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":%q}]}`, prompt)
}

func send(url, body string) (string, error) {
	resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, resp.Body)
	if resp.StatusCode != 200 {
		return "", fmt.Errorf("status %d", resp.StatusCode)
	}
	return resp.Header.Get("X-Warmroute-Backend"), nil
}

func TestStandaloneNodeServes(t *testing.T) {
	e := newHoldEngine(t, 0)
	n := runNode(t, testConfig([]string{e.srv.URL}))
	b, err := send("http://"+n.TrafficAddr().String(), chat("hi"))
	if err != nil || b != e.id() {
		t.Fatalf("got %q, %v", b, err)
	}
	testkit.WaitFor(t, 10*time.Second, "the agreed ring", func() bool { _, ep := n.proxy.Ring(); return ep > 0 })
	resp, err := http.Get("http://" + n.AdminAddr().String() + "/status")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), `"raft_state": "Leader"`) || !strings.Contains(string(body), e.id()) {
		t.Fatalf("status %s", body)
	}
}

// TestGlobalInFlightBoundsOwner is the load-sharing acceptance test: three
// routers, ConcurrencyThreshold T, T clients per router all sending one
// prefix. With shared in-flight counts the owner sees about T concurrent
// requests and the rest overflow; alone each router would allow T, 3T in
// all. Five engines give room for the overflow, so no request falls back to
// least-loaded (which ignores the threshold by design).
func TestGlobalInFlightBoundsOwner(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-node load test")
	}
	const T = 4
	for _, shared := range []bool{true, false} {
		t.Run(fmt.Sprintf("shared=%v", shared), func(t *testing.T) {
			var engines []*holdEngine
			var urls []string
			for i := 0; i < 5; i++ {
				e := newHoldEngine(t, 200*time.Millisecond)
				engines = append(engines, e)
				urls = append(urls, e.srv.URL)
			}
			mut := func(i int, c *Config) {
				*c = testConfig(urls)
				c.Routing.ConcurrencyThreshold = T
			}
			var nodes []*Node
			if shared {
				nodes = startCluster(t, 3, mut)
			} else {
				for i := 0; i < 3; i++ {
					var c Config
					mut(i, &c)
					nodes = append(nodes, runNode(t, c))
				}
			}
			body := chat("one hot shared prefix")
			// T clients per router, started 60 ms apart (a ramp, not a
			// burst), each looping for 3 s.
			var wg sync.WaitGroup
			var errs atomic.Int64
			stop := time.Now().Add(3 * time.Second)
			for c := 0; c < 3*T; c++ {
				url := "http://" + nodes[c%3].TrafficAddr().String()
				wg.Add(1)
				go func() {
					defer wg.Done()
					for time.Now().Before(stop) {
						if _, err := send(url, body); err != nil {
							errs.Add(1)
						}
					}
				}()
				time.Sleep(60 * time.Millisecond)
			}
			wg.Wait()
			if errs.Load() > 0 {
				t.Fatalf("%d requests failed", errs.Load())
			}
			var ownerPeak int64
			for _, e := range engines {
				ownerPeak = max(ownerPeak, e.peak.Load())
			}
			t.Logf("shared=%v: owner peak concurrency %d with ConcurrencyThreshold %d (slack %d)", shared, ownerPeak, T, ownerPeak-T)
			if shared && ownerPeak > T+3 {
				t.Errorf("owner reached %d concurrent requests, want at most T+3 = %d", ownerPeak, T+3)
			}
			if !shared && ownerPeak < 2*T {
				t.Errorf("without sharing the owner reached only %d; the test does not load it", ownerPeak)
			}
		})
	}
}

func TestRemoteInFlightPropagates(t *testing.T) {
	e := newHoldEngine(t, 2*time.Second)
	nodes := startCluster(t, 3, func(i int, c *Config) { *c = testConfig([]string{e.srv.URL}) })
	go send("http://"+nodes[0].TrafficAddr().String(), chat("x"))
	start := time.Now()
	testkit.WaitFor(t, 5*time.Second, "node 2 to see node 0's request", func() bool {
		for _, s := range nodes[2].proxy.Status() {
			if s.RemoteInFlight == 1 {
				return true
			}
		}
		return false
	})
	t.Logf("remote in-flight visible after %v", time.Since(start))
}
