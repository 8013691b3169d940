package main

import (
	"context"
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

// serveFlags binds every serve flag to cfg. Flags, environment variables
// (WARMROUTE_<FLAG>, '-' as '_') and --help come from the settings
// sections' tags (settings.go); the few settings outside a section are
// bound here. YAML keys are the yaml tags of node.Config.
func serveFlags(fs *flag.FlagSet, cfg *node.Config) (configPath *string) {
	configPath = fs.String("config", "", "YAML config file (flags and WARMROUTE_* variables override it)")
	fs.StringVar(&cfg.Listen, "listen", cfg.Listen, "client-facing listen address (OpenAI API, /invocations, /ping)")
	fs.StringVar(&cfg.AdminListen, "admin-listen", cfg.AdminListen, "admin listen address: /metrics, /status, /debug/route")
	fs.Var(backendsFlag{&cfg.Backends}, "backends", "comma-separated backend base URLs, each `[id=]url[;zone=z][;weight=n]` (id defaults to host:port)")

	for _, s := range settingSections(cfg) {
		sectionFlags(fs, s)
	}

	fs.StringVar(&cfg.TLS.CertFile, "tls-cert-file", cfg.TLS.CertFile, "serve clients over TLS with this certificate (PEM)")
	fs.StringVar(&cfg.TLS.KeyFile, "tls-key-file", cfg.TLS.KeyFile, "private key for --tls-cert-file (PEM)")
	fs.StringVar(&cfg.TLS.ClusterCertFile, "cluster-tls-cert-file", cfg.TLS.ClusterCertFile, "mutual TLS between routers (Raft and the admin API): this router's certificate (PEM)")
	fs.StringVar(&cfg.TLS.ClusterKeyFile, "cluster-tls-key-file", cfg.TLS.ClusterKeyFile, "private key for --cluster-tls-cert-file (PEM)")
	fs.StringVar(&cfg.TLS.ClusterCAFile, "cluster-tls-ca-file", cfg.TLS.ClusterCAFile, "CA that signs every router's cluster certificate (PEM)")

	x := &cfg.ExtProc
	fs.StringVar(&x.Listen, "ext-proc-listen", x.Listen, "serve as a gateway's endpoint picker (Envoy ext_proc v3, Gateway API Inference Extension) on this address, e.g. :9002; empty: off")
	fs.StringVar(&x.HealthListen, "ext-proc-health-listen", x.HealthListen, "serve the picker's gRPC health service alone, in plaintext, for Kubernetes probes, e.g. :9003")
	fs.StringVar(&x.CertFile, "ext-proc-tls-cert-file", x.CertFile, "the picker listener's TLS certificate (PEM); default: --tls-cert-file's, else a self-signed one made at start")
	fs.StringVar(&x.KeyFile, "ext-proc-tls-key-file", x.KeyFile, "private key for --ext-proc-tls-cert-file (PEM)")
	fs.BoolVar(&x.Plaintext, "ext-proc-plaintext", x.Plaintext, "serve the picker without TLS (loopback addresses only)")
	fs.IntVar(&x.MaxConns, "ext-proc-max-conns", x.MaxConns, "gateway connections to the picker")
	fs.IntVar(&x.MaxStreams, "ext-proc-max-streams", x.MaxStreams, "requests the picker holds open at once; over it they are answered 429")
	fs.IntVar(&x.Fallbacks, "ext-proc-fallbacks", x.Fallbacks, "fallback endpoints listed after the primary (0-16)")

	fs.DurationVar(&cfg.ShutdownTimeout, "shutdown-timeout", cfg.ShutdownTimeout, "time open streams get to finish on shutdown")
	return configPath
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
// (SageMaker aliases have none), the secrets' and the others the project
// reads.
func serveEnvNames(fs *flag.FlagSet) []string {
	names := slices.Clone(otherEnvNames)
	fs.VisitAll(func(f *flag.Flag) {
		if !sageMakerAlias(f.Name) {
			names = append(names, envName(f.Name))
		}
	})
	for _, st := range secretSettings(new(node.Config)) {
		names = append(names, st.Env)
	}
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
	secretEnv(&cfg)
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
