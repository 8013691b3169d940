package cluster

import (
	"encoding/json"
	"fmt"
	"io"
	"sync/atomic"

	"github.com/hashicorp/raft"
)

// published is an applied state and its epoch: the index of the log entry
// that produced it. It is never changed after it is stored.
type published struct {
	state State
	epoch uint64
}

// applyResult is what the FSM returns for each command (ApplyFuture's
// Response).
type applyResult struct {
	epoch uint64
	err   error
}

// fsm is the Raft state machine. Raft calls Apply, Snapshot and Restore from
// one goroutine; readers load cur without locks.
type fsm struct {
	cur    atomic.Pointer[published]
	notify func()
}

var _ raft.FSM = (*fsm)(nil)

func newFSM(notify func()) *fsm {
	f := &fsm{notify: notify}
	f.cur.Store(&published{state: State{Backends: []Backend{}}})
	return f
}

func (f *fsm) load() *published { return f.cur.Load() }

// Apply applies one command. A command that is invalid against the current
// state changes nothing (on every node alike) and reports its error.
func (f *fsm) Apply(l *raft.Log) any {
	cur := f.cur.Load()
	cmd, err := decodeCommand(l.Data)
	if err != nil {
		return applyResult{epoch: cur.epoch, err: err}
	}
	next, changed, err := apply(&cur.state, cmd)
	if err != nil || !changed {
		return applyResult{epoch: cur.epoch, err: err}
	}
	f.cur.Store(&published{state: next, epoch: l.Index})
	f.notify()
	return applyResult{epoch: l.Index}
}

// snapshotFile is the snapshot's encoding.
type snapshotFile struct {
	Version int    `json:"version"`
	Epoch   uint64 `json:"epoch"`
	State   State  `json:"state"`
}

const snapshotVersion = 1

func (f *fsm) Snapshot() (raft.FSMSnapshot, error) {
	return fsmSnapshot{f.cur.Load()}, nil
}

func (f *fsm) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	var s snapshotFile
	if err := json.NewDecoder(rc).Decode(&s); err != nil {
		return fmt.Errorf("cluster: decode snapshot: %w", err)
	}
	if s.Version != snapshotVersion {
		return fmt.Errorf("cluster: snapshot version %d, want %d", s.Version, snapshotVersion)
	}
	if s.State.Backends == nil {
		s.State.Backends = []Backend{}
	}
	if err := s.State.validate(); err != nil {
		return fmt.Errorf("cluster: snapshot: %w", err)
	}
	f.cur.Store(&published{state: s.State, epoch: s.Epoch})
	f.notify()
	return nil
}

type fsmSnapshot struct{ p *published }

func (s fsmSnapshot) Persist(sink raft.SnapshotSink) error {
	err := json.NewEncoder(sink).Encode(snapshotFile{Version: snapshotVersion, Epoch: s.p.epoch, State: s.p.state})
	if err != nil {
		_ = sink.Cancel()
		return err
	}
	return sink.Close()
}

func (fsmSnapshot) Release() {}
