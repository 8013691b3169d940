package gossip

import (
	"slices"
	"testing"
	"time"
)

func TestStateSumsAndOrdering(t *testing.T) {
	now := time.Now()
	s := selfState("self", "a", "b")
	mustHandle(t, s, publishMsg("a", 1, 1, map[string]int64{"x": 3, "y": 1}), now)
	mustHandle(t, s, publishMsg("b", 1, 1, map[string]int64{"x": 4}), now)
	wantRemote(t, s, "x", 7, "")
	// A newer figure replaces, an older one (reordered packet) is ignored.
	mustHandle(t, s, publishMsg("a", 1, 3, map[string]int64{"x": 10}), now)
	mustHandle(t, s, publishMsg("a", 1, 2, map[string]int64{"x": 99}), now)
	wantRemote(t, s, "x", 14, "")
	// Figures from ourselves and from non-members are not counted.
	mustHandle(t, s, publishMsg("self", 1, 1, map[string]int64{"x": 100}), now)
	mustHandle(t, s, publishMsg("stranger", 1, 1, map[string]int64{"x": 100}), now)
	wantRemote(t, s, "x", 14, "")
	if u, _ := s.counters(); u != 1 {
		t.Errorf("unknown = %d, want 1", u)
	}
	checkSums(t, s)
	s.leave("a")
	if got, y := remote(s, "x"), remote(s, "y"); got != 4 || y != 0 {
		t.Fatalf("after leave x=%d y=%d, want 4 0", got, y)
	}
	if v := s.build(nil); len(v.remoteBackends()) != 1 {
		t.Fatalf("backends %v", v.remoteBackends())
	}
	checkSums(t, s)
}

func TestStateExpiry(t *testing.T) {
	now := time.Now()
	s := selfState("a", "b")
	mustHandle(t, s, publishMsg("a", 1, 1, map[string]int64{"x": 3}), now)
	mustHandle(t, s, publishMsg("b", 1, 1, map[string]int64{"x": 4}), now.Add(800*time.Millisecond))
	s.sweep(now.Add(900 * time.Millisecond))
	wantRemote(t, s, "x", 7, "before expiry")
	s.sweep(now.Add(1500 * time.Millisecond))
	wantRemote(t, s, "x", 4, "after a's figure expired")
	// A refresh with a newer seq keeps a figure alive.
	mustHandle(t, s, publishMsg("b", 1, 2, map[string]int64{"x": 4}), now.Add(1700*time.Millisecond))
	s.sweep(now.Add(2500 * time.Millisecond))
	wantRemote(t, s, "x", 4, "after refresh")
	s.sweep(now.Add(3 * time.Second))
	wantRemote(t, s, "x", 0, "after all expired")
	if age := s.oldestAge(now.Add(3 * time.Second)); age != 0 {
		t.Fatalf("oldest age %v with nothing held", age)
	}
	checkSums(t, s)
}

func TestStateByeAndRestart(t *testing.T) {
	now := time.Now()
	s := selfState("a")
	mustHandle(t, s, publishMsg("a", 5, 10, map[string]int64{"x": 3}), now)
	mustHandle(t, s, byeMsg("a", 5, 11), now)
	wantRemote(t, s, "x", 0, "after bye")
	// A late packet of the same run is ignored after its bye.
	mustHandle(t, s, publishMsg("a", 5, 9, map[string]int64{"x": 3}), now)
	mustHandle(t, s, publishMsg("a", 5, 12, map[string]int64{"x": 3}), now)
	wantRemote(t, s, "x", 0, "from a closed run")
	// A new run of the node counts again, from seq 1.
	mustHandle(t, s, publishMsg("a", 6, 1, map[string]int64{"x": 2}), now)
	wantRemote(t, s, "x", 2, "from the new run")
	// The old run cannot overwrite it while the new one talks...
	mustHandle(t, s, publishMsg("a", 5, 50, map[string]int64{"x": 9}), now.Add(100*time.Millisecond))
	wantRemote(t, s, "x", 2, "after old-run packet")
	// ...but a new run that fell silent is replaced by one that talks.
	mustHandle(t, s, publishMsg("a", 4, 1, map[string]int64{"x": 9}), now.Add(2*time.Second))
	wantRemote(t, s, "x", 9, "")
	checkSums(t, s)
}

