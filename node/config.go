package node

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/warmroute/warmroute/internal/backendspec"
	"github.com/warmroute/warmroute/internal/bytesize"
	"github.com/warmroute/warmroute/internal/identity"
	"github.com/warmroute/warmroute/proxy"
	"github.com/warmroute/warmroute/proxy/reqlog"
	"github.com/warmroute/warmroute/ring"
	"go.yaml.in/yaml/v3"
)

// Config is one router node's configuration: defaults, then the YAML file,
// then WARMROUTE_* environment variables, then flags.
type Config struct {
	// Listen is the client-facing address (OpenAI API, /invocations).
	Listen string `yaml:"listen"`
	// AdminListen serves /metrics, /status and /debug/route. Loopback by
	// default.
	AdminListen string `yaml:"admin_listen"`
	// Backends seeds the backend set.
	Backends []backendspec.Spec `yaml:"backends"`
	Routing  ring.Settings      `yaml:"routing"`
	// Limits, Upstream and Health are the proxy's settings, declared
	// there once and handed to it whole (ProxyConfig).
	Limits   proxy.Limits   `yaml:"limits"`
	Upstream proxy.Upstream `yaml:"upstream"`
	Health   proxy.Health   `yaml:"health"`
	Log      Log            `yaml:"log"`
	Cluster  ClusterConfig  `yaml:"cluster"`
	Engine   Engine         `yaml:"engine"`
	Admin    Admin          `yaml:"admin"`
	TLS      TLS            `yaml:"tls"`
	// ExtProc is the endpoint-picker listener (off by default).
	ExtProc ExtProc `yaml:"ext_proc"`
	// AccessLog, Tracing and Record are what the router reports of each
	// request: a log line, OpenTelemetry spans, a replayable trace.
	AccessLog AccessLog `yaml:"access_log"`
	Tracing   Tracing   `yaml:"tracing"`
	Record    Record    `yaml:"record"`
	// ShutdownTimeout is how long open streams may finish on shutdown.
	ShutdownTimeout time.Duration `yaml:"shutdown_timeout"`

	// SageMaker accepts SageMaker's RoutingConfig block verbatim.
	SageMaker *SageMakerRouting `yaml:"RoutingConfig,omitempty"`
}

// SageMakerRouting is SageMaker's RoutingConfig shape.
type SageMakerRouting struct {
	RoutingStrategy          string `yaml:"RoutingStrategy"`
	PrefixAwareRoutingConfig struct {
		PrefixLength         int `yaml:"PrefixLength"`
		ConcurrencyThreshold int `yaml:"ConcurrencyThreshold"`
	} `yaml:"PrefixAwareRoutingConfig"`
}

