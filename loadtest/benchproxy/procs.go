package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// setChildAttrs puts a child in its own process group and has the kernel
// kill it if the harness dies.
func setChildAttrs(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// child is a long-running process the harness started.
type child struct {
	name string
	cmd  *exec.Cmd
	logs *tailBuffer
	done chan struct{}
	err  error
}

// children stops, in reverse start order, everything the harness started.
type children struct {
	mu   sync.Mutex
	list []*child
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

// start runs argv pinned to cpus at niceness nice.
func (cs *children) start(name, taskset, cpus string, nice int, stdout io.Writer, argv ...string) (*child, error) {
	prog, args := pinned(taskset, cpus, nice, argv...)
	cmd := exec.Command(prog, args...)
	setChildAttrs(cmd)
	c := &child{name: name, cmd: cmd, logs: &tailBuffer{max: 16 << 10}, done: make(chan struct{})}
	cmd.Stderr = c.logs
	cmd.Stdout = c.logs
	if stdout != nil {
		cmd.Stdout = stdout
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	go func() {
		c.err = cmd.Wait()
		close(c.done)
	}()
	cs.mu.Lock()
	cs.list = append(cs.list, c)
	cs.mu.Unlock()
	return c, nil
}

// pid is the child's process ID (taskset execs the program, so it is the
// program's).
func (c *child) pid() int { return c.cmd.Process.Pid }

func (c *child) exited() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// stopAll sends SIGTERM to every child's process group, then SIGKILL to
// those still running after grace, and waits for them.
func (cs *children) stopAll(grace time.Duration) {
	cs.mu.Lock()
	list := cs.list
	cs.list = nil
	cs.mu.Unlock()
	for i := len(list) - 1; i >= 0; i-- {
		c := list[i]
		if c.exited() {
			continue
		}
		_ = syscall.Kill(-c.pid(), syscall.SIGTERM)
		select {
		case <-c.done:
		case <-time.After(grace):
			_ = syscall.Kill(-c.pid(), syscall.SIGKILL)
			<-c.done
		}
	}
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if len(t.b) > t.max {
		t.b = append(t.b[:0], t.b[len(t.b)-t.max:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.b)
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

// freeAddr returns a free loopback address (closed again at once).
func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// waitReady polls until a chat request through url gets a 200, or the
// deadline passes or the child exits.
func waitReady(ctx context.Context, c *child, url string, body []byte, d time.Duration) error {
	deadline := time.Now().Add(d)
	client := &http.Client{Timeout: 2 * time.Second}
	var last string
	for time.Now().Before(deadline) {
		if c != nil && c.exited() {
			return fmt.Errorf("%s exited: %v\n%s", c.name, c.err, c.logs)
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/chat/completions", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return nil
			}
			last = resp.Status
		} else {
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	name := url
	if c != nil {
		name = c.name + "\n" + c.logs.String()
	}
	return fmt.Errorf("not ready after %s (%s): %s", d, last, name)
}

// readListenLines reads "LISTEN addr" lines from r until n were seen.
func readListenLines(r io.Reader, n int, timeout time.Duration) ([]string, error) {
	type res struct {
		addrs []string
		err   error
	}
	ch := make(chan res, 1)
	go func() {
		sc := bufio.NewScanner(r)
		var addrs []string
		for len(addrs) < n && sc.Scan() {
			if a, ok := strings.CutPrefix(sc.Text(), "LISTEN "); ok {
				addrs = append(addrs, a)
			}
		}
		if len(addrs) < n {
			ch <- res{addrs, fmt.Errorf("stub printed %d of %d addresses", len(addrs), n)}
			return
		}
		ch <- res{addrs, nil}
		_, _ = io.Copy(io.Discard, r)
	}()
	select {
	case r := <-ch:
		return r.addrs, r.err
	case <-time.After(timeout):
		return nil, errors.New("stub did not report its addresses in time")
	}
}
