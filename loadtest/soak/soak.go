package soak

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/warmroute/warmroute/internal/identity"
	"github.com/warmroute/warmroute/loadtest/proc"
)

// Config is a soak run. Start from DefaultConfig.
type Config struct {
	// Binary is the warmroute executable.
	Binary string
	// Duration is the load phase.
	Duration time.Duration
	// Backends is how many gpusim instances the router fronts.
	Backends int
	// Workers send requests in a closed loop.
	Workers int
	// RestartEvery kills one backend (round robin, SIGKILL) this often and
	// restarts it on its port DownFor later; 0 never does.
	RestartEvery, DownFor time.Duration
	// RestartGrace is how long after a restart errors are still put down
	// to it (the router's health checks take the backend back).
	RestartGrace time.Duration
	// SampleEvery is the /metrics sampling period.
	SampleEvery time.Duration
	// Settle bounds the wait, after the load, for the router's goroutines
	// to return to the baseline.
	Settle time.Duration
	// TimeScale is gpusim's --time-scale (smaller: faster answers).
	TimeScale float64
	// AbortFraction of requests are streams the client abandons after the
	// first event; BadFraction are malformed.
	AbortFraction, BadFraction float64
	// GoroutineSlack is how many goroutines above the idle baseline the
	// settled router may keep.
	GoroutineSlack int
	// HeapGrowth bounds how much the heap in use may grow from the early
	// part of the load to its end (relative; plus HeapSlack bytes).
	HeapGrowth float64
	HeapSlack  float64
	// Log receives progress lines; nil discards them.
	Log io.Writer
}

// DefaultConfig is the 10-minute soak of `make soak`.
func DefaultConfig() Config {
	return Config{
		Duration:      10 * time.Minute,
		Backends:      3,
		Workers:       16,
		RestartEvery:  20 * time.Second,
		DownFor:       2 * time.Second,
		RestartGrace:  3 * time.Second,
		SampleEvery:   5 * time.Second,
		Settle:        40 * time.Second,
		TimeScale:     0.05,
		AbortFraction: 0.10,
		BadFraction:   0.05,
		// One fasthttp connection cleaner per backend with idle upstream
		// connections, plus the client listener's lingering refusals and
		// timers that come and go: see docs/hardening.md.
		GoroutineSlack: 3 + 3,
		HeapGrowth:     0.25,
		HeapSlack:      4 << 20,
	}
}

// Validate reports the first unusable setting.
func (c *Config) Validate() error {
	switch {
	case c.Binary == "":
		return errors.New("soak: no warmroute binary")
	case c.Duration < 5*time.Second:
		return fmt.Errorf("soak: duration %s is under 5s", c.Duration)
	case c.Backends < 2:
		return fmt.Errorf("soak: %d backends; restarts need at least 2", c.Backends)
	case c.Workers < 1:
		return fmt.Errorf("soak: %d workers", c.Workers)
	case c.RestartEvery < 0 || c.RestartEvery > 0 && c.DownFor <= 0:
		return errors.New("soak: restarts need a positive DownFor")
	case c.SampleEvery <= 0 || c.Settle <= 0:
		return errors.New("soak: SampleEvery and Settle must be positive")
	case c.TimeScale <= 0:
		return errors.New("soak: TimeScale must be positive")
	case c.AbortFraction < 0 || c.BadFraction < 0 || c.AbortFraction+c.BadFraction > 1:
		return errors.New("soak: fractions must be within [0, 1] and add up to at most 1")
	}
	return nil
}

// Sample is one reading of the router's /metrics.
type Sample struct {
	At          time.Duration // since the start of the load
	Phase       string        // "idle", "load" or "settle"
	Goroutines  float64
	HeapInuse   float64 // bytes
	RSS         float64 // bytes
	ClientConns float64
	Requests    int64 // finished requests so far
}

