//go:build linux

package rawio

import (
	"bytes"
	"errors"
	"io"
	"net"
	"syscall"
	"testing"
	"time"
	"unsafe"
)

// newSocket returns a Socket over c with no write bound.
func newSocket(t *testing.T, c net.Conn) *Socket {
	t.Helper()
	s := NewSocket(c, 0)
	if s == nil {
		t.Fatal("no raw socket for a TCP connection")
	}
	return s
}

func init() {
	peekers["Socket.PeerClosed"] = func(t *testing.T, c net.Conn) func() bool {
		return newSocket(t, c).PeerClosed
	}
}

// readable reports whether a read on c would not wait: bytes, an EOF or
// a reset are pending. Unlike a peek it leaves a pending reset in place.
func readable(c syscall.Conn) bool {
	rc, err := c.SyscallConn()
	if err != nil {
		return false
	}
	ok := false
	rc.Control(func(fd uintptr) {
		var set syscall.FdSet
		bits := uintptr(unsafe.Sizeof(set.Bits[0]) * 8)
		set.Bits[fd/bits] |= 1 << (fd % bits)
		n, err := syscall.Select(int(fd)+1, &set, nil, nil, &syscall.Timeval{})
		ok = err == nil && n > 0
	})
	return ok
}

// writer returns a Socket with the write bound stall over one end of a
// new loopback connection, whose send buffer is fixed at snd, and the
// other end, whose receive buffer is fixed at rcv.
func writer(t *testing.T, stall time.Duration, snd, rcv int) (*Socket, *net.TCPConn) {
	t.Helper()
	srv, cli := tcpPair(t)
	buffers(t, srv, snd, cli, rcv)
	return NewSocket(srv, stall), cli
}

type readResult struct {
	n   int
	err error
}

// waitingRead starts a Read on s in a goroutine and returns once the read
// found nothing and is about to wait (OnBlock), with the channel that
// gets its result.
func waitingRead(t *testing.T, s *Socket, p []byte) <-chan readResult {
	t.Helper()
	waiting := make(chan struct{})
	s.OnBlock(func() { close(waiting) })
	ch := make(chan readResult, 1)
	go func() {
		n, err := s.Read(p)
		ch <- readResult{n, err}
	}()
	select {
	case <-waiting:
	case r := <-ch:
		t.Fatalf("the read returned %d %v without waiting", r.n, r.err)
	case <-time.After(5 * time.Second):
		t.Fatal("the read neither waited nor returned within 5 s")
	}
	return ch
}

// result waits for a waitingRead.
func result(t *testing.T, ch <-chan readResult) readResult {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(5 * time.Second):
		t.Fatal("the read did not return within 5 s")
		return readResult{}
	}
}

// readAfterWait reads msg on s, which peer sends only once the read
// found nothing and is about to wait: the read certainly waits (and so
// hands its deadline to the poller if it must).
func readAfterWait(t *testing.T, s *Socket, peer net.Conn, msg string) {
	t.Helper()
	s.OnBlock(func() { peer.Write([]byte(msg)) })
	buf := make([]byte, len(msg)+1)
	if n, err := s.Read(buf); err != nil || string(buf[:n]) != msg {
		t.Fatalf("read %q %v, want %q", buf[:n], err, msg)
	}
}

// setDeadline asks s for the read deadline at (none if zero).
func setDeadline(t *testing.T, s *Socket, at time.Time) {
	t.Helper()
	var want int64
	if !at.IsZero() {
		want = at.UnixNano()
	}
	if err := s.SetReadDeadline(want, time.Now().UnixNano()); err != nil {
		t.Fatal(err)
	}
}

func TestNewSocketNeedsADescriptor(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	if s := NewSocket(a, 0); s != nil {
		t.Fatal("a Socket over net.Pipe")
	}
	if d := NewDeferredWrite(a, 0); d != nil {
		t.Fatal("a DeferredWrite over net.Pipe")
	}
}

