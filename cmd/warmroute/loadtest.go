package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/warmroute/warmroute/loadtest"
	"github.com/warmroute/warmroute/loadtest/proc"
	"github.com/warmroute/warmroute/loadtest/report"
	"github.com/warmroute/warmroute/loadtest/stats"
	"github.com/warmroute/warmroute/loadtest/trace"
	"github.com/warmroute/warmroute/loadtest/workload"
)

// listFlag parses a comma-separated list into *dst; blanks around items and
// empty items are dropped, and each use replaces the list.
type listFlag struct{ dst *[]string }

func (f listFlag) String() string {
	if f.dst == nil {
		return ""
	}
	return strings.Join(*f.dst, ",")
}

func (f listFlag) Set(v string) error {
	*f.dst = splitList(v)
	return nil
}

// splitList splits v at commas, dropping blanks around items and empty
// items.
func splitList(v string) []string {
	var out []string
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}

// argsFlag collects extra flags for child processes (--gpusim-args,
// --router-args): words separated by blanks, with shell quoting
// (proc.SplitArgs); each use adds to them.
type argsFlag struct{ dst *[]string }

// argsSyntax describes argsFlag's values in --help.
const argsSyntax = "separated by blanks, quoted as in a shell; repeatable"

func (f argsFlag) String() string {
	if f.dst == nil {
		return ""
	}
	return strings.Join(*f.dst, " ")
}

func (f argsFlag) Set(v string) error {
	words, err := proc.SplitArgs(v)
	if err != nil {
		return err
	}
	*f.dst = append(*f.dst, words...)
	return nil
}

// parseCommand parses the flags of a command that takes no arguments;
// -h, --help and errors print usage (what the command does) and the flags.
func parseCommand(fs *flag.FlagSet, args []string, usage string) error {
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), usage)
		fs.PrintDefaults()
	}
	hintDurations(fs)
	if err := fs.Parse(args); err != nil {
		return flagError(fs, err)
	}
	if fs.NArg() > 0 {
		fs.Usage()
		return usageErrorf("unexpected arguments: %v", fs.Args())
	}
	return nil
}