// ClusterConfig configures membership, load sharing and agreement with other
// router nodes. With GossipListen empty the node runs alone.
//
// Each field's tags name it everywhere, as proxy.Limits' do: yaml under
// the cluster: block, flag the serve flag (and its WARMROUTE_ variable),
// help the flag's help text; env, instead of flag, a secret that only its
// variable carries.
type ClusterConfig struct {
	// NodeName identifies the node: letters, digits, '.', '_' and '-'.
	// Default: the name in the cluster certificate when there is one,
	// else the host name. With a cluster certificate it must be the name
	// the certificate proves.
	NodeName string `yaml:"node_name" flag:"node-name" help:"this router's name in the cluster (unique, stable; letters, digits, '.', '_', '-'); default: the name in --cluster-tls-cert-file, else the host name"`
	// GossipListen turns cluster mode on: memberlist's TCP and UDP address.
	GossipListen string `yaml:"gossip_listen" flag:"gossip-listen" help:"gossip address (TCP and UDP), e.g. 0.0.0.0:7946; empty runs the router alone"`
	// GossipAdvertise is the address other nodes reach this one on.
	GossipAdvertise string `yaml:"gossip_advertise" flag:"gossip-advertise" help:"address other routers reach this one on, when it differs from --gossip-listen"`
	// Join lists seeds: host:port, host, or a DNS name whose A records are
	// seeds (a headless Kubernetes Service).
	Join []string `yaml:"join" flag:"join" help:"comma-separated seeds: host:port, host, or a DNS name whose A records are seeds"`
	// GossipKeyFile holds the base64 gossip key (16, 24 or 32 bytes);
	// WARMROUTE_GOSSIP_KEY may carry it instead.
	GossipKeyFile string `yaml:"gossip_key_file" flag:"gossip-key-file" help:"file holding the base64 gossip encryption key (16, 24 or 32 bytes); or WARMROUTE_GOSSIP_KEY"`
	// GossipKey is the key itself: a secret, so only its variable carries
	// it, never a flag (process lists show flags) or the file.
	GossipKey string `yaml:"-" env:"WARMROUTE_GOSSIP_KEY" help:"the base64 gossip encryption key itself, instead of --gossip-key-file"`
	// AllowPlaintextGossip permits an unencrypted cluster on non-loopback
	// addresses.
	AllowPlaintextGossip bool `yaml:"allow_plaintext_gossip" flag:"allow-plaintext-gossip" help:"allow an unencrypted cluster on non-loopback addresses"`
	// AllowInsecureCluster permits cluster mode on non-loopback addresses
	// without cluster TLS: Raft, forwarded admin writes and gossiped
	// figures are then accepted from anyone who reaches the cluster
	// ports (and knows the gossip key). For networks where every host is
	// trusted.
	AllowInsecureCluster bool `yaml:"allow_insecure_cluster" flag:"allow-insecure-cluster" help:"allow cluster mode on non-loopback addresses without cluster TLS (Raft, admin forwarding and gossiped figures then trust anyone who reaches the cluster ports): trusted networks only"`
	// PublishInterval is how often this node shares its in-flight counts.
	PublishInterval time.Duration `yaml:"publish_interval" flag:"publish-interval" help:"how often this router shares its in-flight counts"`
	// Zone is this router's availability zone.
	Zone string `yaml:"zone" flag:"zone" help:"this router's availability zone"`

	// RaftListen is the Raft transport address (cluster mode). Default:
	// the gossip address's host, port gossip port + 1 (7947 next to 7946).
	RaftListen string `yaml:"raft_listen" flag:"raft-listen" help:"Raft transport address (cluster mode); default: --gossip-listen's host, its port + 1"`
	// RaftAdvertise is the Raft address other nodes dial, when it differs.
	RaftAdvertise string `yaml:"raft_advertise" flag:"raft-advertise" help:"Raft address other routers dial, when it differs from --raft-listen"`
	// DataDir keeps the Raft log, snapshots and the last applied state.
	// Empty keeps them in memory: the node then re-seeds from its config on
	// every start.
	DataDir string `yaml:"data_dir" flag:"data-dir" help:"directory for the Raft log, snapshots and the last agreed state (empty: memory only, re-seeded from the config on every start)"`
	// BootstrapExpect is how many voter-eligible routers form a new cluster
	// (set the same N on the first N routers; 1 for a single seed). 0 waits
	// to be added by an existing cluster's leader.
	BootstrapExpect int `yaml:"bootstrap_expect" flag:"bootstrap-expect" help:"routers that form a new cluster: the same N on the first N routers (1 for a single seed); 0 joins an existing cluster"`
	// Voters is how many routers vote in Raft (1, 3 or 5); the others
	// follow as non-voters.
	Voters int `yaml:"voters" flag:"voters" help:"Raft voters the leader keeps (1, 3 or 5); other routers follow as non-voters"`
	// NonVoter keeps this router from ever voting.
	NonVoter bool `yaml:"non_voter" flag:"non-voter" help:"never take a Raft vote"`
	// DeadNodeTimeout is how long a router may be gone before the leader
	// removes it from Raft.
	DeadNodeTimeout time.Duration `yaml:"dead_node_timeout" flag:"dead-node-timeout" help:"how long a router may be gone before the leader removes it from Raft"`
	// RaftTimeout scales Raft's heartbeat and election timeouts (the default
	// 1s elects a new leader in 1.4-2 s).
	RaftTimeout time.Duration `yaml:"raft_timeout" flag:"raft-timeout" help:"Raft heartbeat and election timeout (failover takes about 1.5-2x this)"`

	// DiscoveryDNS polls DNS for backends: an A/AAAA name (with
	// DiscoveryPort) or an SRV name starting with '_'.
	DiscoveryDNS      string        `yaml:"discovery_dns" flag:"discovery-dns" help:"DNS name polled for backends: A/AAAA (with --discovery-port) or SRV (a name starting with '_')"`
	DiscoveryPort     int           `yaml:"discovery_port" flag:"discovery-port" help:"backend port for A/AAAA discovery"`
	DiscoveryInterval time.Duration `yaml:"discovery_interval" flag:"discovery-interval" help:"DNS or Kubernetes discovery polling interval"`

	// Kubernetes discovery (node/kube), polled every DiscoveryInterval
	// like DNS, instead of it: the ready pods of an InferencePool
	// (DiscoveryK8sPool), or of a label selector on DiscoveryK8sPorts.
	DiscoveryK8sPool       string   `yaml:"discovery_k8s_pool" flag:"discovery-k8s-pool" help:"find backends in Kubernetes: the ready pods of this InferencePool (inference.networking.k8s.io/v1), each podIP:targetPort"`
	DiscoveryK8sSelector   string   `yaml:"discovery_k8s_selector" flag:"discovery-k8s-selector" help:"find backends in Kubernetes: the ready pods of this label selector (with --discovery-k8s-ports)"`
	DiscoveryK8sPorts      PortList `yaml:"discovery_k8s_ports" flag:"discovery-k8s-ports" help:"the backends' ports for --discovery-k8s-selector, comma-separated (1-8)"`
	DiscoveryK8sNamespace  string   `yaml:"discovery_k8s_namespace" flag:"discovery-k8s-namespace" help:"namespace of the pool and its pods (default: this pod's)"`
	DiscoveryK8sKubeconfig string   `yaml:"discovery_k8s_kubeconfig" flag:"discovery-k8s-kubeconfig" help:"kubeconfig file for Kubernetes discovery (default: the pod's service account)"`
}

