package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/warmroute/warmroute/loadtest/proc"
)

func TestParseOpenOptions(t *testing.T) {
	o, err := parseOptions(nil)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(o.Phases, ",") != "wrk,stream,open" || len(o.OpenStreams) != 1 || o.OpenStreams[0] != 2000 ||
		o.OpenChunks != 61 || o.OpenGap != 300*time.Millisecond || o.OpenRamp != 3*time.Second || o.OpenReps != 3 || o.OpenSettle != 30*time.Second {
		t.Fatalf("defaults: %+v", o)
	}
	o, err = parseOptions([]string{"-phases", "open", "-open-streams", "2000, 10000", "-open-reps", "1"})
	if err != nil {
		t.Fatal(err)
	}
	if !o.phase("open") || o.phase("wrk") || len(o.OpenStreams) != 2 || o.OpenStreams[1] != 10000 {
		t.Fatalf("open only: %+v", o)
	}
	// -open-streams 0 drops the phase.
	for _, v := range []string{"0", ""} {
		o, err = parseOptions([]string{"-open-streams", v})
		if err != nil || o.phase("open") || !o.phase("wrk") {
			t.Fatalf("-open-streams %q: phases %v, %v", v, o.Phases, err)
		}
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-phases", "open", "-open-streams", "0"}, "nothing to run"},
		{[]string{"-phases", "wrk,bogus"}, "unknown phase"},
		{[]string{"-phases", "open,open"}, "given twice"},
		{[]string{"-phases", " , "}, "none given"},
		{[]string{"-open-streams", "2000,x"}, "bad count"},
		{[]string{"-open-streams", "0,2000"}, "bad count"},
		{[]string{"-open-streams", "100001"}, "bad count"},
		{[]string{"-open-streams", "5,5"}, "given twice"},
		{[]string{"-open-streams", "1,2,3,4,5,6,7,8,9"}, "at most 8"},
		{[]string{"-open-chunks", "2"}, "-open-chunks 2"},
		{[]string{"-open-engine", "vllm"}, "-open-engine \"vllm\": stub or gpusim"},
		{[]string{"-open-chunks", "10001"}, "-open-chunks"},
		{[]string{"-open-gap", "0s"}, "-open-gap"},
		{[]string{"-open-gap", "11s"}, "-open-gap"},
		{[]string{"-open-ramp", "-1s"}, "-open-ramp"},
		{[]string{"-open-reps", "0"}, "-open-reps"},
		{[]string{"-open-reps", "21"}, "-open-reps"},
		{[]string{"-open-settle", "-1s"}, "-open-settle"},
		{[]string{"-open-settle", "11m"}, "-open-settle"},
		{[]string{"-open-ramp", "15s"}, "steady window of 2.4s"},
		{[]string{"-open-chunks", "10", "-open-gap", "100ms"}, "steady window"},
		{[]string{"-open-reps", "20", "-open-streams", "1,2,3", "-timeout", "30m"}, "would take about"},
		{[]string{"-timeout", "0s"}, "-timeout"},
		{[]string{"stray"}, "unexpected arguments"},
	} {
		_, err := parseOptions(tc.args)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: error %v, want one containing %q", tc.args, err, tc.want)
		}
	}
	// Settings the open phase does not use are not checked against it.
	if _, err := parseOptions([]string{"-phases", "wrk", "-open-chunks", "2"}); err != nil {
		t.Errorf("open flags checked without the open phase: %v", err)
	}
}

func TestOpenPlan(t *testing.T) {
	if w := openWindow(61, 300*time.Millisecond, 3*time.Second); w != 14400*time.Millisecond {
		t.Errorf("default window %v", w)
	}
	t0 := time.Unix(100, 0)
	if end := openWindowEnd(t0, 61, 300*time.Millisecond, 10*time.Millisecond); end != t0.Add(17410*time.Millisecond) {
		t.Errorf("window end %v", end.Sub(t0))
	}
	o, err := parseOptions([]string{"-phases", "open", "-open-streams", "2000,10000"})
	if err != nil {
		t.Fatal(err)
	}
	// 2 counts x 3 reps x (3 x 22.3s of streams + 2 x 34s of proxy life).
	if est := o.openEstimate(); est < 13*time.Minute || est > 14*time.Minute {
		t.Errorf("estimate %v", est)
	}
	if fdsNeeded(10000) != 20256 {
		t.Errorf("fds for 10000: %d", fdsNeeded(10000))
	}
	for _, tc := range []struct{ n, conns, per int }{{20, 0, 0}, {1024, 0, 0}, {2000, 0, 2000}, {10000, 0, 10000}, {16000, 17024, 16000}} {
		c, p := openServeLimits(tc.n)
		if c != tc.conns || p != tc.per {
			t.Errorf("n=%d: --max-conns %d --max-conns-per-backend %d, want %d %d", tc.n, c, p, tc.conns, tc.per)
		}
	}
	if openHAProxyMaxConn(20) != haproxyMaxConn || openHAProxyMaxConn(10000) != 10064 {
		t.Error("HAProxy maxconn")
	}
}

