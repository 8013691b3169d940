package cluster

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
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
// one goroutine; readers load cur and pub without locks.
//
// cur is the state machine's own state. pub is what routing reads: the same
// as cur, except right after a restart, when pub holds the state last
// applied before the restart (from the cache file) until Raft has replayed
// the log up to it, so a restarted node routes on its last state even
// while there is no leader to learn the commit index from, and never on an
// older one.
type fsm struct {
	cur     atomic.Pointer[published]
	pub     atomic.Pointer[published]
	floor   uint64 // pub is held until cur reaches this epoch
	notify  func()
	persist func(*published) // nil: nothing to persist
	// check vets every new state before it is published (nil: none); an
	// error halts the state machine.
	check func(*published) error
	// halted is set when an entry could not be applied on this node
	// alone (damaged, foreign, or from a newer version): nothing more is
	// applied, and the last good state stays published.
	halted atomic.Pointer[haltInfo]
	onHalt func(index uint64, err error) // nil: none
	// onPublish is told of every state published for routing (nil:
	// nobody), before subscribers are notified.
	onPublish func(*published)
}

var _ raft.FSM = (*fsm)(nil)

func newFSM(notify func(), persist func(*published), cached *published) *fsm {
	f := &fsm{notify: notify, persist: persist}
	empty := &published{state: State{Backends: []Backend{}}}
	f.cur.Store(empty)
	f.pub.Store(empty)
	if cached != nil {
		f.pub.Store(cached)
		f.floor = cached.epoch
	}
	return f
}

// load returns the state machine's state (the leader validates writes
// against it).
func (f *fsm) load() *published { return f.cur.Load() }

// view returns the state routing uses.
func (f *fsm) view() *published { return f.pub.Load() }

func (f *fsm) set(p *published) {
	f.cur.Store(p)
	if p.epoch < f.floor {
		return
	}
	f.floor = 0
	f.pub.Store(p)
	if f.persist != nil {
		f.persist(p)
	}
	if f.onPublish != nil {
		f.onPublish(p)
	}
	f.notify()
}

// halt stops applying at entry index.
func (f *fsm) halt(index uint64, err error) {
	if f.halted.CompareAndSwap(nil, &haltInfo{index: index, err: err}) && f.onHalt != nil {
		f.onHalt(index, err)
	}
}

// Apply applies one command. A command that is invalid against the current
// state changes nothing (on every node alike) and reports its error. An
// entry that fails its checksum, does not decode, or would publish another
// cluster's state is this node's problem alone: the state machine halts
// (see halted) rather than skip it and diverge from the others.
func (f *fsm) Apply(l *raft.Log) any {
	cur := f.cur.Load()
	if h := f.halted.Load(); h != nil {
		return applyResult{epoch: cur.epoch, err: fmt.Errorf("%w: halted at entry %d", ErrHalted, h.index)}
	}
	cmd, err := decodeCommand(l.Data)
	if err != nil {
		f.halt(l.Index, err)
		return applyResult{epoch: cur.epoch, err: err}
	}
	next, changed, err := apply(&cur.state, cmd)
	if err != nil || !changed {
		return applyResult{epoch: cur.epoch, err: err}
	}
	p := &published{state: next, epoch: l.Index}
	if f.check != nil {
		if err := f.check(p); err != nil {
			f.halt(l.Index, err)
			return applyResult{epoch: cur.epoch, err: err}
		}
	}
	f.set(p)
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
	s.State.normalize()
	if err := s.State.validate(); err != nil {
		return fmt.Errorf("cluster: snapshot: %w", err)
	}
	p := &published{state: s.State, epoch: s.Epoch}
	if f.check != nil {
		if err := f.check(p); err != nil {
			return fmt.Errorf("cluster: snapshot: %w", err)
		}
	}
	f.set(p)
	return nil
}

// normalize puts a state read from a snapshot or the cache file in the
// form apply keeps it in: backends never nil, empty labels nil.
func (s *State) normalize() {
	if s.Backends == nil {
		s.Backends = []Backend{}
	}
	for i := range s.Backends {
		if len(s.Backends[i].Labels) == 0 {
			s.Backends[i].Labels = nil
		}
	}
	if len(s.RevokedNames) == 0 {
		s.RevokedNames = nil
	}
	if len(s.RevokedSerials) == 0 {
		s.RevokedSerials = nil
	}
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

// stateCache keeps the last published state in a file next to the Raft
// log. It is a cache: Raft's log and snapshots stay the truth.
type stateCache struct {
	path string
	log  func(msg string, args ...any)
}

const stateCacheFile = "state.json"

// load reads the cache file. The caller checks it against the log
// (replay) before serving it.
func (sc stateCache) load() (*published, error) {
	b, err := os.ReadFile(sc.path)
	if err != nil {
		return nil, err
	}
	var s snapshotFile
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, err
	}
	if s.Version != snapshotVersion {
		return nil, fmt.Errorf("version %d", s.Version)
	}
	s.State.normalize()
	if err := s.State.validate(); err != nil {
		return nil, err
	}
	return &published{state: s.State, epoch: s.Epoch}, nil
}

func (sc stateCache) store(p *published) {
	b, err := json.Marshal(snapshotFile{Version: snapshotVersion, Epoch: p.epoch, State: p.state})
	if err == nil {
		tmp := sc.path + ".tmp"
		if err = os.WriteFile(tmp, b, 0o640); err == nil {
			err = os.Rename(tmp, sc.path)
		}
	}
	if err != nil {
		sc.log("cannot cache the applied state", "err", err)
	}
}

// replay computes, from this node's own snapshots and log, the state the
// log holds at epoch: the newest snapshot at or below epoch, then every
// command entry up to epoch. The state cache is served only when it equals
// this: a cache file that is damaged, foreign or ahead of the log is
// never routed on.
func replay(epoch uint64, logs raft.LogStore, snaps raft.SnapshotStore) (State, error) {
	st := State{Backends: []Backend{}}
	from := uint64(0)
	metas, err := snaps.List()
	if err != nil {
		return st, fmt.Errorf("list snapshots: %w", err)
	}
	for _, m := range metas { // newest first
		if m.Index > epoch {
			continue
		}
		_, rc, err := snaps.Open(m.ID)
		if err != nil {
			return st, fmt.Errorf("open snapshot %s: %w", m.ID, err)
		}
		var sf snapshotFile
		err = json.NewDecoder(rc).Decode(&sf)
		rc.Close()
		if err != nil || sf.Version != snapshotVersion {
			return st, fmt.Errorf("snapshot %s does not decode", m.ID)
		}
		sf.State.normalize()
		st, from = sf.State, m.Index
		break
	}
	if first, err := logs.FirstIndex(); err != nil || (first > from+1 && epoch > from) {
		return st, fmt.Errorf("the log starts at %d, after the newest usable snapshot (%d)", first, from)
	}
	for i := from + 1; i <= epoch; i++ {
		var l raft.Log
		if err := logs.GetLog(i, &l); err != nil {
			return st, fmt.Errorf("entry %d: %w", i, err)
		}
		if l.Type != raft.LogCommand {
			continue
		}
		cmd, err := decodeCommand(l.Data)
		if err != nil {
			return st, fmt.Errorf("entry %d: %w", i, err)
		}
		if next, changed, err := apply(&st, cmd); err == nil && changed {
			st = next
		}
	}
	return st, nil
}
