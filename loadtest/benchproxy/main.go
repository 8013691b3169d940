package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/warmroute/warmroute/loadtest/proc"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "stub" {
		if err := stubMain(os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, "benchproxy stub:", err)
			os.Exit(1)
		}
		return
	}
	if len(os.Args) > 1 && os.Args[1] == "script" {
		if err := scriptMain(os.Args[2:], os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "benchproxy script:", err)
			os.Exit(1)
		}
		return
	}
	if len(os.Args) > 1 && os.Args[1] == "haproxy-config" {
		if err := haproxyConfigMain(os.Args[2:], os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "benchproxy haproxy-config:", err)
			os.Exit(1)
		}
		return
	}
	args := os.Args[1:]
	if len(args) > 0 && args[0] == "run" {
		args = args[1:]
	}
	if err := runMain(args, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "benchproxy:", err)
		os.Exit(1)
	}
}

// stubMain serves n stub backends on loopback and prints "LISTEN addr" for
// each, then runs until SIGTERM.
func stubMain(args []string) error {
	fs := flag.NewFlagSet("stub", flag.ContinueOnError)
	n := fs.Int("n", 4, "number of stub backends")
	var cfg stubConfig
	fs.DurationVar(&cfg.Prefill, "prefill", 10*time.Millisecond, "delay before the first SSE chunk")
	fs.DurationVar(&cfg.Gap, "gap", time.Millisecond, "delay between SSE chunks")
	fs.IntVar(&cfg.Chunks, "chunks", 50, "SSE chunks per stream")
	if err := fs.Parse(args); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	errc := make(chan error, *n)
	for i := 0; i < *n; i++ {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		fmt.Printf("LISTEN %s\n", ln.Addr())
		go func() { errc <- serveStub(ctx, ln, cfg) }()
	}
	var first error
	for i := 0; i < *n; i++ {
		if err := <-errc; err != nil && first == nil {
			first = err
		}
	}
	return first
}

// scriptMain prints the wrk script of the benchmark's workload, for runs
// by hand: wrk -s script.lua http://host:port/v1/chat/completions.
func scriptMain(args []string, w io.Writer) error {
	fs := flag.NewFlagSet("script", flag.ContinueOnError)
	wl := workload{}
	fs.IntVar(&wl.BodySize, "body-size", 4096, "request body bytes")
	fs.IntVar(&wl.Prefixes, "prefixes", 64, "distinct shared prefixes")
	fs.IntVar(&wl.Suffixes, "suffixes", 4, "distinct user questions per prefix")
	fs.BoolVar(&wl.Stream, "stream", false, "ask for SSE streams")
	if err := fs.Parse(args); err != nil {
		return err
	}
	bodies, err := wl.bodies()
	if err != nil {
		return err
	}
	_, err = io.WriteString(w, wrkScript(bodies, "/v1/chat/completions"))
	return err
}

// haproxyConfigMain prints the benchmark's HAProxy configuration, for runs
// outside the harness (scripts/bench-instructions.sh).
func haproxyConfigMain(args []string, w io.Writer) error {
	fs := flag.NewFlagSet("haproxy-config", flag.ContinueOnError)
	listen := fs.String("listen", "", "address HAProxy listens on (host:port)")
	backends := fs.String("backends", "", "comma-separated stub addresses (host:port)")
	prefixBytes := fs.Int("prefix-bytes", 2048, "bytes hashed for affinity")
	balanceFactor := fs.Int("balance-factor", 125, "hash-balance-factor")
	maxconn := fs.Int("maxconn", haproxyMaxConn, "client connections HAProxy accepts")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *listen == "" || *backends == "" {
		return errors.New("-listen and -backends are required")
	}
	if *maxconn < 1 {
		return errors.New("-maxconn must be positive")
	}
	_, err := io.WriteString(w, haproxyConfig(*listen, strings.Split(*backends, ","), *prefixBytes, *balanceFactor, *maxconn))
	return err
}

