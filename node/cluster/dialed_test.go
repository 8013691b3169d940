package cluster

import (
	"net"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// plainStream is a Raft stream layer on loopback without identities.
func plainStream(t *testing.T) *tcpStream {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := newStream(ln, nil, streamConfig{
		clusterID: func() string { return "c1" }, maxConns: 16, maxPerIP: 16,
		handshakeTimeout: 2 * time.Second, idleTimeout: time.Minute, dialTimeout: 2 * time.Second,
		log: testLogger(), refusals: func(string) {}, peer: func(string, string, string, bool, bool) {},
	})
	t.Cleanup(func() { s.Close() })
	return s
}

// TestCloseDialedEndsBlockedReads: a read waiting on a peer that never
// answers (a paused router) ends at once when the stream closes its
// outbound connections, which is what lets Raft's shutdown finish; a
// connection Raft closed itself is no longer tracked.
func TestCloseDialedEndsBlockedReads(t *testing.T) {
	a, b := plainStream(t), plainStream(t)
	go func() { // b accepts and then never answers
		for {
			if _, err := b.Accept(); err != nil {
				return
			}
		}
	}()
	closed, err := a.Dial(raft.ServerAddress(b.Addr().String()), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	closed.Close()
	c, err := a.Dial(raft.ServerAddress(b.Addr().String()), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	read := make(chan error, 1)
	go func() {
		_, err := c.Read(make([]byte, 1))
		read <- err
	}()
	select {
	case err := <-read:
		t.Fatalf("the read ended before the connections were closed: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	if n := a.closeDialed(); n != 1 {
		t.Fatalf("closeDialed closed %d connections, want 1 (the one Raft closed itself is gone)", n)
	}
	select {
	case err := <-read:
		if err == nil {
			t.Fatal("the read returned no error on a closed connection")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the read still waits after closeDialed")
	}
	if n := a.closeDialed(); n != 0 {
		t.Fatalf("%d connections still tracked after they were closed", n)
	}
}