// Admin configures the admin API's authentication.
type Admin struct {
	// TokenFile holds the bearer token admin writes need (and reads from
	// off loopback); WARMROUTE_ADMIN_TOKEN may carry it instead. Without a
	// token, admin writes are accepted only from loopback clients.
	TokenFile string `yaml:"token_file" flag:"admin-token-file" help:"file holding the admin API bearer token (or WARMROUTE_ADMIN_TOKEN); without one, admin writes are accepted from loopback only"`
	// Token is the token itself: a secret, so only its variable carries
	// it.
	Token string `yaml:"-" env:"WARMROUTE_ADMIN_TOKEN" help:"the admin API bearer token itself, instead of --admin-token-file"`
	// Insecure allows an admin listener on a non-loopback address without
	// a token (anyone who reaches it may read status and explain routes;
	// writes are still refused off loopback).
	Insecure bool `yaml:"insecure" flag:"admin-insecure" help:"allow an admin listener reachable from other hosts without an admin token"`
	// PublicMetrics serves /metrics to other hosts without the token, as
	// reads without a token are (Insecure, or no token set). Off by
	// default: with a token, every read from another host needs it.
	PublicMetrics bool `yaml:"public_metrics" flag:"admin-public-metrics" help:"serve /metrics to other hosts without the admin token (reads from loopback never need it)"`
}

// token returns the configured admin token ("" when none).
func (a *Admin) token() (string, error) {
	if t := strings.TrimSpace(a.Token); t != "" {
		return t, nil
	}
	if a.TokenFile == "" {
		return "", nil
	}
	b, err := os.ReadFile(a.TokenFile)
	if err != nil {
		return "", fmt.Errorf("admin token file: %w", err)
	}
	t := strings.TrimSpace(string(b))
	if t == "" {
		return "", fmt.Errorf("admin token file %s is empty", a.TokenFile)
	}
	return t, nil
}

// Engine configures scraping of the engines' Prometheus metrics (KV-cache
// use, queue depth, prefix hit rate).
type Engine struct {
	// MetricsPath is appended to each backend's URL; empty turns scraping
	// off.
	MetricsPath string `yaml:"metrics_path" flag:"engine-metrics-path" help:"path of the engines' Prometheus metrics on each backend (empty: do not scrape)"`
	// Interval between scrapes of one backend.
	Interval time.Duration `yaml:"interval" flag:"engine-scrape-interval" help:"engine metrics scrape interval"`
	// Timeout of one scrape.
	Timeout time.Duration `yaml:"timeout" flag:"engine-scrape-timeout" help:"engine metrics scrape timeout"`
}

