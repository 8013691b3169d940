package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/warmroute/warmroute/loadtest/proc"
)

// The open-streams phase: N long SSE streams open at once through a fresh
// proxy process, as LLM streaming holds them. It measures the proxy's CPU
// per relayed event and its memory per open stream while every stream is
// open (the steady window), each event's one-way latency, and how much of
// that memory the process gives back once the streams have ended.

// Bounds of the open-streams flags.
const (
	maxOpenStreams = 100000
	maxOpenCounts  = 8
	maxOpenReps    = 20
	maxOpenRamp    = 10 * time.Minute
	maxOpenSettle  = 10 * time.Minute
	minOpenGap     = time.Millisecond
	// minOpenWindow is the shortest steady window the flags may plan.
	minOpenWindow = 5 * time.Second
)

// Timings of one run around the streams.
const (
	// openIdleWait is how long a fresh proxy runs after it first answered
	// before its idle memory is read.
	openIdleWait = time.Second
	// openRSSEvery is how often RSS is read in the steady window.
	openRSSEvery = 250 * time.Millisecond
	// openSettleEvery is how often RSS is read after the streams ended.
	openSettleEvery = time.Second
	// openSettleNear: RSS within this factor of idle counts as returned.
	openSettleNear = 1.2
	// openStop is the grace a proxy gets to exit after SIGTERM.
	openStop = 3 * time.Second
)

// phases the harness knows, in the order it runs them.
var phaseNames = []string{"wrk", "stream", "open", "long"}

// defaultPhases are the phases run unless -phases names others.
var defaultPhases = []string{"wrk", "stream", "open"}

// parsePhases reads -phases: a comma-separated subset of phaseNames.
func parsePhases(s string) ([]string, error) {
	var out []string
	for _, p := range strings.Split(s, ",") {
		p = strings.TrimSpace(p)
		if p == "" {
			continue
		}
		if !slices.Contains(phaseNames, p) {
			return nil, fmt.Errorf("-phases: unknown phase %q (known: %s)", p, strings.Join(phaseNames, ", "))
		}
		if slices.Contains(out, p) {
			return nil, fmt.Errorf("-phases: %q given twice", p)
		}
		out = append(out, p)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("-phases: none given (known: %s)", strings.Join(phaseNames, ", "))
	}
	return out, nil
}

// parseStreamCounts reads -open-streams: stream counts, comma-separated,
// each 1 to maxOpenStreams, at most maxOpenCounts of them, none twice.
// "" or "0" is none (the phase is skipped).
func parseStreamCounts(s string) ([]int, error) {
	s = strings.TrimSpace(s)
	if s == "" || s == "0" {
		return nil, nil
	}
	return parseIntList("-open-streams", "count", s, 1, maxOpenStreams, maxOpenCounts, "; \"0\" alone skips the phase")
}

// parseIntList reads a flag's comma-separated list of what (counts,
// sizes): each lo to hi, at most most of them, none twice. hint ends the
// message of a bad entry.
func parseIntList(flag, what, s string, lo, hi, most int, hint string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		n, err := strconv.Atoi(f)
		if err != nil || n < lo || n > hi {
			return nil, fmt.Errorf("%s: bad %s %q (%d to %d%s)", flag, what, f, lo, hi, hint)
		}
		if slices.Contains(out, n) {
			return nil, fmt.Errorf("%s: %d given twice", flag, n)
		}
		out = append(out, n)
	}
	if len(out) > most {
		return nil, fmt.Errorf("%s: %d given, at most %d", flag, len(out), most)
	}
	return out, nil
}

// openWindow is the steady window the settings plan: from the ramp's end
// (every stream has had its first event) to 2 gaps before the first stream
// started sends its last event. Slow first events make it shorter; the run
// then reports the window it had.
func openWindow(chunks int, gap, ramp time.Duration) time.Duration {
	return time.Duration(chunks-3)*gap - ramp
}

// openWindowEnd is when the steady window ends, for streams started from
// started on: every stream sends its last event after it (a stream's
// events are at least gap apart, the first prefill after its request).
func openWindowEnd(started time.Time, chunks int, gap, prefill time.Duration) time.Time {
	return started.Add(prefill + time.Duration(chunks-3)*gap)
}