// A read that finds nothing (EAGAIN) waits on the poller for the data,
// and a read with an empty buffer returns at once.
func TestReadWouldBlockWaitsForData(t *testing.T) {
	srv, cli := tcpPair(t)
	s := newSocket(t, srv)
	if n, err := s.Read(nil); n != 0 || err != nil {
		t.Fatalf("empty read: %d %v", n, err)
	}
	buf := make([]byte, 64)
	ch := waitingRead(t, s, buf)
	if _, err := cli.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	if r := result(t, ch); r.err != nil || string(buf[:r.n]) != "hello" {
		t.Fatalf("read %q %v", buf[:r.n], r.err)
	}
}

// A read with nothing to read and a deadline fails when the deadline
// passes, with a net.OpError that is a timeout.
func TestReadDeadlineEndsWait(t *testing.T) {
	srv, _ := tcpPair(t)
	s := newSocket(t, srv)
	start := time.Now()
	setDeadline(t, s, start.Add(50*time.Millisecond))
	n, err := s.Read(make([]byte, 8))
	if n != 0 || !isTimeout(err) {
		t.Fatalf("read: %d %v, want a timeout", n, err)
	}
	var oe *net.OpError
	if !errors.As(err, &oe) || oe.Source == nil || oe.Addr == nil {
		t.Fatalf("read error %#v, want a net.OpError naming both addresses", err)
	}
	if d := time.Since(start); d < 40*time.Millisecond || d > 3*time.Second {
		t.Fatalf("a 50 ms deadline ended the read after %v", d)
	}
}

// OnBlock runs once, before a read that has to wait waits, and not for a
// read that finds data: it is how a held write goes out before the wait.
func TestOnBlockRunsOnceBeforeWait(t *testing.T) {
	srv, cli := tcpPair(t)
	s := newSocket(t, srv)
	calls := 0
	// The bytes the waiting read gets are sent by OnBlock itself: the read
	// can end only if it ran before the wait. (OnBlock must not use the
	// Socket it is set on; it sends on the peer's end.)
	s.OnBlock(func() {
		calls++
		if _, err := cli.Write([]byte("pong")); err != nil {
			t.Error(err)
		}
	})
	buf := make([]byte, 64)

	// Data waiting: OnBlock stays set.
	cli.Write([]byte("early"))
	waitUntil(t, func() bool { return readable(srv) }, "the bytes to arrive")
	if n, err := s.Read(buf); err != nil || string(buf[:n]) != "early" {
		t.Fatalf("read %q %v", buf[:n], err)
	}
	if calls != 0 {
		t.Fatalf("OnBlock ran %d times for a read that did not wait", calls)
	}

	// Nothing waiting: OnBlock runs, then the read waits.
	if n, err := s.Read(buf); err != nil || string(buf[:n]) != "pong" {
		t.Fatalf("read %q %v", buf[:n], err)
	}
	if calls != 1 {
		t.Fatalf("OnBlock ran %d times, want 1", calls)
	}

	// It was used up; and OnBlock(nil) clears one that was not.
	s.OnBlock(func() { calls++ })
	s.OnBlock(nil)
	time.AfterFunc(20*time.Millisecond, func() { cli.Write([]byte("late")) })
	if n, err := s.Read(buf); err != nil || string(buf[:n]) != "late" {
		t.Fatalf("read %q %v", buf[:n], err)
	}
	if calls != 1 {
		t.Fatalf("a cleared OnBlock ran (%d calls)", calls)
	}
}

