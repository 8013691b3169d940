package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/warmroute/warmroute/loadtest/gpusim"
	"github.com/warmroute/warmroute/loadtest/stats"
	"github.com/warmroute/warmroute/loadtest/trace"
)

// The fleet 'trace bounds' assumes: the demo's.
const (
	traceBoundInstances = demoInstances
	traceBoundKVBlocks  = demoKVBlocks
)

// cmdTrace generates a synthetic Mooncake-format trace, or prints the
// offline hit-rate bounds of a trace.
func cmdTrace(_ context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		traceUsage(stderr)
		return errors.New("missing subcommand: gen or bounds")
	}
	switch args[0] {
	case "-h", "-help", "--help", "help":
		traceUsage(stdout)
		return flag.ErrHelp
	case "gen":
		return traceGen(args[1:], stdout, stderr)
	case "bounds":
		return traceBounds(args[1:], stdout, stderr)
	}
	traceUsage(stderr)
	return fmt.Errorf("unknown subcommand %q (want gen or bounds)", args[0])
}

func traceUsage(w io.Writer) {
	fmt.Fprint(w, `usage: warmroute trace gen --out FILE [flags]
       warmroute trace bounds [flags] FILE

Traces are JSON lines in the format of Mooncake's public traces:
  {"timestamp": 0, "input_length": 6758, "output_length": 500, "hash_ids": [0, 1, 2, ...]}
(timestamp in ms from the start, lengths in tokens, one hash id per block of
512 prompt tokens: equal leading hash ids are a shared prefix).

  gen     writes a synthetic trace: conversations whose turns extend the previous
          turn's hash ids and questions on shared documents, all behind one
          system prompt block, Poisson arrivals; seeded, so deterministic
  bounds  prints the KV hit rate an infinite cache, the demo fleet's caches
          under perfect prefix affinity, and one cache would give the trace's
          requests, without a fleet

'warmroute loadtest --trace FILE' replays a trace against an endpoint.
Run 'warmroute trace gen --help' (or 'bounds') for the flags. See docs/loadtest.md.
`)
}

// bindReplayFlags registers how a trace is replayed (loadtest --trace
// and trace bounds share them).
func bindReplayFlags(fs *flag.FlagSet) *trace.ReplayConfig {
	rc := trace.DefaultReplayConfig()
	fs.IntVar(&rc.BlockTokens, "trace-block-tokens", rc.BlockTokens, "trace: prompt tokens per hash id")
	fs.Float64Var(&rc.TimeScale, "trace-time-scale", rc.TimeScale, "trace: divide the trace's times by this (10: ten times faster)")
	fs.DurationVar(&rc.WindowStart, "trace-window-start", rc.WindowStart, "trace: replay from this point of trace time")
	fs.DurationVar(&rc.Window, "trace-window", rc.Window, "trace: replay this much trace time (0: to the end)")
	fs.IntVar(&rc.MaxTokens, "trace-max-tokens", rc.MaxTokens, "trace: max_tokens is the record's output_length, capped at this")
	return &rc
}

// readTrace parses a trace file.
func readTrace(path string, blockTokens int) ([]trace.Record, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	recs, err := trace.Parse(f, trace.ParseConfig{BlockTokens: blockTokens})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(recs) == 0 {
		return nil, fmt.Errorf("%s: no records", path)
	}
	return recs, nil
}

func describeReplay(p *trace.Replay, rc *trace.ReplayConfig) string {
	d := fmt.Sprintf("%d requests in %.1fs", p.Len(), p.Span().Seconds())
	if rc.TimeScale != 1 {
		d += fmt.Sprintf(" (trace time / %g)", rc.TimeScale)
	}
	if rc.WindowStart > 0 || rc.Window > 0 {
		d += fmt.Sprintf(", window %v+%v", rc.WindowStart, rc.Window)
	}
	return d + fmt.Sprintf(", max_tokens <= %d", rc.MaxTokens)
}

func traceGen(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("trace gen", flag.ContinueOnError)
	fs.SetOutput(stderr)
	c := trace.DefaultGenConfig()
	out := fs.String("out", "", "write the trace to this file (- for stdout)")
	fs.Uint64Var(&c.Seed, "seed", c.Seed, "seed (same seed and flags, same trace)")
	fs.IntVar(&c.Requests, "requests", c.Requests, "records")
	fs.Float64Var(&c.Rate, "rate", c.Rate, "arrivals per second of trace time")
	fs.IntVar(&c.BlockTokens, "block-tokens", c.BlockTokens, "prompt tokens per hash id")
	fs.IntVar(&c.MeanInputTokens, "mean-input-tokens", c.MeanInputTokens, "mean prompt length (Mooncake's conversation trace: about 12,000; smaller keeps a 2-core machine's replay fast)")
	fs.IntVar(&c.MeanOutputTokens, "mean-output-tokens", c.MeanOutputTokens, "mean output_length")
	fs.IntVar(&c.Turns, "turns", c.Turns, "mean turns per conversation (1 to 2*turns-1)")
	fs.DurationVar(&c.Think, "think", c.Think, "mean time between two turns of a conversation")
	fs.Float64Var(&c.DocShare, "doc-share", c.DocShare, "share of requests that are questions on a shared document")
	fs.IntVar(&c.Documents, "documents", c.Documents, "shared documents")
	usage := "usage: warmroute trace gen --out FILE [flags]\n\n" +
		"Writes a synthetic Mooncake-format trace: every request opens with the same\n" +
		"system prompt block; conversations of several turns, each turn's hash ids\n" +
		"extending the previous turn's; a share of questions on shared documents;\n" +
		"Poisson arrivals. The defaults make a minute of traffic whose working set is\n" +
		"several times one demo instance's KV cache (see 'warmroute trace bounds').\n\nflags:\n"
	if err := parseCommand(fs, args, usage); err != nil {
		return err
	}
	if *out == "" {
		fs.Usage()
		return errors.New("--out is required")
	}
	recs, err := trace.Generate(c)
	if err != nil {
		return err
	}
	info := stderr
	if *out == "-" {
		if err := trace.Write(stdout, recs); err != nil {
			return err
		}
	} else {
		if err := writeReportFile(*out, func(w io.Writer) error { return trace.Write(w, recs) }); err != nil {
			return err
		}
		info = stdout
	}
	fmt.Fprintf(info, "trace %s: %s\n", *out, trace.Describe(recs).Format(c.BlockTokens))
	return nil
}

