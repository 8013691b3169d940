package admin

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/warmroute/warmroute/gossip"
	"github.com/warmroute/warmroute/internal/identity"
	"github.com/warmroute/warmroute/node/cluster"
	"github.com/warmroute/warmroute/proxy"
	"github.com/warmroute/warmroute/ring"
)

// fakeAgreement is a leader that applies commands to its state at once.
type fakeAgreement struct {
	mu    sync.Mutex
	st    cluster.State
	epoch uint64
	cmds  []cluster.Command
}

func (f *fakeAgreement) State() (cluster.State, uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.st.Clone(), f.epoch
}

func (f *fakeAgreement) Apply(_ context.Context, cmd cluster.Command) (uint64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.cmds = append(f.cmds, cmd)
	switch cmd.Op {
	case cluster.OpUpsertBackend:
		f.st.Backends = append(f.st.Backends, *cmd.Backend)
	case cluster.OpRemoveBackend:
		i := slices.IndexFunc(f.st.Backends, func(b cluster.Backend) bool { return b.ID == cmd.ID })
		if i < 0 {
			return 0, cluster.ErrUnknownBackend
		}
		f.st.Backends = slices.Delete(f.st.Backends, i, i+1)
	case cluster.OpSetRouting:
		f.st.Routing = *cmd.Routing
	case cluster.OpRevoke:
		f.st.RevokedNames = append(f.st.RevokedNames, cmd.Names...)
		f.st.RevokedSerials = append(f.st.RevokedSerials, cmd.Serials...)
	case cluster.OpUnrevoke:
		f.st.RevokedNames = slices.DeleteFunc(f.st.RevokedNames, func(n string) bool { return slices.Contains(cmd.Names, n) })
	}
	f.epoch++
	return f.epoch, nil
}

func (f *fakeAgreement) Leader() (string, string) { return "r0", "127.0.0.1:1" }
func (f *fakeAgreement) Status() cluster.Status {
	return cluster.Status{ID: "r0", RaftState: "Leader", LeaderID: "r0", Term: 3,
		Refused: []cluster.Refusal{{Name: "r9", Addr: "127.0.0.1:7009", Reason: "no certificate of the cluster CA"}}}
}
func (f *fakeAgreement) Halted() error { return nil }

// fakeRouter routes on a fixed ring at the agreement's epoch.
type fakeRouter struct {
	r *ring.Ring
	a *fakeAgreement
}

func (f fakeRouter) Ring() (*ring.Ring, uint64) { _, e := f.a.State(); return f.r, e }
func (f fakeRouter) Status() []proxy.BackendStatus {
	return []proxy.BackendStatus{{ID: "gpu-1", Addr: "http://127.0.0.1:9001", State: "active", Healthy: true, Limit: 16}}
}
func (f fakeRouter) Ready() bool          { return true }
func (f fakeRouter) Splits() []ring.Split { return nil }

func (f fakeRouter) ExplainSession(api ring.API, body, tenant, session []byte) (ring.KeyInfo, ring.Explanation, error) {
	return ring.KeyInfo{}, ring.Explanation{}, nil
}

func newTestServer(t *testing.T, token string) (*httptest.Server, *fakeAgreement) {
	t.Helper()
	r, err := ring.New(ring.DefaultConfig(), []ring.Backend{{ID: "gpu-1", Addr: "http://127.0.0.1:9001"}})
	if err != nil {
		t.Fatal(err)
	}
	a := &fakeAgreement{st: cluster.State{Seeded: true, Routing: ring.DefaultSettings(),
		Backends: []cluster.Backend{{ID: "gpu-1", URL: "http://127.0.0.1:9001", State: cluster.StateActive, Source: cluster.SourceConfig}}}, epoch: 4}
	s := New(Config{Name: "r0", Token: token, Metrics: prometheus.NewRegistry(), Agreement: a, Router: fakeRouter{r, a},
		ParseBackend: func(req BackendRequest) (cluster.Backend, error) {
			if !strings.HasPrefix(req.URL, "http://") {
				return cluster.Backend{}, errors.New("want an http:// URL")
			}
			id := req.ID
			if id == "" {
				id = strings.TrimPrefix(req.URL, "http://")
			}
			return cluster.Backend{ID: id, URL: req.URL, State: req.State}, nil
		}})
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)
	return srv, a
}

