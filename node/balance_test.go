package node

import (
	"fmt"
	"testing"
	"time"

	"github.com/warmroute/warmroute/proxy"
	"github.com/warmroute/warmroute/ring"
)

func balanceRing(t *testing.T, n int) *ring.Ring {
	t.Helper()
	var bs []ring.Backend
	for i := 0; i < n; i++ {
		bs = append(bs, ring.Backend{ID: fmt.Sprintf("gpu-%d", i), Addr: fmt.Sprintf("http://10.0.0.%d:8000", i+1)})
	}
	r, err := ring.New(ring.DefaultConfig(), bs)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func never(int) bool  { return false }
func always(int) bool { return true }

func gates(stale, pressed, calm func(int) bool) moveGates {
	return moveGates{stale: stale, pressed: pressed, calm: calm}
}

// open lets every backend give and take partitions.
var open = gates(never, always, always)

// shares returns each backend's requests under r.
func shares(r *ring.Ring, loads []uint32) []uint64 {
	out := make([]uint64, r.Len())
	for p, c := range loads {
		out[r.Order(p)[0]] += uint64(c)
	}
	return out
}

func TestPlanMovesEvensTraffic(t *testing.T) {
	r := balanceRing(t, 4)
	loads := make([]uint32, r.Partitions())
	// 40 busy partitions, 25 of them owned by backend 0.
	owned0 := 0
	for p := 0; p < r.Partitions() && owned0 < 25; p++ {
		if r.Order(p)[0] == 0 {
			loads[p] = 20 * proxy.PartitionUnit
			owned0++
		}
	}
	others := 0
	for p := 0; p < r.Partitions() && others < 15; p++ {
		if r.Order(p)[0] != 0 {
			loads[p] = 20 * proxy.PartitionUnit
			others++
		}
	}
	var moves []ring.Move
	cur := r
	for round := 0; round < 10; round++ {
		moves = planMoves(cur, loads, moves, open)
		if err := ring.CheckMoves(moves); err != nil {
			t.Fatal(err)
		}
		cur = r.WithMoves(moves)
	}
	s := shares(cur, loads)
	lo, hi := s[0], s[0]
	for _, v := range s {
		lo, hi = min(lo, v), max(hi, v)
	}
	if float64(hi) > (1.1*float64(800)/4+20)*proxy.PartitionUnit {
		t.Fatalf("after balancing, shares %v (moves %v)", s, moves)
	}
	if len(moves) == 0 || len(moves) > 20 {
		t.Fatalf("%d moves", len(moves))
	}
	for _, m := range moves {
		if loads[m.Partition] == 0 {
			t.Fatalf("moved a cold partition %d", m.Partition)
		}
	}
	t.Logf("shares before %v, after %v with %d moves", shares(r, loads), s, len(moves))
	// The same traffic on backends that keep up moves nothing: only a
	// pressed backend gives partitions away.
	if got := planMoves(r, loads, nil, gates(never, never, always)); len(got) != 0 {
		t.Fatalf("moves off a backend that keeps up: %v", got)
	}
	if got := planMoves(r, loads, nil, gates(never, func(b int) bool { return b != 0 }, func(b int) bool { return b == 0 })); len(got) != 0 {
		t.Fatalf("moves while only the others are pressed: %v", got)
	}
	// The busiest is pressed but so was every other backend lately: a
	// move would only shift a queue, and cost the keys their prefixes.
	hot := func(b int) bool { return b == 0 }
	if got := planMoves(r, loads, nil, gates(never, hot, never)); len(got) != 0 {
		t.Fatalf("moves onto backends that queued too: %v", got)
	}
	// Only backend 2 had room all along: everything moved goes there,
	// however little the others carry.
	got := planMoves(r, loads, nil, gates(never, hot, func(b int) bool { return b == 2 }))
	if len(got) == 0 {
		t.Fatal("no move onto the one calm backend")
	}
	for _, m := range got {
		if m.Backend != "gpu-2" || r.Order(m.Partition)[0] != 0 {
			t.Fatalf("move %+v: want partitions of gpu-0 onto gpu-2 (all %v)", m, got)
		}
	}
	// Traffic gone: moves stay until they have been cold for long, then
	// they are dropped.
	clear(loads)
	if got := planMoves(cur, loads, moves, open); len(got) != len(moves) {
		t.Fatalf("moves of partitions cold for a moment dropped: %v, had %v", got, moves)
	}
	if got := planMoves(cur, loads, moves, gates(always, always, always)); len(got) != 0 {
		t.Fatalf("moves of stale partitions kept: %v", got)
	}
}

func TestPlanMovesLeavesBalancedAlone(t *testing.T) {
	r := balanceRing(t, 4)
	loads := make([]uint32, r.Partitions())
	for p := range loads {
		loads[p] = proxy.PartitionUnit
	}
	if got := planMoves(r, loads, nil, open); len(got) != 0 {
		t.Fatalf("balanced traffic moved %v", got)
	}
	// Too little traffic to judge (under balanceMinCount requests).
	small := make([]uint32, r.Partitions())
	small[0] = 25 * proxy.PartitionUnit
	if got := planMoves(r, small, nil, open); len(got) != 0 {
		t.Fatalf("25 requests moved %v", got)
	}
}

func TestColdMovesClock(t *testing.T) {
	moves := []ring.Move{{Partition: 1, Backend: "gpu-1"}, {Partition: 2, Backend: "gpu-2"}}
	loads := []uint32{0, 0, proxy.PartitionUnit}
	c := coldMoves{}
	t0 := time.Unix(1000, 0)
	c.update(moves, loads, t0)
	if c.stale(1, t0.Add(balanceKeepCold-time.Second)) {
		t.Fatal("partition 1 stale before balanceKeepCold")
	}
	if !c.stale(1, t0.Add(balanceKeepCold)) {
		t.Fatal("partition 1 not stale after balanceKeepCold without traffic")
	}
	if c.stale(2, t0.Add(time.Hour)) {
		t.Fatal("partition 2 carries traffic but is stale")
	}
	// A request restarts the clock; a cold period later starts it anew.
	loads[1] = 1
	c.update(moves, loads, t0.Add(10*time.Second))
	loads[1] = 0
	c.update(moves, loads, t0.Add(20*time.Second))
	if c.stale(1, t0.Add(balanceKeepCold+10*time.Second)) {
		t.Fatal("partition 1 stale though it carried traffic 20 s ago")
	}
	if !c.stale(1, t0.Add(balanceKeepCold+20*time.Second)) {
		t.Fatal("partition 1 not stale balanceKeepCold after its last traffic")
	}
	// A partition no longer moved is forgotten.
	c.update(moves[1:], loads, t0.Add(21*time.Second))
	if _, ok := c[1]; ok || len(c) != 0 {
		t.Fatalf("clocks %v after the moves ended", c)
	}
}

func TestPressure(t *testing.T) {
	p := newPressure(balancePressedFor, balancePressedSamples)
	t0 := time.Unix(1000, 0)
	st := []proxy.BackendStatus{
		{ID: "queued", Busy: true, Limit: 8},
		{ID: "full", InFlight: 3, RemoteInFlight: 5, Limit: 8},
		{ID: "light", InFlight: 3, RemoteInFlight: 4, Limit: 8},
		{ID: "nolimit", InFlight: 9},
		{ID: "learned", InFlight: 3, Capacity: 3, Limit: 8, Pressed: true},
	}
	for i := 0; i < balancePressedSamples; i++ {
		for _, id := range []string{"queued", "full", "learned"} {
			if p.pressed(id) {
				t.Fatalf("%s pressed after %d samples", id, i)
			}
		}
		p.sample(st, t0.Add(time.Duration(i)*time.Second))
	}
	for id, want := range map[string]bool{"queued": true, "full": true, "learned": true, "light": false, "nolimit": false} {
		if p.pressed(id) != want {
			t.Errorf("pressed(%s) = %v, want %v", id, !want, want)
		}
	}
	// One more pressed sample for "queued" only; once the first samples
	// are older than balancePressedFor, "full" is forgotten and "queued"
	// keeps too few to count.
	p.sample(st[:1], t0.Add(balancePressedFor-time.Second))
	p.sample(nil, t0.Add(balancePressedFor+2*time.Second))
	if p.pressed("queued") || p.pressed("full") {
		t.Errorf("after balancePressedFor: %v", p)
	}
	if _, ok := p.at["full"]; ok || len(p.at["queued"]) != 1 {
		t.Errorf("samples kept: %v", p.at)
	}
}

func TestPressureCalm(t *testing.T) {
	p := newPressure(balancePressedFor, balancePressedSamples)
	if p.calm("light") {
		t.Fatal("calm before any sample")
	}
	t0 := time.Unix(1000, 0)
	st := []proxy.BackendStatus{
		{ID: "queued", Busy: true, Limit: 8},
		{ID: "light", InFlight: 1, Limit: 8},
	}
	// queued pressed once, in the second sample: not calm for the window
	// that follows.
	p.sample(st[1:], t0)
	for i := 1; i < 10; i++ {
		if i == 1 {
			p.sample(st, t0.Add(time.Second))
		} else {
			p.sample(st[1:], t0.Add(time.Duration(i)*time.Second))
		}
		if p.calm("light") {
			t.Fatalf("light calm after %d s of samples: the window is not spanned yet", i)
		}
	}
	p.sample(st[1:], t0.Add(balancePressedFor))
	if !p.calm("light") {
		t.Error("light not calm after a window with room in every sample")
	}
	if p.calm("queued") {
		t.Error("queued calm though pressed in the window")
	}
	p.sample(st[1:], t0.Add(balancePressedFor+2*time.Second))
	if !p.calm("queued") {
		t.Error("queued not calm once its one pressed sample left the window")
	}
}

// TestNewMoves counts the moves a commit adds: a partition given an owner
// it did not have, not one kept or dropped.
func TestNewMoves(t *testing.T) {
	cur := []ring.Move{{Partition: 1, Backend: "a"}, {Partition: 2, Backend: "b"}}
	next := []ring.Move{{Partition: 1, Backend: "a"}, {Partition: 2, Backend: "c"}, {Partition: 5, Backend: "a"}}
	if got := newMoves(cur, next); got != 2 {
		t.Errorf("newMoves = %d, want 2 (partition 2 to a new owner, partition 5 moved)", got)
	}
	if got := newMoves(next, cur[:1]); got != 0 {
		t.Errorf("newMoves after dropping moves = %d, want 0", got)
	}
}
