package main

import (
	"context"
	"encoding/base64"
	"flag"
	"fmt"
	"io"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/warmroute/warmroute/internal/backendspec"
	"github.com/warmroute/warmroute/internal/identity"
	"github.com/warmroute/warmroute/loadtest/proc"
	"github.com/warmroute/warmroute/node"
	"github.com/warmroute/warmroute/ring"
)

// The tools and the end-to-end tests build `warmroute serve` and
// `warmroute gpusim` command lines with proc.ServeArgs and proc.GpusimArgs.
// These tests render every field and parse the result with the real flag
// tables, so a renamed flag fails here rather than when a tool runs.

// requireEveryField fails unless every field of the structs in vs (and of
// the structs they hold) is set in at least one of them: a field added to
// a builder must be added to these tests.
func requireEveryField(t *testing.T, vs ...any) {
	t.Helper()
	var walk func(path string, typ reflect.Type, vals []reflect.Value)
	walk = func(path string, typ reflect.Type, vals []reflect.Value) {
		for i := range typ.NumField() {
			f := typ.Field(i)
			var sub []reflect.Value
			set := false
			for _, v := range vals {
				sub = append(sub, v.Field(i))
				set = set || !v.Field(i).IsZero()
			}
			if f.Type.Kind() == reflect.Struct {
				walk(path+f.Name+".", f.Type, sub)
			} else if !set {
				t.Errorf("%s%s is not set by the test: set it and check where it lands", path, f.Name)
			}
		}
	}
	var vals []reflect.Value
	for _, v := range vs {
		vals = append(vals, reflect.ValueOf(v))
	}
	walk(vals[0].Type().Name()+".", vals[0].Type(), vals)
}

// check is one setting: where it lands and the value it should have there.
type check[C any] struct {
	name string
	got  func(C) any
	want any
}

// checkAll compares each setting in got with its wanted value, which must
// differ from the default (else the flag could have been left out).
func checkAll[C any](t *testing.T, got, def C, checks []check[C]) {
	t.Helper()
	for _, c := range checks {
		if g := c.got(got); !reflect.DeepEqual(g, c.want) {
			t.Errorf("%s: %#v, want %#v", c.name, g, c.want)
		}
		if reflect.DeepEqual(c.got(def), c.want) {
			t.Errorf("%s: %#v is the default: the test cannot tell whether the flag was given", c.name, c.want)
		}
	}
}

