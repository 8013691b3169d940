package ring

import (
	"fmt"
	"slices"
	"strings"
)

// Move hands a partition to another backend: the balancer's way of
// evening out traffic that consistent hashing spread unevenly. The
// partition's keys go to Backend; its previous owner becomes its first
// overflow, so a busy new owner overflows back to the warm cache.
type Move struct {
	Partition int    `json:"partition"`
	Backend   string `json:"backend"`
}

// MaxMoves bounds a move list.
const MaxMoves = 4096

// CheckMoves reports the first problem in a move list: too many moves, a
// partition out of range (at most the largest partition count), a
// partition moved twice, an empty backend id.
func CheckMoves(moves []Move) error {
	if len(moves) > MaxMoves {
		return fmt.Errorf("%w: %d moves, at most %d", ErrConfig, len(moves), MaxMoves)
	}
	seen := make(map[int]bool, len(moves))
	for _, m := range moves {
		switch {
		case m.Partition < 0 || m.Partition >= 1<<20:
			return fmt.Errorf("%w: moved partition %d out of range", ErrConfig, m.Partition)
		case seen[m.Partition]:
			return fmt.Errorf("%w: partition %d moved twice", ErrConfig, m.Partition)
		case m.Backend == "":
			return fmt.Errorf("%w: partition %d moved to an empty backend id", ErrConfig, m.Partition)
		}
		seen[m.Partition] = true
	}
	return nil
}

// SortMoves sorts moves by partition: the canonical order.
func SortMoves(moves []Move) {
	slices.SortFunc(moves, func(a, b Move) int {
		if a.Partition != b.Partition {
			return a.Partition - b.Partition
		}
		return strings.Compare(a.Backend, b.Backend)
	})
}

// WithMoves returns a ring like r whose moved partitions have their new
// owner first and the rest of their order after it (the old owner at rank
// 1). Moves of partitions r does not have, or to backends it does not
// have, are skipped; so is everything when moves is empty (r itself is
// returned). r is not changed.
func (r *Ring) WithMoves(moves []Move) *Ring {
	if len(moves) == 0 || r.parts == 0 {
		return r
	}
	out := *r
	out.order = slices.Clone(r.order)
	out.moved = 0
	for _, m := range moves {
		b, ok := r.index[m.Backend]
		if !ok || m.Partition < 0 || m.Partition >= int(r.parts) {
			continue
		}
		row := out.order[m.Partition*r.depth : (m.Partition+1)*r.depth]
		i := slices.Index(row, int32(b))
		if i == 0 {
			continue
		}
		if i < 0 {
			i = len(row) - 1 // dropped off the end
		}
		copy(row[1:i+1], row[:i])
		row[0] = int32(b)
		out.moved++
	}
	return &out
}

// Moved is the number of partitions WithMoves gave another owner.
func (r *Ring) Moved() int { return r.moved }
