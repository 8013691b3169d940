package backendspec

import (
	"fmt"
	"strconv"
	"strings"
)

// MaxIDLen bounds a backend ID: IDs appear in metric labels, response
// headers, logs and the agreed state.
const MaxIDLen = 253

// MaxWeight bounds a backend's weight.
const MaxWeight = 1000

// Spec describes one backend. In YAML it is a mapping or a string
// "[id=]url[;zone=z][;weight=n]"; the --backends flag takes a
// comma-separated list of such strings. The ID defaults to the URL's
// host:port.
type Spec struct {
	ID     string `yaml:"id"`
	URL    string `yaml:"url"`
	Zone   string `yaml:"zone"`
	Weight int    `yaml:"weight"`
	// Models declares what the backend serves (model ids, adapters
	// included) until its /v1/models answers; empty: learned from that
	// alone. YAML mapping form only.
	Models []string `yaml:"models"`
}

// Parse parses "[id=]url[;zone=z][;weight=n]" and checks the result.
func Parse(s string) (Spec, error) {
	var b Spec
	parts := strings.Split(strings.TrimSpace(s), ";")
	main := parts[0]
	if i := strings.Index(main, "="); i >= 0 && !strings.Contains(main[:i], "/") {
		b.ID, main = strings.TrimSpace(main[:i]), main[i+1:]
	}
	b.URL = strings.TrimSpace(main)
	for _, kv := range parts[1:] {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return b, fmt.Errorf("backend %q: option %q is not key=value", s, kv)
		}
		switch strings.TrimSpace(k) {
		case "zone":
			b.Zone = strings.TrimSpace(v)
		case "weight":
			w, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil || w < 1 || w > MaxWeight {
				return b, fmt.Errorf("backend %q: weight %q must be an integer in [1, 1000]", s, v)
			}
			b.Weight = w
		default:
			return b, fmt.Errorf("backend %q: unknown option %q (want zone or weight)", s, k)
		}
	}
	_, _, err := b.Check()
	return b, err
}

// UnmarshalYAML accepts a mapping or a spec string. It takes the decoder's
// unmarshal function (which go.yaml.in/yaml/v3 still honours) so that the
// package needs no YAML library.
func (b *Spec) UnmarshalYAML(unmarshal func(any) error) error {
	var s string
	if unmarshal(&s) == nil { // a scalar: the spec string
		v, err := Parse(s)
		if err != nil {
			return err
		}
		*b = v
		return nil
	}
	type plain Spec
	var p plain
	if err := unmarshal(&p); err != nil {
		return err
	}
	*b = Spec(p)
	return nil
}

// Check checks the spec and returns the backend's ID (the URL's host:port
// when the spec names none) and its address, scheme://host:port.
func (b Spec) Check() (id, addr string, err error) {
	t, err := ParseTarget(b.URL)
	if err != nil {
		return "", "", err
	}
	id = b.ID
	if id == "" {
		id = t.HostPort
	}
	if CheckID(id) != nil {
		return "", "", fmt.Errorf("backend id %q: 1-253 printable ASCII characters, no spaces or commas", id)
	}
	if b.Weight < 0 || b.Weight > MaxWeight {
		return "", "", fmt.Errorf("backend %s: weight %d must be in [1, 1000]", id, b.Weight)
	}
	return id, t.Addr(), nil
}

// CheckID reports whether id can name a backend: 1-253 printable ASCII
// characters, no spaces or commas. IDs appear in metric labels, response
// headers and logs, so control characters are refused.
func CheckID(id string) error {
	if id == "" || len(id) > MaxIDLen {
		return fmt.Errorf("backend id %q: 1-%d characters", id, MaxIDLen)
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; c <= ' ' || c > '~' || c == ',' {
			return fmt.Errorf("backend id %q: printable ASCII only, no spaces or commas", id)
		}
	}
	return nil
}
