package rawio

import (
	"errors"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/warmroute/warmroute/internal/testkit"
)

// The tests run over real loopback TCP connections: the edges they cover
// (would-block, FIN, RST, full socket buffers, deadlines on the poller)
// are the kernel's and the runtime poller's, which an in-memory pipe does
// not have.

// tcpPair returns the two ends of a loopback TCP connection, closed when
// the test ends.
func tcpPair(t *testing.T) (server, client *net.TCPConn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	s, err := ln.Accept()
	if err != nil {
		c.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close(); c.Close() })
	return s.(*net.TCPConn), c.(*net.TCPConn)
}

// buffers fixes w's send buffer and r's receive buffer (the kernel
// doubles both), which also turns off their autotuning.
func buffers(t *testing.T, w *net.TCPConn, snd int, r *net.TCPConn, rcv int) {
	t.Helper()
	if err := w.SetWriteBuffer(snd); err != nil {
		t.Fatal(err)
	}
	if err := r.SetReadBuffer(rcv); err != nil {
		t.Fatal(err)
	}
}

// reset closes c with a reset (RST) instead of a FIN.
func reset(t *testing.T, c *net.TCPConn) {
	t.Helper()
	if err := c.SetLinger(0); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
}

// waitUntil is testkit.WaitFor with a 5 s timeout.
func waitUntil(t *testing.T, cond func() bool, what string) {
	t.Helper()
	testkit.WaitFor(t, 5*time.Second, what, cond)
}

// isReset reports whether err says the peer reset the connection (a
// write to it may see EPIPE instead).
func isReset(err error) bool {
	return errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// isTimeout reports whether err is a deadline error that also says so
// through net.Error, as callers such as fasthttp expect.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, os.ErrDeadlineExceeded) && errors.As(err, &ne) && ne.Timeout()
}
