package fleet

import (
	"cmp"
	"context"
	"encoding/json"
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
	"time"

	"github.com/warmroute/warmroute/loadtest/proc"
	"github.com/warmroute/warmroute/ring"
)

// Errors returned by Start.
var (
	ErrBadConfig = errors.New("fleet: invalid config")
	// ErrExited means a child process exited during start-up; the error
	// carries the end of its log.
	ErrExited = proc.ErrExited
	// ErrNotReady means a child did not become ready in time.
	ErrNotReady = proc.ErrNotReady
)

// Strategies returns the routing strategies a router accepts (ring's
// table), and PrefixAwareFixed just before PREFIX_AWARE, ordered by what
// they know, as a comparison shows them: those blind to key and load
// first, then those that weigh load, then those that route on the key,
// then those that do both.
func Strategies() []string {
	all := ring.Strategies()
	knows := func(s ring.StrategyInfo) int {
		k := 0
		if s.Key {
			k += 2
		}
		if s.Load {
			k++
		}
		return k
	}
	slices.SortStableFunc(all, func(a, b ring.StrategyInfo) int { return cmp.Compare(knows(a), knows(b)) })
	out := make([]string, 0, len(all)+1)
	for _, s := range all {
		if s.Strategy == ring.PrefixAware {
			out = append(out, PrefixAwareFixed)
		}
		out = append(out, s.Name)
	}
	return out
}

// PrefixAwareFixed names PREFIX_AWARE as it routed before adaptive keys:
// the first PrefixLength bytes as the key, overflow at the concurrency
// threshold or when the engine queues. Routers run it as PREFIX_AWARE with
// FixedArgs.
const PrefixAwareFixed = "PREFIX_AWARE_FIXED"

// FixedArgs are the serve flags that make PREFIX_AWARE PrefixAwareFixed.
var FixedArgs = []string{"--key-depth", "FIXED", "--overflow", "THRESHOLD", "--busy-is-full"}

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
	// RouterArgs, when set, completes the serve arguments of router i,
	// knowing the addresses of all routers (e.g. to join them in a
	// cluster); args holds the addresses, backends and routing settings.
	RouterArgs func(i int, routers []Router, args *proc.ServeArgs) error
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
		Strategy:             ring.PrefixAware.String(),
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
	procs    []*proc.Process
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
	args := proc.GpusimArgs{Instances: n, Listen: "127.0.0.1:" + strconv.Itoa(base), Extra: f.cfg.GpusimArgs}
	p, err := f.startProc("gpusim", args.Args())
	if err != nil {
		return err
	}
	urls := make([]string, n)
	for i := range urls {
		urls[i] = "http://127.0.0.1:" + strconv.Itoa(base+i)
	}
	for _, u := range urls {
		if err := p.WaitReady(ctx, 0, proc.HTTPCheck(u+"/health")); err != nil {
			p.Stop(f.cfg.StopTimeout)
			return fmt.Errorf("fleet: %w", err)
		}
	}
	f.procs = append(f.procs, p)
	f.backends = urls
	return nil
}

func (f *Fleet) startRouters(ctx context.Context) error {
	k := f.cfg.Routers
	addrs, err := proc.FreeAddrs("127.0.0.1", 2*k)
	if err != nil {
		return fmt.Errorf("fleet: %w", err)
	}
	routers := make([]Router, k)
	for i := range routers {
		routers[i] = Router{URL: "http://" + addrs[2*i], AdminURL: "http://" + addrs[2*i+1]}
	}
	var started []*proc.Process
	stopAll := func() {
		for _, p := range started {
			p.Stop(f.cfg.StopTimeout)
		}
	}
	for i := range routers {
		args := proc.ServeArgs{
			Listen:               addrs[2*i],
			AdminListen:          addrs[2*i+1],
			Backends:             f.routerBackends(),
			Strategy:             f.cfg.Strategy,
			PrefixLength:         f.cfg.PrefixLength,
			ConcurrencyThreshold: f.cfg.ConcurrencyThreshold,
			LoadFactor:           f.cfg.LoadFactor,
		}
		if f.cfg.RouterArgs != nil {
			if err := f.cfg.RouterArgs(i, routers, &args); err != nil {
				stopAll()
				return fmt.Errorf("fleet: router %d flags: %w", i, err)
			}
		}
		if args.Strategy == PrefixAwareFixed {
			args.Strategy = ring.PrefixAware.String()
			args.Extra = append(slices.Clone(FixedArgs), args.Extra...)
		}
		p, err := f.startProc("router-"+strconv.Itoa(i), args.Args())
		if err != nil {
			stopAll()
			return err
		}
		started = append(started, p)
	}
	for i, r := range routers {
		if err := started[i].WaitReady(ctx, 0, proc.HTTPCheck(r.URL+"/readyz")); err != nil {
			stopAll()
			return fmt.Errorf("fleet: %w", err)
		}
	}
	f.procs = append(f.procs, started...)
	f.routers = routers
	return nil
}

// startProc starts one child, its output in LogDir/name.log.
func (f *Fleet) startProc(name string, args []string) (*proc.Process, error) {
	p, err := proc.Start(proc.Spec{Name: name, Path: f.cfg.Exe, Args: args, Env: f.cfg.Env,
		LogFile: filepath.Join(f.cfg.LogDir, name+".log")})
	if err != nil {
		return nil, fmt.Errorf("fleet: %w", err)
	}
	return p, nil
}