// options are the run's settings.
type options struct {
	Warmroute, HAProxy, Wrk, Taskset string
	Baseline                         string
	SUTCPUs, GenCPUs                 string
	Backends                         int
	Phases                           []string
	Duration, Warmup                 time.Duration
	Reps                             int
	Conns                            []int
	BodySize, Prefixes, Suffixes     int
	PrefixBytes, BalanceFactor       int
	Streams, StreamChunks            int
	StreamPrefill, StreamGap         time.Duration
	OpenStreams                      []int
	OpenChunks, OpenReps             int
	OpenGap, OpenRamp, OpenSettle    time.Duration
	OpenEngine                       string
	LongSizes                        []int
	LongRate                         float64
	LongConns                        int
	LongDuration, LongWarmup         time.Duration
	Out                              string
	Timeout                          time.Duration
	WarmrouteArgs                    string
	Nice                             int
}

// phase reports whether the run includes phase name.
func (o *options) phase(name string) bool { return slices.Contains(o.Phases, name) }

func parseOptions(args []string) (options, error) {
	o := options{}
	fs := flag.NewFlagSet("benchproxy", flag.ContinueOnError)
	fs.StringVar(&o.Warmroute, "warmroute", "bin/warmroute", "warmroute binary")
	fs.StringVar(&o.Baseline, "baseline", "", "a second warmroute binary (e.g. an older build) measured as target \"baseline\"")
	fs.StringVar(&o.HAProxy, "haproxy", "haproxy", "haproxy binary")
	fs.StringVar(&o.Wrk, "wrk", "wrk", "wrk binary")
	fs.StringVar(&o.Taskset, "taskset", "taskset", "taskset binary (util-linux)")
	fs.StringVar(&o.SUTCPUs, "sut-cpus", "0", "CPUs the proxy under test is pinned to")
	fs.StringVar(&o.GenCPUs, "gen-cpus", "1", "CPUs wrk and the stub backends are pinned to")
	fs.IntVar(&o.Backends, "backends", 4, "stub backends")
	phases := fs.String("phases", strings.Join(defaultPhases, ","), "phases to run, comma-separated: wrk (requests/s, latency and CPU per request), stream (time to the first SSE chunk), open (many long SSE streams open at once), long (long prompts at a fixed rate; not run unless named)")
	fs.DurationVar(&o.Duration, "duration", 5*time.Second, "length of each measured wrk run (whole seconds)")
	fs.DurationVar(&o.Warmup, "warmup", time.Second, "unmeasured wrk run before each measured one (whole seconds; 0 = none)")
	fs.IntVar(&o.Reps, "reps", 5, "repetitions of the wrk and stream phases, interleaved across targets")
	conns := fs.String("conns", "1,64", "comma-separated wrk connection counts")
	fs.IntVar(&o.BodySize, "body-size", 4096, "request body bytes")
	fs.IntVar(&o.Prefixes, "prefixes", 64, "distinct shared prefixes (system prompts)")
	fs.IntVar(&o.Suffixes, "suffixes", 4, "distinct user questions per prefix")
	fs.IntVar(&o.PrefixBytes, "prefix-bytes", 2048, "bytes hashed for affinity (HAProxy bytes(0,N); warmroute --prefix-length)")
	fs.IntVar(&o.BalanceFactor, "balance-factor", 125, "HAProxy hash-balance-factor; warmroute gets --load-factor N/100")
	fs.IntVar(&o.Streams, "streams", 60, "streamed requests per target per repetition")
	fs.IntVar(&o.StreamChunks, "stream-chunks", 50, "SSE chunks per stream")
	fs.DurationVar(&o.StreamPrefill, "stream-prefill", 10*time.Millisecond, "stub delay before the first SSE chunk (open streams too)")
	fs.DurationVar(&o.StreamGap, "stream-gap", time.Millisecond, "stub delay between SSE chunks")
	openStreams := fs.String("open-streams", "2000", "open phase: comma-separated counts of SSE streams open at once (e.g. 2000,10000); \"0\" or \"\" skips the phase")
	fs.IntVar(&o.OpenChunks, "open-chunks", 61, "open phase: SSE events per stream")
	fs.DurationVar(&o.OpenGap, "open-gap", 300*time.Millisecond, "open phase: time between a stream's events")
	fs.DurationVar(&o.OpenRamp, "open-ramp", 3*time.Second, "open phase: the streams start spread over this time")
	fs.IntVar(&o.OpenReps, "open-reps", 3, "open phase: repetitions, interleaved across targets, each on a fresh proxy process")
	fs.StringVar(&o.OpenEngine, "open-engine", engineStub, "open phase: the backends: stub (this binary; each event carries its send time, so latencies are measured) or gpusim (warmroute's simulated vLLM: vLLM's chunks, usage chunk and /metrics, which warmroute scrapes; events counted, not timed)")
	fs.DurationVar(&o.OpenSettle, "open-settle", 30*time.Second, "open phase: how long the proxy's memory is watched after the streams ended")
	longSizes := fs.String("long-sizes", "400000,8192", "long phase: request body sizes in bytes, comma-separated (400000 is about 100k tokens)")
	fs.Float64Var(&o.LongRate, "long-rate", 100, "long phase: requests per second, sent on time whatever the answers take")
	fs.IntVar(&o.LongConns, "long-conns", 64, "long phase: most connections open at once; a request due when all are busy counts late and makes the run invalid")
	fs.DurationVar(&o.LongDuration, "long-duration", 10*time.Second, "long phase: measured window per target and size")
	fs.DurationVar(&o.LongWarmup, "long-warmup", 2*time.Second, "long phase: load before the window")
	fs.StringVar(&o.Out, "out", "out/bench-proxy", "directory for results.json and summary.md")
	fs.DurationVar(&o.Timeout, "timeout", 20*time.Minute, "bound on the whole run")
	fs.IntVar(&o.Nice, "nice", 0, "niceness for the proxies, stubs and wrk (e.g. -10 so other processes on a shared machine disturb less; needs root)")
	fs.StringVar(&o.WarmrouteArgs, "warmroute-args", "", "extra `warmroute serve` flags, separated by blanks, quoted as in a shell")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	var err error
	if o.Phases, err = parsePhases(*phases); err != nil {
		return o, err
	}
	if o.OpenStreams, err = parseStreamCounts(*openStreams); err != nil {
		return o, err
	}
	if len(o.OpenStreams) == 0 {
		o.Phases = slices.DeleteFunc(o.Phases, func(p string) bool { return p == "open" })
		if len(o.Phases) == 0 {
			return o, errors.New("nothing to run: -phases open with -open-streams 0")
		}
	}
	for _, s := range strings.Split(*conns, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			return o, fmt.Errorf("bad -conns entry %q", s)
		}
		o.Conns = append(o.Conns, n)
	}
	switch {
	case o.Backends < 1 || o.Reps < 1 || o.Streams < 0:
		return o, errors.New("backends and reps must be positive, streams not negative")
	case o.Duration < time.Second || o.Duration%time.Second != 0 || o.Warmup%time.Second != 0:
		return o, errors.New("duration and warmup are whole seconds (duration at least 1s)")
	case o.Prefixes < 1 || o.Suffixes < 1:
		return o, errors.New("prefixes and suffixes must be positive")
	case o.Timeout <= 0:
		return o, errors.New("-timeout must be positive")
	}
	if o.phase("open") {
		if err := o.validateOpen(); err != nil {
			return o, err
		}
	}
	if o.phase("long") {
		if o.LongSizes, err = parseLongSizes(*longSizes); err != nil {
			return o, err
		}
		if err := o.validateLong(); err != nil {
			return o, err
		}
	}
	return o, nil
}

