package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warmroute/warmroute/loadtest/proc"
)

// serveHelpGolden is what 'warmroute serve --help' prints. The settings
// sections declare the flags, their help and their defaults; a change to
// any of them shows here (rewrite with -update-golden).
const serveHelpGolden = "testdata/serve-help.golden"

// TestE2EServeHelpUnchanged: 'warmroute serve --help' prints what the
// golden file holds, byte for byte: moving a setting between types keeps
// its flag, default and help.
func TestE2EServeHelpUnchanged(t *testing.T) {
	t.Parallel()
	needBinary(t)
	out, code := runCLIExit(t, nil, "serve", "--help")
	if code != 0 {
		t.Fatalf("serve --help: exit %d\n%s", code, out)
	}
	if *updateGolden {
		if err := os.WriteFile(serveHelpGolden, []byte(out), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(serveHelpGolden)
	if err != nil {
		t.Fatal(err)
	}
	if out != string(want) {
		t.Fatalf("serve --help differs from %s (rewrite it with -update-golden if the change is meant):\n%s", serveHelpGolden, lineDiff(string(want), out))
	}
}

// lineDiff lists the lines only one of a and b has.
func lineDiff(a, b string) string {
	in := func(s string) map[string]bool {
		m := map[string]bool{}
		for _, l := range strings.Split(s, "\n") {
			m[l] = true
		}
		return m
	}
	ina, inb := in(a), in(b)
	var out []string
	for _, l := range strings.Split(a, "\n") {
		if !inb[l] {
			out = append(out, "- "+l)
		}
	}
	for _, l := range strings.Split(b, "\n") {
		if !ina[l] {
			out = append(out, "+ "+l)
		}
	}
	return strings.Join(out, "\n")
}

// serveOutcome runs 'warmroute serve' with args on free loopback ports
// and returns its output and exit status once it exits on its own. A
// router that starts serving instead is stopped at once and started is
// true; one that does neither within a minute fails the test.
func serveOutcome(t *testing.T, args ...string) (out string, code int, started bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	args = append([]string{"serve", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"}, args...)
	cmd := exec.CommandContext(ctx, binPath, args...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout = io.Discard
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var (
		mu   sync.Mutex
		logs strings.Builder
	)
	serving := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(stderr)
		once := sync.Once{}
		for sc.Scan() {
			mu.Lock()
			logs.WriteString(sc.Text() + "\n")
			mu.Unlock()
			if strings.Contains(sc.Text(), `msg="router serving"`) {
				once.Do(func() { close(serving) })
			}
		}
	}()
	select {
	case <-serving:
		cmd.Process.Kill()
		started = true
	case <-done:
	case <-ctx.Done():
	}
	<-done
	err = cmd.Wait()
	mu.Lock()
	out = logs.String()
	mu.Unlock()
	if ctx.Err() != nil {
		t.Fatalf("serve %v neither exited nor served within a minute:\n%s", args, out)
	}
	var ee *exec.ExitError
	switch {
	case started:
		return out, -1, true
	case err == nil:
		return out, 0, false
	case errors.As(err, &ee):
		return out, ee.ExitCode(), false
	}
	t.Fatalf("serve %v: %v", args, err)
	return "", 0, false
}

// TestE2EBackendKeyTypoRefused: an unknown key in a backend of the config
// file's backends list is an error, as an unknown key anywhere else is
// ("a typo never silently falls back to a default"). Before, a backend
// written as a mapping was decoded without the file's strict decoder, so
// `wieght: 5` or `model: [...]` was dropped without a word and the router
// served with weight 1 and no declared models.
func TestE2EBackendKeyTypoRefused(t *testing.T) {
	t.Parallel()
	needBinary(t)
	dir := t.TempDir()
	for name, c := range map[string]struct{ yaml, key string }{
		"weight": {"backends:\n  - url: http://127.0.0.1:9\n    wieght: 5\n", "wieght"},
		"models": {"backends:\n  - id: gpu-1\n    url: http://127.0.0.1:9\n    model: [llama]\n", "model"},
	} {
		path := filepath.Join(dir, name+".yaml")
		if err := os.WriteFile(path, []byte(c.yaml), 0o600); err != nil {
			t.Fatal(err)
		}
		out, code, started := serveOutcome(t, "--config", path)
		if started {
			t.Errorf("%s: the router started with the unknown backend key %q:\n%s", name, c.key, out)
			continue
		}
		if code == 0 || !strings.Contains(out, "field "+c.key+" not found") {
			t.Errorf("%s: exit %d, want a non-zero exit naming the key %q:\n%s", name, code, c.key, out)
		}
	}
	// The same backends, spelled right, start.
	path := filepath.Join(dir, "right.yaml")
	if err := os.WriteFile(path, []byte("backends:\n  - id: gpu-1\n    url: http://127.0.0.1:9\n    weight: 5\n    models: [llama]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, code, started := serveOutcome(t, "--config", path); !started {
		t.Errorf("the backends spelled right did not start the router: exit %d\n%s", code, out)
	}
}

// TestE2EBodyLimitsCheckedWithoutOverflow: --max-body-memory must be at
// least twice --max-body-size, whatever the size. Before, the check
// doubled the size in an int64, so a size of 2^62 bytes (the largest a
// size may be) doubled to a negative number and passed with any memory
// budget, and the router started with bodies allowed beyond its whole
// body memory.
func TestE2EBodyLimitsCheckedWithoutOverflow(t *testing.T) {
	t.Parallel()
	needBinary(t)
	for _, args := range [][]string{
		{"--max-body-size", "4611686018427387904"},
		{"--max-body-size", "4294967296GiB", "--max-body-memory", "1GiB"},
		{"--max-body-size", "4611686018427387904", "--max-body-memory", "4611686018427387904"},
	} {
		out, code, started := serveOutcome(t, args...)
		if started {
			t.Errorf("%v: the router started:\n%s", args, out)
			continue
		}
		if code == 0 || !strings.Contains(out, "max body memory must be at least twice the max request body size") {
			t.Errorf("%v: exit %d, want the body memory refused:\n%s", args, code, out)
		}
	}
	// At the bound the check still passes.
	if out, code, started := serveOutcome(t, "--max-body-size", "1GiB", "--max-body-memory", "2GiB"); !started {
		t.Errorf("max-body-size 1GiB with max-body-memory 2GiB: exit %d\n%s", code, out)
	}
}

// TestE2EBodyTooLargeNamesItsSetting: the 413 body_too_large answer names
// the setting that bounds the body, --max-body-size, both for a declared
// length and for a chunked body cut at the limit. Before, both messages
// named a "maxSize-body-size" that no flag, variable or key is called.
func TestE2EBodyTooLargeNamesItsSetting(t *testing.T) {
	t.Parallel()
	needBinary(t)
	e := newEngine(t, 0, 0, 1)
	r := startRouter(t, proc.ServeArgs{Backends: []string{e.srv.URL}, NoEngineMetrics: true, Extra: []string{"--max-body-size", "1KiB"}})
	body := `{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("a", 4<<10) + `"}]}`
	for name, rd := range map[string]io.Reader{
		"declared": strings.NewReader(body),
		"chunked":  io.MultiReader(strings.NewReader(body)), // no length: sent chunked
	} {
		resp, err := http.Post(r.url+"/v1/chat/completions", "application/json", rd)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var msg struct {
			Error struct{ Message, Code string }
		}
		if resp.StatusCode != http.StatusRequestEntityTooLarge || json.Unmarshal(b, &msg) != nil || msg.Error.Code != "body_too_large" {
			t.Fatalf("%s: %d %s, want 413 body_too_large", name, resp.StatusCode, b)
		}
		if !strings.Contains(msg.Error.Message, "1024 bytes (max-body-size)") {
			t.Errorf("%s: message %q does not name --max-body-size", name, msg.Error.Message)
		}
	}
	if n := e.hits.Load(); n != 0 {
		t.Errorf("the engine saw %d of the refused requests", n)
	}
}
