package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"time"

	"github.com/warmroute/warmroute/loadtest"
	"github.com/warmroute/warmroute/loadtest/compare"
	"github.com/warmroute/warmroute/loadtest/fleet"
	"github.com/warmroute/warmroute/loadtest/proc"
	"github.com/warmroute/warmroute/loadtest/report"
	"github.com/warmroute/warmroute/loadtest/trace"
	"github.com/warmroute/warmroute/loadtest/workload"
	"github.com/warmroute/warmroute/ring"
)

// The demo's fleet and workloads. docs/loadtest.md explains the sizing:
// each workload's working set (about 290-310k tokens for rag, chat,
// sysprompt, preamble and agent) is several times one instance's KV cache
// (demoKVBlocks x 16 = 96,000 tokens) but fits in the seven instances'
// caches together (672,000 tokens).
const (
	demoInstances    = 7
	demoKVBlocks     = 6000
	demoPrefixLength = 2048
	demoThreshold    = 32
	demoLoadFactor   = 0
	demoMaxTokens    = 96
	demoWarmup       = 8 * time.Second
)

// The demo's two lengths. A first run should take under three minutes on
// a 2-core machine, and nearly all of a run is wall-clock load: the fleet
// starts and stops in about a second. So the default compares the
// strategies on two workloads, one of each kind that matters (rag: every
// prefix distinct within the routing key; agent: a shared prompt longer
// than the fixed key, the case adaptive keys are for), measured for 10 s
// after the same 8 s warm-up as --full, and waits at most 10 s for the
// last answers: what a queueing strategy still has waiting then is
// counted unanswered. --full is the complete comparison: chat and
// preamble too (the same two kinds again), 20 s measured, 30 s to drain;
// about seven minutes.
const (
	demoDuration     = 10 * time.Second
	demoDrain        = 10 * time.Second
	demoFullDuration = 20 * time.Second
	demoFullDrain    = 30 * time.Second
)

// demoDefaultWorkloads and demoFullWorkloads are the workloads run without
// and with --full.
func demoDefaultWorkloads() []string { return []string{"rag", "agent"} }
func demoFullWorkloads() []string    { return []string{"rag", "chat", "preamble", "agent"} }

// demoWorkloads lists the workloads demoCase knows.
const demoWorkloads = "rag, chat, noreuse, bot, code, mix, sysprompt, preamble, agent"

