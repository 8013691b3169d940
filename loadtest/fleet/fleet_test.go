package fleet

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warmroute/warmroute/internal/testkit"
	"github.com/warmroute/warmroute/loadtest"
	"github.com/warmroute/warmroute/loadtest/gpusim"
	"github.com/warmroute/warmroute/loadtest/internal/fakefleet"
	"github.com/warmroute/warmroute/loadtest/proc"
	"github.com/warmroute/warmroute/loadtest/workload"
	"github.com/warmroute/warmroute/ring"
)

// The test binary doubles as the children (see fakefleet).
func TestMain(m *testing.M) { fakefleet.TestMain(m) }

func testConfig(t *testing.T, mode string) Config {
	t.Helper()
	c := DefaultConfig()
	c.Exe = os.Args[0]
	c.Env = []string{fakefleet.Env + "=" + mode}
	c.Instances = 3
	c.Routers = 0
	c.LogDir = t.TempDir()
	c.StartTimeout = 30 * time.Second
	c.StopTimeout = 2 * time.Second
	return c
}

// alive reports whether pid exists and is not a zombie.
func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// the state follows the parenthesised command name
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}

// pidsInLogs returns the pids the children printed.
func pidsInLogs(t *testing.T, dir string) []int {
	t.Helper()
	var pids []int
	files, _ := filepath.Glob(filepath.Join(dir, "*.log"))
	re := regexp.MustCompile(`(?m)^pid (\d+)$`)
	for _, f := range files {
		b, _ := os.ReadFile(f)
		for _, m := range re.FindAllStringSubmatch(string(b), -1) {
			n, _ := strconv.Atoi(m[1])
			pids = append(pids, n)
		}
	}
	return pids
}

func requireGone(t *testing.T, pids ...int) {
	t.Helper()
	if len(pids) == 0 {
		t.Fatal("no pids to check")
	}
	for _, p := range pids {
		testkit.WaitFor(t, 20*time.Second, fmt.Sprintf("process %d outlived the fleet", p), func() bool { return !alive(p) })
	}
}

func TestDirectFleet(t *testing.T) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("needs /proc")
	}
	cfg := testConfig(t, "ok")
	f, err := Start(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(f.BackendURLs()) != 3 || len(f.Routers()) != 0 {
		t.Fatalf("backends %v routers %v", f.BackendURLs(), f.Routers())
	}
	if strings.Join(f.Targets(), ",") != strings.Join(f.BackendURLs(), ",") {
		t.Fatal("without routers the targets are the instances")
	}
	// consecutive ports
	for i, id := range f.BackendIDs() {
		_, p0, _ := strings.Cut(f.BackendIDs()[0], ":")
		_, pi, _ := strings.Cut(id, ":")
		a, _ := strconv.Atoi(p0)
		b, _ := strconv.Atoi(pi)
		if b != a+i {
			t.Fatalf("instance ports not consecutive: %v", f.BackendIDs())
		}
	}
	for _, u := range f.MetricsURLs() {
		resp, err := http.Get(u)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("%s: %d", u, resp.StatusCode)
		}
	}
	pids := pidsInLogs(t, cfg.LogDir)
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal("second Close:", err)
	}
	requireGone(t, pids...)
}

