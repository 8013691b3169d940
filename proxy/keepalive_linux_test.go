//go:build linux

package proxy

import (
	"net"
	"syscall"
	"testing"
	"time"
)

// Neither the client listener's accepted connections nor the dialled
// upstream ones set TCP keep-alive (four socket options per connection
// that the router's own deadlines make useless); both keep TCP_NODELAY.
func TestNoTCPKeepAlive(t *testing.T) {
	ln, err := Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			close(accepted)
			return
		}
		accepted <- c
	}()
	cfg := DefaultConfig()
	up, err := newDialer(&cfg)(ln.Addr().String(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer up.Close()
	in, ok := <-accepted
	if !ok {
		t.Fatal("accept failed")
	}
	defer in.Close()
	for name, c := range map[string]net.Conn{"accepted": in, "dialled": up.(*upstreamConn).Conn} {
		if ka := sockopt(t, c, syscall.SOL_SOCKET, syscall.SO_KEEPALIVE); ka != 0 {
			t.Errorf("%s connection: SO_KEEPALIVE %d, want 0", name, ka)
		}
		if nd := sockopt(t, c, syscall.IPPROTO_TCP, syscall.TCP_NODELAY); nd == 0 {
			t.Errorf("%s connection: TCP_NODELAY off", name)
		}
	}
}

func sockopt(t *testing.T, c net.Conn, level, opt int) int {
	t.Helper()
	rc, err := c.(syscall.Conn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var v int
	var gerr error
	if err := rc.Control(func(fd uintptr) { v, gerr = syscall.GetsockoptInt(int(fd), level, opt) }); err != nil {
		t.Fatal(err)
	}
	if gerr != nil {
		t.Fatal(gerr)
	}
	return v
}
