package chaos

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
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
	// FirstUID is the uid of the first router when Partition is set.
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
	uid                  int
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
	for i := 0; i < c.Backends; i++ {
		port, err := freePort("127.0.0.1")
		if err != nil {
			return err
		}
		id := "gpu-" + strconv.Itoa(i)
		addr := "127.0.0.1:" + strconv.Itoa(port)
		l.backs = append(l.backs, &localBackend{
			Backend: Backend{ID: id, URL: "http://" + addr, MetricsURL: "http://" + addr + "/metrics"},
			listen:  addr,
		})
	}
	for i := 0; i < c.Routers; i++ {
		host := "127.0.0." + strconv.Itoa(11+i)
		ports := make([]int, 4)
		for j := range ports {
			p, err := freePort(host)
			if err != nil {
				return err
			}
			ports[j] = p
		}
		name := "router-" + string(rune('a'+i))
		hp := func(p int) string { return host + ":" + strconv.Itoa(p) }
		r := &localRouter{
			Router:      Router{Name: name, URL: "http://" + hp(ports[0]), AdminURL: "https://" + hp(ports[1])},
			host:        host,
			traffic:     hp(ports[0]),
			adminListen: hp(ports[1]),
			gossip:      hp(ports[2]),
			raft:        hp(ports[3]),
			data:        filepath.Join(l.dir, name+"-data"),
			uid:         -1,
		}
		if c.Partition {
			r.uid = c.FirstUID + i
		}
		if err := os.MkdirAll(r.data, 0o700); err != nil {
			return err
		}
		if r.uid >= 0 {
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
		args := []string{"serve",
			"--node-name", r.Name,
			"--listen", r.traffic,
			"--admin-listen", r.adminListen,
			"--gossip-listen", r.gossip,
			"--raft-listen", r.raft,
			"--join", strings.Join(join, ","),
			"--bootstrap-expect", strconv.Itoa(min(3, c.Routers)),
			"--data-dir", r.data,
			"--raft-timeout", c.RaftTimeout.String(),
			"--backends", strings.Join(specs, ","),
			"--probe-interval", "1s",
			"--shutdown-timeout", "10s",
		}
		args = append(args, pki[r.Name].args()...)
		args = append(args, c.RouterArgs...)
		r.proc = &lproc{name: r.Name, exe: l.exe, args: args, dir: l.dir, uid: r.uid,
			logPath: filepath.Join(l.dir, r.Name+".log")}
	}
	for _, b := range l.backs {
		args := append([]string{"gpusim", "--instances", "1", "--listen", b.listen, "--name-prefix", b.ID + "-"}, c.GpusimArgs...)
		b.proc = &lproc{name: b.ID, exe: l.exe, args: args, dir: l.dir, uid: -1,
			logPath: filepath.Join(l.dir, b.ID+".log")}
	}
	return nil
}

func (l *Local) logf(format string, a ...any) {
	if l.log != nil {
		fmt.Fprintf(l.log, "chaos local: "+format+"\n", a...)
	}
}

// startAll starts every backend, then every router, and waits for them.
func (l *Local) startAll(ctx context.Context) error {
	for _, b := range l.backs {
		if err := b.proc.start(); err != nil {
			return err
		}
	}
	for _, b := range l.backs {
		if err := l.waitHTTP(ctx, b.proc, b.URL+"/health"); err != nil {
			return err
		}
	}
	for _, r := range l.routers {
		if err := r.proc.start(); err != nil {
			return err
		}
	}
	for _, r := range l.routers {
		if err := l.waitHTTP(ctx, r.proc, r.URL+"/readyz"); err != nil {
			return err
		}
	}
	l.logf("%d backends and %d routers running (logs in %s)", len(l.backs), len(l.routers), l.dir)
	return nil
}

// waitHTTP polls url until it answers 200, the process exits, or the start
// timeout passes.
func (l *Local) waitHTTP(ctx context.Context, p *lproc, url string) error {
	hc := &http.Client{Timeout: time.Second, Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true}}
	deadline := time.Now().Add(l.cfg.StartTimeout)
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		if resp, err := hc.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if !p.running() {
			return fmt.Errorf("%w: %s exited; its log ends:\n%s", ErrTarget, p.name, p.tail(2048))
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%w: %s did not answer %s within %s; its log ends:\n%s", ErrNotReady, p.name, url, l.cfg.StartTimeout, p.tail(2048))
		}
		if err := sleep(ctx, 50*time.Millisecond); err != nil {
			return err
		}
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

