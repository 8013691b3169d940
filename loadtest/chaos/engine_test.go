package chaos

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"io"
	"net"
	"net/http"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warmroute/warmroute/loadtest/workload"
)

// fakeCluster is an in-process stand-in for a router cluster: three HTTP
// routers sharing one ring (rendezvous hashing over the active backends,
// so a removal moves exactly the removed backend's prompts), and backends
// that only export prefix-cache counters.
type fakeCluster struct {
	t *testing.T

	mu       sync.Mutex
	epoch    uint64
	active   []string // backend ids in the ring
	counters map[string][2]float64
	routers  []*fakeRouter
	backends []Backend
	metrics  *http.Server
}

type fakeRouter struct {
	c      *fakeCluster
	name   string
	addr   string
	srv    *http.Server
	paused chan struct{} // non-nil while paused
	mu     sync.Mutex
}

func newFakeCluster(t *testing.T, nBackends int) *fakeCluster {
	c := &fakeCluster{t: t, epoch: 3, counters: map[string][2]float64{}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /m/{id}/metrics", func(w http.ResponseWriter, r *http.Request) {
		c.mu.Lock()
		v := c.counters[r.PathValue("id")]
		c.mu.Unlock()
		fmt.Fprintf(w, "# TYPE vllm:prefix_cache_queries_total counter\nvllm:prefix_cache_queries_total{engine=\"0\"} %g\n", v[0])
		fmt.Fprintf(w, "# TYPE vllm:prefix_cache_hits_total counter\nvllm:prefix_cache_hits_total{engine=\"0\"} %g\n", v[1])
	})
	mux.HandleFunc("POST /m/{id}/reset_prefix_cache", func(w http.ResponseWriter, r *http.Request) {})
	c.metrics = &http.Server{Handler: mux}
	go c.metrics.Serve(ln)
	t.Cleanup(func() { c.metrics.Close() })
	for i := 0; i < nBackends; i++ {
		id := fmt.Sprintf("b%d", i)
		c.active = append(c.active, id)
		c.backends = append(c.backends, Backend{ID: id, URL: "http://" + id + ":8000",
			MetricsURL: "http://" + ln.Addr().String() + "/m/" + id + "/metrics"})
	}
	return c
}

// owner is the rendezvous-hash owner of a body among the active backends.
func (c *fakeCluster) owner(body []byte) (string, uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	best, bestH := "-", uint64(0)
	for _, id := range c.active {
		h := fnv.New64a()
		h.Write([]byte(id))
		h.Write(body)
		if v := h.Sum64(); best == "-" || v > bestH {
			best, bestH = id, v
		}
	}
	return best, c.epoch
}

func (r *fakeRouter) handler() http.Handler {
	c := r.c
	mux := http.NewServeMux()
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {})
	mux.HandleFunc("GET /v1/models", func(w http.ResponseWriter, _ *http.Request) {
		io.WriteString(w, `{"object":"list","data":[{"id":"m","object":"model"}]}`)
	})
	mux.HandleFunc("GET /v1/cluster", func(w http.ResponseWriter, _ *http.Request) {
		c.mu.Lock()
		defer c.mu.Unlock()
		fmt.Fprintf(w, `{"node":%q,"epoch":%d,"leader":"router-a","raft":{"leader_id":"router-a"}}`, r.name, c.epoch)
	})
	mux.HandleFunc("POST /debug/route/v1/chat/completions", func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		b, epoch := c.owner(body)
		fmt.Fprintf(w, `{"node":%q,"epoch":%d,"backend":%q,"reason":"affinity","rank":0,"candidates":[{"id":%q,"state":"active","healthy":true}]}`,
			r.name, epoch, b, b)
	})
	mux.HandleFunc("GET /v1/backends", func(w http.ResponseWriter, _ *http.Request) {
		c.mu.Lock()
		defer c.mu.Unlock()
		var bs []map[string]string
		for _, id := range c.active {
			bs = append(bs, map[string]string{"id": id, "state": "active"})
		}
		json.NewEncoder(w).Encode(map[string]any{"epoch": c.epoch, "backends": bs})
	})
	mux.HandleFunc("GET /status", func(w http.ResponseWriter, _ *http.Request) {
		c.mu.Lock()
		defer c.mu.Unlock()
		var bs []map[string]any
		for _, id := range c.active {
			bs = append(bs, map[string]any{"id": id, "state": "active", "healthy": true})
		}
		json.NewEncoder(w).Encode(map[string]any{"backends": bs})
	})
	mux.HandleFunc("DELETE /v1/backends/{id}", func(w http.ResponseWriter, req *http.Request) {
		c.mu.Lock()
		defer c.mu.Unlock()
		id := req.PathValue("id")
		i := sort.SearchStrings(c.active, id)
		if i == len(c.active) || c.active[i] != id {
			http.Error(w, "unknown", http.StatusNotFound)
			return
		}
		c.active = append(c.active[:i:i], c.active[i+1:]...)
		c.epoch++
		fmt.Fprintf(w, `{"epoch":%d,"node":%q}`, c.epoch, r.name)
	})
	mux.HandleFunc("POST /v1/backends", func(w http.ResponseWriter, req *http.Request) {
		var b struct{ ID string }
		json.NewDecoder(req.Body).Decode(&b)
		c.mu.Lock()
		defer c.mu.Unlock()
		c.active = append(c.active, b.ID)
		sort.Strings(c.active)
		c.epoch++
		fmt.Fprintf(w, `{"epoch":%d,"node":%q}`, c.epoch, r.name)
	})
	mux.HandleFunc("POST /v1/chat/completions", func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		b, epoch := c.owner(body)
		c.mu.Lock()
		v := c.counters[b]
		c.counters[b] = [2]float64{v[0] + 100, v[1] + 90}
		c.mu.Unlock()
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set(headerBackend, b)
		w.Header().Set(headerDecision, "affinity")
		w.Header().Set(headerEpoch, fmt.Sprint(epoch))
		for i := 0; i < 3; i++ {
			fmt.Fprintf(w, "data: {\"choices\":[{\"delta\":{\"content\":\"t%d\"}}]}\n\n", i)
			w.(http.Flusher).Flush()
			time.Sleep(10 * time.Millisecond)
		}
		io.WriteString(w, "data: [DONE]\n\n")
	})
	// a paused router holds every request until resumed
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.mu.Lock()
		p := r.paused
		r.mu.Unlock()
		if p != nil {
			select {
			case <-p:
			case <-req.Context().Done():
				return
			}
		}
		mux.ServeHTTP(w, req)
	})
}

