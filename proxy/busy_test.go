package proxy

import (
	"sync"
	"testing"
	"time"
)

// TestBusyFollowsInFlight checks the busy estimate: a scrape that saw a
// queue anchors it at the in-flight count then less the queue, requests
// ending drain it and new ones grow it without a new scrape, copies of the
// scrape re-sent by gossip do not re-anchor it, and a scrape without a
// queue, a failed one or a hostile figure end or bound it.
func TestBusyFollowsInFlight(t *testing.T) {
	p := totalsProxy(t)
	setTotalsRing(t, p, totalsRingConfig(), totalsBackends([]int{1, 2}), 1)
	id := "gpu-1/"
	busy := func() bool {
		t.Helper()
		for _, s := range p.Status() {
			if s.ID == id {
				return s.Busy
			}
		}
		t.Fatalf("no status for %s", id)
		return false
	}
	tab := p.tab.Load()
	i, _ := tab.ring.Index(id)
	own := tab.bs[i]
	t0 := time.Now()

	if busy() {
		t.Fatal("busy before any scrape")
	}
	// 10 in flight (6 of them on other routers), 3 queued: the engine
	// runs 7.
	own.inflight.Add(4)
	p.SetRemote(id, 6, EngineQueue{Waiting: 3, Scraped: t0})
	if !busy() {
		t.Fatal("not busy with the scrape's queue still in flight")
	}
	// Two requests end on other routers; gossip re-sends the same scrape
	// with its time a few milliseconds off.
	p.SetRemote(id, 4, EngineQueue{Waiting: 3, Scraped: t0.Add(3 * time.Millisecond)})
	if !busy() {
		t.Fatal("not busy at 8 in flight, one queued")
	}
	// One more ends here: 7 in flight, what the engine runs.
	own.inflight.Add(-1)
	if busy() {
		t.Fatal("busy once the queue drained (7 in flight)")
	}
	// A new request queues again, before any new scrape.
	own.inflight.Add(1)
	if !busy() {
		t.Fatal("not busy at 8 in flight")
	}
	// The next scrape sees no queue: not busy, whatever is in flight.
	p.SetRemote(id, 20, EngineQueue{Scraped: t0.Add(time.Second)})
	if busy() {
		t.Fatal("busy after a scrape without a queue")
	}
	// A later scrape re-anchors: 24 in flight, 2 queued.
	p.SetRemote(id, 20, EngineQueue{Waiting: 2, Scraped: t0.Add(2 * time.Second)})
	if !busy() {
		t.Fatal("not busy after a new scrape with a queue")
	}
	p.SetRemote(id, 18, EngineQueue{Waiting: 2, Scraped: t0.Add(2*time.Second - time.Millisecond)})
	if busy() {
		t.Fatal("busy at 22 in flight with 22 running at the scrape")
	}
	// A failed scrape (no figures) ends the estimate.
	p.SetRemote(id, 30, EngineQueue{})
	if busy() {
		t.Fatal("busy without engine figures")
	}
	// A queue larger than anything in flight (work from elsewhere, or a
	// hostile figure) makes any request of ours wait: busy while one is
	// in flight, and not once none is.
	p.SetRemote(id, 0, EngineQueue{Waiting: 1 << 62, Scraped: t0.Add(3 * time.Second)})
	if !busy() {
		t.Fatal("not busy with our requests behind a huge queue")
	}
	own.inflight.Add(-own.inflight.Load())
	if busy() {
		t.Fatal("busy with nothing in flight")
	}
	// The other backend never had figures.
	if s := p.Status(); s[0].ID == s[1].ID || (s[0].ID != id && s[0].Busy) || (s[1].ID != id && s[1].Busy) {
		t.Fatalf("status %+v", s)
	}
}

// triggerLog records the scrapes a proxy asks for.
type triggerLog struct {
	mu  sync.Mutex
	ids []string
}

func (l *triggerLog) TriggerScrape(id string) {
	l.mu.Lock()
	l.ids = append(l.ids, id)
	l.mu.Unlock()
}

func (l *triggerLog) len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.ids)
}

