package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/warmroute/warmroute/internal/testkit"
	"github.com/warmroute/warmroute/loadtest/proc"
)

// The end-to-end tests' processes: `warmroute serve` and `warmroute
// gpusim` run by loadtest/proc, their command lines from proc.ServeArgs and
// proc.GpusimArgs, and the one way the tests wait for a condition.

// routerLogBytes is how much of a router's output a test keeps: all of it
// in practice (TestE2EBadInputMatrix searches the whole log).
const routerLogBytes = 4 << 20

// router is a `warmroute serve` process of a test.
type router struct {
	*proc.Process
	name, url, admin, gossip string
	started                  time.Time
}

// launch starts `warmroute serve` with a without waiting for it, filling
// what a leaves empty: free loopback ports for the client and admin
// listeners, probes every 100 ms, 2 s to shut down. At the end of the test,
// unless the test stopped or killed it, the router must still run and
// must stop cleanly on SIGTERM.
func launch(t *testing.T, a proc.ServeArgs) *router {
	t.Helper()
	a.Listen = cmp.Or(a.Listen, freeAddr(t))
	a.AdminListen = cmp.Or(a.AdminListen, freeAddr(t))
	a.ProbeInterval = cmp.Or(a.ProbeInterval, 100*time.Millisecond)
	a.ShutdownTimeout = cmp.Or(a.ShutdownTimeout, 2*time.Second)
	name := cmp.Or(a.NodeName, "router")
	started := time.Now()
	p, err := proc.Start(proc.Spec{Name: name, Path: binPath, Args: a.Args(), TailBytes: routerLogBytes})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if p.Stopped() {
			return
		}
		early := p.Alive()
		err := p.Stop(10 * time.Second)
		switch {
		case early != nil:
			t.Errorf("router %s exited before the end of the test: %v", name, early)
		case err != nil:
			t.Errorf("router %s stopped with %v\n%s", name, err, p.Logs())
		}
	})
	admin := "http://" + a.AdminListen
	if a.ClusterTLS != (proc.ClusterTLS{}) {
		admin = "https://" + a.AdminListen // the admin API serves the cluster certificate
	}
	return &router{Process: p, name: a.NodeName, url: "http://" + a.Listen, admin: admin, gossip: a.GossipListen, started: started}
}

// startRouter is launch, then a wait until the router is ready.
func startRouter(t *testing.T, a proc.ServeArgs) *router {
	t.Helper()
	r := launch(t, a)
	if err := r.waitReady(); err != nil {
		t.Fatal(err)
	}
	return r
}

// waitReady waits until the router answers /readyz with 200.
func (r *router) waitReady() error {
	return r.WaitReady(context.Background(), 15*time.Second, proc.HTTPCheck(r.url+"/readyz"))
}

// startRouterUntil is launch, then a wait until up holds: for a router
// that cannot become ready.
func startRouterUntil(t *testing.T, a proc.ServeArgs, up func(*router) bool) *router {
	t.Helper()
	r := launch(t, a)
	if err := r.WaitReady(context.Background(), 15*time.Second, func(context.Context) error {
		if !up(r) {
			return errors.New("not up yet")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return r
}

// startRouterNoWait is startRouter for a router that cannot become ready
// (its backends are unreachable): it waits for /healthz and a ring with
// the first backend in it instead.
func startRouterNoWait(t *testing.T, a proc.ServeArgs) *router {
	t.Helper()
	return startRouterUntil(t, a, func(r *router) bool {
		resp, err := http.Get(r.url + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return statusContains(r, strings.TrimPrefix(a.Backends[0], "http://"))
	})
}

// spawnRouter starts a router in cluster mode without waiting for it:
// launch's defaults, and gossip and Raft on free loopback ports, a 200 ms
// Raft timeout, a data directory of its own, and no engine metrics
// scrapes (the stub engines export none; a scrape would be held like a
// request and counted in their concurrency). a names the node.
func spawnRouter(t *testing.T, a proc.ServeArgs) *router {
	t.Helper()
	a.GossipListen = cmp.Or(a.GossipListen, freeAddr(t))
	a.RaftListen = cmp.Or(a.RaftListen, freeAddr(t))
	a.RaftTimeout = cmp.Or(a.RaftTimeout, 200*time.Millisecond)
	a.DataDir = cmp.Or(a.DataDir, t.TempDir())
	a.NoEngineMetrics = true
	return launch(t, a)
}

// portTaken reports whether the router exited because a port freeAddr
// chose was taken meanwhile (other tests on the machine bind ports too;
// gossip also needs the UDP port that freeAddr did not check).
func (r *router) portTaken() bool {
	return r.Exited() && strings.Contains(r.Logs(), "address already in use")
}

// statusContains reports whether the router's /status mentions s.
func statusContains(r *router, s string) bool {
	resp, err := http.Get(r.admin + "/status")
	if err != nil {
		return false
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return strings.Contains(string(b), s)
}

// alive fails the test if the router process has exited or does not
// answer /healthz.
func alive(t *testing.T, r *router) {
	t.Helper()
	if err := r.Alive(); err != nil {
		t.Fatalf("the router died: %v", err)
	}
	resp, err := http.Get(r.url + "/healthz")
	if err != nil {
		t.Fatalf("the router does not answer: %v\n%s", err, r.Logs())
	}
	resp.Body.Close()
}

// procStatus reads a field of /proc/<pid>/status in KiB (VmRSS, VmHWM),
// and skips the test where there is no /proc.
func procStatus(t *testing.T, pid int, field string) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Skip("no /proc:", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb
		}
	}
	t.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}

// gpusimModel is the model gpusim serves by default.
const gpusimModel = "meta-llama/Llama-3.1-70B-Instruct"

// gpusimURL finds the first instance's URL in gpusim's output.
var gpusimURL = regexp.MustCompile(`at (http://\S+)\n`)

// startGpusim runs `warmroute gpusim` on a free loopback port, fast (time
// scale 0.01), with extra flags, and returns its base URL. It is stopped
// at the end of the test.
func startGpusim(t *testing.T, extra ...string) string {
	t.Helper()
	a := proc.GpusimArgs{Listen: "127.0.0.1:0", TimeScale: 0.01, Extra: extra}
	p, err := proc.Start(proc.Spec{Name: "gpusim", Path: binPath, Args: a.Args()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Stop(10 * time.Second) })
	var url string
	if err := p.WaitReady(context.Background(), 15*time.Second, func(context.Context) error {
		m := gpusimURL.FindStringSubmatch(p.Logs())
		if m == nil {
			return errors.New("no address printed yet")
		}
		url = m[1]
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return url
}

// pollUntil is testkit.Poll (every 2 ms until limit; the time returned is
// measured after the answer that satisfied cond) that also gives up at
// once when cond's error says that a router it polls has exited
// (r.Alive()).
func pollUntil(limit time.Duration, cond func() (bool, error)) (time.Duration, error) {
	return testkit.Poll(limit, func() (bool, error) {
		ok, err := cond()
		if errors.Is(err, proc.ErrExited) {
			err = fmt.Errorf("%w: %w", testkit.ErrGiveUp, err)
		}
		return ok, err
	})
}
