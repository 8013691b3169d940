package main

import (
	"context"
	"encoding"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"github.com/warmroute/warmroute/internal/backendspec"
	"github.com/warmroute/warmroute/node"
	"github.com/warmroute/warmroute/ring"
)

// backendsFlag parses --backends: a comma-separated list of
// "[id=]url[;zone=z][;weight=n]".
type backendsFlag struct{ dst *[]backendspec.Spec }

func (f backendsFlag) String() string {
	if f.dst == nil {
		return ""
	}
	var parts []string
	for _, b := range *f.dst {
		parts = append(parts, b.URL)
	}
	return strings.Join(parts, ",")
}

func (f backendsFlag) Set(v string) error {
	var out []backendspec.Spec
	for _, s := range strings.Split(v, ",") {
		if strings.TrimSpace(s) == "" {
			continue
		}
		b, err := backendspec.Parse(s)
		if err != nil {
			return err
		}
		out = append(out, b)
	}
	*f.dst = out
	return nil
}

// serveFlags binds every serve flag to cfg. It is the one table flags,
// environment variables (WARMROUTE_<FLAG>, '-' as '_') and --help come
// from; the routing settings come from ring.Settings' tags (routingFlags).
// YAML keys are the yaml tags of node.Config.
func serveFlags(fs *flag.FlagSet, cfg *node.Config) (configPath *string) {
	configPath = fs.String("config", "", "YAML config file (flags and WARMROUTE_* variables override it)")
	fs.StringVar(&cfg.Listen, "listen", cfg.Listen, "client-facing listen address (OpenAI API, /invocations, /ping)")
	fs.StringVar(&cfg.AdminListen, "admin-listen", cfg.AdminListen, "admin listen address: /metrics, /status, /debug/route")
	fs.Var(backendsFlag{&cfg.Backends}, "backends", "comma-separated backend base URLs, each `[id=]url[;zone=z][;weight=n]` (id defaults to host:port)")

	routingFlags(fs, &cfg.Routing)

	l := &cfg.Limits
	fs.TextVar(&l.MaxBodySize, "max-body-size", l.MaxBodySize, "largest request body accepted (413 above)")
	fs.TextVar(&l.MaxBodyMemory, "max-body-memory", l.MaxBodyMemory, "request bodies held in memory at once, all connections together (at least twice max-body-size; bodies over 1MiB share half of it)")
	fs.DurationVar(&l.BodyMemoryWait, "body-memory-wait", l.BodyMemoryWait, "how long a request body waits for room in max-body-memory before 503 body_memory_full")
	fs.TextVar(&l.MaxHeaderSize, "max-header-size", l.MaxHeaderSize, "largest request header block accepted (431 above)")
	fs.DurationVar(&l.ReadTimeout, "read-timeout", l.ReadTimeout, "time allowed to read a request's headers and body")
	fs.DurationVar(&l.IdleTimeout, "idle-timeout", l.IdleTimeout, "close client keep-alive connections idle this long")
	fs.DurationVar(&l.WriteTimeout, "write-timeout", l.WriteTimeout, "cut a client whose socket accepts nothing for this long (it stopped reading); streams being read are never cut")
	fs.IntVar(&l.MaxConns, "max-conns", l.MaxConns, "concurrent client connections")

	u := &cfg.Upstream
	fs.DurationVar(&u.ConnectTimeout, "connect-timeout", u.ConnectTimeout, "time allowed to connect to a backend")
	fs.DurationVar(&u.FirstByteTimeout, "first-byte-timeout", u.FirstByteTimeout, "time allowed for a backend to start answering (504 after)")
	fs.DurationVar(&u.StreamIdleTimeout, "stream-idle-timeout", u.StreamIdleTimeout, "longest gap allowed between chunks of a streamed response")
	fs.IntVar(&u.MaxConnsPerBackend, "max-conns-per-backend", u.MaxConnsPerBackend, "upstream connections per backend")
	fs.DurationVar(&u.MaxConnWait, "max-conn-wait", u.MaxConnWait, "wait for a free upstream connection before trying another backend")
	fs.DurationVar(&u.IdleConnTimeout, "upstream-idle-conn-timeout", u.IdleConnTimeout, "close idle upstream connections after this (keep below the engine's keep-alive, 5s for vLLM)")
	fs.IntVar(&u.Retries, "retries", u.Retries, "other backends to try when a request could not reach one")
	fs.TextVar(&u.MaxBufferedResponse, "max-buffered-response", u.MaxBufferedResponse, "largest complete (not streamed) backend answer the router reads; larger ones get 502 upstream_response_too_large (streamed answers are not bounded)")
	fs.BoolVar(&u.StreamRelay, "stream-relay", u.StreamRelay, "pass streamed answers on event loops instead of a goroutine and buffers each (Linux; plain TCP to the client and the backend; other streams always take the goroutine path)")
	fs.IntVar(&u.MaxHops, "max-hops", u.MaxHops, "warmroute routers a request may already have passed (X-Warmroute-Hops) before this router answers 508 loop_detected (1-64)")

	h := &cfg.Health
	fs.StringVar(&h.ProbePath, "probe-path", h.ProbePath, "health-check path on backends (empty disables active checks)")
	fs.DurationVar(&h.ProbeInterval, "probe-interval", h.ProbeInterval, "active health-check interval")
	fs.DurationVar(&h.ProbeTimeout, "probe-timeout", h.ProbeTimeout, "active health-check timeout")
	fs.IntVar(&h.ProbeFailThreshold, "probe-fail-threshold", h.ProbeFailThreshold, "consecutive failed checks that mark a backend down")
	fs.IntVar(&h.ProbeRiseThreshold, "probe-rise-threshold", h.ProbeRiseThreshold, "consecutive passed checks that mark it up again")
	fs.IntVar(&h.EjectAfter, "eject-after", h.EjectAfter, "consecutive connect failures that eject a backend (0 = never)")
	fs.DurationVar(&h.EjectFor, "eject-for", h.EjectFor, "how long an ejected backend is skipped")

	c := &cfg.Cluster
	fs.StringVar(&c.NodeName, "node-name", c.NodeName, "this router's name in the cluster (unique, stable; letters, digits, '.', '_', '-'); default: the name in --cluster-tls-cert-file, else the host name")
	fs.StringVar(&c.GossipListen, "gossip-listen", c.GossipListen, "gossip address (TCP and UDP), e.g. 0.0.0.0:7946; empty runs the router alone")
	fs.StringVar(&c.GossipAdvertise, "gossip-advertise", c.GossipAdvertise, "address other routers reach this one on, when it differs from --gossip-listen")
	fs.Var(listFlag{&c.Join}, "join", "comma-separated seeds: host:port, host, or a DNS name whose A records are seeds")
	fs.StringVar(&c.GossipKeyFile, "gossip-key-file", c.GossipKeyFile, "file holding the base64 gossip encryption key (16, 24 or 32 bytes); or WARMROUTE_GOSSIP_KEY")
	fs.BoolVar(&c.AllowPlaintextGossip, "allow-plaintext-gossip", c.AllowPlaintextGossip, "allow an unencrypted cluster on non-loopback addresses")
	fs.BoolVar(&c.AllowInsecureCluster, "allow-insecure-cluster", c.AllowInsecureCluster, "allow cluster mode on non-loopback addresses without cluster TLS (Raft, admin forwarding and gossiped figures then trust anyone who reaches the cluster ports): trusted networks only")
	fs.DurationVar(&c.PublishInterval, "publish-interval", c.PublishInterval, "how often this router shares its in-flight counts")
	fs.StringVar(&c.Zone, "zone", c.Zone, "this router's availability zone")
	fs.StringVar(&c.RaftListen, "raft-listen", c.RaftListen, "Raft transport address (cluster mode); default: --gossip-listen's host, its port + 1")
	fs.StringVar(&c.RaftAdvertise, "raft-advertise", c.RaftAdvertise, "Raft address other routers dial, when it differs from --raft-listen")
	fs.StringVar(&c.DataDir, "data-dir", c.DataDir, "directory for the Raft log, snapshots and the last agreed state (empty: memory only, re-seeded from the config on every start)")
	fs.IntVar(&c.BootstrapExpect, "bootstrap-expect", c.BootstrapExpect, "routers that form a new cluster: the same N on the first N routers (1 for a single seed); 0 joins an existing cluster")
	fs.IntVar(&c.Voters, "voters", c.Voters, "Raft voters the leader keeps (1, 3 or 5); other routers follow as non-voters")
	fs.BoolVar(&c.NonVoter, "non-voter", c.NonVoter, "never take a Raft vote")
	fs.DurationVar(&c.DeadNodeTimeout, "dead-node-timeout", c.DeadNodeTimeout, "how long a router may be gone before the leader removes it from Raft")
	fs.DurationVar(&c.RaftTimeout, "raft-timeout", c.RaftTimeout, "Raft heartbeat and election timeout (failover takes about 1.5-2x this)")
	fs.StringVar(&c.DiscoveryDNS, "discovery-dns", c.DiscoveryDNS, "DNS name polled for backends: A/AAAA (with --discovery-port) or SRV (a name starting with '_')")
	fs.IntVar(&c.DiscoveryPort, "discovery-port", c.DiscoveryPort, "backend port for A/AAAA discovery")
	fs.DurationVar(&c.DiscoveryInterval, "discovery-interval", c.DiscoveryInterval, "DNS or Kubernetes discovery polling interval")
	fs.StringVar(&c.DiscoveryK8sPool, "discovery-k8s-pool", c.DiscoveryK8sPool, "find backends in Kubernetes: the ready pods of this InferencePool (inference.networking.k8s.io/v1), each podIP:targetPort")
	fs.StringVar(&c.DiscoveryK8sSelector, "discovery-k8s-selector", c.DiscoveryK8sSelector, "find backends in Kubernetes: the ready pods of this label selector (with --discovery-k8s-ports)")
	fs.TextVar(&c.DiscoveryK8sPorts, "discovery-k8s-ports", c.DiscoveryK8sPorts, "the backends' ports for --discovery-k8s-selector, comma-separated (1-8)")
	fs.StringVar(&c.DiscoveryK8sNamespace, "discovery-k8s-namespace", c.DiscoveryK8sNamespace, "namespace of the pool and its pods (default: this pod's)")
	fs.StringVar(&c.DiscoveryK8sKubeconfig, "discovery-k8s-kubeconfig", c.DiscoveryK8sKubeconfig, "kubeconfig file for Kubernetes discovery (default: the pod's service account)")
	fs.BoolVar(&cfg.Admin.Insecure, "admin-insecure", cfg.Admin.Insecure, "allow an admin listener reachable from other hosts without an admin token")
	fs.BoolVar(&cfg.Admin.PublicMetrics, "admin-public-metrics", cfg.Admin.PublicMetrics, "serve /metrics to other hosts without the admin token (reads from loopback never need it)")
	fs.StringVar(&cfg.TLS.CertFile, "tls-cert-file", cfg.TLS.CertFile, "serve clients over TLS with this certificate (PEM)")
	fs.StringVar(&cfg.TLS.KeyFile, "tls-key-file", cfg.TLS.KeyFile, "private key for --tls-cert-file (PEM)")
	fs.StringVar(&cfg.TLS.ClusterCertFile, "cluster-tls-cert-file", cfg.TLS.ClusterCertFile, "mutual TLS between routers (Raft and the admin API): this router's certificate (PEM)")
	fs.StringVar(&cfg.TLS.ClusterKeyFile, "cluster-tls-key-file", cfg.TLS.ClusterKeyFile, "private key for --cluster-tls-cert-file (PEM)")
	fs.StringVar(&cfg.TLS.ClusterCAFile, "cluster-tls-ca-file", cfg.TLS.ClusterCAFile, "CA that signs every router's cluster certificate (PEM)")
	fs.StringVar(&cfg.Admin.TokenFile, "admin-token-file", cfg.Admin.TokenFile, "file holding the admin API bearer token (or WARMROUTE_ADMIN_TOKEN); without one, admin writes are accepted from loopback only")

	x := &cfg.ExtProc
	fs.StringVar(&x.Listen, "ext-proc-listen", x.Listen, "serve as a gateway's endpoint picker (Envoy ext_proc v3, Gateway API Inference Extension) on this address, e.g. :9002; empty: off")
	fs.StringVar(&x.HealthListen, "ext-proc-health-listen", x.HealthListen, "serve the picker's gRPC health service alone, in plaintext, for Kubernetes probes, e.g. :9003")
	fs.StringVar(&x.CertFile, "ext-proc-tls-cert-file", x.CertFile, "the picker listener's TLS certificate (PEM); default: --tls-cert-file's, else a self-signed one made at start")
	fs.StringVar(&x.KeyFile, "ext-proc-tls-key-file", x.KeyFile, "private key for --ext-proc-tls-cert-file (PEM)")
	fs.BoolVar(&x.Plaintext, "ext-proc-plaintext", x.Plaintext, "serve the picker without TLS (loopback addresses only)")
	fs.IntVar(&x.MaxConns, "ext-proc-max-conns", x.MaxConns, "gateway connections to the picker")
	fs.IntVar(&x.MaxStreams, "ext-proc-max-streams", x.MaxStreams, "requests the picker holds open at once; over it they are answered 429")
	fs.IntVar(&x.Fallbacks, "ext-proc-fallbacks", x.Fallbacks, "fallback endpoints listed after the primary (0-16)")

	e := &cfg.Engine
	fs.StringVar(&e.MetricsPath, "engine-metrics-path", e.MetricsPath, "path of the engines' Prometheus metrics on each backend (empty: do not scrape)")
	fs.DurationVar(&e.Interval, "engine-scrape-interval", e.Interval, "engine metrics scrape interval")
	fs.DurationVar(&e.Timeout, "engine-scrape-timeout", e.Timeout, "engine metrics scrape timeout")

	fs.StringVar(&cfg.Log.Level, "log-level", cfg.Log.Level, "debug, info, warn or error")
	fs.StringVar(&cfg.Log.Format, "log-format", cfg.Log.Format, "text or json")

	a := &cfg.AccessLog
	fs.StringVar(&a.Mode, "access-log", a.Mode, "access log: off, on, or a sampling rate in (0, 1]; a line per request (route, model, tenant hash, backend, decision, status, bytes, times; never prompt text)")
	fs.StringVar(&a.Format, "access-log-format", a.Format, "access log format: json or text")
	fs.StringVar(&a.Output, "access-log-output", a.Output, "access log destination: stdout, stderr or a file path")
	fs.StringVar(&cfg.Tracing.Endpoint, "tracing-endpoint", cfg.Tracing.Endpoint, "OpenTelemetry collector's OTLP/HTTP URL (http://host:4318) to export spans to; empty: off, unless OTEL_EXPORTER_OTLP_ENDPOINT is set")
	fs.Float64Var(&cfg.Tracing.SampleRatio, "tracing-sample-ratio", cfg.Tracing.SampleRatio, "share of requests without a sampled traceparent that are traced (0-1); a sampled traceparent is always followed")
	fs.StringVar(&cfg.Record.Path, "record-trace", cfg.Record.Path, "record the routed traffic to this file as a Mooncake-format trace (replay with warmroute loadtest --trace FILE --trace-block-tokens 256); empty: off")
	fs.TextVar(&cfg.Record.MaxSize, "record-trace-max-size", cfg.Record.MaxSize, "the recording stops at this size")
	fs.IntVar(&cfg.Record.MaxRecords, "record-trace-max-records", cfg.Record.MaxRecords, "the recording stops after this many requests (at most 1048576)")
	fs.DurationVar(&cfg.ShutdownTimeout, "shutdown-timeout", cfg.ShutdownTimeout, "time open streams get to finish on shutdown")
	return configPath
}

