//go:build unix

package rawio

import (
	"net"
	"testing"
	"time"
)

// peekers are the implementations of the closed-idle-connection check:
// each returns the check for one connection. PeerClosed is the portable
// one that the unix systems other than Linux use; Linux's Socket adds its
// own (socket_linux_test.go).
var peekers = map[string]func(t *testing.T, c net.Conn) func() bool{
	"PeerClosed": func(_ *testing.T, c net.Conn) func() bool {
		return func() bool { return PeerClosed(c) }
	},
}

// The check on an idle connection: open while nothing is waiting; closed
// once the peer sent a FIN, a reset or bytes nobody asked for; closed when
// the connection itself was closed. All of it also after the connection's
// read deadline has passed (a health probe leaves its short one behind),
// where a check made through RawConn.Read would not look at all.
func TestPeerClosed(t *testing.T) {
	cases := []struct {
		name   string
		act    func(t *testing.T, srv, cli *net.TCPConn)
		closed bool
	}{
		{"nothing waiting", func(*testing.T, *net.TCPConn, *net.TCPConn) {}, false},
		{"bytes waiting", func(t *testing.T, _, cli *net.TCPConn) {
			if _, err := cli.Write([]byte("unasked")); err != nil {
				t.Fatal(err)
			}
		}, true},
		{"FIN", func(_ *testing.T, _, cli *net.TCPConn) { cli.Close() }, true},
		{"half-close", func(_ *testing.T, _, cli *net.TCPConn) { cli.CloseWrite() }, true},
		{"reset", func(t *testing.T, _, cli *net.TCPConn) { reset(t, cli) }, true},
		{"closed here", func(_ *testing.T, srv, _ *net.TCPConn) { srv.Close() }, true},
	}
	for name, peeker := range peekers {
		for _, lapsed := range []bool{false, true} {
			for _, tc := range cases {
				label := name + "/" + tc.name
				if lapsed {
					label += "/deadline passed"
				}
				t.Run(label, func(t *testing.T) {
					srv, cli := tcpPair(t)
					peek := peeker(t, srv)
					if lapsed {
						srv.SetReadDeadline(time.Now().Add(-time.Second))
					}
					tc.act(t, srv, cli)
					if tc.closed {
						waitUntil(t, peek, "the check to see the connection closed")
						return
					}
					// Give a wrong answer every chance to show.
					cli.Write(nil)
					for range 3 {
						if peek() {
							t.Fatal("an open, quiet connection reported closed")
						}
						time.Sleep(time.Millisecond)
					}
				})
			}
		}
	}
}

// The peek leaves the bytes it saw to be read.
func TestPeerClosedConsumesNothing(t *testing.T) {
	for name, peeker := range peekers {
		t.Run(name, func(t *testing.T) {
			srv, cli := tcpPair(t)
			peek := peeker(t, srv)
			cli.Write([]byte("ab"))
			waitUntil(t, peek, "the bytes to show")
			srv.SetReadDeadline(time.Now().Add(5 * time.Second))
			buf := make([]byte, 2)
			if n, err := srv.Read(buf); err != nil || string(buf[:n]) != "ab" {
				t.Fatalf("read after the peek: %q %v", buf[:n], err)
			}
		})
	}
}

// A connection without a descriptor cannot be looked at: not closed.
func TestPeerClosedWithoutDescriptor(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	if PeerClosed(a) {
		t.Fatal("net.Pipe reported closed")
	}
}
