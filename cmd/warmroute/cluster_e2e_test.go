package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warmroute/warmroute/loadtest/proc"
)

// The cluster tests run three (or four) `warmroute serve` processes that
// gossip and run Raft over loopback, in front of stub engines that can hold
// requests open so in-flight counts stay observable, and measure what the
// load-sharing and agreement requirements promise: how soon one router's
// in-flight shows on another, how soon a killed router's share is gone, how
// soon a late joiner converges, and that every router routes every prompt
// alike. The figures are in docs/gossip.md ("Real processes") and
// docs/cluster.md.

func needCluster(t *testing.T) {
	t.Helper()
	needBinary(t)
}

// integOnly skips a test under -short: `make test` runs with -short, so the
// test runs in `make integ` only. For tests whose length, not their
// importance, keeps them out of the gate; say why.
func integOnly(t *testing.T, why string) {
	t.Helper()
	if testing.Short() {
		t.Skip("integration tier (make integ): " + why)
	}
}

// getJSON decodes a GET answer.
func getJSON(c *http.Client, url string, v any) error {
	resp, err := c.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("GET %s: %d %s", url, resp.StatusCode, b)
	}
	err = json.NewDecoder(resp.Body).Decode(v)
	io.Copy(io.Discard, resp.Body) // to EOF, so the connection is reused
	return err
}

type clusterDoc struct {
	Epoch uint64 `json:"epoch"`
	Raft  struct {
		LeaderID string `json:"leader_id"`
	} `json:"raft"`
	Members []struct {
		Name string `json:"name"`
	} `json:"members"`
}

func memberNames(d clusterDoc) []string {
	var out []string
	for _, m := range d.Members {
		out = append(out, m.Name)
	}
	slices.Sort(out)
	return out
}

// spawnCluster starts n routers r0..r(n-1) from a that bootstrap Raft
// together (--bootstrap-expect n, each joining r0), each adjusted first by
// each (when not nil), and waits until every one is ready. When one exits
// because a port it was given was taken meanwhile, it starts them all
// again, twice at most.
func spawnCluster(t *testing.T, n int, a proc.ServeArgs, each func(i int, a *proc.ServeArgs)) []*router {
	t.Helper()
	for attempt := 1; ; attempt++ {
		var ps []*router
		for i := range n {
			ai := a
			ai.NodeName, ai.BootstrapExpect = fmt.Sprintf("r%d", i), n
			if i > 0 {
				ai.Join = []string{ps[0].gossip}
			}
			if each != nil {
				each(i, &ai)
			}
			ps = append(ps, spawnRouter(t, ai))
		}
		var errs []error
		for _, p := range ps {
			errs = append(errs, p.waitReady())
		}
		err := errors.Join(errs...)
		if err == nil {
			return ps
		}
		if attempt == 3 || !slices.ContainsFunc(ps, (*router).portTaken) {
			t.Fatal(err)
		}
		t.Logf("a port was taken meanwhile; starting the cluster again: %v", err)
		for _, p := range ps {
			p.Kill()
		}
	}
}

// startProcCluster starts n routers in front of backends that bootstrap
// Raft together and waits until every one is ready, sees all n members and
// routes on the same agreed epoch under one leader.
func startProcCluster(t *testing.T, backends []string, n int) []*router {
	t.Helper()
	ps := spawnCluster(t, n, proc.ServeArgs{Backends: backends}, nil)
	waitAgreed(t, &http.Client{Timeout: 5 * time.Second}, ps, 30*time.Second)
	return ps
}

// waitAgreed waits until every router lists all of them as members and
// they route on the same agreed epoch under one leader.
func waitAgreed(t *testing.T, c *http.Client, ps []*router, limit time.Duration) {
	t.Helper()
	var leaders, epochs, sizes map[any]bool
	if _, err := pollUntil(limit, func() (bool, error) {
		leaders, epochs, sizes = map[any]bool{}, map[any]bool{}, map[any]bool{}
		for _, p := range ps {
			var d clusterDoc
			if err := getJSON(c, p.admin+"/v1/cluster", &d); err != nil {
				return false, err
			}
			leaders[d.Raft.LeaderID], epochs[d.Epoch], sizes[len(d.Members)] = true, true, true
		}
		return len(leaders) == 1 && !leaders[""] && len(epochs) == 1 && !epochs[uint64(0)] && len(sizes) == 1 && sizes[len(ps)], nil
	}); err != nil {
		t.Fatalf("no agreed leader and epoch: leaders %v epochs %v member counts %v: %v\n%s", leaders, epochs, sizes, err, ps[0].Logs())
	}
}

