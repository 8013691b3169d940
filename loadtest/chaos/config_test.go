package chaos

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestParseFaults(t *testing.T) {
	all := AllFaults()
	for _, in := range []string{"", "all", " all ", "router-kill,all"} {
		got, err := ParseFaults(in)
		if err != nil || !slices.Equal(got, all) {
			t.Errorf("ParseFaults(%q) = %v, %v; want all", in, got, err)
		}
	}
	got, err := ParseFaults("restart-all, router-kill,router-kill,,backend-remove")
	want := []Fault{RouterKill, BackendRemove, RestartAll}
	if err != nil || !slices.Equal(got, want) {
		t.Errorf("subset = %v, %v; want %v (default order, once each)", got, err, want)
	}
	for _, in := range []string{"router-kil", "router-kill,nope", ",", "ROUTER-KILL"} {
		if _, err := ParseFaults(in); !errors.Is(err, ErrUnknownFault) {
			t.Errorf("ParseFaults(%q) error %v, want ErrUnknownFault", in, err)
		}
	}
}

func FuzzParseFaults(f *testing.F) {
	for _, s := range []string{"", "all", "router-kill,backend-add", "x,,y", "leader-kill, restart-all"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got, err := ParseFaults(s)
		if err != nil {
			if !errors.Is(err, ErrUnknownFault) {
				t.Fatalf("error %v is not ErrUnknownFault", err)
			}
			return
		}
		if len(got) == 0 {
			t.Fatal("no fault and no error")
		}
		// in default order, each once, each valid
		last := -1
		for _, f := range got {
			i := slices.Index(AllFaults(), f)
			if i <= last {
				t.Fatalf("%v out of order or repeated", got)
			}
			last = i
		}
	})
}

