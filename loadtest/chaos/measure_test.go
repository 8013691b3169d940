package chaos

import (
	"math"
	"testing"
	"time"

	"github.com/warmroute/warmroute/loadtest/stats"
)

const s = time.Second

func TestAgree(t *testing.T) {
	cases := []struct {
		name              string
		picks             [][]string
		agreeing, compare int
	}{
		{"empty", nil, 0, 0},
		{"all agree", [][]string{{"a", "b", "c"}, {"a", "b", "c"}, {"a", "b", "c"}}, 3, 3},
		{"one differs", [][]string{{"a", "b", "c"}, {"a", "x", "c"}, {"a", "b", "c"}}, 2, 3},
		{"missing answers skip the router", [][]string{{"a", "", "c"}, {"a", "b", ""}, {"", "b", "c"}}, 3, 3},
		{"nobody answered a prompt", [][]string{{"a", ""}, {"a", ""}}, 1, 1},
		{"no pick disagrees with a backend", [][]string{{NoPick, "b"}, {"a", "b"}}, 1, 2},
		{"no pick agrees with no pick", [][]string{{NoPick}, {NoPick}}, 1, 1},
		{"one router alone agrees with itself", [][]string{{"a", "b"}}, 2, 2},
		{"ragged", [][]string{{"a", "b"}, {"a"}}, 2, 2},
	}
	for _, c := range cases {
		a, n := Agree(c.picks)
		if a != c.agreeing || n != c.compare {
			t.Errorf("%s: Agree = %d/%d, want %d/%d", c.name, a, n, c.agreeing, c.compare)
		}
	}
}

// tick is a sample where owners and picks agree alike.
func tick(at time.Duration, agreeing, compared int) Tick {
	return Tick{At: at, Answering: 3, Agreeing: agreeing, OwnersAgreeing: agreeing, Compared: compared}
}

func TestTickAgreement(t *testing.T) {
	if got := tick(0, 45, 50).Agreement(Picks); got != 0.9 {
		t.Errorf("agreement %v, want 0.9", got)
	}
	if got := tick(0, 0, 0).Agreement(Picks); got != 1 {
		t.Errorf("nothing compared: agreement %v, want 1", got)
	}
	if tick(0, 49, 50).Full(Picks) || !tick(0, 50, 50).Full(Picks) {
		t.Error("Full wrong")
	}
	// overflow: picks differ where owners agree
	tk := Tick{Answering: 3, Compared: 50, Agreeing: 40, OwnersAgreeing: 50}
	if tk.Full(Picks) || !tk.Full(Owners) || tk.Agreement(Picks) != 0.8 || tk.Agreement(Owners) != 1 {
		t.Errorf("levels mixed up: %+v", tk)
	}
	if e := (Tick{Epochs: []uint64{7, 9, 8}}).MaxEpoch(); e != 9 {
		t.Errorf("max epoch %d", e)
	}
}

func TestMinAgreement(t *testing.T) {
	ticks := []Tick{tick(1*s, 50, 50), tick(2*s, 10, 50), tick(3*s, 40, 50), tick(4*s, 50, 50)}
	ticks = append(ticks, Tick{At: 5 * s, Answering: 1, Agreeing: 0, Compared: 50}) // one router: ignored
	if lo, ok := MinAgreement(ticks, Picks, 0, 10*s); !ok || lo != 0.2 {
		t.Errorf("min %v %v, want 0.2 true", lo, ok)
	}
	if lo, ok := MinAgreement(ticks, Picks, 2500*time.Millisecond, 10*s); !ok || lo != 0.8 {
		t.Errorf("min from 2.5s %v %v, want 0.8 true", lo, ok)
	}
	if _, ok := MinAgreement(ticks, Picks, 4500*time.Millisecond, 10*s); ok {
		t.Error("a window with only single-router ticks must report no sample")
	}
}

