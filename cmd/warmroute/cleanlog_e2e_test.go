package main

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/warmroute/warmroute/loadtest/fleet"
	"github.com/warmroute/warmroute/loadtest/proc"
)

// A clean start, a few requests and a clean shutdown log no warning and
// no error: one router alone, and three routers in one cluster as the demo
// runs them (started back to back, so they try to join one another before
// all listen, and stopped by the fleet as the demo stops them). A warning
// in a healthy run teaches operators to ignore warnings.

var warnOrError = regexp.MustCompile(`(?m)^.*level=(WARN|ERROR) .*$`)

func TestE2ECleanLogs(t *testing.T) {
	t.Parallel()
	needBinary(t)
	for _, c := range []struct {
		name    string
		routers int
		args    func(int, []fleet.Router, *proc.ServeArgs) error
	}{
		{"one router", 1, nil},
		{"three routers", 3, demoClusterArgs()},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := fleet.DefaultConfig()
			cfg.Exe = binPath
			cfg.Instances = 2
			cfg.GpusimArgs = proc.GpusimArgs{TimeScale: 0.01}.Flags()
			cfg.Routers = c.routers
			cfg.RouterArgs = c.args
			cfg.LogDir = t.TempDir()
			cfg.StopTimeout = 10 * time.Second
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			f, err := fleet.Start(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			closed := false
			defer func() {
				if !closed {
					f.Close()
				}
			}()
			for i, u := range f.Targets() {
				body := fmt.Sprintf(`{"model":%q,"prompt":"clean logs %d","max_tokens":4}`, gpusimModel, i)
				resp, err := http.Post(u+"/v1/completions", "application/json", strings.NewReader(body))
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					t.Errorf("POST %s/v1/completions: %s", u, resp.Status)
				}
			}
			// Long enough for the periodic work (scrapes, gossip rounds,
			// the leader's reconcile) to run a few times.
			time.Sleep(1500 * time.Millisecond)
			if err := f.Close(); err != nil {
				t.Fatal(err)
			}
			closed = true

			logs, err := filepath.Glob(filepath.Join(cfg.LogDir, "*.log"))
			if err != nil || len(logs) != 1+c.routers {
				t.Fatalf("logs %v (%v), want gpusim's and %d routers'", logs, err, c.routers)
			}
			for _, l := range logs {
				b, err := os.ReadFile(l)
				if err != nil {
					t.Fatal(err)
				}
				if strings.HasPrefix(filepath.Base(l), "router-") && !bytes.Contains(b, []byte(`msg="router serving"`)) {
					t.Errorf("%s: no start logged (the log format changed?):\n%s", filepath.Base(l), b)
				}
				for _, line := range warnOrError.FindAll(b, -1) {
					t.Errorf("%s: %s", filepath.Base(l), line)
				}
			}
		})
	}
}
