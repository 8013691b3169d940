package main

import (
	"errors"
	"flag"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/warmroute/warmroute/ring"
)

func TestServeConfigPrecedence(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "warmroute.yaml")
	os.WriteFile(path, []byte(`
listen: "127.0.0.1:18080"
backends:
  - http://10.0.0.1:8000
  - id: big
    url: http://10.0.0.2:8000
    zone: us-east-1a
    weight: 2
routing:
  prefix_length: 2048
  concurrency_threshold: 8
limits:
  max_body_size: 8MiB
`), 0o600)
	t.Setenv("WARMROUTE_CONCURRENCY_THRESHOLD", "12")
	t.Setenv("WARMROUTE_STRATEGY", "round-robin")
	cfg, err := loadServeConfig([]string{"--config", path, "--strategy", "CONSISTENT_HASH"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Listen != "127.0.0.1:18080" || cfg.Routing.PrefixLength != 2048 || cfg.Limits.MaxBodySize != 8<<20 {
		t.Errorf("file values not applied: %+v", cfg)
	}
	if cfg.Routing.ConcurrencyThreshold != 12 {
		t.Errorf("env did not override the file: %d", cfg.Routing.ConcurrencyThreshold)
	}
	if cfg.Routing.Strategy != ring.ConsistentHash {
		t.Errorf("flag did not override env: %s", cfg.Routing.Strategy)
	}
	bs, err := cfg.RingBackends()
	if err != nil || len(bs) != 2 || bs[0].ID != "10.0.0.1:8000" || bs[1].ID != "big" || bs[1].Weight != 2 || bs[1].Zone != "us-east-1a" {
		t.Errorf("backends %+v, %v", bs, err)
	}
}

func TestServeSageMakerNames(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "sm.yaml")
	os.WriteFile(path, []byte(`
RoutingConfig:
  RoutingStrategy: LEAST_OUTSTANDING_REQUESTS
  PrefixAwareRoutingConfig:
    PrefixLength: 8192
    ConcurrencyThreshold: 10
`), 0o600)
	cfg, err := loadServeConfig([]string{"--config=" + path}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Routing.Strategy != ring.LeastOutstanding || cfg.Routing.PrefixLength != 8192 || cfg.Routing.ConcurrencyThreshold != 10 {
		t.Errorf("SageMaker block not applied: %+v", cfg.Routing)
	}
	cfg, err = loadServeConfig([]string{"--RoutingStrategy", "PREFIX_AWARE", "--PrefixLength", "1024", "--ConcurrencyThreshold", "3"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Routing.Strategy != ring.PrefixAware || cfg.Routing.PrefixLength != 1024 || cfg.Routing.ConcurrencyThreshold != 3 {
		t.Errorf("SageMaker flag names not applied: %+v", cfg.Routing)
	}
}

func TestServeConfigErrors(t *testing.T) {
	dir := t.TempDir()
	typo := filepath.Join(dir, "typo.yaml")
	os.WriteFile(typo, []byte("routing:\n  prefix_lenght: 10\n"), 0o600)
	for _, c := range []struct {
		args []string
		env  [2]string
		want string
	}{
		{[]string{"--prefix-length", "100"}, [2]string{}, "PrefixLength 100 out of range"},
		{[]string{"--concurrency-threshold", "2000"}, [2]string{}, "ConcurrencyThreshold 2000 out of range"},
		{[]string{"--strategy", "FASTEST"}, [2]string{}, "unknown strategy"},
		{[]string{"--backends", "ftp://x:1"}, [2]string{}, "scheme must be http or https"},
		{[]string{"--listen", "nope"}, [2]string{}, "listen"},
		{[]string{"--max-body-size", "lots"}, [2]string{}, "invalid size"},
		{nil, [2]string{"WARMROUTE_LOAD_FACTOR", "0.5"}, "LoadFactor"},
		{nil, [2]string{"WARMROUTE_RETRIES", "x"}, "WARMROUTE_RETRIES"},
		{[]string{"--config", typo}, [2]string{}, "prefix_lenght"},
		{[]string{"--config", filepath.Join(dir, "missing.yaml")}, [2]string{}, "no such file"},
		{[]string{"--backends", "a=http://h:1,a=http://h:2"}, [2]string{}, "listed twice"},
		{[]string{"stray"}, [2]string{}, "unexpected arguments"},
	} {
		if c.env[0] != "" {
			t.Setenv(c.env[0], c.env[1])
		}
		_, err := loadServeConfig(c.args, io.Discard)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v %v: err = %v, want it to mention %q", c.args, c.env, err, c.want)
		}
		if c.env[0] != "" {
			os.Unsetenv(c.env[0])
		}
	}
	if _, err := loadServeConfig([]string{"--help"}, io.Discard); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("--help: %v", err)
	}
}
