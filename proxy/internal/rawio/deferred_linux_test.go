//go:build linux

package rawio

import (
	"bytes"
	"io"
	"net"
	"testing"
	"time"
)

func newDeferred(t *testing.T, c net.Conn, stall time.Duration) *DeferredWrite {
	t.Helper()
	d := NewDeferredWrite(c, stall)
	if d == nil {
		t.Fatal("no raw socket for a TCP connection")
	}
	return d
}

// echo answers each message of size n read on c with answer, until c
// fails.
func echo(c net.Conn, n int, answer string) <-chan []byte {
	got := make(chan []byte, 16)
	go func() {
		defer close(got)
		for {
			b := make([]byte, n)
			if _, err := io.ReadFull(c, b); err != nil {
				return
			}
			got <- b
			if _, err := io.WriteString(c, answer); err != nil {
				return
			}
		}
	}()
	return got
}

// A write is held until the next read, which sends it and then gets the
// answer; nothing reaches the peer before.
func TestDeferredWriteHeldUntilRead(t *testing.T) {
	srv, cli := tcpPair(t)
	d := newDeferred(t, cli, time.Second)
	req := []byte("request")
	if n, err := d.Write(req); n != len(req) || err != nil {
		t.Fatalf("write: %d %v", n, err)
	}
	req[0] = 'X' // the caller reuses its buffer: the held bytes are a copy
	if readable(srv) {
		t.Fatal("the held write reached the peer before the read")
	}
	got := echo(srv, len(req), "answer")
	buf := make([]byte, 16)
	for i := range 3 {
		n, err := d.Read(buf)
		if err != nil || string(buf[:n]) != "answer" {
			t.Fatalf("exchange %d: read %q %v", i, buf[:n], err)
		}
		if b := <-got; string(b) != "request" {
			t.Fatalf("exchange %d: the peer got %q", i, b)
		}
		copy(req, "request")
		if _, err := d.Write(req); err != nil {
			t.Fatal(err)
		}
	}
	// An empty read sends nothing and keeps the bytes held.
	if n, err := d.Read(nil); n != 0 || err != nil {
		t.Fatalf("empty read: %d %v", n, err)
	}
	if readable(srv) {
		t.Fatal("an empty read sent the held bytes")
	}
	// flush sends them without a read.
	if err := d.flush(); err != nil {
		t.Fatal(err)
	}
	if b := <-got; string(b) != "request" {
		t.Fatalf("the peer got %q after flush", b)
	}
}

// A write while bytes are held sends those first, so order is kept; a
// write over 64 KiB goes out at once.
func TestDeferredWriteOrderAndLargeWrites(t *testing.T) {
	srv, cli := tcpPair(t)
	d := newDeferred(t, cli, time.Second)
	large := bytes.Repeat([]byte("L"), maxHeld+1)
	want := append([]byte("first"), large...)
	want = append(want, "last"...)
	got := make(chan []byte, 1)
	go func() {
		b := make([]byte, len(want))
		n, _ := io.ReadFull(srv, b)
		got <- b[:n]
		srv.Write([]byte("ok"))
	}()
	for _, p := range [][]byte{[]byte("first"), large} {
		if n, err := d.Write(p); n != len(p) || err != nil {
			t.Fatalf("write of %d: %d %v", len(p), n, err)
		}
	}
	if len(d.held) != 0 {
		t.Fatalf("%d bytes held after a large write", len(d.held))
	}
	if _, err := d.Write([]byte("last")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 8)
	if n, err := d.Read(buf); err != nil || string(buf[:n]) != "ok" {
		t.Fatalf("read %q %v", buf[:n], err)
	}
	if b := <-got; !bytes.Equal(b, want) {
		t.Fatalf("the peer got %d bytes out of order or short (want %d)", len(b), len(want))
	}
}