// TestClient: the typed client reads and writes every document the
// server serves, and an error the API answers arrives as an *APIError.
func TestClient(t *testing.T) {
	srv, a := newTestServer(t, "tok")
	ctx := context.Background()
	c, err := NewClient(srv.URL, "tok", nil, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	st, err := c.Status(ctx)
	if err != nil || st.Node != "r0" || st.Epoch != 4 || st.Routing.PrefixLength != 4096 || len(st.Backends) != 1 || st.Raft.Term != 3 {
		t.Fatalf("Status: %+v %v", st, err)
	}
	cl, err := c.Cluster(ctx)
	if err != nil || cl.Leader != "r0" || cl.Raft.RaftState != "Leader" {
		t.Fatalf("Cluster: %+v %v", cl, err)
	}
	w, err := c.AddBackend(ctx, BackendRequest{URL: "http://127.0.0.1:9002", ID: "gpu-2"})
	if err != nil || w.Epoch != 5 || w.Node != "r0" {
		t.Fatalf("AddBackend: %+v %v", w, err)
	}
	list, err := c.Backends(ctx)
	if err != nil || len(list.Backends) != 2 || list.Backends[0].Live == nil || list.Backends[0].Live.Limit != 16 {
		t.Fatalf("Backends: %+v %v", list, err)
	}
	if d, err := c.Backend(ctx, "gpu-2"); err != nil || d.Backend.URL != "http://127.0.0.1:9002" {
		t.Fatalf("Backend: %+v %v", d, err)
	}
	if _, err := c.SetBackendState(ctx, "gpu-2", ActionDrain); err != nil {
		t.Fatalf("SetBackendState: %v", err)
	}
	if _, err := c.PatchConfig(ctx, map[string]any{"prefix_length": 8192, "RoutingStrategy": "random"}); err != nil {
		t.Fatalf("PatchConfig: %v", err)
	}
	cfg, err := c.Config(ctx)
	if err != nil || cfg.Routing.PrefixLength != 8192 || cfg.Routing.Strategy != ring.Random {
		t.Fatalf("Config: %+v %v", cfg, err)
	}
	if _, err := c.RemoveBackend(ctx, "gpu-2"); err != nil {
		t.Fatalf("RemoveBackend: %v", err)
	}
	if got := len(a.cmds); got != 4 {
		t.Fatalf("%d commands applied, want 4: %+v", got, a.cmds)
	}

	// Errors the API answers.
	var ae *APIError
	if _, err := c.RemoveBackend(ctx, "nope"); !errors.As(err, &ae) || ae.Status != 404 || ae.Code != "unknown_backend" {
		t.Fatalf("removing an unknown backend: %v", err)
	}
	if _, err := c.AddBackend(ctx, BackendRequest{URL: "ftp://x"}); !errors.As(err, &ae) || ae.Status != 400 || ae.Code != "invalid_backend" {
		t.Fatalf("an invalid backend: %v", err)
	}
	if _, err := c.PatchConfig(ctx, map[string]any{"prefix_length": 10}); !errors.As(err, &ae) || ae.Code != "invalid_config" {
		t.Fatalf("an invalid config: %v", err)
	}
	noToken, _ := NewClient(srv.URL, "", nil, 5*time.Second)
	if _, err := noToken.AddBackend(ctx, BackendRequest{URL: "http://h:1"}); !errors.As(err, &ae) || ae.Status != 401 {
		t.Fatalf("a write without the token: %v", err)
	}
	if _, err := NewClient("ftp://x", "", nil, time.Second); err == nil {
		t.Fatal("an ftp admin URL was accepted")
	}
}

type recorder struct {
	header http.Header
	status int
}

func (r *recorder) Header() http.Header         { return r.header }
func (r *recorder) Write(b []byte) (int, error) { return len(b), nil }
func (r *recorder) WriteHeader(s int)           { r.status = s }

func TestAuthorize(t *testing.T) {
	s := New(Config{})
	req, _ := http.NewRequest("POST", "/v1/backends", strings.NewReader(`{"url":"http://h:1"}`))
	req.RemoteAddr = "10.1.2.3:5555"
	w := &recorder{header: http.Header{}}
	if s.authorize(w, req, true) || w.status != http.StatusForbidden {
		t.Fatalf("a remote write without a configured token was allowed (%d)", w.status)
	}
	req.RemoteAddr = "127.0.0.1:5555"
	if !s.authorize(&recorder{header: http.Header{}}, req, true) {
		t.Fatal("a loopback write without a configured token was refused")
	}
	s = New(Config{Token: "t"})
	req.RemoteAddr = "10.1.2.3:5555"
	w = &recorder{header: http.Header{}}
	if s.authorize(w, req, false) || w.status != http.StatusUnauthorized {
		t.Fatal("a remote read without the token was allowed while a token is configured")
	}
	req.Header.Set("Authorization", "Bearer t")
	if !s.authorize(&recorder{header: http.Header{}}, req, true) {
		t.Fatal("a remote write with the token was refused")
	}
	// Without identities a forwarded write is an ordinary one.
	req.Header.Set(headerForwarded, "r1")
	req.Header.Del("Authorization")
	w = &recorder{header: http.Header{}}
	if s.authorize(w, req, true) || w.status != http.StatusUnauthorized {
		t.Fatal("a forwarded write without the token was let in without identities")
	}
}

// testRouterCert issues a router certificate for name from ca.
func testRouterCert(t *testing.T, ca *identity.CA, name string) tls.Certificate {
	t.Helper()
	c, k, err := ca.Issue(identity.Request{Name: name, Validity: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	pair, err := tls.X509KeyPair(c, k)
	if err != nil {
		t.Fatal(err)
	}
	return pair
}

// TestForwardOnlyToTheLeader: the leader's admin address comes from
// gossip metadata, which a holder of the gossip key can write. A write
// forwarded there carries the operator's token, so it goes only to a
// server that proves the leader's name: another router's certificate, or
// another CA's, gets nothing.
func TestForwardOnlyToTheLeader(t *testing.T) {
	ca, err := identity.NewCA("cluster", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	id, err := identity.NewBundle(testRouterCert(t, ca, "router-0"), roots)
	if err != nil {
		t.Fatal(err)
	}
	s := New(Config{Name: "router-0", Identity: id})
	serve := func(ca *identity.CA, name string) (url string, got *atomic.Int32) {
		got = &atomic.Int32{}
		srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get("Authorization") != "" {
				got.Add(1)
			}
		}))
		srv.TLS = &tls.Config{Certificates: []tls.Certificate{testRouterCert(t, ca, name)}}
		srv.StartTLS()
		t.Cleanup(srv.Close)
		return srv.URL, got
	}
	send := func(leader, url string) error {
		req, _ := http.NewRequest("POST", url+"/v1/backends", strings.NewReader("{}"))
		req.Header.Set("Authorization", "Bearer operator-token")
		resp, err := s.forwardClient(leader).Do(req)
		if err == nil {
			resp.Body.Close()
		}
		return err
	}
	leaderURL, leaderGot := serve(ca, "router-1")
	if err := send("router-1", leaderURL); err != nil || leaderGot.Load() != 1 {
		t.Fatalf("forward to the leader: %v (received %d)", err, leaderGot.Load())
	}
	otherURL, otherGot := serve(ca, "router-2")
	if err := send("router-1", otherURL); err == nil || otherGot.Load() != 0 {
		t.Fatalf("forward to router-2 posing as the leader router-1: %v (received %d)", err, otherGot.Load())
	}
	other, err := identity.NewCA("other", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	foreignURL, foreignGot := serve(other, "router-1")
	if err := send("router-1", foreignURL); err == nil || foreignGot.Load() != 0 {
		t.Fatalf("forward to another CA's router-1: %v (received %d)", err, foreignGot.Load())
	}
}

// FuzzParseRoutingPatch: config patches never panic, and an accepted patch
// is valid settings.
func FuzzParseRoutingPatch(f *testing.F) {
	for _, s := range []string{
		`{"prefix_length":2048}`, `{"strategy":"round-robin","load_factor":1.5}`,
		`{"RoutingStrategy":"PREFIX_AWARE","PrefixLength":4096,"ConcurrencyThreshold":10}`,
		`{"prefix_length":"x"}`, `{"nope":1}`, `null`, `[]`, `{"zone_aware":true,"overflow_depth":3}`,
		`{"partition_count":-1}`, `{"load_factor":0.5}`, `{"PrefixLength":2048,"prefix_length":4096}`,
	} {
		f.Add([]byte(s), false)
		f.Add([]byte(s), true)
	}
	f.Fuzz(func(t *testing.T, body []byte, replace bool) {
		out, err := ParseRoutingPatch(ring.DefaultSettings(), body, replace)
		if err != nil {
			return
		}
		if err := out.Validate(); err != nil {
			t.Fatalf("accepted %q but the settings are invalid: %v", body, err)
		}
		if _, err := json.Marshal(out); err != nil {
			t.Fatal(err)
		}
	})
}

// fakeMembers is gossip's view: r0 (this router), r1, and r9 at the
// address the agreement's probes refuse, and r9's name at another.
type fakeMembers struct{}

func (fakeMembers) Members() []gossip.Member {
	return []gossip.Member{
		{Name: "r0", State: "alive", Self: true, Meta: gossip.Meta{RaftAddr: "127.0.0.1:7000"}},
		{Name: "r1", State: "alive", Meta: gossip.Meta{RaftAddr: "127.0.0.1:7001"}},
		{Name: "r9", State: "alive", Meta: gossip.Meta{RaftAddr: "127.0.0.1:7009"}},
	}
}
func (fakeMembers) Failing(string) []string { return nil }

// TestRefusedMembersAndRevocations: a member this router's probes refuse
// shows as refused, with the reason, in /v1/cluster and /status; the
// revocation list is read and changed through /v1/revocations (a write:
// it needs the token), and a body with unknown fields is refused.
func TestRefusedMembersAndRevocations(t *testing.T) {
	srv, a := newTestServer(t, "tok")
	s := New(Config{Name: "r0", Token: "tok", Metrics: prometheus.NewRegistry(), Agreement: a, Router: fakeRouter{nil, a}, Members: fakeMembers{}})
	cl := s.Cluster()
	for _, m := range cl.Members {
		want, reason := "alive", ""
		if m.Name == "r9" {
			want, reason = MemberRefused, "no certificate of the cluster CA"
		}
		if m.State != want || m.Reason != reason {
			t.Errorf("member %s: %q %q, want %q %q", m.Name, m.State, m.Reason, want, reason)
		}
	}

	ctx := context.Background()
	c, _ := NewClient(srv.URL, "tok", nil, 5*time.Second)
	if _, err := c.Revoke(ctx, RevocationRequest{Names: []string{"r2"}, Serials: []string{"ab"}}); err != nil {
		t.Fatal(err)
	}
	list, err := c.Revocations(ctx)
	if err != nil || !slices.Equal(list.Names, []string{"r2"}) || !slices.Equal(list.Serials, []string{"ab"}) {
		t.Fatalf("Revocations: %+v %v", list, err)
	}
	if _, err := c.Unrevoke(ctx, RevocationRequest{Names: []string{"r2"}}); err != nil {
		t.Fatal(err)
	}
	if list, err = c.Revocations(ctx); err != nil || len(list.Names) != 0 || list.Names == nil {
		t.Fatalf("after unrevoke: %+v %v", list, err)
	}
	if ops := []cluster.Op{a.cmds[0].Op, a.cmds[1].Op}; ops[0] != cluster.OpRevoke || ops[1] != cluster.OpUnrevoke {
		t.Fatalf("commands %v", ops)
	}
	noToken, _ := NewClient(srv.URL, "", nil, 5*time.Second)
	var ae *APIError
	if _, err := noToken.Revoke(ctx, RevocationRequest{Names: []string{"r1"}}); !errors.As(err, &ae) || ae.Status != 401 {
		t.Fatalf("a revocation without the token: %v", err)
	}
	req, _ := http.NewRequest("POST", srv.URL+"/v1/revocations", strings.NewReader(`{"name":["r1"]}`))
	req.Header.Set("Authorization", "Bearer tok")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 400 {
		t.Fatalf("a body with an unknown field: %d, want 400", resp.StatusCode)
	}
}
