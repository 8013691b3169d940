package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
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

// The crash test: three clustered routers with data directories of their
// own take admin writes (backend adds and removes, routing config
// changes: every one a Raft commit) from concurrent writers, and are
// killed with SIGKILL at a random point of them: the followers and then
// the leader, all three, the leader alone or a follower alone. They
// restart on the same ports and data directories. After every round each
// router must start, become ready and agree with the others, and every
// write a writer saw acknowledged (2xx) must be in the state each router
// serves through its admin API.
//
// A killed leader's log may end in entries the others never had; when it
// rejoins, the new leader's entries replace them and raft-wal truncates the
// log's tail ("clearing log suffix"). raft-wal v0.4.0 recorded the cut
// segment as sealed without writing its index, so the router's next start
// panicked in raft.NewRaft, and every start after it. A leader left alone
// with writes arriving takes that path almost surely; the kills of all
// three then restart every router on whatever its log holds.
//
// `make test` runs crashRounds rounds (3); `make integ` builds the tests
// with the integ tag, which makes it 20 (crash_integ_test.go). The
// routers refuse unknown WARMROUTE_* variables, so the count is not an
// environment variable: the old builds this test is run against would
// refuse it.

const (
	// crashBackendWriters add and remove backends; one more writer
	// changes the routing config.
	crashBackendWriters = 3
	// crashLiveIDs bounds the backends one writer keeps: with more it
	// removes one.
	crashLiveIDs = 6
)

// crashKind is what a round kills.
type crashKind int

const (
	// killLeaderLast kills both followers, lets writes reach the lone
	// leader (they append to its log and never commit), then kills it;
	// the followers come back and elect a leader of their own before it
	// does: its log's tail must go.
	killLeaderLast crashKind = iota
	// killAll kills all three in a random order with random gaps, so a
	// kill can land on an election the previous one started, and restarts
	// them the same way.
	killAll
	// killLeader kills the leader alone; the others elect a new one and
	// take writes before it comes back.
	killLeader
	// killFollower kills one follower.
	killFollower
)

func (k crashKind) String() string {
	return [...]string{"the followers, then the leader", "all three", "the leader", "a follower"}[k]
}

// crashSchedule is the rounds' kinds, in turn: a leader whose log ran
// ahead first, so that the second round restarts a router whose log was
// cut.
var crashSchedule = []crashKind{killLeaderLast, killAll, killLeader, killFollower}

