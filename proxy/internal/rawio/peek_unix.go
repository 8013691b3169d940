//go:build unix

package rawio

import (
	"net"
	"syscall"
)

// PeerClosed reports whether the peer closed the idle connection c (EOF or
// reset pending, or unexpected bytes waiting), with one non-blocking
// MSG_PEEK recv. Like Socket.PeerClosed it runs through Control, which
// ignores deadlines (Read does not call back once the last read deadline
// has passed), and a connection whose descriptor is gone counts as closed.
// A connection without a descriptor cannot be looked at: false. It
// allocates, so on Linux the request path uses Socket.PeerClosed; this one
// serves the other unix systems.
func PeerClosed(c net.Conn) bool {
	rc := syscallConn(c)
	if rc == nil {
		return false
	}
	closed := false
	if err := rc.Control(func(fd uintptr) {
		var buf [1]byte
		_, _, rerr := syscall.Recvfrom(int(fd), buf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		e, _ := rerr.(syscall.Errno)
		closed = peekSaysClosed(e)
	}); err != nil {
		return true
	}
	return closed
}

// syscallConn returns c's syscall.RawConn, or nil when c has no
// descriptor.
func syscallConn(c net.Conn) syscall.RawConn {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return nil
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	return rc
}

// peekSaysClosed reads the outcome of a one-byte non-blocking MSG_PEEK recv
// on an idle connection (0 for no error). EAGAIN: alive and quiet. Any
// other error: reset. No error: EOF (0 bytes) or bytes nobody asked for;
// either way not reusable.
func peekSaysClosed(e syscall.Errno) bool {
	return e != syscall.EAGAIN && e != syscall.EWOULDBLOCK
}