func traceBounds(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("trace bounds", flag.ContinueOnError)
	fs.SetOutput(stderr)
	rc := bindReplayFlags(fs)
	requests := fs.Int("requests", 0, "only the first requests of the window (0: all)")
	warmup := fs.Duration("warmup", 0, "requests sent in this first part of the replay (replay time) fill the caches but are not counted, as loadtest --warmup")
	sim := gpusim.DefaultConfig()
	instances := fs.Int("bound-instances", traceBoundInstances, "caches of the fleet bound (gpusim instances)")
	kvBlocks := fs.Int("bound-kv-blocks", traceBoundKVBlocks, "KV blocks per cache (gpusim --kv-blocks)")
	fs.IntVar(&sim.BlockSize, "block-size", sim.BlockSize, "gpusim --block-size (tokens per KV block)")
	fs.IntVar(&sim.BytesPerToken, "bytes-per-token", sim.BytesPerToken, "gpusim --bytes-per-token")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: warmroute trace bounds [flags] FILE\n\n"+
			"Renders the trace's requests as 'warmroute loadtest --trace' would send them,\n"+
			"computes their KV blocks as gpusim does, and prints the KV hit rate that an\n"+
			"infinite cache (bound_hit_rate), %d LRU caches of %d blocks with every request\n"+
			"on the one holding its longest prefix under a load cap (bound_fleet_hit_rate;\n"+
			"by default the demo fleet), and a single such cache would give them.\n\nflags:\n",
			traceBoundInstances, traceBoundKVBlocks)
		fs.PrintDefaults()
	}
	pos, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		fs.Usage()
		return errors.New("bounds: want one trace file")
	}
	if *warmup < 0 {
		return fmt.Errorf("--warmup %v < 0", *warmup)
	}
	recs, err := readTrace(pos[0], rc.BlockTokens)
	if err != nil {
		return err
	}
	rc.MaxRequests, rc.BytesPerToken = *requests, sim.BytesPerToken
	fleet := stats.BoundsConfig{Caches: *instances, CacheBlocks: *kvBlocks, BlockTokens: sim.BlockSize}
	one := fleet
	one.Caches = 1
	var res [2]stats.BoundsResult
	var replay *trace.Replay
	for i, c := range []stats.BoundsConfig{fleet, one} {
		if replay, err = trace.NewReplay(recs, *rc); err != nil {
			return err
		}
		if res[i], err = trace.Bounds(replay, c, sim.BytesPerToken, *warmup); err != nil {
			return err
		}
	}
	b := res[0]
	fmt.Fprintf(stdout, "trace %s: %s\n", pos[0], trace.Describe(recs).Format(rc.BlockTokens))
	fmt.Fprintf(stdout, "replayed: %s; %d measured", describeReplay(replay, rc), b.Requests)
	if b.Unmeasured > 0 {
		fmt.Fprintf(stdout, " after %d in the %v warm-up", b.Unmeasured, *warmup)
	}
	fmt.Fprintf(stdout, ", %d prompt tokens in KV blocks of %d tokens (%d bytes each), %d distinct blocks\n",
		b.QueriedTokens, b.BlockTokens, b.BlockTokens*sim.BytesPerToken, b.DistinctBlocks)
	if b.Skipped > 0 || b.Truncated {
		fmt.Fprintf(stdout, "skipped: %d requests (truncated: %v)\n", b.Skipped, b.Truncated)
	}
	fmt.Fprintf(stdout, "bound_hit_rate        %5.1f%%  infinite cache\n", 100*b.HitRate)
	fmt.Fprintf(stdout, "bound_fleet_hit_rate  %5.1f%%  %d caches of %d blocks (%d tokens each), longest cached prefix, load cap %g x average\n",
		100*b.FleetHitRate, b.Caches, b.CacheBlocks, b.CacheBlocks*b.BlockTokens, b.LoadFactor)
	fmt.Fprintf(stdout, "one cache             %5.1f%%  1 cache of %d blocks\n", 100*res[1].FleetHitRate, b.CacheBlocks)
	return nil
}