// TestServeArgsFlagTable renders a proc.ServeArgs with every field set,
// parses it with serve's flag table (loadServeConfig, validation included)
// and checks that every field lands in its place of node.Config.
func TestServeArgsFlagTable(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ca, err := identity.NewCA("flag table CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	certPEM, keyPEM, err := ca.Issue(identity.Request{Name: "r7", Validity: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	tlsFiles := proc.ClusterTLS{CertFile: writeSecret(t, "r7.pem", string(certPEM)), KeyFile: writeSecret(t, "r7-key.pem", string(keyPEM)),
		CAFile: writeSecret(t, "ca.pem", string(ca.CertPEM()))}
	a := proc.ServeArgs{
		Listen:               "127.0.0.1:18080",
		AdminListen:          "127.0.0.1:19090",
		Backends:             []string{"http://10.0.0.1:8000", "big=http://10.0.0.2:8000;zone=z2;weight=2"},
		Strategy:             "ROUND_ROBIN",
		PrefixLength:         2048,
		ConcurrencyThreshold: 12,
		LoadFactor:           1.5,
		ReadTimeout:          11 * time.Second,
		IdleTimeout:          12 * time.Second,
		WriteTimeout:         13 * time.Second,
		MaxConns:             77,
		ConnectTimeout:       1500 * time.Millisecond,
		FirstByteTimeout:     14 * time.Second,
		StreamIdleTimeout:    15 * time.Second,
		MaxConnsPerBackend:   33,
		MaxConnWait:          250 * time.Millisecond,
		ProbePath:            "/ready",
		ProbeInterval:        350 * time.Millisecond,
		NoEngineMetrics:      true,
		NodeName:             "r7",
		GossipListen:         "127.0.0.1:17946",
		GossipAdvertise:      "127.0.0.1:27946",
		RaftListen:           "127.0.0.1:17947",
		RaftAdvertise:        "127.0.0.1:27947",
		Join:                 []string{"127.0.0.2:7946", "seeds.example"},
		BootstrapExpect:      3,
		Voters:               5,
		RaftTimeout:          300 * time.Millisecond,
		DataDir:              filepath.Join(dir, "data"),
		GossipKeyFile:        writeSecret(t, "gossip.key", base64.StdEncoding.EncodeToString([]byte("0123456789abcdef0123456789abcdef"))),
		AdminTokenFile:       writeSecret(t, "admin.token", "flag-table-token"),
		AdminPublicMetrics:   true,
		ClusterTLS:           tlsFiles,
		LogLevel:             "warn",
		ShutdownTimeout:      7 * time.Second,
		Extra:                []string{"--zone", "z9"},
	}
	off := a
	off.NoProbes = true
	requireEveryField(t, a, off)
	if args := a.Args(); args[0] != "serve" || !slices.Equal(args[1:], a.Flags()) {
		t.Fatalf("Args %q", args)
	}
	strategy, err := ring.ParseStrategy("ROUND_ROBIN")
	if err != nil {
		t.Fatal(err)
	}
	def := node.DefaultConfig()
	for _, tc := range []struct {
		args      proc.ServeArgs
		probePath string
	}{{a, "/ready"}, {off, ""}} {
		cfg, err := loadServeConfig(tc.args.Flags(), io.Discard)
		if err != nil {
			t.Fatalf("serve does not take %q: %v", tc.args.Flags(), err)
		}
		type c = check[node.Config]
		checkAll(t, cfg, def, []c{
			{"listen", func(c node.Config) any { return c.Listen }, a.Listen},
			{"admin-listen", func(c node.Config) any { return c.AdminListen }, a.AdminListen},
			{"backends", func(c node.Config) any { return c.Backends }, []backendspec.Spec{
				{URL: "http://10.0.0.1:8000"}, {ID: "big", URL: "http://10.0.0.2:8000", Zone: "z2", Weight: 2}}},
			{"strategy", func(c node.Config) any { return c.Routing.Strategy }, strategy},
			{"prefix-length", func(c node.Config) any { return c.Routing.PrefixLength }, a.PrefixLength},
			{"concurrency-threshold", func(c node.Config) any { return c.Routing.ConcurrencyThreshold }, a.ConcurrencyThreshold},
			{"load-factor", func(c node.Config) any { return c.Routing.LoadFactor }, a.LoadFactor},
			{"read-timeout", func(c node.Config) any { return c.Limits.ReadTimeout }, a.ReadTimeout},
			{"idle-timeout", func(c node.Config) any { return c.Limits.IdleTimeout }, a.IdleTimeout},
			{"write-timeout", func(c node.Config) any { return c.Limits.WriteTimeout }, a.WriteTimeout},
			{"max-conns", func(c node.Config) any { return c.Limits.MaxConns }, a.MaxConns},
			{"connect-timeout", func(c node.Config) any { return c.Upstream.ConnectTimeout }, a.ConnectTimeout},
			{"first-byte-timeout", func(c node.Config) any { return c.Upstream.FirstByteTimeout }, a.FirstByteTimeout},
			{"stream-idle-timeout", func(c node.Config) any { return c.Upstream.StreamIdleTimeout }, a.StreamIdleTimeout},
			{"max-conns-per-backend", func(c node.Config) any { return c.Upstream.MaxConnsPerBackend }, a.MaxConnsPerBackend},
			{"max-conn-wait", func(c node.Config) any { return c.Upstream.MaxConnWait }, a.MaxConnWait},
			{"probe-path", func(c node.Config) any { return c.Health.ProbePath }, tc.probePath},
			{"probe-interval", func(c node.Config) any { return c.Health.ProbeInterval }, a.ProbeInterval},
			{"engine-metrics-path", func(c node.Config) any { return c.Engine.MetricsPath }, ""},
			{"node-name", func(c node.Config) any { return c.Cluster.NodeName }, a.NodeName},
			{"gossip-listen", func(c node.Config) any { return c.Cluster.GossipListen }, a.GossipListen},
			{"gossip-advertise", func(c node.Config) any { return c.Cluster.GossipAdvertise }, a.GossipAdvertise},
			{"raft-listen", func(c node.Config) any { return c.Cluster.RaftListen }, a.RaftListen},
			{"raft-advertise", func(c node.Config) any { return c.Cluster.RaftAdvertise }, a.RaftAdvertise},
			{"join", func(c node.Config) any { return c.Cluster.Join }, a.Join},
			{"bootstrap-expect", func(c node.Config) any { return c.Cluster.BootstrapExpect }, a.BootstrapExpect},
			{"voters", func(c node.Config) any { return c.Cluster.Voters }, a.Voters},
			{"raft-timeout", func(c node.Config) any { return c.Cluster.RaftTimeout }, a.RaftTimeout},
			{"data-dir", func(c node.Config) any { return c.Cluster.DataDir }, a.DataDir},
			{"gossip-key-file", func(c node.Config) any { return c.Cluster.GossipKeyFile }, a.GossipKeyFile},
			{"admin-token-file", func(c node.Config) any { return c.Admin.TokenFile }, a.AdminTokenFile},
			{"admin-public-metrics", func(c node.Config) any { return c.Admin.PublicMetrics }, true},
			{"cluster-tls-cert-file", func(c node.Config) any { return c.TLS.ClusterCertFile }, tlsFiles.CertFile},
			{"cluster-tls-key-file", func(c node.Config) any { return c.TLS.ClusterKeyFile }, tlsFiles.KeyFile},
			{"cluster-tls-ca-file", func(c node.Config) any { return c.TLS.ClusterCAFile }, tlsFiles.CAFile},
			{"log-level", func(c node.Config) any { return c.Log.Level }, a.LogLevel},
			{"shutdown-timeout", func(c node.Config) any { return c.ShutdownTimeout }, a.ShutdownTimeout},
			{"extra flags (--zone)", func(c node.Config) any { return c.Cluster.Zone }, "z9"},
		})
	}
}

