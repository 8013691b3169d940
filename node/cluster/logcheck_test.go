package cluster

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	wal "github.com/hashicorp/raft-wal"
	"github.com/hashicorp/raft-wal/metadb"
	"github.com/hashicorp/raft-wal/segment"
	"github.com/hashicorp/raft-wal/types"
	"github.com/warmroute/warmroute/internal/testkit"
)

func bufferLogger(b *testkit.Buffer) *slog.Logger {
	return slog.New(slog.NewTextHandler(b, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

// cutLikeV040 rewrites the WAL metadata in walDir as raft-wal v0.4.0 left
// it after cutting the log's tail after entry cut: the tail segment marked
// sealed at cut without an index block, followed by a new segment from
// cut+1 (whose file is created when the WAL opens). It returns the cut
// segment.
func cutLikeV040(t *testing.T, walDir string, cut uint64) types.SegmentInfo {
	t.Helper()
	meta := &metadb.BoltMetaDB{}
	defer meta.Close()
	ps, err := meta.Load(walDir)
	if err != nil {
		t.Fatal(err)
	}
	n := len(ps.Segments)
	if n == 0 || !ps.Segments[n-1].SealTime.IsZero() || cut < ps.Segments[n-1].BaseIndex {
		t.Fatalf("no open tail segment holding entry %d: %+v", cut, ps.Segments)
	}
	ps.Segments[n-1].SealTime, ps.Segments[n-1].MaxIndex = time.Now(), cut
	cutSeg := ps.Segments[n-1]
	ps.Segments = append(ps.Segments, types.SegmentInfo{
		ID: ps.NextSegmentID, BaseIndex: cut + 1, MinIndex: cut + 1,
		SizeLimit: cutSeg.SizeLimit, Codec: cutSeg.Codec, CreateTime: time.Now(),
	})
	ps.NextSegmentID++
	if err := meta.CommitState(ps); err != nil {
		t.Fatal(err)
	}
	return cutSeg
}

// nopFSM is a state machine for a bare raft.NewRaft.
type nopFSM struct{}

func (nopFSM) Apply(*raft.Log) any                 { return nil }
func (nopFSM) Snapshot() (raft.FSMSnapshot, error) { return nil, errors.New("no snapshots") }
func (nopFSM) Restore(rc io.ReadCloser) error      { return rc.Close() }

// writeLog runs a single router on dir, commits n backend changes and
// stops it, returning its last log index.
func writeLog(t *testing.T, dir string, n int) uint64 {
	t.Helper()
	tn := newTestNet(t, true)
	a := tn.start("a", func(c *Config) { c.BootstrapExpect = 1; c.DataDir = dir })
	leader(t, []*tnode{a})
	for i := range n {
		applyAny(t, []*tnode{a}, UpsertBackend(Backend{ID: fmt.Sprintf("gpu-%d/", i), URL: fmt.Sprintf("http://127.0.0.1:%d", 9100+i)}))
	}
	last := a.c.Status().LastIndex
	tn.stop("a", true)
	return last
}

// TestRepairV040Cut: a data directory whose log raft-wal v0.4.0 cut (the
// cut segment sealed without its index) made raft.NewRaft panic at every
// start. checkLog names the entry instead, newRaft turns the panic into an
// error, and Open repairs the segment (once) and starts on the entries
// before the cut.
func TestRepairV040Cut(t *testing.T) {
	dir := t.TempDir()
	walDir := filepath.Join(dir, "wal")
	last := writeLog(t, dir, 12)
	cut := last - 4
	cutLikeV040(t, walDir, cut)

	// What raft.NewRaft met in such a directory: the new leader's entries
	// after the cut, readable, and the cut segment's, not.
	meta := &metadb.BoltMetaDB{}
	w, err := wal.Open(walDir, wal.WithMetaStore(meta))
	if err != nil {
		t.Fatal(err)
	}
	const added = 3
	for i := cut + 1; i <= cut+added; i++ {
		if err := w.StoreLog(&raft.Log{Index: i, Term: 1, Type: raft.LogNoop}); err != nil {
			t.Fatal(err)
		}
	}
	err = checkLog(w, raft.NewInmemSnapshotStore())
	if err == nil || !strings.Contains(err.Error(), "sealed segment has no index block") {
		t.Errorf("checkLog on the cut log: %v, want the unreadable entry named", err)
	}
	_, trans := raft.NewInmemTransport("x")
	rc := raft.DefaultConfig()
	rc.LocalID, rc.Logger = "x", newHclog(testLogger(), "raft")
	if r, err := newRaft(rc, nopFSM{}, w, w, raft.NewInmemSnapshotStore(), trans); !errors.Is(err, errRaftPanic) {
		if r != nil {
			r.Shutdown().Error()
		}
		t.Errorf("raft.NewRaft on the cut log: %v, want its panic as an error", err)
	}
	trans.Close()
	w.Close()
	meta.Close()

	var logs testkit.Buffer
	tn := newTestNet(t, true)
	start := func() *tnode {
		return tn.start("a", func(c *Config) { c.BootstrapExpect = 1; c.DataDir = dir; c.Logger = bufferLogger(&logs) })
	}
	a := start()
	if !strings.Contains(logs.String(), "repaired a Raft log segment") {
		t.Errorf("no repair logged:\n%s", logs.String())
	}
	if got := a.c.Status().LastIndex; got != cut+added {
		t.Errorf("last index %d after the repair, want %d", got, cut+added)
	}
	leader(t, []*tnode{a})
	e := applyAny(t, []*tnode{a}, RemoveBackend("gpu-0/"))
	tn.stop("a", true)

	// The repair was recorded: the next start needs none and resumes at
	// the last write.
	before := strings.Count(logs.String(), "repaired a Raft log segment")
	a = start()
	if n := strings.Count(logs.String(), "repaired a Raft log segment"); n != before {
		t.Errorf("repaired again on the next start")
	}
	if _, epoch := a.c.State(); epoch != e {
		t.Errorf("epoch %d after the restart, want %d", epoch, e)
	}
	if strings.Contains(logs.String(), "level=ERROR") {
		t.Errorf("errors logged:\n%s", logs.String())
	}
}

// TestDamagedLogRefused: a data directory whose log cannot be read where
// Raft reads it at start makes Open return ErrDamagedLog naming the
// directory, the entry and the recovery, logged at ERROR; it never panics,
// and it releases the directory (a second Open says the same).
func TestDamagedLogRefused(t *testing.T) {
	for _, tc := range []struct {
		name   string
		damage func(t *testing.T, walDir string, seg types.SegmentInfo)
		want   string
	}{
		{
			// The cut segment's frames are gone too: nothing to repair.
			name: "cut segment truncated",
			damage: func(t *testing.T, walDir string, seg types.SegmentInfo) {
				if err := os.Truncate(filepath.Join(walDir, segment.FileName(seg)), 64); err != nil {
					t.Fatal(err)
				}
			},
			want: "entry 1 of 1-",
		},
		{
			name: "cut segment missing",
			damage: func(t *testing.T, walDir string, seg types.SegmentInfo) {
				if err := os.Remove(filepath.Join(walDir, segment.FileName(seg))); err != nil {
					t.Fatal(err)
				}
			},
			want: "no such file",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			walDir := filepath.Join(dir, "wal")
			last := writeLog(t, dir, 6)
			tc.damage(t, walDir, cutLikeV040(t, walDir, last-2))
			for attempt := 1; attempt <= 2; attempt++ {
				var logs testkit.Buffer
				cfg := fastConfig("a")
				cfg.BootstrapExpect, cfg.DataDir, cfg.Network, cfg.Logger = 1, dir, NewInmemNetwork(), bufferLogger(&logs)
				c, err := Open(cfg, nil, nil)
				if err == nil {
					c.Close()
					t.Fatalf("attempt %d: a damaged log opened", attempt)
				}
				msg := err.Error()
				if !errors.Is(err, ErrDamagedLog) || !strings.Contains(msg, dir) || !strings.Contains(msg, tc.want) ||
					!strings.Contains(msg, "move "+dir+" aside") || !strings.Contains(msg, "(a)") {
					t.Errorf("attempt %d: %v\nwant ErrDamagedLog naming %s, %q and the recovery", attempt, err, dir, tc.want)
				}
				if !strings.Contains(logs.String(), "level=ERROR") {
					t.Errorf("attempt %d: nothing logged at ERROR:\n%s", attempt, logs.String())
				}
			}
		})
	}
}

// TestCheckLogFromSnapshot: checkLog reads from the newest snapshot on, as
// raft.NewRaft does, so entries a snapshot covers may be gone.
func TestCheckLogFromSnapshot(t *testing.T) {
	logs := raft.NewInmemStore()
	for i := uint64(5); i <= 9; i++ {
		if err := logs.StoreLog(&raft.Log{Index: i, Term: 1, Type: raft.LogNoop}); err != nil {
			t.Fatal(err)
		}
	}
	snaps := raft.NewInmemSnapshotStore()
	if err := checkLog(logs, snaps); err == nil || !strings.Contains(err.Error(), "entry 1 of 1-9") {
		t.Errorf("without a snapshot: %v, want entry 1 named", err)
	}
	_, trans := raft.NewInmemTransport("x")
	defer trans.Close()
	sink, err := snaps.Create(raft.SnapshotVersionMax, 4, 1, raft.Configuration{}, 1, trans)
	if err != nil {
		t.Fatal(err)
	}
	if err := sink.Close(); err != nil {
		t.Fatal(err)
	}
	if err := checkLog(logs, snaps); err != nil {
		t.Errorf("from the snapshot at 4: %v", err)
	}
	if err := logs.DeleteRange(7, 7); err != nil {
		t.Fatal(err)
	}
	if err := checkLog(logs, snaps); err == nil || !strings.Contains(err.Error(), "entry 7 of 5-9") {
		t.Errorf("entry 7 gone: %v, want it named", err)
	}
}

// BenchmarkCheckLog: what checkLog adds to a start, on raft-wal, for the
// most entries a snapshot leaves to read (SnapshotThreshold +
// TrailingLogs of DefaultConfig, 2,048) of a typical size.
func BenchmarkCheckLog(b *testing.B) {
	meta := &metadb.BoltMetaDB{}
	w, err := wal.Open(b.TempDir(), wal.WithMetaStore(meta))
	if err != nil {
		b.Fatal(err)
	}
	defer meta.Close()
	defer w.Close()
	cfg := DefaultConfig()
	n := cfg.SnapshotThreshold + cfg.TrailingLogs
	data := bytes.Repeat([]byte("x"), 300)
	var batch []*raft.Log
	for i := uint64(1); i <= n; i++ {
		batch = append(batch, &raft.Log{Index: i, Term: 1, Type: raft.LogCommand, Data: data})
	}
	if err := w.StoreLogs(batch); err != nil {
		b.Fatal(err)
	}
	snaps := raft.NewInmemSnapshotStore()
	b.ResetTimer()
	for b.Loop() {
		if err := checkLog(w, snaps); err != nil {
			b.Fatal(err)
		}
	}
}
