package backendspec

import (
	"net"
	"strings"
	"testing"
)

func TestParseTarget(t *testing.T) {
	for in, want := range map[string]Target{
		"http://10.0.0.1:8000": {HostPort: "10.0.0.1:8000"},
		"10.0.0.1:8000":        {HostPort: "10.0.0.1:8000"},
		"https://gpu.example":  {HostPort: "gpu.example:443", TLS: true},
		"http://[::1]:9000/":   {HostPort: "[::1]:9000"},
		" http://h:1 ":         {HostPort: "h:1"},
	} {
		got, err := ParseTarget(in)
		if err != nil || got != want {
			t.Errorf("ParseTarget(%q) = %+v, %v", in, got, err)
		}
	}
	for _, bad := range []string{"", "ftp://x:1", "http://", "http://h:1/v1", "http://h:bad"} {
		if _, err := ParseTarget(bad); err == nil {
			t.Errorf("ParseTarget(%q) accepted", bad)
		}
	}
}

// FuzzParseTarget: backend addresses never panic the parser, and what it
// accepts is a host:port that parses back to itself (but for IPv6 zones,
// which a URL must write escaped, %25).
func FuzzParseTarget(f *testing.F) {
	for _, s := range []string{"http://10.0.0.5:8000", "https://gpu-3.example", "gpu:80", "[::1]:9", "http://[fe80::1%25eth0]:1", "ftp://x", "http://x/p", " http://h:1 ", "http://:80", "http://h:99999"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		tg, err := ParseTarget(raw)
		if err != nil {
			return
		}
		host, port, err := net.SplitHostPort(tg.HostPort)
		if err != nil || host == "" || port == "" {
			t.Fatalf("ParseTarget(%q) = %q: not host:port (%v)", raw, tg.HostPort, err)
		}
		if strings.Contains(host, "%") {
			return
		}
		scheme := "http://"
		if tg.TLS {
			scheme = "https://"
		}
		again, err := ParseTarget(scheme + tg.HostPort)
		if err != nil || again != tg {
			t.Fatalf("ParseTarget(%q) = %+v, but its address parses to %+v (%v)", raw, tg, again, err)
		}
	})
}
