package soak

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/warmroute/warmroute/loadtest/proc"
)

// binary is the warmroute executable built for the package's tests.
var binary string

func TestMain(m *testing.M) {
	code := func() int {
		if os.Getenv("WARMROUTE_SKIP_E2E") != "" {
			return m.Run()
		}
		dir, err := os.MkdirTemp("", "warmroute-soak")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		if binary, err = proc.Binary(dir); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		return m.Run()
	}()
	os.Exit(code)
}

// TestSoak runs the soak: a short one by default (12 s of load, about 35 s
// in all: the router's idle fasthttp workers retire 10-20 s after the
// load), the full one with WARMROUTE_SOAK_DURATION (make soak: 10m).
func TestSoak(t *testing.T) {
	if binary == "" {
		t.Skip("WARMROUTE_SKIP_E2E is set")
	}
	if testing.Short() {
		t.Skip("integration tier (make integ): 35 s of load and recovery")
	}
	cfg := DefaultConfig()
	cfg.Binary = binary
	cfg.Duration = 12 * time.Second
	cfg.RestartEvery = 4 * time.Second
	cfg.DownFor = time.Second
	cfg.SampleEvery = time.Second
	cfg.Workers = 8
	if v := os.Getenv("WARMROUTE_SOAK_DURATION"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("WARMROUTE_SOAK_DURATION=%q: %v", v, err)
		}
		cfg = DefaultConfig()
		cfg.Binary, cfg.Duration = binary, d
	}
	var logw strings.Builder
	if testing.Verbose() {
		cfg.Log = os.Stderr
	} else {
		cfg.Log = &logw
	}
	ctx, cancel := context.WithTimeout(context.Background(), cfg.Duration+5*time.Minute)
	defer cancel()
	rep, err := Run(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("soak of %v, %d backends restarted %d times, %d workers:\n%s\n%s", cfg.Duration, cfg.Backends, rep.Restarts, cfg.Workers,
		rep.Curve(40), rep.Summary())
	if rep.Failed() {
		t.Fatalf("soak failed:\n%s\n%s", rep.Summary(), rep.RouterExit)
	}
}

func TestParseMetrics(t *testing.T) {
	text := "# HELP go_goroutines x\n# TYPE go_goroutines gauge\ngo_goroutines 27\nwarmroute_x{a=\"b\"} 3\nprocess_resident_memory_bytes 2.5e+07\n"
	v, err := parseMetrics(strings.NewReader(text), "go_goroutines", "process_resident_memory_bytes")
	if err != nil || v[0] != 27 || v[1] != 2.5e7 {
		t.Fatalf("%v %v", v, err)
	}
	if _, err := parseMetrics(strings.NewReader(text), "go_memstats_heap_inuse_bytes"); err == nil {
		t.Fatal("a missing metric was not reported")
	}
}

func TestChecks(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Duration = 60 * time.Second
	rep := &Report{Config: cfg, Baseline: Sample{Goroutines: 20}, Settled: Sample{Goroutines: 24}, Restarts: 2,
		Counts: Counts{OK: 100, Err5xxInWindow: 3}}
	for s := 0; s < 60; s += 5 {
		rep.Samples = append(rep.Samples, Sample{At: time.Duration(s) * time.Second, Phase: "load", HeapInuse: 10 << 20})
	}
	rep.check()
	if rep.Failed() {
		t.Fatalf("a clean run failed:\n%s", rep.Summary())
	}
	for name, spoil := range map[string]func(r *Report){
		"goroutines back to baseline":    func(r *Report) { r.Settled.Goroutines = 40 },
		"no 5xx outside restarts":        func(r *Report) { r.Counts.Err5xxOutside = 1 },
		"no cut stream outside restarts": func(r *Report) { r.Counts.CutOutside = 1 },
		"requests served":                func(r *Report) { r.Counts.Unexpected = 1 },
		"router alive":                   func(r *Report) { r.RouterExit = "signal: killed" },
		"heap flat under load": func(r *Report) {
			for i := range r.Samples {
				if r.Samples[i].At >= 50*time.Second {
					r.Samples[i].HeapInuse = 40 << 20
				}
			}
		},
	} {
		bad := *rep
		bad.Samples = append([]Sample(nil), rep.Samples...)
		bad.Checks = nil
		spoil(&bad)
		bad.check()
		failed := false
		for _, c := range bad.Checks {
			if !c.OK {
				failed = true
				if c.Name != name {
					t.Errorf("spoiling %q failed %q", name, c.Name)
				}
			}
		}
		if !failed {
			t.Errorf("spoiling %q passed", name)
		}
	}
}

func TestValidate(t *testing.T) {
	cfg := DefaultConfig()
	if err := cfg.Validate(); err == nil {
		t.Fatal("no binary accepted")
	}
	cfg.Binary = "warmroute"
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	cfg.Backends = 1
	if err := cfg.Validate(); err == nil {
		t.Fatal("one backend accepted with restarts")
	}
}
