package gpusim

import (
	"context"
	"fmt"
	"net/http"
	"testing"
)

func TestFleetServesIndependentInstances(t *testing.T) {
	cfg := FastConfig()
	f, err := StartFleet(t.Context(), FleetConfig{N: 3, Instance: cfg})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	urls := f.URLs()
	if len(urls) != 3 || len(f.Instances()) != 3 {
		t.Fatalf("urls %v", urls)
	}
	client := &http.Client{}
	defer client.CloseIdleConnections()
	body := tokenIDsBody(seqIDs(0, 64), `,"max_tokens":1`)
	for i, u := range urls {
		ts := &testServer{in: f.Instances()[i], c: client}
		ts.srv = fakeSrv(u)
		resp, b := ts.do(t, http.MethodPost, "/v1/completions", body)
		if resp.StatusCode != 200 {
			t.Fatalf("%s: %d %s", u, resp.StatusCode, b)
		}
		if got, want := resp.Header.Get("X-Gpusim-Instance"), fmt.Sprintf("gpu-%d", i); got != want {
			t.Fatalf("%s: X-Gpusim-Instance %q, want %q", u, got, want)
		}
		// Each instance has its own cache: the prompt is new to every one.
		if st := f.Instances()[i].Stats(); st.CachedTokens != 0 || st.Completed != 1 {
			t.Fatalf("%s: stats %+v", u, st)
		}
	}
	if err := f.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := f.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := client.Get(urls[0] + "/ping"); err == nil {
		t.Fatal("instance still serving after Close")
	}
}

func TestFleetClosesWithItsContext(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	f, err := StartFleet(ctx, FleetConfig{N: 1, NamePrefix: "node-", Instance: FastConfig()})
	if err != nil {
		t.Fatal(err)
	}
	if f.Instances()[0].Name() != "node-0" {
		t.Fatalf("name %q, want node-0", f.Instances()[0].Name())
	}
	cancel()
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestFleetConsecutivePortsAndErrors(t *testing.T) {
	if _, err := StartFleet(t.Context(), FleetConfig{N: 0, Instance: FastConfig()}); err == nil {
		t.Fatal("N=0 accepted")
	}
	bad := FastConfig()
	bad.TimeScale = 0
	if _, err := StartFleet(t.Context(), FleetConfig{N: 2, Instance: bad}); err == nil {
		t.Fatal("invalid instance config accepted")
	}
	// Take a free port, then ask for two fleets on the same ports.
	f, err := StartFleet(t.Context(), FleetConfig{N: 1, Instance: FastConfig()})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var port int
	if _, err := fmt.Sscanf(f.URLs()[0], "http://127.0.0.1:%d", &port); err != nil {
		t.Fatal(err)
	}
	if _, err := StartFleet(t.Context(), FleetConfig{N: 2, FirstPort: port - 1, Instance: FastConfig()}); err == nil {
		t.Fatal("a fleet started on a port in use")
	}
}