// validateOpen checks the open-streams settings.
func (o *options) validateOpen() error {
	switch {
	case o.OpenEngine != engineStub && o.OpenEngine != engineGpusim:
		return fmt.Errorf("-open-engine %q: stub or gpusim", o.OpenEngine)
	case o.OpenChunks < 3 || o.OpenChunks > maxBenchChunks:
		return fmt.Errorf("-open-chunks %d: 3 to %d events per stream", o.OpenChunks, maxBenchChunks)
	case o.OpenGap < minOpenGap || o.OpenGap > maxBenchGap:
		return fmt.Errorf("-open-gap %s: %s to %s", o.OpenGap, minOpenGap, maxBenchGap)
	case o.OpenRamp < 0 || o.OpenRamp > maxOpenRamp:
		return fmt.Errorf("-open-ramp %s: 0 to %s", o.OpenRamp, maxOpenRamp)
	case o.OpenReps < 1 || o.OpenReps > maxOpenReps:
		return fmt.Errorf("-open-reps %d: 1 to %d", o.OpenReps, maxOpenReps)
	case o.OpenSettle < 0 || o.OpenSettle > maxOpenSettle:
		return fmt.Errorf("-open-settle %s: 0 to %s", o.OpenSettle, maxOpenSettle)
	case o.StreamPrefill < 0 || o.StreamPrefill > maxBenchGap:
		return fmt.Errorf("-stream-prefill %s: 0 to %s", o.StreamPrefill, maxBenchGap)
	}
	if w := openWindow(o.OpenChunks, o.OpenGap, o.OpenRamp); w < minOpenWindow {
		return fmt.Errorf("-open-chunks %d x -open-gap %s after a -open-ramp of %s leaves a steady window of %s; it must be at least %s: more chunks, a longer gap or a shorter ramp",
			o.OpenChunks, o.OpenGap, o.OpenRamp, w, minOpenWindow)
	}
	if est := o.openEstimate(); est > o.Timeout {
		return fmt.Errorf("the open-streams phase would take about %s, over -timeout %s: fewer -open-reps or stream counts, or a shorter -open-settle",
			est.Round(time.Second), o.Timeout)
	}
	return nil
}

// openTargets are the phase's targets: the stubs directly (latency floor)
// and each proxy.
func (o *options) openTargets() []string {
	t := []string{"direct", "haproxy", "warmroute"}
	if o.Baseline != "" {
		t = append(t, "baseline")
	}
	return t
}

// openEstimate is about how long the phase takes: per run the streams, and
// for a proxy its start, idle wait, settle and stop.
func (o *options) openEstimate() time.Duration {
	stream := o.OpenRamp + o.StreamPrefill + time.Duration(o.OpenChunks)*o.OpenGap + time.Second
	proxy := 2*time.Second + openIdleWait + o.OpenSettle + time.Second
	per := time.Duration(len(o.openTargets()))*stream + time.Duration(len(o.openTargets())-1)*proxy
	return time.Duration(len(o.OpenStreams)*o.OpenReps) * per
}

// fdsNeeded is the file descriptors a proxy holds for n open streams: a
// client and an upstream connection each, and a margin for listeners,
// health checks, metrics and logs. The stubs and the client hold one per
// stream.
func fdsNeeded(n int) uint64 { return 2*uint64(n) + 256 }

// openServeLimits are the `warmroute serve` limits n open streams need,
// 0 where the default admits them: --max-conns (client connections,
// default 16384) and --max-conns-per-backend (upstream connections per
// backend, default 1024: the streams may all have one owner).
func openServeLimits(n int) (maxConns, perBackend int) {
	const defMaxConns, defPerBackend, margin = 16384, 1024, 1024
	if n+margin > defMaxConns {
		maxConns = n + margin
	}
	if n > defPerBackend {
		perBackend = n
	}
	return maxConns, perBackend
}

// openHAProxyMaxConn is HAProxy's maxconn for n open streams.
func openHAProxyMaxConn(n int) int { return max(haproxyMaxConn, n+64) }

