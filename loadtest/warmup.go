package loadtest

import (
	"context"
	"sync"
	"time"
)

// warmup decides which requests belong to the warm-up and says when the
// last of them has been answered. The counters the measured figures start
// from (the engines' cache counters, the routers' predictions) are taken
// then, not at the warm-up's nominal end: a warm-up request still queued
// in an engine at that instant would otherwise be counted as measured.
//
// A request is in the warm-up when it was meant to be sent before the
// measured window and is sent before the warm-up is closed; a request the
// sender could only send later (a client that fell behind) is measured.
type warmup struct {
	measure time.Time

	mu     sync.Mutex
	open   bool
	active int
	done   chan struct{} // closed once closed and active == 0
}

func newWarmup(measure time.Time, on bool) *warmup {
	w := &warmup{measure: measure, open: on, done: make(chan struct{})}
	if !on {
		close(w.done)
	}
	return w
}

// start reports whether a request meant for intended is a warm-up one; if
// so the caller calls finish when it is answered.
func (w *warmup) start(intended time.Time) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.open || !intended.Before(w.measure) {
		return false
	}
	w.active++
	return true
}

// finish ends a warm-up request.
func (w *warmup) finish() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.active--
	if !w.open && w.active == 0 {
		close(w.done)
	}
}

// closeAt closes the warm-up at its nominal end (or when ctx ends): no
// request starts in it afterwards.
func (w *warmup) closeAt(ctx context.Context) {
	t := time.NewTimer(time.Until(w.measure))
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.open {
		return
	}
	w.open = false
	if w.active == 0 {
		close(w.done)
	}
}

// over is closed once the warm-up is closed and its last request answered.
func (w *warmup) over() <-chan struct{} { return w.done }