// routingFlags binds a flag to every routing setting, named and explained
// by ring.Settings' tags, and one more under its SageMaker name where it
// has one.
func routingFlags(fs *flag.FlagSet, r *ring.Settings) {
	for _, info := range ring.SettingsInfo() {
		names := [][2]string{{info.Flag, info.Help}}
		if info.SageMaker != "" {
			names = append(names, [2]string{info.SageMaker, "SageMaker name for --" + info.Flag})
		}
		for _, n := range names {
			switch p := r.Field(info).(type) {
			case *int:
				fs.IntVar(p, n[0], *p, n[1])
			case *float64:
				fs.Float64Var(p, n[0], *p, n[1])
			case *bool:
				fs.BoolVar(p, n[0], *p, n[1])
			case textSetting:
				fs.TextVar(p, n[0], p, n[1])
			default:
				panic(fmt.Sprintf("routing setting %s: no flag type for %T", info.Field, p))
			}
		}
	}
}

// textSetting is a routing setting spelled as a name (Strategy,
// KeyDepth, OverflowRule).
type textSetting interface {
	encoding.TextMarshaler
	encoding.TextUnmarshaler
}

// sageMakerAlias reports whether a flag is a SageMaker alias, which takes
// no environment variable.
func sageMakerAlias(name string) bool {
	info, ok := ring.LookupSetting(name)
	return ok && info.SageMaker == name
}

