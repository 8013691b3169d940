package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/warmroute/warmroute/loadtest/proc"
	"github.com/warmroute/warmroute/node"
	"github.com/warmroute/warmroute/node/admin"
)

func TestDurationFlagsHint(t *testing.T) {
	t.Parallel()
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	d := fs.Duration("wait", 2*time.Second, "how long to wait")
	n := fs.Int("n", 1, "a count")
	hintDurations(fs)
	for _, bad := range []string{"500", "1.5", "soon"} {
		err := fs.Parse([]string{"--wait", bad})
		if err == nil || !strings.Contains(err.Error(), durationHint) {
			t.Errorf("--wait %s: %v, want the unit hint", bad, err)
		}
	}
	if err := fs.Parse([]string{"--wait", "500ms", "--n", "3"}); err != nil || *d != 500*time.Millisecond || *n != 3 {
		t.Fatalf("parse: %v %v %v", err, *d, *n)
	}
	var help strings.Builder
	fs.SetOutput(&help)
	fs.PrintDefaults()
	if !regexp.MustCompile(`-wait duration\n.*with a unit: 500ms, 2s.*\(default 2s\)`).MatchString(help.String()) {
		t.Errorf("help does not hint at the unit:\n%s", help.String())
	}
	if strings.Count(help.String(), "with a unit") != 1 {
		t.Errorf("the hint is on a flag that is not a duration:\n%s", help.String())
	}
}

func TestParseArgsFlagsAfterPositionals(t *testing.T) {
	t.Parallel()
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	zone := fs.String("zone", "", "")
	pos, err := parseArgs(fs, []string{"add", "http://x:1", "--zone", "a"})
	if err != nil || *zone != "a" || strings.Join(pos, " ") != "add http://x:1" {
		t.Fatalf("pos %q zone %q err %v", pos, *zone, err)
	}
	pos, err = parseArgs(fs, []string{"add", "--", "--zone"})
	if err != nil || strings.Join(pos, " ") != "add --zone" {
		t.Fatalf("after --: pos %q err %v", pos, err)
	}
	_, err = parseArgs(fs, []string{"list", "--zome", "a"})
	var u usageError
	if !errors.As(err, &u) || !strings.Contains(err.Error(), "did you mean --zone?") {
		t.Fatalf("unknown flag: %v", err)
	}
}

func TestUnknownEnv(t *testing.T) {
	t.Parallel()
	known := []string{"WARMROUTE_PREFIX_LENGTH", "WARMROUTE_LISTEN"}
	if err := unknownEnv([]string{"PATH=/bin", "WARMROUTE_LISTEN=:1", "HOME=/"}, known); err != nil {
		t.Fatal(err)
	}
	err := unknownEnv([]string{"WARMROUTE_PREFIX_LENTH=8192", "WARMROUTE_ZZZZZZZZZZZ=1"}, known)
	if exitCode(err) != 2 {
		t.Fatalf("exit code %d for %v", exitCode(err), err)
	}
	for _, want := range []string{"WARMROUTE_PREFIX_LENTH is not a setting (did you mean WARMROUTE_PREFIX_LENGTH?)", "WARMROUTE_ZZZZZZZZZZZ is not a setting"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%v lacks %q", err, want)
		}
	}
}

// TestServeKnowsEveryProjectVariable: every WARMROUTE_* variable serve
// reads or the project sets is known, so none is refused as a typo.
func TestServeKnowsEveryProjectVariable(t *testing.T) {
	t.Parallel()
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	cfg := node.DefaultConfig()
	serveFlags(fs, &cfg)
	known := serveEnvNames(fs)
	for _, n := range []string{"WARMROUTE_BACKENDS", "WARMROUTE_GOSSIP_KEY", "WARMROUTE_ADMIN_TOKEN", "WARMROUTE_CONFIG", "WARMROUTE_PREFIX_LENGTH", "WARMROUTE_E2E_BIN"} {
		if err := unknownEnv([]string{n + "=x"}, known); err != nil {
			t.Errorf("%s: %v", n, err)
		}
	}
	if err := unknownEnv([]string{"WARMROUTE_ROUTINGSTRATEGY=x"}, known); err == nil {
		t.Error("a SageMaker alias's name was taken as a variable")
	}
}

