package deploy

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/warmroute/warmroute/internal/identity"
	"go.yaml.in/yaml/v3"
)

const (
	dashboardPath = "grafana/dashboards/warmroute.json"
	rulesPath     = "prometheus/warmroute-rules.yml"
)

type dashboard struct {
	UID        string `json:"uid"`
	Templating struct {
		List []struct {
			Name       string          `json:"name"`
			Query      json.RawMessage `json:"query"`
			Definition string          `json:"definition"`
		} `json:"list"`
	} `json:"templating"`
	Panels []panel `json:"panels"`
}

type panel struct {
	ID      int    `json:"id"`
	Type    string `json:"type"`
	Title   string `json:"title"`
	GridPos struct {
		H, W, X, Y int
	} `json:"gridPos"`
	Targets []struct {
		Expr         string `json:"expr"`
		RefID        string `json:"refId"`
		LegendFormat string `json:"legendFormat"`
	} `json:"targets"`
	FieldConfig struct {
		Defaults struct {
			Unit       string `json:"unit"`
			Thresholds struct {
				Steps []thresholdStep `json:"steps"`
			} `json:"thresholds"`
		} `json:"defaults"`
	} `json:"fieldConfig"`
}

// thresholdStep is a colour from a value on (nil: from the lowest).
type thresholdStep struct {
	Color string   `json:"color"`
	Value *float64 `json:"value"`
}

func loadDashboard(t *testing.T) *dashboard {
	t.Helper()
	var d dashboard
	if err := json.Unmarshal(readFile(t, dashboardPath), &d); err != nil {
		t.Fatal(err)
	}
	return &d
}

func (d *dashboard) exprs() []string {
	var out []string
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			out = append(out, tg.Expr)
		}
	}
	return out
}

