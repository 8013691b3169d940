package gossip

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"
)

// Figures travel when they change, not at the next publish: a peer stops
// counting a request as soon as it ends. The lag itself is measured by
// BenchmarkDecreaseLag and BenchmarkOvercount (docs/gossip.md), not here.

// slowPublish makes every path but the prompt one a minute apart:
// publishes, refreshes and push/pull. Only figures sent when they change
// can then reach another node within the tests' bounds.
func slowPublish(c *Config) {
	c.PublishInterval = time.Minute
	c.RefreshInterval = time.Minute
	c.ExpireAfter = 5 * time.Minute
	c.PushPullInterval = time.Minute
}

func TestChangesTravelBeforeTheNextPublish(t *testing.T) {
	for _, signed := range []bool{false, true} {
		t.Run(fmt.Sprintf("signed=%v", signed), func(t *testing.T) {
			mod := slowPublish
			if signed {
				mod = withIdentity(t, newTestCA(t), slowPublish)
			}
			nodes := startNodes(t, 3, mod)
			a := nodes[0]
			// Requests start and end on A one after another; after the
			// last ends nobody counts any.
			for _, v := range []int64{1, 2, 3, 2, 1, 0} {
				a.src.set("x", v)
				for _, nd := range nodes[1:] {
					waitFor(t, 10*time.Second, func() bool { return nd.c.View().RemoteInFlight("x") == v },
						"%s sees x=%d from A", nd.c.Name(), v)
				}
			}
			// A backend that leaves A's source is sent as 0 at once.
			a.src.set("y", 2)
			waitFor(t, 10*time.Second, func() bool { return nodes[1].c.View().RemoteInFlight("y") == 2 }, "B sees y=2")
			a.src.remove("y")
			for _, nd := range nodes[1:] {
				waitFor(t, 10*time.Second, func() bool { return nd.c.View().RemoteInFlight("y") == 0 },
					"%s sees y gone from A", nd.c.Name())
			}
		})
	}
}