func TestSettingValueErrors(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ kv, want string }{
		{"concurrency_threshold=abc", `concurrency_threshold="abc": concurrency_threshold takes an integer, e.g. concurrency_threshold=16`},
		{"load_factor=x", "load_factor takes a finite number, e.g. load_factor="},
		{"busy_is_full=yes", "busy_is_full takes true or false, e.g. busy_is_full=false"},
		{"strategy=FOO", "strategy takes a name, e.g. strategy=PREFIX_AWARE"},
		{"prefix_lenght=1", `unknown setting "prefix_lenght" (did you mean prefix_length?)`},
	} {
		k, v, _ := strings.Cut(c.kv, "=")
		_, err := settingValue(k, v)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", c.kv, err, c.want)
		}
	}
}

func TestExitCodes(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		err  error
		want int
	}{
		{nil, 0}, {flag.ErrHelp, 0}, {usageErrorf("bad"), 2}, {fmt.Errorf("wrapped: %w", usageErrorf("bad")), 2},
		{errors.New("server said no"), 1}, {&admin.APIError{Status: 400}, 1},
	} {
		if got := exitCode(c.err); got != c.want {
			t.Errorf("exitCode(%v) = %d, want %d", c.err, got, c.want)
		}
	}
}

func TestVersionText(t *testing.T) {
	t.Parallel()
	v := versionText()
	if !strings.HasPrefix(v, "warmroute "+version+"\n") || !strings.Contains(v, "go:") {
		t.Fatalf("version text %q", v)
	}
}

// runCLIExit runs the binary with env added and returns its output and
// exit status.
func runCLIExit(t *testing.T, env []string, args ...string) (string, int) {
	t.Helper()
	cmd := exec.Command(binPath, args...)
	cmd.Env = append(cmd.Environ(), env...)
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return string(out), 0
	case errors.As(err, &ee):
		return string(out), ee.ExitCode()
	}
	t.Fatalf("%v: %v", args, err)
	return "", 0
}

// TestE2ECLIUsage: the binary's version, unit hints, typo hints and exit
// statuses, with nothing to talk to.
func TestE2ECLIUsage(t *testing.T) {
	t.Parallel()
	needBinary(t)
	for _, c := range []struct {
		env  []string
		args []string
		code int
		want []string
	}{
		{nil, []string{"--version"}, 0, []string{"warmroute ", "go:        go1."}},
		{nil, []string{"version"}, 0, []string{"go:        go1."}},
		{nil, []string{"serve", "--read-timeout", "500"}, 2, []string{`"500" has no unit: use a unit, e.g. 500ms or 2s`}},
		{nil, []string{"serve", "--help"}, 0, []string{"(a duration with a unit: 500ms, 2s, 5m)"}},
		{[]string{"WARMROUTE_PREFIX_LENTH=8192"}, []string{"serve"}, 2, []string{"WARMROUTE_PREFIX_LENTH is not a setting (did you mean WARMROUTE_PREFIX_LENGTH?)"}},
		{[]string{"WARMROUTE_PROBE_INTERVAL=5"}, []string{"serve"}, 2, []string{"WARMROUTE_PROBE_INTERVAL", "use a unit"}},
		{nil, []string{"serve", "--prefix-lenth", "8192"}, 2, []string{"did you mean --prefix-length?"}},
		{nil, []string{"config", "--admin", "127.0.0.1:1", "set", "concurrency_threshold=abc"}, 2, []string{"concurrency_threshold takes an integer, e.g. concurrency_threshold=16"}},
		{nil, []string{"config", "--admin", "127.0.0.1:1", "get"}, 1, []string{"cannot reach the admin API"}},
		{nil, []string{"statsu"}, 2, []string{"did you mean status?"}},
	} {
		out, code := runCLIExit(t, c.env, c.args...)
		if code != c.code {
			t.Errorf("%v %v: exit %d, want %d\n%s", c.env, c.args, code, c.code, out)
		}
		for _, w := range c.want {
			if !strings.Contains(out, w) {
				t.Errorf("%v %v: output lacks %q:\n%s", c.env, c.args, w, out)
			}
		}
	}
}

