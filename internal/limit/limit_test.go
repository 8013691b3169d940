package limit

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"math/big"
	"net"
	"sync"
	"testing"
	"time"
)

// dialFrom opens n connections to ln's address from local address ip.
func dialFrom(t *testing.T, ln net.Listener, ip string, n int) []net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
	var out []net.Conn
	for range n {
		c, err := d.Dial("tcp", ln.Addr().String())
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

// bounded is a Listener on loopback whose accepted connections arrive
// on a channel and whose refusals are counted.
type bounded struct {
	*Listener
	accepted chan net.Conn
	mu       sync.Mutex
	refused  map[string]int
}

func newBounded(t *testing.T, max, perIP int) *bounded {
	t.Helper()
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &bounded{accepted: make(chan net.Conn, 64), refused: map[string]int{}}
	b.Listener = NewListener(raw, max, perIP, func(r string) { b.mu.Lock(); b.refused[r]++; b.mu.Unlock() })
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := b.Accept()
			if err != nil {
				return
			}
			b.accepted <- c
		}
	}()
	t.Cleanup(func() { b.Close(); <-done })
	return b
}

// take receives n accepted connections.
func (b *bounded) take(t *testing.T, n int) []net.Conn {
	t.Helper()
	var out []net.Conn
	for range n {
		select {
		case c := <-b.accepted:
			out = append(out, c)
		case <-time.After(5 * time.Second):
			t.Fatalf("accepted %d of %d connections", len(out), n)
		}
	}
	return out
}

func (b *bounded) count(reason string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.refused[reason]
}

// closed returns the indexes of the clients the listener closed.
func closed(clients []net.Conn) []int {
	var out []int
	for i, c := range clients {
		if closedByPeer(c, 200*time.Millisecond) {
			out = append(out, i)
		}
	}
	return out
}

// TestBounds: over the per-address bound, the oldest pending connections
// of that address are closed for the newer ones; a closed connection
// (closed twice) frees its slot.
func TestBounds(t *testing.T) {
	ln := newBounded(t, 5, 3)
	clients := dialFrom(t, ln, "127.0.0.1", 5)
	server := ln.take(t, 5)
	if got := closed(clients); len(got) != 2 || got[0] != 0 || got[1] != 1 || ln.count(ReasonLimitPerIP) != 2 || ln.Open() != 3 {
		t.Fatalf("closed %v, refused per IP %d, open %d; want the two oldest, 2, 3", got, ln.count(ReasonLimitPerIP), ln.Open())
	}
	// Closing a held connection (twice) frees one slot; closing one the
	// listener closed frees nothing more.
	server[4].Close()
	server[4].Close()
	server[0].Close()
	if ln.Open() != 2 {
		t.Fatalf("open %d after a close, want 2", ln.Open())
	}
}

// TestTotalBound: over the total bound, the oldest pending connection of
// the address holding the most is closed: a neighbour holding idle
// connections from one address churns its own, and the newcomers from
// another address stay.
func TestTotalBound(t *testing.T) {
	ln := newBounded(t, 4, 4)
	flood := dialFrom(t, ln, "127.0.0.2", 4)
	ln.take(t, 4)
	mine := dialFrom(t, ln, "127.0.0.1", 3)
	ln.take(t, 3)
	if got := closed(mine); len(got) != 0 {
		t.Fatalf("newcomers %v closed for a neighbour's idle connections", got)
	}
	if got := closed(flood); len(got) != 3 || ln.count(ReasonLimit) != 3 || ln.Pending() != 4 {
		t.Fatalf("neighbour's connections closed %v, refused %d, pending %d; want 3, 3, 4", got, ln.count(ReasonLimit), ln.Pending())
	}
}

// TestPromote: a promoted connection leaves the pending pool: a flood of
// pending connections from its own address does not close it, and a
// full proven pool (or key) refuses more.
func TestPromote(t *testing.T) {
	ln := newBounded(t, 2, 2)
	first := dialFrom(t, ln, "127.0.0.1", 1)[0]
	held := ln.take(t, 1)[0]
	if !Promote(held, "r1") || !Promote(held, "r1") { // twice: still one slot
		t.Fatal("promotion refused")
	}
	flood := dialFrom(t, ln, "127.0.0.1", 10)
	ln.take(t, 10)
	if closedByPeer(first, 200*time.Millisecond) {
		t.Fatal("a promoted connection was closed by a flood of pending ones")
	}
	if got := closed(flood); len(got) != 8 || ln.Pending() != 2 || ln.Proven() != 1 {
		t.Fatalf("flood closed %v, pending %d, proven %d; want 8, 2, 1", got, ln.Pending(), ln.Proven())
	}
	// The key's share is 2: a second goes in, a third is refused; and a
	// connection the listener closed cannot be promoted.
	more := dialFrom(t, ln, "127.0.0.3", 2)
	m := ln.take(t, 2)
	if !Promote(m[0], "r1") {
		t.Fatal("second promotion for r1 refused")
	}
	if Promote(m[1], "r1") || ln.count(ReasonLimitProven) != 1 {
		t.Fatalf("third promotion for r1 accepted (refused %d)", ln.count(ReasonLimitProven))
	}
	if closedByPeer(more[0], 100*time.Millisecond) {
		t.Fatal("a promoted connection was closed")
	}
	m[1].Close()
	if Promote(m[1], "r2") {
		t.Fatal("a closed connection was promoted")
	}
	// Closing a proven connection frees its proven slot.
	held.Close()
	if ln.Proven() != 1 {
		t.Fatalf("proven %d after a close, want 1", ln.Proven())
	}
}

// TestPromoteThroughTLS: Promote finds the listener's connection under a
// TLS connection.
func TestPromoteThroughTLS(t *testing.T) {
	ln := newBounded(t, 2, 2)
	dialFrom(t, ln, "127.0.0.1", 1)
	raw := ln.take(t, 1)[0]
	tc := tls.Server(raw, &tls.Config{Certificates: []tls.Certificate{selfSigned(t)}})
	if !Promote(tc, "op") || ln.Proven() != 1 || ln.Pending() != 0 {
		t.Fatalf("proven %d, pending %d", ln.Proven(), ln.Pending())
	}
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	if !Promote(a, "x") {
		t.Fatal("a connection of no listener: Promote should leave it alone")
	}
}

func selfSigned(t *testing.T) tls.Certificate {
	t.Helper()
	k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: k}
}