// Counts are the load's outcomes.
type Counts struct {
	OK, Aborted, BadRefused int64
	// Cut streams and 5xx answers, inside and outside restart windows.
	CutInWindow, CutOutside int64
	Err5xxInWindow          int64
	Err5xxOutside           int64
	// Unexpected: other statuses, and transport errors (the router gone).
	Unexpected int64
	Examples   []string // a few unexpected outcomes
	// InWindow are a few of the errors put down to restarts.
	InWindow []string
}

// Check is one pass criterion and its verdict.
type Check struct {
	Name, Detail string
	OK           bool
}

// Report is what a run measured.
type Report struct {
	Config   Config
	Samples  []Sample
	Counts   Counts
	Restarts int
	// Baseline is the idle router before the load; Settled after it.
	Baseline, Settled Sample
	RouterExit        string // "" while it ran to the end and stopped cleanly
	Checks            []Check
}

// Failed reports whether a check failed.
func (r *Report) Failed() bool {
	for _, c := range r.Checks {
		if !c.OK {
			return true
		}
	}
	return false
}

// startTimeout bounds the wait for a process to answer.
const startTimeout = 20 * time.Second

// window is a span in which errors are put down to a backend restart.
type window struct{ from, to time.Time }

type runner struct {
	cfg      Config
	log      io.Writer
	client   *http.Client
	url      string
	admin    string
	adminHC  *http.Client // HTTPS, trusting the run's cluster CA
	start    time.Time
	mu       sync.Mutex
	windows  []*window
	counts   Counts
	finished atomic.Int64
}

