package chaos

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/warmroute/warmroute/loadtest/proc"
)

// LocalConfig describes a cluster of child processes on loopback: routers
// on 127.0.0.11, .12, ... (each its own address, so a partition can name
// it) and one gpusim process per backend on 127.0.0.1. The routers run
// with cluster TLS, as a deployment does: a CA made for the run signs a
// certificate for each (its node name), so Raft and admin forwarding go
// over mutual TLS and the admin APIs serve HTTPS.
type LocalConfig struct {
	// Exe is the warmroute executable (default: the running one).
	Exe      string
	Routers  int
	Backends int
	// GpusimArgs and RouterArgs are extra flags for every gpusim and
	// router process.
	GpusimArgs []string
	RouterArgs []string
	// RaftTimeout is the routers' --raft-timeout.
	RaftTimeout time.Duration
	// Partition runs each router under its own uid so iptables owner rules
	// can cut it off from its peers on loopback. Needs root and iptables;
	// without it the router-partition fault is skipped.
	Partition bool
	// FirstUID is the uid of the first router when Partition is set (the
	// others follow it).
	FirstUID int
	// WorkDir receives logs and data ("" : a temporary directory, removed
	// by Close unless KeepWorkDir).
	WorkDir     string
	KeepWorkDir bool
	// StartTimeout bounds the start of every process; StopTimeout the wait
	// between SIGTERM and SIGKILL.
	StartTimeout time.Duration
	StopTimeout  time.Duration
}

// DefaultLocalConfig is 3 routers in front of 6 gpusim instances, with
// partitions when running as root.
func DefaultLocalConfig() LocalConfig {
	return LocalConfig{
		Routers:      3,
		Backends:     6,
		RaftTimeout:  time.Second,
		Partition:    os.Geteuid() == 0,
		FirstUID:     61400,
		StartTimeout: 30 * time.Second,
		StopTimeout:  15 * time.Second,
	}
}

// Validate reports the first problem with c.
func (c LocalConfig) Validate() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: %s", ErrBadConfig, fmt.Sprintf(format, a...))
	}
	switch {
	case c.Routers < 2 || c.Routers > 9:
		return bad("local routers %d outside 2-9", c.Routers)
	case c.Backends < 2 || c.Backends > 64:
		return bad("local backends %d outside 2-64", c.Backends)
	case c.RaftTimeout <= 0 || c.StartTimeout <= 0 || c.StopTimeout <= 0:
		return bad("timeouts must be > 0")
	case c.Partition && (c.FirstUID < 1000 || c.FirstUID > 1<<30):
		return bad("first uid %d outside 1000-2^30", c.FirstUID)
	}
	return nil
}

// localRouter is one router process and its fixed addresses.
type localRouter struct {
	Router
	host                 string // 127.0.0.x
	gossip, raft, data   string
	uid                  int // 0: this process's
	proc                 *lproc
	traffic, adminListen string
}

type localBackend struct {
	Backend
	listen string
	proc   *lproc
}

// Local is the local target.
type Local struct {
	cfg      LocalConfig
	dir      string
	exe      string
	routers  []*localRouter
	backs    []*localBackend
	fw       *firewall
	log      io.Writer
	adminTLS *tls.Config

	mu        sync.Mutex
	closeOnce sync.Once
	closeErr  error
}

var _ Target = (*Local)(nil)

// NewLocal returns a local target; nothing starts before Start. log
// receives one line per process start (nil: silent).
func NewLocal(cfg LocalConfig, log io.Writer) (*Local, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := localSupported(); err != nil {
		return nil, err
	}
	return &Local{cfg: cfg, log: log}, nil
}

// Name implements Target.
func (l *Local) Name() string { return "local" }

// Describe implements Target.
func (l *Local) Describe() string {
	part := "no partitions"
	if l.fw != nil {
		part = "partitions with iptables owner rules"
	}
	return fmt.Sprintf("%d router processes on 127.0.0.11-%d with cluster TLS, %d gpusim processes (one instance each) on 127.0.0.1, %s; work dir %s",
		len(l.routers), 10+len(l.routers), len(l.backs), part, l.dir)
}

// Admin implements Target: HTTPS with the run's CA; loopback admin
// requests need no token.
func (l *Local) Admin() AdminAccess { return AdminAccess{TLS: l.adminTLS} }

// Routers implements Target.
func (l *Local) Routers() []Router {
	out := make([]Router, len(l.routers))
	for i, r := range l.routers {
		out[i] = r.Router
	}
	return out
}

