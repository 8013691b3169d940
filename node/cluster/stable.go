package cluster

import (
	"sync"

	"github.com/hashicorp/raft"
)

// Raft's heartbeat fast path runs on the transport's connection goroutines,
// not Raft's own: a heartbeat that passed Raft's shutdown check just before
// Close can still write the current term after Raft stopped, and Raft
// panics on any failed write ("failed to save current term"). So Close
// closes the stable store through shutStable: it waits for the writes in
// progress, and a write that comes later is dropped instead of failing.
// Dropping it is safe: once Raft stopped nothing can vote, and a term a
// stopped follower would have recorded is learned again after a restart.

// shutStable is a raft.StableStore that can be shut before the store
// behind it closes.
type shutStable struct {
	raft.StableStore
	mu      sync.RWMutex
	shut    bool
	dropped func() // called for each write dropped after shut
}

var _ raft.StableStore = (*shutStable)(nil)

func (s *shutStable) Set(k, v []byte) error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.shut {
		s.dropped()
		return nil
	}
	return s.StableStore.Set(k, v)
}

func (s *shutStable) SetUint64(k []byte, v uint64) error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.shut {
		s.dropped()
		return nil
	}
	return s.StableStore.SetUint64(k, v)
}

// shutdown waits for the writes in progress; later ones are dropped.
func (s *shutStable) shutdown() {
	s.mu.Lock()
	s.shut = true
	s.mu.Unlock()
}