func TestReconverge(t *testing.T) {
	ms := time.Millisecond
	ticks := []Tick{
		tick(1000*ms, 50, 50), // before the settle
		tick(1200*ms, 20, 50),
		tick(1400*ms, 30, 50),
		tick(1600*ms, 50, 50), // full, but a later tick disagrees
		tick(1800*ms, 49, 50),
		tick(2000*ms, 50, 50), // from here on: full
		tick(2200*ms, 50, 50),
		tick(2400*ms, 50, 50),
	}
	d, ok := Reconverge(ticks, Picks, 1100*ms, 3000*ms)
	if !ok || d != 900*ms {
		t.Errorf("Reconverge = %v %v, want 900ms true", d, ok)
	}
	// settled after the last disagreement: the first tick after it
	if d, ok := Reconverge(ticks, Picks, 1900*ms, 3000*ms); !ok || d != 100*ms {
		t.Errorf("Reconverge after the disagreement = %v %v, want 100ms true", d, ok)
	}
	// window ends while still disagreeing
	if _, ok := Reconverge(ticks, Picks, 1100*ms, 1850*ms); ok {
		t.Error("still disagreeing at the end of the window: want not reconverged")
	}
	// no tick in the window
	if _, ok := Reconverge(ticks, Picks, 5*s, 6*s); ok {
		t.Error("no tick: want not reconverged")
	}
	// owners agree throughout while the picks still differ at 1.8 s
	own := append([]Tick(nil), ticks...)
	for i := range own {
		own[i].OwnersAgreeing = own[i].Compared
	}
	if d, ok := Reconverge(own, Owners, 1100*ms, 3000*ms); !ok || d != 100*ms {
		t.Errorf("owners: %v %v, want 100ms true", d, ok)
	}
	if d, ok := Reconverge(own, Picks, 1100*ms, 3000*ms); !ok || d != 900*ms {
		t.Errorf("picks with owners agreeing: %v %v, want 900ms true", d, ok)
	}
}

func TestStableSince(t *testing.T) {
	ms := time.Millisecond
	ticks := []Tick{tick(0, 50, 50), tick(200*ms, 10, 50), tick(400*ms, 50, 50), tick(600*ms, 50, 50), tick(800*ms, 50, 50)}
	if d := StableSince(ticks, Picks, 3); d != 400*ms {
		t.Errorf("stable %v, want 400ms", d)
	}
	if d := StableSince(ticks, Picks, 4); d != 0 {
		t.Errorf("fewer routers answering than required: stable %v, want 0", d)
	}
	if d := StableSince(ticks[:2], Picks, 3); d != 0 {
		t.Errorf("last tick disagrees: stable %v, want 0", d)
	}
	if d := StableSince(nil, Picks, 1); d != 0 {
		t.Errorf("no ticks: %v", d)
	}
	gap := append([]Tick(nil), ticks...)
	gap[3].Answering = 2 // a router missed a sample: the run restarts after it
	if d := StableSince(gap, Picks, 3); d != 0 {
		t.Errorf("stable across a tick with a router missing: %v, want 0 (the last run is one tick)", d)
	}
}

func TestMove(t *testing.T) {
	// removal of b: its prompts move, one other prompt moves needlessly,
	// and a prompt without an answer is skipped
	before := []string{"a", "b", "b", "c", "a", "", "c"}
	after := []string{"a", "c", "a", "c", "c", "a", "c"}
	m := Move(before, after, "b")
	want := Movement{Prompts: 6, Moved: 3, FromBackend: 2, ToBackend: 0, OwnedBefore: 2, OwnedAfter: 0}
	if m != want {
		t.Errorf("removal: %+v, want %+v", m, want)
	}
	if m.Unneeded() != 1 || m.Fraction() != 0.5 {
		t.Errorf("unneeded %d fraction %v", m.Unneeded(), m.Fraction())
	}
	// addition of d
	m = Move([]string{"a", "b", "c", "a"}, []string{"d", "b", "d", "a"}, "d")
	want = Movement{Prompts: 4, Moved: 2, ToBackend: 2, OwnedAfter: 2}
	if m != want {
		t.Errorf("addition: %+v, want %+v", m, want)
	}
	// nothing changed: no backend named
	m = Move([]string{"a", "b"}, []string{"a", "b"}, "")
	if m.Moved != 0 || m.Prompts != 2 || m.Fraction() != 0 {
		t.Errorf("no change: %+v", m)
	}
	if (Movement{}).Fraction() != 0 {
		t.Error("empty movement fraction")
	}
}

