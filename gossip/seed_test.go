package gossip

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"
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
			defPort = defaultPort
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

func TestSelfMatcher(t *testing.T) {
	ap := netip.MustParseAddrPort
	a := netip.MustParseAddr
	cases := []struct {
		adv   string
		bind  string
		port  uint16
		local []netip.Addr
		self  []string
		other []string
	}{
		{ // bound to one loopback address: other loopback addresses are other nodes
			adv: "127.0.0.2:7946", bind: "127.0.0.2", port: 7946,
			self:  []string{"127.0.0.2:7946", "[::ffff:127.0.0.2]:7946"},
			other: []string{"127.0.0.1:7946", "127.0.0.3:7946", "[::1]:7946", "127.0.0.2:7947"},
		},
		{ // bound to all addresses: every loopback and interface address with the port
			adv: "10.0.0.5:7946", bind: "0.0.0.0", port: 7946, local: []netip.Addr{a("10.0.0.5"), a("192.168.1.2")},
			self:  []string{"127.0.0.1:7946", "127.0.0.3:7946", "[::1]:7946", "10.0.0.5:7946", "192.168.1.2:7946", "0.0.0.0:7946"},
			other: []string{"10.0.0.6:7946", "127.0.0.1:7947", "192.168.1.2:7000"},
		},
		{ // advertised behind NAT on another port
			adv: "203.0.113.7:8000", bind: "10.0.0.5", port: 7946,
			self:  []string{"203.0.113.7:8000", "10.0.0.5:7946"},
			other: []string{"203.0.113.7:7946", "10.0.0.5:8000", "127.0.0.1:7946"},
		},
	}
	for _, tc := range cases {
		isSelf := selfMatcher(ap(tc.adv), a(tc.bind), tc.port, tc.local)
		for _, s := range tc.self {
			if p := ap(s); !isSelf(p.Addr(), p.Port()) {
				t.Errorf("adv %s bind %s: %s is not self", tc.adv, tc.bind, s)
			}
		}
		for _, s := range tc.other {
			if p := ap(s); isSelf(p.Addr(), p.Port()) {
				t.Errorf("adv %s bind %s: %s is self", tc.adv, tc.bind, s)
			}
		}
	}
}

// TestLoopbackNodesShareAPort: routers on 127.0.0.2, .3 and .4 with one
// port number, each a seed of all, form one cluster (each used to take
// the others' loopback addresses for its own and join no one).
func TestLoopbackNodesShareAPort(t *testing.T) {
	hosts := []string{"127.0.0.2", "127.0.0.3", "127.0.0.4"}
	for attempt := 0; ; attempt++ {
		port := freeLoopbackPort(t, hosts[0])
		var join []string
		for _, h := range hosts {
			join = append(join, net.JoinHostPort(h, strconv.Itoa(port)))
		}
		var logs syncBuffer
		var nodes []*testNode
		for i, h := range hosts {
			cfg := testConfig(fmt.Sprintf("node-%d", i+2))
			cfg.BindAddr, cfg.BindPort, cfg.Join = h, port, join
			cfg.Logger = logs.warnLogger()
			src := newFakeSource()
			c, err := New(cfg, src)
			if err != nil {
				break // the port is taken on one of the addresses
			}
			t.Cleanup(func() { _ = c.Close() })
			nodes = append(nodes, &testNode{c: c, src: src})
		}
		if len(nodes) < len(hosts) {
			for _, nd := range nodes {
				_ = nd.c.Close()
			}
			if attempt == 10 {
				t.Fatalf("no port free on all of %v", hosts)
			}
			continue
		}
		waitMembers(t, nodes, len(hosts))
		nodes[0].src.set("x", 2)
		waitFor(t, 10*time.Second, func() bool { return nodes[2].c.View().RemoteInFlight("x") == 2 }, "figures flow")
		if strings.Contains(logs.String(), "every seed is this node's own address") {
			t.Fatalf("warned about seeds though they are other nodes:\n%s", logs.String())
		}
		return
	}
}

// TestSeedsAllSelfWarns: a node whose seeds are all its own address says
// so instead of silently staying alone.
func TestSeedsAllSelfWarns(t *testing.T) {
	port := freeLoopbackPort(t, "127.0.0.5")
	var logs syncBuffer
	cfg := testConfig("node-a")
	cfg.BindAddr, cfg.BindPort = "127.0.0.5", port
	cfg.Join = []string{fmt.Sprintf("127.0.0.5:%d", port), "127.0.0.5"}
	cfg.Logger = logs.warnLogger()
	c, err := New(cfg, nil)
	if err != nil {
		t.Skipf("port %d: %v", port, err)
	}
	defer c.Close()
	if !strings.Contains(logs.String(), "every seed is this node's own address") {
		t.Fatalf("no warning; logs:\n%s", logs.String())
	}
	// Once, not on every retry.
	c.resolveSeeds()
	if n := strings.Count(logs.String(), "every seed is this node's own address"); n != 1 {
		t.Fatalf("warned %d times", n)
	}
}
