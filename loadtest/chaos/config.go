package chaos

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/warmroute/warmroute/loadtest/workload"
)

// Errors. Functions wrap them with details.
var (
	ErrBadConfig    = errors.New("chaos: invalid config")
	ErrUnknownFault = errors.New("chaos: unknown fault")
	ErrUnsupported  = errors.New("chaos: not supported by this target")
	ErrNotReady     = errors.New("chaos: cluster not ready")
	ErrTarget       = errors.New("chaos: target operation failed")
	ErrInterrupted  = errors.New("chaos: interrupted")
)

// Fault names a fault scenario.
type Fault string

// The faults, in their default order.
const (
	RouterKill      Fault = "router-kill"      // SIGKILL a follower router, restart it
	RouterPause     Fault = "router-pause"     // SIGSTOP a follower router, SIGCONT it
	RouterPartition Fault = "router-partition" // cut a follower off from the other routers, heal
	LeaderKill      Fault = "leader-kill"      // SIGKILL the Raft leader, restart it
	BackendKill     Fault = "backend-kill"     // SIGKILL a backend, restart it
	BackendRemove   Fault = "backend-remove"   // DELETE a backend through the admin API
	BackendAdd      Fault = "backend-add"      // add it back
	RestartAll      Fault = "restart-all"      // stop every router and backend, start them again
)

// AllFaults lists every fault in the default order.
func AllFaults() []Fault {
	return []Fault{RouterKill, RouterPause, RouterPartition, LeaderKill, BackendKill, BackendRemove, BackendAdd, RestartAll}
}

// ParseFaults reads a comma-separated fault list; "all" (or "") is every
// fault. Faults run in the default order whatever order they are given in,
// each once.
func ParseFaults(s string) ([]Fault, error) {
	s = strings.TrimSpace(s)
	if s == "" || s == "all" {
		return AllFaults(), nil
	}
	want := map[Fault]bool{}
	for _, p := range strings.Split(s, ",") {
		p = strings.TrimSpace(p)
		if p == "" {
			continue
		}
		if p == "all" {
			return AllFaults(), nil
		}
		f := Fault(p)
		if !f.valid() {
			return nil, fmt.Errorf("%w %q (want all or some of %s)", ErrUnknownFault, p, faultList())
		}
		want[f] = true
	}
	if len(want) == 0 {
		return nil, fmt.Errorf("%w: empty list", ErrUnknownFault)
	}
	var out []Fault
	for _, f := range AllFaults() {
		if want[f] {
			out = append(out, f)
		}
	}
	return out, nil
}

func (f Fault) valid() bool {
	for _, g := range AllFaults() {
		if f == g {
			return true
		}
	}
	return false
}

func faultList() string {
	var names []string
	for _, f := range AllFaults() {
		names = append(names, string(f))
	}
	return strings.Join(names, ", ")
}

// Config describes one chaos run against one target.
type Config struct {
	// Faults to run, in order.
	Faults []Fault

	// Load: open-loop Poisson arrivals at Rate per second, at most
	// MaxInFlight at once, each bounded by RequestTimeout.
	Rate           float64
	MaxInFlight    int
	RequestTimeout time.Duration
	Seed           uint64
	// Workload shapes the requests (its Model is filled from the first
	// router's /v1/models when empty).
	Workload workload.Config

	// Warmup runs the load before the first fault, so caches are warm and
	// the hit rate is steady.
	Warmup time.Duration
	// Pre is the steady window measured before each fault (the hit-rate
	// baseline). Hold is how long a fault lasts before it is healed.
	Pre, Hold time.Duration
	// After the last change of a fault settles, observation goes on at
	// least MinObserve, until agreement has been 100% for StableFor and the
	// hit rate is back, and at most MaxObserve.
	MinObserve, MaxObserve, StableFor time.Duration

	// Probe: ProbePrompts fixed prompts; every ProbeInterval a batch of
	// ProbeBatch of them goes to every router's explainer, each call
	// bounded by ProbeTimeout.
	ProbePrompts  int
	ProbeBatch    int
	ProbeInterval time.Duration
	ProbeTimeout  time.Duration

	// KV hit rate: counters scraped every KVInterval; the rate is taken
	// over sliding windows of KVWindow. Recovered means back within
	// KVTolerance (absolute) of the pre-fault rate.
	KVInterval  time.Duration
	KVWindow    time.Duration
	KVTolerance float64

	// ReadyTimeout bounds each wait for a router or the cluster to come
	// (back) up.
	ReadyTimeout time.Duration

	// Log receives progress lines (nil: silent).
	Log io.Writer
}