// openRun is one open-streams run: one target, one stream count, one
// repetition, on a fresh proxy process.
type openRun struct {
	Rep    int    `json:"rep"`
	Target string `json:"target"`
	N      int    `json:"n"`
	// Untimed says the events carried no send time (gpusim): the latency
	// fields are empty.
	Untimed bool `json:"untimed,omitempty"`
	// Invalid says why the run does not count ("" when it does): failed
	// or short streams, a steady window too short, the proxy exiting.
	Invalid      string   `json:"invalid,omitempty"`
	Errors       int64    `json:"errors"`
	ErrorSamples []string `json:"error_samples,omitempty"`
	// Events is the data events received, [DONE] not counted.
	Events int64 `json:"events"`
	// AllFirst is the time from the first stream's start until every
	// stream had its first event.
	AllFirst time.Duration `json:"all_first_ns"`
	// One-way latency (receive time minus the stub's send time) of the
	// first event of each stream, and of the later events.
	FirstP50 time.Duration `json:"first_p50_ns"`
	FirstP99 time.Duration `json:"first_p99_ns"`
	LaterP50 time.Duration `json:"later_p50_ns"`
	LaterP99 time.Duration `json:"later_p99_ns"`
	LaterMax time.Duration `json:"later_max_ns"`

	// The steady window: its length, the proxy's CPU time in it and the
	// events the client received in it.
	Window       time.Duration `json:"window_ns"`
	WindowCPU    time.Duration `json:"window_cpu_ns"`
	WindowEvents int64         `json:"window_events"`
	// CPUPerEventUs is WindowCPU / WindowEvents, in microseconds.
	CPUPerEventUs float64 `json:"cpu_per_event_us"`
	// The whole life: the proxy's CPU time from just before the first
	// stream's request to just after the last stream ended (accepting,
	// reading and routing every request, connecting upstream, the relay,
	// the last events, teardown; the window's two /metrics scrapes are
	// in it), and that per event received.
	LifeCPU           time.Duration `json:"life_cpu_ns"`
	LifeCPUPerEventUs float64       `json:"life_cpu_per_event_us"`
	// OtherSUTBusy and GenBusy are as in run, over the window.
	OtherSUTBusy float64 `json:"other_sut_busy"`
	GenBusy      float64 `json:"gen_busy"`

	// Memory of the proxy process: RSS when idle (fresh, after one
	// request), its highest reading in the window, and after the settle
	// time; Go heap in use and goroutines (warmroute), idle, right after
	// the window, and after the settle time.
	IdleRSS          int64   `json:"idle_rss_bytes"`
	PeakRSS          int64   `json:"peak_rss_bytes"`
	SettleRSS        int64   `json:"settle_rss_bytes"`
	SettleSeriesKB   []int64 `json:"settle_rss_kb"` // every second from the streams' end
	IdleHeap         int64   `json:"idle_heap_bytes,omitempty"`
	PeakHeap         int64   `json:"peak_heap_bytes,omitempty"`
	SettleHeap       int64   `json:"settle_heap_bytes,omitempty"`
	IdleStack        int64   `json:"idle_stack_bytes,omitempty"`
	PeakStack        int64   `json:"peak_stack_bytes,omitempty"`
	IdleGoroutines   int64   `json:"idle_goroutines,omitempty"`
	PeakGoroutines   int64   `json:"peak_goroutines,omitempty"`
	SettleGoroutines int64   `json:"settle_goroutines,omitempty"`
	// AllocsPerEvent is the Go allocations (go_memstats_mallocs_total)
	// over the window, per event received; the window's two /metrics
	// scrapes, just outside its CPU reading, are counted in it.
	AllocsPerEvent float64 `json:"allocs_per_event,omitempty"`
	// SettleNear is when, after the streams ended, RSS first came within
	// 20% of idle; SettleReached is false when it never did.
	SettleNear    time.Duration `json:"settle_near_ns"`
	SettleReached bool          `json:"settle_reached"`
	// ProxyLog is the end of the proxy's output, kept for invalid runs.
	ProxyLog string `json:"proxy_log,omitempty"`
}

// openLogTail bounds ProxyLog.
const openLogTail = 1024

// isProxy reports whether the run measured a proxy process.
func (r openRun) isProxy() bool { return r.Target != "direct" }

// openEnv is what the phase's runs share.
type openEnv struct {
	cs        *children
	dir       string
	stubs     []string // the stub backends' addresses
	bodies    [][]byte // streamed request bodies
	readyBody []byte   // a non-streamed body, for readiness checks
	serve     proc.ServeArgs
	minWindow time.Duration
	out       io.Writer
	untimed   bool // the events carry no send time (gpusim)
}