// heldEngines starts n stub engines; requests wait for the channel their
// hold pointer names when they arrive.
func heldEngines(t *testing.T, n int) ([]*sseEngine, []string) {
	var es []*sseEngine
	var urls []string
	for i := 0; i < n; i++ {
		e := newEngine(t, 0, 0, 1)
		es = append(es, e)
		urls = append(urls, e.srv.URL)
	}
	return es, urls
}

// holdAll makes every engine hold new requests until the returned release
// is called (safe to call more than once; also called at cleanup, before
// the routers stop).
func holdAll(t *testing.T, es []*sseEngine) (release func()) {
	ch := make(chan struct{})
	for _, e := range es {
		e.hold.Store(&ch)
	}
	release = sync.OnceFunc(func() { close(ch) })
	t.Cleanup(release)
	return release
}

func heldCount(es []*sseEngine) int64 {
	var n int64
	for _, e := range es {
		n += e.cur.Load()
	}
	return n
}

func waitHeld(t *testing.T, es []*sseEngine, n int64) {
	t.Helper()
	if _, err := pollUntil(10*time.Second, func() (bool, error) { return heldCount(es) == n, nil }); err != nil {
		t.Fatalf("engines hold %d requests, want %d: %v", heldCount(es), n, err)
	}
}

// clients opens requests that stay open until the engines release them.
type clients struct {
	wg   sync.WaitGroup
	errs atomic.Int64
}

// wait waits for the requests and fails the test if any failed.
func (h *clients) wait(t *testing.T, through string) {
	t.Helper()
	h.wg.Wait()
	if n := h.errs.Load(); n != 0 {
		t.Errorf("%d requests through %s failed", n, through)
	}
}

func (h *clients) open(url, prompt string) {
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(chatBody(prompt, false)))
		if err != nil {
			h.errs.Add(1)
			return
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			h.errs.Add(1)
		}
	}()
}

// loads is one router's live view: backend id -> count.
type loads map[string]int64

func (l loads) sum() int64 {
	var n int64
	for _, v := range l {
		n += v
	}
	return n
}

// nonZero drops zero entries, so views that differ only in listing idle
// backends compare equal.
func (l loads) nonZero() loads {
	out := loads{}
	for k, v := range l {
		if v != 0 {
			out[k] = v
		}
	}
	return out
}

func addLoads(ls ...loads) loads {
	out := loads{}
	for _, l := range ls {
		for k, v := range l {
			out[k] += v
		}
	}
	return out.nonZero()
}

// liveLoads reads a router's own and remote in-flight per backend from
// GET /status: the counts its proxy routes on. (GET /v1/backends lists the
// agreed backends, which a router that just joined does not have until
// Raft has replicated them to it, although it routes and counts already.)
func liveLoads(c *http.Client, p *router) (own, remote loads, err error) {
	var doc struct {
		Backends []struct {
			ID             string `json:"id"`
			InFlight       int64  `json:"in_flight"`
			RemoteInFlight int64  `json:"remote_in_flight"`
		} `json:"backends"`
	}
	if err := getJSON(c, p.admin+"/status", &doc); err != nil {
		return nil, nil, err
	}
	own, remote = loads{}, loads{}
	for _, b := range doc.Backends {
		own[b.ID], remote[b.ID] = b.InFlight, b.RemoteInFlight
	}
	return own.nonZero(), remote.nonZero(), nil
}

// remoteOf reads one backend's remote in-flight on a router from
// GET /v1/backends/{id} ("live.remote_in_flight").
func remoteOf(c *http.Client, p *router, id string) (int64, error) {
	var doc struct {
		Backend struct {
			Live *struct {
				RemoteInFlight int64 `json:"remote_in_flight"`
			} `json:"live"`
		} `json:"backend"`
	}
	if err := getJSON(c, p.admin+"/v1/backends/"+id, &doc); err != nil {
		return 0, err
	}
	if doc.Backend.Live == nil {
		return 0, fmt.Errorf("backend %s has no live view on %s", id, p.name)
	}
	return doc.Backend.Live.RemoteInFlight, nil
}

