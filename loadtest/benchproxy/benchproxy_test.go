package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// stubEnv makes the test binary run as "benchproxy stub" (see TestStubProcess).
const stubEnv = "BENCHPROXY_TEST_STUB"

func TestMain(m *testing.M) {
	if os.Getenv(stubEnv) != "" {
		if err := stubMain(os.Args[1:]); err != nil {
			fmt.Fprintln(os.Stderr, "benchproxy stub:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func TestParseWrk(t *testing.T) {
	out := []byte("Running 5s test @ http://127.0.0.1:1/v1/chat/completions\n  1 threads and 64 connections\n" +
		"BENCH requests=1000 duration_us=2000000 p50_us=150 p90_us=300 p99_us=900 max_us=5000 mean_us=180.5 status_errors=0 socket_errors=2\n" +
		"Requests/sec: 500.00\n")
	r, err := parseWrk(out)
	if err != nil {
		t.Fatal(err)
	}
	if r.Requests != 1000 || r.P50 != 150*time.Microsecond || r.P99 != 900*time.Microsecond || r.SocketErrors != 2 || r.RPS() != 500 {
		t.Errorf("parsed %+v (rps %v)", r, r.RPS())
	}
	if _, err := parseWrk([]byte("no line")); err == nil {
		t.Error("output without a BENCH line accepted")
	}
	if _, err := parseWrk([]byte("BENCH requests=0 duration_us=1")); err == nil {
		t.Error("a run with no request accepted")
	}
}

func TestParseStatCPU(t *testing.T) {
	// The command name holds spaces and a parenthesis.
	line := []byte("1234 (my (odd) proc) S 1 1234 1234 0 -1 4194560 100 0 0 0 250 75 0 0 20 0 4 0 100 0 0\n")
	d, err := parseStatCPU(line)
	if err != nil {
		t.Fatal(err)
	}
	if d != 325*clockTick {
		t.Errorf("cpu %v, want %v", d, 325*clockTick)
	}
	own, err := cpuTime(os.Getpid())
	if err != nil || own < 0 {
		t.Errorf("own cpu time %v, %v", own, err)
	}
}

func TestWorkload(t *testing.T) {
	w := workload{BodySize: 4096, Prefixes: 64, Suffixes: 4}
	bodies, err := w.bodies()
	if err != nil {
		t.Fatal(err)
	}
	if len(bodies) != 256 {
		t.Fatalf("%d bodies", len(bodies))
	}
	prefixes := map[string]bool{}
	for i, b := range bodies {
		if len(b) != 4096 {
			t.Fatalf("body %d is %d bytes", i, len(b))
		}
		prefixes[string(b[:2048])] = true
		if bytes.Contains(b, []byte(`"stream":true`)) {
			t.Fatal("non-streamed workload asks for a stream")
		}
	}
	if len(prefixes) != 64 {
		t.Errorf("%d distinct 2 KiB prefixes, want 64", len(prefixes))
	}
	// Bodies with the same prefix index share their first 2 KiB.
	if !bytes.Equal(bodies[0][:2048], bodies[64][:2048]) || bytes.Equal(bodies[0], bodies[64]) {
		t.Error("suffixes do not vary behind a shared prefix")
	}
	s, err := workload{BodySize: 4096, Prefixes: 2, Suffixes: 1, Stream: true}.bodies()
	if err != nil || !bytes.Contains(s[0], []byte(`"stream":true`)) {
		t.Errorf("streamed workload: %v", err)
	}
	if !strings.Contains(wrkScript(bodies[:2], "/v1/chat/completions"), "BENCH requests=") {
		t.Error("wrk script prints no BENCH line")
	}
}

func TestHAProxyConfigIsValid(t *testing.T) {
	cfg := haproxyConfig("127.0.0.1:18999", []string{"127.0.0.1:1", "127.0.0.1:2"}, 2048, 125, 10064)
	for _, want := range []string{"maxconn 10064", "balance hash req.body,bytes(0,2048)", "hash-type consistent", "hash-balance-factor 125", "option http-buffer-request", "server e1 127.0.0.1:2"} {
		if !strings.Contains(cfg, want) {
			t.Errorf("config lacks %q", want)
		}
	}
	path, err := exec.LookPath("haproxy")
	if err != nil {
		t.Skip("haproxy not installed")
	}
	f := filepath.Join(t.TempDir(), "h.cfg")
	if err := os.WriteFile(f, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(path, "-c", "-f", f).CombinedOutput(); err != nil {
		t.Fatalf("haproxy -c: %v\n%s", err, out)
	}
}

// The haproxy-config subcommand prints the harness's own configuration
// and refuses to run without an address and backends.
func TestHAProxyConfigCommand(t *testing.T) {
	var b bytes.Buffer
	if err := haproxyConfigMain([]string{"-listen", "127.0.0.1:18999", "-backends", "127.0.0.1:1,127.0.0.1:2"}, &b); err != nil {
		t.Fatal(err)
	}
	if want := haproxyConfig("127.0.0.1:18999", []string{"127.0.0.1:1", "127.0.0.1:2"}, 2048, 125, haproxyMaxConn); b.String() != want {
		t.Fatalf("got\n%s\nwant\n%s", b.String(), want)
	}
	if err := haproxyConfigMain([]string{"-listen", "127.0.0.1:1"}, &b); err == nil {
		t.Fatal("no backends accepted")
	}
}

func TestStub(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- serveStub(ctx, ln, stubConfig{Prefill: time.Millisecond, Gap: 0, Chunks: 5}) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	url := "http://" + ln.Addr().String()
	bodies, _ := workload{BodySize: 1024, Prefixes: 1, Suffixes: 1}.bodies()
	if err := waitReady(ctx, nil, url, bodies[0], 5*time.Second); err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get(url + "/health")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("health: %v %v", resp, err)
	}
	resp.Body.Close()
	sb, _ := workload{BodySize: 1024, Prefixes: 1, Suffixes: 1, Stream: true}.bodies()
	c := newStreamClient(ln.Addr().String())
	defer c.close()
	for i := 0; i < 4; i++ { // one keep-alive connection, both engine styles
		st, err := c.do(sb[0], i%2 == 1, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if st.Events != 6 || st.First < time.Millisecond || st.Total < st.First {
			t.Errorf("stream %+v", st)
		}
	}
}

func TestSpreadAndRatios(t *testing.T) {
	s := spreadOf([]float64{3, 1, 2, 10})
	if s.Median != 2.5 || s.Min != 1 || s.Max != 10 {
		t.Errorf("spread %+v", s)
	}
	r := &results{Options: options{Reps: 2, Conns: []int{1, 64}}}
	for rep := 0; rep < 2; rep++ {
		r.Runs = append(r.Runs,
			run{Rep: rep, Target: "direct", Conns: 1, P50: 10 * time.Microsecond, RPS: 1000},
			run{Rep: rep, Target: "haproxy", Conns: 1, P50: 30 * time.Microsecond, CPUPerReq: 20 * time.Microsecond, RPS: 500},
			run{Rep: rep, Target: "warmroute", Conns: 1, P50: 25 * time.Microsecond, CPUPerReq: 15 * time.Microsecond, RPS: 600},
			run{Rep: rep, Target: "direct", Conns: 64, RPS: 9000},
			run{Rep: rep, Target: "haproxy", Conns: 64, CPUPerReq: 20 * time.Microsecond, RPS: 4000},
			run{Rep: rep, Target: "warmroute", Conns: 64, CPUPerReq: 18 * time.Microsecond, RPS: 4000})
	}
	r.summarise()
	got := map[string]ratio{}
	for _, q := range r.Ratios {
		got[q.Name] = q
	}
	if q := got["CPU per request, c=1"]; q.Spread.Median != 0.75 || !q.Met {
		t.Errorf("cpu ratio %+v", q)
	}
	if q := got["throughput, c=64"]; q.Spread.Median != 1 || q.Met {
		t.Errorf("throughput ratio %+v", q)
	}
	if q := got["added p50 latency, c=1"]; q.Spread.Median != 0.75 || !q.Met {
		t.Errorf("latency ratio %+v", q)
	}
	if !strings.Contains(r.markdown(), "| warmroute | 64 |") {
		t.Error("markdown lacks the warmroute row")
	}
}

// TestStubProcess runs the stub backends as the harness does (a child
// pinned with taskset), reads their addresses from their output, waits for
// them to answer, and stops them.
func TestStubProcess(t *testing.T) {
	taskset, err := exec.LookPath("taskset")
	if err != nil {
		t.Skip("no taskset")
	}
	t.Setenv(stubEnv, "1")
	var cs children
	defer cs.stopAll(3 * time.Second)
	stubs, err := cs.start("stubs", taskset, "0", 0, os.Args[0], "-n", "2", "-prefill", "1ms", "-gap", "0s", "-chunks", "2")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	addrs, err := listenAddrs(ctx, stubs, 2, 10*time.Second)
	if err != nil || len(addrs) != 2 || addrs[0] == addrs[1] {
		t.Fatalf("addresses %v: %v", addrs, err)
	}
	bodies, _ := workload{BodySize: 1024, Prefixes: 1, Suffixes: 1}.bodies()
	for _, a := range addrs {
		if err := waitReady(ctx, stubs, "http://"+a, bodies[0], 5*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := cpuTime(stubs.Pid()); err != nil {
		t.Fatalf("the stubs' CPU time: %v", err)
	}
	cs.stopAll(3 * time.Second)
	if stubs.Status() != "exit 0" {
		t.Fatalf("stubs after stopAll: %s\n%s", stubs.Status(), stubs.Logs())
	}
	if err := waitReady(ctx, nil, "http://"+addrs[0], bodies[0], 100*time.Millisecond); err == nil {
		t.Fatal("a stopped stub answered")
	}
}