// runOpenPhase runs every stream count, repetition and target, the targets
// interleaved within a repetition (their order rotating by one each
// repetition).
func runOpenPhase(ctx context.Context, env openEnv, o options) ([]openRun, error) {
	var runs []openRun
	targets := o.openTargets()
	for _, n := range o.OpenStreams {
		for rep := 0; rep < o.OpenReps; rep++ {
			for k := range targets {
				t := targets[(k+rep)%len(targets)]
				r, err := runOpen(ctx, env, o, t, n)
				if err != nil {
					return runs, fmt.Errorf("open streams, %s n=%d: %w", t, n, err)
				}
				r.Rep = rep
				runs = append(runs, r)
				fmt.Fprintln(env.out, r.line())
			}
		}
	}
	return runs, nil
}

// line is the run's one-line report.
func (r openRun) line() string {
	var b strings.Builder
	fmt.Fprintf(&b, "rep %d %-9s open n=%-5d first p50/p99 %7.3f/%7.3fms  later p50/p99 %7.3f/%7.3fms  errors %d",
		r.Rep, r.Target, r.N, ms(r.FirstP50), ms(r.FirstP99), ms(r.LaterP50), ms(r.LaterP99), r.Errors)
	if r.isProxy() {
		fmt.Fprintf(&b, "  cpu %6.2fus/chunk (whole life %6.2f)  rss %+7.1fKB/stream", r.CPUPerEventUs, r.LifeCPUPerEventUs, r.rssPerStreamKB())
		if r.IdleHeap > 0 {
			fmt.Fprintf(&b, "  heap %+7.1fKB/stream  %.1f allocs/chunk", r.heapPerStreamKB(), r.AllocsPerEvent)
		}
		near := "never"
		if r.SettleReached {
			near = r.SettleNear.Round(time.Second).String()
		}
		fmt.Fprintf(&b, "  settle %.2fx idle (%+.1fMB, within 20%% %s)", r.settleRatio(), r.settleMB(), near)
	}
	fmt.Fprintf(&b, "  window %.1fs, generator busy %.0f%%", r.Window.Seconds(), 100*r.GenBusy)
	if r.Invalid != "" {
		fmt.Fprintf(&b, "  INVALID: %s", r.Invalid)
	}
	return b.String()
}

func (r openRun) rssPerStreamKB() float64 {
	return float64(r.PeakRSS-r.IdleRSS) / float64(r.N) / 1024
}

func (r openRun) heapPerStreamKB() float64 {
	return float64(r.PeakHeap-r.IdleHeap) / float64(r.N) / 1024
}

func (r openRun) settleRatio() float64 {
	if r.IdleRSS == 0 {
		return 0
	}
	return float64(r.SettleRSS) / float64(r.IdleRSS)
}

func (r openRun) settleMB() float64 { return float64(r.SettleRSS-r.IdleRSS) / (1 << 20) }

// openProxy is a proxy started for one run.
type openProxy struct {
	p       *proc.Process
	addr    string // client-facing host:port
	metrics string // Prometheus URL, "" for HAProxy
}

// startOpenProxy starts a fresh target process for n open streams and
// waits until it answers.
func startOpenProxy(ctx context.Context, env openEnv, o options, target string, n int) (openProxy, error) {
	free, err := proc.FreeAddrs("127.0.0.1", 2)
	if err != nil {
		return openProxy{}, err
	}
	var px openProxy
	switch target {
	case "haproxy":
		cfg := filepath.Join(env.dir, "haproxy-open.cfg")
		text := haproxyConfig(free[0], env.stubs, o.PrefixBytes, o.BalanceFactor, openHAProxyMaxConn(n))
		if err := os.WriteFile(cfg, []byte(text), 0o644); err != nil {
			return openProxy{}, err
		}
		px.addr = free[0]
		px.p, err = env.cs.start("haproxy-open", o.Taskset, o.SUTCPUs, o.Nice, o.HAProxy, "-db", "-f", cfg)
	case "warmroute", "baseline":
		bin := o.Warmroute
		if target == "baseline" {
			bin = o.Baseline
		}
		args := env.serve
		args.Listen, args.AdminListen = free[0], free[1]
		args.MaxConns, args.MaxConnsPerBackend = openServeLimits(n)
		px.addr, px.metrics = free[0], "http://"+free[1]+"/metrics"
		px.p, err = env.cs.start(target+"-open", o.Taskset, o.SUTCPUs, o.Nice, append([]string{bin}, args.Args()...)...)
	default:
		return openProxy{}, fmt.Errorf("unknown target %q", target)
	}
	if err != nil {
		return openProxy{}, err
	}
	if err := waitReady(ctx, px.p, "http://"+px.addr, env.readyBody, 15*time.Second); err != nil {
		px.p.Stop(openStop)
		return openProxy{}, err
	}
	return px, nil
}

