package proxy

import (
	"errors"
	"net"
	"os"
	"sync/atomic"
	"testing"
	"time"
)

// tcpPair returns the two ends of a loopback TCP connection.
func tcpPair(t *testing.T) (server, client net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	client, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	server, err = ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { server.Close(); client.Close() })
	return server, client
}

// The server's pattern of an idle deadline before each request and a read
// deadline after its first byte reaches the poller a handful of times over
// many requests, not twice per request; and the deadline still holds.
func TestReadDeadlineReachesPollerLazily(t *testing.T) {
	srv, cli := tcpPair(t)
	var open atomic.Int64
	open.Add(1)
	rc := newRawConn(srv, time.Second, &open, nil).(*rawConn)
	const idle, read = 10 * time.Second, 3 * time.Second
	buf := make([]byte, 64)
	const n = 200
	for i := range n {
		go func() {
			time.Sleep(200 * time.Microsecond)
			cli.Write([]byte("x"))
		}()
		if err := rc.SetReadDeadline(time.Now().Add(idle)); err != nil {
			t.Fatal(err)
		}
		if _, err := rc.Read(buf); err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		if err := rc.SetReadDeadline(time.Now().Add(read)); err != nil {
			t.Fatal(err)
		}
	}
	if got := rc.s.rdApplied; got > 3 {
		t.Fatalf("the poller's deadline was set %d times for %d requests", got, n)
	}
	t.Logf("%d requests, poller deadline set %d times", n, rc.s.rdApplied)

	// A read that waits gets the deadline asked for last (3 s would be too
	// long to wait here, so ask for a short one: earlier, so applied).
	if err := rc.SetReadDeadline(time.Now().Add(50 * time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err := rc.Read(buf)
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read: %v, want a deadline error", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("the 50 ms deadline ended the read after %v", d)
	}

	// A deadline in the past fails the next read at once, even with data
	// waiting (net.Conn semantics, used to interrupt reads).
	cli.Write([]byte("y"))
	time.Sleep(10 * time.Millisecond)
	if err := rc.SetReadDeadline(time.Now().Add(-time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := rc.Read(buf); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read past the deadline: %v", err)
	}
	// Cleared, the read gets the waiting byte.
	if err := rc.SetReadDeadline(time.Time{}); err != nil {
		t.Fatal(err)
	}
	if n, err := rc.Read(buf); err != nil || string(buf[:n]) != "y" {
		t.Fatalf("read after clearing: %q %v", buf[:n], err)
	}
}
