package gossip

import (
	"net"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
)

// countingTransport is memberlist's NetTransport counting the bytes it
// sends (all of memberlist's traffic: probes, gossip, push/pull and our
// messages, after framing and encryption).
type countingTransport struct {
	*memberlist.NetTransport
	packetBytes atomic.Uint64
	streamBytes atomic.Uint64
}

var _ memberlist.NodeAwareTransport = (*countingTransport)(nil)

func (t *countingTransport) WriteTo(b []byte, addr string) (time.Time, error) {
	t.packetBytes.Add(uint64(len(b)))
	return t.NetTransport.WriteTo(b, addr)
}

func (t *countingTransport) WriteToAddress(b []byte, a memberlist.Address) (time.Time, error) {
	t.packetBytes.Add(uint64(len(b)))
	return t.NetTransport.WriteToAddress(b, a)
}

func (t *countingTransport) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	c, err := t.NetTransport.DialTimeout(addr, timeout)
	if err != nil {
		return nil, err
	}
	return &countingConn{Conn: c, n: &t.streamBytes}, nil
}

func (t *countingTransport) DialAddressTimeout(a memberlist.Address, timeout time.Duration) (net.Conn, error) {
	c, err := t.NetTransport.DialAddressTimeout(a, timeout)
	if err != nil {
		return nil, err
	}
	return &countingConn{Conn: c, n: &t.streamBytes}, nil
}

type countingConn struct {
	net.Conn
	n *atomic.Uint64
}

func (c *countingConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	c.n.Add(uint64(n))
	return n, err
}
