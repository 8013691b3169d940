package backendspec

import (
	"net"
	"net/netip"
	"net/url"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/warmroute/warmroute/ring"
	"go.yaml.in/yaml/v3"
)

// formatSpec writes b back in the "[id=]url[;zone=z][;weight=n]"
// syntax. The id is written when set, and as an empty "=" prefix when the
// URL would otherwise be read as "id=url".
func formatSpec(b Spec) string {
	s := b.URL
	if i := strings.Index(s, "="); b.ID != "" || (i >= 0 && !strings.Contains(s[:i], "/")) {
		s = b.ID + "=" + s
	}
	if b.Zone != "" {
		s += ";zone=" + b.Zone
	}
	if b.Weight != 0 {
		s += ";weight=" + strconv.Itoa(b.Weight)
	}
	return s
}

// FuzzParse: the --backends and YAML scalar syntax never panics; an
// accepted spec builds a ring, and formatting it re-parses to the same
// spec.
func FuzzParse(f *testing.F) {
	for _, s := range []string{
		"http://10.0.0.11:8000", "10.0.0.11:8000", "https://gpu-3.example", "gpu-1=http://10.0.0.12:8000",
		"gpu-big=http://10.0.0.12:8000;zone=us-east-1b;weight=2", " http://[::1]:9000 ; zone = z1 ",
		"http://h:1;weight=1000", "http://h:1;weight=0", "http://h:1;weight=1001", "http://h:1;weight=x",
		"http://h:1;colour=red", "http://h:1;zone", "a b=http://h:1", "=http://h:1", "id=", "",
		"http://h:1/v1", "ftp://h:1", "http://h:99999", "http://u@h:1/?a=b", "x=y=h:1",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		b, err := Parse(s)
		if err != nil {
			return
		}
		id, addr, err := b.Check()
		if err != nil {
			t.Fatalf("accepted %q as %+v, but Check fails: %v", s, b, err)
		}
		rb := ring.Backend{ID: id, Addr: addr, Zone: b.Zone, Weight: b.Weight}
		if b.Weight < 0 || b.Weight > 1000 {
			t.Fatalf("accepted %q with weight %d", s, b.Weight)
		}
		// The id ends at the first '=', options at ';', and spaces around
		// each part are not part of it.
		if strings.ContainsAny(b.ID, "=;") || strings.Contains(b.Zone, ";") || strings.Contains(b.URL, ";") {
			t.Fatalf("%q split wrongly: %+v", s, b)
		}
		for _, v := range []string{b.ID, b.URL, b.Zone} {
			if v != strings.TrimSpace(v) {
				t.Fatalf("%q: part %q not trimmed", s, v)
			}
		}
		checkBackendAddr(t, s, b.URL, rb.Addr)
		rc := ring.DefaultConfig()
		rc.PartitionCount = 7 // a small ring: the backend is what is checked
		if _, err := ring.New(rc, []ring.Backend{rb}); err != nil {
			t.Fatalf("accepted %q, but no ring builds from it: %v", s, err)
		}
		out := formatSpec(b)
		back, err := Parse(out)
		if err != nil {
			t.Fatalf("%q parsed to %+v, formatted as %q, which fails: %v", s, b, out, err)
		}
		if !reflect.DeepEqual(back, b) {
			t.Fatalf("%q parsed to %+v, formatted as %q, re-parsed to %+v", s, b, out, back)
		}
	})
}

// checkBackendAddr: an accepted backend URL names a host that can be
// dialled (an IP address or a DNS name) and carries nothing the router
// would silently drop (user info, query, fragment).
func checkBackendAddr(t *testing.T, spec, rawURL, addr string) {
	t.Helper()
	withScheme := rawURL
	if !strings.Contains(withScheme, "://") {
		withScheme = "http://" + withScheme
	}
	u, err := url.Parse(withScheme)
	if err != nil {
		t.Fatalf("%q accepted, but its URL %q does not parse: %v", spec, rawURL, err)
	}
	if u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		t.Fatalf("%q accepted, dropping user info, query or fragment of %q", spec, rawURL)
	}
	hostport := addr[strings.Index(addr, "://")+3:]
	host, _, err := net.SplitHostPort(hostport)
	if err != nil {
		t.Fatalf("%q accepted as address %q: %v", spec, addr, err)
	}
	if _, err := netip.ParseAddr(host); err == nil {
		return
	}
	for _, c := range []byte(host) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '.' || c == '_') {
			t.Fatalf("%q accepted with host %q, neither an IP address nor a DNS name", spec, host)
		}
	}
}

