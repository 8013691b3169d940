package deploy

import (
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

const composePath = "compose/docker-compose.yml"

type composeFile struct {
	Version  string                    `yaml:"version"`
	Services map[string]*composeSvc    `yaml:"services"`
	Networks map[string]composeNetwork `yaml:"networks"`
	Volumes  map[string]any            `yaml:"volumes"`
}

type composeSvc struct {
	Image       string            `yaml:"image"`
	Command     []string          `yaml:"command"`
	Hostname    string            `yaml:"hostname"`
	Environment map[string]string `yaml:"environment"`
	Networks    serviceNetworks   `yaml:"networks"`
	Ports       []string          `yaml:"ports"`
	Volumes     []string          `yaml:"volumes"`
	ReadOnly    bool              `yaml:"read_only"`
	CapDrop     []string          `yaml:"cap_drop"`
	Profiles    []string          `yaml:"profiles"`
}

type composeNetwork struct {
	Internal bool `yaml:"internal"`
	IPAM     struct {
		Config []struct {
			Subnet string `yaml:"subnet"`
		} `yaml:"config"`
	} `yaml:"ipam"`
}

// serviceNetworks is a service's networks, given as a list or a map;
// the value is the fixed IPv4 address, if any.
type serviceNetworks map[string]string

func (n *serviceNetworks) UnmarshalYAML(v *yaml.Node) error {
	*n = serviceNetworks{}
	switch v.Kind {
	case yaml.SequenceNode:
		var names []string
		if err := v.Decode(&names); err != nil {
			return err
		}
		for _, s := range names {
			(*n)[s] = ""
		}
		return nil
	case yaml.MappingNode:
		var m map[string]*struct {
			IPv4 string `yaml:"ipv4_address"`
		}
		if err := v.Decode(&m); err != nil {
			return err
		}
		for k, e := range m {
			if e != nil {
				(*n)[k] = e.IPv4
			} else {
				(*n)[k] = ""
			}
		}
		return nil
	}
	return fmt.Errorf("networks: unexpected YAML kind %v", v.Kind)
}

// interpolate replaces ${VAR}, ${VAR-default}, ${VAR:-default} and
// ${VAR:?message} the way docker-compose does with none of them set.
var composeVar = regexp.MustCompile(`\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([^}]*))?\}`)

func interpolate(b []byte) []byte {
	return composeVar.ReplaceAllFunc(b, func(m []byte) []byte {
		sub := composeVar.FindSubmatch(m)
		if op := string(sub[2]); op == ":-" || op == "-" {
			return sub[3]
		}
		return nil
	})
}

func loadCompose(t *testing.T) *composeFile {
	t.Helper()
	var f composeFile
	if err := yaml.Unmarshal(interpolate(readFile(t, composePath)), &f); err != nil {
		t.Fatal(err)
	}
	return &f
}

// role is the warmroute subcommand a service runs.
func (s *composeSvc) role() string {
	if len(s.Command) == 0 {
		return ""
	}
	return s.Command[0]
}

func (s *composeSvc) flag(name string) string {
	for i, a := range s.Command {
		if a == "--"+name && i+1 < len(s.Command) {
			return s.Command[i+1]
		}
	}
	return ""
}

func (f *composeFile) names(role string) []string {
	var out []string
	for n, s := range f.Services {
		if s.role() == role && len(s.Profiles) == 0 {
			out = append(out, n)
		}
	}
	sort.Strings(out)
	return out
}

// zoneOf is the one zone network a service is on besides the backbone.
func (f *composeFile) zoneOf(s *composeSvc) (string, error) {
	var zones []string
	for n := range s.Networks {
		if n != "backbone" && n != "edge" {
			zones = append(zones, n)
		}
	}
	if _, ok := s.Networks["backbone"]; !ok || len(zones) != 1 {
		return "", fmt.Errorf("networks %v: want backbone and one zone network", s.Networks)
	}
	return zones[0], nil
}

func (f *composeFile) validate() []error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if f.Version != "2.4" {
		bad("version %q: docker-compose 1.29 is the target; keep 2.4", f.Version)
	}
	bb, ok := f.Networks["backbone"]
	if !ok || !bb.Internal || len(bb.IPAM.Config) != 1 {
		bad("backbone network must exist, be internal, and have one fixed subnet")
		return errs
	}
	if edge, ok := f.Networks["edge"]; !ok || edge.Internal {
		bad("edge network (published ports) must exist and not be internal")
	}
	subnet, err := netip.ParsePrefix(bb.IPAM.Config[0].Subnet)
	if err != nil {
		bad("backbone subnet: %v", err)
		return errs
	}
	routers, gpus := f.names("serve"), f.names("gpusim")
	if len(routers) != 3 {
		bad("%d routers, want 3", len(routers))
	}
	if len(gpus) < 6 || len(gpus) > 9 {
		bad("%d gpusim instances, want 6 to 9", len(gpus))
	}
	zones := map[string]bool{}
	gpuZone := map[string]string{}
	perZone := map[string]int{}
	for _, n := range gpus {
		s := f.Services[n]
		z, err := f.zoneOf(s)
		if err != nil {
			bad("%s: %v", n, err)
			continue
		}
		gpuZone[n] = z
		perZone[z]++
		if s.Hostname != n {
			bad("%s: hostname %q", n, s.Hostname)
		}
		if _, ok := s.Networks["edge"]; ok || len(s.Ports) > 0 {
			bad("%s: engines are reached through the routers only (no edge network, no ports)", n)
		}
		if _, port, _ := net.SplitHostPort(s.flag("listen")); port != "8000" {
			bad("%s: gpusim should listen on port 8000, got %q", n, s.flag("listen"))
		}
	}
	var seeds []string
	for _, n := range routers {
		if ip := f.Services[n].Networks["backbone"]; ip != "" {
			seeds = append(seeds, ip+":7946")
		}
	}
	for _, n := range routers {
		s := f.Services[n]
		env := s.Environment
		z, err := f.zoneOf(s)
		if err != nil {
			bad("%s: %v", n, err)
			continue
		}
		if zones[z] {
			bad("%s: a second router in %s", n, z)
		}
		if _, ok := s.Networks["edge"]; !ok {
			bad("%s: not on the edge network, so cutting its backbone link would cut its clients too", n)
		}
		zones[z] = true
		if env["WARMROUTE_ZONE"] != z {
			bad("%s: WARMROUTE_ZONE %q but on network %s", n, env["WARMROUTE_ZONE"], z)
		}
		if env["WARMROUTE_NODE_NAME"] != n || s.Hostname != n {
			bad("%s: node name %q, hostname %q: want the service name", n, env["WARMROUTE_NODE_NAME"], s.Hostname)
		}
		ip, err := netip.ParseAddr(s.Networks["backbone"])
		if err != nil || !subnet.Contains(ip) {
			bad("%s: backbone address %q not in %s", n, s.Networks["backbone"], subnet)
			continue
		}
		if got := env["WARMROUTE_GOSSIP_ADVERTISE"]; got != ip.String()+":7946" {
			bad("%s: WARMROUTE_GOSSIP_ADVERTISE %q, want %s:7946", n, got, ip)
		}
		if got := env["WARMROUTE_RAFT_ADVERTISE"]; got != ip.String()+":7947" {
			bad("%s: WARMROUTE_RAFT_ADVERTISE %q, want %s:7947", n, got, ip)
		}
		join := strings.Split(env["WARMROUTE_JOIN"], ",")
		sort.Strings(join)
		if want := slices.Sorted(slices.Values(seeds)); !slices.Equal(join, want) {
			bad("%s: WARMROUTE_JOIN %v, want every router %v", n, join, want)
		}
		if env["WARMROUTE_BOOTSTRAP_EXPECT"] != fmt.Sprint(len(routers)) {
			bad("%s: WARMROUTE_BOOTSTRAP_EXPECT %q with %d routers", n, env["WARMROUTE_BOOTSTRAP_EXPECT"], len(routers))
		}
		dataVol := ""
		for _, v := range s.Volumes {
			parts := strings.Split(v, ":")
			if len(parts) >= 2 && parts[1] == env["WARMROUTE_DATA_DIR"] {
				dataVol = parts[0]
			}
		}
		if _, ok := f.Volumes[dataVol]; !ok || dataVol == "" {
			bad("%s: the data dir %q is not on a named volume", n, env["WARMROUTE_DATA_DIR"])
		}
		for _, k := range []string{"WARMROUTE_GOSSIP_KEY_FILE", "WARMROUTE_ADMIN_TOKEN_FILE"} {
			if !strings.HasPrefix(env[k], "/run/secrets/") {
				bad("%s: %s %q is not under the secrets mount", n, k, env[k])
			}
		}
		errs = append(errs, f.validateClusterTLS(n, s)...)
		listed := map[string]bool{}
		for _, spec := range strings.Split(env["WARMROUTE_BACKENDS"], ",") {
			spec = strings.TrimSpace(spec)
			id, rest, _ := strings.Cut(spec, "=")
			parts := strings.Split(rest, ";")
			u, err := url.Parse(parts[0])
			if err != nil {
				bad("%s: backend %q: %v", n, spec, err)
				continue
			}
			zone := ""
			for _, p := range parts[1:] {
				if v, ok := strings.CutPrefix(p, "zone="); ok {
					zone = v
				}
			}
			gz, ok := gpuZone[id]
			switch {
			case !ok:
				bad("%s: backend %q is not a gpusim service", n, id)
			case u.Hostname() != id || u.Port() != "8000":
				bad("%s: backend %s has URL %s", n, id, u)
			case zone != gz:
				bad("%s: backend %s says zone %q but runs in %s", n, id, zone, gz)
			}
			listed[id] = true
		}
		for _, g := range gpus {
			if !listed[g] {
				bad("%s: gpusim %s is not among its backends", n, g)
			}
		}
	}
	for z := range zones {
		if !f.Networks[z].Internal {
			bad("zone network %s should be internal (the backbone is the only way out)", z)
		}
		if perZone[z] < 2 {
			bad("zone %s has %d gpusim instances", z, perZone[z])
		}
	}
	for n, s := range f.Services {
		for _, p := range s.Ports {
			if !strings.HasPrefix(p, "127.0.0.1:") {
				bad("%s: port %q is published beyond loopback", n, p)
			}
		}
		if r := s.role(); r != "serve" && r != "gpusim" {
			continue
		}
		if !s.ReadOnly || !slices.Equal(s.CapDrop, []string{"ALL"}) {
			bad("%s: want read_only and cap_drop [ALL]", n)
		}
		if s.Image != "warmroute:dev" {
			bad("%s: image %q, want the warmroute:dev default", n, s.Image)
		}
	}
	return errs
}