// A peer that closes (FIN) ends a waiting read with io.EOF; one that sent
// bytes and closed while the connection was idle gives the bytes, then
// io.EOF, and io.EOF again after.
func TestPeerFIN(t *testing.T) {
	t.Run("mid-read", func(t *testing.T) {
		srv, cli := tcpPair(t)
		s := newSocket(t, srv)
		ch := waitingRead(t, s, make([]byte, 8))
		cli.Close()
		if r := result(t, ch); r.n != 0 || r.err != io.EOF {
			t.Fatalf("read: %d %v, want io.EOF", r.n, r.err)
		}
	})
	t.Run("idle", func(t *testing.T) {
		srv, cli := tcpPair(t)
		s := newSocket(t, srv)
		cli.Write([]byte("bye"))
		cli.Close()
		waitUntil(t, func() bool { return readable(srv) }, "the bytes to arrive")
		buf := make([]byte, 8)
		got := []byte{}
		var err error
		for err == nil {
			var n int
			n, err = s.Read(buf)
			got = append(got, buf[:n]...)
		}
		if string(got) != "bye" || err != io.EOF {
			t.Fatalf("read %q then %v, want \"bye\" then io.EOF", got, err)
		}
		if n, err := s.Read(buf); n != 0 || err != io.EOF {
			t.Fatalf("read after EOF: %d %v", n, err)
		}
	})
}

// A peer that resets (RST) ends a waiting read, or the next one, with
// ECONNRESET in a net.OpError; a write after it fails (EPIPE or
// ECONNRESET) without a signal.
func TestPeerRST(t *testing.T) {
	t.Run("mid-read", func(t *testing.T) {
		srv, cli := tcpPair(t)
		s := newSocket(t, srv)
		ch := waitingRead(t, s, make([]byte, 8))
		reset(t, cli)
		r := result(t, ch)
		var oe *net.OpError
		if r.n != 0 || !isReset(r.err) || !errors.As(r.err, &oe) || oe.Op != "read" {
			t.Fatalf("read: %d %v, want a reset", r.n, r.err)
		}
	})
	t.Run("idle", func(t *testing.T) {
		srv, cli := tcpPair(t)
		s := newSocket(t, srv)
		reset(t, cli)
		waitUntil(t, func() bool { return readable(srv) }, "the reset to arrive")
		if n, err := s.Read(make([]byte, 8)); n != 0 || !isReset(err) {
			t.Fatalf("read: %d %v, want a reset", n, err)
		}
		n, err := s.Write([]byte("after"))
		var oe *net.OpError
		if n != 0 || !isReset(err) || !errors.As(err, &oe) || oe.Op != "write" {
			t.Fatalf("write after a reset: %d %v", n, err)
		}
	})
}

// A write larger than the socket buffers goes out in pieces (partial
// sends, then waits for room) and returns once all of it is out.
func TestPartialWritesComplete(t *testing.T) {
	for _, stall := range []time.Duration{0, 2 * time.Second} {
		s, cli := writer(t, stall, 16<<10, 64<<10)
		msg := bytes.Repeat([]byte("0123456789abcdef"), 64<<10) // 1 MiB
		got := make(chan []byte, 1)
		go func() {
			b := make([]byte, len(msg))
			n, _ := io.ReadFull(cli, b)
			got <- b[:n]
		}()
		n, err := s.Write(msg)
		if n != len(msg) || err != nil {
			t.Fatalf("stall %v: wrote %d of %d: %v", stall, n, len(msg), err)
		}
		if b := <-got; !bytes.Equal(b, msg) {
			t.Fatalf("stall %v: the peer got %d bytes, not what was written", stall, len(b))
		}
	}
}

// With a write bound, a write to a peer that stopped reading fails after
// the bound with a timeout and the count of bytes that went out; the
// write deadline is cleared after it, so a later write is not failed by
// it.
func TestWriteStallFailsWhenPeerStopsReading(t *testing.T) {
	const stall = 200 * time.Millisecond
	// Buffers as small as they go: once they are full, nothing more moves.
	s, cli := writer(t, stall, 4<<10, 4<<10)
	msg := make([]byte, 4<<20)
	start := time.Now()
	n, err := s.Write(msg)
	took := time.Since(start)
	var oe *net.OpError
	if !isTimeout(err) || !errors.As(err, &oe) {
		t.Fatalf("write to a peer that does not read: %d %v, want a timeout", n, err)
	}
	if n <= 0 || n >= len(msg) {
		t.Fatalf("wrote %d of %d bytes before the stall", n, len(msg))
	}
	if took < stall-stall/10 || took > 3*time.Second {
		t.Fatalf("failed after %v; the bound is %v", took, stall)
	}
	// The peer drains what was sent; a small write then goes through at
	// once even well after the stalled write's deadline.
	go io.CopyN(io.Discard, cli, int64(n))
	time.Sleep(stall) // past the earlier write deadline, had it stayed
	waitUntil(t, func() bool {
		_, err := s.Write([]byte("x"))
		return err == nil
	}, "a write to go through")
}

