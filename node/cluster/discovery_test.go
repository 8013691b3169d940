package cluster

import (
	"context"
	"errors"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/warmroute/warmroute/internal/testkit"
)

// fakeResolver answers from a table the test changes.
type fakeResolver struct {
	mu    sync.Mutex
	hosts []string
	srv   []*net.SRV
	err   error
}

func (r *fakeResolver) set(hosts ...string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.hosts, r.err = hosts, nil
}

func (r *fakeResolver) fail(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.err = err
}

func (r *fakeResolver) LookupHost(ctx context.Context, host string) ([]string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.hosts), r.err
}

func (r *fakeResolver) LookupSRV(ctx context.Context, service, proto, name string) (string, []*net.SRV, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return name, slices.Clone(r.srv), r.err
}

func ids(bs []Backend) string {
	var out []string
	for _, b := range bs {
		out = append(out, b.ID)
	}
	return strings.Join(out, " ")
}

func TestSyncedDiscoveredHysteresis(t *testing.T) {
	cur := []Backend{
		{ID: "cfg/", Source: SourceConfig},
		{ID: "10.0.0.1:80", URL: "http://10.0.0.1:80", Source: SourceDNS, State: StateDown, StateBy: ByHealth},
		{ID: "10.0.0.2:80", URL: "http://10.0.0.2:80", Source: SourceDNS},
	}
	found := []Backend{{ID: "10.0.0.1:80", URL: "http://10.0.0.1:80", Source: SourceDNS}}
	missing := map[string]int{}
	// First poll without .2: nothing to commit yet.
	if want := syncedDiscovered(cur, found, missing); want != nil {
		t.Fatalf("first miss committed %v", ids(want))
	}
	// Second poll without .2: removed.
	want := syncedDiscovered(cur, found, missing)
	if ids(want) != "10.0.0.1:80" {
		t.Fatalf("second miss: %q", ids(want))
	}
	// A new address is committed at once, with the missing one kept for now.
	cur = cur[:2]
	found = append(found, Backend{ID: "10.0.0.3:80", URL: "http://10.0.0.3:80", Source: SourceDNS})
	if want := syncedDiscovered(cur, found, missing); ids(want) != "10.0.0.1:80 10.0.0.3:80" {
		t.Fatalf("new address: %q", ids(want))
	}
	// An address back before the second miss resets its count.
	missing = map[string]int{}
	cur = []Backend{{ID: "a:1", URL: "http://a:1", Source: SourceDNS}}
	if syncedDiscovered(cur, nil, missing) != nil || missing["a:1"] != 1 {
		t.Fatalf("missing = %v", missing)
	}
	if syncedDiscovered(cur, []Backend{{ID: "a:1", URL: "http://a:1", Source: SourceDNS}}, missing) != nil || len(missing) != 0 {
		t.Fatalf("missing after return = %v", missing)
	}
}