// explained is the part of a /debug/route answer the tests compare.
type explained struct {
	Node       string `json:"node"`
	Epoch      uint64 `json:"epoch"`
	Backend    string `json:"backend"`
	Reason     string `json:"reason"`
	Candidates []struct {
		ID string `json:"id"`
	} `json:"candidates"`
}

// owner is the first backend of the key's order: whom the agreed state
// (splits, moves, membership) makes the key's owner, whatever the health
// and load that chose Backend.
func (e explained) owner() string {
	if len(e.Candidates) == 0 {
		return ""
	}
	return e.Candidates[0].ID
}

func explain(c *http.Client, p *router, body []byte) (explained, error) {
	resp, err := c.Post(p.admin+"/debug/route/v1/chat/completions", "application/json", bytes.NewReader(body))
	if err != nil {
		return explained{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		return explained{}, fmt.Errorf("%s /debug/route: %d %s", p.name, resp.StatusCode, b)
	}
	var e explained
	err = json.NewDecoder(resp.Body).Decode(&e)
	io.Copy(io.Discard, resp.Body) // to EOF, so the connection is reused
	return e, err
}

// percentile is the nearest-rank percentile of ds (q in (0, 1]).
func percentile(ds []time.Duration, q float64) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(q*float64(len(s))+0.999999) - 1
	return s[max(0, min(i, len(s)-1))]
}

func engineByAddr(es []*sseEngine, id string) *sseEngine {
	for _, e := range es {
		if e.addr() == id {
			return e
		}
	}
	return nil
}

// TestClusterProcessesPropagation: one request held open through router A
// shows in router B's remote in-flight, and leaves it when it ends, within
// a few publish intervals (50 ms, the default). 100 samples at a random
// phase of the publish tick.
func TestClusterProcessesPropagation(t *testing.T) {
	t.Parallel()
	needCluster(t)
	engines, urls := heldEngines(t, 3)
	ps := startProcCluster(t, urls, 3)
	a, b := ps[0], ps[1]
	c := &http.Client{Timeout: 5 * time.Second}
	const (
		samples  = 100
		interval = 50 * time.Millisecond // --publish-interval default
		bound    = 2 * time.Second
	)
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
	var visible, cleared []time.Duration
	for i := 0; i < samples; i++ {
		prompt := fmt.Sprintf("propagation sample %d", i)
		ex, err := explain(c, a, []byte(chatBody(prompt, false)))
		if err != nil {
			t.Fatal(err)
		}
		e := engineByAddr(engines, ex.Backend)
		if e == nil || ex.Reason != "affinity" {
			t.Fatalf("router A would send the sample to %q (%s)", ex.Backend, ex.Reason)
		}
		ch := make(chan struct{})
		for _, e := range engines {
			e.hold.Store(&ch)
		}
		time.Sleep(time.Duration(rng.Int64N(int64(interval))))
		var cl clients
		cl.open(a.url, prompt)
		d, err := pollUntil(bound, func() (bool, error) {
			n, err := remoteOf(c, b, ex.Backend)
			return n == 1, err
		})
		if err != nil {
			close(ch)
			t.Fatalf("sample %d: router A's request not visible on router B: %v", i, err)
		}
		visible = append(visible, d)
		waitHeld(t, engines, 1)
		if e.cur.Load() != 1 {
			close(ch)
			t.Fatalf("sample %d: the request is not held by %s, the backend router A named", i, ex.Backend)
		}
		// Release at a random phase too (B just saw a publish).
		time.Sleep(time.Duration(rng.Int64N(int64(interval))))
		close(ch)
		d, err = pollUntil(bound, func() (bool, error) {
			n, err := remoteOf(c, b, ex.Backend)
			return n == 0, err
		})
		if err != nil {
			t.Fatalf("sample %d: the request ended but router B still counts it: %v", i, err)
		}
		cleared = append(cleared, d)
		cl.wg.Wait()
		if cl.errs.Load() != 0 {
			t.Fatalf("sample %d: the request through router A failed", i)
		}
	}
	t.Logf("in-flight through router A visible on router B (%d samples, publish interval %v, polling every 2 ms): p50 %v, p99 %v, max %v",
		samples, interval, percentile(visible, 0.5), percentile(visible, 0.99), slices.Max(visible))
	t.Logf("request ended -> gone from router B: p50 %v, p99 %v, max %v",
		percentile(cleared, 0.5), percentile(cleared, 0.99), slices.Max(cleared))
	if p50 := percentile(visible, 0.5); p50 > 3*interval {
		t.Errorf("visible on B: p50 %v, want within 3 publish intervals (%v)", p50, 3*interval)
	}
	if p50 := percentile(cleared, 0.5); p50 > 3*interval {
		t.Errorf("gone from B: p50 %v, want within 3 publish intervals (%v)", p50, 3*interval)
	}
}

