package testkit

import (
	"bytes"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

const (
	// firstWait is WaitFor's first pause between two checks; each pause
	// doubles it up to maxWait.
	firstWait = time.Millisecond
	maxWait   = 5 * time.Millisecond
	// pollInterval is Poll's pause between two checks, short so that the
	// time Poll returns is never much coarser than the wait it measures.
	pollInterval = 2 * time.Millisecond
)

// ErrNotMet means Poll's condition did not hold within its timeout.
var ErrNotMet = errors.New("condition not met")

// ErrGiveUp, wrapped in the error a Poll condition returns, makes Poll
// stop at once instead of asking again (what it waits for can no longer
// happen, say a process it polls has exited).
var ErrGiveUp = errors.New("giving up")

// WaitFor calls cond until it reports true, pausing a little longer each
// time (1 ms, then up to 5 ms). After timeout it fails t with t.Fatalf,
// naming what it waited for. It must be called from the test's goroutine.
func WaitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	pause := firstWait
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(pause)
		pause = min(2*pause, maxWait)
	}
}

// Poll calls cond every 2 ms until it reports true and returns the time
// from the start to the answer that satisfied it (measured after that
// answer, so a figure is never flattered by the polling). It gives up
// after timeout (never when timeout <= 0) with an error that wraps
// ErrNotMet and names cond's last error, and at once, returning that
// error, when cond's error wraps ErrGiveUp.
func Poll(timeout time.Duration, cond func() (bool, error)) (time.Duration, error) {
	start := time.Now()
	var lastErr error
	for {
		ok, err := cond()
		d := time.Since(start)
		if ok {
			return d, nil
		}
		if errors.Is(err, ErrGiveUp) {
			return d, err
		}
		if err != nil {
			lastErr = err
		}
		if timeout > 0 && d > timeout {
			return d, fmt.Errorf("%w within %v (last error: %v)", ErrNotMet, timeout, lastErr)
		}
		time.Sleep(pollInterval)
	}
}

// Buffer is an io.Writer safe for concurrent use: loggers on other
// goroutines may write to it while a test reads it with String. Its zero
// value is empty and ready to use; it must not be copied after first use.
type Buffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

// Write appends p to the buffer.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns what was written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// VerifyNoLeaks fails t if goroutines other than the ones opts ignore are
// still running (goleak retries for a while first, so goroutines that are
// ending get the time to end). Call it with defer, or at the end of a test.
func VerifyNoLeaks(t testing.TB, opts ...goleak.Option) {
	t.Helper()
	goleak.VerifyNone(t, opts...)
}

// IgnoreCurrent returns an option for VerifyNoLeaks that ignores the
// goroutines running now, for a test that checks only its own.
func IgnoreCurrent() goleak.Option { return goleak.IgnoreCurrent() }
