package gossip

import (
	"net/netip"
	"testing"
	"time"
)

// sent decodes one publish into backend -> figure (nil map: nothing sent).
func sent(t *testing.T, pkts [][]byte) map[string]int64 {
	t.Helper()
	if len(pkts) == 0 {
		return nil
	}
	out := map[string]int64{}
	var m wireMsg
	for _, p := range pkts {
		if err := m.decode(p); err != nil {
			t.Fatal(err)
		}
		for _, l := range m.blocks[0].loads {
			out[string(l.backend)] = l.inFlight
		}
	}
	return out
}

func TestPublisherResendAndRefresh(t *testing.T) {
	src := newFakeSource()
	src.set("x", 1)
	src.set("y", 2)
	cfg := DefaultConfig()
	cfg.ResendCount = 2
	cfg.RefreshInterval = 5 * cfg.PublishInterval
	p := newPublisher("a", 1, src, &cfg)
	now := time.Now()
	var got []map[string]int64
	for tick := 1; tick <= 11; tick++ {
		switch tick {
		case 3:
			src.set("x", 5)
		case 8:
			src.remove("y")
		}
		got = append(got, sent(t, p.next(now)))
	}
	want := []map[string]int64{
		{"x": 1, "y": 2}, // 1: first publish is full
		{"x": 1, "y": 2}, // 2: both still "changed" (new)
		{"x": 5},         // 3: x changed
		{"x": 5},         // 4: resent once
		nil,              // 5: nothing to say
		{"x": 5, "y": 2}, // 6: refresh
		nil,              // 7
		{"y": 0},         // 8: y removed: sent as 0
		{"y": 0},         // 9: resent
		nil,              // 10: y forgotten
		{"x": 5},         // 11: refresh, without y
	}
	for i := range want {
		if !equalMap(got[i], want[i]) {
			t.Errorf("tick %d sent %v, want %v", i+1, got[i], want[i])
		}
	}
	if p.seq != 8 {
		t.Errorf("seq = %d after 8 publishes", p.seq)
	}
}