func (r *fakeRouter) start() error {
	addr := r.addr
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	r.addr = ln.Addr().String()
	r.srv = &http.Server{Handler: r.handler()}
	go r.srv.Serve(ln)
	return nil
}

// fakeTarget implements Target over a fakeCluster.
type fakeTarget struct {
	c      *fakeCluster
	closed bool
}

var _ Target = (*fakeTarget)(nil)

func (f *fakeTarget) Name() string     { return "fake" }
func (f *fakeTarget) Describe() string { return "in-process fake cluster" }
func (f *fakeTarget) Start(context.Context) error {
	for _, n := range []string{"router-a", "router-b", "router-c"} {
		r := &fakeRouter{c: f.c, name: n}
		if err := r.start(); err != nil {
			return err
		}
		f.c.routers = append(f.c.routers, r)
	}
	return nil
}
func (f *fakeTarget) Routers() []Router {
	var out []Router
	for _, r := range f.c.routers {
		out = append(out, Router{Name: r.name, URL: "http://" + r.addr, AdminURL: "http://" + r.addr})
	}
	return out
}
func (f *fakeTarget) Backends() []Backend { return append([]Backend(nil), f.c.backends...) }
func (f *fakeTarget) Admin() AdminAccess  { return AdminAccess{} }
func (f *fakeTarget) router(name string) *fakeRouter {
	for _, r := range f.c.routers {
		if r.name == name {
			return r
		}
	}
	f.c.t.Fatalf("no router %s", name)
	return nil
}
func (f *fakeTarget) KillRouter(_ context.Context, name string) error {
	return f.router(name).srv.Close()
}
func (f *fakeTarget) StartRouter(_ context.Context, name string) error { return f.router(name).start() }
func (f *fakeTarget) PauseRouter(_ context.Context, name string) error {
	r := f.router(name)
	r.mu.Lock()
	r.paused = make(chan struct{})
	r.mu.Unlock()
	return nil
}
func (f *fakeTarget) ResumeRouter(_ context.Context, name string) error {
	r := f.router(name)
	r.mu.Lock()
	if r.paused != nil {
		close(r.paused)
		r.paused = nil
	}
	r.mu.Unlock()
	return nil
}
func (f *fakeTarget) CanPartition() error { return fmt.Errorf("%w: fake", ErrUnsupported) }
func (f *fakeTarget) PartitionRouter(context.Context, string) error {
	return ErrUnsupported
}
func (f *fakeTarget) HealRouter(context.Context, string) error   { return nil }
func (f *fakeTarget) KillBackend(context.Context, string) error  { return ErrUnsupported }
func (f *fakeTarget) StartBackend(context.Context, string) error { return nil }
func (f *fakeTarget) StopAll(context.Context) error              { return ErrUnsupported }
func (f *fakeTarget) StartAll(context.Context) error             { return ErrUnsupported }
func (f *fakeTarget) Close() error {
	if !f.closed {
		f.closed = true
		for _, r := range f.c.routers {
			f.ResumeRouter(context.Background(), r.name)
			r.srv.Close()
		}
	}
	return nil
}