// sleepCtx sleeps d, or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// runOpen runs target with n open streams once. An error is returned
// only when the run could not take place (the proxy did not start, the
// harness was stopped); failed streams make the run invalid.
func runOpen(ctx context.Context, env openEnv, o options, target string, n int) (openRun, error) {
	r := openRun{Target: target, N: n, Untimed: env.untimed}
	var invalid []string
	var px openProxy
	addrs := env.stubs
	if target != "direct" {
		var err error
		if px, err = startOpenProxy(ctx, env, o, target, n); err != nil {
			return r, err
		}
		defer px.p.Stop(openStop)
		addrs = []string{px.addr}
		if err := sleepCtx(ctx, openIdleWait); err != nil {
			return r, err
		}
		if r.IdleRSS, err = proc.RSS(px.p.Pid()); err != nil {
			return r, err
		}
		if px.metrics != "" {
			s, err := scrapeGoStats(ctx, px.metrics)
			if err != nil {
				return r, err
			}
			r.IdleHeap, r.IdleStack, r.IdleGoroutines = s.HeapInuse, s.StackInuse, s.Goroutines
		}
	}

	c, err := newOpenClient(openClientSpec{Addrs: addrs, Bodies: env.bodies, N: n, Chunks: o.OpenChunks,
		Gap: o.OpenGap, Prefill: o.StreamPrefill, Ramp: o.OpenRamp, Untimed: env.untimed})
	if err != nil {
		return r, err
	}
	var life0 time.Duration
	if px.p != nil {
		if life0, err = cpuTime(px.p.Pid()); err != nil {
			return r, err
		}
	}
	cctx, cancelStreams := context.WithCancel(ctx)
	defer func() {
		cancelStreams()
		<-c.done
	}()
	c.start(cctx)
	end := openWindowEnd(c.started, o.OpenChunks, o.OpenGap, o.StreamPrefill)
	first := time.NewTimer(time.Until(end))
	select {
	case <-c.allFirst:
		first.Stop()
		r.AllFirst = time.Since(c.started)
		if left := time.Until(end); left < env.minWindow {
			invalid = append(invalid, fmt.Sprintf("steady window of %s, under %s: every stream had its first event only %s after the first started",
				left.Round(time.Millisecond), env.minWindow, r.AllFirst.Round(time.Millisecond)))
		} else if err := measureWindow(ctx, &r, c, px, end, o); err != nil {
			return r, err
		}
	case <-first.C:
		invalid = append(invalid, fmt.Sprintf("%d of %d streams had their first event before the first ones ended", c.firsts.Load(), n))
	case <-ctx.Done():
		first.Stop()
		return r, ctx.Err()
	}
	<-c.done
	if ctx.Err() != nil {
		return r, ctx.Err()
	}
	r.Events, r.Errors, r.ErrorSamples = c.events.Load(), c.failed.Load(), c.errorSamples()
	if px.p != nil {
		life1, err := cpuTime(px.p.Pid())
		if err != nil {
			return r, err
		}
		r.LifeCPU = life1 - life0
		if r.Events > 0 {
			r.LifeCPUPerEventUs = us(r.LifeCPU) / float64(r.Events)
		}
	}
	if r.Errors > 0 {
		invalid = append(invalid, fmt.Sprintf("%d of %d streams failed or ended early", r.Errors, n))
	}
	fh, lh := c.latencies()
	us := func(v int64) time.Duration { return time.Duration(v) * time.Microsecond }
	r.FirstP50, r.FirstP99 = us(fh.ValueAtQuantile(50)), us(fh.ValueAtQuantile(99))
	r.LaterP50, r.LaterP99, r.LaterMax = us(lh.ValueAtQuantile(50)), us(lh.ValueAtQuantile(99)), us(lh.Max())

	if px.p != nil {
		if err := settle(ctx, &r, px, o.OpenSettle); err != nil {
			return r, err
		}
		if err := px.p.Alive(); err != nil {
			invalid = append(invalid, "the proxy exited: "+err.Error())
		}
	}
	r.Invalid = strings.Join(invalid, "; ")
	if r.Invalid != "" && px.p != nil {
		r.ProxyLog = px.p.Output().Last(openLogTail)
	}
	return r, nil
}

