package fleet

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Errors returned by Start.
var (
	ErrBadConfig = errors.New("fleet: invalid config")
	// ErrExited means a child process exited during start-up; the error
	// carries the end of its log.
	ErrExited = errors.New("fleet: process exited")
	// ErrNotReady means a child did not become ready in time.
	ErrNotReady = errors.New("fleet: not ready")
)

// Strategies returns the routing strategies a router accepts.
func Strategies() []string {
	return []string{"RANDOM", "ROUND_ROBIN", "LEAST_OUTSTANDING_REQUESTS", "CONSISTENT_HASH", "PREFIX_AWARE"}
}

// Router is one router process's addresses.
type Router struct {
	URL      string // traffic (OpenAI API), http://127.0.0.1:P
	AdminURL string // admin and /metrics, http://127.0.0.1:Q
}

// Config describes a local fleet.
type Config struct {
	// Exe is the warmroute executable to run children from (default: the
	// running executable).
	Exe string
	// Instances is the number of gpusim instances, served by one process.
	Instances int
	// GpusimArgs are extra flags for `warmroute gpusim` (the model: KV
	// capacity, time scale, ...).
	GpusimArgs []string
	// Routers is the number of router processes; 0 drives the backends
	// directly.
	Routers int
	// Routing configuration of every router.
	Strategy             string
	PrefixLength         int
	ConcurrencyThreshold int
	LoadFactor           float64
	// RouterArgs, when set, returns extra flags for router i, knowing the
	// addresses of all routers (e.g. to join them in a cluster).
	RouterArgs func(i int, routers []Router) ([]string, error)
	// Env is added to the children's environment.
	Env []string
	// LogDir receives one log file per child; "" uses a temporary
	// directory removed by Close.
	LogDir string
	// StartTimeout bounds the wait for children to become ready;
	// StopTimeout the wait between SIGTERM and SIGKILL.
	StartTimeout time.Duration
	StopTimeout  time.Duration
}

// DefaultConfig returns 7 instances behind one PREFIX_AWARE router.
func DefaultConfig() Config {
	return Config{
		Instances:            7,
		Routers:              1,
		Strategy:             "PREFIX_AWARE",
		PrefixLength:         1024,
		ConcurrencyThreshold: 8,
		LoadFactor:           1.5,
		StartTimeout:         20 * time.Second,
		StopTimeout:          3 * time.Second,
	}
}

// Validate reports the first problem with c.
func (c Config) Validate() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: %s", ErrBadConfig, fmt.Sprintf(format, a...))
	}
	switch {
	case c.Instances < 1 || c.Instances > 1000:
		return bad("instances %d outside 1-1000", c.Instances)
	case c.Routers < 0 || c.Routers > 64:
		return bad("routers %d outside 0-64", c.Routers)
	case c.StartTimeout <= 0 || c.StopTimeout <= 0:
		return bad("timeouts must be > 0")
	}
	if c.Routers > 0 {
		ok := false
		for _, s := range Strategies() {
			ok = ok || s == c.Strategy
		}
		if !ok {
			return bad("strategy %q (want one of %s)", c.Strategy, strings.Join(Strategies(), ", "))
		}
		if c.PrefixLength < 1 || c.ConcurrencyThreshold < 1 || c.LoadFactor < 0 {
			return bad("prefix length and concurrency threshold must be >= 1, load factor >= 0")
		}
	}
	return nil
}

// Fleet is a running local fleet.
type Fleet struct {
	cfg      Config
	backends []string
	routers  []Router
	procs    []*proc
	tmpDir   string

	closeOnce sync.Once
	closeErr  error
}

// Start starts the gpusim process and the routers and waits until every
// instance answers /health and every router /readyz. On any error, or when
// ctx is cancelled, whatever was started is stopped before Start returns.
func Start(ctx context.Context, cfg Config) (*Fleet, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Exe == "" {
		exe, err := os.Executable()
		if err != nil {
			return nil, fmt.Errorf("fleet: finding the executable: %w", err)
		}
		cfg.Exe = exe
	}
	f := &Fleet{cfg: cfg}
	if cfg.LogDir == "" {
		d, err := os.MkdirTemp("", "warmroute-fleet-")
		if err != nil {
			return nil, err
		}
		f.tmpDir, f.cfg.LogDir = d, d
	} else if err := os.MkdirAll(cfg.LogDir, 0o755); err != nil {
		return nil, err
	}
	if err := f.start(ctx); err != nil {
		_ = f.Close()
		return nil, err
	}
	return f, nil
}

