package node

import (
	"context"
	"net"
	"net/http"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// ignoreFasthttpClock skips fasthttp's process-wide Date-header clock: one
// goroutine started on the first server's first request that runs for the
// life of the process and has no way to stop.
var ignoreFasthttpClock = goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.updateServerDate.func1")

// TestMain fails the package's tests when a goroutine outlives them: every
// node, with its proxy, admin server, gossip, Raft, scrapers and probes,
// must have stopped. Two fasthttp goroutines end on their own timers after
// what started them stopped: a stopped server's worker-pool cleaner within
// its 10 s idle-worker sleep, a client's connection cleaner within
// IdleConnTimeout of its last connection closing. goleak.VerifyTestMain
// retries for only about 1.5 s, so the check waits up to 15 s for them
// rather than ignoring them (one that never ends is still reported).
func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		http.DefaultClient.CloseIdleConnections()
		err := goleak.Find(ignoreFasthttpClock)
		for deadline := time.Now().Add(15 * time.Second); err != nil && time.Now().Before(deadline); {
			time.Sleep(500 * time.Millisecond)
			err = goleak.Find(ignoreFasthttpClock)
		}
		if err != nil {
			os.Stderr.WriteString("goleak: goroutines outlived the tests: " + err.Error() + "\n")
			code = 1
		}
	}
	os.Exit(code)
}

// Found by the leak check: a node stopped as soon as it started (Shutdown
// before its proxy's Serve had begun) left Serve accepting on the traffic
// port for ever. Run now returns only when both servers have, and the
// ports are closed.
func TestRunStoppedAtOnceReleasesServers(t *testing.T) {
	for i := 0; i < 5; i++ {
		n, err := New(testConfig(nil), Options{})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		done := make(chan error, 1)
		go func() { done <- n.Run(ctx) }()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("Run: %v", err)
			}
		case <-time.After(15 * time.Second):
			t.Fatal("Run did not return")
		}
		for _, addr := range []string{n.TrafficAddr().String(), n.AdminAddr().String()} {
			if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
				c.Close()
				t.Fatalf("run %d: %s still accepts after Run returned", i, addr)
			}
		}
	}
}

// TestCloseWithoutRun: a node built and never run releases Raft, gossip
// and both listeners on Close (TestMain checks that no goroutine of them
// is left); Close is idempotent, and Run after Close fails instead of
// serving on closed listeners.
func TestCloseWithoutRun(t *testing.T) {
	cfg := testConfig(nil)
	cfg.Cluster.NodeName = "closer"
	cfg.Cluster.GossipListen = "127.0.0.1:0"
	cfg.Cluster.RaftListen = "127.0.0.1:0"
	cfg.Cluster.BootstrapExpect = 1
	n, err := New(cfg, Options{})
	if err != nil {
		t.Fatal(err)
	}
	addrs := []string{n.TrafficAddr().String(), n.AdminAddr().String(), n.agree.Addr()}
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	if err := n.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	for _, a := range addrs {
		if c, err := net.DialTimeout("tcp", a, time.Second); err == nil {
			c.Close()
			t.Errorf("%s still accepts connections after Close", a)
		}
	}
	if err := n.Run(context.Background()); err == nil {
		t.Fatal("Run after Close served")
	}
}
