package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/warmroute/warmroute/loadtest/proc"
)

// wrkScript is a wrk Lua script that cycles through pre-formatted requests
// (so the generator spends no time building them) and prints exact
// figures in done().
func wrkScript(bodies [][]byte, path string) string {
	var b strings.Builder
	b.WriteString("local bodies = {\n")
	for _, body := range bodies {
		fmt.Fprintf(&b, "[==[%s]==],\n", body)
	}
	b.WriteString("}\n")
	fmt.Fprintf(&b, `local reqs = {}
local n = 0
local i = 0
init = function(args)
  for k, body in ipairs(bodies) do
    reqs[k] = wrk.format("POST", %q, {["Content-Type"] = "application/json"}, body)
  end
  n = #reqs
end
request = function()
  i = i %% n + 1
  return reqs[i]
end
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("BENCH requests=%%d duration_us=%%d p50_us=%%d p90_us=%%d p99_us=%%d max_us=%%d mean_us=%%.1f status_errors=%%d socket_errors=%%d\n",
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(90), latency:percentile(99),
    latency.max, latency.mean, e.status, e.connect + e.read + e.write + e.timeout))
end
`, path)
	return b.String()
}

// wrkResult is one wrk run.
type wrkResult struct {
	Requests     int64         `json:"requests"`
	Duration     time.Duration `json:"duration_ns"`
	P50          time.Duration `json:"p50_ns"`
	P90          time.Duration `json:"p90_ns"`
	P99          time.Duration `json:"p99_ns"`
	Max          time.Duration `json:"max_ns"`
	Mean         time.Duration `json:"mean_ns"`
	StatusErrors int64         `json:"status_errors"`
	SocketErrors int64         `json:"socket_errors"`
}

// RPS is requests per second.
func (r wrkResult) RPS() float64 {
	if r.Duration <= 0 {
		return 0
	}
	return float64(r.Requests) / r.Duration.Seconds()
}

// parseWrk reads the BENCH line the script's done() prints.
func parseWrk(out []byte) (wrkResult, error) {
	var r wrkResult
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "BENCH ") {
			continue
		}
		for _, kv := range strings.Fields(line)[1:] {
			k, v, ok := strings.Cut(kv, "=")
			if !ok {
				return r, fmt.Errorf("wrk: bad field %q", kv)
			}
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return r, fmt.Errorf("wrk: field %s: %w", k, err)
			}
			us := time.Duration(f * float64(time.Microsecond))
			switch k {
			case "requests":
				r.Requests = int64(f)
			case "duration_us":
				r.Duration = us
			case "p50_us":
				r.P50 = us
			case "p90_us":
				r.P90 = us
			case "p99_us":
				r.P99 = us
			case "max_us":
				r.Max = us
			case "mean_us":
				r.Mean = us
			case "status_errors":
				r.StatusErrors = int64(f)
			case "socket_errors":
				r.SocketErrors = int64(f)
			}
		}
		if r.Requests == 0 {
			return r, fmt.Errorf("wrk completed no request:\n%s", out)
		}
		return r, nil
	}
	return r, fmt.Errorf("wrk printed no BENCH line:\n%s", out)
}

// wrkRunner runs wrk pinned to the generator's cores.
type wrkRunner struct {
	wrk, taskset string
	cpus         string
	nice         int
	script       string
}

func newWrkRunner(dir, wrkPath, tasksetPath, cpus string, nice int, bodies [][]byte) (*wrkRunner, error) {
	script := filepath.Join(dir, "bench.lua")
	if err := os.WriteFile(script, []byte(wrkScript(bodies, "/v1/chat/completions")), 0o644); err != nil {
		return nil, err
	}
	return &wrkRunner{wrk: wrkPath, taskset: tasksetPath, cpus: cpus, nice: nice, script: script}, nil
}

func (w *wrkRunner) run(ctx context.Context, baseURL string, conns int, d time.Duration) (wrkResult, error) {
	prog, args := pinned(w.taskset, w.cpus, w.nice, w.wrk, "-t1", "-c"+strconv.Itoa(conns),
		"-d"+strconv.Itoa(int(d.Seconds()))+"s", "--timeout", "5s", "-s", w.script,
		baseURL+"/v1/chat/completions")
	cctx, cancel := context.WithTimeout(ctx, d+30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(cctx, prog, args...)
	proc.Prepare(cmd)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return wrkResult{}, fmt.Errorf("wrk %v: %w\n%s", args, err, out)
	}
	return parseWrk(out)
}
