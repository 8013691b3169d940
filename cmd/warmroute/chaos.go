package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/warmroute/warmroute/loadtest/chaos"
)

// cmdChaos breaks a cluster on purpose under steady load and reports how
// routing held up.
func cmdChaos(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("chaos", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cc := chaos.DefaultConfig()
	sc := chaos.ShortConfig()
	lc := chaos.DefaultLocalConfig()
	pc := chaos.DefaultComposeConfig()
	wc := cc.Workload

	target := fs.String("target", "local", "where to run: local (child processes on loopback), compose (deploy/compose under Docker) or all")
	faults := fs.String("faults", "all", "comma-separated faults to run: all or some of "+faultNames())
	short := fs.Bool("short", false, "quick check: shorter warm-up, fault and observation windows (flags set explicitly win)")
	fs.Float64Var(&cc.Rate, "rate", cc.Rate, "steady load: requests per second (Poisson), spread over the routers")
	fs.IntVar(&cc.MaxInFlight, "max-in-flight", cc.MaxInFlight, "most requests in flight")
	fs.DurationVar(&cc.RequestTimeout, "request-timeout", cc.RequestTimeout, "per-request timeout")
	fs.Uint64Var(&cc.Seed, "seed", cc.Seed, "seed of the workload, the arrivals and the probe prompts")
	fs.DurationVar(&cc.Warmup, "warmup", cc.Warmup, "load before the first fault")
	fs.DurationVar(&cc.Pre, "pre", cc.Pre, "steady window measured before each fault")
	fs.DurationVar(&cc.Hold, "hold", cc.Hold, "how long a fault lasts before it is healed")
	fs.DurationVar(&cc.MinObserve, "min-observe", cc.MinObserve, "observe at least this long after a fault's last change settles")
	fs.DurationVar(&cc.MaxObserve, "max-observe", cc.MaxObserve, "and at most this long")
	fs.DurationVar(&cc.StableFor, "stable-for", cc.StableFor, "agreement must stay at 100% this long to count as reconverged")
	fs.IntVar(&cc.ProbePrompts, "probe-prompts", cc.ProbePrompts, "fixed prompts whose route the explainers are asked for")
	fs.IntVar(&cc.ProbeBatch, "probe-batch", cc.ProbeBatch, "prompts sent to every router's explainer per sample")
	fs.DurationVar(&cc.ProbeInterval, "probe-interval", cc.ProbeInterval, "agreement sampling period")
	fs.DurationVar(&cc.KVWindow, "kv-window", cc.KVWindow, "sliding window of the KV-cache hit rate")
	fs.Float64Var(&cc.KVTolerance, "kv-tolerance", cc.KVTolerance, "hit rate counts as recovered within this of its pre-fault level (absolute)")

	fs.IntVar(&lc.Routers, "routers", lc.Routers, "local: router processes")
	fs.IntVar(&lc.Backends, "backends", lc.Backends, "local: gpusim processes (one instance each)")
	fs.StringVar(&lc.Exe, "exe", "", "local: warmroute executable for the children (default: this one)")
	fs.Var(argsFlag{&lc.GpusimArgs}, "gpusim-args", "local: extra gpusim `flags`, "+argsSyntax+" (e.g. \"--time-scale 0.5\")")
	fs.Var(argsFlag{&lc.RouterArgs}, "router-args", "local: extra serve `flags`, "+argsSyntax)
	fs.DurationVar(&lc.RaftTimeout, "raft-timeout", lc.RaftTimeout, "local: the routers' --raft-timeout")
	noPartition := fs.Bool("no-partition", !lc.Partition, "local: run the routers as this user and skip router-partition (partitions need root and iptables)")
	fs.StringVar(&lc.WorkDir, "work-dir", "", "local: directory for logs and Raft data (default: a temporary one, removed at the end)")

	fs.StringVar(&pc.File, "compose-file", pc.File, "compose: the compose file")
	fs.StringVar(&pc.Image, "image", pc.Image, "compose: the warmroute image")
	fs.StringVar(&pc.Project, "project", "", "compose: project name (default wrchaos<pid>)")
	fs.StringVar(&pc.TimeScale, "time-scale", pc.TimeScale, "compose: gpusim --time-scale")
	keep := fs.Bool("keep", false, "leave the local work dir or the compose stack in place")

	jsonPath := fs.String("json", "", "write the reports as JSON to this file (- for stdout)")
	markdown := fs.Bool("markdown", false, "print the table as Markdown")
	noCheck := fs.Bool("no-check", false, "exit 0 even when an acceptance check fails")
	quiet := fs.Bool("quiet", false, "no progress lines")
	wc.BindFlags(fs)
	usage := fmt.Sprintf("usage: warmroute chaos [flags]\n\n"+
		"Starts a three-router cluster (local child processes, or the compose stack),\n"+
		"puts it under steady load and injects faults one at a time: %s.\n"+
		"For each it reports client errors (unavoidable / on the router hit / elsewhere),\n"+
		"the lowest routing agreement across the routers' explainers and the time back to\n"+
		"100%% after each change settles, the fraction of probe prompts whose backend moved,\n"+
		"and the KV-cache hit rate before the fault, at its lowest, and the time back.\n"+
		"It then checks the acceptance bounds and exits 1 if one is missed.\n"+
		"See docs/chaos.md.\n\nflags:\n", faultNames())
	if err := parseCommand(fs, args, usage); err != nil {
		return err
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if *short {
		for name, v := range map[string]struct {
			dst *time.Duration
			src time.Duration
		}{
			"warmup": {&cc.Warmup, sc.Warmup}, "pre": {&cc.Pre, sc.Pre}, "hold": {&cc.Hold, sc.Hold},
			"min-observe": {&cc.MinObserve, sc.MinObserve}, "max-observe": {&cc.MaxObserve, sc.MaxObserve},
			"stable-for": {&cc.StableFor, sc.StableFor},
		} {
			if !set[name] {
				*v.dst = v.src
			}
		}
	}
	fl, err := chaos.ParseFaults(*faults)
	if err != nil {
		return err
	}
	cc.Faults = fl
	cc.Workload = wc
	if !*quiet {
		cc.Log = stderr
	}
	lc.Partition = !*noPartition
	lc.KeepWorkDir = *keep
	pc.Keep = *keep
	if err := cc.Validate(); err != nil {
		return err
	}
	var targets []string
	switch *target {
	case "local", "compose":
		targets = []string{*target}
	case "all":
		targets = []string{"local", "compose"}
	default:
		return fmt.Errorf("--target %q: want local, compose or all", *target)
	}

	var reps []chaos.Report
	var runErr error
	for _, name := range targets {
		var tgt chaos.Target
		switch name {
		case "local":
			tgt, err = chaos.NewLocal(lc, cc.Log)
		case "compose":
			tgt, err = chaos.NewCompose(pc, cc.Log)
		}
		if errors.Is(err, chaos.ErrUnsupported) && *target == "all" {
			fmt.Fprintf(stderr, "chaos: %s target SKIPPED: %v\n", name, err)
			continue
		}
		if err != nil {
			return err
		}
		rep, err := chaos.Run(ctx, cc, tgt)
		if len(rep.Results) > 0 {
			reps = append(reps, rep)
		}
		if err != nil {
			runErr = fmt.Errorf("%s target: %w", name, err)
			break
		}
	}
	chaos.WriteTable(stdout, reps, *markdown)
	if *jsonPath != "" {
		if err := writeChaosJSON(*jsonPath, reps, stdout); err != nil {
			return err
		}
	}
	if runErr != nil {
		return runErr
	}
	var failed []string
	for _, rep := range reps {
		failed = append(failed, chaos.Check(rep, chaos.Picks)...)
	}
	fmt.Fprintln(stdout)
	if len(failed) == 0 {
		fmt.Fprintln(stdout, "acceptance: PASS (no failed request on surviving routers for router faults; a removal moves at most 1/N + 5% of prefixes and no request reaches the removed backend at its removal epoch or later; agreement back to 100% within 2s of every change)")
		return nil
	}
	fmt.Fprintln(stdout, "acceptance: FAIL")
	for _, f := range failed {
		fmt.Fprintln(stdout, "  "+f)
	}
	if *noCheck {
		return nil
	}
	return errors.New("acceptance checks failed")
}

func faultNames() string {
	var n []string
	for _, f := range chaos.AllFaults() {
		n = append(n, string(f))
	}
	return strings.Join(n, ", ")
}

func writeChaosJSON(path string, reps []chaos.Report, stdout io.Writer) error {
	b, err := json.MarshalIndent(reps, "", "  ")
	if err != nil {
		return err
	}
	b = append(b, '\n')
	if path == "-" {
		_, err = stdout.Write(b)
		return err
	}
	return os.WriteFile(path, b, 0o644)
}