// DefaultConfig is the full run: every fault, 16 requests/s of a RAG
// workload with 64 documents, 5 s faults.
func DefaultConfig() Config {
	wc := workload.DefaultConfig()
	wc.Kind = workload.KindRAG
	wc.RAG.Documents = 64
	wc.RAG.DocumentTokens = 1500
	wc.MaxTokens = 48
	wc.Stream = true
	return Config{
		Faults:         AllFaults(),
		Rate:           16,
		MaxInFlight:    256,
		RequestTimeout: 30 * time.Second,
		Seed:           1,
		Workload:       wc,
		Warmup:         15 * time.Second,
		Pre:            5 * time.Second,
		Hold:           5 * time.Second,
		MinObserve:     5 * time.Second,
		MaxObserve:     30 * time.Second,
		StableFor:      2 * time.Second,
		ProbePrompts:   1000,
		ProbeBatch:     50,
		ProbeInterval:  200 * time.Millisecond,
		ProbeTimeout:   300 * time.Millisecond,
		KVInterval:     time.Second,
		KVWindow:       3 * time.Second,
		KVTolerance:    0.03,
		ReadyTimeout:   60 * time.Second,
	}
}

// ShortConfig is a quick check: the same faults with shorter windows.
func ShortConfig() Config {
	c := DefaultConfig()
	c.Warmup = 6 * time.Second
	c.Pre = 3 * time.Second
	c.Hold = 2 * time.Second
	c.MinObserve = 2 * time.Second
	c.MaxObserve = 12 * time.Second
	c.StableFor = time.Second
	return c
}

// Validate reports the first problem with c.
func (c Config) Validate() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: %s", ErrBadConfig, fmt.Sprintf(format, a...))
	}
	if len(c.Faults) == 0 {
		return bad("no fault selected")
	}
	for _, f := range c.Faults {
		if !f.valid() {
			return fmt.Errorf("%w %q", ErrUnknownFault, f)
		}
	}
	switch {
	case !(c.Rate > 0) || c.Rate > 1000:
		return bad("rate %g outside (0, 1000]", c.Rate)
	case c.MaxInFlight < 1 || c.MaxInFlight > 10000:
		return bad("max in flight %d outside 1-10000", c.MaxInFlight)
	case c.RequestTimeout <= 0:
		return bad("request timeout must be > 0")
	case c.Warmup < 0 || c.Pre <= 0 || c.Hold <= 0:
		return bad("warm-up must be >= 0, pre and hold > 0")
	case c.MinObserve < 0 || c.MaxObserve < c.MinObserve || c.MaxObserve <= 0 || c.StableFor <= 0:
		return bad("observe windows: want 0 <= min <= max, max > 0, stable-for > 0")
	case c.Warmup+time.Duration(len(c.Faults))*(c.Pre+2*c.Hold+c.MaxObserve) > time.Hour:
		return bad("the run could last more than an hour")
	case c.ProbePrompts < 1 || c.ProbePrompts > 100000:
		return bad("probe prompts %d outside 1-100000", c.ProbePrompts)
	case c.ProbeBatch < 1 || c.ProbeBatch > c.ProbePrompts:
		return bad("probe batch %d outside 1-%d", c.ProbeBatch, c.ProbePrompts)
	case c.ProbeInterval <= 0 || c.ProbeTimeout <= 0:
		return bad("probe interval and timeout must be > 0")
	case c.KVInterval <= 0 || c.KVWindow < c.KVInterval:
		return bad("kv interval must be > 0 and the window at least one interval")
	case c.KVTolerance < 0 || c.KVTolerance >= 1:
		return bad("kv tolerance %g outside [0, 1)", c.KVTolerance)
	case c.ReadyTimeout <= 0:
		return bad("ready timeout must be > 0")
	}
	if err := c.Workload.Validate(); err != nil {
		return err
	}
	return nil
}