func TestRaiseNoFile(t *testing.T) {
	limit, err := raiseNoFile(16)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := raiseNoFile(limit + 1); err == nil || !strings.Contains(err.Error(), "open-file limit") {
		t.Fatalf("a need over the hard limit: %v", err)
	}
}

func TestTimedEvent(t *testing.T) {
	now := time.Now().UnixNano()
	ev := timedEvent(nil, 60, now)
	if n := len(ev); n < 150 || n > 200 {
		t.Errorf("event of %d bytes: %s", n, ev)
	}
	if !bytes.HasPrefix(ev, []byte(`data: {"id":"chatcmpl-bench","object":"chat.completion.chunk"`)) || !bytes.HasSuffix(ev, []byte("}\n\n")) {
		t.Errorf("event %q", ev)
	}
	if got, ok := parseEventTime(ev); !ok || got != now {
		t.Errorf("send time %d %v, want %d", got, ok, now)
	}
	chunk := appendChunk(nil, ev)
	if want := fmt.Sprintf("%x\r\n%s\r\n", len(ev), ev); string(chunk) != want {
		t.Errorf("chunk %q", chunk)
	}
	for _, bad := range []string{`data: {}`, `"t":`, `"t":-5`, `"t":0`, `"t":99999999999999999999`, `"t":9223372036854775808`} {
		if v, ok := parseEventTime([]byte(bad)); ok {
			t.Errorf("%q read as %d", bad, v)
		}
	}
	if v, ok := parseEventTime([]byte(`"t":9223372036854775807,`)); !ok || v != 9223372036854775807 {
		t.Errorf("max int64: %d %v", v, ok)
	}
}

// sseOf reads events out of a chunked body with sseReader.
func sseOf(t *testing.T, body string) (events []string, done bool, err error) {
	t.Helper()
	br := bufio.NewReader(strings.NewReader(body))
	var r sseReader
	for {
		data, err := r.next(br)
		if err != nil {
			return events, r.done, err
		}
		if data == nil {
			return events, r.done, nil
		}
		for {
			ev, ok := r.event()
			if !ok {
				break
			}
			if string(ev) == "data: [DONE]" {
				r.done = true
				continue
			}
			events = append(events, string(ev))
		}
	}
}