// TestE2ECrashRestart kills routers with writes in flight, round after
// round; every router must come back and no acknowledged write may be
// lost.
func TestE2ECrashRestart(t *testing.T) {
	t.Parallel()
	needCluster(t)
	seed := uint64(time.Now().UnixNano())
	rng := rand.New(rand.NewPCG(seed, 29))
	t.Logf("%d rounds, seed %d", crashRounds, seed)

	_, urls := heldEngines(t, 2)
	args := make([]proc.ServeArgs, 3)
	ps := spawnCluster(t, 3, proc.ServeArgs{Backends: urls, ProbeInterval: time.Second}, func(i int, a *proc.ServeArgs) {
		if i == 0 {
			// Every router's addresses are fixed before the first starts,
			// so each joins the other two and restarts where it was.
			for j := range args {
				args[j] = proc.ServeArgs{
					Listen: freeAddr(t), AdminListen: freeAddr(t), GossipListen: freeAddr(t), RaftListen: freeAddr(t),
					DataDir: t.TempDir(),
				}
			}
		}
		a.Listen, a.AdminListen, a.GossipListen, a.RaftListen, a.DataDir =
			args[i].Listen, args[i].AdminListen, args[i].GossipListen, args[i].RaftListen, args[i].DataDir
		a.Join = nil
		for j := range args {
			if j != i {
				a.Join = append(a.Join, args[j].GossipListen)
			}
		}
		args[i] = *a
	})
	c := &http.Client{Timeout: 5 * time.Second}
	waitAgreed(t, c, ps, 30*time.Second)
	cl := &crashCluster{t: t, c: c, args: args, ps: ps, all: slices.Clone(ps)}

	w := newCrashWriters(ps, urls)
	defer w.c.CloseIdleConnections()
	w.cfg.initial = routingPrefix(t, c, ps[0])

	start := time.Now()
	for round := 1; round <= crashRounds; round++ {
		kind := crashSchedule[(round-1)%len(crashSchedule)]
		cl.round = round
		stop := w.run(rng.Uint64())
		t.Cleanup(stop)
		time.Sleep(randDur(rng, 300*time.Millisecond, 1500*time.Millisecond))

		var killed []int
		switch kind {
		case killLeaderLast:
			leader := cl.leader()
			for _, i := range rng.Perm(len(ps)) {
				if i != leader {
					ps[i].Kill()
					killed = append(killed, i)
				}
			}
			time.Sleep(randDur(rng, 100*time.Millisecond, 400*time.Millisecond))
			ps[leader].Kill()
			stop()
			cl.restart(rng, killed...)
			cl.waitLeader(killed)
			// The new leader commits on before the old one is back.
			stop = w.run(rng.Uint64())
			t.Cleanup(stop)
			time.Sleep(randDur(rng, 200*time.Millisecond, 600*time.Millisecond))
			stop()
			cl.restart(rng, leader)
			killed = append(killed, leader)
		case killAll:
			for _, i := range rng.Perm(len(ps)) {
				ps[i].Kill()
				killed = append(killed, i)
				time.Sleep(randDur(rng, 0, 300*time.Millisecond))
			}
			stop()
			cl.restart(rng, killed...)
		case killLeader, killFollower:
			leader := cl.leader()
			i := leader
			if kind == killFollower {
				i = (leader + 1 + rng.IntN(len(ps)-1)) % len(ps)
			}
			ps[i].Kill()
			killed = append(killed, i)
			// The others elect a leader (or keep theirs) and commit on:
			// where the killed leader's log ran ahead, theirs now differs.
			time.Sleep(randDur(rng, 500*time.Millisecond, 1500*time.Millisecond))
			stop()
			cl.restart(rng, i)
		}

		waitAgreed(t, c, ps, 30*time.Second)
		for _, p := range ps {
			if err := w.check(c, p); err != nil {
				t.Fatalf("round %d (killed %v): %v", round, kind, err)
			}
		}
		t.Logf("round %d: killed %v (%s); all back and agreed after %v", round, kind, names(ps, killed), time.Since(start).Round(time.Millisecond))
	}

	cleared := 0
	for _, p := range cl.all {
		cleared += strings.Count(p.Logs(), "clearing log suffix")
	}
	acked, uncertain := w.counts()
	present, absent := w.settled()
	t.Logf("%d rounds in %v: %d writes acknowledged and kept, %d unanswered or refused (in flight at a kill, or no leader); "+
		"at the end %d backends must be there and %d must not; log suffixes cleared %d times",
		crashRounds, time.Since(start).Round(time.Millisecond), acked, uncertain, present, absent, cleared)
	if acked == 0 {
		t.Error("no write was acknowledged: the test checked nothing")
	}
}

// crashCluster is the test's three routers and the settings each restarts
// with.
type crashCluster struct {
	t     *testing.T
	c     *http.Client
	args  []proc.ServeArgs
	ps    []*router // the current process of each router
	all   []*router // every process started, for the logs
	round int
}