// TestLearnedCapacity checks what scrapes teach: an engine that queues
// while it runs N requests has capacity N; one that later runs more
// without a queue has room for them; a copy of a scrape teaches nothing;
// the backend is pressed once the cluster's in-flight count reaches the
// capacity, queue or not; and a count past the highest level seen without
// a queue asks for a scrape, at most every triggerGap.
func TestLearnedCapacity(t *testing.T) {
	p := totalsProxy(t)
	setTotalsRing(t, p, totalsRingConfig(), totalsBackends([]int{1, 2}), 1)
	id := "gpu-1/"
	status := func() BackendStatus {
		t.Helper()
		for _, s := range p.Status() {
			if s.ID == id {
				return s
			}
		}
		t.Fatalf("no status for %s", id)
		return BackendStatus{}
	}
	var log triggerLog
	p.SetScrapeTrigger(&log)
	tab := p.tab.Load()
	i, _ := tab.ring.Index(id)
	own := tab.bs[i]
	t0 := time.Now()

	if s := status(); s.Capacity != 0 || s.Pressed {
		t.Fatalf("before any scrape: %+v", s)
	}
	// Before the engine gave any figure, a rise asks for no scrape: there
	// is no level to pass.
	own.rising(&log, 5, t0.UnixNano())
	if log.len() != 0 {
		t.Fatalf("%d scrapes asked for before the engine gave a figure", log.len())
	}
	// A quiet scrape at 3 in flight: nothing learnt of the capacity, but 3
	// is the highest level seen without a queue.
	p.SetRemote(id, 3, EngineQueue{Running: 3, Scraped: t0})
	if s := status(); s.Capacity != 0 || s.Pressed {
		t.Fatalf("after a quiet scrape: %+v", s)
	}
	asked := log.len()
	p.SetRemote(id, 3, EngineQueue{Running: 3, Scraped: t0})
	if log.len() != asked {
		t.Fatal("a scrape was asked for at the level seen without a queue")
	}
	// 6 in flight: past it, a scrape is asked for, once within triggerGap.
	now := time.Now().UnixNano()
	own.rising(&log, 6, now)
	own.rising(&log, 7, now+int64(triggerGap)/2)
	if log.len() != asked+1 {
		t.Fatalf("%d scrapes asked for past the quiet level within triggerGap, want 1", log.len()-asked)
	}
	own.rising(&log, 7, now+int64(triggerGap))
	if log.len() != asked+2 {
		t.Fatal("no scrape asked for after triggerGap")
	}
	// The engine queues 2 while it runs 4: capacity 4.
	p.SetRemote(id, 6, EngineQueue{Waiting: 2, Running: 4, Scraped: t0.Add(time.Second)})
	if s := status(); s.Capacity != 4 || !s.Pressed || !s.Busy {
		t.Fatalf("after a queue at 4 running: %+v", s)
	}
	// A copy of that scrape re-sent with other figures teaches nothing.
	p.SetRemote(id, 6, EngineQueue{Waiting: 2, Running: 9, Scraped: t0.Add(time.Second + time.Millisecond)})
	if s := status(); s.Capacity != 4 {
		t.Fatalf("a copy of a scrape changed the capacity: %+v", s)
	}
	// No queue any more, 4 in flight: not busy, but at its capacity.
	p.SetRemote(id, 4, EngineQueue{Running: 4, Scraped: t0.Add(2 * time.Second)})
	if s := status(); s.Busy || !s.Pressed || s.Capacity != 4 {
		t.Fatalf("at capacity without a queue: %+v", s)
	}
	p.SetRemote(id, 3, EngineQueue{Running: 3, Scraped: t0.Add(3 * time.Second)})
	if s := status(); s.Pressed {
		t.Fatalf("under its capacity: %+v", s)
	}
	// It runs 6 without a queue: it had room, the capacity rises.
	p.SetRemote(id, 6, EngineQueue{Running: 6, Scraped: t0.Add(4 * time.Second)})
	if s := status(); s.Capacity != 6 {
		t.Fatalf("after running 6 without a queue: %+v", s)
	}
}

// TestStatusWithoutThreshold: with ConcurrencyThreshold not set (0) a
// backend's limit reads 0 in Status, it is pressed only by its queue or
// learned capacity, and no limit gauge is exported.
func TestStatusWithoutThreshold(t *testing.T) {
	p := totalsProxy(t)
	cfg := totalsRingConfig()
	cfg.ConcurrencyThreshold = 0
	setTotalsRing(t, p, cfg, totalsBackends([]int{1, 2}), 1)
	id := "gpu-1/"
	p.SetRemote(id, 5000, EngineQueue{Running: 5000, Scraped: time.Now()})
	for _, s := range p.Status() {
		if s.Limit != 0 {
			t.Fatalf("%s: limit %d without a threshold", s.ID, s.Limit)
		}
		if s.ID == id && s.Pressed {
			t.Fatalf("pressed at 5000 in flight with no queue, limit or capacity: %+v", s)
		}
	}
}

// TestBusyAnchorAgreesAcrossRouters: two routers take the same scrape (a
// queue while the engine ran 7) at different moments, one a request
// later than the other; once their in-flight counts agree again, so do
// their queue estimates, for the anchor is what the engine ran, not the
// count when the scrape arrived.
func TestBusyAnchorAgreesAcrossRouters(t *testing.T) {
	id := "gpu-1/"
	router := func() (*Proxy, *backend) {
		p := totalsProxy(t)
		setTotalsRing(t, p, totalsRingConfig(), totalsBackends([]int{1, 2}), 1)
		tab := p.tab.Load()
		i, _ := tab.ring.Index(id)
		return p, tab.bs[i]
	}
	pa, a := router()
	pb, b := router()
	t0 := time.Now()
	scrape := EngineQueue{Waiting: 3, Running: 7, Scraped: t0}
	// a takes the scrape at 10 in flight (4 its own); b a request later,
	// at 11 (its own 5, the other 6 as gossip reports them).
	a.inflight.Add(4)
	pa.SetRemote(id, 6, scrape)
	b.inflight.Add(5)
	pb.SetRemote(id, 6, scrape)
	// a learns of b's request: both count 11 in flight.
	pa.SetRemote(id, 7, scrape)
	if qa, qb := a.queued(), b.queued(); qa != 4 || qb != 4 {
		t.Fatalf("queued %d and %d at 11 in flight with 7 running, want 4 and 4", qa, qb)
	}
	// Requests end: both drain alike, to no queue at 7.
	pa.SetRemote(id, 3, scrape)
	pb.SetRemote(id, 2, scrape)
	if qa, qb := a.queued(), b.queued(); qa != 0 || qb != 0 {
		t.Fatalf("queued %d and %d at 7 in flight, want 0 and 0", qa, qb)
	}
	// An engine busy with work that bypasses the routers: it runs 8 and
	// queues 8 while the routers have 3 in flight. Their requests wait
	// behind that queue: the anchor comes from the counts, not from R.
	pa.SetRemote(id, 0, EngineQueue{Waiting: 8, Running: 8, Scraped: t0.Add(time.Second)})
	a.inflight.Add(3 - a.inflight.Load())
	if !a.busy() {
		t.Fatalf("not busy with 3 in flight behind a queue of 8 from elsewhere (queued %d)", a.queued())
	}
}
