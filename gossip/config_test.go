package gossip

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestValidate(t *testing.T) {
	base := func() Config {
		c := DefaultConfig()
		c.NodeName = "n1"
		c.BindAddr = "127.0.0.1"
		return c
	}
	if err := (func() *Config { c := base(); return &c })().Validate(); err != nil {
		t.Fatalf("loopback default: %v", err)
	}
	cases := map[string]struct {
		mod  func(*Config)
		want error
	}{
		"no name":            {func(c *Config) { c.NodeName = "" }, ErrNoNodeName},
		"all interfaces":     {func(c *Config) { c.BindAddr = "0.0.0.0" }, ErrPlaintext},
		"lan address":        {func(c *Config) { c.BindAddr = "10.0.0.5" }, ErrPlaintext},
		"advertise lan":      {func(c *Config) { c.AdvertiseAddr = "10.0.0.5" }, ErrPlaintext},
		"short key":          {func(c *Config) { c.SecretKey = []byte("short") }, ErrKeyLength},
		"bad extra key":      {func(c *Config) { c.SecretKey = make([]byte, 16); c.ExtraKeys = [][]byte{make([]byte, 5)} }, ErrKeyLength},
		"bind hostname":      {func(c *Config) { c.BindAddr = "myhost" }, ErrInvalidConfig},
		"port":               {func(c *Config) { c.BindPort = 70000 }, ErrInvalidConfig},
		"zero publish":       {func(c *Config) { c.PublishInterval = 0 }, ErrInvalidConfig},
		"zero change delay":  {func(c *Config) { c.ChangeDelay = 0 }, ErrInvalidConfig},
		"delay > publish":    {func(c *Config) { c.ChangeDelay = 2 * c.PublishInterval }, ErrInvalidConfig},
		"expire <= refresh":  {func(c *Config) { c.ExpireAfter = c.RefreshInterval }, ErrInvalidConfig},
		"refresh < publish":  {func(c *Config) { c.RefreshInterval = time.Millisecond }, ErrInvalidConfig},
		"probe timeout":      {func(c *Config) { c.ProbeTimeout = 2 * c.ProbeInterval }, ErrInvalidConfig},
		"resend":             {func(c *Config) { c.ResendCount = 0 }, ErrInvalidConfig},
		"meta too big":       {func(c *Config) { c.Meta.Zone = strings.Repeat("z", 600) }, ErrMetaTooLarge},
		"bad seed port":      {func(c *Config) { c.Join = []string{"host:99999"} }, ErrInvalidConfig},
		"empty seed":         {func(c *Config) { c.Join = []string{" "} }, ErrInvalidConfig},
		"extra without main": {func(c *Config) { c.ExtraKeys = [][]byte{make([]byte, 16)} }, ErrInvalidConfig},
	}
	for name, tc := range cases {
		c := base()
		tc.mod(&c)
		if err := c.Validate(); !errors.Is(err, tc.want) {
			t.Errorf("%s: err = %v, want %v", name, err, tc.want)
		}
	}
	ok := map[string]func(*Config){
		"key on lan":       func(c *Config) { c.BindAddr = "0.0.0.0"; c.SecretKey = make([]byte, 32) },
		"explicit opt-out": func(c *Config) { c.BindAddr = "0.0.0.0"; c.AllowPlaintext = true },
		"ipv6 loopback":    func(c *Config) { c.BindAddr = "::1" },
		"seeds":            func(c *Config) { c.Join = []string{"a", "b:7000", "10.0.0.1", "[::1]:7946", "::1"} },
	}
	for name, mod := range ok {
		c := base()
		mod(&c)
		if err := c.Validate(); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}

func TestSplitSeed(t *testing.T) {
	cases := []struct {
		in   string
		host string
		port int
	}{
		{"router-a", "router-a", 7000},
		{"router-a:7946", "router-a", 7946},
		{"10.0.0.1", "10.0.0.1", 7000},
		{"[fe80::1]:8000", "fe80::1", 8000},
		{"[fe80::1]", "fe80::1", 7000},
		{"fe80::1", "fe80::1", 7000},
	}
	for _, tc := range cases {
		h, p, err := splitSeed(tc.in, 7000)
		if err != nil || h != tc.host || p != tc.port {
			t.Errorf("splitSeed(%q) = %q %d %v, want %q %d", tc.in, h, p, err, tc.host, tc.port)
		}
	}
}

func TestMetaRoundTrip(t *testing.T) {
	m := Meta{AdminAddr: "10.0.0.1:9090", RaftAddr: "10.0.0.1:7000", Zone: "eu-1a", Voter: true, Version: "v1.2.3", Wire: 1}
	b, err := encodeMeta(m)
	if err != nil {
		t.Fatal(err)
	}
	got, err := decodeMeta(b)
	if err != nil || got != m {
		t.Fatalf("got %+v %v", got, err)
	}
	if got, err := decodeMeta([]byte(`{"a":"x","new":1}`)); err != nil || got.AdminAddr != "x" {
		t.Fatalf("unknown keys: %+v %v", got, err)
	}
	if _, err := decodeMeta([]byte("{")); err == nil {
		t.Fatal("bad meta decoded")
	}
}
