package admin

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/warmroute/warmroute/ring"
)

// decodeStrict reads a JSON body, refusing unknown fields and trailing
// data.
func decodeStrict(body []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("request body: %w", err)
	}
	if dec.More() {
		return errors.New("request body: trailing data after the JSON object")
	}
	return nil
}

// ParseRoutingPatch merges a JSON object of routing fields over cur (over
// the defaults when replace is set), by their admin API names or
// SageMaker's (RoutingStrategy, PrefixLength, ConcurrencyThreshold). A
// field named twice, under either name, is an error.
func ParseRoutingPatch(cur ring.Settings, body []byte, replace bool) (ring.Settings, error) {
	raw, err := objectFields(body)
	if err != nil {
		return cur, fmt.Errorf("request body: %w", err)
	}
	out := cur
	if replace {
		out = ring.DefaultSettings()
	}
	given := map[string]string{} // setting -> the name it was given as
	for _, f := range raw {
		info, ok := ring.LookupSetting(f.name)
		if !ok {
			return cur, fmt.Errorf("unknown routing field %q", f.name)
		}
		if prev, dup := given[info.JSON]; dup {
			if prev == f.name {
				return cur, fmt.Errorf("routing field %q given twice", f.name)
			}
			return cur, fmt.Errorf("routing field %q given twice, as %q and %q: give it once", info.JSON, prev, f.name)
		}
		given[info.JSON] = f.name
		if err := json.Unmarshal(f.value, out.Field(info)); err != nil {
			return cur, fmt.Errorf("routing field %q: %w", f.name, err)
		}
	}
	if err := out.Validate(); err != nil {
		return cur, err
	}
	return out, nil
}

// field is one member of a JSON object, in order.
type field struct {
	name  string
	value json.RawMessage
}

// objectFields reads a JSON object's members in order, duplicates
// included (encoding/json keeps the last of a duplicated key silently).
func objectFields(body []byte) ([]field, error) {
	dec := json.NewDecoder(bytes.NewReader(body))
	if t, err := dec.Token(); err != nil {
		return nil, err
	} else if d, ok := t.(json.Delim); !ok || d != '{' {
		return nil, errors.New("want a JSON object")
	}
	var out []field
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return nil, err
		}
		name, ok := t.(string)
		if !ok {
			return nil, errors.New("want a JSON object")
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, err
		}
		out = append(out, field{name: name, value: v})
	}
	if _, err := dec.Token(); err != nil { // the closing '}'
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("trailing data after the JSON object")
	}
	return out, nil
}