// A peer that reads slowly but steadily never trips the write bound,
// though the whole write takes longer than it: the bound is per stall.
func TestWriteStallSparesSlowReader(t *testing.T) {
	const stall = 250 * time.Millisecond
	// The writer wakes when half its send buffer drained, a few of the
	// reader's reads; the receive buffer is well above loopback's 64 KiB
	// segments, so the window never shrinks below one.
	s, cli := writer(t, stall, 64<<10, 256<<10)
	msg := make([]byte, 8<<20)
	done := make(chan int64, 1)
	go func() {
		var total int64
		buf := make([]byte, 32<<10)
		for total < int64(len(msg)) {
			time.Sleep(2 * time.Millisecond) // a reader trickling
			n, err := cli.Read(buf)
			total += int64(n)
			if err != nil {
				break
			}
		}
		done <- total
	}()
	start := time.Now()
	if n, err := s.Write(msg); n != len(msg) || err != nil {
		t.Fatalf("wrote %d of %d after %v: %v", n, len(msg), time.Since(start), err)
	}
	took := time.Since(start)
	if got := <-done; got != int64(len(msg)) {
		t.Fatalf("the peer got %d bytes", got)
	}
	t.Logf("a %d MiB write to a slow reader took %v (bound %v per stall)", len(msg)>>20, took, stall)
	if took < stall {
		t.Logf("the write took less than the bound; the reader was not slow enough to show it")
	}
}

