package gossip

import (
	"crypto/x509"
	"fmt"
	"log/slog"
	"net"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warmroute/warmroute/internal/identity"
	"github.com/warmroute/warmroute/internal/testkit"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// memberlist does not wait for its probe goroutines on Shutdown; one
	// may still wait for a fallback TCP ping to time out.
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/hashicorp/memberlist.(*Memberlist).probeNode"))
}

// testConfig is a loopback Config on a free port. WARMROUTE_TEST_LOG=1
// prints the clusters' logs (=warn: warnings and errors only).
func testConfig(name string) Config {
	cfg := DefaultConfig()
	cfg.NodeName = name
	cfg.BindAddr = "127.0.0.1"
	cfg.BindPort = 0
	switch os.Getenv("WARMROUTE_TEST_LOG") {
	case "":
	case "warn":
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	default:
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return cfg
}

type testNode struct {
	c   *Mesh
	src *fakeSource
}

// startNodes starts n nodes, each joining the first, and waits until every
// node sees all n members.
func startNodes(t *testing.T, n int, mod func(*Config)) []*testNode {
	t.Helper()
	nodes := make([]*testNode, 0, n)
	for i := range n {
		nodes = append(nodes, startNode(t, fmt.Sprintf("node-%c", 'a'+i), nodes, mod))
	}
	waitMembers(t, nodes, n)
	return nodes
}

func startNode(t *testing.T, name string, seeds []*testNode, mod func(*Config)) *testNode {
	t.Helper()
	cfg := testConfig(name)
	if len(seeds) > 0 {
		cfg.Join = []string{seeds[0].c.Addr()}
	}
	if mod != nil {
		mod(&cfg)
	}
	src := newFakeSource()
	c, err := New(cfg, src)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return &testNode{c: c, src: src}
}

func waitMembers(t *testing.T, nodes []*testNode, n int) {
	t.Helper()
	waitFor(t, 20*time.Second, func() bool {
		for _, nd := range nodes {
			if len(nd.c.View().members) != n {
				return false
			}
		}
		return true
	}, "every node sees %d members", n)
}

// waitFor is testkit.WaitFor naming what it waits for with format and args.
func waitFor(t testing.TB, d time.Duration, cond func() bool, format string, args ...any) {
	t.Helper()
	testkit.WaitFor(t, d, fmt.Sprintf(format, args...), cond)
}

func percentile(d []time.Duration, p float64) time.Duration {
	s := slices.Clone(d)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[min(len(s)-1, int(p*float64(len(s))))]
}

// fakeSource is a LocalSource tests can change while a Mesh reads it.
type fakeSource struct {
	mu   sync.Mutex
	m    map[string]int64
	fail map[string]bool
}

func newFakeSource() *fakeSource { return &fakeSource{m: map[string]int64{}, fail: map[string]bool{}} }

func (f *fakeSource) AppendInFlight(dst []BackendLoad) []BackendLoad {
	f.mu.Lock()
	defer f.mu.Unlock()
	for k, v := range f.m {
		dst = append(dst, BackendLoad{Backend: k, InFlight: v, Failing: f.fail[k]})
	}
	return dst
}

// setFailing sets backend's figure and this node's verdict on it.
func (f *fakeSource) setFailing(backend string, v int64, failing bool) {
	f.mu.Lock()
	f.m[backend] = v
	f.fail[backend] = failing
	f.mu.Unlock()
}

func (f *fakeSource) set(backend string, v int64) {
	f.mu.Lock()
	f.m[backend] = v
	f.mu.Unlock()
}

func (f *fakeSource) remove(backend string) {
	f.mu.Lock()
	delete(f.m, backend)
	f.mu.Unlock()
}

// remoteBackends returns, sorted, the backends that have remote figures.
func (v *View) remoteBackends() []string {
	out := make([]string, 0, len(v.index))
	for k := range v.index {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// waitResendsDone waits until no node has a changed figure left to
// resend: until the next change, only refreshes send figures.
func waitResendsDone(t *testing.T, nodes []*testNode) {
	t.Helper()
	waitFor(t, 10*time.Second, func() bool {
		for _, nd := range nodes {
			if nd.c.pub.resending() {
				return false
			}
		}
		return true
	}, "the resend window passes")
}

// resending reports whether the next tick sends a figure because it
// changed (fewer than resend ticks before that tick), refresh aside.
func (p *publisher) resending() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	next := p.tick + 1
	for _, e := range p.loads {
		if next < e.changed+p.resend {
			return true
		}
	}
	for _, e := range p.engines {
		if next < e.changed+p.resend {
			return true
		}
	}
	return false
}

// joinFailures counts the failed joins a node logged to logs (its
// Logger is logs.debugLogger(): the first failures are logged at debug).
func joinFailures(logs *syncBuffer) int {
	return strings.Count(logs.String(), "gossip join failed")
}

// testCA issues router identities signed by one cluster CA.
type testCA struct {
	ca   *identity.CA
	pool *x509.CertPool
}

func newTestCA(t testing.TB) *testCA {
	t.Helper()
	ca, err := identity.NewCA("test cluster CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	return &testCA{ca: ca, pool: pool}
}

// bundle issues a certificate for router name.
func (ca *testCA) bundle(t testing.TB, name string) *identity.Bundle {
	t.Helper()
	return ca.bundleFor(t, name, time.Hour)
}

func (ca *testCA) bundleFor(t testing.TB, name string, validity time.Duration) *identity.Bundle {
	t.Helper()
	b, err := ca.ca.Bundle(identity.Request{Name: name, Validity: validity})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// signer issues a certificate for router name and returns a signer for
// it, with the certificate.
func (ca *testCA) signer(t testing.TB, name string) (*signer, *identity.Bundle) {
	t.Helper()
	id := ca.bundle(t, name)
	s, err := newSigner(id, name)
	if err != nil {
		t.Fatal(err)
	}
	return s, id
}

// testKey is the gossip key of the test clusters.
var testKey = []byte("0123456789abcdef")

// checkSums verifies the incremental per-backend sums against the figures
// held per node.
func checkSums(t *testing.T, s *state) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	want := map[string]int64{}
	count := map[string]int{}
	for _, n := range s.nodes {
		for k, e := range n.loads {
			want[k] += e.v
			count[k]++
		}
	}
	if len(want) != len(s.sums) {
		t.Fatalf("sums has %d backends, nodes hold %d", len(s.sums), len(want))
	}
	for k, a := range s.sums {
		if a.sum != want[k] || a.n != count[k] {
			t.Fatalf("backend %q: sum %d/%d, nodes hold %d/%d", k, a.sum, a.n, want[k], count[k])
		}
	}
}

// publishMsg is a publish of loads, with no health section.
func publishMsg(origin string, instance, seq uint64, loads map[string]int64) []byte {
	return healthMsg(origin, instance, seq, loads)
}

func byeMsg(origin string, instance, seq uint64) []byte {
	return appendBlock(appendHeader(nil, kindBye), appendBlockHead(nil, origin, instance, seq))
}

// selfState is the state of node "self" (figures live 1 s, engine
// metrics 5 s) with members joined.
func selfState(members ...string) *state {
	s := newState("self", time.Second, 5*time.Second)
	for _, m := range members {
		s.join(m)
	}
	return s
}

func mustHandle(t *testing.T, s *state, b []byte, now time.Time) {
	t.Helper()
	if _, err := s.handle(b, now); err != nil {
		t.Fatal(err)
	}
}

func remote(s *state, backend string) int64 {
	v := s.build(nil)
	return v.RemoteInFlight(backend)
}

// wantRemote fails the test unless the remote figure for backend is want;
// when says when (empty: nothing to say).
func wantRemote(t *testing.T, s *state, backend string, want int64, when string) {
	t.Helper()
	if got := remote(s, backend); got != want {
		if when != "" {
			when = " " + when
		}
		t.Fatalf("%s = %d%s, want %d", backend, got, when, want)
	}
}

// healthMsg is a publish with loads and a tagHealth section marking
// failing (none when failing is empty); the health section comes first,
// which receivers must accept.
func healthMsg(origin string, instance, seq uint64, loads map[string]int64, failing ...string) []byte {
	var sec, hs []byte
	for k, v := range loads {
		sec = appendLoad(sec, k, v)
	}
	for _, f := range failing {
		hs = appendHealth(hs, f, healthFailing)
	}
	body := appendBlockHead(nil, origin, instance, seq)
	body = appendSection(body, tagHealth, hs)
	body = appendSection(body, tagLoads, sec)
	return appendBlock(appendHeader(nil, kindPublish), body)
}

// staticSource is a LocalSource with fixed figures (not safe for
// concurrent use; see fakeSource for that).
type staticSource []BackendLoad

func (s staticSource) AppendInFlight(dst []BackendLoad) []BackendLoad { return append(dst, s...) }

// checkHealth builds a View and checks its health lists against the
// figures held per node: for every backend any node has a figure for,
// every voting node is listed exactly once, as failing when its figure
// says so and healthy otherwise, and no other node is listed.
func checkHealth(t *testing.T, s *state) {
	t.Helper()
	s.healthDirty = true
	v := s.build(nil)
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, n := range s.nodes {
		for k := range n.loads {
			h := v.Health(k)
			for name, m := range s.nodes {
				e := m.loads[k]
				failing := e != nil && e.failing
				inF, inH := slices.Contains(h.Failing, name), slices.Contains(h.Healthy, name)
				switch {
				case !m.voting && (inF || inH):
					t.Fatalf("node %s does not vote but is listed for %s: %+v", name, k, h)
				case m.voting && (inF == inH || inF != failing):
					t.Fatalf("node %s (failing %v) listed wrongly for %s: %+v", name, failing, k, h)
				}
			}
		}
	}
}

// freeLoopbackPort returns a port that was free for TCP and UDP on host.
func freeLoopbackPort(t *testing.T, host string) int {
	t.Helper()
	for range 20 {
		l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
		if err != nil {
			t.Fatal(err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		u, err := net.ListenPacket("udp", net.JoinHostPort(host, strconv.Itoa(port)))
		l.Close()
		if err == nil {
			u.Close()
			return port
		}
	}
	t.Fatal("no free port")
	return 0
}

// syncBuffer is a testkit.Buffer with loggers that write to it.
type syncBuffer struct{ testkit.Buffer }

// debugLogger returns a logger that writes every record to s.
func (s *syncBuffer) debugLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(s, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// warnLogger returns a logger that writes warnings and errors to s.
func (s *syncBuffer) warnLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(s, &slog.HandlerOptions{Level: slog.LevelWarn}))
}