// Backends implements Target.
func (l *Local) Backends() []Backend {
	out := make([]Backend, len(l.backs))
	for i, b := range l.backs {
		out[i] = b.Backend
	}
	return out
}

// Start implements Target.
func (l *Local) Start(ctx context.Context) error {
	if err := l.prepare(); err != nil {
		l.Close()
		return err
	}
	if err := l.startAll(ctx); err != nil {
		l.Close()
		return err
	}
	return nil
}

// prepare makes the work dir, picks addresses and ports, and, for
// partitions, copies the executable where other uids can run it.
func (l *Local) prepare() error {
	c := l.cfg
	l.dir = c.WorkDir
	if l.dir == "" {
		d, err := os.MkdirTemp("", "warmroute-chaos-")
		if err != nil {
			return err
		}
		l.dir = d
	} else if err := os.MkdirAll(l.dir, 0o755); err != nil {
		return err
	}
	if err := os.Chmod(l.dir, 0o755); err != nil {
		return err
	}
	l.exe = c.Exe
	if l.exe == "" {
		exe, err := os.Executable()
		if err != nil {
			return err
		}
		l.exe = exe
	}
	if c.Partition {
		fw, err := newFirewall(fmt.Sprintf("WRCHAOS-%d", os.Getpid()))
		if err != nil {
			return fmt.Errorf("partitions need iptables as root (set Partition false to skip them): %w", err)
		}
		l.fw = fw
		// other uids must be able to run the binary
		dst := filepath.Join(l.dir, "warmroute")
		if err := copyFile(l.exe, dst, 0o755); err != nil {
			return err
		}
		l.exe = dst
	}
	backAddrs, err := proc.FreeAddrs("127.0.0.1", c.Backends)
	if err != nil {
		return err
	}
	for i, addr := range backAddrs {
		id := "gpu-" + strconv.Itoa(i)
		l.backs = append(l.backs, &localBackend{
			Backend: Backend{ID: id, URL: "http://" + addr, MetricsURL: "http://" + addr + "/metrics"},
			listen:  addr,
		})
	}
	for i := 0; i < c.Routers; i++ {
		host := "127.0.0." + strconv.Itoa(11+i)
		addrs, err := proc.FreeAddrs(host, 4)
		if err != nil {
			return err
		}
		name := "router-" + string(rune('a'+i))
		r := &localRouter{
			Router:      Router{Name: name, URL: "http://" + addrs[0], AdminURL: "https://" + addrs[1]},
			host:        host,
			traffic:     addrs[0],
			adminListen: addrs[1],
			gossip:      addrs[2],
			raft:        addrs[3],
			data:        filepath.Join(l.dir, name+"-data"),
		}
		if c.Partition {
			r.uid = c.FirstUID + i
		}
		if err := os.MkdirAll(r.data, 0o700); err != nil {
			return err
		}
		if r.uid > 0 {
			if err := os.Chown(r.data, r.uid, r.uid); err != nil {
				return err
			}
		}
		l.routers = append(l.routers, r)
	}
	names, uids := make([]string, len(l.routers)), make([]int, len(l.routers))
	for i, r := range l.routers {
		names[i], uids[i] = r.Name, r.uid
	}
	// Valid for a year: runs are short, and a --keep'd work dir can be
	// started again by hand.
	pki, adminTLS, err := localPKI(l.dir, names, uids, 365*24*time.Hour)
	if err != nil {
		return fmt.Errorf("cluster certificates: %w", err)
	}
	l.adminTLS = adminTLS
	var specs []string
	for _, b := range l.backs {
		specs = append(specs, b.ID+"="+b.URL)
	}
	for _, r := range l.routers {
		var join []string
		for _, o := range l.routers {
			if o != r {
				join = append(join, o.gossip)
			}
		}
		args := proc.ServeArgs{
			NodeName:        r.Name,
			Listen:          r.traffic,
			AdminListen:     r.adminListen,
			GossipListen:    r.gossip,
			RaftListen:      r.raft,
			Join:            join,
			BootstrapExpect: min(3, c.Routers),
			DataDir:         r.data,
			RaftTimeout:     c.RaftTimeout,
			Backends:        specs,
			ProbeInterval:   time.Second,
			ShutdownTimeout: 10 * time.Second,
			ClusterTLS:      pki[r.Name],
			Extra:           c.RouterArgs,
		}
		r.proc = l.newProc(r.Name, args.Args(), r.uid, r.URL+"/readyz")
	}
	for _, b := range l.backs {
		args := proc.GpusimArgs{Instances: 1, Listen: b.listen, NamePrefix: b.ID + "-", Extra: c.GpusimArgs}
		b.proc = l.newProc(b.ID, args.Args(), 0, b.URL+"/health")
	}
	return nil
}