// Run starts the router and the backends, runs the soak and stops them.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	r := &runner{cfg: cfg, log: io.Discard}
	if cfg.Log != nil {
		r.log = &lockedWriter{w: cfg.Log} // the restarter and the sampler both write
	}
	addrs, err := proc.FreeAddrs("127.0.0.1", cfg.Backends+2)
	if err != nil {
		return nil, err
	}
	backends := make([]*proc.Process, cfg.Backends)
	urls := make([]string, cfg.Backends)
	startBackend := func(i int) (*proc.Process, error) {
		args := proc.GpusimArgs{Listen: addrs[i], TimeScale: cfg.TimeScale, NamePrefix: fmt.Sprintf("soak-%d-", i)}
		p, err := proc.Start(proc.Spec{Name: fmt.Sprintf("gpusim-%d", i), Path: cfg.Binary, Args: args.Args()})
		if err != nil {
			return nil, err
		}
		return p, p.WaitReady(ctx, startTimeout, proc.HTTPCheck(urls[i]+"/health"))
	}
	defer func() {
		for _, b := range backends {
			if b != nil {
				b.Stop(5 * time.Second)
			}
		}
	}()
	for i := range backends {
		urls[i] = "http://" + addrs[i]
		if backends[i], err = startBackend(i); err != nil {
			return nil, fmt.Errorf("soak: gpusim %d: %w", i, err)
		}
	}
	listen, admin := addrs[cfg.Backends], addrs[cfg.Backends+1]
	// The router runs with cluster TLS, as deployed: its admin API serves
	// HTTPS with a certificate from a CA made for the run.
	tlsDir, err := os.MkdirTemp("", "warmroute-soak-tls-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tlsDir)
	tlsFiles, adminTLS, err := clusterTLS(tlsDir, routerName, cfg.Duration+time.Hour)
	if err != nil {
		return nil, fmt.Errorf("soak: cluster certificate: %w", err)
	}
	args := proc.ServeArgs{Listen: listen, AdminListen: admin, NodeName: routerName, Backends: urls,
		ProbeInterval: 200 * time.Millisecond, ShutdownTimeout: 5 * time.Second, ClusterTLS: tlsFiles}
	router, err := proc.Start(proc.Spec{Name: "router", Path: cfg.Binary, Args: args.Args()})
	if err != nil {
		return nil, fmt.Errorf("soak: router: %w", err)
	}
	defer router.Stop(10 * time.Second)
	r.url, r.admin = "http://"+listen, "https://"+admin
	adminTr := &http.Transport{TLSClientConfig: adminTLS}
	defer adminTr.CloseIdleConnections()
	r.adminHC = &http.Client{Transport: adminTr}
	rep := &Report{Config: cfg}
	if err := router.WaitReady(ctx, startTimeout, proc.HTTPCheck(r.url+"/readyz")); err != nil {
		return nil, fmt.Errorf("soak: router: %w", err)
	}
	tr := &http.Transport{MaxIdleConnsPerHost: cfg.Workers, IdleConnTimeout: 30 * time.Second}
	r.client = &http.Client{Transport: tr, Timeout: 60 * time.Second}
	defer tr.CloseIdleConnections()

	// Idle baseline: no client connection open.
	r.start = time.Now()
	base, err := r.sample("idle")
	if err != nil {
		return nil, err
	}
	rep.Baseline = base
	rep.Samples = append(rep.Samples, base)
	fmt.Fprintf(r.log, "soak: baseline goroutines %v heap %.1f MiB rss %.1f MiB\n", base.Goroutines, base.HeapInuse/(1<<20), base.RSS/(1<<20))

	// The load, the restarts and the sampler.
	loadCtx, stopLoad := context.WithTimeout(ctx, cfg.Duration)
	defer stopLoad()
	r.start = time.Now()
	var wg sync.WaitGroup
	for w := 0; w < cfg.Workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.worker(loadCtx, uint64(w))
		}()
	}
	var bg sync.WaitGroup
	var restartErr error
	if cfg.RestartEvery > 0 {
		bg.Add(1)
		go func() {
			defer bg.Done()
			tick := time.NewTicker(cfg.RestartEvery)
			defer tick.Stop()
			for i := 0; ; i++ {
				select {
				case <-loadCtx.Done():
					return
				case <-tick.C:
				}
				k := i % cfg.Backends
				// The window opens before the kill, so every error it
				// causes finds it, and closes RestartGrace after the
				// backend is back.
				w := &window{from: time.Now(), to: time.Now().Add(24 * time.Hour)}
				r.mu.Lock()
				r.windows = append(r.windows, w)
				r.mu.Unlock()
				backends[k].Kill()
				select {
				case <-loadCtx.Done():
				case <-time.After(cfg.DownFor):
				}
				p, err := startBackend(k)
				backends[k] = p
				r.mu.Lock()
				w.to = time.Now().Add(cfg.RestartGrace)
				r.mu.Unlock()
				rep.Restarts++
				fmt.Fprintf(r.log, "soak: %5.0fs restarted backend %d\n", time.Since(r.start).Seconds(), k)
				if err != nil {
					restartErr = err
					return
				}
			}
		}()
	}
	samples := make(chan Sample, 1024)
	bg.Add(1)
	go func() {
		defer bg.Done()
		tick := time.NewTicker(cfg.SampleEvery)
		defer tick.Stop()
		for {
			select {
			case <-loadCtx.Done():
				return
			case <-tick.C:
			}
			if s, err := r.sample("load"); err == nil {
				samples <- s
				fmt.Fprintf(r.log, "soak: %5.0fs goroutines %4.0f heap %6.1f MiB rss %6.1f MiB conns %3.0f requests %d\n",
					s.At.Seconds(), s.Goroutines, s.HeapInuse/(1<<20), s.RSS/(1<<20), s.ClientConns, s.Requests)
			}
		}
	}()
	wg.Wait()
	bg.Wait()
	close(samples)
	for s := range samples {
		rep.Samples = append(rep.Samples, s)
	}
	if restartErr != nil {
		return nil, fmt.Errorf("soak: restarting a backend: %w", restartErr)
	}

	// Settle: the clients' idle connections closed, the router should
	// come back to its baseline.
	tr.CloseIdleConnections()
	deadline := time.Now().Add(cfg.Settle)
	for {
		s, err := r.sample("settle")
		if err != nil {
			return nil, err
		}
		rep.Samples = append(rep.Samples, s)
		rep.Settled = s
		if s.ClientConns == 0 && s.Goroutines <= base.Goroutines+float64(cfg.GoroutineSlack) || time.Now().After(deadline) {
			break
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(time.Second):
		}
	}
	if router.Exited() {
		rep.RouterExit = "exited during the soak: " + router.Status()
	} else if err := router.Stop(10 * time.Second); err != nil {
		rep.RouterExit = "stopped with " + err.Error()
	}
	if rep.RouterExit != "" {
		rep.RouterExit += "\n" + router.Logs()
	}
	rep.Counts = r.counts
	rep.check()
	return rep, nil
}

