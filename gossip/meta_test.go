package gossip

import (
	"errors"
	"testing"
	"unicode/utf8"
)

// metaSeeds are metadata as nodes advertise it.
var metaSeeds = []Meta{
	{},
	{AdminAddr: "10.0.0.1:9090", RaftAddr: "10.0.0.1:7947", Zone: "eu-west-1a", Voter: true, Version: "v1.2.3", Wire: 1},
	{AdminAddr: "[fe80::1%eth0]:9090", RaftAddr: "[::1]:7947", Zone: "zone \"quoted\" \\ <&>", Version: "f31f591-dirty", Wire: 255},
	{AdminAddr: "router-0.warmroute.default.svc.cluster.local:9090", Zone: "ü-ζ-🙂", Wire: 2},
}

// FuzzDecodeMeta feeds arbitrary bytes to the decoding of another node's
// metadata, which arrives from the network: it must never panic, and what
// it accepts encodes and decodes back to itself.
func FuzzDecodeMeta(f *testing.F) {
	for _, m := range metaSeeds {
		b, err := encodeMeta(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	for _, s := range []string{"", "{", "null", "[]", `{"a":"x","new":1}`, `{"w":256}`, `{"w":-1}`, `{"v":"true"}`,
		`{"a":"\ud800"}`, `{"z":"\u0000"}`, `{"A":"case-folded key"}`, `{"a":1}`, `{"a":"x"} trailing`, `{"b":"v","b":"w"}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := decodeMeta(b)
		if err != nil {
			if m != (Meta{}) {
				t.Fatalf("decodeMeta(%q) failed (%v) but returned %+v", b, err, m)
			}
			return
		}
		for _, s := range []string{m.AdminAddr, m.RaftAddr, m.Zone, m.Version} {
			if !utf8.ValidString(s) {
				t.Fatalf("decodeMeta(%q) gave invalid UTF-8 %q", b, s)
			}
		}
		enc, err := encodeMeta(m)
		if errors.Is(err, ErrMetaTooLarge) {
			return // escapes grew it past the limit; this node would not send it
		}
		if err != nil {
			t.Fatalf("decoded %+v from %q, but it does not encode: %v", m, b, err)
		}
		back, err := decodeMeta(enc)
		if err != nil || back != m {
			t.Fatalf("decoded %+v from %q, encoded %q, decoded %+v, %v", m, b, enc, back, err)
		}
	})
}

// FuzzMetaRoundTrip: any metadata a node may advertise encodes within
// memberlist's limit or fails with ErrMetaTooLarge, and decodes to itself.
func FuzzMetaRoundTrip(f *testing.F) {
	for _, m := range metaSeeds {
		f.Add(m.AdminAddr, m.RaftAddr, m.Zone, m.Voter, m.Version, m.Wire)
	}
	f.Fuzz(func(t *testing.T, admin, raft, zone string, voter bool, version string, wire uint8) {
		m := Meta{AdminAddr: admin, RaftAddr: raft, Zone: zone, Voter: voter, Version: version, Wire: wire}
		b, err := encodeMeta(m)
		if err != nil {
			if !errors.Is(err, ErrMetaTooLarge) {
				t.Fatalf("encodeMeta(%+v): %v", m, err)
			}
			return
		}
		if len(b) > metaMaxSize {
			t.Fatalf("encodeMeta(%+v) is %d bytes, over the %d limit", m, len(b), metaMaxSize)
		}
		back, err := decodeMeta(b)
		if err != nil {
			t.Fatalf("encodeMeta(%+v) = %q does not decode: %v", m, b, err)
		}
		for _, s := range []string{admin, raft, zone, version} {
			if !utf8.ValidString(s) {
				return // JSON carries invalid UTF-8 as U+FFFD; node config is valid YAML, so UTF-8
			}
		}
		if back != m {
			t.Fatalf("encodeMeta(%+v) = %q decodes to %+v", m, b, back)
		}
	})
}
