package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/warmroute/warmroute/loadtest/proc"
)

// children stops, in reverse start order, everything the harness started.
type children struct {
	mu   sync.Mutex
	list []*proc.Process
}

// pinned is the command line that runs argv pinned to cpus (taskset) and,
// when nice is not 0, at that niceness (every thread inherits both).
func pinned(taskset, cpus string, nice int, argv ...string) (string, []string) {
	args := append([]string{"-c", cpus}, argv...)
	if nice == 0 {
		return taskset, args
	}
	return "nice", append([]string{"-n", strconv.Itoa(nice), taskset}, args...)
}

// start runs argv pinned to cpus at niceness nice. taskset and nice exec
// the program, so the process's pid is the program's.
func (cs *children) start(name, taskset, cpus string, nice int, argv ...string) (*proc.Process, error) {
	prog, args := pinned(taskset, cpus, nice, argv...)
	p, err := proc.Start(proc.Spec{Name: name, Path: prog, Args: args})
	if err != nil {
		return nil, err
	}
	cs.mu.Lock()
	cs.list = append(cs.list, p)
	cs.mu.Unlock()
	return p, nil
}

// stopAll sends SIGTERM to every child's process group, then SIGKILL to
// those still running after grace, and waits for them.
func (cs *children) stopAll(grace time.Duration) {
	cs.mu.Lock()
	list := cs.list
	cs.list = nil
	cs.mu.Unlock()
	for i := len(list) - 1; i >= 0; i-- {
		list[i].Stop(grace)
	}
}

// cpuTime is a process's user+system CPU time so far, all threads
// included, from /proc/<pid>/stat (clock ticks of 1/100 s).
func cpuTime(pid int) (time.Duration, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	return parseStatCPU(b)
}

// clockTick is USER_HZ, 100 on every Linux architecture Go supports.
const clockTick = 10 * time.Millisecond

func parseStatCPU(b []byte) (time.Duration, error) {
	// The command name is in parentheses and may hold spaces: fields are
	// counted after the last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, errors.New("proc stat: no command name")
	}
	f := strings.Fields(string(b[i+1:]))
	// After ')': state(3) ... utime is field 14, stime 15 (1-based over
	// the whole line), i.e. indexes 11 and 12 here.
	if len(f) < 13 {
		return 0, errors.New("proc stat: too few fields")
	}
	ut, err1 := strconv.ParseUint(f[11], 10, 64)
	st, err2 := strconv.ParseUint(f[12], 10, 64)
	// Ticks beyond a century of CPU would overflow time.Duration.
	const maxTicks = uint64(100 * 365 * 24 * time.Hour / clockTick)
	if err1 != nil || err2 != nil || ut > maxTicks || st > maxTicks {
		return 0, errors.New("proc stat: bad utime/stime")
	}
	return time.Duration(ut+st) * clockTick, nil
}

// chatCheck is a readiness check: a chat request through url gets a 200.
func chatCheck(url string, body []byte) func(context.Context) error {
	client := &http.Client{Timeout: 2 * time.Second}
	return func(ctx context.Context) error {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/chat/completions", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			return errors.New(resp.Status)
		}
		return nil
	}
}

// waitReady polls until a chat request through url gets a 200, or the
// deadline passes or p (when not nil) exits.
func waitReady(ctx context.Context, p *proc.Process, url string, body []byte, d time.Duration) error {
	check := chatCheck(url, body)
	if p != nil {
		return p.WaitReady(ctx, d, check)
	}
	if _, err := proc.Poll(ctx, d, proc.PollInterval, func() (bool, error) {
		err := check(ctx)
		return err == nil, err
	}); err != nil {
		return fmt.Errorf("%s not ready: %w", url, err)
	}
	return nil
}

// listenLines returns the addresses of the whole "LISTEN addr" lines in
// out (a last line without its newline may still be being written).
func listenLines(out string) []string {
	var addrs []string
	lines := strings.Split(out, "\n")
	for _, line := range lines[:len(lines)-1] {
		if a, ok := strings.CutPrefix(line, "LISTEN "); ok {
			addrs = append(addrs, a)
		}
	}
	return addrs
}

// listenAddrs waits until the stub process has printed n "LISTEN addr"
// lines and returns the addresses.
func listenAddrs(ctx context.Context, stubs *proc.Process, n int, timeout time.Duration) ([]string, error) {
	var addrs []string
	err := stubs.WaitReady(ctx, timeout, func(context.Context) error {
		if addrs = listenLines(stubs.Logs()); len(addrs) < n {
			return fmt.Errorf("stub printed %d of %d addresses", len(addrs), n)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return addrs[:n], nil
}

// maxMemBytes bounds the memory figures read from /metrics: more is a
// misreading.
const maxMemBytes = proc.MaxMemBytes

// goStats are a Go process's figures from its Prometheus /metrics.
type goStats struct {
	HeapInuse  int64 // go_memstats_heap_inuse_bytes
	StackInuse int64 // go_memstats_stack_inuse_bytes
	Goroutines int64 // go_goroutines
	Mallocs    int64 // go_memstats_mallocs_total
}

// maxMetricsBody bounds a /metrics answer read by scrapeGoStats.
const maxMetricsBody = 16 << 20

// scrapeGoStats reads url (a /metrics endpoint) once.
func scrapeGoStats(ctx context.Context, url string) (goStats, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return goStats{}, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return goStats{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		return goStats{}, fmt.Errorf("%s: %s", url, resp.Status)
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxMetricsBody))
	if err != nil {
		return goStats{}, err
	}
	var s goStats
	for _, m := range []struct {
		name string
		dst  *int64
	}{
		{"go_memstats_heap_inuse_bytes", &s.HeapInuse},
		{"go_memstats_stack_inuse_bytes", &s.StackInuse},
		{"go_goroutines", &s.Goroutines},
		{"go_memstats_mallocs_total", &s.Mallocs},
	} {
		if *m.dst, err = parseGauge(b, m.name); err != nil {
			return goStats{}, err
		}
	}
	return s, nil
}

// parseGauge finds the unlabelled sample "name value" (a gauge or a
// counter) in a Prometheus text exposition and returns its value, which
// must be a whole number from 0 to maxMemBytes.
func parseGauge(b []byte, name string) (int64, error) {
	for len(b) > 0 {
		var line []byte
		line, b, _ = bytes.Cut(b, []byte("\n"))
		rest, ok := bytes.CutPrefix(line, []byte(name))
		if !ok || len(rest) == 0 || (rest[0] != ' ' && rest[0] != '\t') {
			continue
		}
		f := strings.Fields(string(rest))
		if len(f) < 1 || len(f) > 2 { // a value, and maybe a timestamp
			return 0, fmt.Errorf("metrics: bad %s line %q", name, line)
		}
		v, err := strconv.ParseFloat(f[0], 64)
		if err != nil || v < 0 || v > maxMemBytes || v != float64(int64(v)) {
			return 0, fmt.Errorf("metrics: bad %s value %q", name, f[0])
		}
		return int64(v), nil
	}
	return 0, fmt.Errorf("metrics: no %s sample", name)
}