type ruleFile struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []struct {
			Record string `yaml:"record"`
			Alert  string `yaml:"alert"`
			Expr   string `yaml:"expr"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

func ruleExprs(t *testing.T) []string {
	t.Helper()
	var rf ruleFile
	if err := yaml.Unmarshal(readFile(t, rulesPath), &rf); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			out = append(out, r.Expr)
		}
	}
	if len(out) == 0 {
		t.Fatal("no rules")
	}
	return out
}

// metricNames returns the warmroute_* and engine (vllm:*, sglang:*,
// tgi_*) series names an expression reads.
var metricName = regexp.MustCompile(`\b(warmroute_[a-z0-9_]+|vllm:[a-z0-9_:]+|sglang:[a-z0-9_:]+|tgi_[a-z0-9_]+)`)

func metricNames(exprs []string) []string {
	var out []string
	for _, e := range exprs {
		out = append(out, metricName.FindAllString(e, -1)...)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

var grafanaVar = regexp.MustCompile(`\$\{?([A-Za-z_][A-Za-z0-9_]*)`)

func TestDashboardShape(t *testing.T) {
	d := loadDashboard(t)
	if d.UID == "" {
		t.Error("dashboard has no uid")
	}
	vars := map[string]bool{"__rate_interval": true, "__interval": true, "__range": true}
	for _, v := range d.Templating.List {
		vars[v.Name] = true
	}
	ids := map[int]bool{}
	for _, p := range d.Panels {
		if ids[p.ID] {
			t.Errorf("panel %q: duplicate id %d", p.Title, p.ID)
		}
		ids[p.ID] = true
		if p.GridPos.X+p.GridPos.W > 24 || p.GridPos.W <= 0 || p.GridPos.H <= 0 {
			t.Errorf("panel %q: gridPos %+v outside the 24-column grid", p.Title, p.GridPos)
		}
		if p.Type != "row" && len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			if strings.TrimSpace(tg.Expr) == "" || tg.RefID == "" {
				t.Errorf("panel %q: empty query or refId", p.Title)
			}
			for _, m := range grafanaVar.FindAllStringSubmatch(tg.Expr, -1) {
				if !vars[m[1]] {
					t.Errorf("panel %q uses $%s, which is not a dashboard variable", p.Title, m[1])
				}
			}
		}
	}
	// What the dashboard is for: decisions, hit rate, in-flight, epoch,
	// members.
	all := strings.Join(d.exprs(), "\n")
	for _, want := range []string{
		"warmroute_requests_total", `decision="affinity"`, "vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total",
		"warmroute_backend_in_flight", "warmroute_ring_epoch", "warmroute_gossip_members", "warmroute_raft_state",
		"warmroute_cache_answers_total",
	} {
		if !strings.Contains(all, want) {
			t.Errorf("no panel queries %s", want)
		}
	}
}

// promtool runs promtool when it is installed (Debian: apt-get install
// prometheus).
func promtool(t *testing.T, args ...string) {
	t.Helper()
	pt, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("promtool not installed")
	}
	out, err := exec.Command(pt, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// withScrapeSecrets rewrites the directories a Prometheus config reads the
// routers' CA and admin token from (mounted in production) to a temporary
// one holding such files, so promtool finds them.
func withScrapeSecrets(t *testing.T, b []byte, mountDir string) []byte {
	t.Helper()
	dir := t.TempDir()
	ca, err := identity.NewCA("promtool check", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "warmroute-ca.pem"), ca.CertPEM(), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "admin.token"), []byte("token"), 0o600); err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(b, []byte(mountDir+"/")) {
		t.Fatalf("the config reads nothing from %s", mountDir)
	}
	return bytes.ReplaceAll(b, []byte(mountDir+"/"), []byte(dir+"/"))
}

// checkPromConfig runs promtool check config on the Prometheus config
// promYAML, next to the rules file it loads.
func checkPromConfig(t *testing.T, promYAML []byte) {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), promYAML, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "warmroute-rules.yml"), readFile(t, rulesPath), 0o644); err != nil {
		t.Fatal(err)
	}
	promtool(t, "check", "config", filepath.Join(dir, "prometheus.yml"))
}

func TestPrometheusConfigs(t *testing.T) {
	t.Run("rules", func(t *testing.T) { promtool(t, "check", "rules", rulesPath) })
	t.Run("compose", func(t *testing.T) {
		b := readFile(t, "prometheus/prometheus-compose.yml")
		checkPromConfig(t, withScrapeSecrets(t, b, composePromSecrets))
	})
	t.Run("kubernetes", func(t *testing.T) {
		// Debian's promtool is built without Kubernetes service discovery:
		// check the rest of the file (relabelling) with static targets.
		b := withScrapeSecrets(t, readFile(t, "prometheus/prometheus-k8s.yml"), k8sPromSecrets)
		sd := regexp.MustCompile(`(?m)^(\s*)kubernetes_sd_configs:\n\s*- role: pod\n`)
		if len(sd.FindAll(b, -1)) != 2 {
			t.Fatal("expected two kubernetes_sd_configs blocks")
		}
		checkPromConfig(t, sd.ReplaceAll(b, []byte("${1}static_configs:\n${1}  - targets: [\"127.0.0.1:9090\"]\n")))
	})
	t.Run("dashboard queries", func(t *testing.T) {
		// Every panel query must parse as PromQL once Grafana's variables
		// are substituted: write them as recording rules and check those.
		r := strings.NewReplacer("$__rate_interval", "1m", "${datasource}", "", "$instance", ".*", "$backend", ".*")
		var buf bytes.Buffer
		buf.WriteString("groups:\n  - name: dashboard\n    rules:\n")
		for i, e := range loadDashboard(t).exprs() {
			q, _ := json.Marshal(r.Replace(e))
			fmt.Fprintf(&buf, "      - record: dashboard:query%d\n        expr: %s\n", i, q)
		}
		path := filepath.Join(t.TempDir(), "dashboard-rules.yml")
		if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
		promtool(t, "check", "rules", path)
	})
}

// Where the Prometheus configs read the routers' CA and the admin token.
const (
	composePromSecrets = "/etc/prometheus/secrets"
	k8sPromSecrets     = "/etc/prometheus/warmroute"
)

// scrapeJob is the part of a Prometheus scrape job that says how it
// reaches its targets.
type scrapeJob struct {
	JobName   string `yaml:"job_name"`
	Scheme    string `yaml:"scheme"`
	TLSConfig struct {
		CAFile             string `yaml:"ca_file"`
		ServerName         string `yaml:"server_name"`
		InsecureSkipVerify bool   `yaml:"insecure_skip_verify"`
	} `yaml:"tls_config"`
	Authorization struct {
		CredentialsFile string `yaml:"credentials_file"`
	} `yaml:"authorization"`
	StaticConfigs []struct {
		Targets []string `yaml:"targets"`
	} `yaml:"static_configs"`
}

func routerJob(t *testing.T, file string) scrapeJob {
	t.Helper()
	var cfg struct {
		ScrapeConfigs []scrapeJob `yaml:"scrape_configs"`
	}
	if err := yaml.Unmarshal(readFile(t, file), &cfg); err != nil {
		t.Fatal(err)
	}
	for _, j := range cfg.ScrapeConfigs {
		if j.JobName == "warmroute" {
			return j
		}
	}
	t.Fatalf("%s: no warmroute job", file)
	return scrapeJob{}
}

// checkRouterJob checks that a job scrapes the routers as their admin
// listener requires with cluster TLS: HTTPS verified against the cluster
// CA (host names too) and the admin token, both from secretsDir.
func checkRouterJob(j scrapeJob, secretsDir string) []error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if j.Scheme != "https" {
		bad("scheme %q: the routers' admin port serves HTTPS", j.Scheme)
	}
	if j.TLSConfig.InsecureSkipVerify {
		bad("insecure_skip_verify: the routers' certificates must be verified")
	}
	if j.TLSConfig.CAFile != secretsDir+"/warmroute-ca.pem" {
		bad("tls_config.ca_file %q: want the cluster CA, %s/warmroute-ca.pem", j.TLSConfig.CAFile, secretsDir)
	}
	if j.Authorization.CredentialsFile != secretsDir+"/admin.token" {
		bad("authorization.credentials_file %q: want the admin token, %s/admin.token", j.Authorization.CredentialsFile, secretsDir)
	}
	return errs
}

// TestPrometheusScrapesRoutersOverTLS: both Prometheus configs scrape the
// routers over verified HTTPS with the admin token, from files their
// deployment mounts, under a name the routers' certificates carry.
func TestPrometheusScrapesRoutersOverTLS(t *testing.T) {
	t.Run("compose", func(t *testing.T) {
		j := routerJob(t, "prometheus/prometheus-compose.yml")
		for _, err := range checkRouterJob(j, composePromSecrets) {
			t.Error(err)
		}
		// Targets are the routers' service names, which init-secrets.sh
		// puts in each certificate as its DNS name.
		f := loadCompose(t)
		routers := f.names("serve")
		for _, sc := range j.StaticConfigs {
			for _, tg := range sc.Targets {
				host, port, _ := strings.Cut(tg, ":")
				if !slices.Contains(routers, host) || port != "9090" {
					t.Errorf("target %s is not a router's admin port", tg)
				}
			}
		}
		if j.TLSConfig.ServerName != "" {
			t.Errorf("server_name %q: the target names are in the certificates", j.TLSConfig.ServerName)
		}
		if init := readFile(t, "compose/init-secrets.sh"); !strings.Contains(string(init), "--dns '{name}'") {
			t.Error("init-secrets.sh does not put the router's name in its certificate as a DNS name")
		}
		prom := f.Services["prometheus"]
		if prom == nil {
			t.Fatal("no prometheus service")
		}
		src, ok := prom.mountOf(composePromSecrets + "/admin.token")
		if !ok || path.Base(src) != "prometheus" {
			t.Errorf("the prometheus service mounts %q at %s, want the secrets' prometheus directory", src, composePromSecrets)
		}
	})
	t.Run("kubernetes", func(t *testing.T) {
		j := routerJob(t, "prometheus/prometheus-k8s.yml")
		for _, err := range checkRouterJob(j, k8sPromSecrets) {
			t.Error(err)
		}
		// Targets are pod IPs: the name checked is the headless Service's,
		// which docs/deploy.md puts in every router certificate.
		m := loadManifests(t)
		want := m.router().Spec.ServiceName + ".warmroute.svc"
		if j.TLSConfig.ServerName != want {
			t.Errorf("server_name %q, want %q", j.TLSConfig.ServerName, want)
		}
		if doc := readFile(t, filepath.Join(repoRoot, "docs", "deploy.md")); !strings.Contains(string(doc), "--dns "+want) {
			t.Errorf("docs/deploy.md does not issue the router certificates with --dns %s", want)
		}
	})
}

// eventOnly are labelled series that show up on /metrics only after
// their first event; they are checked against the source instead.
var eventOnly = map[string]string{
	"warmroute_retries_total":           "proxy/metrics.go",
	"warmroute_client_aborts_total":     "proxy/metrics.go",
	"warmroute_backend_ejections_total": "proxy/metrics.go",
	"warmroute_upstream_errors_total":   "proxy/metrics.go",
	// Known once the engine's prefix-cache counters grew between two
	// scrapes.
	"warmroute_backend_engine_prefix_hit_rate": "node/admin/metrics.go",
}

// TestDashboardMetricsExist runs a router (in cluster mode with Raft, alone) in
// front of one gpusim instance, sends a streamed request through it, and
// checks that every metric the dashboard and the rules query is exported.
func TestDashboardMetricsExist(t *testing.T) {
	bin := warmrouteBinary(t)
	flags := serveFlags(t)
	if !flags["raft-listen"] || !flags["data-dir"] || !flags["bootstrap-expect"] {
		t.Fatal("warmroute serve has no Raft flags")
	}

	gpusim := exec.Command(bin, "gpusim", "--listen", "127.0.0.1:0", "--instances", "1", "--time-scale", "0.05", "--name-prefix", "g-")
	out, err := gpusim.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	gpusim.Stderr = os.Stderr
	if err := gpusim.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { gpusim.Process.Kill(); gpusim.Wait() })
	engineURL := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if _, u, ok := strings.Cut(sc.Text(), " at "); ok {
				engineURL <- strings.TrimSpace(u)
				break
			}
		}
		io.Copy(io.Discard, out)
	}()
	var engine string
	select {
	case engine = <-engineURL:
	case <-time.After(60 * time.Second):
		t.Fatal("gpusim did not print its address")
	}

	traffic, admin := freePort(t), freePort(t)
	args := []string{"serve",
		"--listen", fmt.Sprintf("127.0.0.1:%d", traffic),
		"--admin-listen", fmt.Sprintf("127.0.0.1:%d", admin),
		"--backends", "g=" + engine,
		"--node-name", "t1",
		"--gossip-listen", fmt.Sprintf("127.0.0.1:%d", freePort(t)),
		"--engine-scrape-interval", "200ms",
		"--log-level", "warn",
	}
	args = append(args, "--raft-listen", fmt.Sprintf("127.0.0.1:%d", freePort(t)),
		"--data-dir", t.TempDir(), "--bootstrap-expect", "1")
	router := exec.Command(bin, args...)
	router.Stdout, router.Stderr = os.Stderr, os.Stderr
	if err := router.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { router.Process.Kill(); router.Wait() })

	client := &http.Client{Timeout: 10 * time.Second}
	base := fmt.Sprintf("http://127.0.0.1:%d", traffic)
	poll(t, "router ready", 60*time.Second, func() error {
		resp, err := client.Get(base + "/readyz")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			return fmt.Errorf("readyz %d", resp.StatusCode)
		}
		return nil
	})
	body := `{"model":"meta-llama/Llama-3.1-70B-Instruct","stream":true,"max_tokens":4,"messages":[{"role":"user","content":"metrics check"}]}`
	resp, err := client.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	sse, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !bytes.Contains(sse, []byte("data: [DONE]")) {
		t.Fatalf("streamed request: %d %s", resp.StatusCode, sse)
	}

	scrape := func(u string) map[string]bool {
		resp, err := client.Get(u)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		names := map[string]bool{}
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			if line == "" || strings.HasPrefix(line, "#") {
				continue
			}
			if i := strings.IndexAny(line, "{ "); i > 0 {
				names[line[:i]] = true
			}
		}
		return names
	}
	want := metricNames(append(loadDashboard(t).exprs(), ruleExprs(t)...))
	var have map[string]bool
	// The engine and gossip figures appear within a scrape interval or two.
	poll(t, "metrics exported", 30*time.Second, func() error {
		have = scrape(fmt.Sprintf("http://127.0.0.1:%d/metrics", admin))
		for n := range scrape(engine + "/metrics") {
			have[n] = true
		}
		if !have["warmroute_requests_total"] || !have["vllm:prefix_cache_hits_total"] || !have["warmroute_backend_engine_kv_usage"] {
			return fmt.Errorf("have %d names", len(have))
		}
		return nil
	})
	otherEngines := otherEngineNames()
	for _, n := range want {
		switch src, ok := eventOnly[n]; {
		case have[n]:
		case slices.Contains(otherEngines, n):
		case ok:
			b, err := os.ReadFile(filepath.Join(repoRoot, src))
			if err != nil || !bytes.Contains(b, []byte(`"`+n+`"`)) {
				t.Errorf("%s: not exported yet and not defined in %s", n, src)
			}
		default:
			t.Errorf("dashboard or rules query %s, which neither the router nor gpusim exports", n)
		}
	}
	t.Logf("checked %d metric names", len(want))
}
