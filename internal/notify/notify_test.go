package notify

import (
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// closed reports whether ch is closed, draining at most one pending value.
func closed(ch <-chan struct{}) bool {
	select {
	case _, ok := <-ch:
		if !ok {
			return true
		}
	default:
		return false
	}
	select {
	case _, ok := <-ch:
		return !ok
	default:
		return false
	}
}

func TestNotifyWakesEverySubscriber(t *testing.T) {
	var h Hub // the zero value is ready
	a, cancelA := h.Subscribe()
	defer cancelA()
	b, cancelB := h.Subscribe()
	defer cancelB()
	if len(a) != 0 || len(b) != 0 {
		t.Fatal("a new subscriber holds a notification")
	}
	h.Notify()
	for name, ch := range map[string]<-chan struct{}{"a": a, "b": b} {
		select {
		case <-ch:
		default:
			t.Fatalf("%s was not notified", name)
		}
	}
}

func TestNotifyCoalescesAndNeverBlocks(t *testing.T) {
	var h Hub
	ch, cancel := h.Subscribe()
	defer cancel()
	for range 1000 {
		h.Notify() // nobody reads: must not block
	}
	if n := len(ch); n != 1 {
		t.Fatalf("%d pending notifications, want 1", n)
	}
	<-ch
	h.Notify()
	if n := len(ch); n != 1 {
		t.Fatalf("after a read: %d pending notifications, want 1", n)
	}
}

func TestCancel(t *testing.T) {
	var h Hub
	ch, cancel := h.Subscribe()
	other, cancelOther := h.Subscribe()
	defer cancelOther()
	cancel()
	cancel() // twice is fine
	h.Notify()
	if len(ch) != 0 {
		t.Fatal("a cancelled subscriber was notified")
	}
	if len(other) != 1 {
		t.Fatal("cancelling one subscriber silenced another")
	}
	h.Close()
	if closed(ch) {
		t.Fatal("Close closed a cancelled subscriber's channel")
	}
	if !closed(other) {
		t.Fatal("Close left a subscriber's channel open")
	}
	cancelOther() // after Close is fine
}

func TestClose(t *testing.T) {
	var h Hub
	ch, cancel := h.Subscribe()
	defer cancel()
	h.Notify()
	h.Close()
	h.Close() // idempotent
	// The pending notification comes first, then the close.
	if _, ok := <-ch; !ok {
		t.Fatal("the pending notification was lost")
	}
	if _, ok := <-ch; ok {
		t.Fatal("channel not closed by Close")
	}
	h.Notify() // after Close: nothing to do, no panic
	late, cancelLate := h.Subscribe()
	defer cancelLate()
	if _, ok := <-late; ok {
		t.Fatal("Subscribe after Close returned an open channel")
	}
}

// TestConcurrent runs Subscribe, cancel, Notify and Close at once (run it
// with -race): nothing panics (no send on a closed channel), a subscriber
// that waits is woken by a later Notify, and once Close returned every
// subscriber not cancelled before it sees its channel closed.
func TestConcurrent(t *testing.T) {
	for range 5 {
		var h Hub
		stop := make(chan struct{})
		var subscribed atomic.Int64
		var notifiers, subscribers sync.WaitGroup
		for range 2 {
			notifiers.Go(func() {
				for {
					select {
					case <-stop:
						return
					default:
						h.Notify()
						runtime.Gosched()
					}
				}
			})
		}
		for i := range 8 {
			subscribers.Go(func() {
				for j := 0; ; j++ {
					ch, cancel := h.Subscribe()
					subscribed.Add(1)
					if j%2 == i%2 {
						cancel() // cancelled at once: may be notified or not, never closed
						continue
					}
					// Wait for a notification or the close.
					select {
					case _, ok := <-ch:
						if !ok {
							cancel()
							return
						}
					case <-time.After(10 * time.Second):
						t.Error("a subscriber was neither notified nor closed")
						cancel()
						return
					}
					cancel()
				}
			})
		}
		// Close while subscribers come and go.
		for subscribed.Load() < 100 {
			runtime.Gosched()
		}
		h.Close()
		subscribers.Wait() // each ends only on a closed channel
		close(stop)
		notifiers.Wait()
	}
}

func TestCloseClosesEverySubscriber(t *testing.T) {
	var h Hub
	chans := make([]<-chan struct{}, 100)
	var wg sync.WaitGroup
	for i := range chans {
		wg.Go(func() { chans[i], _ = h.Subscribe() })
	}
	wg.Wait()
	var closers sync.WaitGroup
	for range 4 {
		closers.Go(h.Close)
	}
	closers.Wait()
	for i, ch := range chans {
		if !closed(ch) {
			t.Fatalf("subscriber %d: channel open after Close", i)
		}
	}
}