// Found by FuzzParse: backend URLs whose host could never be
// dialled ("y=h", "%80+++", a C1 control character) or whose user info,
// query or fragment the router silently dropped were accepted.
func TestParseRejectsUndiallableHosts(t *testing.T) {
	for _, s := range []string{"x=y=h:1", "AA@0", "http://user:pass@h:1", "%80+++", "\u0088", "http://h:1/?a=b", "http://h:1#f", "+BBYBY"} {
		if b, err := Parse(s); err == nil {
			t.Errorf("Parse(%q) = %+v, want an error", s, b)
		}
	}
	for _, s := range []string{"http://[fe80::1%25eth0]:1", "gpu_0.gpusim.svc.cluster.local.:8000", "https://10.0.0.1", "[::1]:9"} {
		if _, err := Parse(s); err != nil {
			t.Errorf("Parse(%q): %v", s, err)
		}
	}
}

// TestUnmarshalYAML: a backends list takes spec strings and mappings (the
// only form that declares models); unknown keys in a mapping and bad specs
// are errors that name the problem.
func TestUnmarshalYAML(t *testing.T) {
	var got struct {
		Backends []Spec `yaml:"backends"`
	}
	in := `backends:
  - http://10.0.0.11:8000
  - gpu-2=http://10.0.0.12:8000;zone=b;weight=2
  - id: gpu-big
    url: https://gpu-big.example
    zone: c
    weight: 3
    models: [llama, llama-lora]
`
	dec := yaml.NewDecoder(strings.NewReader(in))
	dec.KnownFields(true)
	if err := dec.Decode(&got); err != nil {
		t.Fatal(err)
	}
	want := []Spec{
		{URL: "http://10.0.0.11:8000"},
		{ID: "gpu-2", URL: "http://10.0.0.12:8000", Zone: "b", Weight: 2},
		{ID: "gpu-big", URL: "https://gpu-big.example", Zone: "c", Weight: 3, Models: []string{"llama", "llama-lora"}},
	}
	if !reflect.DeepEqual(got.Backends, want) {
		t.Fatalf("decoded %+v, want %+v", got.Backends, want)
	}
	for in, want := range map[string]string{
		"backends: [\"http://h:1;weight=0\"]":        "weight",
		"backends: [\"ftp://h:1\"]":                  "scheme must be http or https",
		"backends: [{url: http://h:1, colour: red}]": "colour",
		"backends: [[http://h:1]]":                   "cannot unmarshal",
	} {
		dec := yaml.NewDecoder(strings.NewReader(in))
		dec.KnownFields(true)
		err := dec.Decode(&got)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want an error saying %q", in, err, want)
		}
	}
}

// TestCheck: the ID defaults to host:port, the address keeps the scheme,
// and IDs and weights are bounded.
func TestCheck(t *testing.T) {
	id, addr, err := Spec{URL: "https://gpu.example"}.Check()
	if err != nil || id != "gpu.example:443" || addr != "https://gpu.example:443" {
		t.Fatalf("Check = %q, %q, %v", id, addr, err)
	}
	id, addr, err = Spec{ID: "gpu-1", URL: "10.0.0.1:8000"}.Check()
	if err != nil || id != "gpu-1" || addr != "http://10.0.0.1:8000" {
		t.Fatalf("Check = %q, %q, %v", id, addr, err)
	}
	for _, s := range []Spec{
		{ID: "a b", URL: "http://h:1"}, {ID: strings.Repeat("x", MaxIDLen+1), URL: "http://h:1"},
		{URL: "http://h:1", Weight: -1}, {URL: "http://h:1", Weight: MaxWeight + 1},
	} {
		if _, _, err := s.Check(); err == nil {
			t.Errorf("Check(%+v) accepted", s)
		}
	}
	if err := CheckID(strings.Repeat("x", MaxIDLen)); err != nil {
		t.Errorf("an id of %d characters: %v", MaxIDLen, err)
	}
}