// AccessLog configures the access log: a line per request with its
// route, model, tenant hash, backend, decision, status, sizes and times;
// never prompt text.
type AccessLog struct {
	// Mode is "off", "on" (every request) or a sampling rate in (0, 1]
	// (0.01: one request in a hundred, chosen at random).
	Mode string `yaml:"mode" flag:"access-log" help:"access log: off, on, or a sampling rate in (0, 1]; a line per request (route, model, tenant hash, backend, decision, status, bytes, times; never prompt text)"`
	// Format is "json" or "text" (logfmt).
	Format string `yaml:"format" flag:"access-log-format" help:"access log format: json or text"`
	// Output is "stdout", "stderr" or a file path (appended to).
	Output string `yaml:"output" flag:"access-log-output" help:"access log destination: stdout, stderr or a file path"`
}

// sample returns the share of requests Mode logs.
func (a *AccessLog) sample() (float64, error) {
	switch strings.ToLower(strings.TrimSpace(a.Mode)) {
	case "", "off", "false", "0":
		return 0, nil
	case "on", "true", "1":
		return 1, nil
	}
	r, err := strconv.ParseFloat(a.Mode, 64)
	if err != nil || !(r > 0 && r <= 1) {
		return 0, fmt.Errorf("access log %q: want off, on or a sampling rate in (0, 1]", a.Mode)
	}
	return r, nil
}

// Tracing configures OpenTelemetry tracing: spans exported over OTLP/HTTP.
type Tracing struct {
	// Endpoint is the collector's OTLP/HTTP URL: http://host:4318 (spans
	// go to its /v1/traces) or a full URL with a path. Empty: tracing is
	// off, unless the standard OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or
	// OTEL_EXPORTER_OTLP_ENDPOINT variable is set (OTEL_SDK_DISABLED=true
	// keeps it off). The exporter also reads the other
	// OTEL_EXPORTER_OTLP_* variables (headers, timeout, certificate).
	Endpoint string `yaml:"endpoint" flag:"tracing-endpoint" help:"OpenTelemetry collector's OTLP/HTTP URL (http://host:4318) to export spans to; empty: off, unless OTEL_EXPORTER_OTLP_ENDPOINT is set"`
	// SampleRatio is the share of requests without a sampled parent that
	// are traced; a request whose traceparent says sampled always is
	// (parent-based sampling).
	SampleRatio float64 `yaml:"sample_ratio" flag:"tracing-sample-ratio" help:"share of requests without a sampled traceparent that are traced (0-1); a sampled traceparent is always followed"`
}

// enabled reports whether tracing is on, reading the OTEL_* variables.
func (t *Tracing) enabled() bool {
	if strings.EqualFold(strings.TrimSpace(os.Getenv("OTEL_SDK_DISABLED")), "true") {
		return false
	}
	return t.Endpoint != "" || os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != "" || os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != ""
}

// Record configures the recording of the routed traffic as a trace in
// Mooncake's format, which `warmroute loadtest --trace` replays.
type Record struct {
	// Path is the file; empty turns recording off. An existing file is
	// kept as Path.1.
	Path string `yaml:"path" flag:"record-trace" help:"record the routed traffic to this file as a Mooncake-format trace (replay with warmroute loadtest --trace FILE --trace-block-tokens 256); empty: off"`
	// MaxSize and MaxRecords bound the recording: it stops at either.
	MaxSize    bytesize.Size `yaml:"max_size" flag:"record-trace-max-size" help:"the recording stops at this size"`
	MaxRecords int           `yaml:"max_records" flag:"record-trace-max-records" help:"the recording stops after this many requests (at most 1048576)"`
}

// maxRecordRecords is loadtest/trace's default bound on a file's records:
// a recording stays within it so that it replays as it is.
const maxRecordRecords = 1 << 20

// RequestLogConfig is the reqlog.Config the access log and recording
// settings describe (Registry and Logger left to the caller).
func (c *Config) RequestLogConfig() reqlog.Config {
	sample, _ := c.AccessLog.sample()
	return reqlog.Config{
		AccessSample: sample, AccessFormat: strings.ToLower(c.AccessLog.Format), AccessLog: c.AccessLog.Output,
		RecordPath: c.Record.Path, RecordMaxBytes: int64(c.Record.MaxSize), RecordMaxRecords: c.Record.MaxRecords,
	}
}

