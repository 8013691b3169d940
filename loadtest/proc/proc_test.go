//go:build unix

package proc

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// childEnv makes the test binary act as a child process (see child).
const childEnv = "PROC_TEST_CHILD"

func TestMain(m *testing.M) {
	if mode := os.Getenv(childEnv); mode != "" {
		os.Exit(child(mode))
	}
	goleak.VerifyTestMain(m)
}

// child is the test binary run by the tests: it prints "ready" and then,
// by mode, waits for SIGTERM ("term"), ignores it ("ignore-term"), exits
// at once with status 3 ("exit"), or first starts a grandchild in its
// process group that outlives it and prints its pid ("grandchild").
func child(mode string) int {
	if mode == "exit" {
		fmt.Println("bye")
		return 3
	}
	if mode == "ignore-term" {
		signal.Ignore(syscall.SIGTERM)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	if mode == "grandchild" {
		c := exec.Command("sleep", "120")
		if err := c.Start(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		fmt.Printf("grandchild %d\n", c.Process.Pid)
	}
	fmt.Println("ready")
	if mode == "ignore-term" {
		select {}
	}
	<-ctx.Done()
	fmt.Fprintln(os.Stderr, "terminated")
	return 0
}

func startChild(t *testing.T, mode string, spec Spec) *Process {
	t.Helper()
	spec.Path = os.Args[0]
	spec.Env = append(spec.Env, childEnv+"="+mode)
	p, err := Start(spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Kill() })
	return p
}

// logsContain is a readiness check on the process's output.
func logsContain(p *Process, s string) func(context.Context) error {
	return func(context.Context) error {
		if !strings.Contains(p.Logs(), s) {
			return fmt.Errorf("no %q in the output yet", s)
		}
		return nil
	}
}

// gone reports whether pid no longer runs (or is a zombie).
func gone(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return syscall.Kill(pid, 0) != nil
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i >= 0 && i+2 < len(s) && s[i+2] == 'Z'
}

// state is the process state letter from /proc/<pid>/stat.
func state(t *testing.T, pid int) byte {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		t.Skip("needs /proc:", err)
	}
	i := strings.LastIndexByte(string(b), ')')
	return b[i+2]
}

func TestStartWaitStop(t *testing.T) {
	p := startChild(t, "term", Spec{Name: "kid"})
	if err := p.WaitReady(context.Background(), 10*time.Second, logsContain(p, "ready")); err != nil {
		t.Fatal(err)
	}
	if p.Exited() || p.Alive() != nil || p.Status() != "running" || p.Err() != nil || p.Stopped() || p.Name() != "kid" {
		t.Fatalf("a running process: exited %v alive %v status %q stopped %v", p.Exited(), p.Alive(), p.Status(), p.Stopped())
	}
	if err := p.Stop(10 * time.Second); err != nil {
		t.Fatalf("stop: %v\n%s", err, p.Logs())
	}
	if !p.Exited() || !p.Stopped() || p.Status() != "exit 0" || !strings.Contains(p.Logs(), "terminated") {
		t.Fatalf("after Stop: status %q stopped %v logs %q", p.Status(), p.Stopped(), p.Logs())
	}
	if err := p.Stop(time.Second); err != nil {
		t.Fatal("second Stop:", err)
	}
	if err := p.Alive(); !errors.Is(err, ErrExited) || !strings.Contains(err.Error(), "kid (exit 0)") {
		t.Fatalf("Alive after the exit: %v", err)
	}
}