// measureWindow measures the steady window, from now to end: the proxy's
// CPU time, the events the client received, RSS every openRSSEvery
// (reading /proc costs the proxy nothing) and, just before and after the
// CPU readings (a /metrics scrape costs CPU), the Go figures.
func measureWindow(ctx context.Context, r *openRun, c *openClient, px openProxy, end time.Time, o options) error {
	var cpu0 time.Duration
	var err error
	var gs0 goStats
	if px.metrics != "" {
		if gs0, err = scrapeGoStats(ctx, px.metrics); err != nil {
			return err
		}
	}
	if px.p != nil {
		if cpu0, err = cpuTime(px.p.Pid()); err != nil {
			return err
		}
	}
	ev0 := c.events.Load()
	sut0, err := cpusBusy(o.SUTCPUs)
	if err != nil {
		return err
	}
	gen0, err := cpusBusy(o.GenCPUs)
	if err != nil {
		return err
	}
	t0 := time.Now()
	for {
		if px.p != nil {
			if rss, err := proc.RSS(px.p.Pid()); err == nil {
				r.PeakRSS = max(r.PeakRSS, rss)
			}
		}
		d := min(openRSSEvery, time.Until(end))
		if d <= 0 {
			break
		}
		if err := sleepCtx(ctx, d); err != nil {
			return err
		}
	}
	var cpu1 time.Duration
	if px.p != nil {
		if cpu1, err = cpuTime(px.p.Pid()); err != nil {
			return err
		}
	}
	ev1 := c.events.Load()
	r.Window = time.Since(t0)
	sut1, err := cpusBusy(o.SUTCPUs)
	if err != nil {
		return err
	}
	gen1, err := cpusBusy(o.GenCPUs)
	if err != nil {
		return err
	}
	r.WindowCPU, r.WindowEvents = cpu1-cpu0, ev1-ev0
	if r.WindowEvents > 0 {
		r.CPUPerEventUs = us(r.WindowCPU) / float64(r.WindowEvents)
	}
	if b := sut1.sub(sut0); b.total > 0 {
		r.OtherSUTBusy = max(0, (b.busy-r.WindowCPU).Seconds()/b.total.Seconds())
	}
	if g := gen1.sub(gen0); g.total > 0 {
		r.GenBusy = g.busy.Seconds() / g.total.Seconds()
	}
	if px.metrics != "" {
		s, err := scrapeGoStats(ctx, px.metrics)
		if err != nil {
			return err
		}
		r.PeakHeap, r.PeakStack, r.PeakGoroutines = s.HeapInuse, s.StackInuse, s.Goroutines
		if r.WindowEvents > 0 {
			r.AllocsPerEvent = float64(s.Mallocs-gs0.Mallocs) / float64(r.WindowEvents)
		}
	}
	return nil
}

// settle reads the proxy's RSS every openSettleEvery for d after the
// streams ended, then its Go heap.
func settle(ctx context.Context, r *openRun, px openProxy, d time.Duration) error {
	ended := time.Now()
	near := int64(openSettleNear * float64(r.IdleRSS))
	for {
		rss, err := proc.RSS(px.p.Pid())
		if err != nil {
			return fmt.Errorf("the proxy's RSS after the streams: %w", err)
		}
		r.SettleRSS = rss
		r.SettleSeriesKB = append(r.SettleSeriesKB, rss>>10)
		if !r.SettleReached && rss <= near {
			r.SettleReached, r.SettleNear = true, time.Since(ended)
		}
		next := ended.Add(time.Duration(len(r.SettleSeriesKB)) * openSettleEvery)
		if next.Sub(ended) > d {
			break
		}
		if err := sleepCtx(ctx, time.Until(next)); err != nil {
			return err
		}
	}
	if px.metrics != "" {
		s, err := scrapeGoStats(ctx, px.metrics)
		if err != nil {
			return err
		}
		r.SettleHeap, r.SettleGoroutines = s.HeapInuse, s.Goroutines
	}
	return nil
}