// target is one thing wrk drives: the stubs directly or a proxy.
type target struct {
	Name    string
	URL     string
	process *proc.Process // nil for direct
}

func runMain(args []string, stdout io.Writer) error {
	o, err := parseOptions(args)
	if err != nil {
		return err
	}
	bins := []*string{&o.Warmroute, &o.HAProxy, &o.Taskset, &o.Baseline}
	if o.phase("wrk") {
		bins = append(bins, &o.Wrk)
	}
	for _, p := range bins {
		if *p == "" {
			continue
		}
		path, err := exec.LookPath(*p)
		if err != nil {
			return fmt.Errorf("%s not found (scripts/bench-proxy.sh installs HAProxy and wrk): %w", *p, err)
		}
		*p = path
	}
	if o.phase("open") {
		limit, err := raiseNoFile(fdsNeeded(slices.Max(o.OpenStreams)))
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "benchproxy: open-file limit %d for the harness and its children\n", limit)
	}
	ctx, cancel := context.WithTimeout(context.Background(), o.Timeout)
	defer cancel()
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	dir, err := os.MkdirTemp("", "benchproxy")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	var cs children
	defer cs.stopAll(3 * time.Second)

	bodies, err := workload{BodySize: o.BodySize, Prefixes: o.Prefixes, Suffixes: o.Suffixes}.bodies()
	if err != nil {
		return err
	}
	streamBodies, err := workload{BodySize: o.BodySize, Prefixes: o.Prefixes, Suffixes: 1, Stream: true}.bodies()
	if err != nil {
		return err
	}

	// Stub backends, on the generator's cores.
	self, err := os.Executable()
	if err != nil {
		return err
	}
	stubs, err := cs.start("stubs", o.Taskset, o.GenCPUs, o.Nice, self, "stub", "-n", strconv.Itoa(o.Backends),
		"-prefill", o.StreamPrefill.String(), "-gap", o.StreamGap.String(), "-chunks", strconv.Itoa(o.StreamChunks))
	if err != nil {
		return err
	}
	addrs, err := listenAddrs(ctx, stubs, o.Backends, 10*time.Second)
	if err != nil {
		return err
	}
	var urls []string
	for _, a := range addrs {
		urls = append(urls, "http://"+a)
	}
	extra, err := proc.SplitArgs(o.WarmrouteArgs)
	if err != nil {
		return fmt.Errorf("--warmroute-args: %w", err)
	}
	serve := proc.ServeArgs{Backends: urls, Strategy: "PREFIX_AWARE",
		PrefixLength: o.PrefixBytes, LoadFactor: float64(o.BalanceFactor) / 100, LogLevel: "warn", Extra: extra}

	hv, _ := exec.Command(o.HAProxy, "-v").Output()
	res := &results{
		Started: time.Now().UTC(), Options: o, LoadAvgStart: loadAvg(),
		HAProxyVersion: strings.SplitN(string(hv), "\n", 2)[0], CPU: cpuModel(),
		Command: "benchproxy " + strings.Join(args, " "),
	}
	fmt.Fprintf(stdout, "benchproxy: phases %s; %d stub backends %v; SUT cpus %s, generator cpus %s; load average %s\n",
		strings.Join(o.Phases, ","), o.Backends, addrs, o.SUTCPUs, o.GenCPUs, res.LoadAvgStart)

	if o.phase("wrk") || o.phase("stream") || o.phase("long") {
		if err := runRequestPhases(ctx, &cs, dir, o, stubs, addrs, serve, bodies, streamBodies, res, stdout); err != nil {
			return err
		}
	}
	if o.phase("open") {
		env := openEnv{cs: &cs, dir: dir, stubs: addrs, bodies: streamBodies, readyBody: bodies[0], serve: serve,
			minWindow: minOpenWindow, out: stdout}
		if o.OpenEngine == engineGpusim {
			if err := env.useGpusim(ctx, o, slices.Max(o.OpenStreams)); err != nil {
				return err
			}
			fmt.Fprintf(stdout, "benchproxy: open phase on %d gpusim instances %v\n", o.Backends, env.stubs)
		}
		runs, err := runOpenPhase(ctx, env, o)
		res.Open = runs
		if err != nil {
			return err
		}
	}
	if err := stubs.Alive(); err != nil {
		return fmt.Errorf("the stubs exited during the run: %w", err)
	}
	res.LoadAvgEnd = loadAvg()
	res.summarise()
	fmt.Fprintln(stdout)
	fmt.Fprint(stdout, res.text())
	if o.Out != "" {
		if err := os.MkdirAll(o.Out, 0o755); err != nil {
			return err
		}
		j, _ := json.MarshalIndent(res, "", "  ")
		if err := os.WriteFile(filepath.Join(o.Out, "results.json"), j, 0o644); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(o.Out, "summary.md"), []byte(res.markdown()), 0o644); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "\nwrote %s and %s\n", filepath.Join(o.Out, "results.json"), filepath.Join(o.Out, "summary.md"))
	}
	return nil
}