// check applies the pass criteria.
func (rep *Report) check() {
	c := &rep.Config
	add := func(name string, ok bool, format string, args ...any) {
		rep.Checks = append(rep.Checks, Check{Name: name, OK: ok, Detail: fmt.Sprintf(format, args...)})
	}
	add("router alive", rep.RouterExit == "", "%s", cmpStr(rep.RouterExit, "ran throughout and stopped cleanly on SIGTERM"))
	n := rep.Counts
	total := n.OK + n.Aborted + n.BadRefused + n.CutInWindow + n.CutOutside + n.Err5xxInWindow + n.Err5xxOutside + n.Unexpected
	add("requests served", n.OK > 0 && n.Unexpected == 0, "%d requests: %d ok, %d aborted by the client, %d malformed refused, %d unexpected %v",
		total, n.OK, n.Aborted, n.BadRefused, n.Unexpected, n.Examples)
	add("no 5xx outside restarts", n.Err5xxOutside == 0, "%d 5xx during restarts, %d outside; during restarts e.g. %q", n.Err5xxInWindow, n.Err5xxOutside, n.InWindow)
	add("no cut stream outside restarts", n.CutOutside == 0, "%d streams cut during restarts, %d outside", n.CutInWindow, n.CutOutside)
	s := rep.Settled
	add("goroutines back to baseline", s.ClientConns == 0 && s.Goroutines <= rep.Baseline.Goroutines+float64(c.GoroutineSlack),
		"%v idle before, %v after the load (slack %d; %v client connections)", rep.Baseline.Goroutines, s.Goroutines, c.GoroutineSlack, s.ClientConns)
	early, late := rep.heapWindows()
	if early > 0 {
		limit := early*(1+c.HeapGrowth) + c.HeapSlack
		add("heap flat under load", late <= limit, "median heap in use %.1f MiB early in the load, %.1f MiB at its end (limit %.1f MiB)",
			early/(1<<20), late/(1<<20), limit/(1<<20))
	} else {
		add("heap flat under load", false, "too few samples under load")
	}
	if c.RestartEvery > 0 {
		add("backends restarted", rep.Restarts > 0, "%d restarts", rep.Restarts)
	}
}

