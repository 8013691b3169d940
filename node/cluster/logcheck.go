package cluster

import (
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"

	"github.com/hashicorp/raft"
	wal "github.com/hashicorp/raft-wal"
	"github.com/hashicorp/raft-wal/fs"
	"github.com/hashicorp/raft-wal/metadb"
	"github.com/hashicorp/raft-wal/segment"
	"github.com/hashicorp/raft-wal/types"
)

// A router must start on whatever a crash left in its data directory, or
// say why it cannot; it must never panic. raft.NewRaft reads every log
// entry after the newest snapshot to rebuild its configuration and panics
// on one it cannot read, so Open reads them all first (checkLog) and
// returns ErrDamagedLog naming the directory, the entry and the recovery.
//
// raft-wal v0.4.0, which routers used before, cut the log's tail (when a
// deposed leader's uncommitted entries were replaced) by marking the
// segment sealed without writing its index block: every later start
// panicked with "sealed segment has no index block". v0.4.1 writes the
// index (Writer.ForceSeal) before it opens the next segment. A directory
// v0.4.0 left that way is repaired at start with the same call
// (repairUnindexed): the segment's frames are intact, and reading through
// them, as raft-wal does for its tail after a crash, finds every entry.

// damaged logs err at ERROR and returns it as an ErrDamagedLog naming the
// data directory and the recovery.
func (c *Agreement) damaged(err error) error {
	dir := c.cfg.DataDir
	c.log.Error("the Raft log in the data directory cannot be read; this router cannot start on it", "data_dir", dir, "err", err)
	return fmt.Errorf("%w: data directory %s: %v; to recover, stop this router, move %s aside and start it again "+
		"with the same node name (%s): it rejoins the cluster and copies the agreed state from the leader "+
		"(docs/cluster.md, \"After a crash\")", ErrDamagedLog, dir, err, dir, c.cfg.NodeID)
}

// checkLog returns an error naming the first entry raft.NewRaft would fail
// to read: every entry from the newest snapshot's index + 1 (1 without a
// snapshot) to the last one.
func checkLog(logs raft.LogStore, snaps raft.SnapshotStore) error {
	last, err := logs.LastIndex()
	if err != nil {
		return fmt.Errorf("last index: %w", err)
	}
	from := uint64(1)
	metas, err := snaps.List()
	if err != nil {
		return fmt.Errorf("list snapshots: %w", err)
	}
	if len(metas) > 0 { // newest first, as raft.NewRaft tries them
		from = metas[0].Index + 1
	}
	var l raft.Log
	for i := from; i <= last; i++ {
		if err := logs.GetLog(i, &l); err != nil {
			return fmt.Errorf("entry %d of %d-%d: %w", i, from, last, err)
		}
	}
	return nil
}

// repairUnindexed writes the index block of every segment of the WAL in
// walDir that raft-wal v0.4.0 sealed without one, and records it in the
// WAL's metadata (meta, which stays open for wal.Open). It touches only a
// segment that the metadata says is sealed, with no index, followed by the
// segment that starts right after its last entry (what a v0.4.0 tail cut
// leaves, and no other path writes), and only when reading through its
// frames finds every entry up to that last one. A segment it leaves alone
// is logged; checkLog then says whether Raft would need it. A crash midway
// is repaired again at the next start: an index block already written is
// found and kept. It returns how many segments it repaired.
func repairUnindexed(walDir string, meta *metadb.BoltMetaDB, lg *slog.Logger) (int, error) {
	ps, err := meta.Load(walDir)
	if err != nil {
		return 0, fmt.Errorf("raft-wal metadata: %w", err)
	}
	filer := segment.NewFiler(walDir, fs.New())
	repaired := 0
	for i, si := range ps.Segments {
		if si.SealTime.IsZero() || si.IndexStart != 0 {
			continue
		}
		file := filepath.Join(walDir, segment.FileName(si))
		if i+1 == len(ps.Segments) || si.MaxIndex < si.BaseIndex || ps.Segments[i+1].BaseIndex != si.MaxIndex+1 || si.Codec != wal.CodecBinaryV1 {
			lg.Warn("a Raft log segment is sealed without its index block, and not as raft-wal v0.4.0 left one: not repaired",
				"segment", file, "first", si.MinIndex, "last", si.MaxIndex)
			continue
		}
		idx, err := sealSegment(filer, si)
		if err != nil {
			lg.Warn("a Raft log segment is sealed without its index block and cannot be repaired",
				"segment", file, "first", si.MinIndex, "last", si.MaxIndex, "err", err)
			continue
		}
		ps.Segments[i].IndexStart = idx
		if err := meta.CommitState(ps); err != nil {
			return repaired, fmt.Errorf("raft-wal metadata: %w", err)
		}
		repaired++
		lg.Warn("repaired a Raft log segment sealed without its index block (raft-wal v0.4.0 cut the log's tail that way)",
			"segment", file, "first", si.MinIndex, "last", si.MaxIndex)
	}
	return repaired, nil
}

// sealSegment reads through the segment's frames and writes its index
// block after the last complete batch, returning the index's offset.
func sealSegment(filer *segment.Filer, si types.SegmentInfo) (uint64, error) {
	w, err := filer.RecoverTail(si)
	if err != nil {
		return 0, err
	}
	defer w.Close()
	if got := w.LastIndex(); got < si.MaxIndex {
		return 0, fmt.Errorf("its frames end at entry %d", got)
	}
	return w.ForceSeal()
}

// errRaftPanic marks a panic of raft.NewRaft that newRaft recovered.
var errRaftPanic = errors.New("raft panicked while reading its state")

// newRaft is raft.NewRaft, with a panic (it panics on a log entry it
// cannot read; checkLog reads them first, so this is a last resort)
// returned as an error wrapping errRaftPanic. Nothing runs yet when it
// panics: Raft starts its goroutines last.
func newRaft(rc *raft.Config, f raft.FSM, logs raft.LogStore, stable raft.StableStore, snaps raft.SnapshotStore, t raft.Transport) (r *raft.Raft, err error) {
	defer func() {
		if p := recover(); p != nil {
			r, err = nil, fmt.Errorf("%w: %v", errRaftPanic, p)
		}
	}()
	return raft.NewRaft(rc, f, logs, stable, snaps, t)
}