func TestLookupForms(t *testing.T) {
	r := &fakeResolver{}
	r.set("10.0.0.2", "10.0.0.1", "10.0.0.1", "fd00::1")
	d := DiscoveryConfig{Name: "vllm.default.svc", Port: 8000, Scheme: "http", Zone: "z1", Timeout: time.Second, Resolver: r}
	got, err := d.lookup(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if ids(got) != "10.0.0.1:8000 10.0.0.2:8000 [fd00::1]:8000" || got[2].URL != "http://[fd00::1]:8000" || got[0].Zone != "z1" {
		t.Fatalf("A lookup: %+v", got)
	}
	r.srv = []*net.SRV{{Target: "pod-1.vllm.default.svc.", Port: 8001}, {Target: "pod-0.vllm.default.svc.", Port: 8001}, {Target: ".", Port: 0}}
	d.Name = "_http._tcp.vllm.default.svc"
	got, err = d.lookup(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if ids(got) != "pod-0.vllm.default.svc:8001 pod-1.vllm.default.svc:8001" {
		t.Fatalf("SRV lookup: %+v", got)
	}
	r.fail(&net.DNSError{Err: "no such host", Name: d.Name, IsNotFound: true})
	if got, err := d.lookup(context.Background()); err != nil || len(got) != 0 {
		t.Fatalf("NXDOMAIN: %v %v", got, err)
	}
	r.fail(&net.DNSError{Err: "server misbehaving", Name: d.Name, IsTemporary: true})
	if _, err := d.lookup(context.Background()); err == nil {
		t.Fatal("a failed lookup must be an error, not an empty answer")
	}
}

// TestLookupRealResolver runs discovery's lookups through net.Resolver
// against a DNS server on 127.0.0.1.
func TestLookupRealResolver(t *testing.T) {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	mux := dns.NewServeMux()
	mux.HandleFunc("vllm.test.", func(w dns.ResponseWriter, q *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(q)
		if q.Question[0].Qtype == dns.TypeA {
			for _, ip := range []string{"127.0.0.11", "127.0.0.12"} {
				rr, _ := dns.NewRR("vllm.test. 5 IN A " + ip)
				m.Answer = append(m.Answer, rr)
			}
		}
		_ = w.WriteMsg(m)
	})
	mux.HandleFunc("_http._tcp.vllm.test.", func(w dns.ResponseWriter, q *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(q)
		rr, _ := dns.NewRR("_http._tcp.vllm.test. 5 IN SRV 0 0 8001 pod-0.vllm.test.")
		m.Answer = append(m.Answer, rr)
		_ = w.WriteMsg(m)
	})
	srv := &dns.Server{PacketConn: pc, Handler: mux}
	started := make(chan struct{})
	srv.NotifyStartedFunc = func() { close(started) }
	go func() { _ = srv.ActivateAndServe() }()
	<-started
	defer func() { _ = srv.Shutdown() }()

	res := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, address string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "udp", pc.LocalAddr().String())
	}}
	d := DiscoveryConfig{Name: "vllm.test.", Port: 8000, Scheme: "http", Timeout: 5 * time.Second, Resolver: res}
	got, err := d.lookup(context.Background())
	if err != nil || ids(got) != "127.0.0.11:8000 127.0.0.12:8000" {
		t.Fatalf("A via DNS: %v %v", ids(got), err)
	}
	d.Name = "_http._tcp.vllm.test."
	got, err = d.lookup(context.Background())
	if err != nil || ids(got) != "pod-0.vllm.test:8001" {
		t.Fatalf("SRV via DNS: %v %v", ids(got), err)
	}
}

func TestDiscoveryOnLeader(t *testing.T) {
	r := &fakeResolver{}
	r.set("10.1.0.1", "10.1.0.2")
	_, nodes := startFormed(t, true, []string{"a", "b", "c"}, 3, func(c *Config) {
		c.Discovery = DiscoveryConfig{Name: "vllm.svc", Port: 8000, Scheme: "http", Interval: 20 * time.Millisecond, Timeout: time.Second, Resolver: r}
	})
	hasIDs := func(want string) func() bool {
		return func() bool {
			st, _ := leader(t, nodes).c.State()
			return ids(st.Backends) == want
		}
	}
	testkit.WaitFor(t, 10*time.Second, "discovered backends", hasIDs("10.1.0.1:8000 10.1.0.2:8000 gpu-a/ gpu-b/"))
	st, e := agreed(t, nodes, 1, false)
	if b, _ := st.Backend("10.1.0.1:8000"); b.Source != SourceDNS || b.URL != "http://10.1.0.1:8000" || b.State != StateActive {
		t.Fatalf("discovered backend: %+v", b)
	}
	// A failing DNS server removes nothing.
	r.fail(errors.New("dns down"))
	polls := func() float64 {
		l := leader(t, nodes)
		return counterValue(l.c.met.discoveryPolls.WithLabelValues("error"))
	}
	p0 := polls()
	testkit.WaitFor(t, 10*time.Second, "failed polls", func() bool { return polls() >= p0+3 })
	if _, e2 := leader(t, nodes).c.State(); e2 != e {
		t.Fatal("a failed lookup changed the state")
	}
	// One address goes away: removed (after two polls); config backends
	// stay.
	r.set("10.1.0.2", "10.1.0.3")
	testkit.WaitFor(t, 10*time.Second, "discovery follows DNS", hasIDs("10.1.0.2:8000 10.1.0.3:8000 gpu-a/ gpu-b/"))
	r.set()
	testkit.WaitFor(t, 10*time.Second, "empty DNS answer removes only discovered backends", hasIDs("gpu-a/ gpu-b/"))
}