func (f *Fleet) start(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, f.cfg.StartTimeout)
	defer cancel()
	// The ports are free when chosen but may be taken before the child
	// binds them: retry with other ports when the child exits at once.
	var err error
	for attempt := 0; attempt < 3; attempt++ {
		if err = f.startGpusim(ctx); err == nil || !errors.Is(err, ErrExited) || ctx.Err() != nil {
			break
		}
	}
	if err != nil {
		return err
	}
	if f.cfg.Routers == 0 {
		return nil
	}
	for attempt := 0; attempt < 3; attempt++ {
		if err = f.startRouters(ctx); err == nil || !errors.Is(err, ErrExited) || ctx.Err() != nil {
			break
		}
	}
	return err
}

func (f *Fleet) startGpusim(ctx context.Context) error {
	n := f.cfg.Instances
	base, err := consecutivePorts(n)
	if err != nil {
		return err
	}
	args := append([]string{"gpusim", "--instances", strconv.Itoa(n), "--listen", "127.0.0.1:" + strconv.Itoa(base)}, f.cfg.GpusimArgs...)
	p, err := startProc(f.cfg.Exe, "gpusim", args, f.cfg.Env, f.cfg.LogDir)
	if err != nil {
		return err
	}
	urls := make([]string, n)
	for i := range urls {
		urls[i] = "http://127.0.0.1:" + strconv.Itoa(base+i)
	}
	for _, u := range urls {
		if err := waitReady(ctx, p, u+"/health"); err != nil {
			p.stop(f.cfg.StopTimeout)
			return err
		}
	}
	f.procs = append(f.procs, p)
	f.backends = urls
	return nil
}

func (f *Fleet) startRouters(ctx context.Context) error {
	k := f.cfg.Routers
	ports, err := freePorts(2 * k)
	if err != nil {
		return err
	}
	routers := make([]Router, k)
	for i := range routers {
		routers[i] = Router{
			URL:      "http://127.0.0.1:" + strconv.Itoa(ports[2*i]),
			AdminURL: "http://127.0.0.1:" + strconv.Itoa(ports[2*i+1]),
		}
	}
	var started []*proc
	stopAll := func() {
		for _, p := range started {
			p.stop(f.cfg.StopTimeout)
		}
	}
	for i, r := range routers {
		args := []string{"serve",
			"--listen", strings.TrimPrefix(r.URL, "http://"),
			"--admin-listen", strings.TrimPrefix(r.AdminURL, "http://"),
			"--backends", strings.Join(f.backends, ","),
			"--strategy", f.cfg.Strategy,
			"--prefix-length", strconv.Itoa(f.cfg.PrefixLength),
			"--concurrency-threshold", strconv.Itoa(f.cfg.ConcurrencyThreshold),
			"--load-factor", strconv.FormatFloat(f.cfg.LoadFactor, 'g', -1, 64),
		}
		if f.cfg.RouterArgs != nil {
			extra, err := f.cfg.RouterArgs(i, routers)
			if err != nil {
				stopAll()
				return fmt.Errorf("fleet: router %d flags: %w", i, err)
			}
			args = append(args, extra...)
		}
		p, err := startProc(f.cfg.Exe, "router-"+strconv.Itoa(i), args, f.cfg.Env, f.cfg.LogDir)
		if err != nil {
			stopAll()
			return err
		}
		started = append(started, p)
	}
	for i, r := range routers {
		if err := waitReady(ctx, started[i], r.URL+"/readyz"); err != nil {
			stopAll()
			return err
		}
	}
	f.procs = append(f.procs, started...)
	f.routers = routers
	return nil
}

// BackendURLs returns the instances' base URLs.
func (f *Fleet) BackendURLs() []string { return append([]string(nil), f.backends...) }

// BackendIDs returns the instances' ids as a router names them (host:port).
func (f *Fleet) BackendIDs() []string {
	ids := make([]string, len(f.backends))
	for i, u := range f.backends {
		ids[i] = strings.TrimPrefix(u, "http://")
	}
	return ids
}

// MetricsURLs returns the instances' /metrics URLs.
func (f *Fleet) MetricsURLs() []string {
	m := make([]string, len(f.backends))
	for i, u := range f.backends {
		m[i] = u + "/metrics"
	}
	return m
}

// Routers returns the routers' addresses.
func (f *Fleet) Routers() []Router { return append([]Router(nil), f.routers...) }