// heapWindows returns the median heap in use over the load's second
// quarter (caches and pools warm) and over its last sixth.
func (rep *Report) heapWindows() (early, late float64) {
	var e, l []float64
	d := rep.Config.Duration
	for _, s := range rep.Samples {
		if s.Phase != "load" {
			continue
		}
		switch {
		case s.At >= d/4 && s.At < d/2:
			e = append(e, s.HeapInuse)
		case s.At >= d-d/6:
			l = append(l, s.HeapInuse)
		}
	}
	return median(e), median(l)
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

func cmpStr(s, dflt string) string {
	if s == "" {
		return dflt
	}
	return s
}

// Curve renders the samples as a table, at most rows rows.
func (rep *Report) Curve(rows int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%8s  %-6s  %10s  %13s  %9s  %7s  %9s\n", "t", "phase", "goroutines", "heap in use", "rss", "clients", "requests")
	step := 1
	if rows > 0 && len(rep.Samples) > rows {
		step = (len(rep.Samples) + rows - 1) / rows
	}
	for i, s := range rep.Samples {
		if i%step != 0 && i != len(rep.Samples)-1 && s.Phase == "load" {
			continue
		}
		fmt.Fprintf(&b, "%7.0fs  %-6s  %10.0f  %9.1f MiB  %5.1f MiB  %7.0f  %9d\n",
			s.At.Seconds(), s.Phase, s.Goroutines, s.HeapInuse/(1<<20), s.RSS/(1<<20), s.ClientConns, s.Requests)
	}
	return b.String()
}

// Summary renders the checks.
func (rep *Report) Summary() string {
	var b strings.Builder
	for _, c := range rep.Checks {
		v := "PASS"
		if !c.OK {
			v = "FAIL"
		}
		fmt.Fprintf(&b, "%s  %-32s %s\n", v, c.Name, c.Detail)
	}
	return b.String()
}

// sample reads the router's /metrics.
func (r *runner) sample(phase string) (Sample, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", r.admin+"/metrics", nil)
	resp, err := r.adminHC.Do(req)
	if err != nil {
		return Sample{}, fmt.Errorf("soak: /metrics: %w", err)
	}
	defer resp.Body.Close()
	v, err := parseMetrics(resp.Body, "go_goroutines", "go_memstats_heap_inuse_bytes", "process_resident_memory_bytes", "warmroute_client_connections")
	if err != nil {
		return Sample{}, err
	}
	return Sample{At: time.Since(r.start), Phase: phase, Goroutines: v[0], HeapInuse: v[1], RSS: v[2], ClientConns: v[3],
		Requests: r.finished.Load()}, nil
}

// parseMetrics reads unlabelled samples from a Prometheus text exposition;
// it fails when one is missing.
func parseMetrics(rd io.Reader, names ...string) ([]float64, error) {
	out := make([]float64, len(names))
	found := make([]bool, len(names))
	sc := bufio.NewScanner(rd)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 2 {
			continue
		}
		if i := slices.Index(names, f[0]); i >= 0 {
			v, err := strconv.ParseFloat(f[1], 64)
			if err != nil {
				return nil, fmt.Errorf("soak: %s: %w", f[0], err)
			}
			out[i], found[i] = v, true
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	for i, ok := range found {
		if !ok {
			return nil, fmt.Errorf("soak: no %s in /metrics", names[i])
		}
	}
	return out, nil
}

// inWindow reports whether [from, to] overlaps a restart window.
func (r *runner) inWindow(from, to time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, w := range r.windows {
		if from.Before(w.to) && to.After(w.from) {
			return true
		}
	}
	return false
}

// The shared prompt prefixes: a few long documents many requests share.
var prefixes = func() []string {
	var out []string
	for i := 0; i < 8; i++ {
		out = append(out, fmt.Sprintf("Document %d. ", i)+strings.Repeat(fmt.Sprintf("Shared context line %d for the soak. ", i), 30+i*20))
	}
	return out
}()

type kind int

const (
	kindChat kind = iota
	kindStream
	kindAbort
	kindCompletion
	kindBad
)

func (r *runner) worker(ctx context.Context, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 0x50a4))
	for i := 0; ctx.Err() == nil; i++ {
		k := kindChat
		switch x := rng.Float64(); {
		case x < r.cfg.BadFraction:
			k = kindBad
		case x < r.cfg.BadFraction+r.cfg.AbortFraction:
			k = kindAbort
		case x < 0.5:
			k = kindStream
		case x < 0.65:
			k = kindCompletion
		}
		prompt := prefixes[rng.IntN(len(prefixes))] + fmt.Sprintf("Question %d from worker %d.", i, seed)
		r.one(ctx, k, prompt, 4+rng.IntN(28))
		r.finished.Add(1)
	}
}