func envName(flagName string) string {
	return "WARMROUTE_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// serveEnvNames lists the variables serve reads: one per flag of fs
// (SageMaker aliases have none) and the others the project reads.
func serveEnvNames(fs *flag.FlagSet) []string {
	names := slices.Clone(otherEnvNames)
	fs.VisitAll(func(f *flag.Flag) {
		if !sageMakerAlias(f.Name) {
			names = append(names, envName(f.Name))
		}
	})
	return names
}

// findConfigPath finds --config before flags are parsed, so the file can be
// loaded under the environment and the flags.
func findConfigPath(args []string) string {
	for i, a := range args {
		name, val, hasVal := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !strings.HasPrefix(a, "-") || name != "config" {
			continue
		}
		if hasVal {
			return val
		}
		if i+1 < len(args) {
			return args[i+1]
		}
	}
	return os.Getenv(envName("config"))
}

// loadServeConfig applies defaults, the config file, WARMROUTE_* variables
// and flags, in that order.
func loadServeConfig(args []string, stderr io.Writer) (node.Config, error) {
	cfg := node.DefaultConfig()
	fs := flag.NewFlagSet("warmroute serve", flag.ContinueOnError)
	fs.SetOutput(io.Discard) // errors are returned, not printed twice
	if wantsHelp(args) {
		serveFlags(fs, &cfg)
		hintDurations(fs)
		fs.SetOutput(stderr)
		fmt.Fprintf(stderr, "usage: warmroute serve [flags]\n\nRun a router node. Every flag can also be set as WARMROUTE_<FLAG> (e.g. WARMROUTE_PREFIX_LENGTH=8192)\nor in the --config YAML file; flags win over variables, variables over the file.\n\n")
		fs.PrintDefaults()
		return cfg, flag.ErrHelp
	}
	if path := findConfigPath(args); path != "" {
		if err := cfg.LoadFile(path); err != nil {
			return cfg, err
		}
	}
	serveFlags(fs, &cfg)
	hintDurations(fs)
	if err := unknownEnv(environ(), serveEnvNames(fs)); err != nil {
		return cfg, err
	}
	var envErr error
	fs.VisitAll(func(f *flag.Flag) {
		if sageMakerAlias(f.Name) || f.Name == "config" {
			return
		}
		if v, ok := os.LookupEnv(envName(f.Name)); ok {
			if err := fs.Set(f.Name, v); err != nil {
				envErr = errors.Join(envErr, fmt.Errorf("%s=%q: %w", envName(f.Name), v, err))
			}
		}
	})
	if envErr != nil {
		return cfg, usageError{envErr}
	}
	cfg.Cluster.GossipKey = os.Getenv("WARMROUTE_GOSSIP_KEY")
	cfg.Admin.Token = os.Getenv("WARMROUTE_ADMIN_TOKEN")
	if err := fs.Parse(args); err != nil {
		return cfg, usageErrorf("%w (see 'warmroute serve --help')", flagError(fs, err))
	}
	if fs.NArg() > 0 {
		return cfg, usageErrorf("unexpected arguments %q", fs.Args())
	}
	if err := cfg.Validate(); err != nil {
		return cfg, fmt.Errorf("invalid configuration:\n%w", err)
	}
	return cfg, nil
}

func cmdServe(ctx context.Context, args []string, _, stderr io.Writer) error {
	cfg, err := loadServeConfig(args, stderr)
	if err != nil {
		return err
	}
	log := node.NewLogger(cfg.Log, os.Stderr)
	if len(cfg.Backends) == 0 {
		log.Warn("no backends configured: every request will get 503 until backends are added")
	}
	n, err := node.New(cfg, node.Options{Logger: log, Version: version})
	if err != nil {
		return err
	}
	return n.Run(ctx)
}

// wantsHelp reports whether args ask for --help.
func wantsHelp(args []string) bool {
	for _, a := range args {
		switch a {
		case "-h", "-help", "--help", "--h":
			return true
		case "--":
			return false
		}
	}
	return false
}
