package stats

import (
	"math"
	"testing"
)

func TestEvenShareFloor(t *testing.T) {
	for _, c := range []struct {
		n      int64
		k      int
		lo, hi float64
	}{
		// Medians of max/min over 7 bins from an independent simulation
		// (4,000 trials each): 175 -> 1.70, 960 -> 1.25, 1,200 -> 1.22.
		{175, 7, 1.6, 1.8},
		{960, 7, 1.2, 1.3},
		{1200, 7, 1.18, 1.27},
		{100000, 7, 1.01, 1.04},
		{1, 1, 1, 1},
	} {
		if got := EvenShareFloor(c.n, c.k); got < c.lo || got > c.hi {
			t.Errorf("EvenShareFloor(%d, %d) = %.3f, want %.2f-%.2f", c.n, c.k, got, c.lo, c.hi)
		}
	}
	if got := EvenShareFloor(5, 7); got != 0 {
		t.Errorf("5 requests over 7 backends: %v, want 0 (a backend always empty)", got)
	}
	if EvenShareFloor(0, 7) != 0 || EvenShareFloor(10, 0) != 0 {
		t.Error("empty sample or fleet: want 0")
	}
	if a, b := EvenShareFloor(960, 7), EvenShareFloor(960, 7); a != b {
		t.Errorf("not deterministic: %v then %v", a, b)
	}
	// Past the simulated size the floor keeps shrinking toward 1, and
	// continues the simulated curve.
	big, edge := EvenShareFloor(4*floorMaxSample, 7), EvenShareFloor(floorMaxSample, 7)
	if !(big > 1 && big < edge) || math.Abs((big-1)-(edge-1)/2) > 1e-9 {
		t.Errorf("floor at 4x the largest sample %v, at it %v", big, edge)
	}
}
