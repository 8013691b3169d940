package gossip

import (
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