// one sends a request and records its outcome.
func (r *runner) one(ctx context.Context, k kind, prompt string, maxTokens int) {
	path := "/v1/chat/completions"
	var body string
	q := strconv.Quote(prompt)
	switch k {
	case kindCompletion:
		path = "/v1/completions"
		body = fmt.Sprintf(`{"model":"meta-llama/Llama-3.1-70B-Instruct","prompt":%s,"max_tokens":%d}`, q, maxTokens)
	case kindBad:
		body = fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":%s}`, q) // truncated
	default:
		stream := k == kindStream || k == kindAbort
		body = fmt.Sprintf(`{"model":"meta-llama/Llama-3.1-70B-Instruct","stream":%v,"max_tokens":%d,"messages":[{"role":"user","content":%s}]}`, stream, maxTokens, q)
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	req, _ := http.NewRequestWithContext(rctx, "POST", r.url+path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	start := time.Now()
	resp, err := r.client.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return // the load phase ended
		}
		r.unexpected(fmt.Sprintf("transport: %v", err))
		return
	}
	defer resp.Body.Close()
	switch {
	case k == kindBad:
		io.Copy(io.Discard, resp.Body)
		if resp.StatusCode == 400 {
			r.add(&r.counts.BadRefused)
		} else {
			r.unexpected(fmt.Sprintf("malformed request answered %d", resp.StatusCode))
		}
		return
	case resp.StatusCode >= 500:
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		if r.inWindow(start, time.Now()) {
			r.add(&r.counts.Err5xxInWindow)
			r.inWindowNote(fmt.Sprintf("%d %s", resp.StatusCode, bytes.TrimSpace(b)))
		} else {
			r.add(&r.counts.Err5xxOutside)
			r.unexpectedNote(fmt.Sprintf("%d outside restarts: %s", resp.StatusCode, bytes.TrimSpace(b)))
		}
		return
	case resp.StatusCode != 200:
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		r.unexpected(fmt.Sprintf("status %d: %s", resp.StatusCode, bytes.TrimSpace(b)))
		return
	}
	if k == kindAbort {
		br := bufio.NewReader(resp.Body)
		if _, err := br.ReadString('\n'); err == nil {
			cancel() // leave mid-stream
			r.add(&r.counts.Aborted)
			return
		}
	}
	b, err := io.ReadAll(resp.Body)
	streamed := k == kindStream || k == kindAbort
	if err != nil || streamed && !bytes.Contains(b, []byte("data: [DONE]")) {
		if ctx.Err() != nil {
			return
		}
		if r.inWindow(start, time.Now()) {
			r.add(&r.counts.CutInWindow)
			r.inWindowNote(fmt.Sprintf("cut: %v", err))
		} else {
			r.add(&r.counts.CutOutside)
			r.unexpectedNote(fmt.Sprintf("answer cut outside restarts: %v", err))
		}
		return
	}
	r.add(&r.counts.OK)
}

func (r *runner) add(p *int64) {
	r.mu.Lock()
	*p++
	r.mu.Unlock()
}

func (r *runner) unexpected(what string) {
	r.add(&r.counts.Unexpected)
	r.unexpectedNote(what)
}

func (r *runner) inWindowNote(what string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.counts.InWindow) < 4 {
		r.counts.InWindow = append(r.counts.InWindow, what)
	}
}

func (r *runner) unexpectedNote(what string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.counts.Examples) < 5 {
		r.counts.Examples = append(r.counts.Examples, what)
	}
}

// lockedWriter serialises writes to w.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// routerName is the soak router's node name, and the name in its
// certificate.
const routerName = "soak"

// clusterTLS makes a CA and a certificate for router name (with the SAN
// 127.0.0.1, where its admin API is reached) in dir, and returns the files
// and the client configuration that trusts the CA.
func clusterTLS(dir, name string, validity time.Duration) (proc.ClusterTLS, *tls.Config, error) {
	var files proc.ClusterTLS
	ca, err := identity.NewCA("warmroute soak CA", validity)
	if err != nil {
		return files, nil, err
	}
	certPEM, keyPEM, err := ca.Issue(identity.Request{Name: name, IPs: []net.IP{net.IPv4(127, 0, 0, 1)}, Validity: validity})
	if err != nil {
		return files, nil, err
	}
	caFile, certFile, keyFile := filepath.Join(dir, "warmroute-ca.pem"), filepath.Join(dir, name+".pem"), filepath.Join(dir, name+"-key.pem")
	for _, f := range []struct {
		path string
		data []byte
	}{{caFile, ca.CertPEM()}, {certFile, certPEM}, {keyFile, keyPEM}} {
		if err := os.WriteFile(f.path, f.data, 0o600); err != nil {
			return files, nil, err
		}
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	files = proc.ClusterTLS{CertFile: certFile, KeyFile: keyFile, CAFile: caFile}
	return files, &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}, nil
}