// TestClusterProcessesKilledRouter: requests held open through router C
// count in router A's remote in-flight; once C is SIGKILLed (no goodbye,
// no leave) its share leaves A's view within the failure-detection time,
// while router B's share stays.
func TestClusterProcessesKilledRouter(t *testing.T) {
	t.Parallel()
	needCluster(t)
	engines, urls := heldEngines(t, 3)
	ps := startProcCluster(t, urls, 3)
	a, b, cr := ps[0], ps[1], ps[2]
	c := &http.Client{Timeout: 5 * time.Second}
	release := holdAll(t, engines)
	const onB, onC = 3, 5
	var viaB, viaC clients
	for i := 0; i < onB; i++ {
		viaB.open(b.url, fmt.Sprintf("held through b %d", i))
	}
	for i := 0; i < onC; i++ {
		viaC.open(cr.url, fmt.Sprintf("held through c %d", i))
	}
	waitHeld(t, engines, onB+onC)

	var ownB, ownC, remoteA loads
	if _, err := pollUntil(5*time.Second, func() (bool, error) {
		var err1, err2, err3 error
		ownB, _, err1 = liveLoads(c, b)
		ownC, _, err2 = liveLoads(c, cr)
		_, remoteA, err3 = liveLoads(c, a)
		return ownB.sum() == onB && ownC.sum() == onC && maps.Equal(remoteA, addLoads(ownB, ownC)), errors.Join(err1, err2, err3)
	}); err != nil {
		t.Fatalf("router A never counted B's and C's requests: A remote %v, B own %v, C own %v: %v", remoteA, ownB, ownC, err)
	}
	t.Logf("before the kill: A's remote in-flight %v = B's own %v + C's own %v", remoteA, ownB, ownC)

	start := time.Now()
	cr.Kill()
	var ownBNow loads
	_, err := pollUntil(10*time.Second, func() (bool, error) {
		var err1, err2 error
		ownBNow, _, err1 = liveLoads(c, b)
		_, remoteA, err2 = liveLoads(c, a)
		return maps.Equal(remoteA, ownBNow), errors.Join(err1, err2)
	})
	d := time.Since(start)
	if err != nil {
		t.Fatalf("after SIGKILL of router C, A's remote in-flight is %v, want B's own %v: %v", remoteA, ownBNow, err)
	}
	var cd clusterDoc
	getJSON(c, a.admin+"/v1/cluster", &cd)
	t.Logf("router C SIGKILLed with %d requests open: its share left router A's view after %v (A's members then: %v)",
		onC, d, memberNames(cd))
	if !maps.Equal(ownBNow, ownB) {
		t.Errorf("B's own in-flight changed from %v to %v", ownB, ownBNow)
	}
	if d > 5*time.Second {
		t.Errorf("C's share left A's view after %v, want under 5 s (failure detection is about 1 s)", d)
	}
	// B's share is still counted a while later.
	time.Sleep(300 * time.Millisecond)
	if _, remoteA, err = liveLoads(c, a); err != nil || !maps.Equal(remoteA, ownB) {
		t.Errorf("later, A's remote in-flight is %v, want B's own %v (%v)", remoteA, ownB, err)
	}
	release()
	viaB.wait(t, "B")
	viaC.wg.Wait() // C was killed under them
}

