package cluster

import (
	"bytes"
	"encoding/json"
	"flag"
	"github.com/warmroute/warmroute/ring"
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

var updateGolden = flag.Bool("update-golden", false, "rewrite testdata/log.golden from the current encoder")

// goldenCommands are one command of every op, with every field set, so
// every name of the Raft log's JSON appears.
func goldenCommands() []Command {
	// The settings as they were before key_depth and overflow existed:
	// their entries must keep their bytes.
	old := ring.Settings{Strategy: ring.PrefixAware, PrefixLength: 4096, ConcurrencyThreshold: 16, BusyIsFull: true, OverflowDepth: 8}
	r := old
	r.PrefixLength, r.ConcurrencyThreshold, r.LoadFactor = 8192, 24, 1.25
	r.InvocationsJSON, r.BusyIsFull, r.OverflowDepth, r.PartitionCount, r.ZoneAware = true, true, 4, 271, true
	off := old
	off.BusyIsFull = false
	adaptive := off
	adaptive.KeyDepth, adaptive.Overflow = ring.AdaptiveDepth, ring.CostOverflow
	sessions := adaptive
	sessions.SessionHeader = "X-Session-Id"
	b := Backend{ID: "gpu-1/", URL: "http://10.0.0.1:8000", Zone: "z1", Weight: 2, State: StateDraining, StateBy: ByAdmin,
		Labels: map[string]string{"gpu": "h100", "model": "llama"}, Source: SourceAdmin}
	return []Command{
		{Op: OpSeed, Backends: []Backend{b, {ID: "gpu-2/", URL: "https://gpu-2:443"}}, Routing: &r, ClusterID: "0123456789abcdef0123456789abcdef"},
		UpsertBackend(b),
		RemoveBackend("gpu-1/"),
		SetBackendState("gpu-1/", StateDown),
		{Op: OpSetBackendState, ID: "gpu-1/", State: StateActive, By: ByHealth},
		SetRouting(r),
		SetRouting(off),
		{Op: OpSyncDiscovered, Backends: []Backend{{ID: "d:1", URL: "http://d:1", Zone: "z2"}}},
		SetClusterID("fedcba9876543210fedcba9876543210"),
		SetRouting(adaptive),
		SetSplits([]ring.Split{{Key: 0x8000000000000001, Depth: 0}, {Key: 42, Depth: 3}}),
		SetMoves([]ring.Move{{Partition: 7, Backend: "gpu-2/"}}),
		SetRouting(sessions),
		SetModels("gpu-2/", []string{"meta-llama/Llama-3.1-8B-Instruct", "sql-lora"}),
		Revoke([]string{"r2"}, []string{"1f2e3d"}),
		Unrevoke([]string{"r2"}, []string{"1f2e3d"}),
		SetRecomputeUnit(1536),
	}
}

// TestLogGolden keeps the Raft log's JSON exactly as written by earlier
// versions: every command encodes to the same bytes as in
// testdata/log.golden, and those bytes decode to the same command, so
// routers of different versions keep reading each other's log. The
// snapshot and state cache encoding of a state is held the same way.
func TestLogGolden(t *testing.T) {
	var got bytes.Buffer
	for _, c := range goldenCommands() {
		b, err := encodeCommand(c)
		if err != nil {
			t.Fatal(err)
		}
		got.Write(b)
		got.WriteByte('\n')
	}
	st, _, err := apply(&State{Backends: []Backend{}}, goldenCommands()[0])
	if err != nil {
		t.Fatal(err)
	}
	snap, err := json.Marshal(snapshotFile{Version: snapshotVersion, Epoch: 42, State: st})
	if err != nil {
		t.Fatal(err)
	}
	got.Write(snap)
	got.WriteByte('\n')

	path := filepath.Join("testdata", "log.golden")
	if *updateGolden {
		if err := os.WriteFile(path, got.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got.Bytes(), want) {
		t.Fatalf("the Raft log's JSON changed:\n got %s\nwant %s", got.Bytes(), want)
	}
	lines := bytes.Split(bytes.TrimSuffix(want, []byte("\n")), []byte("\n"))
	for i, c := range goldenCommands() {
		back, err := decodeCommand(lines[i])
		if err != nil {
			t.Fatalf("golden entry %d: %v", i, err)
		}
		if !reflect.DeepEqual(back, c) {
			t.Fatalf("golden entry %d decodes to\n%+v\nwant\n%+v", i, back, c)
		}
	}
	var sf snapshotFile
	if err := json.Unmarshal(lines[len(lines)-1], &sf); err != nil || !sf.State.equal(&st) {
		t.Fatalf("golden snapshot: %v\n%+v", err, sf.State)
	}
}