// runRequestPhases runs the wrk and stream phases against one HAProxy
// and one warmroute (and the baseline) for all their repetitions, and
// stops those proxies.
func runRequestPhases(ctx context.Context, cs *children, dir string, o options, stubs *proc.Process, addrs []string,
	serve proc.ServeArgs, bodies, streamBodies [][]byte, res *results, stdout io.Writer) error {
	free, err := proc.FreeAddrs("127.0.0.1", 5)
	if err != nil {
		return err
	}
	hapAddr := free[0]
	cfgPath := filepath.Join(dir, "haproxy.cfg")
	if err := os.WriteFile(cfgPath, []byte(haproxyConfig(hapAddr, addrs, o.PrefixBytes, o.BalanceFactor, haproxyMaxConn)), 0o644); err != nil {
		return err
	}
	hap, err := cs.start("haproxy", o.Taskset, o.SUTCPUs, o.Nice, o.HAProxy, "-db", "-f", cfgPath)
	if err != nil {
		return err
	}
	wrArgs := serve
	wrArgs.Listen, wrArgs.AdminListen = free[1], free[2]
	wr, err := cs.start("warmroute", o.Taskset, o.SUTCPUs, o.Nice, append([]string{o.Warmroute}, wrArgs.Args()...)...)
	if err != nil {
		return err
	}
	targets := []target{
		{Name: "direct", URL: "http://" + addrs[0]},
		{Name: "haproxy", URL: "http://" + hapAddr, process: hap},
		{Name: "warmroute", URL: "http://" + wrArgs.Listen, process: wr},
	}
	if o.Baseline != "" {
		bargs := wrArgs
		bargs.Listen, bargs.AdminListen = free[3], free[4]
		base, err := cs.start("baseline", o.Taskset, o.SUTCPUs, o.Nice, append([]string{o.Baseline}, bargs.Args()...)...)
		if err != nil {
			return err
		}
		targets = append(targets, target{Name: "baseline", URL: "http://" + bargs.Listen, process: base})
	}
	for _, t := range targets {
		if err := waitReady(ctx, t.process, t.URL, bodies[0], 15*time.Second); err != nil {
			return fmt.Errorf("%s: %w", t.Name, err)
		}
	}
	fmt.Fprintf(stdout, "benchproxy: HAProxy %s; warmroute %s\n", hapAddr, wrArgs.Listen)

	var longBodiesBySize map[int][][]byte
	if o.phase("long") {
		if longBodiesBySize, err = longBodies(o); err != nil {
			return err
		}
	}
	var wrkr *wrkRunner
	if o.phase("wrk") {
		if wrkr, err = newWrkRunner(dir, o.Wrk, o.Taskset, o.GenCPUs, o.Nice, bodies); err != nil {
			return err
		}
	}
	for rep := 0; rep < o.Reps; rep++ {
		for k := range targets {
			if !o.phase("wrk") {
				break
			}
			t := targets[(k+rep)%len(targets)]
			for _, c := range o.Conns {
				r, err := measure(ctx, wrkr, t, stubs, c, o)
				if err != nil {
					return fmt.Errorf("%s c=%d: %w", t.Name, c, err)
				}
				r.Rep = rep
				res.Runs = append(res.Runs, r)
				fmt.Fprintf(stdout, "rep %d %-9s c=%-3d %9.0f req/s  p50 %7.1fus  p99 %7.1fus  cpu %6.2fus/req  stubs %5.2fus/req  other on SUT cpus %4.0f%%  generator cpus busy %4.0f%%\n",
					rep, t.Name, c, r.RPS, us(r.P50), us(r.P99), us(r.CPUPerReq), us(r.StubCPUPerReq), 100*r.OtherSUTBusy, 100*r.GenBusy)
			}
		}
		for _, together := range []bool{false, true} {
			if o.Streams == 0 || !o.phase("stream") {
				break
			}
			st, err := measureStreams(ctx, targets, streamBodies, together, o)
			if err != nil {
				return fmt.Errorf("streams: %w", err)
			}
			for i := range st {
				st[i].Rep = rep
				fmt.Fprintf(stdout, "rep %d %-9s stream (%s) first chunk p50 %7.3fms p90 %7.3fms  (whole stream p50 %.1fms, %d events)\n",
					rep, st[i].Target, st[i].Engine, ms(st[i].FirstP50), ms(st[i].FirstP90), ms(st[i].TotalP50), st[i].Events)
			}
			res.Streams = append(res.Streams, st...)
		}
		if o.phase("long") {
			if err := runLongRep(ctx, targets, o, longBodiesBySize, rep, res, stdout); err != nil {
				return err
			}
		}
	}
	for _, t := range targets {
		if t.process == nil {
			continue
		}
		if err := t.process.Alive(); err != nil {
			return fmt.Errorf("%s exited during the run: %w", t.Name, err)
		}
		// The open phase starts proxies of its own.
		t.process.Stop(3 * time.Second)
	}
	return nil
}

