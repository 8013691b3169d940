package gossip

import (
	"errors"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"testing"
)

// FuzzSplitSeed: --join entries never panic the parser; an accepted entry
// names a host that can be resolved (an IP address or a DNS name) and a
// port in range (the default when it has none), and host:port written back
// splits to the same seed.
func FuzzSplitSeed(f *testing.F) {
	for _, s := range []string{
		"router-a", "router-a:7946", "10.0.0.1", "10.0.0.1:7000", "[fe80::1]:8000", "[fe80::1]", "fe80::1",
		"[fe80::1%eth0]:7946", "warmroute-headless.default.svc.cluster.local", " router-b:7946 ",
		"", ":7946", "router-a:0", "router-a:65536", "router-a:x", "[]", "[", "[::1]:", "a b", "u@h:1", "h/x:1",
	} {
		f.Add(s, uint16(7946))
	}
	f.Fuzz(func(t *testing.T, s string, defPort uint16) {
		if defPort == 0 {
			defPort = DefaultPort
		}
		host, port, err := splitSeed(s, int(defPort))
		if err != nil {
			if !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("splitSeed(%q): %v is not ErrInvalidConfig", s, err)
			}
			return
		}
		if port < 1 || port > 65535 {
			t.Fatalf("splitSeed(%q) = port %d", s, port)
		}
		if _, _, err := net.SplitHostPort(strings.TrimSpace(s)); err != nil && port != int(defPort) {
			t.Fatalf("splitSeed(%q) has no port but gave %d, not the default %d", s, port, defPort)
		}
		if _, err := netip.ParseAddr(host); err != nil {
			if host == "" {
				t.Fatalf("splitSeed(%q) accepted an empty host", s)
			}
			for _, c := range []byte(host) {
				if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
					t.Fatalf("splitSeed(%q) = host %q, neither an IP address nor a DNS name", s, host)
				}
			}
		}
		joined := net.JoinHostPort(host, strconv.Itoa(port))
		h2, p2, err := splitSeed(joined, 1)
		if err != nil || h2 != host || p2 != port {
			t.Fatalf("splitSeed(%q) = %q %d; %q splits to %q %d, %v", s, host, port, joined, h2, p2, err)
		}
	})
}

// Found by FuzzSplitSeed: join entries with an empty host ("[]") or a host
// no resolver takes ("a b", a typo for "a,b") passed validation and only
// failed, with a warning, when the node tried to join.
func TestSplitSeedRejectsUnresolvableHosts(t *testing.T) {
	for _, s := range []string{"[]", "[", "a b", "u@h:1", "h/x:1", "router-a:7946#"} {
		if h, p, err := splitSeed(s, 7946); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("splitSeed(%q) = %q %d %v, want ErrInvalidConfig", s, h, p, err)
		}
	}
	for _, s := range []string{"[fe80::1%eth0]:7946", "fe80::1%eth0", "warmroute_headless.default.svc.cluster.local."} {
		if _, _, err := splitSeed(s, 7946); err != nil {
			t.Errorf("splitSeed(%q): %v", s, err)
		}
	}
}