// restart starts the routers idx again, in a random order with random
// gaps, and waits until each is ready; a router that exits or stays
// unready fails the test.
func (cl *crashCluster) restart(rng *rand.Rand, idx ...int) {
	cl.t.Helper()
	order := slices.Clone(idx)
	rng.Shuffle(len(order), func(a, b int) { order[a], order[b] = order[b], order[a] })
	for k, i := range order {
		if k > 0 {
			time.Sleep(randDur(rng, 0, 300*time.Millisecond))
		}
		cl.ps[i] = restartRouter(cl.t, cl.args[i])
		cl.all = append(cl.all, cl.ps[i])
	}
	var errs []error
	for _, i := range idx {
		if err := cl.ps[i].waitReady(); err != nil {
			errs = append(errs, fmt.Errorf("round %d: router %s did not come back: %w", cl.round, cl.ps[i].name, err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		cl.t.Fatal(err)
	}
}

// leader returns the index of the router the first one names as leader,
// waiting up to 10 s for one.
func (cl *crashCluster) leader() int {
	cl.t.Helper()
	leader := -1
	if _, err := pollUntil(10*time.Second, func() (bool, error) {
		var d clusterDoc
		if err := getJSON(cl.c, cl.ps[0].admin+"/v1/cluster", &d); err != nil {
			return false, err
		}
		leader = slices.IndexFunc(cl.ps, func(p *router) bool { return p.name == d.Raft.LeaderID })
		return leader >= 0, nil
	}); err != nil {
		cl.t.Fatalf("round %d: no leader among the routers: %v", cl.round, err)
	}
	return leader
}

// waitLeader waits until the routers idx all name one of them as leader.
func (cl *crashCluster) waitLeader(idx []int) {
	cl.t.Helper()
	var seen []string
	if _, err := pollUntil(30*time.Second, func() (bool, error) {
		seen = seen[:0]
		for _, i := range idx {
			var d clusterDoc
			if err := getJSON(cl.c, cl.ps[i].admin+"/v1/cluster", &d); err != nil {
				return false, err
			}
			seen = append(seen, d.Raft.LeaderID)
		}
		ours := slices.ContainsFunc(idx, func(i int) bool { return cl.ps[i].name == seen[0] })
		return ours && !slices.ContainsFunc(seen, func(s string) bool { return s != seen[0] }), nil
	}); err != nil {
		cl.t.Fatalf("round %d: routers %s name no leader among them (%q): %v", cl.round, names(cl.ps, idx), seen, err)
	}
}

// restartRouter starts a router again on the settings it had, waiting a
// little and trying again while a port it needs is still taken.
func restartRouter(t *testing.T, a proc.ServeArgs) *router {
	t.Helper()
	for attempt := 1; ; attempt++ {
		r := spawnRouter(t, a)
		// Until it exits or answers (it answers once every port is bound).
		pollUntil(15*time.Second, func() (bool, error) {
			if r.Exited() {
				return true, nil
			}
			resp, err := http.Get(r.url + "/healthz")
			if err != nil {
				return false, nil
			}
			resp.Body.Close()
			return true, nil
		})
		if attempt == 3 || !r.portTaken() {
			return r
		}
		t.Logf("router %s: a port is still taken; starting it again", a.NodeName)
		time.Sleep(500 * time.Millisecond)
	}
}

// randDur returns a duration in [lo, hi].
func randDur(rng *rand.Rand, lo, hi time.Duration) time.Duration {
	return lo + time.Duration(rng.Int64N(int64(hi-lo)+1))
}

// names lists the names of the routers idx.
func names(ps []*router, idx []int) string {
	var out []string
	for _, i := range idx {
		out = append(out, ps[i].name)
	}
	return strings.Join(out, ", ")
}

// routingPrefix reads a router's agreed prefix_length.
func routingPrefix(t *testing.T, c *http.Client, p *router) int {
	t.Helper()
	var doc struct {
		Routing struct {
			PrefixLength int `json:"prefix_length"`
		} `json:"routing"`
	}
	if err := getJSON(c, p.admin+"/v1/config", &doc); err != nil {
		t.Fatal(err)
	}
	return doc.Routing.PrefixLength
}

// crashID is what the writers did to one backend id. Each id is added
// once, by one writer, and removed at most once after its add was
// acknowledged.
type crashID struct {
	addAcked, removeTried, removeAcked bool
}

// crashWriters write through the routers' admin APIs and keep a ledger of
// what was acknowledged.
type crashWriters struct {
	c        *http.Client
	routers  []*router // the test's slice: it replaces a router only while no writer runs
	backends []string

	mu  sync.Mutex
	ids map[string]*crashID
	own [crashBackendWriters][]string // acknowledged ids each writer may remove
	cfg struct {
		initial, acked int
		tried          map[int]bool
		next           int
	}
	errs []string // answers no write should get

	acked, uncertain atomic.Int64
	seq              atomic.Int64
}

func newCrashWriters(ps []*router, backends []string) *crashWriters {
	w := &crashWriters{
		c:        &http.Client{Timeout: 15 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 8}},
		routers:  ps,
		backends: backends,
		ids:      map[string]*crashID{},
	}
	w.cfg.tried = map[int]bool{}
	w.cfg.next = 2000 // prefix_length: 1024-65536; every change raises it
	return w
}

// run starts the writers and returns a function that stops them and waits
// for their last requests to be answered or to fail. It may be called more
// than once; the test also calls the last one at its end, so no writer
// outlives a test that failed while they ran.
func (w *crashWriters) run(seed uint64) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	for i := range crashBackendWriters + 1 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, uint64(i)))
			for {
				select {
				case <-done:
					return
				default:
				}
				var ok bool
				if i == crashBackendWriters {
					ok = w.patchConfig(rng)
				} else {
					ok = w.backendWrite(i, rng)
				}
				if !ok {
					time.Sleep(20 * time.Millisecond) // a router is down, or no leader: do not spin
				}
			}
		}()
	}
	return sync.OnceFunc(func() { close(done); wg.Wait() })
}

