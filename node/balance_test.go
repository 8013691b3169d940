package node

import (
	"fmt"
	"testing"

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
		moves = planMoves(cur, loads, moves)
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
	// Traffic gone: cold moves are dropped.
	clear(loads)
	if got := planMoves(cur, loads, moves); len(got) != 0 {
		t.Fatalf("moves of cold partitions kept: %v", got)
	}
}

func TestPlanMovesLeavesBalancedAlone(t *testing.T) {
	r := balanceRing(t, 4)
	loads := make([]uint32, r.Partitions())
	for p := range loads {
		loads[p] = proxy.PartitionUnit
	}
	if got := planMoves(r, loads, nil); len(got) != 0 {
		t.Fatalf("balanced traffic moved %v", got)
	}
	// Too little traffic to judge (under balanceMinCount requests).
	small := make([]uint32, r.Partitions())
	small[0] = 25 * proxy.PartitionUnit
	if got := planMoves(r, small, nil); len(got) != 0 {
		t.Fatalf("25 requests moved %v", got)
	}
}