// BackendURLs returns the instances' base URLs.
func (f *Fleet) BackendURLs() []string { return append([]string(nil), f.backends...) }

// instanceID is the id the routers give instance i: "gpu-" and i, as
// gpusim names it by default. Placement depends only on backend ids, so
// with ids that do not depend on the ports a run happened to get, every
// run of a fleet, and every strategy compared on it, places keys alike.
func instanceID(i int) string { return "gpu-" + strconv.Itoa(i) }

// routerBackends is the routers' --backends: id=url for each instance.
func (f *Fleet) routerBackends() []string {
	out := make([]string, len(f.backends))
	for i, u := range f.backends {
		out[i] = instanceID(i) + "=" + u
	}
	return out
}

// BackendIDs returns the instances' ids as responses name them: the
// routers' ids (gpu-0, gpu-1, ...), or, with no router, host:port, the id
// the load test gives an instance it reaches directly.
func (f *Fleet) BackendIDs() []string {
	ids := make([]string, len(f.backends))
	for i, u := range f.backends {
		if f.cfg.Routers > 0 {
			ids[i] = instanceID(i)
		} else {
			ids[i] = strings.TrimPrefix(u, "http://")
		}
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

// Close stops every child (routers first, then gpusim) and waits for them.
// Routers in one cluster stop one at a time, the Raft leader last, each
// once the leader has removed the one before from the configuration: a
// router that leaves a healthy cluster this way is a planned departure,
// not a failure the others must report. It is safe to call more than once.
func (f *Fleet) Close() error {
	f.closeOnce.Do(func() {
		f.stopRouters()
		if len(f.procs) > 0 {
			f.procs[0].Stop(f.cfg.StopTimeout)
		}
		if f.tmpDir != "" {
			f.closeErr = os.RemoveAll(f.tmpDir)
		}
	})
	return f.closeErr
}

// stopRouters stops the routers: a cluster in order (see Close), and
// whatever that leaves, or routers that are not one cluster, all at once.
func (f *Fleet) stopRouters() {
	procs := f.procs[min(1, len(f.procs)):]
	left := make([]int, len(procs)) // indices into procs and f.routers
	for i := range left {
		left[i] = i
	}
	if len(procs) == len(f.routers) {
		for len(left) > 1 {
			next, leader, name, err := f.nextToStop(left)
			// An election may be under way: ask again for a moment.
			for wait := time.Now().Add(time.Second); errors.Is(err, errNoLeader) && time.Now().Before(wait); {
				time.Sleep(50 * time.Millisecond)
				next, leader, name, err = f.nextToStop(left)
			}
			if err != nil {
				break
			}
			procs[left[next]].Stop(f.cfg.StopTimeout)
			f.waitRemoved(left[leader], name)
			left = slices.Delete(left, next, next+1)
		}
	}
	var wg sync.WaitGroup
	for _, i := range left {
		wg.Go(func() { procs[i].Stop(f.cfg.StopTimeout) })
	}
	wg.Wait()
}

// clusterView is the part of a router's GET /v1/cluster the fleet reads.
type clusterView struct {
	Node   string `json:"node"`
	Leader string `json:"leader"`
	Raft   struct {
		Servers []raftServer `json:"servers"`
	} `json:"raft"`
}

type raftServer struct {
	ID string `json:"id"`
}

// clusterOf asks router i for its view of the cluster.
func (f *Fleet) clusterOf(i int) (clusterView, error) {
	var v clusterView
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, f.routers[i].AdminURL+"/v1/cluster", nil)
	if err != nil {
		return v, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return v, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return v, fmt.Errorf("fleet: GET /v1/cluster: %s", resp.Status)
	}
	err = json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&v)
	return v, err
}

// errNoLeader: the routers do not name one leader among them.
var errNoLeader = errors.New("fleet: no leader")

// nextToStop picks among the running routers left (indices into
// f.routers) one that is not the Raft leader, and returns its position in
// left, its node name, and the leader's position. It fails unless every
// router answers, and with errNoLeader unless they all name one leader
// among them.
func (f *Fleet) nextToStop(left []int) (next, leader int, name string, err error) {
	names := make([]string, len(left))
	leaders := map[string]bool{}
	for k, i := range left {
		v, err := f.clusterOf(i)
		if err != nil {
			return 0, 0, "", err
		}
		names[k] = v.Node
		leaders[v.Leader] = true
	}
	electing := leaders[""]
	delete(leaders, "")
	if len(leaders) > 1 {
		return 0, 0, "", errors.New("fleet: the routers are not one cluster")
	}
	lead := ""
	for l := range leaders {
		lead = l
	}
	if leader = slices.Index(names, lead); electing || lead == "" || leader < 0 {
		return 0, 0, "", errNoLeader
	}
	next = (leader + 1) % len(left)
	return next, leader, names[next], nil
}

// waitRemoved waits, at most StopTimeout, until router i (the leader) no
// longer lists name among the Raft servers.
func (f *Fleet) waitRemoved(i int, name string) {
	deadline := time.Now().Add(f.cfg.StopTimeout)
	for time.Now().Before(deadline) {
		v, err := f.clusterOf(i)
		if err != nil || !slices.ContainsFunc(v.Raft.Servers, func(s raftServer) bool { return s.ID == name }) {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
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
