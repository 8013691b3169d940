package proc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"
)

// Errors of this package; functions wrap them with the process's name,
// exit status and the end of its output.
var (
	// ErrExited means the process is gone: it exited before it was ready,
	// or before it was paused.
	ErrExited = errors.New("process exited")
	// ErrNotReady means a readiness check did not pass in time.
	ErrNotReady = errors.New("process not ready")
	// ErrStopTimeout means the process outlived SIGTERM by the grace
	// period and was killed.
	ErrStopTimeout = errors.New("did not stop")
	// ErrNotMet means a condition Poll waited for did not hold in time.
	ErrNotMet = errors.New("condition not met")
)

// PollInterval is how often WaitReady runs its check.
const PollInterval = 20 * time.Millisecond

// errorTail is how much of a process's output its errors carry.
const errorTail = 2048

// Spec describes a child process.
type Spec struct {
	// Name names the process in errors (default: the executable's base
	// name).
	Name string
	// Path is the executable; Args its arguments (without the program
	// name).
	Path string
	Args []string
	// Env is added to this process's environment.
	Env []string
	// Dir is the working directory ("" : this process's).
	Dir string
	// UID, when > 0, runs the process as that uid and gid (Unix; this
	// process must be root).
	UID int
	// LogFile, when set, also receives the process's output: truncated
	// first, or appended to with AppendLog.
	LogFile   string
	AppendLog bool
	// TailBytes is how much of the output Logs keeps (DefaultTailBytes
	// when 0).
	TailBytes int
}

// Process is a running (or exited) child process. Its methods are safe for
// concurrent use.
type Process struct {
	name string
	cmd  *exec.Cmd
	out  *Tail

	done chan struct{}
	err  error // the exit error, set before done is closed

	stopped  atomic.Bool
	stopOnce sync.Once
	stopErr  error
}