// measure runs wrk once unmeasured (warm-up) and once measured against t,
// reading the proxy's and the stubs' CPU time around the measured run.
func measure(ctx context.Context, w *wrkRunner, t target, stubs *proc.Process, conns int, o options) (run, error) {
	if o.Warmup > 0 {
		if _, err := w.run(ctx, t.URL, conns, o.Warmup); err != nil {
			return run{}, err
		}
	}
	var cpu0, cpu1 time.Duration
	var err error
	if t.process != nil {
		if cpu0, err = cpuTime(t.process.Pid()); err != nil {
			return run{}, err
		}
	}
	scpu0, err := cpuTime(stubs.Pid())
	if err != nil {
		return run{}, err
	}
	sut0, err := cpusBusy(o.SUTCPUs)
	if err != nil {
		return run{}, err
	}
	gen0, err := cpusBusy(o.GenCPUs)
	if err != nil {
		return run{}, err
	}
	r, err := w.run(ctx, t.URL, conns, o.Duration)
	if err != nil {
		return run{}, err
	}
	sut1, err := cpusBusy(o.SUTCPUs)
	if err != nil {
		return run{}, err
	}
	gen1, err := cpusBusy(o.GenCPUs)
	if err != nil {
		return run{}, err
	}
	scpu1, err := cpuTime(stubs.Pid())
	if err != nil {
		return run{}, err
	}
	if t.process != nil {
		if cpu1, err = cpuTime(t.process.Pid()); err != nil {
			return run{}, err
		}
	}
	if r.StatusErrors > 0 || r.SocketErrors > 0 {
		return run{}, fmt.Errorf("%d non-2xx answers, %d socket errors", r.StatusErrors, r.SocketErrors)
	}
	out := run{Target: t.Name, Conns: conns, Wrk: r, RPS: r.RPS(), P50: r.P50, P99: r.P99,
		StubCPUPerReq: (scpu1 - scpu0) / time.Duration(r.Requests)}
	busy := sut1.sub(sut0)
	if t.process != nil {
		out.CPU = cpu1 - cpu0
		out.CPUPerReq = out.CPU / time.Duration(r.Requests)
	}
	if busy.total > 0 {
		other := busy.busy - out.CPU
		out.OtherSUTBusy = max(0, other.Seconds()/busy.total.Seconds())
	}
	if g := gen1.sub(gen0); g.total > 0 {
		out.GenBusy = g.busy.Seconds() / g.total.Seconds()
	}
	return out, nil
}