// validateClusterTLS checks a router's mutual TLS: on, with its own
// certificate (the file named after its node name, which init-secrets.sh
// issues for that name), from a secrets directory of its own, so no router
// reads another's key, and never the CA's directory.
func (f *composeFile) validateClusterTLS(n string, s *composeSvc) []error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(n+": "+format, args...)) }
	env := s.Environment
	cert, key, ca := env["WARMROUTE_CLUSTER_TLS_CERT_FILE"], env["WARMROUTE_CLUSTER_TLS_KEY_FILE"], env["WARMROUTE_CLUSTER_TLS_CA_FILE"]
	if cert == "" || key == "" || ca == "" {
		return append(errs, fmt.Errorf("%s: cluster TLS is off: set WARMROUTE_CLUSTER_TLS_CERT_FILE, _KEY_FILE and _CA_FILE", n))
	}
	if v := strings.ToLower(env["WARMROUTE_ALLOW_INSECURE_CLUSTER"]); v != "" && v != "false" {
		bad("WARMROUTE_ALLOW_INSECURE_CLUSTER=%s: the stack runs secure", v)
	}
	name := env["WARMROUTE_NODE_NAME"]
	if path.Base(cert) != name+".pem" || path.Base(key) != name+"-key.pem" {
		bad("certificate %s and key %s: want %s.pem and %s-key.pem, the pair issued for its node name", cert, key, name, name)
	}
	for _, file := range []string{cert, key, ca} {
		src, ok := s.mountOf(file)
		switch {
		case !ok:
			bad("%s is on no mounted volume", file)
		case path.Base(src) != name:
			bad("%s comes from %s: want the router's own secrets directory (…/%s), so no router reads another's key or the CA key", file, src, name)
		}
	}
	return errs
}