func TestRoutersAndLoad(t *testing.T) {
	cfg := testConfig(t, "ok")
	cfg.Routers = 2
	cfg.Strategy = "ROUND_ROBIN"
	var mu sync.Mutex
	hooked := map[int]int{}
	cfg.RouterArgs = func(i int, rs []Router, a *proc.ServeArgs) error {
		mu.Lock()
		hooked[i] = len(rs)
		mu.Unlock()
		if a.Listen != strings.TrimPrefix(rs[i].URL, "http://") || a.Strategy != "ROUND_ROBIN" || len(a.Backends) != 3 {
			return fmt.Errorf("router %d starts from %+v", i, a)
		}
		urls := make([]string, len(rs))
		for j, r := range rs {
			urls[j] = r.URL
		}
		a.Extra = []string{"--peers", strings.Join(urls, ",")}
		return nil
	}
	f, err := Start(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if len(hooked) != 2 || hooked[0] != 2 || hooked[1] != 2 {
		t.Fatalf("router hook calls %v", hooked)
	}
	if len(f.Targets()) != 2 || f.Targets()[0] == f.Targets()[1] {
		t.Fatalf("targets %v", f.Targets())
	}
	w := workload.DefaultConfig()
	w.Model = gpusim.DefaultConfig().Model
	w.MaxTokens = 4
	w.RAG.DocumentTokens = 200
	gen, err := workload.New(w)
	if err != nil {
		t.Fatal(err)
	}
	lc := loadtest.DefaultConfig()
	lc.Targets = f.Targets()
	lc.MetricsURLs = f.MetricsURLs()
	lc.Backends = f.BackendIDs()
	lc.Mode = loadtest.ClosedLoop
	lc.Concurrency = 3
	lc.Requests = 30
	s, err := loadtest.Run(context.Background(), lc, gen)
	if err != nil {
		t.Fatal(err)
	}
	if s.OK != 30 || s.Decisions["round_robin"] != 30 || len(s.Backends) != 3 || s.ShareMaxMin == 0 {
		t.Fatalf("ok %d decisions %v backends %v ratio %g", s.OK, s.Decisions, s.Backends, s.ShareMaxMin)
	}
	// The routers name the instances by position, not by port, so every
	// fleet places keys alike.
	if got := strings.Join(f.BackendIDs(), ","); got != "gpu-0,gpu-1,gpu-2" {
		t.Fatalf("backend ids %s", got)
	}
	for _, id := range f.BackendIDs() {
		if s.Backends[id] == 0 {
			t.Fatalf("backend %s got nothing: %v", id, s.Backends)
		}
	}
	if s.KV == nil || s.KV.QueriedTokens == 0 {
		t.Fatalf("kv %+v", s.KV)
	}
}

func TestCloseStopsStubbornChildrenAndGrandchildren(t *testing.T) {
	for _, mode := range []string{"ignore-term", "grandchild"} {
		t.Run(mode, func(t *testing.T) {
			cfg := testConfig(t, mode)
			cfg.Instances = 1
			pidFile := filepath.Join(t.TempDir(), "grandchild.pid")
			cfg.Env = append(cfg.Env, fakefleet.GrandchildPIDFile+"="+pidFile)
			cfg.StopTimeout = 300 * time.Millisecond
			f, err := Start(context.Background(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			pids := pidsInLogs(t, cfg.LogDir)
			if mode == "grandchild" {
				var b []byte
				testkit.WaitFor(t, 20*time.Second, "the grandchild's pid file", func() bool {
					b, err = os.ReadFile(pidFile)
					return err == nil && len(b) > 0
				})
				n, err := strconv.Atoi(string(b))
				if err != nil {
					t.Fatalf("grandchild pid %q: %v", b, err)
				}
				if !alive(n) {
					t.Fatal("grandchild not running")
				}
				pids = append(pids, n)
			}
			start := time.Now()
			if err := f.Close(); err != nil {
				t.Fatal(err)
			}
			if d := time.Since(start); d > 10*time.Second {
				t.Fatalf("Close took %v", d)
			}
			requireGone(t, pids...)
		})
	}
}

func TestChildExitIsReported(t *testing.T) {
	cfg := testConfig(t, "fail")
	_, err := Start(context.Background(), cfg)
	if !errors.Is(err, ErrExited) || !strings.Contains(err.Error(), "flag provided but not defined") {
		t.Fatalf("error %v, want ErrExited with the child's log", err)
	}
}

func TestNeverReadyRouterCleansUp(t *testing.T) {
	cfg := testConfig(t, "never-ready")
	cfg.Routers = 1
	cfg.StartTimeout = 2 * time.Second
	_, err := Start(context.Background(), cfg)
	if !errors.Is(err, ErrNotReady) {
		t.Fatalf("error %v, want ErrNotReady", err)
	}
	pids := pidsInLogs(t, cfg.LogDir)
	if len(pids) != 2 {
		t.Fatalf("pids %v, want gpusim and router", pids)
	}
	requireGone(t, pids...)
}

func TestCancelledStart(t *testing.T) {
	cfg := testConfig(t, "never-ready")
	cfg.Routers = 1
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		// cancel once the router has started
		_, _ = proc.Poll(ctx, 20*time.Second, 20*time.Millisecond, func() (bool, error) {
			return len(pidsInLogs(t, cfg.LogDir)) == 2, nil
		})
		cancel()
	}()
	start := time.Now()
	_, err := Start(ctx, cfg)
	if err == nil {
		t.Fatal("cancelled start succeeded")
	}
	if time.Since(start) > 25*time.Second {
		t.Fatal("cancel did not stop the start")
	}
	requireGone(t, pidsInLogs(t, cfg.LogDir)...)
}

func TestValidate(t *testing.T) {
	for i, mut := range []func(*Config){
		func(c *Config) { c.Instances = 0 },
		func(c *Config) { c.Routers = -1 },
		func(c *Config) { c.Strategy = "FASTEST" },
		func(c *Config) { c.PrefixLength = 0 },
		func(c *Config) { c.StartTimeout = 0 },
	} {
		c := DefaultConfig()
		mut(&c)
		if err := c.Validate(); !errors.Is(err, ErrBadConfig) {
			t.Errorf("case %d: %v", i, err)
		}
	}
	c := DefaultConfig()
	c.Routers, c.Strategy = 0, ""
	if err := c.Validate(); err != nil {
		t.Fatalf("no routers needs no strategy: %v", err)
	}
}

// TestStrategiesFromRing walks ring's strategy table: every strategy is in
// Strategies, once, and a fleet validates with it; PrefixAwareFixed comes
// just before PREFIX_AWARE; the list goes from the strategies that know
// least to those that know most, and keeps the order the comparisons
// have always shown.
func TestStrategiesFromRing(t *testing.T) {
	got := Strategies()
	table := ring.Strategies()
	if len(got) != len(table)+1 {
		t.Fatalf("Strategies() = %v for the %d strategies of ring's table and %s", got, len(table), PrefixAwareFixed)
	}
	knows := map[string]int{}
	for _, info := range table {
		if n := len(got) - len(slices.DeleteFunc(slices.Clone(got), func(s string) bool { return s == info.Name })); n != 1 {
			t.Errorf("%s appears %d times in %v", info.Name, n, got)
		}
		c := DefaultConfig()
		c.Strategy = info.Name
		if err := c.Validate(); err != nil {
			t.Errorf("%s: %v", info.Name, err)
		}
		knows[info.Name] = 2*boolInt(info.Key) + boolInt(info.Load)
	}
	fixed := slices.Index(got, PrefixAwareFixed)
	if fixed < 0 || fixed+1 >= len(got) || got[fixed+1] != ring.PrefixAware.String() {
		t.Errorf("%s is not just before %s in %v", PrefixAwareFixed, ring.PrefixAware, got)
	}
	knows[PrefixAwareFixed] = knows[ring.PrefixAware.String()]
	for i := 1; i < len(got); i++ {
		if knows[got[i-1]] > knows[got[i]] {
			t.Errorf("%s knows more than %s after it: %v", got[i-1], got[i], got)
		}
	}
	old := []string{"RANDOM", "ROUND_ROBIN", "LEAST_OUTSTANDING_REQUESTS", "CONSISTENT_HASH", PrefixAwareFixed, "PREFIX_AWARE"}
	if kept := slices.DeleteFunc(slices.Clone(got), func(s string) bool { return !slices.Contains(old, s) }); !slices.Equal(kept, old) {
		t.Errorf("the strategies compared so far come in the order %v, was %v", kept, old)
	}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