func cc(q, h float64) stats.CacheCounters { return stats.CacheCounters{Queries: q, Hits: h} }

func TestHitRateBetween(t *testing.T) {
	points := []KVPoint{
		{At: 1 * s, Counters: map[string]stats.CacheCounters{"a": cc(100, 50), "b": cc(100, 100)}},
		{At: 2 * s, Counters: map[string]stats.CacheCounters{"a": cc(200, 140)}}, // b's scrape failed
		{At: 3 * s, Counters: map[string]stats.CacheCounters{"a": cc(300, 230), "b": cc(300, 250), "c": cc(10, 0)}},
		{At: 4 * s, Counters: map[string]stats.CacheCounters{"a": cc(50, 40), "b": cc(400, 350), "c": cc(20, 10)}}, // a restarted
	}
	// 1s..3s: a +200/+180, b +200/+150 (its 2s scrape missing does not
	// matter), c new: counts from 0 (+10/+0)
	rate, q := HitRateBetween(points, 1*s, 3*s)
	if q != 410 || math.Abs(rate-330.0/410) > 1e-12 {
		t.Errorf("1s..3s: rate %v queried %v, want %v 410", rate, q, 330.0/410)
	}
	// 3s..4s: a reset, counts from the reset (+50/+40), b +100/+100, c +10/+10
	rate, q = HitRateBetween(points, 3*s, 4*s)
	if q != 160 || math.Abs(rate-150.0/160) > 1e-12 {
		t.Errorf("3s..4s: rate %v queried %v", rate, q)
	}
	// 1s..2s: b not scraped since 1s: left out
	rate, q = HitRateBetween(points, 1*s, 2*s)
	if q != 100 || rate != 0.9 {
		t.Errorf("1s..2s: rate %v queried %v, want 0.9 100", rate, q)
	}
	if _, q := HitRateBetween(points, 5*s, 6*s); q != 0 {
		t.Errorf("after the last scrape: queried %v, want 0", q)
	}
}

// series builds one backend's cumulative counters scraped every second
// from a per-second hit rate (100 tokens queried per second).
func series(rates []float64) []KVPoint {
	var q, h float64
	points := []KVPoint{{At: 0, Counters: map[string]stats.CacheCounters{"a": cc(0, 0)}}}
	for i, r := range rates {
		q += 100
		h += 100 * r
		points = append(points, KVPoint{At: time.Duration(i+1) * s, Counters: map[string]stats.CacheCounters{"a": cc(q, h)}})
	}
	return points
}

func TestHitDip(t *testing.T) {
	// 5 s at 0.9, the fault at 5 s, two bad seconds, then back
	rates := []float64{0.9, 0.9, 0.9, 0.9, 0.9, 0.3, 0.5, 0.9, 0.9, 0.9, 0.9, 0.9}
	pts := series(rates)
	d := HitDip(pts, 0, 5*s, 12*s, 2*s, s, 0.03)
	if !d.Measured || math.Abs(d.Before-0.9) > 1e-9 {
		t.Fatalf("before %v measured %v", d.Before, d.Measured)
	}
	// windows (clipped at the fault): [5,6]=0.3 is the lowest
	if math.Abs(d.Min-0.3) > 1e-9 || d.MinAt != s {
		t.Errorf("min %v at %v, want 0.3 at 1s", d.Min, d.MinAt)
	}
	// windows of 2 s: [6,8] = 0.7 is the last one below 0.87; [7,9]
	// ending at 9 s recovers: 4 s after the fault
	if !d.RecoveredOK || d.Recovered != 4*s {
		t.Errorf("recovered %v ok %v, want 4s true", d.Recovered, d.RecoveredOK)
	}

	// no dip
	flat := series([]float64{0.8, 0.8, 0.8, 0.8, 0.8, 0.8})
	d = HitDip(flat, 0, 3*s, 6*s, 2*s, s, 0.03)
	if !d.RecoveredOK || d.Recovered != 0 || math.Abs(d.Min-0.8) > 1e-9 {
		t.Errorf("flat: %+v", d)
	}

	// never recovers
	low := series([]float64{0.9, 0.9, 0.9, 0.2, 0.2, 0.2})
	d = HitDip(low, 0, 3*s, 6*s, 2*s, s, 0.03)
	if d.RecoveredOK || d.Recovered != 3*s {
		t.Errorf("not recovered: %+v", d)
	}

	// nothing queried before the fault: not measured
	if d := HitDip(series(nil), 0, 3*s, 6*s, 2*s, s, 0.03); d.Measured {
		t.Errorf("empty series measured: %+v", d)
	}
}