// newProc describes one child: run from the work dir as uid (0: this
// process's), its output appended to <work dir>/<name>.log, ready once a
// GET of ready answers 200.
func (l *Local) newProc(name string, args []string, uid int, ready string) *lproc {
	return &lproc{spec: proc.Spec{Name: name, Path: l.exe, Args: args, Dir: l.dir, UID: uid,
		LogFile: filepath.Join(l.dir, name+".log"), AppendLog: true}, ready: ready}
}

func (l *Local) logf(format string, a ...any) {
	if l.log != nil {
		fmt.Fprintf(l.log, "chaos local: "+format+"\n", a...)
	}
}

// startAll starts every backend, then every router, and waits for them.
func (l *Local) startAll(ctx context.Context) error {
	var backs, routers []*lproc
	for _, b := range l.backs {
		backs = append(backs, b.proc)
	}
	for _, r := range l.routers {
		routers = append(routers, r.proc)
	}
	for _, group := range [][]*lproc{backs, routers} {
		for _, p := range group {
			if err := p.start(); err != nil {
				return err
			}
		}
		for _, p := range group {
			if err := l.waitReady(ctx, p); err != nil {
				return err
			}
		}
	}
	l.logf("%d backends and %d routers running (logs in %s)", len(l.backs), len(l.routers), l.dir)
	return nil
}

// waitReady polls the process's ready URL until it answers 200, the
// process exits, or the start timeout passes.
func (l *Local) waitReady(ctx context.Context, lp *lproc) error {
	p := lp.current()
	if p == nil {
		return fmt.Errorf("%w: %s was never started", ErrTarget, lp.spec.Name)
	}
	err := p.WaitReady(ctx, l.cfg.StartTimeout, proc.HTTPCheck(lp.ready))
	switch {
	case err == nil:
		return nil
	case errors.Is(err, proc.ErrExited):
		return fmt.Errorf("%w: %w", ErrTarget, err)
	default:
		return fmt.Errorf("%w: %w", ErrNotReady, err)
	}
}

func (l *Local) router(name string) (*localRouter, error) {
	for _, r := range l.routers {
		if r.Name == name {
			return r, nil
		}
	}
	return nil, fmt.Errorf("%w: no router %q", ErrTarget, name)
}

func (l *Local) backend(id string) (*localBackend, error) {
	for _, b := range l.backs {
		if b.ID == id {
			return b, nil
		}
	}
	return nil, fmt.Errorf("%w: no backend %q", ErrTarget, id)
}

// onRouter runs do on the named router's process.
func (l *Local) onRouter(name string, do func(*lproc) error) error {
	r, err := l.router(name)
	if err != nil {
		return err
	}
	return do(r.proc)
}

// KillRouter implements Target (SIGKILL).
func (l *Local) KillRouter(_ context.Context, name string) error {
	return l.onRouter(name, (*lproc).kill)
}

// StartRouter implements Target: same flags, addresses and data dir.
func (l *Local) StartRouter(_ context.Context, name string) error {
	return l.onRouter(name, (*lproc).start)
}

// PauseRouter implements Target (SIGSTOP).
func (l *Local) PauseRouter(_ context.Context, name string) error {
	return l.onRouter(name, (*lproc).pause)
}

// ResumeRouter implements Target (SIGCONT).
func (l *Local) ResumeRouter(_ context.Context, name string) error {
	return l.onRouter(name, (*lproc).resume)
}

// CanPartition implements Target.
func (l *Local) CanPartition() error {
	if l.fw == nil {
		return fmt.Errorf("%w: local partitions need root and iptables (routers under their own uids); run the compose target for partitions", ErrUnsupported)
	}
	return nil
}