// Start starts the process described by spec. The returned Process owns a
// goroutine that reaps the child; it ends once the child has exited.
func Start(spec Spec) (*Process, error) {
	name := spec.Name
	if name == "" {
		name = filepath.Base(spec.Path)
	}
	out := NewTail(spec.TailBytes)
	var w io.Writer = out
	var logFile *os.File
	if spec.LogFile != "" {
		mode := os.O_CREATE | os.O_WRONLY | os.O_TRUNC
		if spec.AppendLog {
			mode = os.O_CREATE | os.O_WRONLY | os.O_APPEND
		}
		f, err := os.OpenFile(spec.LogFile, mode, 0o644)
		if err != nil {
			return nil, fmt.Errorf("starting %s: %w", name, err)
		}
		logFile = f
		w = teeWriter{out, f}
	}
	cmd := exec.Command(spec.Path, spec.Args...)
	cmd.Dir = spec.Dir
	if len(spec.Env) > 0 {
		cmd.Env = append(os.Environ(), spec.Env...)
	}
	cmd.Stdout, cmd.Stderr = w, w
	// A grandchild that keeps the output pipe open does not hold up the
	// exit: Stop kills it with the rest of the group.
	cmd.WaitDelay = time.Second
	prepare(cmd, spec.UID)
	if err := cmd.Start(); err != nil {
		if logFile != nil {
			logFile.Close()
		}
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	p := &Process{name: name, cmd: cmd, out: out, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		if logFile != nil {
			logFile.Close()
		}
		close(p.done)
	}()
	return p, nil
}

// teeWriter writes to the tail and to a log file; a failing log file does
// not stop the output from reaching the tail.
type teeWriter struct {
	tail *Tail
	file *os.File
}

func (t teeWriter) Write(p []byte) (int, error) {
	t.tail.Write(p)
	_, _ = t.file.Write(p)
	return len(p), nil
}

// Name returns the process's name.
func (p *Process) Name() string { return p.name }

// Pid returns the process's id; its process group has the same id.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Done is closed once the process has exited and its output is read.
func (p *Process) Done() <-chan struct{} { return p.done }

// Exited reports whether the process has exited.
func (p *Process) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Err returns the exit error (nil for exit status 0) once Done is closed,
// and nil before.
func (p *Process) Err() error {
	if !p.Exited() {
		return nil
	}
	return p.err
}

// Status describes the process's state: "running", "exit 0", or its exit
// error ("exit status 2", "signal: killed").
func (p *Process) Status() string {
	switch {
	case !p.Exited():
		return "running"
	case p.err == nil:
		return "exit 0"
	default:
		return p.err.Error()
	}
}

// Stopped reports whether Stop or Kill was called: an exit after it was
// asked for.
func (p *Process) Stopped() bool { return p.stopped.Load() }

// Logs returns the output kept (the last Spec.TailBytes bytes).
func (p *Process) Logs() string { return p.out.String() }

// Output returns the buffer the output goes to.
func (p *Process) Output() *Tail { return p.out }

// Alive returns nil while the process runs; after, an error wrapping
// ErrExited with its exit status and the end of its output.
func (p *Process) Alive() error {
	if !p.Exited() {
		return nil
	}
	return fmt.Errorf("%w: %s (%s); its log ends:\n%s", ErrExited, p.name, p.Status(), p.out.Last(errorTail))
}

// Stop resumes the process group should it be paused, sends it SIGTERM,
// and after grace SIGKILL (to whatever is left of the group, grandchildren
// included, even when the process itself has exited), then waits for the
// process. A process still running after grace is first sent SIGQUIT and
// given quitGrace, so that a Go program's goroutine stacks, which say
// where it hung, end up in its output. It returns the exit error, or one
// wrapping ErrStopTimeout when SIGKILL was needed. Later calls return the
// same.
func (p *Process) Stop(grace time.Duration) error {
	p.stopOnce.Do(func() {
		p.stopped.Store(true)
		timedOut := false
		if !p.Exited() {
			_ = resume(p.cmd)
			terminate(p.cmd)
			t := time.NewTimer(grace)
			select {
			case <-p.done:
			case <-t.C:
				timedOut = true
				quit(p.cmd)
				q := time.NewTimer(quitGrace)
				select {
				case <-p.done:
				case <-q.C:
				}
				q.Stop()
			}
			t.Stop()
		}
		kill(p.cmd)
		<-p.done
		p.stopErr = p.err
		if timedOut {
			p.stopErr = fmt.Errorf("%w within %s", ErrStopTimeout, grace)
		}
	})
	return p.stopErr
}

// quitGrace is how long a process that did not stop may take to print
// its stacks after SIGQUIT.
const quitGrace = 2 * time.Second

// Kill sends SIGKILL to the process group (a crash: no goodbye) and waits
// for the process.
func (p *Process) Kill() {
	p.stopped.Store(true)
	if !p.Exited() {
		kill(p.cmd)
	}
	<-p.done
}

// Pause stops the process group (SIGSTOP) until Continue.
func (p *Process) Pause() error {
	if err := p.Alive(); err != nil {
		return err
	}
	return pause(p.cmd)
}

// Continue resumes a paused process group (SIGCONT).
func (p *Process) Continue() error {
	if p.Exited() {
		return nil
	}
	return resume(p.cmd)
}

// WaitReady runs check every PollInterval until it returns nil. It fails
// with an error wrapping ErrExited when the process exits first, and with
// one wrapping ErrNotReady (and ctx's error, when ctx ended) after within
// (no limit but ctx when within <= 0); both carry the check's last error
// and the end of the process's output.
func (p *Process) WaitReady(ctx context.Context, within time.Duration, check func(context.Context) error) error {
	var last error
	_, err := Poll(ctx, within, PollInterval, func() (bool, error) {
		if last = check(ctx); last == nil {
			return true, nil
		}
		return false, p.Alive()
	})
	switch {
	case err == nil:
		return nil
	case errors.Is(err, ErrExited):
		return err
	case ctx.Err() != nil:
		return fmt.Errorf("%w: %s: %w (last check: %v); its log ends:\n%s", ErrNotReady, p.name, ctx.Err(), last, p.out.Last(errorTail))
	default:
		return fmt.Errorf("%w: %s not ready within %s: %v; its log ends:\n%s", ErrNotReady, p.name, within, last, p.out.Last(errorTail))
	}
}

// Poll calls cond every interval until it reports true, and returns the
// time from the start to the answer that satisfied it (measured after
// that answer, so a figure is never flattered by the polling). It gives
// up when cond's error wraps ErrExited (the process waited on is gone),
// when ctx ends, and after within (never when within <= 0), returning an
// error that wraps ErrNotMet (or ctx's error) with cond's last error.
func Poll(ctx context.Context, within, interval time.Duration, cond func() (bool, error)) (time.Duration, error) {
	start := time.Now()
	var lastErr error
	t := time.NewTimer(interval)
	t.Stop()
	defer t.Stop()
	for {
		ok, err := cond()
		d := time.Since(start)
		if ok {
			return d, nil
		}
		if errors.Is(err, ErrExited) {
			return d, err
		}
		if err != nil {
			lastErr = err
		}
		if within > 0 && d > within {
			return d, fmt.Errorf("%w within %v (last error: %v)", ErrNotMet, within, lastErr)
		}
		t.Reset(interval)
		select {
		case <-ctx.Done():
			return time.Since(start), fmt.Errorf("%w (last error: %v)", ctx.Err(), lastErr)
		case <-t.C:
		}
	}
}

// HTTPCheck returns a readiness check that passes once a GET of url
// answers 200. It opens a new connection each time (none is left idle) and
// ignores proxy settings.
func HTTPCheck(url string) func(context.Context) error {
	hc := &http.Client{Timeout: time.Second, Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true}}
	return func(ctx context.Context) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		resp, err := hc.Do(req)
		if err != nil {
			return err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("GET %s: %s", url, resp.Status)
		}
		return nil
	}
}

// Prepare gives a command run to completion elsewhere (exec.Cmd.Run) what
// Start gives its processes: its own process group and, on Linux, death
// with this process.
func Prepare(cmd *exec.Cmd) { prepare(cmd, 0) }
