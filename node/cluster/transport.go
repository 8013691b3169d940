package cluster

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
)

// tcpStream is Raft's TCP stream layer, plus what raft.TCPStreamLayer
// lacks: Close also closes every accepted connection, so the transport's
// per-connection goroutines end with the Cluster instead of when the peer
// next writes.
type tcpStream struct {
	ln        net.Listener
	advertise net.Addr
	// tls, when set, wraps every connection both ways (mutual TLS: the
	// config carries this node's certificate and the cluster CA).
	tls *tls.Config

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
}

var _ raft.StreamLayer = (*tcpStream)(nil)

func (s *tcpStream) Accept() (net.Conn, error) {
	c, err := s.ln.Accept()
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		_ = c.Close()
		return nil, net.ErrClosed
	}
	if s.tls != nil {
		c = tls.Server(c, s.tls)
	}
	tc := &trackedConn{Conn: c, s: s}
	s.conns[tc] = struct{}{}
	return tc, nil
}

func (s *tcpStream) Close() error {
	err := s.ln.Close()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	for c := range s.conns {
		_ = c.(*trackedConn).Conn.Close()
	}
	clear(s.conns)
	return err
}

func (s *tcpStream) Addr() net.Addr {
	if s.advertise != nil {
		return s.advertise
	}
	return s.ln.Addr()
}

func (s *tcpStream) Dial(addr raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	d := net.Dialer{Timeout: timeout}
	if s.tls != nil {
		return tls.DialWithDialer(&d, "tcp", string(addr), s.tls)
	}
	return d.Dial("tcp", string(addr))
}

type trackedConn struct {
	net.Conn
	s    *tcpStream
	once sync.Once
}

func (c *trackedConn) Close() error {
	c.once.Do(func() {
		c.s.mu.Lock()
		delete(c.s.conns, c)
		c.s.mu.Unlock()
	})
	return c.Conn.Close()
}

// tcpTransport listens on RaftBind and advertises RaftAdvertise (or the
// bound address, which must then be a concrete IP).
func (c *Cluster) tcpTransport(hl hclog.Logger) (*raft.NetworkTransport, error) {
	var adv net.Addr
	if a := c.cfg.RaftAdvertise; a != "" {
		ta, err := net.ResolveTCPAddr("tcp", a)
		if err != nil {
			return nil, fmt.Errorf("cluster: raft advertise address %q: %w", a, err)
		}
		adv = ta
	}
	ln, err := net.Listen("tcp", c.cfg.RaftBind)
	if err != nil {
		return nil, fmt.Errorf("cluster: raft listen on %s: %w", c.cfg.RaftBind, err)
	}
	s := &tcpStream{ln: ln, advertise: adv, tls: c.cfg.TLS, conns: map[net.Conn]struct{}{}}
	if ta, ok := s.Addr().(*net.TCPAddr); !ok || ta.IP == nil || ta.IP.IsUnspecified() {
		_ = ln.Close()
		return nil, errors.New("cluster: raft address " + s.Addr().String() + " is not advertisable: set RaftAdvertise")
	}
	return raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{
		Stream:                s,
		ServerAddressProvider: addrProvider{c},
		MaxPool:               3,
		Timeout:               10 * time.Second,
		Logger:                hl.Named("transport"),
	}), nil
}