func TestStateEngineFreshestWins(t *testing.T) {
	now := time.Now()
	s := selfState("a", "b")
	engineMsg := func(origin string, seq uint64, waiting float64, age time.Duration) []byte {
		sec := appendEngine(nil, "x", EngineStats{OK: true, Known: EngineWaiting, Waiting: waiting}, age)
		body := appendSection(appendBlockHead(nil, origin, 1, seq), tagEngine, sec)
		return appendBlock(appendHeader(nil, kindPublish), body)
	}
	mustHandle(t, s, engineMsg("a", 1, 1, 2*time.Second), now)
	mustHandle(t, s, engineMsg("b", 1, 2, time.Second), now)
	v := s.build(nil)
	e, ok := v.Engine("x")
	if !ok || e.Waiting != 2 || !e.Has(EngineWaiting) || e.Has(EngineKVUsage) {
		t.Fatalf("engine = %+v %v, want b's scrape (waiting 2)", e, ok)
	}
	if d := now.Sub(e.Scraped); d < 999*time.Millisecond || d > 1001*time.Millisecond {
		t.Fatalf("scraped %v ago, want 1s", d)
	}
	// This node's own scrape is newer still.
	s.setLocal("x", EngineStats{OK: true, Known: EngineWaiting, Waiting: 3, Scraped: now})
	if e, _ := s.build(v).Engine("x"); e.Waiting != 3 {
		t.Fatalf("waiting %v, want own scrape 3", e.Waiting)
	}
	// Too old on arrival: ignored; expired: swept.
	mustHandle(t, s, engineMsg("a", 2, 9, 6*time.Second), now)
	s.sweep(now.Add(4500 * time.Millisecond))
	if e, _ := s.build(nil).Engine("x"); e.Waiting != 3 {
		t.Fatalf("waiting %v after a's expiry, want 3", e.Waiting)
	}
	s.sweep(now.Add(6 * time.Second))
	if _, ok := s.build(nil).Engine("x"); ok {
		t.Fatal("engine stats survived expiry")
	}
}

func TestStateRelay(t *testing.T) {
	now := time.Now()
	a := newState("a", 2*time.Second, 5*time.Second)
	a.join("b")
	a.join("c")
	mustHandle(t, a, publishMsg("b", 7, 3, map[string]int64{"x": 3, "y": 2}), now.Add(-500*time.Millisecond))
	mustHandle(t, a, publishMsg("c", 8, 4, map[string]int64{"x": 5}), now)
	state := a.appendRelay(appendHeader(nil, kindState), now)

	d := newState("d", 2*time.Second, 5*time.Second)
	d.join("b")
	d.join("c")
	mustHandle(t, d, state, now)
	v := d.build(nil)
	if v.RemoteInFlight("x") != 8 || v.RemoteInFlight("y") != 2 {
		t.Fatalf("relayed x=%d y=%d, want 8 2", v.RemoteInFlight("x"), v.RemoteInFlight("y"))
	}
	// Relayed figures keep their age: b's expire 0.5 s before c's.
	d.sweep(now.Add(1700 * time.Millisecond))
	if v := d.build(nil); v.RemoteInFlight("x") != 5 || v.RemoteInFlight("y") != 0 {
		t.Fatalf("after b expired x=%d y=%d, want 5 0", v.RemoteInFlight("x"), v.RemoteInFlight("y"))
	}
	// And their seq: an older direct packet does not overwrite them.
	mustHandle(t, d, publishMsg("c", 8, 3, map[string]int64{"x": 50}), now)
	wantRemote(t, d, "x", 5, "")
	checkSums(t, d)
}

func TestStateBuildOnlyOnChange(t *testing.T) {
	now := time.Now()
	s := selfState("a")
	v1 := s.build(nil)
	if s.build(v1) != nil {
		t.Fatal("built a View with nothing changed")
	}
	mustHandle(t, s, publishMsg("a", 1, 1, map[string]int64{"x": 3}), now)
	v2 := s.build(v1)
	if v2 == nil || v2.version != v1.version+1 || v2.RemoteInFlight("x") != 3 {
		t.Fatalf("v2 = %+v", v2)
	}
	// The same figure again (a refresh) changes nothing.
	changed, _ := s.handle(publishMsg("a", 1, 2, map[string]int64{"x": 3}), now)
	if changed || s.build(v2) != nil {
		t.Fatal("a refresh with the same figure built a new View")
	}
	if v1.RemoteInFlight("x") != 0 {
		t.Fatal("an old View changed")
	}
}