// measureStreams sends o.Streams streamed requests to every target in
// turn (interleaved, one keep-alive connection each) and summarises the
// time to the first chunk.
func measureStreams(ctx context.Context, targets []target, bodies [][]byte, together bool, o options) ([]streamRun, error) {
	clients := make([]*streamClient, len(targets))
	firsts := make([][]time.Duration, len(targets))
	totals := make([][]time.Duration, len(targets))
	events := make([]int, len(targets))
	for i, t := range targets {
		clients[i] = newStreamClient(strings.TrimPrefix(t.URL, "http://"))
		defer clients[i].close()
	}
	// One unmeasured stream each to open the connections.
	for i := range targets {
		if _, err := clients[i].do(bodies[0], together, 10*time.Second); err != nil {
			return nil, fmt.Errorf("%s: %w", targets[i].Name, err)
		}
	}
	for n := 0; n < o.Streams; n++ {
		for k := range targets {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			i := (k + n) % len(targets)
			st, err := clients[i].do(bodies[n%len(bodies)], together, 10*time.Second)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", targets[i].Name, err)
			}
			if st.Events != o.StreamChunks+1 {
				return nil, fmt.Errorf("%s: %d events, want %d", targets[i].Name, st.Events, o.StreamChunks+1)
			}
			firsts[i] = append(firsts[i], st.First)
			totals[i] = append(totals[i], st.Total)
			events[i] = st.Events
		}
	}
	out := make([]streamRun, len(targets))
	for i, t := range targets {
		out[i] = streamRun{Target: t.Name, Engine: engineStyle(together), N: len(firsts[i]), Events: events[i],
			FirstP50: percentile(firsts[i], 50), FirstP90: percentile(firsts[i], 90),
			TotalP50: percentile(totals[i], 50)}
	}
	return out, nil
}

// engineStyle names how the stub sends a stream's headers.
func engineStyle(together bool) string {
	if together {
		return "headers with first event"
	}
	return "headers first"
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