func fastConfig() Config {
	c := DefaultConfig()
	c.Faults = []Fault{RouterKill, RouterPause, RouterPartition, BackendRemove, BackendAdd}
	c.Rate = 40
	c.Warmup = 300 * time.Millisecond
	c.Pre = 300 * time.Millisecond
	c.Hold = 400 * time.Millisecond
	c.MinObserve = 200 * time.Millisecond
	c.MaxObserve = 3 * time.Second
	c.StableFor = 200 * time.Millisecond
	c.ProbePrompts = 200
	c.ProbeBatch = 40
	c.ProbeInterval = 50 * time.Millisecond
	c.ProbeTimeout = 200 * time.Millisecond
	c.KVInterval = 100 * time.Millisecond
	c.KVWindow = 300 * time.Millisecond
	c.ReadyTimeout = 10 * time.Second
	c.Workload = workload.DefaultConfig()
	c.Workload.RAG.DocumentTokens = 40
	c.Workload.MaxTokens = 3
	return c
}

// TestRunAgainstFake runs the engine end to end against the fake cluster
// and checks what it measured against what the fake did.
func TestRunAgainstFake(t *testing.T) {
	c := newFakeCluster(t, 5)
	var log bytes.Buffer
	cfg := fastConfig()
	cfg.Log = &log
	rep, err := Run(context.Background(), cfg, &fakeTarget{c: c})
	if err != nil {
		t.Fatalf("Run: %v\n%s", err, log.String())
	}
	if len(rep.Results) != 5 || rep.Requests == 0 || rep.Ticks == 0 {
		t.Fatalf("report: %d results, %d requests, %d ticks\n%s", len(rep.Results), rep.Requests, rep.Ticks, log.String())
	}
	byFault := map[Fault]*Result{}
	for i := range rep.Results {
		r := &rep.Results[i]
		byFault[r.Fault] = r
		if r.Failed != "" {
			t.Errorf("%s failed: %s", r.Fault, r.Failed)
		}
	}
	if r := byFault[RouterPartition]; r.Skipped == "" {
		t.Error("partition on a target that cannot partition was not skipped")
	}
	for _, f := range []Fault{RouterKill, RouterPause} {
		r := byFault[f]
		if r.Victim == "" || r.Victim == "router-a" {
			t.Errorf("%s: victim %q, want a follower", f, r.Victim)
		}
		if r.Errors.Other != 0 {
			t.Errorf("%s: %d failures on surviving routers: %v", f, r.Errors.Other, r.Errors.ByKind)
		}
		if r.Returned == nil || r.Returned.Moved != 0 {
			t.Errorf("%s: prompts moved after a router fault: %+v", f, r.Returned)
		}
		if len(r.Settles) == 0 || !r.Settles[len(r.Settles)-1].OK {
			t.Errorf("%s: settles %+v", f, r.Settles)
		}
	}
	if r := byFault[RouterKill]; len(r.Outages) != 1 || r.Outages[0].Router != r.Victim {
		t.Errorf("router kill outages %+v", r.Outages)
	}
	rm := byFault[BackendRemove]
	if rm.Moved == nil || rm.Moved.Moved == 0 || rm.Moved.FromBackend != rm.Moved.Moved || rm.Moved.OwnedBefore != rm.Moved.Moved {
		t.Errorf("removal: rendezvous hashing moves exactly the removed backend's prompts, got %+v", rm.Moved)
	}
	if rm.RemovalEpoch != 4 || rm.LateByEpoch != 0 {
		t.Errorf("removal epoch %d, late %d", rm.RemovalEpoch, rm.LateByEpoch)
	}
	if rm.Backends != 5 {
		t.Errorf("removal: %d backends before, want 5", rm.Backends)
	}
	add := byFault[BackendAdd]
	if add.Moved == nil || add.Moved.Moved == 0 || add.Moved.ToBackend != add.Moved.Moved || add.Victim != rm.Victim {
		t.Errorf("addition of %s (removed %s): %+v", add.Victim, rm.Victim, add.Moved)
	}
	if !strings.Contains(log.String(), "emptied "+add.Victim) {
		t.Errorf("the added backend's cache was not emptied:\n%s", log.String())
	}
	measured := false
	for _, r := range rep.Results {
		measured = measured || r.KV.Measured
	}
	if !measured {
		t.Error("no hit rate measured")
	}
	if bad := Check(rep, Picks); len(bad) != 0 {
		t.Errorf("acceptance on the fake: %v", bad)
	}
	var out bytes.Buffer
	WriteTable(&out, []Report{rep}, true)
	for _, f := range cfg.Faults {
		if !strings.Contains(out.String(), "| "+string(f)+" |") {
			t.Errorf("table lacks %s:\n%s", f, out.String())
		}
	}
	if _, err := json.Marshal(rep); err != nil {
		t.Error(err)
	}
}

// TestRunInterrupted checks that a cancelled run stops and says so.
func TestRunInterrupted(t *testing.T) {
	c := newFakeCluster(t, 3)
	cfg := fastConfig()
	cfg.Warmup = time.Minute
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	tgt := &fakeTarget{c: c}
	_, err := Run(ctx, cfg, tgt)
	if err != ErrInterrupted {
		t.Fatalf("err %v, want ErrInterrupted", err)
	}
	if !tgt.closed {
		t.Error("target not closed")
	}
}