// cmdLoadtest drives one OpenAI-compatible endpoint with one workload and
// prints the results.
func cmdLoadtest(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("loadtest", flag.ContinueOnError)
	fs.SetOutput(stderr)
	lc := loadtest.DefaultConfig()
	wc := workload.DefaultConfig()
	mode := string(lc.Mode)
	fs.Var(listFlag{&lc.Targets}, "target", "base URL(s) of the endpoint, comma-separated; requests go to them in turn")
	fs.StringVar(&mode, "mode", mode, "open (Poisson arrivals at --rate) or closed (--concurrency workers)")
	fs.Float64Var(&lc.Rate, "rate", lc.Rate, "open loop: arrivals per second")
	fs.IntVar(&lc.Concurrency, "concurrency", lc.Concurrency, "closed loop: concurrent requests")
	fs.IntVar(&lc.MaxInFlight, "max-in-flight", lc.MaxInFlight, "open loop: most requests in flight (later ones are late, and timed from their schedule)")
	fs.DurationVar(&lc.Duration, "duration", lc.Duration, "stop sending after this long (0: only --requests)")
	fs.IntVar(&lc.Requests, "requests", lc.Requests, "stop after this many requests (0: only --duration)")
	fs.DurationVar(&lc.Warmup, "warmup", lc.Warmup, "send this long before --duration without measuring (the hit rate then counts from its end)")
	fs.DurationVar(&lc.Timeout, "timeout", lc.Timeout, "per-request timeout")
	fs.DurationVar(&lc.Drain, "drain", lc.Drain, "wait this long for requests in flight at the end")
	seed := fs.Uint64("seed", 1, "seed of the workload and the arrival times (same seed, same requests)")
	fs.Var(listFlag{&lc.MetricsURLs}, "metrics", "backends' Prometheus /metrics URLs, comma-separated, for the KV-cache hit rate")
	fs.DurationVar(&lc.MetricsInterval, "metrics-interval", lc.MetricsInterval, "period of the hit-rate-over-time samples")
	fs.Var(listFlag{&lc.RouterMetricsURLs}, "router-metrics", "routers' admin /metrics URLs, comma-separated, for their cache predictions against what was delivered, per decision kind")
	fs.Var(listFlag{&lc.Backends}, "backends", "backend ids expected to get traffic, for max/min share (default: host:port of each --metrics URL)")
	fs.StringVar(&lc.BackendHeader, "backend-header", lc.BackendHeader, "response header naming the backend (X-Gpusim-Instance is the fallback)")
	fs.StringVar(&lc.DecisionHeader, "decision-header", lc.DecisionHeader, "response header naming the router's decision")
	fs.BoolVar(&lc.AllowRemote, "allow-remote", false, "allow targets outside 127.0.0.0/8")
	fs.StringVar(&lc.Label, "label", "", "name of this run in the output (e.g. the strategy)")
	jsonPath := fs.String("json", "", "write the summary as JSON to this file (- for stdout)")
	htmlPath := fs.String("html", "", "write an HTML report to this file")
	fs.DurationVar(&lc.ProgressInterval, "progress-interval", lc.ProgressInterval, "period of the progress line on stderr")
	quiet := fs.Bool("quiet", false, "no progress line")
	wc.BindFlags(fs)
	tracePath := fs.String("trace", "", "replay this Mooncake-format trace (JSON lines) instead of a generated workload: arrivals come from the trace's timestamps, not --rate; --requests and --duration (default: the whole trace) cut it short")
	rc := bindReplayFlags(fs)
	fs.IntVar(&lc.Bounds.Instances, "bound-instances", 0, "caches of the fleet bound, one per backend (0: one per --backends, --metrics URL or --target)")
	fs.IntVar(&lc.Bounds.KVBlocks, "bound-kv-blocks", 0, "KV blocks of 16 tokens per cache of the fleet bound: the backends' gpusim --kv-blocks (0: gpusim's default, 84000)")
	usage := "usage: warmroute loadtest [flags]\n\n" +
		"Drives an OpenAI-compatible endpoint (a warmroute router, one backend, or another\n" +
		"router) with a seeded workload, or replays a Mooncake-format trace (--trace), and\n" +
		"reports TTFT, inter-token and end-to-end latency (p50/p90/p99), throughput, errors\n" +
		"by kind, traffic share per backend, the router's decisions and, with --metrics, the\n" +
		"backends' KV-cache hit rate, next to two offline bounds computed from the requests\n" +
		"sent (an infinite cache, and --bound-instances LRU caches of --bound-kv-blocks).\n" +
		"To compare routing strategies on a local fleet, see 'warmroute demo'.\n" +
		"See docs/loadtest.md.\n\nflags:\n"
	if err := parseCommand(fs, args, usage); err != nil {
		return err
	}
	lc.Mode = loadtest.Mode(mode)
	lc.Seed, wc.Seed = *seed, *seed
	lc.Workload = string(wc.Kind)
	var recs []trace.Record
	if *tracePath != "" {
		set := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
		var err error
		if recs, err = readTrace(*tracePath, rc.BlockTokens); err != nil {
			return err
		}
		if !set["duration"] {
			lc.Duration = 0 // the whole trace
		}
		rc.MaxRequests, rc.Stream = lc.Requests, wc.Stream
		replay, err := trace.NewReplay(recs, *rc)
		if err != nil {
			return err
		}
		lc.Requests = replay.Len()
		lc.Workload = string(trace.Kind)
	}
	if err := lc.Validate(); err != nil {
		return err
	}
	if err := wc.Validate(); err != nil {
		return err
	}
	if wc.Model == "" {
		ids, err := loadtest.Models(ctx, lc.Targets[0])
		switch {
		case err != nil:
			return err
		case len(ids) == 0:
			return fmt.Errorf("%s/v1/models lists no model: set --model", lc.Targets[0])
		}
		wc.Model = ids[0]
	}
	var (
		gen  workload.Generator
		what string
		err  error
	)
	if recs != nil {
		rc.Model = wc.Model
		replay, err := trace.NewReplay(recs, *rc)
		if err != nil {
			return err
		}
		gen = replay
		what = fmt.Sprintf("trace %s: %s", *tracePath, describeReplay(replay, rc))
	} else {
		if gen, err = workload.New(wc); err != nil {
			return err
		}
		what = fmt.Sprintf("%s workload", wc.Kind)
	}
	fmt.Fprintf(stderr, "loadtest: %s (model %s, seed %d) against %s, %s\n",
		what, wc.Model, wc.Seed, strings.Join(lc.Targets, ","), describeLoad(&lc, recs != nil))
	if !*quiet {
		pw := newProgressWriter(stderr, 0, nil)
		pw.single = runLength{warmup: lc.Warmup, duration: lc.Duration, requests: lc.Requests}
		lc.Progress = pw
	}
	s, runErr := loadtest.Run(ctx, lc, gen)
	if runErr != nil && !errors.Is(runErr, loadtest.ErrInterrupted) {
		return runErr
	}
	if s.Label == "" {
		s.Label = "-"
	}
	if err := report.WriteTable(stdout, []stats.Summary{s}); err != nil {
		return err
	}
	rep := &report.Report{
		Title:       "warmroute load test",
		GeneratedAt: time.Now(),
		Command:     "warmroute loadtest " + strings.Join(args, " "),
		Setup:       []string{fmt.Sprintf("%s, %s, targets %s", what, describeLoad(&lc, recs != nil), strings.Join(lc.Targets, ","))},
		Partial:     s.Partial,
		Runs:        []stats.Summary{s},
	}
	if err := writeReports(rep, *jsonPath, *htmlPath, stdout, stderr); err != nil {
		return err
	}
	return runErr
}

func describeLoad(c *loadtest.Config, scheduled bool) string {
	d := fmt.Sprintf("open loop at %g req/s", c.Rate)
	switch {
	case c.Mode == loadtest.ClosedLoop:
		d = fmt.Sprintf("closed loop with %d workers", c.Concurrency)
	case scheduled:
		d = "open loop at the trace's times"
	}
	if c.Warmup > 0 {
		d += " after a " + c.Warmup.String() + " warm-up"
	}
	if c.Duration > 0 {
		d += " for " + c.Duration.String()
	}
	if c.Requests > 0 {
		d += fmt.Sprintf(", at most %d requests", c.Requests)
	}
	return d
}

// writeOutputs writes the JSON and HTML reports where asked.
func writeReports(rep *report.Report, jsonPath, htmlPath string, stdout, stderr io.Writer) error {
	if jsonPath == "-" {
		if err := report.WriteJSON(stdout, rep); err != nil {
			return err
		}
	} else if jsonPath != "" {
		if err := writeReportFile(jsonPath, func(w io.Writer) error { return report.WriteJSON(w, rep) }); err != nil {
			return err
		}
		fmt.Fprintf(stderr, "JSON: %s\n", jsonPath)
	}
	if htmlPath != "" {
		if err := writeReportFile(htmlPath, func(w io.Writer) error { return report.WriteHTML(w, rep) }); err != nil {
			return err
		}
		fmt.Fprintf(stderr, "HTML report: %s\n", htmlPath)
	}
	return nil
}

func writeReportFile(path string, write func(io.Writer) error) error {
	if dir := filepath.Dir(path); dir != "" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := write(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
