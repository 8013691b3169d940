package proxy

import (
	"math"
	"testing"
	"time"

	"github.com/warmroute/warmroute/internal/backendspec"
)

func TestRecomputeCostUnits(t *testing.T) {
	var c recomputeCost
	if got := c.units(4000, true); got != 1 {
		t.Fatalf("first request: units %d, want 1 (no mean yet)", got)
	}
	// The mean is 4000 bytes; no owner has reported: h = 0.5, so the cost
	// is twice the body's size in mean requests.
	for _, tc := range []struct {
		body, want int64
	}{{4000, 2}, {12000, 6}, {1000, 1}, {40000, 20}} {
		if got := c.units(tc.body, false); got != tc.want {
			t.Errorf("h unknown: units(%d) = %d, want %d", tc.body, got, tc.want)
		}
	}

	// Owners' answers cache 90% of their prompts: moving an average
	// request forfeits ten times an average request's remaining work.
	hot := usageReport{result: usageOK, prompt: 1000, cached: 900}
	for i := 0; i < 10; i++ {
		c.observe(kindAffinity, hot)
	}
	if h := c.ownerHitPermille(); h != 900 {
		t.Fatalf("owner hit %d permille, want 900", h)
	}
	if got := c.units(4000, false); got != 10 {
		t.Errorf("h = 0.9: units(mean) = %d, want 10", got)
	}
	if got := c.units(8000, false); got != 20 {
		t.Errorf("h = 0.9: units(2 x mean) = %d, want 20", got)
	}

	// What an overflow or a fallback delivered, an answer without cached
	// tokens reported, and an invalid report say nothing of the owners.
	cold := usageReport{result: usageOK, prompt: 1000, cached: 0}
	for _, k := range []kind{kindOverflow, kindFallback, kindOther, kindNone} {
		c.observe(k, cold)
	}
	c.observe(kindAffinity, usageReport{result: usageNoDetails, prompt: 1000})
	c.observe(kindAffinity, usageReport{result: usageInvalid, prompt: 5, cached: 9})
	if h := c.ownerHitPermille(); h != 900 {
		t.Fatalf("after non-owner answers: owner hit %d permille, want 900", h)
	}

	// Split and session answers are an owner's too; the mean follows them.
	for i := 0; i < 500; i++ {
		c.observe(kindSplit, cold)
		c.observe(kindSession, cold)
	}
	if h := c.ownerHitPermille(); h > 10 {
		t.Fatalf("after 1000 cold owner answers: owner hit %d permille, want about 0", h)
	}
	// No reuse: the body's size in mean requests, never below 1.
	if got := c.units(40000, false); got != 10 {
		t.Errorf("h = 0: units(10 x mean) = %d, want 10", got)
	}
	if got := c.units(400, false); got != 1 {
		t.Errorf("h = 0: units(mean / 10) = %d, want 1", got)
	}
}

func TestRecomputeCostCapped(t *testing.T) {
	var c recomputeCost
	c.units(1000, true)
	c.observe(kindAffinity, usageReport{result: usageOK, prompt: 1 << 50, cached: 1 << 50})
	if h := c.ownerHitPermille(); h != maxOwnerHitPermille {
		t.Fatalf("everything cached: owner hit %d permille, want the cap %d", h, maxOwnerHitPermille)
	}
	if got := c.units(1000, false); got != 20 {
		t.Errorf("at the cap: units(mean) = %d, want 20", got)
	}
	var nilCost *recomputeCost
	nilCost.observe(kindAffinity, usageReport{result: usageOK, prompt: 10, cached: 5}) // must not panic
}

// A backend's owner answers teach the proxy's cost (countUsage).
func TestCountUsageTeachesCost(t *testing.T) {
	m := newMetrics(nil)
	var c recomputeCost
	b := &backend{id: "b/", m: m.forBackend("b/"), cost: &c}
	b.countUsage(prediction{kind: kindAffinity, warm: true}, usageReport{result: usageOK, prompt: 100, cached: 75})
	if h := c.ownerHitPermille(); h != 750 {
		t.Fatalf("owner hit %d permille after one answer caching 75%%, want 750", h)
	}
}

