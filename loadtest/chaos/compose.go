package chaos

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/warmroute/warmroute/loadtest/proc"
)

// ComposeConfig describes a run of deploy/compose's three-zone stack.
type ComposeConfig struct {
	// File is the compose file; init-secrets.sh is read from its directory.
	File string
	// Project is the compose project name ("" : wrchaos<pid>).
	Project string
	// Image is the warmroute image (WARMROUTE_IMAGE).
	Image string
	// TimeScale is gpusim's --time-scale (WR_GPUSIM_TIME_SCALE).
	TimeScale string
	// CommandTimeout bounds each docker or compose command.
	CommandTimeout time.Duration
	// StartTimeout bounds the wait for the routers to answer.
	StartTimeout time.Duration
	// Keep leaves the stack up on Close (prints how to remove it).
	Keep bool
}

// DefaultComposeConfig runs deploy/compose/docker-compose.yml with the
// warmroute:dev image.
func DefaultComposeConfig() ComposeConfig {
	return ComposeConfig{
		File:           "deploy/compose/docker-compose.yml",
		Image:          "warmroute:dev",
		TimeScale:      "1",
		CommandTimeout: 2 * time.Minute,
		StartTimeout:   2 * time.Minute,
	}
}

// Validate reports the first problem with c.
func (c ComposeConfig) Validate() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: %s", ErrBadConfig, fmt.Sprintf(format, a...))
	}
	switch {
	case c.File == "":
		return bad("no compose file")
	case c.Image == "":
		return bad("no image")
	case c.Project != "" && !projectName.MatchString(c.Project):
		return bad("project name %q (want lower-case letters, digits, - and _)", c.Project)
	case c.CommandTimeout <= 0 || c.StartTimeout <= 0:
		return bad("timeouts must be > 0")
	}
	if _, err := strconv.ParseFloat(c.TimeScale, 64); err != nil {
		return bad("time scale %q", c.TimeScale)
	}
	return nil
}