// demoCase returns the calibrated workload and load of one demo workload.
func demoCase(name string, seed uint64, warmup, duration time.Duration, rateScale float64) (compare.Case, error) {
	w := workload.DefaultConfig()
	w.Seed = seed
	w.MaxTokens = demoMaxTokens
	l := loadtest.DefaultConfig()
	l.Mode = loadtest.OpenLoop
	l.Seed = seed
	l.Warmup = warmup
	l.Duration = duration
	l.Drain = demoFullDrain
	l.Timeout = 60 * time.Second
	l.MetricsInterval = time.Second
	switch name {
	case "rag":
		// 288 documents of 1,000 tokens: 288,000 tokens
		w.Kind = workload.KindRAG
		w.RAG = workload.RAGConfig{Documents: 288, DocumentTokens: 1000, QuestionsPerDoc: 8, QuestionTokens: 24}
		l.Rate = 60
	case "chat":
		// 180 open conversations of 24 turns opening with 1,000 tokens and
		// growing by 60 a turn: about 310,000 tokens of history
		w.Kind = workload.KindChat
		w.Chat = workload.ChatConfig{Active: 180, Turns: 24, SystemTokens: 40, FirstUserTokens: 1000, UserTokens: 20, AssistantTokens: 40, Stagger: true}
		l.Rate = 48
	case "noreuse":
		// the control: light load, so that TTFT is the cost of a prompt
		// rather than of queueing
		w.Kind = workload.KindNoReuse
		w.NoReuse.PromptTokens = 2000
		l.Rate = 8
		l.Warmup = 0
	case "bot":
		w.Kind = workload.KindBot
		w.Bot = workload.BotConfig{Templates: 24, PolicyTokens: 8000, UserTokens: 60}
		l.Rate = 10
	case "code":
		w.Kind = workload.KindCode
		w.Code = workload.CodeConfig{Files: 64, FileTokens: 3000, EditTokens: 12, MinCursor: 0.5}
		l.Rate = 25
	case "sysprompt":
		// 288 system prompts of 2,000-6,000 characters (1,040 tokens on
		// average, 299,000 in all), Zipf 1.1: the most popular gets a fifth
		// of the requests, more than one instance's fair share. Prompts
		// of RAG's size at RAG's rate.
		w.Kind = workload.KindSysPrompt
		w.SysPrompt = workload.SysPromptConfig{Prompts: 288, MinChars: 2000, MaxChars: 6000, QuestionTokens: 40, Zipf: 1.1}
		l.Rate = 60
	case "preamble":
		// a 12,288-character preamble (3,072 tokens, longer than the
		// routing prefix) in front of 200 conversations of 8 turns
		// opening with 800 tokens: about 290,000 tokens. Every instance
		// soon holds the preamble; what is left to prefill, the
		// histories, is about a third of the fleet's capacity at 28/s
		// (at 36/s, --rate-scale 1.5 overloaded PREFIX_AWARE, which put
		// the single key's load on six instances)
		w.Kind = workload.KindPreamble
		w.Preamble = workload.PreambleConfig{Chars: 12288, Active: 200, Turns: 8, FirstUserTokens: 800, UserTokens: 60, AssistantTokens: 120, Stagger: true}
		l.Rate = 28
	case "agent":
		// 64 sessions of 12 turns behind a 1,500-token tool-use prompt,
		// growing by 150-1,550 tokens a turn: about 313,000 tokens, and
		// prompts of 7,400 tokens on average; 8/s leaves about 36% of the
		// fleet's prefill capacity to do when turns miss their history
		w.Kind = workload.KindAgent
		w.Agent = workload.AgentConfig{Active: 64, Turns: 12, SystemTokens: 1500, TaskTokens: 200, CallTokens: 50, MinResultTokens: 100, MaxResultTokens: 1500, Stagger: true}
		l.Rate = 8
	case "mix":
		w.Kind = workload.KindMix
		w.RAG = workload.RAGConfig{Documents: 32, DocumentTokens: 2000, QuestionsPerDoc: 8, QuestionTokens: 24}
		w.Chat = workload.ChatConfig{Active: 20, Turns: 16, SystemTokens: 40, FirstUserTokens: 1500, UserTokens: 30, AssistantTokens: 100}
		w.Bot = workload.BotConfig{Templates: 6, PolicyTokens: 8000, UserTokens: 60}
		w.Code = workload.CodeConfig{Files: 16, FileTokens: 3000, EditTokens: 12, MinCursor: 0.5}
		l.Rate = 30
	default:
		return compare.Case{}, fmt.Errorf("unknown workload %q (want %s)", name, demoWorkloads)
	}
	l.Rate *= rateScale
	return compare.Case{Name: name, Workload: w, Load: l}, nil
}

// demoClusterArgs returns what makes a demo fleet's routers one cluster:
// gossip and Raft on free loopback ports, every router a seed of the
// others, the first three bootstrapping Raft together. The fleet calls it
// for routers 0..k-1 in turn each time it starts, so ports are chosen
// afresh when router 0 asks.
func demoClusterArgs() func(i int, rs []fleet.Router, a *proc.ServeArgs) error {
	var gossip, raft []string
	return func(i int, rs []fleet.Router, a *proc.ServeArgs) error {
		if len(rs) < 2 {
			return nil
		}
		if i == 0 {
			addrs, err := proc.FreeAddrs("127.0.0.1", 2*len(rs))
			if err != nil {
				return err
			}
			gossip, raft = addrs[:len(rs)], addrs[len(rs):]
		}
		var join []string
		for j, g := range gossip {
			if j != i {
				join = append(join, g)
			}
		}
		a.NodeName = fmt.Sprintf("router-%d", i)
		a.GossipListen, a.RaftListen, a.Join = gossip[i], raft[i], join
		a.RaftTimeout, a.Voters = 300*time.Millisecond, 3
		if i < 3 {
			a.BootstrapExpect = min(3, len(rs))
		}
		return nil
	}
}