func TestStopKillsStubbornGroup(t *testing.T) {
	for _, mode := range []string{"ignore-term", "grandchild"} {
		t.Run(mode, func(t *testing.T) {
			p := startChild(t, mode, Spec{})
			if err := p.WaitReady(context.Background(), 10*time.Second, logsContain(p, "ready")); err != nil {
				t.Fatal(err)
			}
			var grandchild int
			fmt.Sscanf(p.Logs(), "grandchild %d", &grandchild)
			// The grandchild mode exits on SIGTERM (under the race detector
			// a second later); only the grandchild needs SIGKILL.
			grace := 300 * time.Millisecond
			if mode == "grandchild" {
				grace = 10 * time.Second
			}
			start := time.Now()
			err := p.Stop(grace)
			if mode == "ignore-term" && !errors.Is(err, ErrStopTimeout) {
				t.Fatalf("Stop of a process ignoring SIGTERM: %v", err)
			}
			if mode == "grandchild" && err != nil {
				t.Fatalf("Stop: %v (%s)\n%s", err, p.Status(), p.Logs())
			}
			if d := time.Since(start); d > grace+5*time.Second {
				t.Fatalf("Stop took %v", d)
			}
			if grandchild != 0 {
				if _, err := Poll(context.Background(), 10*time.Second, 10*time.Millisecond, func() (bool, error) {
					return gone(grandchild), nil
				}); err != nil {
					t.Fatalf("grandchild %d outlived Stop: %v", grandchild, err)
				}
			}
		})
	}
}

func TestWaitReadyReportsExit(t *testing.T) {
	p := startChild(t, "exit", Spec{Name: "quitter"})
	err := p.WaitReady(context.Background(), 10*time.Second, func(context.Context) error { return errors.New("never") })
	if !errors.Is(err, ErrExited) || !strings.Contains(err.Error(), "quitter (exit status 3)") || !strings.Contains(err.Error(), "bye") {
		t.Fatalf("error %v, want ErrExited with the status and the output", err)
	}
	if p.Stopped() {
		t.Fatal("an exit nobody asked for counts as stopped")
	}
}

func TestWaitReadyTimeoutAndCancel(t *testing.T) {
	p := startChild(t, "term", Spec{Name: "slow"})
	never := func(context.Context) error { return errors.New("no answer") }
	err := p.WaitReady(context.Background(), 200*time.Millisecond, never)
	if !errors.Is(err, ErrNotReady) || !strings.Contains(err.Error(), "no answer") || !strings.Contains(err.Error(), "within 200ms") {
		t.Fatalf("error %v, want ErrNotReady with the check's error", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		time.Sleep(50 * time.Millisecond)
		cancel()
	}()
	err = p.WaitReady(ctx, 0, never)
	if !errors.Is(err, ErrNotReady) || !errors.Is(err, context.Canceled) {
		t.Fatalf("error %v, want ErrNotReady and context.Canceled", err)
	}
}

func TestKillPauseContinue(t *testing.T) {
	p := startChild(t, "term", Spec{})
	if err := p.WaitReady(context.Background(), 10*time.Second, logsContain(p, "ready")); err != nil {
		t.Fatal(err)
	}
	if err := p.Pause(); err != nil {
		t.Fatal(err)
	}
	if _, err := Poll(context.Background(), 5*time.Second, time.Millisecond, func() (bool, error) {
		return state(t, p.Pid()) == 'T', nil
	}); err != nil {
		t.Fatalf("not stopped after Pause: %v", err)
	}
	if err := p.Continue(); err != nil {
		t.Fatal(err)
	}
	if _, err := Poll(context.Background(), 5*time.Second, time.Millisecond, func() (bool, error) {
		return state(t, p.Pid()) != 'T', nil
	}); err != nil {
		t.Fatalf("still stopped after Continue: %v", err)
	}
	p.Kill()
	if p.Status() != "signal: killed" || !p.Stopped() {
		t.Fatalf("after Kill: %q", p.Status())
	}
	if err := p.Pause(); !errors.Is(err, ErrExited) {
		t.Fatalf("Pause of an exited process: %v", err)
	}
	if err := p.Continue(); err != nil {
		t.Fatalf("Continue of an exited process: %v", err)
	}
}

// A paused process still stops: Stop resumes it first.
func TestStopPaused(t *testing.T) {
	p := startChild(t, "term", Spec{})
	if err := p.WaitReady(context.Background(), 10*time.Second, logsContain(p, "ready")); err != nil {
		t.Fatal(err)
	}
	if err := p.Pause(); err != nil {
		t.Fatal(err)
	}
	if err := p.Stop(10 * time.Second); err != nil {
		t.Fatalf("Stop of a paused process: %v", err)
	}
}

func TestLogFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kid.log")
	for i, appendLog := range []bool{false, true, false} {
		p := startChild(t, "exit", Spec{LogFile: path, AppendLog: appendLog})
		<-p.Done()
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		want := []int{1, 2, 1}[i]
		if got := strings.Count(string(b), "bye"); got != want {
			t.Fatalf("run %d (append %v): %d lines in the log file, want %d", i, appendLog, got, want)
		}
	}
	if _, err := Start(Spec{Path: os.Args[0], LogFile: filepath.Join(t.TempDir(), "missing", "x.log")}); err == nil {
		t.Fatal("a log file that cannot be created was accepted")
	}
	if _, err := Start(Spec{Path: filepath.Join(t.TempDir(), "no-such-program")}); err == nil {
		t.Fatal("a missing executable was started")
	}
}