func equalMap(a, b map[string]int64) bool {
	if (a == nil) != (b == nil) || len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

func TestPublisherEngineExpires(t *testing.T) {
	cfg := DefaultConfig()
	p := newPublisher("a", 1, nil, &cfg)
	now := time.Now()
	p.setEngine("x", EngineStats{OK: true, Scraped: now})
	var m wireMsg
	pkts := p.next(now)
	if len(pkts) != 1 {
		t.Fatalf("%d packets", len(pkts))
	}
	if err := m.decode(pkts[0]); err != nil || len(m.blocks[0].engines) != 1 {
		t.Fatalf("decode: %v, %d engines", err, len(m.blocks[0].engines))
	}
	if pkts := p.next(now.Add(cfg.EngineExpireAfter)); len(pkts) != 0 {
		t.Fatalf("expired engine stats still sent (%d packets)", len(pkts))
	}
	if len(p.engines) != 0 {
		t.Fatal("expired engine stats kept")
	}
}

func TestPublisherEngineOnlyChangesTravel(t *testing.T) {
	cfg := DefaultConfig()
	cfg.RefreshInterval = 10 * cfg.PublishInterval
	p := newPublisher("a", 1, nil, &cfg)
	now := time.Now()
	engines := func() int {
		n := 0
		var m wireMsg
		for _, pkt := range p.next(now) {
			if err := m.decode(pkt); err != nil {
				t.Fatal(err)
			}
			n += len(m.blocks[0].engines)
		}
		return n
	}
	st := EngineStats{OK: true, Known: EngineWaiting, Waiting: 2, Scraped: now}
	p.setEngine("x", st)
	for range cfg.ResendCount {
		if engines() != 1 {
			t.Fatal("new engine stats not sent")
		}
	}
	// A new scrape with the same figures is not news.
	st.Scraped = now.Add(time.Second)
	p.setEngine("x", st)
	if n := engines(); n != 0 {
		t.Fatalf("unchanged figures sent %d times", n)
	}
	if got := p.engines["x"].s.Scraped; !got.Equal(st.Scraped) {
		t.Fatalf("scrape time not refreshed: %v", got)
	}
	st.Waiting = 3
	p.setEngine("x", st)
	if engines() != 1 {
		t.Fatal("changed figures not sent")
	}
}

// TestPublisherSettledZeroNotRefreshed: a figure at 0 travels when it
// changes and at the refreshes of the next two refresh periods, then no
// more (receivers count a figure they do not hold as 0), while a
// figure that counts a request or a failing verdict is refreshed for as
// long as it does; the push/pull state leaves settled zeros out too.
func TestPublisherSettledZeroNotRefreshed(t *testing.T) {
	src := newFakeSource()
	src.set("busy", 2)
	src.set("idle", 0)
	src.setFailing("down", 0, true)
	cfg := DefaultConfig()
	cfg.ResendCount = 1
	cfg.RefreshInterval = 4 * cfg.PublishInterval
	p := newPublisher("a", 1, src, &cfg)
	p.skipZeros.Store(true)
	now := time.Now()
	refreshes := map[int]map[string]int64{}
	for tick := 1; tick <= 21; tick++ {
		if tick == 6 {
			src.set("busy", 0) // the last request ended
		}
		if got := sent(t, p.next(now)); tick%4 == 1 {
			refreshes[tick] = got
		}
	}
	want := map[int]map[string]int64{
		1:  {"busy": 2, "idle": 0, "down": 0}, // new: everything
		5:  {"busy": 2, "idle": 0, "down": 0}, // idle changed at tick 1: still within two refreshes
		9:  {"busy": 0, "down": 0},            // idle settled; busy went to 0 at tick 6
		13: {"busy": 0, "down": 0},
		17: {"down": 0}, // busy settled too; the failing verdict stays
		21: {"down": 0},
	}
	for tick, w := range want {
		if !equalMap(refreshes[tick], w) {
			t.Errorf("refresh at tick %d sent %v, want %v", tick, refreshes[tick], w)
		}
	}
	var m wireMsg
	if err := m.decode(append(appendHeader(nil, kindState), p.ownBlock(nil, now, nil)...)); err != nil {
		t.Fatal(err)
	}
	var inState []string
	for _, l := range m.blocks[0].loads {
		inState = append(inState, string(l.backend))
	}
	if len(inState) != 1 || inState[0] != "down" {
		t.Errorf("push/pull state carries %v, want only the failing backend", inState)
	}
}

// TestChangeInterval: changes go out every ChangeDelay up to the cluster
// size at which every peer's changes would exceed ChangeBudget publishes
// per second at a receiver; beyond it the interval grows with the number
// of peers, up to PublishInterval.
func TestChangeInterval(t *testing.T) {
	cfg := DefaultConfig()
	c := &Mesh{cfg: cfg}
	for _, tc := range []struct {
		peers int
		want  time.Duration
	}{
		{0, 5 * time.Millisecond},
		{2, 5 * time.Millisecond},
		{10, 5 * time.Millisecond},
		{19, 9500 * time.Microsecond},
		{49, 24500 * time.Microsecond},
		{500, 50 * time.Millisecond},
	} {
		list := make([]netip.AddrPort, tc.peers)
		c.members.sendList.Store(&list)
		if got := c.changeInterval(); got != tc.want {
			t.Errorf("%d peers: interval %v, want %v", tc.peers, got, tc.want)
		}
	}
}

// TestPublisherKeepalive: a node with nothing to refresh still sends one
// bare packet at every refresh, so the others keep counting its silence
// about a backend as a healthy verdict (View.Health).
func TestPublisherKeepalive(t *testing.T) {
	src := newFakeSource()
	src.set("idle", 0)
	cfg := DefaultConfig()
	cfg.RefreshInterval = 2 * cfg.PublishInterval
	p := newPublisher("a", 1, src, &cfg)
	p.skipZeros.Store(true)
	now := time.Now()
	for tick := 1; tick <= 12; tick++ {
		got := sent(t, p.next(now))
		switch {
		case tick <= 3: // new, resent, and refreshed within two refreshes
			if v, ok := got["idle"]; !ok || v != 0 || len(got) != 1 {
				t.Errorf("tick %d sent %v", tick, got)
			}
		case tick%2 == 1: // a refresh: a keepalive without figures
			if got == nil || len(got) != 0 {
				t.Errorf("refresh at tick %d sent %v, want a bare packet", tick, got)
			}
		default:
			if got != nil {
				t.Errorf("tick %d sent %v, want nothing", tick, got)
			}
		}
	}
}

// TestPublisherRefreshesZerosForOlderMembers: while some member does not
// count silence as a healthy verdict (an earlier version), every figure,
// zeros included, is refreshed as before; once every member does, settled
// zeros are left out.
func TestPublisherRefreshesZerosForOlderMembers(t *testing.T) {
	src := newFakeSource()
	src.set("idle", 0)
	cfg := DefaultConfig()
	cfg.ResendCount = 1
	cfg.RefreshInterval = 2 * cfg.PublishInterval
	p := newPublisher("a", 1, src, &cfg)
	now := time.Now()
	for tick := 1; tick <= 9; tick++ {
		got := sent(t, p.next(now))
		if v, ok := got["idle"]; tick%2 == 1 && (!ok || v != 0) {
			t.Errorf("refresh at tick %d sent %v, want the zero", tick, got)
		}
	}
	p.skipZeros.Store(true)
	p.next(now)
	if got := sent(t, p.next(now)); len(got) != 0 {
		t.Errorf("refresh with every member counting silence sent %v, want none", got)
	}
}

// TestAllCountSilence: settled zeros are left out only while every other
// member advertises Meta.Votes; this node's own entry, and a member with
// metadata that does not decode, count as they should.
func TestAllCountSilence(t *testing.T) {
	meta := func(m Meta) []byte {
		b, err := encodeMeta(m)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	var at netip.AddrPort
	peers := map[string]peer{
		"self": newPeer(at, meta(Meta{})),
		"b":    newPeer(at, meta(Meta{Wire: wireVersion, Votes: silenceVotes})),
	}
	if !allCountSilence(peers, "self") {
		t.Error("every other member counts silence, yet zeros would be refreshed")
	}
	peers["old"] = newPeer(at, meta(Meta{Wire: wireVersion}))
	if allCountSilence(peers, "self") {
		t.Error("a member of an earlier version would miss idle routers' votes")
	}
	peers["old"] = newPeer(at, []byte("{"))
	if allCountSilence(peers, "self") {
		t.Error("a member whose metadata does not decode counted as voting on silence")
	}
}
