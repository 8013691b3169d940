package limit

import (
	"errors"
	"net"
	"sync"
	"testing"
	"time"
)

// dialN opens n connections to ln's address.
func dialN(t *testing.T, ln net.Listener, n int) []net.Conn {
	t.Helper()
	var out []net.Conn
	for range n {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, c)
	}
	t.Cleanup(func() {
		for _, c := range out {
			c.Close()
		}
	})
	return out
}

// closedByPeer reports whether the peer closed c within d.
func closedByPeer(c net.Conn, d time.Duration) bool {
	c.SetReadDeadline(time.Now().Add(d))
	_, err := c.Read(make([]byte, 1))
	var ne net.Error
	return err != nil && !(errors.As(err, &ne) && ne.Timeout())
}

func TestBounds(t *testing.T) {
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	refused := map[string]int{}
	ln := NewListener(raw, 5, 3, func(r string) { mu.Lock(); refused[r]++; mu.Unlock() })
	defer ln.Close()

	accepted := make(chan net.Conn, 16)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				close(accepted)
				return
			}
			accepted <- c
		}
	}()
	clients := dialN(t, ln, 5)
	var held []net.Conn
	for range 3 {
		held = append(held, <-accepted)
	}
	// The per-address cap (3) closes the other two at once.
	closed := 0
	for _, c := range clients {
		if closedByPeer(c, 300*time.Millisecond) {
			closed++
		}
	}
	mu.Lock()
	got := refused[ReasonLimitPerIP]
	mu.Unlock()
	if closed != 2 || got != 2 || ln.Open() != 3 {
		t.Fatalf("closed %d, refused per IP %d, open %d; want 2, 2, 3", closed, got, ln.Open())
	}
	// A held connection closed (twice) frees one slot.
	held[0].Close()
	held[0].Close()
	if ln.Open() != 2 {
		t.Fatalf("open %d after a close, want 2", ln.Open())
	}
	c := dialN(t, ln, 1)[0]
	select {
	case <-accepted:
	case <-time.After(2 * time.Second):
		t.Fatal("a connection within the bounds was not accepted")
	}
	if closedByPeer(c, 100*time.Millisecond) {
		t.Fatal("a connection within the bounds was closed")
	}
}

func TestTotalBound(t *testing.T) {
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused := make(chan string, 8)
	ln := NewListener(raw, 2, 10, func(r string) { refused <- r })
	defer ln.Close()
	go func() {
		for {
			if _, err := ln.Accept(); err != nil {
				return
			}
		}
	}()
	dialN(t, ln, 3)
	select {
	case r := <-refused:
		if r != ReasonLimit {
			t.Fatalf("reason %q, want %q", r, ReasonLimit)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("the third connection was not refused")
	}
}
