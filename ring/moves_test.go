package ring

import (
	"errors"
	"slices"
	"testing"
)

func TestWithMoves(t *testing.T) {
	r := mustRing(t, DefaultConfig(), gpus(5))
	p := 17
	before := slices.Clone(r.Order(p))
	target := r.Backends()[before[2]].ID
	absent := -1
	for b := range r.Backends() {
		if !slices.Contains(before, int32(b)) {
			absent = b
		}
	}
	m := r.WithMoves([]Move{{Partition: p, Backend: target}, {Partition: 3, Backend: "nope"}, {Partition: 1 << 19, Backend: target}})
	if m.Moved() != 1 || r.Moved() != 0 {
		t.Fatalf("moved %d (original %d), want 1 and 0", m.Moved(), r.Moved())
	}
	got := m.Order(p)
	if got[0] != before[2] || got[1] != before[0] || got[2] != before[1] || !slices.Equal(got[3:], before[3:]) {
		t.Fatalf("order %v, was %v: want the new owner first, then the old order without it", got, before)
	}
	if !slices.Equal(r.Order(p), before) {
		t.Fatal("WithMoves changed the original ring")
	}
	for q := 0; q < r.Partitions(); q++ {
		if q != p && !slices.Equal(m.Order(q), r.Order(q)) {
			t.Fatalf("partition %d changed", q)
		}
	}
	if absent >= 0 {
		m2 := r.WithMoves([]Move{{Partition: p, Backend: r.Backends()[absent].ID}})
		got := m2.Order(p)
		if got[0] != int32(absent) || !slices.Equal(got[1:], before[:len(before)-1]) {
			t.Fatalf("move to a backend outside the order: %v, was %v", got, before)
		}
	}
	if r.WithMoves(nil) != r {
		t.Fatal("no moves should give the ring itself")
	}
	if err := CheckMoves([]Move{{Partition: 1, Backend: "a"}, {Partition: 1, Backend: "b"}}); !errors.Is(err, ErrConfig) {
		t.Fatalf("twice-moved partition: %v", err)
	}
	if err := CheckMoves([]Move{{Partition: -1, Backend: "a"}}); !errors.Is(err, ErrConfig) {
		t.Fatalf("negative partition: %v", err)
	}
	if err := CheckMoves(make([]Move, MaxMoves+1)); !errors.Is(err, ErrConfig) {
		t.Fatalf("too many: %v", err)
	}
}