func TestSSEReader(t *testing.T) {
	// Events joined in one chunk and split across chunks, as a proxy may
	// pass them, and a chunk extension.
	body := "6\r\ndata: \r\n" + "b;x=1\r\na\n\ndata: b\n\r\n" + "3\r\n\nda\r\n" + "c\r\nta: [DONE]\n\n\r\n" + "0\r\nTrailer: x\r\n\r\n"
	events, done, err := sseOf(t, body)
	if err != nil || !done || strings.Join(events, "|") != "data: a|data: b" {
		t.Fatalf("events %q, done %v, %v", events, done, err)
	}
	for _, bad := range []string{
		"zz\r\n",
		"5\r\nabc",               // short chunk
		"3\r\nabcXY",             // no CRLF after the data
		"123456789\r\n",          // 9 hex digits
		"10001\r\n",              // over maxPendingEvent
		"2\r\nab\r\n",            // the body ends without its last chunk
		"\r\n",                   // empty size
		"ffff\r\n" + "data: ...", // short
	} {
		if _, _, err := sseOf(t, bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	// An event that never ends is bounded.
	var b strings.Builder
	for i := 0; i < 20; i++ {
		fmt.Fprintf(&b, "1000\r\n%s\r\n", strings.Repeat("x", 0x1000))
	}
	if _, _, err := sseOf(t, b.String()); err == nil || !strings.Contains(err.Error(), "over") {
		t.Errorf("an endless event: %v", err)
	}
}

func TestParseGauge(t *testing.T) {
	text := []byte("# HELP go_goroutines x\n# TYPE go_goroutines gauge\ngo_goroutines 25\n" +
		"go_memstats_heap_inuse_bytes_total 1\ngo_memstats_heap_inuse_bytes{a=\"b\"} 2\ngo_memstats_heap_inuse_bytes 3.293184e+06\n")
	if v, err := parseGauge(text, "go_memstats_heap_inuse_bytes"); err != nil || v != 3293184 {
		t.Errorf("heap %d %v", v, err)
	}
	if v, err := parseGauge(text, "go_goroutines"); err != nil || v != 25 {
		t.Errorf("goroutines %d %v", v, err)
	}
	for _, bad := range []string{"", "g NaN\n", "g -1\n", "g 1.5\n", "g +Inf\n", "g 1e300\n", "g\n", "g 1 2 3\n"} {
		if v, err := parseGauge([]byte(bad), "g"); err == nil {
			t.Errorf("%q read as %d", bad, v)
		}
	}
}

func TestReadHeadOpenStream(t *testing.T) {
	read := func(s string) (reqHead, error) {
		return readHead(bufio.NewReader(strings.NewReader(s)))
	}
	h, err := read("POST /v1/chat/completions HTTP/1.1\r\nx-bench-gap: 300ms\r\nX-Bench-Chunks: 61\r\nContent-Length: 2\r\n\r\n")
	if err != nil || !h.timed() || h.gap != 300*time.Millisecond || h.chunks != 61 || h.clen != 2 {
		t.Fatalf("%+v %v", h, err)
	}
	spec := h.spec(stubConfig{Prefill: time.Millisecond, Gap: time.Second, Chunks: 5})
	if spec.Gap != 300*time.Millisecond || spec.Chunks != 61 || spec.Prefill != time.Millisecond {
		t.Errorf("spec %+v", spec)
	}
	if h, err := read("POST / HTTP/1.1\r\nX-Bench-Gap: 0s\r\n\r\n"); err != nil || !h.timed() || h.spec(stubConfig{Gap: time.Second, Chunks: 5}).Chunks != 5 {
		t.Errorf("gap alone: %+v %v", h, err)
	}
	if h, err := read("POST / HTTP/1.1\r\n\r\n"); err != nil || h.timed() {
		t.Errorf("no header: %+v %v", h, err)
	}
	for _, bad := range []string{"X-Bench-Gap: -1ms", "X-Bench-Gap: 11s", "X-Bench-Gap: soon", "X-Bench-Chunks: 0", "X-Bench-Chunks: 10001", "X-Bench-Chunks: 1e3"} {
		if _, err := read("POST / HTTP/1.1\r\n" + bad + "\r\n\r\n"); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// startStub serves one in-process stub backend until the test ends.
func startStub(t *testing.T, cfg stubConfig) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- serveStub(ctx, ln, cfg) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	return ln.Addr().String()
}

func streamBodiesForTest(t *testing.T) [][]byte {
	t.Helper()
	b, err := workload{BodySize: 1024, Prefixes: 2, Suffixes: 1, Stream: true}.bodies()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// The client against stubs directly: every stream gets every event, with
// its one-way latency recorded; the counters reach their totals.
func TestOpenClientDirect(t *testing.T) {
	addrs := []string{startStub(t, stubConfig{Prefill: time.Millisecond, Gap: time.Second, Chunks: 2}),
		startStub(t, stubConfig{Prefill: time.Millisecond, Gap: time.Second, Chunks: 2})}
	c, err := newOpenClient(openClientSpec{Addrs: addrs, Bodies: streamBodiesForTest(t), N: 20, Chunks: 5,
		Gap: 10 * time.Millisecond, Prefill: time.Millisecond, Ramp: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	c.start(context.Background())
	select {
	case <-c.done:
	case <-time.After(30 * time.Second):
		t.Fatal("streams did not end")
	}
	select {
	case <-c.allFirst:
	default:
		t.Error("allFirst not closed")
	}
	if c.events.Load() != 100 || c.ok.Load() != 20 || c.failed.Load() != 0 || c.firsts.Load() != 20 {
		t.Fatalf("events %d ok %d failed %d firsts %d: %v", c.events.Load(), c.ok.Load(), c.failed.Load(), c.firsts.Load(), c.errorSamples())
	}
	first, later := c.latencies()
	if first.TotalCount() != 20 || later.TotalCount() != 80 || first.ValueAtQuantile(50) < 1 || later.Max() > int64(5*time.Second/time.Microsecond) {
		t.Errorf("latencies: first %d values, later %d, first p50 %dus, later max %dus",
			first.TotalCount(), later.TotalCount(), first.ValueAtQuantile(50), later.Max())
	}
}

// A backend that ends streams early, refuses them or answers garbage
// makes errors, not a crash, and the client still ends.
func TestOpenClientErrors(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	answers := []string{
		string(sseHead) + string(appendChunk(nil, timedEvent(nil, 0, time.Now().UnixNano()))), // then closes: short
		"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n",
		"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello",
		string(sseHead) + string(appendChunk(nil, []byte("data: {}\n\n"))), // no send time
		string(sseHead) + "0\r\n\r\n",                                      // no event at all
	}
	go func() {
		for i := 0; ; i++ {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				h, err := readHead(br)
				if err != nil {
					return
				}
				io.CopyN(io.Discard, br, int64(h.clen))
				io.WriteString(c, answers[i%len(answers)])
			}()
		}
	}()
	c, err := newOpenClient(openClientSpec{Addrs: []string{ln.Addr().String()}, Bodies: streamBodiesForTest(t), N: 10, Chunks: 3,
		Gap: time.Millisecond, Prefill: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	c.start(context.Background())
	select {
	case <-c.done:
	case <-time.After(30 * time.Second):
		t.Fatal("streams did not end")
	}
	if c.failed.Load() != 10 || c.ok.Load() != 0 || len(c.errorSamples()) != maxErrorSamples {
		t.Fatalf("failed %d ok %d samples %q", c.failed.Load(), c.ok.Load(), c.errorSamples())
	}
	select {
	case <-c.allFirst:
		t.Error("allFirst closed though streams failed")
	default:
	}
	// A stopped harness ends open streams at once.
	ctx, cancel := context.WithCancel(context.Background())
	slow := startStub(t, stubConfig{Prefill: time.Millisecond, Gap: time.Second, Chunks: 2})
	c, _ = newOpenClient(openClientSpec{Addrs: []string{slow}, Bodies: streamBodiesForTest(t), N: 5, Chunks: 100, Gap: time.Second})
	c.start(ctx)
	<-c.allFirst
	cancel()
	select {
	case <-c.done:
	case <-time.After(5 * time.Second):
		t.Fatal("streams outlived their context")
	}
	if c.failed.Load() != 5 {
		t.Errorf("%d failed", c.failed.Load())
	}
	if _, err := newOpenClient(openClientSpec{N: 1}); err == nil {
		t.Error("a client without addresses")
	}
}

// openPhaseTools skips the test in -short or without taskset, and returns
// a temporary directory, the warmroute binary and taskset's path.
func openPhaseTools(t *testing.T) (dir, wr, taskset string) {
	t.Helper()
	if testing.Short() {
		t.Skip("builds and runs warmroute")
	}
	taskset, err := exec.LookPath("taskset")
	if err != nil {
		t.Skip("no taskset")
	}
	dir = t.TempDir()
	if wr, err = proc.Binary(dir); err != nil {
		t.Fatal(err)
	}
	return dir, wr, taskset
}

// TestOpenPhase runs the phase end to end at a tiny size: 20 streams of 30
// events 10 ms apart against the stubs directly, warmroute (the real
// binary) and HAProxy when installed, each proxy a fresh pinned process,
// and summarises it.
func TestOpenPhase(t *testing.T) {
	dir, wr, taskset := openPhaseTools(t)
	o := options{Warmroute: wr, Taskset: taskset, SUTCPUs: "0", GenCPUs: "0", PrefixBytes: 2048, BalanceFactor: 125,
		StreamPrefill: time.Millisecond, OpenStreams: []int{20}, OpenChunks: 30, OpenGap: 10 * time.Millisecond,
		OpenRamp: 20 * time.Millisecond, OpenReps: 1, OpenSettle: time.Second, Timeout: time.Minute}
	targets := []string{"direct", "warmroute"}
	if hp, err := exec.LookPath("haproxy"); err == nil {
		o.HAProxy = hp
		targets = []string{"direct", "haproxy", "warmroute"}
	}
	cfg := stubConfig{Prefill: time.Millisecond, Gap: time.Second, Chunks: 2}
	stubs := []string{startStub(t, cfg), startStub(t, cfg)}
	ready, _ := workload{BodySize: 1024, Prefixes: 1, Suffixes: 1}.bodies()
	var cs children
	defer cs.stopAll(3 * time.Second)
	var urls []string
	for _, a := range stubs {
		urls = append(urls, "http://"+a)
	}
	var out bytes.Buffer
	env := openEnv{cs: &cs, dir: dir, stubs: stubs, bodies: streamBodiesForTest(t), readyBody: ready[0],
		serve:     proc.ServeArgs{Backends: urls, Strategy: "PREFIX_AWARE", PrefixLength: 2048, LoadFactor: 1.25, LogLevel: "warn"},
		minWindow: 0, out: &out}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var runs []openRun
	for _, tgt := range targets {
		r, err := runOpen(ctx, env, o, tgt, 20)
		if err != nil {
			t.Fatalf("%s: %v", tgt, err)
		}
		t.Log(r.line())
		if r.Invalid != "" || r.Errors != 0 || r.Events != 600 {
			t.Fatalf("%s: invalid %q, %d errors, %d events: %v", tgt, r.Invalid, r.Errors, r.Events, r.ErrorSamples)
		}
		if r.FirstP50 <= 0 || r.LaterP99 < r.LaterP50 || r.Window <= 0 || r.AllFirst <= 0 {
			t.Errorf("%s: %+v", tgt, r)
		}
		if r.isProxy() {
			if r.LifeCPU <= 0 || r.LifeCPUPerEventUs <= 0 {
				t.Errorf("%s whole-life CPU %v, %.2f us/event", tgt, r.LifeCPU, r.LifeCPUPerEventUs)
			}
			if r.IdleRSS < 1<<20 || r.PeakRSS == 0 || r.SettleRSS == 0 || len(r.SettleSeriesKB) != 2 {
				t.Errorf("%s memory: idle %d peak %d settle %d series %v", tgt, r.IdleRSS, r.PeakRSS, r.SettleRSS, r.SettleSeriesKB)
			}
		}
		if tgt == "warmroute" && (r.IdleHeap == 0 || r.PeakHeap == 0 || r.SettleHeap == 0 || r.PeakGoroutines == 0 || r.PeakStack == 0 || r.AllocsPerEvent <= 0) {
			t.Errorf("warmroute heap: %+v", r)
		}
		runs = append(runs, r)
	}
	// Each proxy was stopped after its run.
	for _, p := range cs.list[:] {
		if !p.Exited() {
			t.Errorf("%s still running after its run", p.Name())
		}
	}
	res := &results{Options: o, Open: runs}
	res.summarise()
	if len(res.OpenRows) != len(targets) {
		t.Fatalf("rows %+v", res.OpenRows)
	}
	md := res.markdown()
	if !strings.Contains(md, "**20 open streams**") || !strings.Contains(md, "| warmroute | ") {
		t.Errorf("markdown:\n%s", md)
	}
}

// TestOpenPhaseGpusim: -open-engine gpusim streams from warmroute's
// gpusim processes (vLLM's chunks, then the finish reason and the usage),
// counted, not timed, directly and through warmroute.
func TestOpenPhaseGpusim(t *testing.T) {
	dir, wr, taskset := openPhaseTools(t)
	o := options{Warmroute: wr, Taskset: taskset, SUTCPUs: "0", GenCPUs: "0", Backends: 2, BodySize: 1024, Prefixes: 4,
		PrefixBytes: 1024, BalanceFactor: 125, StreamPrefill: time.Millisecond, OpenEngine: engineGpusim, OpenStreams: []int{20},
		OpenChunks: 30, OpenGap: 10 * time.Millisecond, OpenRamp: 20 * time.Millisecond, OpenReps: 1, OpenSettle: time.Second,
		Timeout: time.Minute}
	var cs children
	defer cs.stopAll(3 * time.Second)
	var out bytes.Buffer
	env := openEnv{cs: &cs, dir: dir, minWindow: 0, out: &out,
		serve: proc.ServeArgs{Strategy: "PREFIX_AWARE", PrefixLength: 1024, LoadFactor: 1.25, LogLevel: "warn"}}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := env.useGpusim(ctx, o, 20); err != nil {
		t.Fatal(err)
	}
	if len(env.stubs) != 2 || len(env.serve.Backends) != 2 || !env.untimed || len(env.bodies) != 4 {
		t.Fatalf("env after useGpusim: %+v", env)
	}
	for _, tgt := range []string{"direct", "warmroute"} {
		r, err := runOpen(ctx, env, o, tgt, 20)
		if err != nil {
			t.Fatalf("%s: %v", tgt, err)
		}
		t.Log(r.line())
		// Each stream brings its 30 tokens and the engine's own events.
		if r.Invalid != "" || r.Errors != 0 || r.Events < 600 || !r.Untimed {
			t.Fatalf("%s: invalid %q, %d errors, %d events, untimed %v: %v", tgt, r.Invalid, r.Errors, r.Events, r.Untimed, r.ErrorSamples)
		}
		if r.FirstP50 != 0 || r.LaterP99 != 0 {
			t.Errorf("%s: untimed events have latencies: %+v", tgt, r)
		}
		if tgt == "warmroute" && (r.LifeCPU <= 0 || r.CPUPerEventUs <= 0) {
			t.Errorf("warmroute CPU: whole life %v, window %.2f us/event", r.LifeCPU, r.CPUPerEventUs)
		}
	}
}

// The summary takes medians over valid repetitions only, and ratios per
// repetition in which both proxies' runs are valid.
func TestSummariseOpen(t *testing.T) {
	mk := func(rep int, tgt string, cpu float64, peakKB int64, p99 time.Duration, invalid string) openRun {
		return openRun{Rep: rep, Target: tgt, N: 100, CPUPerEventUs: cpu, IdleRSS: 10 << 20, PeakRSS: 10<<20 + peakKB*100<<10,
			SettleRSS: 15 << 20, LaterP50: p99 / 2, LaterP99: p99, FirstP50: time.Millisecond, FirstP99: 2 * time.Millisecond,
			IdleHeap: 1 << 20, PeakHeap: 1<<20 + 100*8<<10, SettleReached: rep == 0, SettleNear: 3 * time.Second, Invalid: invalid}
	}
	r := &results{Options: options{OpenReps: 3, OpenChunks: 61, OpenGap: 300 * time.Millisecond}}
	r.Open = []openRun{
		{Rep: 0, Target: "direct", N: 100, LaterP99: time.Millisecond},
		mk(0, "haproxy", 4, 20, 2*time.Millisecond, ""),
		mk(0, "warmroute", 6, 40, 3*time.Millisecond, ""),
		mk(1, "haproxy", 5, 20, 2*time.Millisecond, ""),
		mk(1, "warmroute", 5, 30, 2*time.Millisecond, ""),
		mk(2, "haproxy", 5, 20, 2*time.Millisecond, ""),
		mk(2, "warmroute", 50, 900, 90*time.Millisecond, "3 of 100 streams failed or ended early"),
	}
	r.Open[6].Errors = 3
	r.Open[1].GenBusy = 0.95
	r.summarise()
	rows := map[string]openRow{}
	for _, x := range r.OpenRows {
		rows[x.Target] = x
	}
	w := rows["warmroute"]
	if w.Runs != 3 || w.Valid != 2 || w.Errors != 3 || w.CPUPerChunkUs.Median != 5.5 || w.RSSPerStreamKB.Median != 35 ||
		w.HeapPerStreamKB.Median != 8 || w.SettleRatio.Median != 1.5 || w.SettleMB.Median != 5 || strings.Join(w.SettleNear, ",") != "3s,never" {
		t.Errorf("warmroute row %+v", w)
	}
	if d := rows["direct"]; d.Valid != 1 || d.cells()[1] != "-" {
		t.Errorf("direct row %+v %q", d, d.cells())
	}
	got := map[string]spread{}
	for _, q := range r.OpenRatios {
		if q.Reps != 2 {
			t.Errorf("%s over %d repetitions", q.Name, q.Reps)
		}
		got[q.Name] = q.Spread
	}
	if got["CPU per chunk"].Median != 1.25 || got["RSS per open stream"].Median != 1.75 || got["inter-event p99 latency"].Median != 1.25 {
		t.Errorf("ratios %+v", got)
	}
	text := r.text()
	for _, want := range []string{"n=100 open streams", "invalid: rep 2 warmroute n=100", "3 (1 of 3 runs invalid)", "CPU per chunk:", "busy in the window of rep 0 haproxy n=100 (95%)"} {
		if !strings.Contains(text, want) {
			t.Errorf("text lacks %q:\n%s", want, text)
		}
	}
	if strings.Contains(text, "Summary: median") {
		t.Error("text has a wrk table without wrk runs")
	}
}
