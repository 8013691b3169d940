package proxy

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/warmroute/warmroute/ring"
)

// pickerProxy returns a proxy with n backends 10.0.0.i:8000 (never
// probed: the picker does not forward) on a PREFIX_AWARE ring at epoch 1.
func pickerProxy(t *testing.T, n int) *Proxy {
	t.Helper()
	cfg := DefaultConfig()
	cfg.ProbePath = ""
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var bs []ring.Backend
	for i := range n {
		addr := fmt.Sprintf("10.0.0.%d:8000", i+1)
		bs = append(bs, ring.Backend{ID: addr, Addr: "http://" + addr, State: ring.Active})
	}
	r, err := ring.New(ring.DefaultConfig(), bs)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.SetRing(r, 1); err != nil {
		t.Fatal(err)
	}
	return p
}

func inflightOf(p *Proxy, endpoint string) int64 {
	for _, l := range p.AppendInFlight(nil) {
		if l.Backend == endpoint {
			return l.InFlight
		}
	}
	return -1
}

func TestPickMatchesExplain(t *testing.T) {
	p := pickerProxy(t, 5)
	for i := range 50 {
		body := []byte(fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":"prompt %d"}]}`, i))
		_, ex, err := p.Explain(ring.Chat, body, nil)
		if err != nil {
			t.Fatal(err)
		}
		pk, err := p.Pick(&PickRequest{API: ring.Chat, Body: body, Fallbacks: 2})
		if err != nil {
			t.Fatal(err)
		}
		want := ex.Backend
		if got := pk.Endpoints(); len(got) != 3 || got[0] != want || len(slices.Compact(slices.Sorted(slices.Values(got)))) != 3 {
			t.Fatalf("prompt %d: endpoints %v, want %s first and three distinct", i, got, want)
		}
		pk.Release()
	}
}

func TestPickSubsetAndInFlight(t *testing.T) {
	p := pickerProxy(t, 4)
	body := []byte(`{"model":"m","messages":[{"role":"user","content":"hello"}]}`)
	pk, err := p.Pick(&PickRequest{API: ring.Chat, Body: body, Subset: []string{"10.0.0.3:8000", "10.0.0.4"}, Fallbacks: 3})
	if err != nil {
		t.Fatal(err)
	}
	eps := pk.Endpoints()
	for _, e := range eps {
		if e != "10.0.0.3:8000" && e != "10.0.0.4:8000" {
			t.Fatalf("endpoint %s outside the subset (all: %v)", e, eps)
		}
	}
	if len(eps) != 2 {
		t.Fatalf("endpoints %v: want both of the subset", eps)
	}
	if n := inflightOf(p, eps[0]); n != 1 {
		t.Fatalf("primary %s in flight %d, want 1", eps[0], n)
	}
	if !pk.Served(eps[1]) {
		t.Fatal("served report of a known endpoint refused")
	}
	if a, b := inflightOf(p, eps[0]), inflightOf(p, eps[1]); a != 0 || b != 1 {
		t.Fatalf("after the served report: primary %d, served %d, want 0 and 1", a, b)
	}
	pk.Release()
	pk.Release()
	if n := inflightOf(p, eps[1]); n != 0 {
		t.Fatalf("after release: %d in flight, want 0", n)
	}

	for _, subset := range [][]string{{}, {"10.9.9.9:8000"}, {"10.0.0.1:9999"}} {
		if _, err := p.Pick(&PickRequest{API: ring.Chat, Body: body, Subset: subset}); !errors.Is(err, ErrNoEndpoint) {
			t.Errorf("subset %q: err %v, want ErrNoEndpoint", subset, err)
		}
	}
	if _, err := p.Pick(&PickRequest{API: ring.Chat, Body: []byte(`{"messages":`)}); !errors.Is(err, ring.ErrMalformedJSON) {
		t.Errorf("broken body: err %v, want ErrMalformedJSON", err)
	}
}

func TestPickUsage(t *testing.T) {
	p := pickerProxy(t, 2)
	pk, err := p.Pick(&PickRequest{API: ring.Chat, Body: []byte(`{"messages":[{"role":"user","content":"x"}]}`)})
	if err != nil {
		t.Fatal(err)
	}
	pk.ResponseHeaders(200, []byte("text/event-stream"))
	pk.ResponseBody([]byte("data: {\"choices\":[]}\n\ndata: {\"usage\":{\"prompt_tokens\":100,\"prompt_to"))
	pk.ResponseBody([]byte("kens_details\":{\"cached_tokens\":60}}}\n\ndata: [DONE]\n\n"))
	served := pk.served
	pk.Release()
	if got := readCounter(t, served.m.usage.cached); got != 60 {
		t.Fatalf("cached tokens counted %v, want 60", got)
	}
	if got := readCounter(t, served.m.usage.prompt); got != 100 {
		t.Fatalf("prompt tokens counted %v, want 100", got)
	}
}

func TestBodyCharge(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxBodySize = 2 << 20
	cfg.MaxBodyMemory = 4 << 20
	cfg.BodyMemoryWait = 0
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	c := p.ChargeBody()
	if !c.Take(1<<20) || !c.Take(1<<20) {
		t.Fatal("2 MiB refused from a 4 MiB budget")
	}
	if used, large := p.bodies.held(); used != 2<<20 || large != 1<<20 {
		t.Fatalf("held %d (large %d), want 2 MiB (1 MiB large)", used, large)
	}
	if c.Take(1<<20 + 1) {
		t.Fatal("more large bytes than half the budget were charged")
	}
	c.Give()
	c.Give()
	if used, large := p.bodies.held(); used != 0 || large != 0 {
		t.Fatalf("after Give: held %d (large %d), want 0", used, large)
	}
}

func readCounter(t *testing.T, c interface{ Write(*dto.Metric) error }) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// BenchmarkPick is the decision alone: key, pick, hold, two fallbacks,
// release (a 4 KiB chat body, eight backends).
func BenchmarkPick(b *testing.B) {
	cfg := DefaultConfig()
	cfg.ProbePath = ""
	p, err := New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	var bs []ring.Backend
	for i := range 8 {
		addr := fmt.Sprintf("10.0.0.%d:8000", i+1)
		bs = append(bs, ring.Backend{ID: addr, Addr: "http://" + addr, State: ring.Active})
	}
	r, _ := ring.New(ring.DefaultConfig(), bs)
	p.SetRing(r, 1)
	body := []byte(fmt.Sprintf(`{"model":"m","stream":true,"messages":[{"role":"user","content":%q}]}`, strings.Repeat("context ", 500)))
	req := &PickRequest{API: ring.Chat, Body: body, Fallbacks: 2}
	b.ReportAllocs()
	for b.Loop() {
		pk, err := p.Pick(req)
		if err != nil {
			b.Fatal(err)
		}
		pk.Release()
	}
}
