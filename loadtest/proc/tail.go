package proc

import (
	"strings"
	"sync"
)

// DefaultTailBytes is how much of a process's output a Process keeps when
// its Spec names no size.
const DefaultTailBytes = 16 << 10

// Tail keeps the last bytes written to it, up to a bound. It is safe for
// concurrent use: a process writes it while tests and tools read it.
type Tail struct {
	mu      sync.Mutex
	max     int
	b       []byte
	dropped int64
}

// NewTail returns a Tail that keeps the last max bytes (DefaultTailBytes
// when max <= 0).
func NewTail(max int) *Tail {
	if max <= 0 {
		max = DefaultTailBytes
	}
	return &Tail{max: max}
}

// Write implements io.Writer; it never fails.
func (t *Tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if over := len(t.b) - t.max; over > 0 {
		t.b = append(t.b[:0], t.b[over:]...)
		t.dropped += int64(over)
	}
	return len(p), nil
}

// String returns what is kept.
func (t *Tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.b)
}

// Last returns the last n bytes kept, without surrounding white space.
func (t *Tail) Last(n int) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	b := t.b
	if n >= 0 && len(b) > n {
		b = b[len(b)-n:]
	}
	return strings.TrimSpace(string(b))
}

// Dropped returns how many bytes were written but are no longer kept.
func (t *Tail) Dropped() int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.dropped
}