// vllmStub is an engine that answers requests and exports vLLM's queue
// and KV-cache gauges.
func vllmStub(t *testing.T) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/health":
		case "/metrics":
			io.WriteString(w, "vllm:kv_cache_usage_perc{model_name=\"m\"} 0.375\nvllm:num_requests_running{model_name=\"m\"} 5\nvllm:num_requests_waiting{model_name=\"m\"} 2\n")
		default:
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, `{"object":"chat.completion","choices":[{"message":{"content":"ok"}}]}`)
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

// TestE2EBackendsTableAndEngineFigures: 'backends list' is an aligned
// table (JSON with -o json), flags may follow the action, a value the
// router refuses exits 1, and the engine's figures show in the table,
// in 'status' and in /status.
func TestE2EBackendsTableAndEngineFigures(t *testing.T) {
	t.Parallel()
	needBinary(t)
	a, b := vllmStub(t), vllmStub(t)
	r := startRouter(t, proc.ServeArgs{Backends: []string{"a=" + a.URL}, Extra: []string{"--engine-scrape-interval", "100ms"}})
	adminURL := r.admin
	out, code := runCLIExit(t, nil, "backends", "add", b.URL, "--admin", adminURL, "--id", "b", "--zone", "z3")
	if code != 0 || !strings.Contains(out, `"epoch"`) {
		t.Fatalf("backends add with flags after the URL: exit %d\n%s", code, out)
	}
	var table string
	if _, err := pollUntil(15*time.Second, func() (bool, error) {
		table, code = runCLIExit(t, nil, "backends", "list", "--admin", adminURL)
		return code == 0 && strings.Count(table, "37.5%") == 2, nil
	}); err != nil {
		t.Fatalf("backends list never showed both engines' figures: exit %d\n%s", code, table)
	}
	lines := strings.Split(strings.TrimSpace(table), "\n")
	var header, rowB string
	for _, l := range lines {
		switch {
		case strings.HasPrefix(l, "BACKEND"):
			header = l
		case strings.HasPrefix(l, "b "):
			rowB = l
		}
	}
	if header == "" || rowB == "" {
		t.Fatalf("no header or row for b:\n%s", table)
	}
	// Aligned: each column starts where its header does.
	for _, col := range []string{"STATE", "ZONE", "KV USED", "RUNNING", "WAITING", "URL"} {
		i := strings.Index(header, col)
		if i <= 0 || len(rowB) <= i || rowB[i-1] != ' ' || rowB[i] == ' ' {
			t.Errorf("column %s (at %d) not aligned:\n%s\n%s", col, i, header, rowB)
		}
	}
	if f := strings.Fields(rowB); !strings.Contains(rowB, "z3") || f[len(f)-1] != b.URL || !strings.Contains(rowB, " 5 ") || !strings.Contains(rowB, " 2 ") {
		t.Errorf("row for b: %q", rowB)
	}
	out, code = runCLIExit(t, nil, "backends", "list", "-o", "json", "--admin", adminURL)
	var list admin.BackendList
	if err := json.Unmarshal([]byte(out), &list); code != 0 || err != nil || len(list.Backends) != 2 {
		t.Fatalf("backends list -o json: exit %d %v\n%s", code, err, out)
	}
	out, code = runCLIExit(t, nil, "status", "--admin", adminURL)
	if code != 0 || !strings.Contains(out, "KV USED") || strings.Count(out, "37.5%") != 2 {
		t.Fatalf("status: exit %d\n%s", code, out)
	}
	resp, err := http.Get(adminURL + "/status")
	if err != nil {
		t.Fatal(err)
	}
	var st admin.Status
	err = json.NewDecoder(resp.Body).Decode(&st)
	resp.Body.Close()
	if err != nil || len(st.Backends) != 2 || st.Backends[0].Engine == nil || st.Backends[0].Engine.Waiting == nil || *st.Backends[0].Engine.Waiting != 2 {
		t.Fatalf("/status: %v %+v", err, st.Backends)
	}
	out, code = runCLIExit(t, nil, "config", "set", "prefix_length=10", "--admin", adminURL)
	if code != 1 || !strings.Contains(out, "out of range") {
		t.Fatalf("a value the router refuses: exit %d, want 1\n%s", code, out)
	}
}