func TestClassify(t *testing.T) {
	ms := time.Millisecond
	recs := []Record{
		{Router: "r1", Start: 0, End: 500 * ms},                                          // ok
		{Router: "r1", Start: 900 * ms, End: 1100 * ms, Err: "eof"},                      // in flight on r1 at its kill: unavoidable
		{Router: "r1", Start: 1500 * ms, End: 1600 * ms, Err: "http_502"},                // after the kill, on the victim: faulted
		{Router: "r2", Start: 900 * ms, End: 1100 * ms, Err: "reset"},                    // other router: other
		{Router: "r2", Start: 2900 * ms, End: 3200 * ms, Err: "incomplete"},              // on a killed backend b1: unavoidable
		{Router: "r3", Start: 2900 * ms, End: 3200 * ms, Err: "http_502", Backend: "b2"}, // another backend: other
		{Router: "r3", Start: 2950 * ms, End: 3200 * ms, Err: "eof"},                     // no backend named, in flight at the kill: unavoidable
		{Router: "r3", Start: 3100 * ms, End: 3300 * ms, Err: "eof"},                     // started after the kill: other
		{Router: "", Start: 4 * s, End: 4 * s, Err: "no_router"},                         // not sent: unavoidable
		{Router: "r2", Start: 5 * s, End: 5 * s, Redispatched: true},                     // refused then served elsewhere
	}
	recs[4].Backend = "b1"
	outages := []Outage{{Router: "r1", From: 1000 * ms, To: 1050 * ms}, {Backend: "b1", From: 3000 * ms, To: 3050 * ms}}
	e := Classify(recs, []string{"r1"}, outages)
	if e.Requests != 10 || e.Unavoidable != 4 || e.Faulted != 1 || e.Other != 3 || e.Redispatched != 1 {
		t.Errorf("classify: %+v", e)
	}
	if e.ByKind["eof"] != 3 || e.ByKind["no_router"] != 1 {
		t.Errorf("by kind: %v", e.ByKind)
	}
}

func TestLateRouted(t *testing.T) {
	recs := []Record{
		{Backend: "b", Epoch: 9, Start: 1 * s},  // before the removal
		{Backend: "b", Epoch: 9, Start: 3 * s},  // a router that had not applied it yet
		{Backend: "b", Epoch: 10, Start: 3 * s}, // at the removal epoch: a violation
		{Backend: "c", Epoch: 10, Start: 3 * s},
		{Backend: "b", Epoch: 0, Start: 1 * s}, // no header
	}
	byEpoch, byTime := LateRouted(recs, "b", 10, 2*s)
	if byEpoch != 1 || byTime != 2 {
		t.Errorf("late routed %d by epoch, %d by time; want 1, 2", byEpoch, byTime)
	}
}

func TestRotation(t *testing.T) {
	r := newRotation([]Router{{Name: "a"}, {Name: "b"}, {Name: "c"}})
	names := func(rs []Router) string {
		out := ""
		for _, x := range rs {
			out += x.Name
		}
		return out
	}
	if got := names(r.order()); got != "abc" {
		t.Errorf("first order %q", got)
	}
	if got := names(r.order()); got != "bca" {
		t.Errorf("second order %q", got)
	}
	r.set("c", false)
	if got := names(r.order()); got != "ab" {
		t.Errorf("without c, third order %q, want ab (turn at c, skipped)", got)
	}
	r.setAll(false)
	if got := r.order(); len(got) != 0 {
		t.Errorf("none in rotation: %v", got)
	}
}