// TestClusterProcessesLateJoiner: with requests held open through routers
// A and B, a fourth router D started later (no --bootstrap-expect: it joins)
// sees their in-flight as its remote in-flight.
func TestClusterProcessesLateJoiner(t *testing.T) {
	t.Parallel()
	needCluster(t)
	engines, urls := heldEngines(t, 3)
	ps := startProcCluster(t, urls, 3)
	a, b, cr := ps[0], ps[1], ps[2]
	c := &http.Client{Timeout: 5 * time.Second}
	release := holdAll(t, engines)
	const onA, onB = 4, 3
	var held clients
	for i := 0; i < onA; i++ {
		held.open(a.url, fmt.Sprintf("held through a %d", i))
	}
	for i := 0; i < onB; i++ {
		held.open(b.url, fmt.Sprintf("held through b %d", i))
	}
	waitHeld(t, engines, onA+onB)
	var want, remoteC loads
	if _, err := pollUntil(5*time.Second, func() (bool, error) {
		ownA, _, err1 := liveLoads(c, a)
		ownB, _, err2 := liveLoads(c, b)
		_, rc, err3 := liveLoads(c, cr)
		want, remoteC = addLoads(ownA, ownB), rc
		return want.sum() == onA+onB && maps.Equal(rc, want), errors.Join(err1, err2, err3)
	}); err != nil {
		t.Fatalf("router C never saw A's and B's requests: %v, want %v: %v", remoteC, want, err)
	}
	// Changed figures are re-sent for 3 publish intervals (150 ms); wait
	// past that, so only D's join exchange (memberlist push/pull) or the
	// next periodic refresh (every 500 ms) can bring them to D.
	time.Sleep(300 * time.Millisecond)

	var d *router
	var firstAnswer time.Duration
	var answers int
	var remoteD loads
	var err error
	for attempt := 1; ; attempt++ {
		d, firstAnswer, answers = spawnRouter(t, proc.ServeArgs{NodeName: "r3", Backends: urls, Join: []string{a.gossip}}), 0, 0
		_, err = pollUntil(10*time.Second, func() (bool, error) {
			if err := d.Alive(); err != nil {
				return false, err
			}
			_, rd, err := liveLoads(c, d)
			if err != nil {
				if answers > 0 {
					t.Logf("router D answered, then: %v", err)
				}
				return false, err
			}
			if answers++; answers == 1 {
				firstAnswer = time.Since(d.started)
			}
			remoteD = rd
			return maps.Equal(rd, want), nil
		})
		if attempt == 3 || !d.portTaken() {
			break
		}
		t.Logf("a port was taken meanwhile; starting router D again: %v", err)
		d.Kill()
	}
	sinceExec := time.Since(d.started)
	if err != nil {
		t.Fatalf("router D's remote in-flight %v, want %v: %v", remoteD, want, err)
	}
	t.Logf("late joiner D: remote in-flight %v matched %v after exec; its admin API first answered %v after exec, and %d answers (2 ms apart) were needed",
		want, sinceExec, firstAnswer, answers)
	if sinceExec > time.Second {
		t.Logf("router D's log:\n%s", d.Logs())
	}
	if sinceExec > 5*time.Second {
		t.Errorf("router D converged %v after it was started, want under 5 s", sinceExec)
	}
	// D stays in the cluster and keeps the view.
	if _, err := pollUntil(10*time.Second, func() (bool, error) {
		var cd clusterDoc
		err := getJSON(c, a.admin+"/v1/cluster", &cd)
		return len(cd.Members) == 4, err
	}); err != nil {
		t.Errorf("router A does not list D as a member: %v", err)
	}
	if _, rd, err := liveLoads(c, d); err != nil || !maps.Equal(rd, want) {
		t.Errorf("router D's remote in-flight moved to %v, want %v (%v)", rd, want, err)
	}
	release()
	held.wait(t, "A and B")
}

