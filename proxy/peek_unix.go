//go:build unix

package proxy

import (
	"errors"
	"net"
	"syscall"
)

// peerClosed reports whether the peer closed an idle connection (EOF or
// reset pending, or unexpected bytes waiting), with one non-blocking
// MSG_PEEK recv.
func peerClosed(c net.Conn) bool {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	closed := false
	var buf [1]byte
	err = rc.Read(func(fd uintptr) bool {
		n, _, rerr := syscall.Recvfrom(int(fd), buf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		switch {
		case errors.Is(rerr, syscall.EAGAIN) || errors.Is(rerr, syscall.EWOULDBLOCK):
			closed = false // alive and quiet
		case rerr != nil:
			closed = true // reset or other error
		default:
			closed = true // n == 0: EOF; n > 0: bytes nobody asked for
			_ = n
		}
		return true
	})
	return err == nil && closed
}
