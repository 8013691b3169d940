package backendspec

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"

	"github.com/warmroute/warmroute/internal/hostname"
)

// Target is a backend's network address parsed from its base URL.
type Target struct {
	// HostPort is host:port.
	HostPort string
	// TLS is true for https URLs.
	TLS bool
}

// ParseTarget parses a backend base URL ("http://10.0.0.5:8000",
// "https://gpu-3.example:443", or a bare "host:port", taken as http).
func ParseTarget(raw string) (Target, error) {
	s := strings.TrimSpace(raw)
	if s == "" {
		return Target{}, errors.New("empty backend address")
	}
	if !strings.Contains(s, "://") {
		s = "http://" + s
	}
	u, err := url.Parse(s)
	if err != nil {
		return Target{}, fmt.Errorf("backend address %q: %w", raw, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return Target{}, fmt.Errorf("backend address %q: scheme must be http or https", raw)
	}
	if u.Host == "" || u.Hostname() == "" {
		return Target{}, fmt.Errorf("backend address %q: no host", raw)
	}
	if u.Path != "" && u.Path != "/" {
		return Target{}, fmt.Errorf("backend address %q: a base URL takes no path", raw)
	}
	if u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return Target{}, fmt.Errorf("backend address %q: a base URL takes no user info, query or fragment", raw)
	}
	if !hostname.Valid(u.Hostname()) {
		return Target{}, fmt.Errorf("backend address %q: host must be an IP address or a DNS name", raw)
	}
	port := u.Port()
	if port == "" {
		port = "80"
		if u.Scheme == "https" {
			port = "443"
		}
	}
	if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
		return Target{}, fmt.Errorf("backend address %q: port must be 1-65535", raw)
	}
	hp := net.JoinHostPort(u.Hostname(), port)
	if h, _, err := net.SplitHostPort(hp); err != nil || h == "" || strings.ContainsAny(h, "[]/ ") {
		return Target{}, fmt.Errorf("backend address %q: invalid host", raw)
	}
	return Target{HostPort: hp, TLS: u.Scheme == "https"}, nil
}

// Addr is the target's base address, scheme://host:port.
func (t Target) Addr() string {
	if t.TLS {
		return "https://" + t.HostPort
	}
	return "http://" + t.HostPort
}
