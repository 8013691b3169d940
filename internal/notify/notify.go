package notify

import "sync"

// Hub fans one "something changed" signal out to any number of
// subscribers. The zero value is ready to use. A Hub must not be copied
// after first use.
type Hub struct {
	mu     sync.Mutex
	subs   map[uint64]chan struct{}
	next   uint64
	closed bool
}

// Subscribe returns a channel that receives a value after each later
// Notify, and cancel, which unsubscribes (the channel then receives
// nothing more and is not closed). Notifications are coalesced: the
// channel holds at most one, and Notify never waits for the reader. The
// channel is closed by Close; after Close, Subscribe returns a closed
// channel. cancel may be called any number of times, before or after
// Close.
func (h *Hub) Subscribe() (<-chan struct{}, func()) {
	h.mu.Lock()
	defer h.mu.Unlock()
	ch := make(chan struct{}, 1)
	if h.closed {
		close(ch)
		return ch, func() {}
	}
	if h.subs == nil {
		h.subs = make(map[uint64]chan struct{})
	}
	id := h.next
	h.next++
	h.subs[id] = ch
	return ch, func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		delete(h.subs, id)
	}
}

// Notify puts a value in every subscriber's channel that does not hold
// one yet. It never blocks on a reader; after Close it does nothing.
func (h *Hub) Notify() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, ch := range h.subs {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// Close closes every subscriber's channel (a pending notification is
// still received first) and makes later Subscribes return closed
// channels. It is idempotent.
func (h *Hub) Close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.closed = true
	for id, ch := range h.subs {
		close(ch)
		delete(h.subs, id)
	}
}