// The server's pattern of an idle deadline before each request and a read
// deadline after its first byte reaches the poller a handful of times over
// many requests, not twice per request; and the deadline still holds.
func TestReadDeadlineReachesPollerLazily(t *testing.T) {
	srv, cli := tcpPair(t)
	s := NewSocket(srv, time.Second)
	const idle, read = 60 * time.Second, 3 * time.Second
	const n = 200
	start := time.Now()
	for range n {
		setDeadline(t, s, time.Now().Add(idle))
		readAfterWait(t, s, cli, "x") // every read waits
		setDeadline(t, s, time.Now().Add(read))
	}
	// The idle deadline moves on the poller each time it moved by more than
	// 1/64 of its length (armRead): about once a second here, however
	// slow the machine is.
	took := time.Since(start)
	if got, most := s.rdApplied, 3+int(took/(idle/64)); got > most {
		t.Fatalf("the poller's deadline was set %d times for %d requests in %v (at most %d)", got, n, took, most)
	}
	t.Logf("%d requests in %v, poller deadline set %d times", n, took, s.rdApplied)

	// A read that waits gets the deadline asked for last (3 s would be too
	// long to wait here, so ask for a short one: earlier, so applied).
	buf := make([]byte, 8)
	start = time.Now()
	setDeadline(t, s, start.Add(50*time.Millisecond))
	if _, err := s.Read(buf); !isTimeout(err) {
		t.Fatalf("read: %v, want a deadline error", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("the 50 ms deadline ended the read after %v", d)
	}

	// A deadline in the past fails the next read at once, even with data
	// waiting (net.Conn semantics, used to interrupt reads).
	cli.Write([]byte("y"))
	waitUntil(t, func() bool { return readable(srv) }, "the byte to arrive")
	setDeadline(t, s, time.Now().Add(-time.Second))
	if _, err := s.Read(buf); !isTimeout(err) {
		t.Fatalf("read past the deadline: %v", err)
	}
	// Cleared, the read gets the waiting byte.
	setDeadline(t, s, time.Time{})
	if n, err := s.Read(buf); err != nil || string(buf[:n]) != "y" {
		t.Fatalf("read after clearing: %q %v", buf[:n], err)
	}
}

// Before a wait, a deadline later than the poller's by at most 1/64 of
// its length is left on the poller; a later one, or an earlier one, is
// applied.
func TestReadDeadlineSlack(t *testing.T) {
	srv, cli := tcpPair(t)
	s := newSocket(t, srv)
	for _, step := range []struct {
		ahead   time.Duration
		applied int
		what    string
	}{
		{64 * time.Second, 1, "the first deadline"},
		{64 * time.Second, 1, "a deadline later by less than 1 s (1/64)"},
		{70 * time.Second, 2, "a deadline later by 6 s"},
		{30 * time.Second, 3, "an earlier deadline"},
	} {
		setDeadline(t, s, time.Now().Add(step.ahead))
		readAfterWait(t, s, cli, "x")
		if s.rdApplied != step.applied {
			t.Fatalf("%s: the poller's deadline was set %d times in all, want %d", step.what, s.rdApplied, step.applied)
		}
	}
}

// A poller deadline about to lapse is replaced at once when a later one is
// asked for: the poller fails a read whose deadline passed even with data
// waiting, so leaving it for the next wait would fail a read that does not
// wait.
func TestLapsingPollerDeadlineReplacedAtOnce(t *testing.T) {
	srv, cli := tcpPair(t)
	s := newSocket(t, srv)
	short := time.Now().Add(200 * time.Millisecond)
	setDeadline(t, s, short)
	readAfterWait(t, s, cli, "a") // the wait hands it to the poller
	applied := s.rdApplied
	setDeadline(t, s, time.Now().Add(time.Minute))
	if s.rdApplied != applied+1 {
		t.Fatal("a deadline replacing one about to lapse was not applied at once")
	}
	time.Sleep(time.Until(short) + 20*time.Millisecond) // the short one lapses
	cli.Write([]byte("b"))
	waitUntil(t, func() bool { return readable(srv) }, "the byte to arrive")
	buf := make([]byte, 8)
	if n, err := s.Read(buf); err != nil || string(buf[:n]) != "b" {
		t.Fatalf("read after the old deadline lapsed: %q %v", buf[:n], err)
	}
}

// A deadline set on the connection behind the Socket's back (an interrupt
// from another goroutine) ends a waiting read; after PollerChanged the
// Socket no longer trusts what it thought the poller held, so the next
// deadline it is asked for, even the same as before, is applied and the
// next read waits for its data instead of failing.
func TestDeadlineSetBehindItsBack(t *testing.T) {
	srv, cli := tcpPair(t)
	s := newSocket(t, srv)
	far := time.Now().Add(time.Minute)
	setDeadline(t, s, far)
	ch := waitingRead(t, s, make([]byte, 8))
	srv.SetReadDeadline(time.Now().Add(-time.Second))
	s.PollerChanged()
	if r := result(t, ch); !isTimeout(r.err) {
		t.Fatalf("interrupted read: %d %v, want a timeout", r.n, r.err)
	}
	setDeadline(t, s, far)
	readAfterWait(t, s, cli, "z")
}

// Reads, writes and the peek allocate nothing.
func TestSocketAllocations(t *testing.T) {
	srv, cli := tcpPair(t)
	s := newSocket(t, srv)
	c := newSocket(t, cli)
	msg, buf := []byte("ping"), make([]byte, 16)
	n := testing.AllocsPerRun(200, func() {
		setDeadline(t, s, time.Now().Add(time.Minute))
		if _, err := c.Write(msg); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Read(buf); err != nil {
			t.Fatal(err)
		}
		if s.PeerClosed() {
			t.Fatal("an open connection reported closed")
		}
	})
	if n != 0 {
		t.Fatalf("%.1f allocations per exchange, want 0", n)
	}
}