// Held bytes that do not fit the socket buffers are finished the
// ordinary way (waiting for room) before the read.
func TestDeferredWriteLargerThanSocketBuffer(t *testing.T) {
	// The peer starts reading a while after the request was written, so
	// that the buffers fill; if it was quicker than that (a loaded
	// machine), the exchange is tried again with a longer pause.
	for pause := 20 * time.Millisecond; ; pause *= 2 {
		srv, cli := tcpPair(t)
		buffers(t, cli, 4<<10, srv, 4<<10)
		d := newDeferred(t, cli, 5*time.Second)
		req := bytes.Repeat([]byte("0123456789abcdef"), maxHeld/16) // 64 KiB, held
		if _, err := d.Write(req); err != nil {
			t.Fatal(err)
		}
		got := make(chan []byte, 1)
		go func() {
			time.Sleep(pause) // a peer slow to read
			b := make([]byte, len(req))
			n, _ := io.ReadFull(srv, b)
			got <- b[:n]
			srv.Write([]byte("done"))
		}()
		buf := make([]byte, 8)
		if n, err := d.Read(buf); err != nil || string(buf[:n]) != "done" {
			t.Fatalf("read %q %v", buf[:n], err)
		}
		if b := <-got; !bytes.Equal(b, req) {
			t.Fatal("the peer got other bytes than were held")
		}
		if d.blocked {
			return
		}
		if pause > time.Second {
			t.Fatal("the held bytes always fit the socket buffers; the test needs them not to")
		}
		t.Logf("the held bytes fit the buffers with a %v pause; trying a longer one", pause)
	}
}

// A held write to a peer that reset the connection fails the read that
// sends it; to a peer that closed (FIN) it ends with io.EOF or a reset,
// never a wait.
func TestDeferredWriteToClosedPeer(t *testing.T) {
	t.Run("reset", func(t *testing.T) {
		srv, cli := tcpPair(t)
		d := newDeferred(t, cli, time.Second)
		reset(t, srv)
		waitUntil(t, func() bool { return readable(cli) }, "the reset to arrive")
		if _, err := d.Write([]byte("request")); err != nil {
			t.Fatal(err)
		}
		if n, err := d.Read(make([]byte, 8)); n != 0 || !isReset(err) {
			t.Fatalf("read: %d %v, want a reset", n, err)
		}
	})
	t.Run("FIN", func(t *testing.T) {
		srv, cli := tcpPair(t)
		d := newDeferred(t, cli, time.Second)
		srv.Close()
		waitUntil(t, func() bool { return readable(cli) }, "the FIN to arrive")
		if _, err := d.Write([]byte("request")); err != nil {
			t.Fatal(err)
		}
		setDeadline(t, d.Socket, time.Now().Add(5*time.Second))
		n, err := d.Read(make([]byte, 8))
		if n != 0 || (err != io.EOF && !isReset(err)) {
			t.Fatalf("read: %d %v, want io.EOF or a reset", n, err)
		}
	})
}

// The read that sends held bytes and then waits honours the read
// deadline.
func TestDeferredWriteReadDeadline(t *testing.T) {
	srv, cli := tcpPair(t)
	d := newDeferred(t, cli, time.Second)
	got := make(chan []byte, 1)
	go func() {
		b := make([]byte, 7)
		io.ReadFull(srv, b)
		got <- b // and never answers
	}()
	if _, err := d.Write([]byte("request")); err != nil {
		t.Fatal(err)
	}
	setDeadline(t, d.Socket, time.Now().Add(50*time.Millisecond))
	if n, err := d.Read(make([]byte, 8)); n != 0 || !isTimeout(err) {
		t.Fatalf("read: %d %v, want a timeout", n, err)
	}
	if b := <-got; string(b) != "request" {
		t.Fatalf("the peer got %q", b)
	}
}

// An exchange through a DeferredWrite (the request sent by the read of
// its answer) allocates nothing, the peer's part included.
func TestDeferredWriteAllocations(t *testing.T) {
	srv, cli := tcpPair(t)
	d := newDeferred(t, cli, time.Second)
	s := newSocket(t, srv)
	req, ans := []byte("request"), []byte("answer")
	done := make(chan struct{})
	go func() {
		defer close(done)
		b := make([]byte, len(req))
		for {
			if _, err := io.ReadFull(s, b); err != nil {
				return
			}
			if _, err := s.Write(ans); err != nil {
				return
			}
		}
	}()
	buf := make([]byte, 16)
	n := testing.AllocsPerRun(200, func() {
		if d.PeerClosed() {
			t.Fatal("an open connection reported closed")
		}
		if _, err := d.Write(req); err != nil {
			t.Fatal(err)
		}
		if n, err := io.ReadFull(d, buf[:len(ans)]); err != nil {
			t.Fatal(n, err)
		}
	})
	cli.Close()
	<-done
	if n != 0 {
		t.Fatalf("%.1f allocations per exchange, want 0", n)
	}
}
