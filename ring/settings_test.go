package ring

import (
	"encoding/json"
	"reflect"
	"testing"

	"go.yaml.in/yaml/v3"
)

// TestSettingsTags: every setting has all its names, they are unique, and
// the JSON and YAML encodings use them.
func TestSettingsTags(t *testing.T) {
	seen := map[string]bool{}
	for _, s := range SettingsInfo() {
		for _, n := range []string{s.JSON, s.YAML, s.Flag, s.Help} {
			if n == "" {
				t.Fatalf("setting %s lacks a name or its help: %+v", s.Field, s)
			}
		}
		for _, n := range []string{"json:" + s.JSON, "yaml:" + s.YAML, "flag:" + s.Flag, "sm:" + s.SageMaker} {
			if n != "sm:" && seen[n] {
				t.Fatalf("name %s used twice", n)
			}
			seen[n] = true
		}
		if got, ok := LookupSetting(s.JSON); !ok || got.Field != s.Field {
			t.Fatalf("LookupSetting(%q) = %+v, %v", s.JSON, got, ok)
		}
		if s.SageMaker != "" {
			if got, ok := LookupSetting(s.SageMaker); !ok || got.Field != s.Field {
				t.Fatalf("LookupSetting(%q) = %+v, %v", s.SageMaker, got, ok)
			}
		}
	}
	if _, ok := LookupSetting("PrefixLengthX"); ok {
		t.Fatal("an unknown name was found")
	}

	// Every field, set to a non-zero value, round-trips through JSON and
	// YAML under the tag names, and Field points at it.
	s := Settings{Strategy: ConsistentHash, PrefixLength: 2048, ConcurrencyThreshold: 3, LoadFactor: 1.5,
		InvocationsJSON: true, BusyIsFull: true, OverflowDepth: 5, PartitionCount: 97, ZoneAware: true,
		KeyDepth: AdaptiveDepth, Overflow: CostOverflow, SessionHeader: "X-Session-Id"}
	v := reflect.ValueOf(s)
	for _, info := range SettingsInfo() {
		if v.Field(info.Index).IsZero() {
			t.Fatalf("test value leaves %s zero", info.Field)
		}
		if reflect.ValueOf(s.Field(info)).Elem().Interface() != v.Field(info.Index).Interface() {
			t.Fatalf("Field(%s) points elsewhere", info.Field)
		}
	}
	var m map[string]any
	b, _ := json.Marshal(s)
	if err := json.Unmarshal(b, &m); err != nil || len(m) != len(SettingsInfo()) {
		t.Fatalf("JSON %s: %v", b, err)
	}
	var back Settings
	if err := json.Unmarshal(b, &back); err != nil || back != s {
		t.Fatalf("JSON round trip: %+v %v", back, err)
	}
	y, _ := yaml.Marshal(s)
	var yback Settings
	if err := yaml.Unmarshal(y, &yback); err != nil || yback != s {
		t.Fatalf("YAML round trip %s: %+v %v", y, yback, err)
	}
	for _, info := range SettingsInfo() {
		if _, ok := m[info.JSON]; !ok {
			t.Fatalf("JSON lacks %s: %s", info.JSON, b)
		}
	}
}