func TestTail(t *testing.T) {
	tl := NewTail(8)
	fmt.Fprint(tl, "0123")
	fmt.Fprint(tl, "456789ab ")
	if tl.String() != "56789ab " || tl.Dropped() != 5 || tl.Last(3) != "ab" || tl.Last(100) != "56789ab" {
		t.Fatalf("kept %q dropped %d last %q", tl.String(), tl.Dropped(), tl.Last(3))
	}
	if NewTail(0).max != DefaultTailBytes {
		t.Fatal("default size")
	}
	p := startChild(t, "term", Spec{TailBytes: 4})
	if err := p.WaitReady(context.Background(), 10*time.Second, func(context.Context) error {
		if p.Output().Dropped() == 0 {
			return errors.New("nothing dropped yet")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(p.Logs()) > 4 {
		t.Fatalf("kept %q, more than 4 bytes", p.Logs())
	}
}

func TestPoll(t *testing.T) {
	ctx := context.Background()
	n := 0
	d, err := Poll(ctx, 5*time.Second, time.Millisecond, func() (bool, error) { n++; return n == 3, nil })
	if err != nil || n != 3 || d > 5*time.Second {
		t.Fatalf("%v after %d calls (%v)", err, n, d)
	}
	_, err = Poll(ctx, 20*time.Millisecond, time.Millisecond, func() (bool, error) { return false, errors.New("still no") })
	if !errors.Is(err, ErrNotMet) || !strings.Contains(err.Error(), "still no") {
		t.Fatalf("timeout: %v", err)
	}
	calls := 0
	_, err = Poll(ctx, time.Hour, time.Millisecond, func() (bool, error) { calls++; return false, fmt.Errorf("%w: gone", ErrExited) })
	if !errors.Is(err, ErrExited) || calls != 1 {
		t.Fatalf("an exit did not end the poll at once: %v after %d calls", err, calls)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := Poll(cctx, 0, time.Millisecond, func() (bool, error) { return false, nil }); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled: %v", err)
	}
}

func TestHTTPCheck(t *testing.T) {
	status := http.StatusServiceUnavailable
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(status) }))
	defer srv.Close()
	check := HTTPCheck(srv.URL + "/readyz")
	if err := check(context.Background()); err == nil || !strings.Contains(err.Error(), "503") {
		t.Fatalf("503: %v", err)
	}
	status = http.StatusOK
	if err := check(context.Background()); err != nil {
		t.Fatal(err)
	}
	srv.Close()
	if err := check(context.Background()); err == nil {
		t.Fatal("a closed server passed")
	}
}

func TestPrepare(t *testing.T) {
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), childEnv+"=exit")
	Prepare(cmd)
	out, err := cmd.Output()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 3 || !strings.Contains(string(out), "bye") {
		t.Fatalf("%v %q", err, out)
	}
}