// TestGpusimArgsFlagTable renders a proc.GpusimArgs with every field set
// and parses it with gpusim's flag table.
func TestGpusimArgsFlagTable(t *testing.T) {
	t.Parallel()
	a := proc.GpusimArgs{Instances: 3, Listen: "127.0.0.1:23000", NamePrefix: "sim-", KVBlocks: 1234, TimeScale: 0.25,
		Extra: []string{"--model", "flag-table-model"}}
	requireEveryField(t, a)
	if args := a.Args(); args[0] != "gpusim" || !slices.Equal(args[1:], a.Flags()) {
		t.Fatalf("Args %q", args)
	}
	fs := flag.NewFlagSet("gpusim", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	got := gpusimFlags(fs)
	if err := fs.Parse(a.Flags()); err != nil || fs.NArg() > 0 {
		t.Fatalf("gpusim does not take %q: %v", a.Flags(), err)
	}
	def := gpusimFlags(flag.NewFlagSet("defaults", flag.ContinueOnError))
	type c = check[*gpusimSettings]
	checkAll(t, got, def, []c{
		{"instances", func(s *gpusimSettings) any { return s.instances }, a.Instances},
		{"listen", func(s *gpusimSettings) any { return s.listen }, a.Listen},
		{"name-prefix", func(s *gpusimSettings) any { return s.namePrefix }, a.NamePrefix},
		{"kv-blocks", func(s *gpusimSettings) any { return s.model.KVCacheBlocks }, a.KVBlocks},
		{"time-scale", func(s *gpusimSettings) any { return s.model.TimeScale }, a.TimeScale},
		{"extra flags (--model)", func(s *gpusimSettings) any { return s.model.Model }, "flag-table-model"},
	})
}

// TestChildArgsFlags: chaos and demo read --gpusim-args and --router-args
// alike (proc.SplitArgs): blank-separated words with shell quoting, and
// repeated flags add up.
func TestChildArgsFlags(t *testing.T) {
	t.Parallel()
	var got []string
	f := argsFlag{&got}
	for _, v := range []string{"--itl-base 20ms --model 'a b'", `--join a,b --x "c \" d"`} {
		if err := f.Set(v); err != nil {
			t.Fatal(err)
		}
	}
	if want := []string{"--itl-base", "20ms", "--model", "a b", "--join", "a,b", "--x", `c " d`}; !slices.Equal(got, want) {
		t.Fatalf("%q, want %q", got, want)
	}
	for name, cmd := range map[string]func(context.Context, []string, io.Writer, io.Writer) error{"chaos": cmdChaos, "demo": cmdDemo} {
		for _, flagName := range []string{"--gpusim-args", "--router-args"} {
			err := cmd(context.Background(), []string{flagName, "--model 'unterminated"}, io.Discard, io.Discard)
			if err == nil || !strings.Contains(err.Error(), proc.ErrBadArgs.Error()) {
				t.Errorf("%s %s with an unterminated quote: %v", name, flagName, err)
			}
		}
	}
}

// FuzzListFlag: a comma-separated list flag parses any value into items
// that are not empty and hold no comma and no surrounding blanks, which
// joined with commas parse back to themselves; multiFlag adds the items of
// each use.
func FuzzListFlag(f *testing.F) {
	for _, s := range []string{"a,b", " a , ,b,", "", ",,,", "r1, r2 ,\t", "\u00a0x\u00a0,y"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		var got []string
		if err := (listFlag{&got}).Set(v); err != nil {
			t.Fatal(err)
		}
		for _, s := range got {
			if s == "" || strings.Contains(s, ",") || s != strings.TrimSpace(s) {
				t.Fatalf("%q: item %q", v, s)
			}
		}
		var again []string
		if err := (listFlag{&again}).Set(strings.Join(got, ",")); err != nil || !slices.Equal(again, got) {
			t.Fatalf("%q: %q reads back as %q (%v)", v, got, again, err)
		}
		var multi []string
		for range 2 {
			if err := (multiFlag{&multi}).Set(v); err != nil {
				t.Fatal(err)
			}
		}
		if want := append(slices.Clone(got), got...); !slices.Equal(multi, want) {
			t.Fatalf("%q twice: %q, want %q", v, multi, want)
		}
		if s := fmt.Sprint(listFlag{&got}); s != strings.Join(got, ",") {
			t.Fatalf("String %q", s)
		}
	})
}