// cmdDemo compares routing strategies on a local fleet of simulated GPU
// instances and writes a report.
func cmdDemo(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	strategies := demoStrategies()
	workloads := demoDefaultWorkloads()
	full := fs.Bool("full", false, "the complete comparison, about 7 minutes: workloads "+strings.Join(demoFullWorkloads(), ",")+", --duration "+demoFullDuration.String()+", --drain "+demoFullDrain.String()+" (flags given as well win)")
	fs.Var(listFlag{&strategies}, "strategies", "routing strategies to compare, comma-separated, or 'all' ("+strings.Join(fleet.Strategies(), ", ")+")")
	fs.Var(listFlag{&workloads}, "workloads", "workloads, comma-separated: "+demoWorkloads)
	warmup := fs.Duration("warmup", demoWarmup, "load before the measured part of each run (noreuse has none)")
	duration := fs.Duration("duration", demoDuration, "measured load per run ("+demoFullDuration.String()+" with --full; noreuse runs half as long unless this is given)")
	drain := fs.Duration("drain", demoDrain, "longest wait for the answers after a run's load stops; requests still waiting are counted unanswered ("+demoFullDrain.String()+" with --full)")
	rateScale := fs.Float64("rate-scale", 1, "multiply every workload's calibrated arrival rate")
	seed := fs.Uint64("seed", 1, "seed of the workloads and arrivals")
	instances := fs.Int("instances", demoInstances, "simulated GPU instances")
	routers := fs.Int("routers", 3, "router processes, one cluster; clients spread requests over them in turn as an L4 load balancer would (0: no router)")
	prefixLen := fs.Int("prefix-length", demoPrefixLength, "router --prefix-length")
	threshold := fs.Int("concurrency-threshold", demoThreshold, "router --concurrency-threshold")
	loadFactor := fs.Float64("load-factor", demoLoadFactor, "router --load-factor")
	kvBlocks := fs.Int("kv-blocks", demoKVBlocks, "gpusim --kv-blocks: KV-cache blocks of 16 tokens per instance")
	timeScale := fs.Float64("time-scale", 1, "gpusim --time-scale")
	var gpusimArgs, routerArgs []string
	fs.Var(argsFlag{&gpusimArgs}, "gpusim-args", "extra gpusim `flags`, "+argsSyntax+" (e.g. \"--itl-base 20ms --max-num-seqs 64\")")
	fs.Var(argsFlag{&routerArgs}, "router-args", "extra serve `flags` for every router, "+argsSyntax)
	tracePath := fs.String("trace", "", "also replay this Mooncake-format trace (see 'warmroute trace') under each strategy, after a --trace-warmup unmeasured start")
	traceWarmup := fs.Duration("trace-warmup", 15*time.Second, "the unmeasured start of a --trace replay, in replay time")
	rc := bindReplayFlags(fs)
	out := fs.String("out", "", "directory for report.html, report.json and the fleet's logs (default out/demo-TIMESTAMP)")
	quiet := fs.Bool("quiet", false, "no progress lines")
	dryRun := fs.Bool("dry-run", false, "print the runs and how long they will take, and start nothing")
	agreement := fs.Bool("agreement", false, "with --routers 2 or more: ask every router where the workload's first 16 requests would go, all at once every second from the end of the warm-up to the end of the run, and report how often their picks agreed")
	usage := "usage: warmroute demo [flags]\n\n" +
		"Starts a local fleet (gpusim instances, simulated vLLM engines, behind warmroute\n" +
		"routers, all child processes of this executable on free loopback ports), runs each\n" +
		"workload under each routing strategy against a cold fleet, prints one table and a\n" +
		"verdict, and writes an HTML and a JSON report. By default it compares the strategies\n" +
		"on rag and agent in about 2.5 minutes; --full runs four workloads for longer (about\n" +
		"7 minutes). Everything it starts is stopped on exit, including on Ctrl-C.\n" +
		"See docs/loadtest.md for the sizing.\n\nflags:\n"
	if err := parseCommand(fs, args, usage); err != nil {
		return err
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	if *full {
		if !given["workloads"] {
			workloads = demoFullWorkloads()
		}
		if !given["duration"] {
			*duration = demoFullDuration
		}
		if !given["drain"] {
			*drain = demoFullDrain
		}
	}
	if len(strategies) == 1 && strings.EqualFold(strategies[0], "all") {
		strategies = fleet.Strategies()
	}
	for i, s := range strategies {
		strategies[i] = strings.ToUpper(s)
	}
	if *rateScale <= 0 {
		return fmt.Errorf("--rate-scale %g must be > 0", *rateScale)
	}
	if *drain < 0 || *drain > 10*time.Minute {
		return fmt.Errorf("--drain %s outside 0-10m", *drain)
	}

	fc := fleet.DefaultConfig()
	fc.Instances = *instances
	fc.Routers = *routers
	fc.PrefixLength = *prefixLen
	fc.ConcurrencyThreshold = *threshold
	fc.LoadFactor = *loadFactor
	fc.GpusimArgs = proc.GpusimArgs{KVBlocks: *kvBlocks, TimeScale: *timeScale, Extra: gpusimArgs}.Flags()
	clusterArgs := demoClusterArgs()
	fc.RouterArgs = func(i int, rs []fleet.Router, a *proc.ServeArgs) error {
		a.Extra = routerArgs
		return clusterArgs(i, rs, a)
	}
	dir := *out
	if dir == "" {
		dir = filepath.Join("out", "demo-"+time.Now().Format("20060102-150405"))
	}
	fc.LogDir = filepath.Join(dir, "logs")

	plan := compare.Plan{Strategies: strategies, Fleet: fc, Agreement: *agreement}
	for _, name := range workloads {
		c, err := demoCase(name, *seed, *warmup, *duration, *rateScale)
		if err != nil {
			return err
		}
		if c.Workload.Kind == workload.KindNoReuse && !given["duration"] {
			c.Load.Duration = *duration / 2
		}
		c.Load.Drain = *drain
		c.Load.Bounds.Instances, c.Load.Bounds.KVBlocks = *instances, *kvBlocks // the fleet bound's caches are the fleet's
		plan.Cases = append(plan.Cases, c)
	}
	if *tracePath != "" {
		c, err := demoTraceCase(*tracePath, rc, *traceWarmup)
		if err != nil {
			return err
		}
		c.Load.Drain = *drain
		plan.Cases = append(plan.Cases, c)
	}
	if err := plan.Validate(); err != nil {
		return err
	}
	engines, err := demoEngines(fc.GpusimArgs)
	if err != nil {
		return err
	}
	setup := demoSetup(&plan, *kvBlocks)
	estimate := demoEstimate(&plan)
	if *dryRun {
		for _, s := range setup {
			fmt.Fprintln(stdout, "demo:", s)
		}
		fmt.Fprintln(stdout, "demo:", estimate)
		return nil
	}
	if !*quiet {
		runs := len(plan.Cases) * len(strategies)
		if fc.Routers == 0 {
			runs = len(plan.Cases) // one run each, straight to the instances
		}
		lengths := map[string]runLength{}
		for _, c := range plan.Cases {
			lengths[c.Name] = runLength{warmup: c.Load.Warmup, duration: c.Load.Duration, requests: c.Load.Requests}
		}
		pw := newProgressWriter(stderr, runs, lengths)
		plan.Progress = pw
		for i := range plan.Cases {
			plan.Cases[i].Load.Progress = pw
			plan.Cases[i].Load.ProgressInterval = 5 * time.Second
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if la := loadAverage(); la != "" {
		setup = append(setup, fmt.Sprintf("machine: %d CPUs, load average %s at the start", runtime.NumCPU(), la))
	}
	if !*quiet {
		for _, s := range setup {
			fmt.Fprintln(stderr, "demo:", s)
		}
		fmt.Fprintln(stderr, "demo:", estimate)
	}

	started := time.Now()
	runs, runErr := compare.Execute(ctx, plan)
	interrupted := errors.Is(runErr, loadtest.ErrInterrupted)
	if runErr != nil && !interrupted && len(runs) == 0 {
		return runErr
	}
	if len(runs) > 0 {
		fmt.Fprintln(stdout)
		if err := report.WriteTable(stdout, runs); err != nil {
			return err
		}
	}
	rep := &report.Report{
		Title:       "warmroute routing strategy comparison",
		GeneratedAt: time.Now(),
		Command:     strings.TrimSpace("warmroute demo " + strings.Join(args, " ")),
		Build:       buildSummary(),
		Engines:     engines,
		Notes:       demoNotes(*full, given),
		Setup:       setup,
		Partial:     interrupted,
		Instances:   instanceNames(*instances, gpusimArgs),
		Runs:        runs,
	}
	htmlPath := filepath.Join(dir, "report.html")
	jsonPath := filepath.Join(dir, "report.json")
	if err := writeReportFile(jsonPath, func(w io.Writer) error { return report.WriteJSON(w, rep) }); err != nil {
		return err
	}
	if err := writeReportFile(htmlPath, func(w io.Writer) error { return report.WriteHTML(w, rep) }); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "\nreport: %s (JSON: %s)\n", htmlPath, jsonPath)
	fmt.Fprintf(stdout, "%d runs in %.0fs\n", len(runs), time.Since(started).Seconds())
	return runErr
}

// demoEstimate says how long the plan will take: its load (warm-up and
// measured part of every run), at most the drain more per run for the
// last answers, and about two seconds a run to start and stop the fleet.
func demoEstimate(p *compare.Plan) string {
	runs := len(p.Strategies)
	if p.Fleet.Routers == 0 {
		runs = 1
	}
	var load, drain time.Duration
	replays := 0
	for _, c := range p.Cases {
		if c.Generator != nil {
			replays++ // its length is the trace's
			load += time.Duration(runs) * c.Load.Warmup
		} else {
			load += time.Duration(runs) * (c.Load.Warmup + c.Load.Duration)
		}
		drain += time.Duration(runs) * c.Load.Drain
	}
	n := runs * len(p.Cases)
	fleet := time.Duration(n) * 2 * time.Second
	s := fmt.Sprintf("%d runs: %s of load, up to %s more waiting for the last answers, about %s starting and stopping fleets: %s to %s",
		n, load, drain, fleet, minutes(load+fleet), minutes(load+drain+fleet))
	if replays > 0 {
		s += ", plus the trace replay's own length under each strategy"
	}
	return s
}

// minutes writes d as minutes and seconds, "2m20s".
func minutes(d time.Duration) string {
	return d.Round(10 * time.Second).String()
}

// demoNotes says what the run left out, or that it is the complete one.
func demoNotes(full bool, given map[string]bool) []string {
	if full {
		return []string{"The complete comparison (--full)."}
	}
	if given["workloads"] || given["duration"] || given["strategies"] {
		return nil // the reader chose the plan
	}
	return []string{fmt.Sprintf("The short comparison: rag (prefixes distinct within the key) and agent (a shared prompt longer than the fixed key), %s measured per run. "+
		"warmroute demo --full (make demo DEMO_ARGS=--full, about 7 minutes) adds chat and preamble, the same two kinds again, and measures %s per run; "+
		"--strategies all adds %s.", demoDuration, demoFullDuration, demoAllAdds())}
}

// demoStrategies are the strategies the demo compares unless told: the
// ones that route on the key, PREFIX_AWARE as it routed before adaptive
// keys and as it routes now.
func demoStrategies() []string {
	return []string{ring.ConsistentHash.String(), fleet.PrefixAwareFixed, ring.PrefixAware.String()}
}

// demoAllAdds names the strategies that --strategies all adds to
// demoStrategies, "the load-only strategies" when none routes on the key.
func demoAllAdds() string {
	var names []string
	keyBlind := true
	for _, name := range fleet.Strategies() {
		if slices.Contains(demoStrategies(), name) {
			continue
		}
		names = append(names, name)
		s, err := ring.ParseStrategy(name)
		if info, ok := s.Info(); err != nil || !ok || info.Key {
			keyBlind = false
		}
	}
	if keyBlind {
		return "the load-only strategies (" + strings.Join(names, ", ") + ")"
	}
	return strings.Join(names, ", ")
}

// demoEngines says what the demo's instances are: simulated engines, and
// the latency model that their gpusim flags give them.
func demoEngines(gpusimArgs []string) (string, error) {
	fs := flag.NewFlagSet("gpusim", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	s := gpusimFlags(fs)
	if err := fs.Parse(expandListFlags(gpusimArgs)); err != nil {
		return "", fmt.Errorf("--gpusim-args: %w", err)
	}
	m := s.model
	ts := ""
	if m.TimeScale != 1 {
		ts = fmt.Sprintf(", every duration x%g (--time-scale)", m.TimeScale)
	}
	return fmt.Sprintf("The engines are simulated: no GPU ran. Each instance is gpusim, a model of one vLLM instance serving %s on 8 GPUs: "+
		"time to first token is %s plus the prompt tokens not found in its prefix KV cache at %.0f tokens/s (shared by the prefills running at once), "+
		"a decode step takes %s plus %s per running request%s, and the KV cache holds %d blocks of %d tokens (LRU). "+
		"The routing, the caches' hits and misses and the queueing are real; the times are the model's (docs/gpusim.md).",
		m.Model, m.Overhead, m.PrefillTokensPerSec, m.ITLBase, m.ITLPerSeq, ts, m.KVCacheBlocks, m.BlockSize), nil
}

// buildSummary names this build: its version, the commit it was built
// from (Go's VCS stamp, else the one the Makefile passes) and the
// toolchain.
func buildSummary() string {
	rev, modified, toolchain := commit, strings.HasSuffix(version, "-dirty"), ""
	if bi, ok := debug.ReadBuildInfo(); ok {
		toolchain = ", " + bi.GoVersion
		for _, kv := range bi.Settings {
			switch {
			case kv.Key == "vcs.revision" && kv.Value != "":
				rev = kv.Value
			case kv.Key == "vcs.modified" && kv.Value == "true":
				modified = true
			}
		}
	}
	s := "warmroute " + version + ", commit " + cmp.Or(rev, "unknown")
	if modified {
		s += " (modified)"
	}
	return s + toolchain
}

// loadAverage is the 1-minute load average as the kernel reports it
// ("" where there is no /proc/loadavg).
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return ""
	}
	return f[0]
}

// demoTraceCase replays a trace file: every record, at the trace's times,
// the first warmup of them unmeasured.
func demoTraceCase(path string, rc *trace.ReplayConfig, warmup time.Duration) (compare.Case, error) {
	recs, err := readTrace(path, rc.BlockTokens)
	if err != nil {
		return compare.Case{}, err
	}
	probe, err := trace.NewReplay(recs, *rc)
	if err != nil {
		return compare.Case{}, err
	}
	l := loadtest.DefaultConfig()
	l.Mode = loadtest.OpenLoop
	l.Warmup, l.Duration, l.Requests = warmup, 0, probe.Len()
	l.Drain, l.Timeout, l.MetricsInterval = demoFullDrain, 60*time.Second, time.Second
	w := workload.DefaultConfig()
	w.Kind = workload.KindNoReuse // unused: the replay makes the requests
	return compare.Case{
		Name: "trace", Workload: w, Load: l,
		Generator: func(model string) (workload.Generator, error) {
			c := *rc
			c.Model = model
			return trace.NewReplay(recs, c)
		},
	}, nil
}

// demoSetup describes the fleet and the workloads for the report.
func demoSetup(p *compare.Plan, kvBlocks int) []string {
	f := p.Fleet
	s := []string{fmt.Sprintf("fleet: %d gpusim instances (%s), KV cache %d blocks x 16 = %d tokens each, %d tokens in all; %d router(s), prefix length %d, concurrency threshold %d, load factor %g",
		f.Instances, strings.Join(f.GpusimArgs, " "), kvBlocks, kvBlocks*16, kvBlocks*16*f.Instances,
		f.Routers, f.PrefixLength, f.ConcurrencyThreshold, f.LoadFactor)}
	for _, c := range p.Cases {
		if c.Generator != nil {
			s = append(s, fmt.Sprintf("%s: trace replay, %d requests at the trace's times, the first %s unmeasured",
				c.Name, c.Load.Requests, c.Load.Warmup))
			continue
		}
		s = append(s, fmt.Sprintf("%s: %s; working set ~%d tokens; open loop %.1f req/s, %s warm-up then %s measured, seed %d, max_tokens %d",
			c.Name, describeWorkload(c.Workload), c.Workload.SharedTokens(), c.Load.Rate, c.Load.Warmup, c.Load.Duration, c.Workload.Seed, c.Workload.MaxTokens))
	}
	return s
}

func describeWorkload(w workload.Config) string {
	switch w.Kind {
	case workload.KindRAG:
		return fmt.Sprintf("%d documents of %d tokens, %d questions each", w.RAG.Documents, w.RAG.DocumentTokens, w.RAG.QuestionsPerDoc)
	case workload.KindChat:
		return fmt.Sprintf("%d open conversations of %d turns, first message %d tokens, +%d tokens per turn",
			w.Chat.Active, w.Chat.Turns, w.Chat.FirstUserTokens, w.Chat.UserTokens+w.Chat.AssistantTokens)
	case workload.KindNoReuse:
		return fmt.Sprintf("unrelated prompts of %d tokens", w.NoReuse.PromptTokens)
	case workload.KindBot:
		return fmt.Sprintf("%d templates with %d-token policies", w.Bot.Templates, w.Bot.PolicyTokens)
	case workload.KindCode:
		return fmt.Sprintf("%d files of %d tokens", w.Code.Files, w.Code.FileTokens)
	case workload.KindSysPrompt:
		p := w.SysPrompt
		return fmt.Sprintf("%d system prompts of %d-%d characters, Zipf %g, %d-token questions",
			p.Prompts, p.MinChars, p.MaxChars, p.Zipf, p.QuestionTokens)
	case workload.KindPreamble:
		p := w.Preamble
		return fmt.Sprintf("a %d-character preamble shared by all, %d open conversations of %d turns on top, first message %d tokens, +%d tokens per turn",
			p.Chars, p.Active, p.Turns, p.FirstUserTokens, p.UserTokens+p.AssistantTokens)
	case workload.KindAgent:
		a := w.Agent
		return fmt.Sprintf("%d open agent sessions of %d turns, %d-token tool-use prompt shared by all, %d-token task, +%d-token call and %d-%d-token result per turn",
			a.Active, a.Turns, a.SystemTokens, a.TaskTokens, a.CallTokens, a.MinResultTokens, a.MaxResultTokens)
	}
	return string(w.Kind)
}

// instanceNames names a demo fleet's n instances in address order as
// gpusim does: its --name-prefix (gpu- unless extra gpusim flags set
// another) and the instance's index, which is also its port's offset.
func instanceNames(n int, gpusimArgs []string) []string {
	prefix := "gpu-"
	for i, a := range gpusimArgs {
		name, val, hasVal := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !strings.HasPrefix(a, "-") || name != "name-prefix" {
			continue
		}
		switch {
		case hasVal:
			prefix = val
		case i+1 < len(gpusimArgs):
			prefix = gpusimArgs[i+1]
		}
	}
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s%d", prefix, i)
	}
	return out
}