func TestConfigValidate(t *testing.T) {
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatalf("default: %v", err)
	}
	if err := ShortConfig().Validate(); err != nil {
		t.Fatalf("short: %v", err)
	}
	if s, d := ShortConfig(), DefaultConfig(); s.Hold >= d.Hold || s.MaxObserve >= d.MaxObserve {
		t.Error("short config is not shorter")
	}
	for name, mut := range map[string]func(*Config){
		"no faults":       func(c *Config) { c.Faults = nil },
		"unknown fault":   func(c *Config) { c.Faults = []Fault{"x"} },
		"zero rate":       func(c *Config) { c.Rate = 0 },
		"huge rate":       func(c *Config) { c.Rate = 1e6 },
		"batch > prompts": func(c *Config) { c.ProbeBatch = c.ProbePrompts + 1 },
		"min > max":       func(c *Config) { c.MinObserve = c.MaxObserve + time.Second },
		"window < step":   func(c *Config) { c.KVWindow = c.KVInterval / 2 },
		"tolerance 1":     func(c *Config) { c.KVTolerance = 1 },
		"over an hour":    func(c *Config) { c.MaxObserve = time.Hour },
		"bad workload":    func(c *Config) { c.Workload.MaxTokens = 0 },
	} {
		c := DefaultConfig()
		mut(&c)
		if err := c.Validate(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	lc := DefaultLocalConfig()
	if err := lc.Validate(); err != nil {
		t.Fatalf("default local: %v", err)
	}
	lc.Routers = 1
	if err := lc.Validate(); !errors.Is(err, ErrBadConfig) {
		t.Errorf("one router: %v", err)
	}
	pc := DefaultComposeConfig()
	if err := pc.Validate(); err != nil {
		t.Fatalf("default compose: %v", err)
	}
	pc.Project = "Bad Name"
	if err := pc.Validate(); !errors.Is(err, ErrBadConfig) {
		t.Errorf("bad project: %v", err)
	}
}

func TestErrorBackend(t *testing.T) {
	cases := map[string]string{
		`{"error":{"message":"backend gpu-3 failed: connection reset","type":"upstream_error"}}`: "gpu-3",
		`{"error":{"message":"backend 127.0.0.1:8001 did not answer in time"}}`:                  "127.0.0.1:8001",
		`{"error":{"message":"no healthy backend"}}`:                                             "",
		`{"error":{"message":"backend  failed"}}`:                                                "",
		`{"error":{"message":"backend a b failed"}}`:                                             "",
		`not json`: "",
		``:         "",
	}
	for body, want := range cases {
		if got := ErrorBackend([]byte(body)); got != want {
			t.Errorf("ErrorBackend(%s) = %q, want %q", body, got, want)
		}
	}
}

func FuzzErrorBackend(f *testing.F) {
	f.Add([]byte(`{"error":{"message":"backend gpu-3 failed: x"}}`))
	f.Add([]byte(`{"error":{"message":"backend x did not answer in time"}}`))
	f.Add([]byte(`{}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		id := ErrorBackend(b)
		if id != "" && (strings.ContainsAny(id, " \t\n") || !strings.Contains(string(b), "backend")) {
			t.Fatalf("id %q from %q", id, b)
		}
	})
}

func TestCheck(t *testing.T) {
	good := Report{Target: "local", Results: []Result{
		{Fault: RouterKill, Errors: Errors{Unavoidable: 3, Faulted: 1}, Settles: []Settle{{What: "back", Delay: time.Second, OK: true},
			{What: "detected", Delay: 5 * time.Second, Detection: true}}}, // detections are not held to the bound
		{Fault: BackendRemove, Backends: 6, Moved: &Movement{Prompts: 1000, Moved: 200}, Settles: []Settle{{OK: true}}},
		{Fault: RouterPartition, Skipped: "no iptables"},
	}}
	if bad := Check(good, Picks); len(bad) != 0 {
		t.Fatalf("good report failed: %v", bad)
	}
	cases := map[string]func(r *Report){
		"other errors on a router kill": func(r *Report) { r.Results[0].Errors.Other = 1 },
		"slow reconvergence":            func(r *Report) { r.Results[0].Settles[0].Delay = 2500 * time.Millisecond },
		"never reconverged":             func(r *Report) { r.Results[0].Settles[0].OK = false },
		"too much movement":             func(r *Report) { r.Results[1].Moved.Moved = 230 }, // 23% > 1/6 + 5% = 21.7%
		"late request":                  func(r *Report) { r.Results[1].LateByEpoch = 1 },
		"movement not measured":         func(r *Report) { r.Results[1].Moved = nil },
		"failed fault":                  func(r *Report) { r.Results[0].Failed = "boom" },
	}
	for name, mut := range cases {
		r := good
		r.Results = append([]Result(nil), good.Results...)
		r.Results[0].Settles = append([]Settle(nil), good.Results[0].Settles...)
		m := *good.Results[1].Moved
		r.Results[1].Moved = &m
		mut(&r)
		if bad := Check(r, Picks); len(bad) == 0 {
			t.Errorf("%s: passed", name)
		}
	}
}

func TestWorst(t *testing.T) {
	r := Result{Settles: []Settle{{What: "a", Delay: time.Second, OK: true, OwnerOK: true},
		{What: "b", Delay: 3 * time.Second, OK: true, OwnerOK: true}, {What: "c", Delay: 0, OK: true, OwnerOK: true}}}
	if w, ok := r.Worst(Picks); !ok || w.What != "b" {
		t.Errorf("worst %v", w)
	}
	r.Settles = append(r.Settles, Settle{What: "d", OK: false})
	if w, _ := r.Worst(Picks); w.What != "d" {
		t.Errorf("a settle never reconverged must be the worst, got %v", w)
	}
	if w, _ := r.Worst(Owners); w.What != "d" {
		t.Errorf("owners: a settle never reconverged must be the worst, got %v", w)
	}
	det := Result{Settles: []Settle{{What: "killed", Delay: 5 * time.Second, OK: true, Detection: true}, {What: "committed", Delay: time.Second, OK: true}}}
	if w, _ := det.Worst(Picks); w.What != "committed" {
		t.Errorf("a detection must not be the worst settle, got %v", w)
	}
	if _, ok := (&Result{}).Worst(Picks); ok {
		t.Error("no settles: want none")
	}
}
