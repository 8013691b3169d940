package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/warmroute/warmroute/loadtest/gpusim"
	"github.com/warmroute/warmroute/loadtest/report"
)

// runCmd runs a subcommand in process and returns its output.
func runCmd(t *testing.T, cmd func(context.Context, []string, io.Writer, io.Writer) error, args ...string) (string, string, error) {
	t.Helper()
	var out, errOut bytes.Buffer
	err := cmd(context.Background(), args, &out, &errOut)
	return out.String(), errOut.String(), err
}

// TestTraceGenBoundsAndReplay: 'trace gen' writes a trace, 'trace bounds'
// prints its bounds, and 'loadtest --trace' replays it against gpusim
// with the bounds next to the measured hit rate.
func TestTraceGenBoundsAndReplay(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "t.jsonl")
	gen := []string{"gen", "--out", path, "--requests", "60", "--rate", "200", "--block-tokens", "64",
		"--mean-input-tokens", "500", "--mean-output-tokens", "8", "--think", "100ms", "--documents", "3"}
	out, _, err := runCmd(t, cmdTrace, gen...)
	if err != nil || !strings.Contains(out, "60 requests over") {
		t.Fatalf("gen: %v\n%s", err, out)
	}
	first, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := runCmd(t, cmdTrace, gen...); err != nil {
		t.Fatal(err)
	}
	if again, _ := os.ReadFile(path); !bytes.Equal(first, again) {
		t.Fatal("the same flags wrote a different trace")
	}

	out, _, err = runCmd(t, cmdTrace, "bounds", "--trace-block-tokens", "64", "--bound-instances", "2", "--bound-kv-blocks", "500", path)
	if err != nil {
		t.Fatalf("bounds: %v\n%s", err, out)
	}
	for _, want := range []string{"60 measured", "bound_hit_rate ", "bound_fleet_hit_rate ", "2 caches of 500 blocks (8000 tokens each)", "one cache "} {
		if !strings.Contains(out, want) {
			t.Errorf("bounds output lacks %q:\n%s", want, out)
		}
	}

	sim := gpusim.FastConfig()
	sim.KVCacheBlocks = 500
	f, err := gpusim.StartFleet(context.Background(), gpusim.FleetConfig{N: 2, Instance: sim})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	urls := f.URLs()
	jsonPath := filepath.Join(dir, "r.json")
	out, errOut, err := runCmd(t, cmdLoadtest, "--trace", path, "--trace-block-tokens", "64", "--trace-time-scale", "4",
		"--target", strings.Join(urls, ","), "--metrics", urls[0]+"/metrics,"+urls[1]+"/metrics",
		"--bound-kv-blocks", "500", "--json", jsonPath, "--quiet")
	if err != nil {
		t.Fatalf("loadtest: %v\n%s\n%s", err, out, errOut)
	}
	if !strings.Contains(errOut, "trace "+path+": 60 requests in") || !strings.Contains(errOut, "open loop at the trace's times") {
		t.Errorf("loadtest's first line:\n%s", errOut)
	}
	if !strings.Contains(out, "fleet bound") || !strings.Contains(out, "fleet bound: 2 caches of 500 blocks of 16 tokens") {
		t.Errorf("table:\n%s", out)
	}
	b, err := os.ReadFile(jsonPath)
	if err != nil {
		t.Fatal(err)
	}
	var rep report.Report
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	s := rep.Runs[0]
	if s.Workload != "trace" || s.Sent != 60 || s.OK != 60 || s.Bounds == nil || s.KV == nil || s.KV.HitRate > s.Bounds.HitRate {
		t.Fatalf("run %+v", s)
	}
}

func TestTraceErrors(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.jsonl")
	if err := os.WriteFile(bad, []byte(`{"timestamp": 0, "input_length": 600, "output_length": 4, "hash_ids": [0, 1]}`+"\n"+
		`{"timestamp": 1, "input_length": 600, "output_length": 4, "hash_ids": [0, 1, 2]}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		cmd  func(context.Context, []string, io.Writer, io.Writer) error
		args []string
		want string
	}{
		{cmdTrace, nil, "missing subcommand"},
		{cmdTrace, []string{"play"}, `unknown subcommand "play"`},
		{cmdTrace, []string{"gen"}, "--out is required"},
		{cmdTrace, []string{"gen", "--out", "-", "--rate", "0"}, "rate 0 outside"},
		{cmdTrace, []string{"bounds"}, "want one trace file"},
		{cmdTrace, []string{"bounds", bad}, "bad.jsonl: trace: line 2: trace: invalid record: input_length 600 needs 2 hash ids of 512 tokens, got 3"},
		{cmdTrace, []string{"bounds", filepath.Join(dir, "none.jsonl")}, "no such file"},
		{cmdTrace, []string{"bounds", "--bound-instances", "0", bad}, "line 2"},
		{cmdLoadtest, []string{"--trace", bad}, "line 2: "},
		{cmdLoadtest, []string{"--trace", bad, "--trace-window-start", "1h"}, "line 2: "},
	} {
		if _, _, err := runCmd(t, c.cmd, c.args...); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want %q", c.args, err, c.want)
		}
	}
	good := filepath.Join(dir, "good.jsonl")
	if err := os.WriteFile(good, []byte(`{"timestamp": 0, "input_length": 600, "output_length": 4, "hash_ids": [0, 1]}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"bounds", "--bound-instances", "0", good}, "0 caches"},
		{[]string{"bounds", "--trace-window-start", "1s", good}, "no record in the window"},
		{[]string{"bounds", "--warmup", "-1s", good}, "--warmup"},
	} {
		if _, _, err := runCmd(t, cmdTrace, c.args...); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want %q", c.args, err, c.want)
		}
	}
}