// target picks a router at random; a killed one refuses the connection.
func (w *crashWriters) target(rng *rand.Rand) string {
	return w.routers[rng.IntN(len(w.routers))].admin
}

// do sends one write and reports whether it was acknowledged. A 4xx
// answer other than wantMiss and 409 is recorded as an error: the writers
// send only valid writes. (409 version_skew refuses a routing change while
// a router of the Raft configuration is missing from gossip, as a killed
// one is: its version is unknown. Nothing was written.)
func (w *crashWriters) do(method, url, body string, wantMiss int) bool {
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		w.mu.Lock()
		w.errs = append(w.errs, err.Error())
		w.mu.Unlock()
		return false
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := w.c.Do(req)
	if err != nil {
		w.uncertain.Add(1)
		return false
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	switch {
	case resp.StatusCode/100 == 2:
		w.acked.Add(1)
		return true
	case resp.StatusCode/100 == 4 && resp.StatusCode != wantMiss && resp.StatusCode != http.StatusConflict:
		w.mu.Lock()
		w.errs = append(w.errs, fmt.Sprintf("%s %s %s: %d %s", method, url, body, resp.StatusCode, bytes.TrimSpace(b)))
		w.mu.Unlock()
	}
	w.uncertain.Add(1)
	return false
}

// backendWrite adds a new backend, or removes one of the writer's
// acknowledged ones, through a random router.
func (w *crashWriters) backendWrite(i int, rng *rand.Rand) bool {
	w.mu.Lock()
	own := w.own[i]
	if n := len(own); n >= crashLiveIDs || (n > 0 && rng.IntN(3) == 0) {
		k := rng.IntN(n)
		id := own[k]
		w.own[i] = slices.Delete(own, k, k+1) // never touched again
		w.ids[id].removeTried = true
		w.mu.Unlock()
		// A 404 may answer a remove that a router retried on a new
		// leader after the first attempt committed: uncertain, not wrong.
		acked := w.do("DELETE", w.target(rng)+"/v1/backends/"+id, "", http.StatusNotFound)
		if acked {
			w.mu.Lock()
			w.ids[id].removeAcked = true
			w.mu.Unlock()
		}
		return acked
	}
	id := fmt.Sprintf("crash-w%d-%d", i, w.seq.Add(1))
	w.ids[id] = &crashID{}
	w.mu.Unlock()
	body := fmt.Sprintf(`{"id":%q,"url":%q}`, id, w.backends[rng.IntN(len(w.backends))])
	acked := w.do("POST", w.target(rng)+"/v1/backends", body, 0)
	if acked {
		w.mu.Lock()
		w.ids[id].addAcked = true
		w.own[i] = append(w.own[i], id)
		w.mu.Unlock()
	}
	return acked
}

// patchConfig raises prefix_length by one through a random router.
func (w *crashWriters) patchConfig(rng *rand.Rand) bool {
	w.mu.Lock()
	v := w.cfg.next
	w.cfg.next++
	w.cfg.tried[v] = true
	w.mu.Unlock()
	acked := w.do("PATCH", w.target(rng)+"/v1/config", fmt.Sprintf(`{"prefix_length":%d}`, v), 0)
	if acked {
		w.mu.Lock()
		w.cfg.acked = max(w.cfg.acked, v)
		w.mu.Unlock()
	}
	return acked
}

func (w *crashWriters) counts() (acked, uncertain int64) { return w.acked.Load(), w.uncertain.Load() }

// settled counts the backends check requires to be there (an add
// acknowledged, no remove tried) and not to be (a remove acknowledged).
func (w *crashWriters) settled() (present, absent int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, r := range w.ids {
		switch {
		case r.removeAcked:
			absent++
		case r.addAcked && !r.removeTried:
			present++
		}
	}
	return present, absent
}

// check compares what router p serves with the ledger: every backend whose
// add was acknowledged (and never removed) is there, none whose remove was
// acknowledged is, and the prefix_length is the last one acknowledged or
// one sent after it.
func (w *crashWriters) check(c *http.Client, p *router) error {
	var list struct {
		Epoch    uint64 `json:"epoch"`
		Backends []struct {
			ID string `json:"id"`
		} `json:"backends"`
	}
	if err := getJSON(c, p.admin+"/v1/backends", &list); err != nil {
		return err
	}
	var cfg struct {
		Epoch   uint64 `json:"epoch"`
		Routing struct {
			PrefixLength int `json:"prefix_length"`
		} `json:"routing"`
	}
	if err := getJSON(c, p.admin+"/v1/config", &cfg); err != nil {
		return err
	}
	have := map[string]bool{}
	for _, b := range list.Backends {
		have[b.ID] = true
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	var bad []string
	bad = append(bad, w.errs...)
	for id, r := range w.ids {
		switch {
		case r.removeAcked && have[id]:
			bad = append(bad, fmt.Sprintf("backend %s is back after its remove was acknowledged", id))
		case r.addAcked && !r.removeTried && !have[id]:
			bad = append(bad, fmt.Sprintf("backend %s is missing although its add was acknowledged", id))
		}
	}
	got, last := cfg.Routing.PrefixLength, w.cfg.acked
	switch {
	case last == 0 && got != w.cfg.initial && !w.cfg.tried[got]:
		bad = append(bad, fmt.Sprintf("prefix_length %d was never sent", got))
	case last != 0 && got < last:
		bad = append(bad, fmt.Sprintf("prefix_length %d, but %d was acknowledged since", got, last))
	case last != 0 && got > last && !w.cfg.tried[got]:
		bad = append(bad, fmt.Sprintf("prefix_length %d was never sent", got))
	}
	if len(bad) > 0 {
		slices.Sort(bad)
		return fmt.Errorf("router %s at epoch %d (backends) / %d (config): %d problems: %s",
			p.name, list.Epoch, cfg.Epoch, len(bad), strings.Join(bad[:min(len(bad), 10)], "; "))
	}
	return nil
}