// Before any owner's answer reports its cached tokens, h is the engines'
// scraped prefix-cache hit rate (a running mean over scrapes); once an
// answer reports, the answers decide. Rates outside 0..1 are ignored.
func TestRecomputeCostFromEngineHitRate(t *testing.T) {
	var c recomputeCost
	c.units(4000, true) // the mean: 4000 bytes
	c.observeEngine(math.NaN())
	c.observeEngine(-1)
	c.observeEngine(2)
	if h := c.ownerHitPermille(); h != 500 {
		t.Fatalf("after invalid rates: h %d permille, want 500", h)
	}
	c.observeEngine(0.9)
	if h := c.ownerHitPermille(); h != 900 {
		t.Fatalf("first engine rate 0.9: h %d permille, want 900", h)
	}
	if got := c.units(4000, false); got != 10 {
		t.Errorf("engine h = 0.9: units(mean) = %d, want 10", got)
	}
	// A running mean: one scrape of 0.5 moves it by 1/costWindow.
	c.observeEngine(0.5)
	if h := c.ownerHitPermille(); h >= 900 || h < 890 {
		t.Errorf("after one scrape of 0.5: h %d permille, want just under 900", h)
	}
	for range 20 * costWindow {
		c.observeEngine(0.99)
	}
	if h := c.ownerHitPermille(); h != maxOwnerHitPermille {
		t.Errorf("engines at 0.99: h %d permille, want the cap %d", h, maxOwnerHitPermille)
	}
	// An owner's answer with cached tokens takes over.
	c.observe(kindAffinity, usageReport{result: usageOK, prompt: 1000, cached: 200})
	if h := c.ownerHitPermille(); h != 200 {
		t.Errorf("after an owner's report of 20%%: h %d permille, want 200", h)
	}
}

// A backend's new scrape, not a copy of it, teaches the engine's rate.
func TestScrapeTeachesEngineHitRate(t *testing.T) {
	cfg := DefaultConfig()
	b := newBackend("b/", backendspec.Target{HostPort: "127.0.0.1:1"}, &cfg, newMetrics(nil))
	b.cost = new(recomputeCost)
	now := time.Now()
	b.setQueue(EngineQueue{Scraped: now, PrefixHit: 0.8, HasPrefixHit: true})
	if h := b.cost.ownerHitPermille(); h != 800 {
		t.Fatalf("h %d permille after a scrape of 0.8, want 800", h)
	}
	b.setQueue(EngineQueue{Scraped: now.Add(time.Millisecond), PrefixHit: 0, HasPrefixHit: true}) // a copy
	if h := b.cost.ownerHitPermille(); h != 800 {
		t.Fatalf("h %d permille after a copy of the scrape, want 800", h)
	}
	b.setQueue(EngineQueue{Scraped: now.Add(time.Second)}) // no rate
	if h := b.cost.ownerHitPermille(); h != 800 {
		t.Fatalf("h %d permille after a scrape without a rate, want 800", h)
	}
}

// TestRecomputeUnitAgreed: an agreed work unit replaces the router's own
// in every weighing, the router's own figures still follow its traffic
// (for what it publishes), and 0 or a value out of range goes back to the
// router's own.
func TestRecomputeUnitAgreed(t *testing.T) {
	p, err := New(DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	c := &p.cost
	if f := p.RecomputeFigures(); f.Unit != 0 || f.Requests != 0 || f.Agreed != 0 {
		t.Fatalf("before any request: %+v", f)
	}
	c.units(4000, true)
	for range 10 {
		c.observe(kindAffinity, usageReport{result: usageOK, prompt: 1000, cached: 750})
	}
	// Own unit: 4000 x (1 - 0.75) = 1000 bytes.
	f := p.RecomputeFigures()
	if f.Unit != 1000 || !f.FromAnswers || f.Requests != 1 || f.Agreed != 0 {
		t.Fatalf("own figures %+v, want unit 1000 from answers after 1 request", f)
	}
	if got := c.units(8000, false); got != 8 {
		t.Fatalf("own unit: units(8000) = %d, want 8", got)
	}
	p.SetRecomputeUnit(2000)
	if got := c.units(8000, true); got != 4 {
		t.Fatalf("agreed unit 2000: units(8000) = %d, want 4", got)
	}
	if got := c.units(500, false); got != 1 {
		t.Fatalf("agreed unit 2000: units(500) = %d, want at least 1", got)
	}
	if f := p.RecomputeFigures(); f.Agreed != 2000 || f.Requests != 2 || f.Unit == 2000 {
		t.Fatalf("figures with an agreed unit %+v: own unit and count follow the traffic", f)
	}
	for _, bad := range []int64{-1, MaxRecomputeUnit + 1, 0} {
		p.SetRecomputeUnit(2000)
		p.SetRecomputeUnit(bad)
		if f := p.RecomputeFigures(); f.Agreed != 0 {
			t.Fatalf("SetRecomputeUnit(%d) left %d agreed", bad, f.Agreed)
		}
	}
	if got := c.units(8000, false); got == 4 {
		t.Fatal("the agreed unit still weighs after it was cleared")
	}
}
