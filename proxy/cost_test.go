package proxy

import "testing"

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