// validateObserve checks the access log, tracing and recording settings.
func (c *Config) validateObserve() []error {
	var errs []error
	sample, err := c.AccessLog.sample()
	if err != nil {
		errs = append(errs, err)
	}
	if sample > 0 {
		switch strings.ToLower(c.AccessLog.Format) {
		case reqlog.FormatJSON, reqlog.FormatText:
		default:
			errs = append(errs, fmt.Errorf("access log format %q: want json or text", c.AccessLog.Format))
		}
		if strings.TrimSpace(c.AccessLog.Output) == "" {
			errs = append(errs, errors.New("access log output is empty: want stdout, stderr or a file path"))
		}
	}
	if e := c.Tracing.Endpoint; e != "" {
		u, err := url.Parse(e)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			errs = append(errs, fmt.Errorf("tracing endpoint %q: want an http:// or https:// URL, e.g. http://otel-collector:4318", e))
		}
	}
	if r := c.Tracing.SampleRatio; !(r >= 0 && r <= 1) {
		errs = append(errs, fmt.Errorf("tracing sample ratio %v outside [0, 1]", r))
	}
	if c.Record.Path != "" {
		if c.Record.MaxSize < 1<<20 {
			errs = append(errs, fmt.Errorf("record max size %s: want at least 1MiB", c.Record.MaxSize))
		}
		if c.Record.MaxRecords < 1 || c.Record.MaxRecords > maxRecordRecords {
			errs = append(errs, fmt.Errorf("record max records %d outside [1, %d] (what a trace file may hold)", c.Record.MaxRecords, maxRecordRecords))
		}
		if sample > 0 && c.AccessLog.Output == c.Record.Path {
			errs = append(errs, fmt.Errorf("the access log and the trace recording both write %s", c.Record.Path))
		}
	}
	return errs
}

// Enabled reports whether the node runs in a cluster.
func (c *ClusterConfig) Enabled() bool { return c.GossipListen != "" }

// Log configures logging.
type Log struct {
	Level  string `yaml:"level" flag:"log-level" help:"debug, info, warn or error"`
	Format string `yaml:"format" flag:"log-format" help:"text or json"`
}

// DefaultConfig returns the defaults every knob documents.
func DefaultConfig() Config {
	pc := proxy.DefaultConfig()
	return Config{
		Listen:      ":8080",
		AdminListen: "127.0.0.1:9090",
		Routing:     ring.DefaultSettings(),
		Limits:      pc.Limits,
		Upstream:    pc.Upstream,
		Health:      pc.Health,
		Log:         Log{Level: "info", Format: "text"},
		Cluster: ClusterConfig{PublishInterval: 50 * time.Millisecond,
			Voters: 3, DeadNodeTimeout: 2 * time.Minute, RaftTimeout: time.Second,
			DiscoveryInterval: 10 * time.Second},
		Engine:          Engine{MetricsPath: "/metrics", Interval: time.Second, Timeout: 500 * time.Millisecond},
		AccessLog:       AccessLog{Mode: "off", Format: "json", Output: "stdout"},
		Tracing:         Tracing{SampleRatio: 1},
		Record:          Record{MaxSize: 1 << 30, MaxRecords: maxRecordRecords},
		ExtProc:         defaultExtProc(),
		ShutdownTimeout: 30 * time.Second,
	}
}

