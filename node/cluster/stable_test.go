package cluster

import (
	"errors"
	"sync/atomic"
	"testing"

	"github.com/hashicorp/raft"
)

// failingStable fails every write, as a closed raft-wal does.
type failingStable struct{ raft.StableStore }

func (failingStable) Set([]byte, []byte) error       { return errors.New("closed") }
func (failingStable) SetUint64([]byte, uint64) error { return errors.New("closed") }

// TestShutStableDropsLateWrites: a term write that reaches the stable store
// after it was shut is dropped, not failed (Raft panics on a failed one).
func TestShutStableDropsLateWrites(t *testing.T) {
	var dropped atomic.Int32
	s := &shutStable{StableStore: raft.NewInmemStore(), dropped: func() { dropped.Add(1) }}
	if err := s.SetUint64([]byte("CurrentTerm"), 3); err != nil {
		t.Fatal(err)
	}
	if v, err := s.GetUint64([]byte("CurrentTerm")); err != nil || v != 3 {
		t.Fatalf("read %d, %v", v, err)
	}
	s.shutdown()
	s.StableStore = failingStable{s.StableStore}
	if err := s.SetUint64([]byte("CurrentTerm"), 4); err != nil {
		t.Fatalf("a write after shutdown failed: %v", err)
	}
	if err := s.Set([]byte("LastVoteCand"), []byte("r1")); err != nil {
		t.Fatalf("a write after shutdown failed: %v", err)
	}
	if dropped.Load() != 2 {
		t.Fatalf("%d writes counted as dropped, want 2", dropped.Load())
	}
}
