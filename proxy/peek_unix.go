//go:build unix && !linux

package proxy

import (
	"errors"
	"net"
	"syscall"
)

// peerClosed reports whether the peer closed an idle connection (EOF or
// reset pending, or unexpected bytes waiting), with one non-blocking
// MSG_PEEK recv. (Linux has an allocation-free version in rawio_linux.go.)
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
		_, _, rerr := syscall.Recvfrom(int(fd), buf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		closed = !errors.Is(rerr, syscall.EAGAIN) && !errors.Is(rerr, syscall.EWOULDBLOCK)
		return true
	})
	return err == nil && closed
}