// LoadFile reads a YAML config file over c. Unknown keys are errors, so a
// typo never silently falls back to a default.
func (c *Config) LoadFile(path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("config file: %w", err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(c); err != nil && !errors.Is(err, io.EOF) { // io.EOF: an empty file
		return fmt.Errorf("config file %s: %w", path, err)
	}
	return c.applySageMaker()
}

func (c *Config) applySageMaker() error {
	sm := c.SageMaker
	if sm == nil {
		return nil
	}
	if sm.RoutingStrategy != "" {
		s, err := ring.ParseStrategy(sm.RoutingStrategy)
		if err != nil {
			return fmt.Errorf("RoutingConfig.RoutingStrategy: %w", err)
		}
		c.Routing.Strategy = s
	}
	if v := sm.PrefixAwareRoutingConfig.PrefixLength; v != 0 {
		c.Routing.PrefixLength = v
	}
	if v := sm.PrefixAwareRoutingConfig.ConcurrencyThreshold; v != 0 {
		c.Routing.ConcurrencyThreshold = v
	}
	c.SageMaker = nil
	return nil
}

// RingConfig is the ring.Config the routing settings describe, for this
// router's zone.
func (c *Config) RingConfig() ring.Config {
	rc := ring.ConfigFor(c.Routing)
	rc.LocalZone = c.Cluster.Zone
	return rc
}

// ProxyConfig is the proxy.Config the limits, upstream and health settings
// describe.
func (c *Config) ProxyConfig() proxy.Config {
	pc := proxy.DefaultConfig()
	pc.Limits, pc.Upstream, pc.Health = c.Limits, c.Upstream, c.Health
	return pc
}

// Validate reports every problem at once, naming the setting.
func (c *Config) Validate() error {
	var errs []error
	if err := checkListen(c.Listen); err != nil {
		errs = append(errs, fmt.Errorf("listen: %w", err))
	}
	if err := checkListen(c.AdminListen); err != nil {
		errs = append(errs, fmt.Errorf("admin-listen: %w", err))
	}
	rc := c.RingConfig()
	rcErr := rc.Validate()
	if rcErr != nil {
		errs = append(errs, rcErr)
	}
	pc := c.ProxyConfig()
	if err := pc.Validate(); err != nil {
		errs = append(errs, err)
	}
	for _, b := range c.Backends {
		if err := checkModels(b.URL, b.Models); err != nil {
			errs = append(errs, err)
		}
	}
	if rbs, err := c.RingBackends(); err != nil {
		errs = append(errs, err)
	} else if rcErr == nil {
		// What only the whole backend set shows (partition_count below
		// the backend count, too many backends), without building the
		// ring: New builds it once.
		if err := rc.CheckFleet(len(rbs)); err != nil {
			errs = append(errs, fmt.Errorf("routing: %w", err))
		}
	}
	switch strings.ToLower(c.Log.Level) {
	case "debug", "info", "warn", "error":
	default:
		errs = append(errs, fmt.Errorf("log level %q: want debug, info, warn or error", c.Log.Level))
	}
	switch strings.ToLower(c.Log.Format) {
	case "text", "json":
	default:
		errs = append(errs, fmt.Errorf("log format %q: want text or json", c.Log.Format))
	}
	errs = append(errs, c.validateCluster()...)
	errs = append(errs, c.Cluster.validateK8s()...)
	errs = append(errs, c.validateObserve()...)
	errs = append(errs, c.TLS.validate()...)
	errs = append(errs, c.ExtProc.validate(&c.TLS)...)
	if err := c.checkAdminExposure(); err != nil {
		errs = append(errs, err)
	}
	if c.Engine.MetricsPath != "" {
		if c.Engine.MetricsPath[0] != '/' {
			errs = append(errs, fmt.Errorf("engine metrics path %q must start with '/'", c.Engine.MetricsPath))
		}
		if c.Engine.Interval <= 0 || c.Engine.Timeout <= 0 {
			errs = append(errs, fmt.Errorf("engine scrape interval and timeout must be positive"))
		}
	}
	if c.ShutdownTimeout < 0 {
		errs = append(errs, fmt.Errorf("shutdown timeout must not be negative"))
	}
	return errors.Join(errs...)
}

func checkListen(addr string) error {
	if _, port, err := net.SplitHostPort(addr); err != nil {
		return fmt.Errorf("%q is not host:port: %w", addr, err)
	} else if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		return fmt.Errorf("%q: bad port", addr)
	}
	return nil
}

// RingBackends converts the backend specs to ring backends, checking
// addresses and IDs.
func (c *Config) RingBackends() ([]ring.Backend, error) {
	out := make([]ring.Backend, 0, len(c.Backends))
	seen := map[string]bool{}
	for _, s := range c.Backends {
		b, err := ringBackend(s)
		if err != nil {
			return nil, err
		}
		if seen[b.ID] {
			return nil, fmt.Errorf("backend %q listed twice", b.ID)
		}
		seen[b.ID] = true
		out = append(out, b)
	}
	return out, nil
}

