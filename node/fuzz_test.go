package node

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/warmroute/warmroute/internal/backendspec"
	"github.com/warmroute/warmroute/node/admin"
	"github.com/warmroute/warmroute/ring"
	"go.yaml.in/yaml/v3"
)

// FuzzParseBackend: the admin API's add-backend request, with the config
// file's rules, never panics, and what it accepts builds a ring.
func FuzzParseBackend(f *testing.F) {
	for _, s := range []string{
		`{"url":"http://10.0.0.1:8000"}`,
		`{"id":"gpu-1","url":"https://gpu.example","zone":"z","weight":3,"labels":{"a":"b"},"state":"draining"}`,
		`{"url":"ftp://x"}`, `{"url":5}`, `{}`, `[]`, `{"url":"http://h:1"} {}`, `{"url":"http://h:99999"}`,
		`{"id":"a b","url":"http://h:1"}`, `{"url":"http://[::1]:80/"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var req admin.BackendRequest
		if json.Unmarshal(body, &req) != nil {
			return
		}
		b, err := ParseBackend(req)
		if err != nil {
			return
		}
		if b.ID == "" {
			t.Fatalf("accepted %q with no id", body)
		}
		st, err := ring.ParseState(b.State)
		if err != nil && b.State != "" {
			return // the state machine rejects it (ErrInvalid)
		}
		if _, err := ring.New(ring.DefaultConfig(), []ring.Backend{{ID: b.ID, Addr: b.URL, Zone: b.Zone, Weight: b.Weight, State: st}}); err != nil {
			t.Fatalf("accepted %q, but no ring builds from it: %v", body, err)
		}
	})
}

// configFuzzSeeds are YAML config files: the README's example, every
// section, cluster mode, and broken ones.
var configFuzzSeeds = []string{
	"",
	"listen: \":8080\"\nbackends:\n  - http://10.0.0.11:8000\n  - id: gpu-big\n    url: http://10.0.0.12:8000\n    zone: us-east-1b\n    weight: 2\n" +
		"RoutingConfig:\n  RoutingStrategy: PREFIX_AWARE\n  PrefixAwareRoutingConfig:\n    PrefixLength: 4096\n    ConcurrencyThreshold: 10\n",
	"listen: 127.0.0.1:0\nadmin_listen: 127.0.0.1:0\nbackends: [\"gpu-1=http://10.0.0.1:8000;zone=a;weight=3\", \"10.0.0.2:8000\"]\n" +
		"routing:\n  strategy: least-outstanding\n  prefix_length: 2048\n  concurrency_threshold: 4\n  load_factor: 1.25\n  overflow_depth: 3\n  partition_count: 271\n  zone_aware: true\n" +
		"limits:\n  max_body_size: 8MiB\n  max_header_size: 16KiB\n  read_timeout: 5s\n  idle_timeout: 1m\n  write_timeout: 30s\n  max_conns: 1000\n" +
		"upstream:\n  connect_timeout: 2s\n  first_byte_timeout: 1m\n  stream_idle_timeout: 2m\n  max_conns_per_backend: 64\n  retries: 2\n" +
		"health:\n  probe_path: /health\n  probe_interval: 1s\n  probe_timeout: 500ms\n  fail_threshold: 3\n  rise_threshold: 2\n  eject_after: 3\n  eject_for: 10s\n" +
		"log:\n  level: debug\n  format: json\nengine:\n  metrics_path: /metrics\n  interval: 2s\n  timeout: 1s\nshutdown_timeout: 10s\n",
	"cluster:\n  node_name: r1\n  gossip_listen: 127.0.0.1:7946\n  join: [127.0.0.1:7956, r2]\n  zone: z1\n  raft_listen: 127.0.0.1:7947\n" +
		"  bootstrap_expect: 3\n  voters: 3\n  dead_node_timeout: 2m\n  raft_timeout: 1s\n  publish_interval: 50ms\n  discovery_dns: _vllm._tcp.example\n",
	"ext_proc:\n  listen: 127.0.0.1:9002\n  health_listen: 127.0.0.1:9003\n  plaintext: true\n  max_streams: 8\n" +
		"cluster:\n  discovery_k8s_pool: llama\n  discovery_k8s_namespace: llm\n",
	"routing:\n  partition_count: 1\nbackends: [http://a:1, http://b:1]\n",
	"RoutingConfig:\n  RoutingStrategy: NOPE\n",
	"RoutingConfig: {PrefixAwareRoutingConfig: {PrefixLength: 100}}\n",
	"limits:\n  max_body_size: -1\n",
	"routing:\n  load_factor: .nan\n",
	"backends:\n  - {url: 'http://h:1', weight: -3}\n",
	"listn: \":8080\"\n",
	"[1, 2",
	"a: &a [*a]\n",
}

// FuzzLoadConfig: loading any YAML file never panics; what loads has its
// SageMaker block applied, sizes non-negative, writes back as YAML that
// loads to the same config, and, when Validate accepts it, builds a ring
// and passes the proxy's checks.
func FuzzLoadConfig(f *testing.F) {
	for _, s := range configFuzzSeeds {
		f.Add([]byte(s))
	}
	dir := f.TempDir()
	path := filepath.Join(dir, "warmroute.yaml")
	f.Fuzz(func(t *testing.T, data []byte) {
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		c := DefaultConfig()
		if err := c.LoadFile(path); err != nil {
			return
		}
		if c.SageMaker != nil {
			t.Fatal("RoutingConfig block left unapplied")
		}
		if c.Limits.MaxBodySize < 0 || c.Limits.MaxHeaderSize < 0 {
			t.Fatalf("negative size loaded: %d %d", c.Limits.MaxBodySize, c.Limits.MaxHeaderSize)
		}
		out, err := yaml.Marshal(&c)
		if err != nil {
			t.Fatalf("loaded config does not marshal: %v", err)
		}
		if err := os.WriteFile(path, out, 0o600); err != nil {
			t.Fatal(err)
		}
		again := DefaultConfig()
		if err := again.LoadFile(path); err != nil {
			t.Fatalf("config written back does not load: %v\n%s", err, out)
		}
		if out2, _ := yaml.Marshal(&again); !bytes.Equal(out, out2) {
			t.Fatalf("config changes on a round trip:\n%s\n---\n%s", out, out2)
		}
		// Validate builds the ring, which takes most of a second at the
		// largest partition counts: keep the fuzzer fast.
		if c.Routing.PartitionCount > 1<<14 {
			return
		}
		// Validate reads the files a config names; keep it off the host's.
		for _, p := range []*string{&c.Admin.TokenFile, &c.Cluster.GossipKeyFile, &c.TLS.CertFile, &c.TLS.KeyFile,
			&c.TLS.ClusterCertFile, &c.TLS.ClusterKeyFile, &c.TLS.ClusterCAFile} {
			if *p != "" {
				*p = filepath.Join(dir, "absent")
			}
		}
		if err := c.Validate(); err != nil {
			return
		}
		if pc := c.ProxyConfig(); pc.Validate() != nil {
			err := pc.Validate()
			t.Fatalf("valid config, invalid proxy config: %v", err)
		}
		rbs, err := c.RingBackends()
		if err != nil {
			t.Fatalf("valid config, bad backends: %v", err)
		}
		if _, err := ring.New(c.RingConfig(), rbs); err != nil {
			t.Fatalf("config passes Validate, but no ring builds from it: %v\n%s", err, data)
		}
	})
}

// Found by FuzzLoadConfig: a routing.partition_count below the backend
// count passed Validate, and the node then failed to build its first ring.
func TestValidateRejectsPartitionCountBelowBackends(t *testing.T) {
	c := DefaultConfig()
	c.Routing.PartitionCount = 1
	c.Backends = []backendspec.Spec{{URL: "http://a:1"}, {URL: "http://b:1"}}
	err := c.Validate()
	if err == nil || !strings.Contains(err.Error(), "PartitionCount 1 is below the backend count 2") {
		t.Fatalf("Validate = %v, want the partition count refused", err)
	}
	c.Routing.PartitionCount = 2
	if err := c.Validate(); err != nil {
		t.Fatalf("partition_count 2 with 2 backends: %v", err)
	}
}

// FuzzGossipKey: the gossip key (a flag, a file or WARMROUTE_GOSSIP_KEY)
// never panics the parser; an accepted key is 16, 24 or 32 bytes that
// encode back to a key parsing to the same bytes, and no key is read only
// from blank input.
func FuzzGossipKey(f *testing.F) {
	for _, s := range []string{
		"", "  \n", base64.StdEncoding.EncodeToString(make([]byte, 16)), base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{0xfe}, 24)),
		" " + base64.StdEncoding.EncodeToString([]byte("0123456789abcdef0123456789abcdef")) + "\n", "not base64!", "AAAA",
		base64.RawStdEncoding.EncodeToString(make([]byte, 32)), base64.URLEncoding.EncodeToString(bytes.Repeat([]byte{0xff}, 16)),
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		cl := ClusterConfig{GossipKey: s}
		key, err := cl.gossipKey()
		if err != nil {
			return
		}
		if key == nil {
			if strings.TrimSpace(s) != "" {
				t.Fatalf("gossipKey(%q) = no key, no error", s)
			}
			return
		}
		if n := len(key); n != 16 && n != 24 && n != 32 {
			t.Fatalf("gossipKey(%q) = %d bytes", s, n)
		}
		again := ClusterConfig{GossipKey: base64.StdEncoding.EncodeToString(key)}
		if back, err := again.gossipKey(); err != nil || !bytes.Equal(back, key) {
			t.Fatalf("gossipKey(%q) = %x; written back it gives %x, %v", s, key, back, err)
		}
	})
}

// FuzzListenAddr: Validate's check of a listen address (checkListen) and
// the parser the node starts gossip and Raft with (splitHostPort) never
// panic and agree, so a config that validates starts; an accepted
// host:port is written back to the same.
func FuzzListenAddr(f *testing.F) {
	for _, s := range []string{":8080", "127.0.0.1:9090", "0.0.0.0:7946", "[::1]:7947", "[fe80::1%eth0]:1", "router-0:0",
		"", ":", "h", "h:65536", "h:-1", "h:+1", "h:0x10", "[::1]", "a:b:c", "h:  1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		cerr := checkListen(s)
		host, port, err := splitHostPort(s)
		if (cerr == nil) != (err == nil) {
			t.Fatalf("%q: checkListen says %v, splitHostPort %v", s, cerr, err)
		}
		if err != nil {
			return
		}
		if port < 0 || port > 65535 {
			t.Fatalf("%q: port %d", s, port)
		}
		h2, p2, err := splitHostPort(net.JoinHostPort(host, strconv.Itoa(port)))
		if err != nil || h2 != host || p2 != port {
			t.Fatalf("%q = %q %d; written back %q %d, %v", s, host, port, h2, p2, err)
		}
	})
}