// PartitionRouter implements Target: iptables drops every packet the
// router's uid sends to another router's address and every packet another
// router's uid sends to it. Clients and backends still reach it.
func (l *Local) PartitionRouter(_ context.Context, name string) error {
	if err := l.CanPartition(); err != nil {
		return err
	}
	v, err := l.router(name)
	if err != nil {
		return err
	}
	var rules [][]string
	for _, o := range l.routers {
		if o == v {
			continue
		}
		rules = append(rules,
			[]string{"-o", "lo", "-d", o.host, "-m", "owner", "--uid-owner", strconv.Itoa(v.uid), "-j", "DROP"},
			[]string{"-o", "lo", "-d", v.host, "-m", "owner", "--uid-owner", strconv.Itoa(o.uid), "-j", "DROP"})
	}
	return l.fw.block(rules)
}

// HealRouter implements Target.
func (l *Local) HealRouter(context.Context, string) error {
	if l.fw == nil {
		return nil
	}
	return l.fw.clear()
}

// KillBackend implements Target (SIGKILL of its gpusim process).
func (l *Local) KillBackend(_ context.Context, id string) error {
	b, err := l.backend(id)
	if err != nil {
		return err
	}
	return b.proc.kill()
}

// StartBackend implements Target: same port, empty cache.
func (l *Local) StartBackend(ctx context.Context, id string) error {
	b, err := l.backend(id)
	if err != nil {
		return err
	}
	if err := b.proc.start(); err != nil {
		return err
	}
	return l.waitReady(ctx, b.proc)
}

// StopAll implements Target: SIGTERM to every router (they drain open
// streams), then to every backend.
func (l *Local) StopAll(context.Context) error {
	l.stopAll()
	return nil
}

func (l *Local) stopAll() {
	var wg sync.WaitGroup
	for _, r := range l.routers {
		wg.Go(func() { r.proc.stop(l.cfg.StopTimeout) })
	}
	wg.Wait()
	for _, b := range l.backs {
		wg.Go(func() { b.proc.stop(l.cfg.StopTimeout) })
	}
	wg.Wait()
}

// StartAll implements Target.
func (l *Local) StartAll(ctx context.Context) error { return l.startAll(ctx) }

// Close implements Target: removes the firewall rules, stops every
// process and removes the temporary work dir.
func (l *Local) Close() error {
	l.closeOnce.Do(func() {
		var errs []error
		if l.fw != nil {
			errs = append(errs, l.fw.close())
		}
		l.stopAll()
		if l.cfg.WorkDir == "" && !l.cfg.KeepWorkDir && l.dir != "" {
			errs = append(errs, os.RemoveAll(l.dir))
		}
		l.closeErr = errors.Join(errs...)
	})
	return l.closeErr
}

func copyFile(src, dst string, mode os.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// lproc is one child process that can be started again after it ends;
// a nil *lproc (a process prepare never described) is never running.
type lproc struct {
	spec  proc.Spec
	ready string // a URL that answers 200 once the process is ready

	mu sync.Mutex
	p  *proc.Process // the current run; nil before the first
}

// start runs the process (again) unless it runs, appending to its log.
func (lp *lproc) start() error {
	lp.mu.Lock()
	defer lp.mu.Unlock()
	if lp.p != nil && !lp.p.Exited() {
		return nil
	}
	lf, err := os.OpenFile(lp.spec.LogFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	fmt.Fprintf(lf, "---- chaos: starting %s at %s\n", lp.spec.Name, time.Now().Format(time.RFC3339Nano))
	if err := lf.Close(); err != nil {
		return err
	}
	p, err := proc.Start(lp.spec)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrTarget, err)
	}
	lp.p = p
	return nil
}

// current returns the current run (nil when never started).
func (lp *lproc) current() *proc.Process {
	if lp == nil {
		return nil
	}
	lp.mu.Lock()
	defer lp.mu.Unlock()
	return lp.p
}

// kill sends SIGKILL to the process group and waits for the exit.
func (lp *lproc) kill() error {
	if p := lp.current(); p != nil {
		p.Kill()
	}
	return nil
}

// stop resumes a paused process, sends SIGTERM, SIGKILL after grace, and
// waits.
func (lp *lproc) stop(grace time.Duration) {
	if p := lp.current(); p != nil {
		p.Stop(grace)
	}
}

// pause sends SIGSTOP to the process group.
func (lp *lproc) pause() error {
	p := lp.current()
	if p == nil || p.Pause() != nil {
		return fmt.Errorf("%w: %s not running", ErrTarget, lp.spec.Name)
	}
	return nil
}

// resume sends SIGCONT to the process group.
func (lp *lproc) resume() error {
	if p := lp.current(); p != nil {
		return p.Continue()
	}
	return nil
}
