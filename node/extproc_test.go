package node

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestExtProcAndKubernetesSettings(t *testing.T) {
	for name, tc := range map[string]struct {
		edit func(c *Config)
		want string // "" : valid
	}{
		"off":                     {func(c *Config) {}, ""},
		"tls, self-signed":        {func(c *Config) { c.ExtProc.Listen = "0.0.0.0:9002" }, ""},
		"plaintext on loopback":   {func(c *Config) { c.ExtProc.Listen, c.ExtProc.Plaintext = "127.0.0.1:9002", true }, ""},
		"plaintext off loopback":  {func(c *Config) { c.ExtProc.Listen, c.ExtProc.Plaintext = ":9002", true }, "loopback only"},
		"half a certificate":      {func(c *Config) { c.ExtProc.Listen, c.ExtProc.CertFile = ":9002", "x.pem" }, "set both"},
		"health without listener": {func(c *Config) { c.ExtProc.HealthListen = ":9003" }, "ext-proc-listen is empty"},
		"fallbacks":               {func(c *Config) { c.ExtProc.Listen, c.ExtProc.Fallbacks = ":9002", 17 }, "fallbacks"},
		"no streams":              {func(c *Config) { c.ExtProc.Listen, c.ExtProc.MaxStreams = ":9002", 0 }, "max-streams"},
		"pool":                    {func(c *Config) { c.Cluster.DiscoveryK8sPool = "llama" }, ""},
		"selector with ports": {func(c *Config) {
			c.Cluster.DiscoveryK8sSelector, c.Cluster.DiscoveryK8sPorts = "app=vllm", PortList{8000}
		}, ""},
		"selector without ports":   {func(c *Config) { c.Cluster.DiscoveryK8sSelector = "app=vllm" }, "ports"},
		"pool and dns":             {func(c *Config) { c.Cluster.DiscoveryK8sPool, c.Cluster.DiscoveryDNS = "llama", "_x._tcp.example" }, "exclusive"},
		"namespace without source": {func(c *Config) { c.Cluster.DiscoveryK8sNamespace = "llm" }, "need discovery-k8s-pool"},
	} {
		c := DefaultConfig()
		c.Listen, c.AdminListen = "127.0.0.1:0", "127.0.0.1:0"
		tc.edit(&c)
		err := c.Validate()
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v", name, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: %v, want an error with %q", name, err, tc.want)
		}
	}
}

func TestPortList(t *testing.T) {
	var p PortList
	if err := p.UnmarshalText([]byte("8000, 8001")); err != nil || len(p) != 2 || p[1] != 8001 {
		t.Fatalf("%v %v", p, err)
	}
	if b, _ := p.MarshalText(); string(b) != "8000,8001" {
		t.Errorf("MarshalText %q", b)
	}
	for _, bad := range []string{"0", "65536", "x", "1,2,3,4,5,6,7,8,9"} {
		if err := p.UnmarshalText([]byte(bad)); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestExtProcConfigFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "c.yaml")
	os.WriteFile(path, []byte("ext_proc:\n  listen: 127.0.0.1:9002\n  plaintext: true\n  fallbacks: 1\ncluster:\n  discovery_k8s_selector: app=vllm\n  discovery_k8s_ports: 8000,8001\n"), 0o600)
	c := DefaultConfig()
	if err := c.LoadFile(path); err != nil {
		t.Fatal(err)
	}
	if c.ExtProc.Listen != "127.0.0.1:9002" || !c.ExtProc.Plaintext || c.ExtProc.Fallbacks != 1 || len(c.Cluster.DiscoveryK8sPorts) != 2 {
		t.Fatalf("loaded %+v %+v", c.ExtProc, c.Cluster.DiscoveryK8sPorts)
	}
}