// KillRouter implements Target (SIGKILL).
func (l *Local) KillRouter(_ context.Context, name string) error {
	r, err := l.router(name)
	if err != nil {
		return err
	}
	r.proc.kill()
	return nil
}

// StartRouter implements Target: same flags, addresses and data dir.
func (l *Local) StartRouter(_ context.Context, name string) error {
	r, err := l.router(name)
	if err != nil {
		return err
	}
	if r.proc.running() {
		return nil
	}
	return r.proc.start()
}

// PauseRouter implements Target (SIGSTOP).
func (l *Local) PauseRouter(_ context.Context, name string) error {
	r, err := l.router(name)
	if err != nil {
		return err
	}
	return r.proc.pause()
}

// ResumeRouter implements Target (SIGCONT).
func (l *Local) ResumeRouter(_ context.Context, name string) error {
	r, err := l.router(name)
	if err != nil {
		return err
	}
	return r.proc.resume()
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
	b.proc.kill()
	return nil
}

// StartBackend implements Target: same port, empty cache.
func (l *Local) StartBackend(ctx context.Context, id string) error {
	b, err := l.backend(id)
	if err != nil {
		return err
	}
	if !b.proc.running() {
		if err := b.proc.start(); err != nil {
			return err
		}
	}
	return l.waitHTTP(ctx, b.proc, b.URL+"/health")
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
		if r.proc != nil {
			wg.Add(1)
			go func(p *lproc) { defer wg.Done(); p.stop(l.cfg.StopTimeout) }(r.proc)
		}
	}
	wg.Wait()
	for _, b := range l.backs {
		if b.proc != nil {
			wg.Add(1)
			go func(p *lproc) { defer wg.Done(); p.stop(l.cfg.StopTimeout) }(b.proc)
		}
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

// freePort returns a port free on host right now.
func freePort(host string) (int, error) {
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return 0, fmt.Errorf("finding a free port on %s: %w", host, err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
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

// lproc is one child process that can be started again after it ends.
type lproc struct {
	name    string
	exe     string
	args    []string
	dir     string
	uid     int // -1: this process's uid
	logPath string

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
	paused bool
}

// start runs the process (again), appending to its log.
func (p *lproc) start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil {
		select {
		case <-p.exited:
		default:
			return nil // still running
		}
	}
	lf, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	fmt.Fprintf(lf, "---- chaos: starting %s at %s\n", p.name, time.Now().Format(time.RFC3339Nano))
	cmd := exec.Command(p.exe, p.args...)
	cmd.Dir = p.dir
	cmd.Stdout, cmd.Stderr = lf, lf
	prepareCmd(cmd, p.uid)
	if err := cmd.Start(); err != nil {
		lf.Close()
		return fmt.Errorf("%w: starting %s: %v", ErrTarget, p.name, err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		lf.Close()
		close(exited)
	}()
	p.cmd, p.exited, p.paused = cmd, exited, false
	return nil
}

func (p *lproc) running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return false
	}
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// current returns the running command and its exit channel (nil when
// never started).
func (p *lproc) current() (*exec.Cmd, chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cmd, p.exited
}

// kill sends SIGKILL to the process group and waits for the exit.
func (p *lproc) kill() {
	cmd, exited := p.current()
	if cmd == nil {
		return
	}
	signalGroup(cmd, sigKill)
	<-exited
}

// stop resumes a paused process, sends SIGTERM, SIGKILL after grace, and
// waits.
func (p *lproc) stop(grace time.Duration) {
	cmd, exited := p.current()
	if cmd == nil {
		return
	}
	select {
	case <-exited:
		return
	default:
	}
	signalGroup(cmd, sigCont)
	signalGroup(cmd, sigTerm)
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-exited:
	case <-t.C:
	}
	signalGroup(cmd, sigKill)
	<-exited
}

func (p *lproc) pause() error {
	cmd, exited := p.current()
	if cmd == nil {
		return fmt.Errorf("%w: %s not running", ErrTarget, p.name)
	}
	select {
	case <-exited:
		return fmt.Errorf("%w: %s not running", ErrTarget, p.name)
	default:
	}
	signalGroup(cmd, sigStop)
	p.mu.Lock()
	p.paused = true
	p.mu.Unlock()
	return nil
}

func (p *lproc) resume() error {
	cmd, _ := p.current()
	if cmd == nil {
		return nil
	}
	signalGroup(cmd, sigCont)
	p.mu.Lock()
	p.paused = false
	p.mu.Unlock()
	return nil
}

// tail returns the last n bytes of the log.
func (p *lproc) tail(n int64) string {
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