// mountOf returns the host source of the bind mount that holds file.
func (s *composeSvc) mountOf(file string) (string, bool) {
	for _, v := range s.Volumes {
		parts := strings.Split(v, ":")
		if len(parts) < 2 || !strings.Contains(parts[0], "/") {
			continue // a named volume
		}
		if strings.HasPrefix(file, strings.TrimSuffix(parts[1], "/")+"/") {
			return path.Clean(parts[0]), true
		}
	}
	return "", false
}

func TestComposeFile(t *testing.T) {
	f := loadCompose(t)
	for _, err := range f.validate() {
		t.Error(err)
	}
}

// TestComposeChecksCatchMistakes breaks the parsed file and expects the
// checks to notice.
func TestComposeChecksCatchMistakes(t *testing.T) {
	breakers := map[string]func(f *composeFile){
		"backend in the wrong zone": func(f *composeFile) {
			e := f.Services["router-b"].Environment
			e["WARMROUTE_BACKENDS"] = strings.Replace(e["WARMROUTE_BACKENDS"], "gpu-a1:8000;zone=zone-a", "gpu-a1:8000;zone=zone-b", 1)
		},
		"advertise address of another router": func(f *composeFile) {
			f.Services["router-a"].Environment["WARMROUTE_GOSSIP_ADVERTISE"] = f.Services["router-b"].Environment["WARMROUTE_GOSSIP_ADVERTISE"]
		},
		"two routers in one zone": func(f *composeFile) {
			s := f.Services["router-c"]
			delete(s.Networks, "zone-c")
			s.Networks["zone-b"] = ""
			s.Environment["WARMROUTE_ZONE"] = "zone-b"
		},
		"engine published": func(f *composeFile) {
			f.Services["gpu-b2"].Networks["edge"] = ""
		},
		"port open to the world": func(f *composeFile) {
			f.Services["router-a"].Ports[0] = "18080:8080"
		},
		"missing seed": func(f *composeFile) {
			f.Services["router-a"].Environment["WARMROUTE_JOIN"] = "10.213.46.11:7946"
		},
		"cluster TLS off": func(f *composeFile) {
			delete(f.Services["router-b"].Environment, "WARMROUTE_CLUSTER_TLS_CERT_FILE")
		},
		"insecure cluster allowed": func(f *composeFile) {
			f.Services["router-b"].Environment["WARMROUTE_ALLOW_INSECURE_CLUSTER"] = "true"
		},
		"another router's certificate": func(f *composeFile) {
			e := f.Services["router-a"].Environment
			e["WARMROUTE_CLUSTER_TLS_CERT_FILE"] = "/run/secrets/router-b.pem"
			e["WARMROUTE_CLUSTER_TLS_KEY_FILE"] = "/run/secrets/router-b-key.pem"
		},
		"every router's secrets mounted": func(f *composeFile) {
			s := f.Services["router-c"]
			s.Volumes[0] = "./secrets:/run/secrets:ro"
		},
	}
	checkBreakers(t, loadCompose, breakers)
}

