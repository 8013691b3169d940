package cluster

import (
	"context"
	"errors"
	"testing"
	"time"
)

// stuckFuture is a Raft future that answers only once released.
type stuckFuture struct {
	release chan struct{}
	err     error
}

func (f *stuckFuture) Error() error {
	<-f.release
	return f.err
}

func TestConfigChangeError(t *testing.T) {
	// An answer comes back as it is.
	want := errors.New("not leader")
	answered := &stuckFuture{release: make(chan struct{}), err: want}
	close(answered.release)
	if err := configChangeError(context.Background(), answered); !errors.Is(err, want) {
		t.Fatalf("answered future: %v, want %v", err, want)
	}
	// A future Raft never answers no longer holds the leader loop once its
	// context ends.
	stuck := &stuckFuture{release: make(chan struct{})}
	t.Cleanup(func() { close(stuck.release) }) // let the waiter go: no leak
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- configChangeError(ctx, stuck) }()
	select {
	case err := <-done:
		t.Fatalf("returned %v before its context ended", err)
	case <-time.After(50 * time.Millisecond):
	}
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("after cancel: %v, want context.Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("still waiting on the future after its context ended")
	}
}