// Targets returns where clients send traffic: the routers, or the
// instances when there is no router.
func (f *Fleet) Targets() []string {
	if len(f.routers) == 0 {
		return f.BackendURLs()
	}
	t := make([]string, len(f.routers))
	for i, r := range f.routers {
		t[i] = r.URL
	}
	return t
}

// LogDir returns the directory of the children's logs.
func (f *Fleet) LogDir() string { return f.cfg.LogDir }

// Close stops every child (routers first, then gpusim) and waits for them.
// It is safe to call more than once.
func (f *Fleet) Close() error {
	f.closeOnce.Do(func() {
		var wg sync.WaitGroup
		// routers first so they do not see their backends vanish
		for i := len(f.procs) - 1; i >= 1; i-- {
			wg.Add(1)
			go func(p *proc) { defer wg.Done(); p.stop(f.cfg.StopTimeout) }(f.procs[i])
		}
		wg.Wait()
		if len(f.procs) > 0 {
			f.procs[0].stop(f.cfg.StopTimeout)
		}
		if f.tmpDir != "" {
			f.closeErr = os.RemoveAll(f.tmpDir)
		}
	})
	return f.closeErr
}

// proc is one child process.
type proc struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	log     *os.File
	exited  chan struct{}
	waitErr error
	stopped sync.Once
}

func startProc(exe, name string, args, env []string, logDir string) (*proc, error) {
	logPath := filepath.Join(logDir, name+".log")
	lf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe, args...)
	cmd.Stdout, cmd.Stderr = lf, lf
	if len(env) > 0 {
		cmd.Env = append(os.Environ(), env...)
	}
	prepare(cmd)
	if err := cmd.Start(); err != nil {
		lf.Close()
		return nil, fmt.Errorf("fleet: starting %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, logPath: logPath, log: lf, exited: make(chan struct{})}
	go func() {
		p.waitErr = cmd.Wait()
		close(p.exited)
	}()
	return p, nil
}

// stop sends SIGTERM to the process group, SIGKILL after grace, and waits.
func (p *proc) stop(grace time.Duration) {
	p.stopped.Do(func() {
		select {
		case <-p.exited:
		default:
			terminate(p.cmd)
			t := time.NewTimer(grace)
			select {
			case <-p.exited:
			case <-t.C:
			}
			t.Stop()
		}
		// whatever is left of the group (a grandchild, or a child that
		// ignored SIGTERM) goes now
		kill(p.cmd)
		<-p.exited
		p.log.Close()
	})
}

// tail returns the last n bytes of the process's log.
func (p *proc) tail(n int64) string {
	f, err := os.Open(p.logPath)
	if err != nil {
		return ""
	}
	defer f.Close()
	if st, err := f.Stat(); err == nil && st.Size() > n {
		_, _ = f.Seek(st.Size()-n, io.SeekStart)
	}
	b, _ := io.ReadAll(f)
	return strings.TrimSpace(string(b))
}

// waitReady polls url until it answers 200, the process exits, or ctx ends.
func waitReady(ctx context.Context, p *proc, url string) error {
	hc := &http.Client{Timeout: time.Second, Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true}}
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		if resp, err := hc.Do(req); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-p.exited:
			return fmt.Errorf("%w: %s (%v); its log ends:\n%s", ErrExited, p.name, p.waitErr, p.tail(2048))
		case <-ctx.Done():
			return fmt.Errorf("%w: %s did not answer %s: %v; its log ends:\n%s", ErrNotReady, p.name, url, ctx.Err(), p.tail(2048))
		case <-tick.C:
		}
	}
}

// freePorts returns n distinct ports free on 127.0.0.1 right now.
func freePorts(n int) ([]int, error) {
	ports := make([]int, 0, n)
	var lns []net.Listener
	defer func() {
		for _, l := range lns {
			l.Close()
		}
	}()
	for i := 0; i < n; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("fleet: finding a free port: %w", err)
		}
		lns = append(lns, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// consecutivePorts finds n consecutive ports free on 127.0.0.1 right now,
// below the usual ephemeral range so that outgoing connections are
// unlikely to take them.
func consecutivePorts(n int) (int, error) {
	const lo, hi = 20000, 32000
	for attempt := 0; attempt < 100; attempt++ {
		base := lo + rand.IntN(hi-lo-n)
		var lns []net.Listener
		ok := true
		for p := base; p < base+n; p++ {
			l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
			if err != nil {
				ok = false
				break
			}
			lns = append(lns, l)
		}
		for _, l := range lns {
			l.Close()
		}
		if ok {
			return base, nil
		}
	}
	return 0, fmt.Errorf("fleet: no %d consecutive free ports on 127.0.0.1", n)
}