// TestComposeConfig asks docker-compose itself to validate the file
// against its schema (no Docker engine needed).
func TestComposeConfig(t *testing.T) {
	dc, err := exec.LookPath("docker-compose")
	if err != nil {
		t.Skip("docker-compose not installed")
	}
	cmd := exec.Command(dc, "-f", composePath, "config", "-q")
	cmd.Env = append(os.Environ(), "COMPOSE_PROJECT_NAME=warmroute-config-check")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("docker-compose config: %v\n%s", err, out)
	}
}

func TestComposeEnvNamesAreFlags(t *testing.T) {
	f := loadCompose(t)
	var names []string
	for _, n := range f.names("serve") {
		for k := range f.Services[n].Environment {
			names = append(names, k)
		}
	}
	sort.Strings(names)
	names = slices.Compact(names)
	checkEnvNames(t, composePath, names)
}

// TestComposeMountsExist checks that the files the optional monitoring
// services mount are in the repository.
func TestComposeMountsExist(t *testing.T) {
	f := loadCompose(t)
	for n, s := range f.Services {
		for _, v := range s.Volumes {
			src, _, _ := strings.Cut(v, ":")
			if !strings.HasPrefix(src, "../") {
				continue
			}
			if _, err := os.Stat(filepath.Join("compose", src)); err != nil {
				t.Errorf("%s mounts %s: %v", n, src, err)
			}
		}
	}
}