// TestClusterProcessesRouteAgreement: after a backend is added through one
// router, all three routers name the same backend for each of 10,000
// random prompts, asked over HTTP through their route explainers. It runs
// alone (not in parallel): on a machine the other tests load, the routers'
// load views drift apart and overflow decisions differ for a while.
func TestClusterProcessesRouteAgreement(t *testing.T) {
	needCluster(t)
	_, urls := heldEngines(t, 6)
	ps := startProcCluster(t, urls[:5], 3)
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 16}}
	defer c.CloseIdleConnections()

	// A change made at run time, so the ring compared is the agreed one.
	resp, err := c.Post(ps[1].admin+"/v1/backends", "application/json", strings.NewReader(fmt.Sprintf(`{"url":%q}`, urls[5])))
	if err != nil {
		t.Fatal(err)
	}
	var ack struct {
		Epoch uint64 `json:"epoch"`
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || json.Unmarshal(body, &ack) != nil || ack.Epoch == 0 {
		t.Fatalf("adding a backend through r1: %d %s", resp.StatusCode, body)
	}
	for _, p := range ps {
		if _, err := pollUntil(10*time.Second, func() (bool, error) {
			var st struct {
				Epoch    uint64 `json:"epoch"`
				Backends []any  `json:"backends"`
			}
			err := getJSON(c, p.admin+"/status", &st)
			return st.Epoch == ack.Epoch && len(st.Backends) == 6, err
		}); err != nil {
			t.Fatalf("router %s not routing on epoch %d: %v", p.name, ack.Epoch, err)
		}
	}

	const prompts, workers = 10000, 4
	seed := uint64(time.Now().UnixNano())
	rng := rand.New(rand.NewPCG(seed, 2))
	bodies := make([][]byte, prompts)
	for i := range bodies {
		// Lengths from a few bytes to past the 4096-byte prefix.
		buf := make([]byte, 1+rng.IntN(6000))
		for j := range buf {
			buf[j] = "abcdefghijklmnopqrstuvwxyz     "[rng.IntN(31)]
		}
		bodies[i] = []byte(chatBody(fmt.Sprintf("%d %s", i, buf), false))
	}
	type result struct {
		backend, reason string
		bad             string // a disagreement or an error
	}
	results := make([]result, prompts)
	next := atomic.Int64{}
	var wg sync.WaitGroup
	start := time.Now()
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= prompts {
					return
				}
				var first explained
				for j, p := range ps {
					e, err := explain(c, p, bodies[i])
					switch {
					case err != nil:
						results[i].bad = err.Error()
					case e.Epoch != ack.Epoch:
						results[i].bad = fmt.Sprintf("%s answered at epoch %d, want %d", p.name, e.Epoch, ack.Epoch)
					case j == 0:
						first = e
					case e.Backend != first.Backend:
						results[i].bad = fmt.Sprintf("%s picks %s (%s), %s picks %s (%s)", first.Node, first.Backend, first.Reason, e.Node, e.Backend, e.Reason)
					}
					if results[i].bad != "" {
						break
					}
				}
				results[i].backend, results[i].reason = first.Backend, first.Reason
			}
		}()
	}
	wg.Wait()
	took := time.Since(start)
	perBackend, reasons := map[string]int{}, map[string]int{}
	var bad []string
	for i, r := range results {
		if r.bad != "" {
			bad = append(bad, fmt.Sprintf("prompt %d: %s", i, r.bad))
			continue
		}
		perBackend[r.backend]++
		reasons[r.reason]++
	}
	t.Logf("%d prompts x %d routers over HTTP (%d workers, keep-alive, seed %d): %d disagreements or errors, took %v (%.0f answers/s); prompts per backend %v; reasons %v",
		prompts, len(ps), workers, seed, len(bad), took.Round(time.Millisecond), float64(prompts*len(ps))/took.Seconds(), perBackend, reasons)
	if len(bad) > 0 {
		t.Errorf("%d of %d prompts were not routed alike; first: %v", len(bad), prompts, bad[:min(5, len(bad))])
	}
	if len(perBackend) != 6 {
		t.Errorf("the prompts reached %d backends, want all 6: %v", len(perBackend), perBackend)
	}
	if reasons["affinity"] != prompts-len(bad) {
		t.Errorf("reasons %v on an idle fleet, want affinity only", reasons)
	}
}