var projectName = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]*$`)

// composeRouter is router-a, -b or -c of the stack.
type composeRouter struct {
	Router
	service   string
	backbone  string // fixed backbone IP
	container string
	cut       bool // disconnected from the backbone
	paused    bool
}

// Compose is the compose target.
type Compose struct {
	cfg     ComposeConfig
	compose []string // docker-compose, or docker compose
	env     []string
	project string
	net     string // first three octets of the backbone
	tmp     string
	admin   AdminAccess
	log     io.Writer

	mu       sync.Mutex
	routers  []*composeRouter
	backends []Backend
	backCID  map[string]string // backend id -> container

	up        bool
	closeOnce sync.Once
	closeErr  error
}

var _ Target = (*Compose)(nil)

// NewCompose returns a compose target after checking that a Docker engine
// and a compose tool are there; nothing starts before Start. log receives
// progress lines (nil: silent).
func NewCompose(cfg ComposeConfig, log io.Writer) (*Compose, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	c := &Compose{cfg: cfg, log: log}
	if _, err := exec.LookPath("docker"); err != nil {
		return nil, fmt.Errorf("%w: docker is not installed", ErrUnsupported)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := exec.CommandContext(ctx, "docker", "info").Run(); err != nil {
		return nil, fmt.Errorf("%w: no Docker engine is running (docker info failed)", ErrUnsupported)
	}
	if _, err := exec.LookPath("docker-compose"); err == nil {
		c.compose = []string{"docker-compose"}
	} else if exec.CommandContext(ctx, "docker", "compose", "version").Run() == nil {
		c.compose = []string{"docker", "compose"}
	} else {
		return nil, fmt.Errorf("%w: neither docker-compose nor 'docker compose' is installed", ErrUnsupported)
	}
	if _, err := os.Stat(cfg.File); err != nil {
		return nil, fmt.Errorf("%w: compose file: %v", ErrBadConfig, err)
	}
	if _, err := c.docker(ctx, "image", "inspect", cfg.Image); err != nil {
		return nil, fmt.Errorf("%w: image %s not found (run make images)", ErrNotReady, cfg.Image)
	}
	return c, nil
}

// Name implements Target.
func (c *Compose) Name() string { return "compose" }

// Describe implements Target.
func (c *Compose) Describe() string {
	zones := map[string]bool{}
	for _, b := range c.Backends() {
		zones[b.Zone] = true
	}
	return fmt.Sprintf("docker-compose project %s (%s, image %s): %d routers with cluster TLS, %d gpusim containers in %d zones, backbone %s.0/24",
		c.project, c.cfg.File, c.cfg.Image, len(c.routers), len(c.backends), len(zones), c.net)
}

// Admin implements Target: the stack's admin token, and HTTPS verified
// against the CA init-secrets.sh made for it.
func (c *Compose) Admin() AdminAccess { return c.admin }

// Routers implements Target.
func (c *Compose) Routers() []Router {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]Router, len(c.routers))
	for i, r := range c.routers {
		out[i] = r.Router
	}
	return out
}

// Backends implements Target.
func (c *Compose) Backends() []Backend {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]Backend(nil), c.backends...)
}

func (c *Compose) logf(format string, a ...any) {
	if c.log != nil {
		fmt.Fprintf(c.log, "chaos compose: "+format+"\n", a...)
	}
}

// run runs a command with the stack's environment.
func (c *Compose) run(ctx context.Context, name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.CommandTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = append(os.Environ(), c.env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	s := strings.TrimSpace(out.String())
	if err != nil {
		return s, fmt.Errorf("%w: %s %s: %v: %s", ErrTarget, name, strings.Join(args, " "), err, lastLines(s, 20))
	}
	return s, nil
}

func (c *Compose) docker(ctx context.Context, args ...string) (string, error) {
	return c.run(ctx, "docker", args...)
}

func (c *Compose) dc(ctx context.Context, args ...string) (string, error) {
	full := append(append(append([]string(nil), c.compose[1:]...), "-f", c.cfg.File), args...)
	return c.run(ctx, c.compose[0], full...)
}

// Start implements Target: a private project name, backbone network,
// fixed host ports (so a restarted container comes back on the same
// ones) and fresh secrets, then compose up.
func (c *Compose) Start(ctx context.Context) error {
	if err := c.start(ctx); err != nil {
		c.Close()
		return err
	}
	return nil
}

func (c *Compose) start(ctx context.Context) error {
	c.project = c.cfg.Project
	if c.project == "" {
		c.project = "wrchaos" + strconv.Itoa(os.Getpid())
	}
	used, _ := c.docker(ctx, "network", "inspect", "--format", "{{range .IPAM.Config}}{{.Subnet}} {{end}}", "bridge")
	if ids, err := c.docker(ctx, "network", "ls", "-q"); err == nil && ids != "" {
		used, _ = c.docker(ctx, append([]string{"network", "inspect", "--format", "{{range .IPAM.Config}}{{.Subnet}} {{end}}"}, strings.Fields(ids)...)...)
	}
	for n := 200; n <= 250 && c.net == ""; n++ {
		if !strings.Contains(used, fmt.Sprintf("10.213.%d.", n)) {
			c.net = fmt.Sprintf("10.213.%d", n)
		}
	}
	if c.net == "" {
		return fmt.Errorf("%w: no free 10.213.x.0/24 for the backbone", ErrTarget)
	}
	// three client ports, then three admin ports, all distinct
	addrs, err := proc.FreeAddrs("127.0.0.1", 6)
	if err != nil {
		return err
	}
	tmp, err := os.MkdirTemp("", "warmroute-chaos-compose-")
	if err != nil {
		return err
	}
	c.tmp = tmp
	secrets := filepath.Join(tmp, "secrets")
	c.env = []string{
		"COMPOSE_PROJECT_NAME=" + c.project,
		"WARMROUTE_IMAGE=" + c.cfg.Image, // init-secrets.sh runs 'warmroute tls' in it
		"WR_NET=" + c.net,
		"WR_SECRETS_DIR=" + secrets,
		"WR_GPUSIM_TIME_SCALE=" + c.cfg.TimeScale,
	}
	initSecrets := filepath.Join(filepath.Dir(c.cfg.File), "init-secrets.sh")
	if _, err := c.run(ctx, initSecrets, secrets); err != nil {
		return err
	}
	tok, err := os.ReadFile(filepath.Join(secrets, "admin.token"))
	if err != nil {
		return err
	}
	c.admin.Token = strings.TrimSpace(string(tok))
	if c.admin.TLS, err = caFileTLS(filepath.Join(secrets, "ca", "warmroute-ca.pem")); err != nil {
		return fmt.Errorf("%w: the stack's CA: %v", ErrTarget, err)
	}
	letters := []string{"A", "B", "C"}
	for i, l := range letters {
		_, port, _ := net.SplitHostPort(addrs[i])
		_, adminPort, _ := net.SplitHostPort(addrs[3+i])
		c.env = append(c.env, "WR_PORT_"+l+"="+port, "WR_ADMIN_PORT_"+l+"="+adminPort)
		name := "router-" + strings.ToLower(l)
		c.routers = append(c.routers, &composeRouter{
			Router: Router{Name: name,
				URL:      "http://" + addrs[i],
				AdminURL: "https://" + addrs[3+i]},
			service:  name,
			backbone: fmt.Sprintf("%s.%d", c.net, 11+i),
		})
	}
	c.logf("project %s, backbone %s.0/24, image %s: compose up", c.project, c.net, c.cfg.Image)
	c.up = true
	if _, err := c.dc(ctx, "up", "-d", "--no-build"); err != nil {
		return err
	}
	for _, r := range c.routers {
		id, err := c.containerOf(ctx, r.service)
		if err != nil {
			return err
		}
		r.container = id
	}
	if err := c.waitRouters(ctx); err != nil {
		return err
	}
	return c.loadBackends(ctx)
}

// containerOf finds a service's container by its compose labels.
func (c *Compose) containerOf(ctx context.Context, service string) (string, error) {
	out, err := c.docker(ctx, "ps", "-a", "-q", "--no-trunc",
		"--filter", "label=com.docker.compose.project="+c.project,
		"--filter", "label=com.docker.compose.service="+service)
	if err != nil {
		return "", err
	}
	ids := strings.Fields(out)
	if len(ids) != 1 {
		return "", fmt.Errorf("%w: %d containers for service %s", ErrTarget, len(ids), service)
	}
	return ids[0], nil
}

// waitRouters waits until every router answers /readyz.
func (c *Compose) waitRouters(ctx context.Context) error {
	hc := &http.Client{Timeout: time.Second, Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true}}
	return poll(ctx, c.cfg.StartTimeout, 250*time.Millisecond, func() bool {
		for _, r := range c.routers {
			resp, err := hc.Get(r.URL + "/readyz")
			if err != nil {
				return false
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				return false
			}
		}
		return true
	})
}

// loadBackends reads the agreed backends from router-a and finds each
// one's container and backbone address (for its metrics).
func (c *Compose) loadBackends(ctx context.Context) error {
	admin := newAdminClient(c.admin, 1)
	defer admin.close()
	var v struct {
		Backends []struct {
			ID   string `json:"id"`
			URL  string `json:"url"`
			Zone string `json:"zone"`
		} `json:"backends"`
	}
	err := poll(ctx, c.cfg.StartTimeout, 250*time.Millisecond, func() bool {
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		return admin.do(rctx, http.MethodGet, c.routers[0].AdminURL+"/v1/backends", nil, &v) == nil && len(v.Backends) > 0
	})
	if err != nil {
		return fmt.Errorf("%w: no backend list from %s", ErrNotReady, c.routers[0].Name)
	}
	c.backCID = map[string]string{}
	var bs []Backend
	for _, b := range v.Backends {
		id, err := c.containerOf(ctx, b.ID)
		if err != nil {
			return fmt.Errorf("backend %s: %w (the chaos suite expects backend ids to be compose service names)", b.ID, err)
		}
		c.backCID[b.ID] = id
		bs = append(bs, Backend{ID: b.ID, URL: b.URL, Zone: b.Zone})
	}
	sort.Slice(bs, func(i, j int) bool { return bs[i].ID < bs[j].ID })
	c.mu.Lock()
	c.backends = bs
	c.mu.Unlock()
	return c.refreshMetrics(ctx)
}

// refreshMetrics reads each backend container's backbone address (it may
// change when the container restarts).
func (c *Compose) refreshMetrics(ctx context.Context) error {
	network := c.project + "_backbone"
	c.mu.Lock()
	bs := append([]Backend(nil), c.backends...)
	c.mu.Unlock()
	for i, b := range bs {
		ip, err := c.docker(ctx, "inspect", "--format",
			fmt.Sprintf(`{{with index .NetworkSettings.Networks %q}}{{.IPAddress}}{{end}}`, network), c.backCID[b.ID])
		if err != nil {
			return err
		}
		if ip == "" {
			bs[i].MetricsURL = ""
			continue
		}
		bs[i].MetricsURL = "http://" + ip + ":8000/metrics"
	}
	c.mu.Lock()
	c.backends = bs
	c.mu.Unlock()
	return nil
}

func (c *Compose) router(name string) (*composeRouter, error) {
	for _, r := range c.routers {
		if r.Name == name {
			return r, nil
		}
	}
	return nil, fmt.Errorf("%w: no router %q", ErrTarget, name)
}

// dockerOn runs `docker args...` with the named router's container as the
// last argument.
func (c *Compose) dockerOn(ctx context.Context, name string, args ...string) (*composeRouter, error) {
	r, err := c.router(name)
	if err != nil {
		return nil, err
	}
	_, err = c.docker(ctx, append(args, r.container)...)
	return r, err
}

// KillRouter implements Target (docker kill).
func (c *Compose) KillRouter(ctx context.Context, name string) error {
	_, err := c.dockerOn(ctx, name, "kill")
	return err
}

// StartRouter implements Target (docker start; the Raft state is on its
// volume).
func (c *Compose) StartRouter(ctx context.Context, name string) error {
	_, err := c.dockerOn(ctx, name, "start")
	return err
}

// PauseRouter implements Target (docker pause).
func (c *Compose) PauseRouter(ctx context.Context, name string) error {
	r, err := c.dockerOn(ctx, name, "pause")
	if err == nil {
		r.paused = true
	}
	return err
}

// ResumeRouter implements Target (docker unpause).
func (c *Compose) ResumeRouter(ctx context.Context, name string) error {
	r, err := c.router(name)
	if err != nil {
		return err
	}
	if !r.paused {
		return nil
	}
	if _, err := c.docker(ctx, "unpause", r.container); err != nil {
		return err
	}
	r.paused = false
	return nil
}

// CanPartition implements Target.
func (c *Compose) CanPartition() error { return nil }

// PartitionRouter implements Target: the router leaves the backbone, so it
// loses its peers and the other zones' backends, and keeps its clients
// (edge) and its own zone.
func (c *Compose) PartitionRouter(ctx context.Context, name string) error {
	r, err := c.dockerOn(ctx, name, "network", "disconnect", c.project+"_backbone")
	if err == nil {
		r.cut = true
	}
	return err
}

// HealRouter implements Target: back on the backbone with its address.
func (c *Compose) HealRouter(ctx context.Context, name string) error {
	r, err := c.router(name)
	if err != nil {
		return err
	}
	if !r.cut {
		return nil
	}
	if _, err := c.docker(ctx, "network", "connect", "--ip", r.backbone, c.project+"_backbone", r.container); err != nil {
		return err
	}
	r.cut = false
	return nil
}

func (c *Compose) backendContainer(id string) (string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	cid, ok := c.backCID[id]
	if !ok {
		return "", fmt.Errorf("%w: no backend %q", ErrTarget, id)
	}
	return cid, nil
}

// KillBackend implements Target (docker kill).
func (c *Compose) KillBackend(ctx context.Context, id string) error {
	cid, err := c.backendContainer(id)
	if err != nil {
		return err
	}
	_, err = c.docker(ctx, "kill", cid)
	return err
}

// StartBackend implements Target (docker start), and waits until its
// metrics answer.
func (c *Compose) StartBackend(ctx context.Context, id string) error {
	cid, err := c.backendContainer(id)
	if err != nil {
		return err
	}
	if _, err := c.docker(ctx, "start", cid); err != nil {
		return err
	}
	if err := c.refreshMetrics(ctx); err != nil {
		return err
	}
	return c.waitMetrics(ctx, id)
}

func (c *Compose) waitMetrics(ctx context.Context, id string) error {
	hc := &http.Client{Timeout: time.Second, Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true}}
	return poll(ctx, c.cfg.StartTimeout, 100*time.Millisecond, func() bool {
		for _, b := range c.Backends() {
			if b.ID != id || b.MetricsURL == "" {
				continue
			}
			resp, err := hc.Get(b.MetricsURL)
			if err != nil {
				return false
			}
			resp.Body.Close()
			return resp.StatusCode == http.StatusOK
		}
		return false
	})
}

// StopAll implements Target (compose stop: SIGTERM, routers drain).
func (c *Compose) StopAll(ctx context.Context) error {
	_, err := c.dc(ctx, "stop", "-t", "15")
	return err
}

// StartAll implements Target (compose up -d). The containers are looked
// up again, should compose have recreated any.
func (c *Compose) StartAll(ctx context.Context) error {
	if _, err := c.dc(ctx, "up", "-d", "--no-build"); err != nil {
		return err
	}
	for _, r := range c.routers {
		id, err := c.containerOf(ctx, r.service)
		if err != nil {
			return err
		}
		r.container = id
	}
	c.mu.Lock()
	ids := make([]string, 0, len(c.backCID))
	for id := range c.backCID {
		ids = append(ids, id)
	}
	c.mu.Unlock()
	for _, id := range ids {
		cid, err := c.containerOf(ctx, id)
		if err != nil {
			return err
		}
		c.mu.Lock()
		c.backCID[id] = cid
		c.mu.Unlock()
	}
	return c.refreshMetrics(ctx)
}

// Close implements Target: compose down -v, and the secrets go.
func (c *Compose) Close() error {
	c.closeOnce.Do(func() {
		ctx := context.Background()
		var errs []error
		if c.up {
			for _, r := range c.routers {
				if r.paused {
					_, _ = c.docker(ctx, "unpause", r.container)
				}
			}
			if c.cfg.Keep {
				c.logf("stack kept: COMPOSE_PROJECT_NAME=%s WR_NET=%s %s -f %s down -v", c.project, c.net, strings.Join(c.compose, " "), c.cfg.File)
			} else if _, err := c.dc(ctx, "down", "-v", "--remove-orphans", "-t", "5"); err != nil {
				errs = append(errs, err)
			}
		}
		if c.tmp != "" && !c.cfg.Keep {
			errs = append(errs, os.RemoveAll(c.tmp))
		}
		c.closeErr = errors.Join(errs...)
	})
	return c.closeErr
}

// lastLines returns the last n lines of s.
func lastLines(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