// checkModels bounds a declared model list as the agreed state does: at
// most maxBackendModels ids of 1-maxModelID printable ASCII characters.
func checkModels(id string, ms []string) error {
	if len(ms) > maxBackendModels {
		return fmt.Errorf("backend %s: %d models, at most %d", id, len(ms), maxBackendModels)
	}
	for _, m := range ms {
		if m == "" || len(m) > maxModelID || !printableASCII(m) {
			return fmt.Errorf("backend %s: model %q: 1-%d printable ASCII characters", id, m, maxModelID)
		}
	}
	return nil
}

// ringBackend checks a backend spec and returns the ring's view of it.
func ringBackend(b backendspec.Spec) (ring.Backend, error) {
	id, addr, err := b.Check()
	if err != nil {
		return ring.Backend{}, err
	}
	return ring.Backend{ID: id, Addr: addr, Zone: b.Zone, Weight: b.Weight}, nil
}

func hostname() string {
	h, err := os.Hostname()
	if err != nil || h == "" {
		return "warmroute"
	}
	return h
}

func (c *Config) validateCluster() []error {
	cl := &c.Cluster
	if !cl.Enabled() {
		var errs []error
		if len(cl.Join) > 0 {
			errs = append(errs, fmt.Errorf("join is set but gossip-listen is empty: set gossip-listen to run in a cluster"))
		}
		if _, err := c.Admin.token(); err != nil {
			errs = append(errs, err)
		}
		return errs
	}
	var errs []error
	if _, err := c.Admin.token(); err != nil {
		errs = append(errs, err)
	}
	id, idErr := c.TLS.clusterIdentity() // reported by TLS.validate
	name := cl.name(id)
	if err := identity.CheckName(name); err != nil {
		errs = append(errs, fmt.Errorf("node-name: %w", err))
	} else if idErr == nil && id != nil && name != id.Name {
		errs = append(errs, fmt.Errorf("node-name %q differs from the name its cluster certificate proves (%s%s): set --node-name %s, or issue a certificate for %q ('warmroute tls cert create --name %s')",
			name, identity.URNPrefix, id.Name, id.Name, name, name))
	}
	if err := checkListen(cl.GossipListen); err != nil {
		errs = append(errs, fmt.Errorf("gossip-listen: %w", err))
	}
	if cl.GossipAdvertise != "" {
		if err := checkListen(cl.GossipAdvertise); err != nil {
			errs = append(errs, fmt.Errorf("gossip-advertise: %w", err))
		}
	}
	if cl.PublishInterval < 5*time.Millisecond || cl.PublishInterval > 10*time.Second {
		errs = append(errs, fmt.Errorf("publish-interval %s out of range [5ms, 10s]", cl.PublishInterval))
	}
	if _, err := cl.gossipKey(); err != nil {
		errs = append(errs, err)
	}
	if err := checkListen(cl.raftListen()); err != nil {
		errs = append(errs, fmt.Errorf("raft-listen: %w", err))
	}
	if cl.RaftAdvertise != "" {
		if err := checkListen(cl.RaftAdvertise); err != nil {
			errs = append(errs, fmt.Errorf("raft-advertise: %w", err))
		}
	}
	if cl.Voters != 1 && cl.Voters != 3 && cl.Voters != 5 {
		errs = append(errs, fmt.Errorf("voters %d: want 1, 3 or 5", cl.Voters))
	}
	if cl.BootstrapExpect < 0 || cl.BootstrapExpect > cl.Voters {
		errs = append(errs, fmt.Errorf("bootstrap-expect %d out of range [0, voters=%d]", cl.BootstrapExpect, cl.Voters))
	}
	if cl.NonVoter && cl.BootstrapExpect > 0 {
		errs = append(errs, fmt.Errorf("a non-voter cannot bootstrap: drop --bootstrap-expect or --non-voter"))
	}
	if cl.DeadNodeTimeout <= 0 || cl.RaftTimeout < 10*time.Millisecond {
		errs = append(errs, fmt.Errorf("dead-node-timeout must be positive and raft-timeout at least 10ms"))
	}
	if cl.DiscoveryDNS != "" && !strings.HasPrefix(cl.DiscoveryDNS, "_") && (cl.DiscoveryPort < 1 || cl.DiscoveryPort > 65535) {
		errs = append(errs, fmt.Errorf("discovery-dns %q is an A/AAAA name: set discovery-port", cl.DiscoveryDNS))
	}
	if !c.TLS.clusterEnabled() && !cl.AllowInsecureCluster {
		if exposed := cl.exposedAddrs(); len(exposed) > 0 {
			errs = append(errs, fmt.Errorf("cluster addresses %s are reachable from other hosts but cluster TLS is off: "+
				"anyone who reaches them could change the routing through Raft. Create certificates with "+
				"'warmroute tls ca create' and 'warmroute tls cert create --name %s', then set --cluster-tls-cert-file, "+
				"--cluster-tls-key-file and --cluster-tls-ca-file (or pass --allow-insecure-cluster on a network where every host is trusted)",
				strings.Join(exposed, ", "), name))
		}
	}
	return errs
}

