package testkit

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// recorder is a testing.TB whose failures are recorded instead of
// reported, so that a test can check that a helper fails.
type recorder struct {
	testing.TB
	mu     sync.Mutex
	failed []string
}

func (r *recorder) Helper() {}

func (r *recorder) Errorf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.failed = append(r.failed, fmt.Sprintf(format, args...))
}

func (r *recorder) Error(args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.failed = append(r.failed, fmt.Sprint(args...))
}

func (r *recorder) Fatalf(format string, args ...any) {
	r.Errorf(format, args...)
	runtime.Goexit()
}

func (r *recorder) failures() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.failed...)
}

// run calls f with a recorder on a goroutine of its own (Fatalf ends it)
// and returns what f reported.
func run(t *testing.T, f func(tb testing.TB)) []string {
	r := &recorder{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		f(r)
	}()
	<-done
	return r.failures()
}

func TestWaitForHolds(t *testing.T) {
	var calls atomic.Int32
	failed := run(t, func(tb testing.TB) {
		WaitFor(tb, 5*time.Second, "the third call", func() bool { return calls.Add(1) == 3 })
	})
	if len(failed) != 0 || calls.Load() != 3 {
		t.Fatalf("failures %q after %d calls, want none after 3", failed, calls.Load())
	}
}

func TestWaitForTimesOut(t *testing.T) {
	start := time.Now()
	var calls atomic.Int32
	failed := run(t, func(tb testing.TB) {
		WaitFor(tb, 50*time.Millisecond, "the impossible", func() bool { calls.Add(1); return false })
		tb.Errorf("WaitFor returned after a timeout")
	})
	if took := time.Since(start); took < 50*time.Millisecond || took > 5*time.Second {
		t.Errorf("WaitFor gave up after %v, want about 50ms", took)
	}
	if len(failed) != 1 || !strings.Contains(failed[0], "the impossible") || !strings.Contains(failed[0], "50ms") {
		t.Fatalf("failures %q, want one naming what and the timeout", failed)
	}
	// A backoff capped at 5 ms asks at least 50/5 times in 50 ms, and
	// far fewer than a busy loop would.
	if n := calls.Load(); n < 5 || n > 60 {
		t.Errorf("cond called %d times in 50ms", n)
	}
}

func TestPollMeasures(t *testing.T) {
	start := time.Now()
	d, err := Poll(5*time.Second, func() (bool, error) {
		return time.Since(start) >= 30*time.Millisecond, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if d < 30*time.Millisecond || d > time.Since(start) {
		t.Fatalf("Poll took %v, want at least 30ms and at most the time elapsed", d)
	}
}

func TestPollTimesOut(t *testing.T) {
	boom := errors.New("boom")
	var calls int
	d, err := Poll(20*time.Millisecond, func() (bool, error) {
		calls++
		if calls == 1 {
			return false, boom
		}
		return false, nil
	})
	if !errors.Is(err, ErrNotMet) || !strings.Contains(err.Error(), "boom") {
		t.Fatalf("error %v, want ErrNotMet naming the last error", err)
	}
	if d < 20*time.Millisecond || calls < 2 {
		t.Fatalf("gave up after %v and %d calls", d, calls)
	}
}

func TestPollGivesUp(t *testing.T) {
	var calls int
	_, err := Poll(time.Hour, func() (bool, error) {
		calls++
		return false, fmt.Errorf("%w: gone", ErrGiveUp)
	})
	if !errors.Is(err, ErrGiveUp) || calls != 1 {
		t.Fatalf("error %v after %d calls, want ErrGiveUp after 1", err, calls)
	}
}

func TestPollWithoutTimeout(t *testing.T) {
	var calls int
	if _, err := Poll(0, func() (bool, error) { calls++; return calls == 5, errors.New("not yet") }); err != nil || calls != 5 {
		t.Fatalf("error %v after %d calls, want none after 5", err, calls)
	}
}

func TestBufferConcurrent(t *testing.T) {
	var b Buffer
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 100 {
				fmt.Fprintf(&b, "%d\n", i)
				_ = b.String()
			}
		}()
	}
	wg.Wait()
	lines := strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n")
	if len(lines) != 800 {
		t.Fatalf("%d lines, want 800", len(lines))
	}
	for _, l := range lines {
		if len(l) != 1 {
			t.Fatalf("line %q: writes interleaved", l)
		}
	}
}

func TestVerifyNoLeaks(t *testing.T) {
	before := IgnoreCurrent()
	stop := make(chan struct{})
	go func() { <-stop }()
	failed := run(t, func(tb testing.TB) { VerifyNoLeaks(tb, before) })
	close(stop)
	if len(failed) == 0 {
		t.Fatal("VerifyNoLeaks missed a goroutine still running")
	}
	VerifyNoLeaks(t, before)
}
