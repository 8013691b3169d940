package node

import (
	"encoding/json"
	"testing"

	"github.com/warmroute/warmroute/node/cluster"
	"github.com/warmroute/warmroute/ring"
)

// FuzzParseBackendRequest: the admin API's add-backend decoding never
// panics, and what it accepts builds a ring.
func FuzzParseBackendRequest(f *testing.F) {
	for _, s := range []string{
		`{"url":"http://10.0.0.1:8000"}`,
		`{"id":"gpu-1","url":"https://gpu.example","zone":"z","weight":3,"labels":{"a":"b"},"state":"draining"}`,
		`{"url":"ftp://x"}`, `{"url":5}`, `{}`, `[]`, `{"url":"http://h:1"} {}`, `{"url":"http://h:99999"}`,
		`{"id":"a b","url":"http://h:1"}`, `{"url":"http://[::1]:80/"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		cmd, err := ParseBackendRequest(body)
		if err != nil {
			return
		}
		if cmd.Op != cluster.OpUpsertBackend || cmd.Backend == nil || cmd.Backend.ID == "" {
			t.Fatalf("accepted %q as %+v", body, cmd)
		}
		b := cmd.Backend
		st, err := ring.ParseState(b.State)
		if err != nil && b.State != "" {
			return // the state machine rejects it (ErrInvalid)
		}
		if _, err := ring.New(ring.DefaultConfig(), []ring.Backend{{ID: b.ID, Addr: b.URL, Zone: b.Zone, Weight: b.Weight, State: st}}); err != nil {
			t.Fatalf("accepted %q, but no ring builds from it: %v", body, err)
		}
	})
}

// FuzzParseRoutingPatch: config patches never panic, and an accepted patch
// is a valid ring config.
func FuzzParseRoutingPatch(f *testing.F) {
	for _, s := range []string{
		`{"prefix_length":2048}`, `{"strategy":"round-robin","load_factor":1.5}`,
		`{"RoutingStrategy":"PREFIX_AWARE","PrefixLength":4096,"ConcurrencyThreshold":10}`,
		`{"prefix_length":"x"}`, `{"nope":1}`, `null`, `[]`, `{"zone_aware":true,"overflow_depth":3}`,
		`{"partition_count":-1}`, `{"load_factor":0.5}`,
	} {
		f.Add([]byte(s), false)
		f.Add([]byte(s), true)
	}
	f.Fuzz(func(t *testing.T, body []byte, replace bool) {
		out, err := ParseRoutingPatch(cluster.DefaultRouting(), body, replace)
		if err != nil {
			return
		}
		rc, err := out.RingConfig()
		if err != nil {
			t.Fatalf("accepted %q but the config is invalid: %v", body, err)
		}
		if out.Strategy != rc.Strategy.String() {
			t.Fatalf("strategy not canonical: %q", out.Strategy)
		}
		if _, err := json.Marshal(out); err != nil {
			t.Fatal(err)
		}
	})
}