// name is the node's effective name: the configured one, else the name
// its cluster certificate proves (id, nil without one), else the host
// name.
func (cl *ClusterConfig) name(id *identity.Bundle) string {
	switch {
	case cl.NodeName != "":
		return cl.NodeName
	case id != nil:
		return id.Name
	}
	return hostname()
}

// raftListen is the effective Raft address: RaftListen, else the gossip
// host with the gossip port + 1 (port 0 stays 0: any free port).
func (cl *ClusterConfig) raftListen() string {
	if cl.RaftListen != "" {
		return cl.RaftListen
	}
	host, port, err := splitHostPort(cl.GossipListen)
	if err != nil {
		return cl.GossipListen
	}
	if port != 0 {
		port++
	}
	return net.JoinHostPort(host, strconv.Itoa(port))
}

// exposedAddrs lists the cluster addresses that other hosts may reach:
// listen addresses not bound to loopback, advertised addresses and seeds
// that are not loopback.
func (cl *ClusterConfig) exposedAddrs() []string {
	var out []string
	for _, a := range []string{cl.GossipListen, cl.GossipAdvertise, cl.raftListen(), cl.RaftAdvertise} {
		if a == "" {
			continue
		}
		if host, _, err := net.SplitHostPort(a); err != nil || !loopbackHost(host) {
			out = append(out, a)
		}
	}
	for _, j := range cl.Join {
		host := j
		if h, _, err := net.SplitHostPort(j); err == nil {
			host = h
		}
		if !loopbackHost(host) {
			out = append(out, "join "+j)
		}
	}
	return out
}

// loopbackHost reports whether host names this machine only: localhost
// or a loopback IP. An empty host, 0.0.0.0 or :: listen on every
// interface.
func loopbackHost(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// gossipKey reads the gossip key from WARMROUTE_GOSSIP_KEY's value or the
// key file: base64 of 16, 24 or 32 bytes.
func (cl *ClusterConfig) gossipKey() ([]byte, error) {
	raw := strings.TrimSpace(cl.GossipKey)
	if raw == "" && cl.GossipKeyFile != "" {
		b, err := os.ReadFile(cl.GossipKeyFile)
		if err != nil {
			return nil, fmt.Errorf("gossip key file: %w", err)
		}
		raw = strings.TrimSpace(string(b))
	}
	if raw == "" {
		return nil, nil
	}
	key, err := base64.StdEncoding.DecodeString(raw)
	if err != nil {
		return nil, fmt.Errorf("gossip key: not base64: %w", err)
	}
	if n := len(key); n != 16 && n != 24 && n != 32 {
		return nil, fmt.Errorf("gossip key: %d bytes, want 16, 24 or 32 (e.g. head -c 32 /dev/urandom | base64)", n)
	}
	return key, nil
}

// checkAdminExposure refuses an admin listener reachable from other hosts
// with no token, unless explicitly allowed.
func (c *Config) checkAdminExposure() error {
	host, _, err := net.SplitHostPort(c.AdminListen)
	if err != nil || c.Admin.Insecure {
		return nil
	}
	if tok, err := c.Admin.token(); err != nil || tok != "" {
		return nil
	}
	if host == "localhost" {
		return nil
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		return nil
	}
	return fmt.Errorf("admin-listen %s is reachable from other hosts but no admin token is set: set --admin-token-file or WARMROUTE_ADMIN_TOKEN (or --admin-insecure to allow it)", c.AdminListen)
}