// TestBurstSettlesAtTrueCount: routers A and B start and end requests on
// two backends from several goroutines at once; once they stop, every
// router's view (own + remote) of each backend settles at the fleet's
// true count and stays there: no ended request is left counted, no
// figure is summed twice.
func TestBurstSettlesAtTrueCount(t *testing.T) {
	nodes := startNodes(t, 3, nil)
	backends := []string{"x", "y"}
	var (
		mu  sync.Mutex
		own = map[string][]int64{"x": make([]int64, 3), "y": make([]int64, 3)}
	)
	move := func(r int, b string, d int64) {
		mu.Lock()
		own[b][r] += d
		nodes[r].src.set(b, own[b][r])
		mu.Unlock()
	}
	const perWorker = 150
	var wg sync.WaitGroup
	for w := range 4 {
		r := w % 2 // A and B take requests; C only watches
		wg.Go(func() {
			var open []string
			for range perWorker {
				if len(open) > 0 && rand.N(2) == 0 {
					b := open[len(open)-1]
					open = open[:len(open)-1]
					move(r, b, -1)
				} else {
					b := backends[rand.N(len(backends))]
					open = append(open, b)
					move(r, b, 1)
				}
				time.Sleep(rand.N(2 * time.Millisecond))
			}
		})
	}
	wg.Wait()
	view := func(i int, b string) int64 { return own[b][i] + nodes[i].c.View().RemoteInFlight(b) }
	settled := func() bool {
		for _, b := range backends {
			fleet := own[b][0] + own[b][1] + own[b][2]
			for i := range nodes {
				if view(i, b) != fleet {
					return false
				}
			}
		}
		return true
	}
	waitFor(t, 10*time.Second, settled, "every router's view settles at the fleet's count (%v)", own)
	// Resends and a refresh follow; none may bring back an older figure.
	deadline := time.Now().Add(2 * nodes[0].c.cfg.RefreshInterval)
	for time.Now().Before(deadline) {
		if !settled() {
			t.Fatalf("a view left the fleet's count after settling (own %v; A sees x=%d y=%d)",
				own, view(0, "x"), view(0, "y"))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestOlderFiguresArrivingLateAreIgnored: a change sent at once overtakes
// the publish before it; when that older publish (or a push/pull state
// relaying its figures) arrives later, it must not bring the ended
// requests back.
func TestOlderFiguresArrivingLateAreIgnored(t *testing.T) {
	src := newFakeSource()
	src.set("x", 3)
	src.set("y", 1)
	cfg := DefaultConfig()
	p := newPublisher("a", 1, src, &cfg)
	now := time.Now()
	clone := func(pkts [][]byte) [][]byte {
		out := make([][]byte, len(pkts))
		for i, b := range pkts {
			out[i] = bytes.Clone(b)
		}
		return out
	}
	older := clone(p.next(now)) // seq 1: x=3, y=1
	src.set("x", 0)
	newer := clone(p.changes(now)) // seq 2: x=0 alone
	if got := sent(t, newer); !equalMap(got, map[string]int64{"x": 0}) {
		t.Fatalf("the change sent %v, want x=0 alone", got)
	}

	// C heard only the older publish; B hears the newer one first.
	c := selfState("c", "a")
	for _, b := range older {
		mustHandle(t, c, b, now)
	}
	relay := c.appendRelay(appendHeader(nil, kindState), now)
	b := selfState("b", "a", "c")
	for _, pkt := range newer {
		mustHandle(t, b, pkt, now)
	}
	for _, pkt := range append(older, relay) {
		mustHandle(t, b, pkt, now.Add(time.Millisecond))
	}
	wantRemote(t, b, "x", 0, "after the older publish and relay arrived")
	// What the older publish alone carried still counts.
	wantRemote(t, b, "y", 1, "")
	checkSums(t, b)

	// The same between real routers: packets A sent while x=3 reach B
	// again after x=0 did.
	nodes := startNodes(t, 2, func(c *Config) { c.SecretKey = testKey })
	na, nb := nodes[0], nodes[1]
	var capt capture
	capt.start(na, nb.c.Addr())
	na.src.set("x", 3)
	waitFor(t, 10*time.Second, func() bool { return nb.c.View().RemoteInFlight("x") == 3 }, "B sees x=3")
	old := capt.stop(t, na)
	na.src.set("x", 0)
	waitFor(t, 10*time.Second, func() bool { return nb.c.View().RemoteInFlight("x") == 0 }, "B sees x=0")
	// The replay, then a marker from the same socket: B reads its packets
	// in order, so once the marker counts the replay has been applied.
	marker := forge(t, publishMsg(na.c.Name(), na.c.pub.instance, 1<<40, map[string]int64{"marker": 1}))
	sendRaw(t, nb.c.Addr(), append(old, marker)...)
	waitFor(t, 10*time.Second, func() bool { return nb.c.View().RemoteInFlight("marker") == 1 }, "B applies the marker")
	if got := nb.c.View().RemoteInFlight("x"); got != 0 {
		t.Fatalf("%d packets from before x=0 arrived late and B counts x=%d", len(old), got)
	}
}

func TestPublisherSendsChangesAtOnce(t *testing.T) {
	src := newFakeSource()
	src.set("x", 1)
	src.set("y", 2)
	cfg := DefaultConfig()
	cfg.ResendCount = 3
	cfg.RefreshInterval = 10 * cfg.PublishInterval
	p := newPublisher("a", 1, src, &cfg)
	now := time.Now()
	steps := []struct {
		tick bool
		set  func()
		want map[string]int64
	}{
		{true, nil, map[string]int64{"x": 1, "y": 2}}, // tick 1: full
		{false, nil, nil}, // nothing changed since
		{false, func() { src.set("x", 0) }, map[string]int64{"x": 0}},
		// Changes between two reads that end where they began are no news.
		{false, func() { src.set("x", 5); src.set("x", 0) }, nil},
		{false, func() { src.set("y", 5) }, map[string]int64{"y": 5}},
		// Ticks repeat a change (loss repair) until it was sent
		// ResendCount times, the first send included.
		{true, nil, map[string]int64{"x": 0, "y": 5}}, // tick 2
		{false, func() { src.remove("y") }, map[string]int64{"y": 0}},
		{true, nil, map[string]int64{"x": 0, "y": 0}}, // tick 3: x's third send
		{true, nil, map[string]int64{"y": 0}},         // tick 4: y's third
		{true, nil, nil},                              // tick 5: y forgotten
		{false, func() { src.set("y", 1) }, map[string]int64{"y": 1}},
	}
	for i, s := range steps {
		if s.set != nil {
			s.set()
		}
		var got map[string]int64
		if s.tick {
			got = sent(t, p.next(now))
		} else {
			got = sent(t, p.changes(now))
		}
		if !equalMap(got, s.want) {
			t.Errorf("step %d (tick %v) sent %v, want %v", i, s.tick, got, s.want)
		}
	}
	if p.seq != 8 {
		t.Errorf("seq = %d after 8 publishes", p.seq)
	}
}