func TestStateViewsSurviveBackendChurn(t *testing.T) {
	now := time.Now()
	s := selfState("a", "b")
	mustHandle(t, s, publishMsg("a", 1, 1, map[string]int64{"x": 1, "y": 2, "z": 3}), now)
	v1 := s.build(nil)
	// y and z go (a leaves, b never had them), w and x come from b.
	s.leave("a")
	mustHandle(t, s, publishMsg("b", 1, 1, map[string]int64{"w": 4, "x": 5}), now)
	v2 := s.build(v1)
	for b, want := range map[string]int64{"x": 1, "y": 2, "z": 3, "w": 0} {
		if got := v1.RemoteInFlight(b); got != want {
			t.Errorf("old view: %s = %d, want %d", b, got, want)
		}
	}
	for b, want := range map[string]int64{"x": 5, "y": 0, "z": 0, "w": 4} {
		if got := v2.RemoteInFlight(b); got != want {
			t.Errorf("new view: %s = %d, want %d", b, got, want)
		}
	}
	if got := v2.remoteBackends(); len(got) != 2 || got[0] != "w" || got[1] != "x" {
		t.Errorf("backends %v", got)
	}
	if len(s.slots) != 2 {
		t.Errorf("%d slots after compaction, want 2", len(s.slots))
	}
	checkSums(t, s)
}

func TestStateHealth(t *testing.T) {
	now := time.Now()
	s := selfState("self", "a", "b", "c")
	mustHandle(t, s, healthMsg("a", 1, 1, map[string]int64{"x": 1, "y": 0}, "x"), now)
	mustHandle(t, s, healthMsg("b", 1, 1, map[string]int64{"x": 2, "y": 0}), now)
	v1 := s.build(nil)
	if h := v1.Health("x"); !slices.Equal(h.Failing, []string{"a"}) || !slices.Equal(h.Healthy, []string{"b"}) {
		t.Fatalf("x health = %+v", h)
	}
	if h := v1.Health("y"); len(h.Failing) != 0 || !slices.Equal(h.Healthy, []string{"a", "b"}) {
		t.Fatalf("y health = %+v", h)
	}
	// A backend no node sent a figure for (idle on every router) is
	// healthy in the eyes of every node heard from: silence is not a
	// failing verdict, and one router's failing verdict stays a minority.
	// c, never heard from, votes on nothing.
	if h := v1.Health("unknown"); h.Failing != nil || !slices.Equal(h.Healthy, []string{"a", "b"}) {
		t.Fatalf("unknown backend health = %+v", h)
	}

	// A load change alone keeps the health version; a verdict change
	// moves it.
	mustHandle(t, s, healthMsg("b", 1, 2, map[string]int64{"x": 3, "y": 0}), now)
	v2 := s.build(v1)
	if v2.HealthVersion() != v1.HealthVersion() {
		t.Fatalf("health version moved on a load change: %d -> %d", v1.HealthVersion(), v2.HealthVersion())
	}
	mustHandle(t, s, healthMsg("a", 1, 2, map[string]int64{"x": 1, "y": 0}, "y"), now)
	v3 := s.build(v2)
	if v3.HealthVersion() == v2.HealthVersion() {
		t.Fatal("health version did not move when a verdict changed")
	}
	if h := v3.Health("x"); len(h.Failing) != 0 || !slices.Equal(h.Healthy, []string{"a", "b"}) {
		t.Fatalf("x health after recovery = %+v", h)
	}
	if h := v3.Health("y"); !slices.Equal(h.Failing, []string{"a"}) {
		t.Fatalf("y health = %+v", h)
	}

	// A relayed figure (push/pull) carries no health: it neither clears
	// nor sets a verdict.
	var rel []byte
	rel = appendLoadRelay(rel, "y", 5, 9, 0)
	relay := appendBlock(appendHeader(nil, kindState), appendSection(appendBlockHead(nil, "a", 1, 9), tagLoadsRelay, rel))
	mustHandle(t, s, relay, now)
	if h := s.build(v3).Health("y"); !slices.Equal(h.Failing, []string{"a"}) {
		t.Fatalf("relay changed y's health: %+v", h)
	}

	// A node that leaves, or whose figures expire, stops reporting.
	s.leave("a")
	v4 := s.build(nil)
	if h := v4.Health("y"); len(h.Failing) != 0 || !slices.Equal(h.Healthy, []string{"b"}) {
		t.Fatalf("y health after a left = %+v", h)
	}
	s.sweep(now.Add(2 * time.Second))
	if h := s.build(v4).Health("x"); h.Healthy != nil || h.Failing != nil {
		t.Fatalf("x health after expiry = %+v", h)
	}
}
