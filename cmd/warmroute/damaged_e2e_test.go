package main

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft-wal/metadb"
	"github.com/hashicorp/raft-wal/types"
	"github.com/warmroute/warmroute/loadtest/proc"
)

// TestE2EDamagedDataDir: a router of a three-router cluster restarts on a
// data directory whose Raft log is damaged.
//
//   - Cut the way raft-wal v0.4.0 cut a log's tail (the segment marked
//     sealed without its index block; every start panicked in
//     raft.NewRaft): the router repairs it, starts, and agrees with the
//     others.
//   - A segment file truncated: it exits with status 1 and a message that
//     names the directory and the recovery, without a panic.
//   - The recovery the message gives (move the directory aside, start
//     again with the same name): it rejoins and serves the agreed state,
//     a backend added before included.
func TestE2EDamagedDataDir(t *testing.T) {
	t.Parallel()
	needCluster(t)
	_, urls := heldEngines(t, 3)
	var args []proc.ServeArgs
	ps := spawnCluster(t, 3, proc.ServeArgs{Backends: urls[:2]}, func(i int, a *proc.ServeArgs) {
		if i == 0 {
			args = nil
		}
		a.Listen, a.AdminListen, a.GossipListen, a.RaftListen, a.DataDir = freeAddr(t), freeAddr(t), freeAddr(t), freeAddr(t), t.TempDir()
		args = append(args, *a)
	})
	c := &http.Client{Timeout: 5 * time.Second}
	waitAgreed(t, c, ps, 30*time.Second)
	resp, err := c.Post(ps[0].admin+"/v1/backends", "application/json", strings.NewReader(fmt.Sprintf(`{"id":"added","url":%q}`, urls[2])))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("adding a backend: %d %s", resp.StatusCode, body)
	}
	waitAgreed(t, c, ps, 30*time.Second)

	const r2 = 2
	dir := args[r2].DataDir
	walDir := filepath.Join(dir, "wal")
	stop := func() {
		t.Helper()
		if err := ps[r2].Stop(10 * time.Second); err != nil {
			t.Fatalf("stopping r2: %v", err)
		}
	}
	var doc struct {
		Raft struct {
			LastIndex uint64 `json:"last_index"`
		} `json:"raft"`
	}
	if err := getJSON(c, ps[r2].admin+"/v1/cluster", &doc); err != nil {
		t.Fatal(err)
	}
	stop()

	// 1. The log cut as raft-wal v0.4.0 cut it.
	if err := cutLikeV040(walDir, doc.Raft.LastIndex-1); err != nil {
		t.Fatal(err)
	}
	ps[r2] = spawnRouter(t, args[r2])
	if err := ps[r2].waitReady(); err != nil {
		t.Fatalf("r2 on a log raft-wal v0.4.0 cut: %v", err)
	}
	waitAgreed(t, c, ps, 30*time.Second)
	if !strings.Contains(ps[r2].Logs(), "repaired a Raft log segment") {
		t.Errorf("r2 logged no repair:\n%s", ps[r2].Logs())
	}
	stop()

	// 2. The oldest segment file truncated.
	segs, err := filepath.Glob(filepath.Join(walDir, "*.wal"))
	if err != nil || len(segs) < 2 {
		t.Fatalf("segments of r2's log: %v %v", segs, err)
	}
	slices.Sort(segs) // named by first index
	if err := os.Truncate(segs[0], 64); err != nil {
		t.Fatal(err)
	}
	p := spawnRouter(t, args[r2])
	select {
	case <-p.Done():
	case <-time.After(30 * time.Second):
		t.Fatalf("r2 did not exit on a damaged log:\n%s", p.Logs())
	}
	p.Stop(time.Second) // it exited, as it should
	out := p.Logs()
	for _, want := range []string{"the Raft log cannot be read", "data directory " + dir, "move " + dir + " aside", "level=ERROR"} {
		if !strings.Contains(out, want) {
			t.Errorf("r2's output on a damaged log lacks %q", want)
		}
	}
	if p.Status() != "exit status 1" || strings.Contains(out, "panic:") {
		t.Errorf("r2 on a damaged log: %s, want exit status 1 and no panic", p.Status())
	}
	if t.Failed() {
		t.Fatalf("r2's output:\n%s", out)
	}
	t.Logf("r2 on a truncated segment: %s, %s", p.Status(), out[strings.LastIndex(strings.TrimSpace(out), "\n")+1:])

	// 3. The recovery the message gives.
	if err := os.Rename(dir, dir+".damaged"); err != nil {
		t.Fatal(err)
	}
	ps[r2] = spawnRouter(t, args[r2])
	if err := ps[r2].waitReady(); err != nil {
		t.Fatalf("r2 on a fresh data directory: %v", err)
	}
	waitAgreed(t, c, ps, 30*time.Second)
	var list struct {
		Backends []struct {
			ID string `json:"id"`
		} `json:"backends"`
	}
	if err := getJSON(c, ps[r2].admin+"/v1/backends", &list); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, b := range list.Backends {
		found = found || b.ID == "added"
	}
	if !found {
		t.Errorf("r2 rejoined without the backend added before: %+v", list.Backends)
	}
}

// cutLikeV040 rewrites the raft-wal metadata in walDir as raft-wal v0.4.0
// left it after cutting the log's tail after entry cut: the tail segment
// marked sealed at cut without an index block, followed by a new segment
// from cut+1 (its file is created when the log opens).
func cutLikeV040(walDir string, cut uint64) error {
	meta := &metadb.BoltMetaDB{}
	defer meta.Close()
	ps, err := meta.Load(walDir)
	if err != nil {
		return err
	}
	n := len(ps.Segments)
	if n == 0 || !ps.Segments[n-1].SealTime.IsZero() || cut < ps.Segments[n-1].BaseIndex {
		return fmt.Errorf("no open tail segment holding entry %d: %+v", cut, ps.Segments)
	}
	ps.Segments[n-1].SealTime, ps.Segments[n-1].MaxIndex = time.Now(), cut
	tail := ps.Segments[n-1]
	ps.Segments = append(ps.Segments, types.SegmentInfo{
		ID: ps.NextSegmentID, BaseIndex: cut + 1, MinIndex: cut + 1,
		SizeLimit: tail.SizeLimit, Codec: tail.Codec, CreateTime: time.Now(),
	})
	ps.NextSegmentID++
	return meta.CommitState(ps)
}
