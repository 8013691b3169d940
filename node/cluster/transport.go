package cluster

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	"github.com/warmroute/warmroute/internal/identity"
	"github.com/warmroute/warmroute/internal/limit"
)

// tcpStream is Raft's stream layer: TCP, mutual TLS when the node has an
// identity, and the preamble (preamble.go) on every connection. Unlike
// raft.TCPStreamLayer it defends its listener:
//
//   - at most MaxConns inbound connections that proved nothing yet,
//     MaxConnsPerIP from one address (internal/limit): a newcomer closes the
//     oldest of the busiest address, so idle connections of a neighbour
//     never keep a router out; a connection that proved a router (TLS
//     and preamble) moves to a pool of its own, MaxConnsPerIP per router;
//   - the TLS handshake and the preamble run in their own goroutine under
//     HandshakeTimeout, before Raft sees the connection (and allocates its
//     buffers for it), so connections that never prove anything cost a
//     few kilobytes for a few seconds;
//   - an inbound connection that sends nothing for IdleTimeout is closed,
//     and a write that makes no progress for the same time fails;
//   - Close closes every accepted connection, so the transport's
//     per-connection goroutines end with the Agreement.
//
// Outbound connections check that the router answering proves a name the
// Agreement expects at that address, and are redialled transparently when
// they sat idle in Raft's pool for longer than half the peer's idle
// timeout (the peer closes them then; a Raft request on a stale pooled
// connection would fail, and a failed vote request costs an election).
type tcpStream struct {
	ln        net.Listener
	advertise net.Addr
	cfg       streamConfig
	accepted  chan net.Conn
	done      chan struct{}
	wg        sync.WaitGroup

	mu     sync.Mutex
	conns  map[*serverConn]struct{} // inbound, handshaking or accepted
	dialed map[*clientConn]struct{} // outbound, until Raft closes them
	closed bool
}

// streamConfig is what the stream needs from the Agreement.
type streamConfig struct {
	// identity is this node's certificate; nil runs Raft in plaintext.
	identity *identity.Bundle
	// clusterID returns the cluster this node's data belong to ("" when
	// not known yet).
	clusterID func() string
	// expect returns the router names that may answer at addr, or nil
	// when the node does not know (then nothing is checked).
	expect func(addr string) map[string]bool
	// peer is told of every preamble exchanged: the peer's proven name
	// ("" without identities), address and cluster, whether the two
	// clusters differ, and whether this node dialled.
	peer func(name, addr, clusterID string, foreign, dialed bool)
	// rpcCheck, with identities, returns the check of every RPC on an
	// inbound connection whose certificate (leaf) proved name (rpcGate).
	rpcCheck func(name string, leaf *x509.Certificate) func(rpcClaims) error

	maxConns, maxPerIP int
	handshakeTimeout   time.Duration
	idleTimeout        time.Duration
	dialTimeout        time.Duration

	log      *slog.Logger
	refusals func(reason string) // counts refused inbound connections
}

var _ raft.StreamLayer = (*tcpStream)(nil)

func newStream(ln net.Listener, advertise net.Addr, cfg streamConfig) *tcpStream {
	s := &tcpStream{
		ln: limit.NewListener(ln, cfg.maxConns, cfg.maxPerIP, cfg.refusals), advertise: advertise, cfg: cfg,
		accepted: make(chan net.Conn),
		done:     make(chan struct{}),
		conns:    map[*serverConn]struct{}{},
		dialed:   map[*clientConn]struct{}{},
	}
	s.wg.Add(1)
	go s.acceptLoop()
	return s
}

// acceptLoop accepts connections (the limit.Listener closes those over
// the caps) and hands each one to a handshake goroutine.
func (s *tcpStream) acceptLoop() {
	defer s.wg.Done()
	var delay time.Duration
	for {
		c, err := s.ln.Accept()
		if err != nil {
			select {
			case <-s.done:
				return
			default:
			}
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// Out of file descriptors and the like: back off.
			delay = min(max(2*delay, 5*time.Millisecond), time.Second)
			s.cfg.log.Warn("raft listener: accept failed", "err", err)
			select {
			case <-s.done:
				return
			case <-time.After(delay):
			}
			continue
		}
		delay = 0
		sc := &serverConn{Conn: c, c: c, s: s, idle: s.cfg.idleTimeout}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			_ = c.Close()
			return
		}
		s.conns[sc] = struct{}{}
		s.mu.Unlock()
		s.wg.Add(1)
		go s.handshake(sc)
	}
}

// limitKey is the host of a remote address.
func limitKey(a net.Addr) string {
	if host, _, err := net.SplitHostPort(a.String()); err == nil {
		return host
	}
	return a.String()
}

// forget drops sc from the connections Close closes.
func (s *tcpStream) forget(sc *serverConn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.conns, sc)
}

// handshake runs TLS and the preamble under the handshake deadline, then
// hands a Raft connection to Accept; anything else is closed.
func (s *tcpStream) handshake(sc *serverConn) {
	defer s.wg.Done()
	ok := false
	defer func() {
		if !ok {
			_ = sc.Close()
		}
	}()
	_ = sc.Conn.SetDeadline(time.Now().Add(s.cfg.handshakeTimeout))
	name := ""
	var leaf *x509.Certificate
	if s.cfg.identity != nil {
		tc := tls.Server(sc.Conn, s.cfg.identity.ServerConfig(false))
		if err := tc.Handshake(); err != nil {
			s.cfg.refusals("tls")
			s.cfg.log.Debug("raft listener: TLS handshake failed", "remote", sc.RemoteAddr().String(), "err", err)
			return
		}
		cs := tc.ConnectionState()
		n, err := identity.PeerName(cs)
		if err != nil {
			s.cfg.refusals("identity")
			return
		}
		name, leaf = n, cs.PeerCertificates[0]
		sc.c = tc
	}
	mode, theirs, err := readPreamble(sc.c)
	if err != nil {
		s.cfg.refusals("preamble")
		s.cfg.log.Debug("raft listener: bad preamble", "remote", sc.RemoteAddr().String(), "err", err)
		return
	}
	ours := s.cfg.clusterID()
	status := byte(statusOK)
	foreign := !sameCluster(ours, theirs)
	if foreign {
		status = statusForeign
	}
	if _, err := sc.c.Write(appendPreamble(nil, status, ours)); err != nil {
		return
	}
	s.cfg.peer(name, sc.RemoteAddr().String(), theirs, foreign, false)
	if foreign {
		s.cfg.refusals("foreign_cluster")
		return
	}
	if mode != modeRaft {
		return // a probe: it has its answer
	}
	// Proven: the connection leaves the pending pool, which neighbours
	// without credentials contend for (internal/limit).
	key := "router:" + name
	if name == "" {
		key = "addr:" + limitKey(sc.RemoteAddr())
	}
	if !limit.Promote(sc.Conn, key) {
		return
	}
	if leaf != nil && s.cfg.rpcCheck != nil {
		sc.gate = newRPCGate(readFunc(sc.readRaw), s.cfg.rpcCheck(name, leaf))
	}
	_ = sc.Conn.SetDeadline(time.Time{})
	select {
	case s.accepted <- sc:
		ok = true
	case <-s.done:
	}
}

func (s *tcpStream) Accept() (net.Conn, error) {
	select {
	case c := <-s.accepted:
		return c, nil
	case <-s.done:
		return nil, net.ErrClosed
	}
}

func (s *tcpStream) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	close(s.done)
	conns := make([]*serverConn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	err := s.ln.Close()
	for _, c := range conns {
		_ = c.Close()
	}
	s.wg.Wait()
	return err
}

func (s *tcpStream) Addr() net.Addr {
	if s.advertise != nil {
		return s.advertise
	}
	return s.ln.Addr()
}

// Dial connects to the router at addr for Raft RPCs.
func (s *tcpStream) Dial(addr raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	a := string(addr)
	c, err := s.dial(a, timeout, modeRaft, s.expectAt(a))
	if err != nil {
		return nil, err
	}
	cc := &clientConn{c: c, idle: s.cfg.idleTimeout / 2,
		redial: func() (net.Conn, error) { return s.dial(a, s.cfg.dialTimeout, modeRaft, s.expectAt(a)) }}
	cc.last.Store(time.Now().UnixNano())
	s.mu.Lock()
	s.dialed[cc] = struct{}{}
	s.mu.Unlock()
	cc.forget = func() {
		s.mu.Lock()
		delete(s.dialed, cc)
		s.mu.Unlock()
	}
	return cc, nil
}

// closeDialed closes every outbound connection Raft holds. Raft's
// shutdown waits for its replication goroutines, and one that pipelines
// AppendEntries to a peer that stopped answering (paused, or cut off)
// waits until 128 requests time out one after another, minutes; with its
// connections closed, each fails at once and the goroutine ends.
func (s *tcpStream) closeDialed() int {
	s.mu.Lock()
	cs := make([]*clientConn, 0, len(s.dialed))
	for c := range s.dialed {
		cs = append(cs, c)
	}
	s.mu.Unlock()
	for _, c := range cs {
		_ = c.Close()
	}
	return len(cs)
}

// expectAt is the name check for a dial to addr: the peer must prove one
// of the names the Agreement expects there (any name when it knows none).
func (s *tcpStream) expectAt(addr string) func(string) error {
	if s.cfg.identity == nil || s.cfg.expect == nil {
		return nil
	}
	want := s.cfg.expect(addr)
	if want == nil {
		return nil
	}
	return func(name string) error {
		if !want[name] {
			return fmt.Errorf("%w: %s proved %q, a router this node does not expect there", identity.ErrWrongPeer, addr, name)
		}
		return nil
	}
}

// errForeignCluster: the peer's data belong to another cluster.
var errForeignCluster = errors.New("cluster: the peer belongs to another cluster")

// errTLSHandshake: a dialled peer did not complete a TLS handshake that
// proves a router this node expects.
var errTLSHandshake = errors.New("cluster: raft TLS handshake failed")

// dial connects, runs TLS (checking the peer's name with expect) and the
// preamble in mode, all within timeout.
func (s *tcpStream) dial(addr string, timeout time.Duration, mode byte, expect func(string) error) (net.Conn, error) {
	if timeout <= 0 || timeout > s.cfg.dialTimeout {
		timeout = s.cfg.dialTimeout
	}
	deadline := time.Now().Add(timeout)
	d := net.Dialer{Deadline: deadline}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			_ = c.Close()
		}
	}()
	_ = c.SetDeadline(deadline)
	name := ""
	if s.cfg.identity != nil {
		tc := tls.Client(c, s.cfg.identity.ClientConfig(expect))
		if err := tc.Handshake(); err != nil {
			return nil, fmt.Errorf("%w with %s: %w", errTLSHandshake, addr, err)
		}
		name, _ = identity.PeerName(tc.ConnectionState())
		c = tc
	}
	ours := s.cfg.clusterID()
	if _, err := c.Write(appendPreamble(nil, mode, ours)); err != nil {
		return nil, err
	}
	status, theirs, err := readPreamble(c)
	if err != nil {
		return nil, fmt.Errorf("cluster: raft preamble from %s: %w", addr, err)
	}
	foreign := status == statusForeign || !sameCluster(ours, theirs)
	s.cfg.peer(name, addr, theirs, foreign, true)
	if foreign {
		return nil, fmt.Errorf("%w: %s (%s) holds cluster %s, this router's data belong to cluster %s", errForeignCluster, addr, name, theirs, ours)
	}
	_ = c.SetDeadline(time.Time{})
	ok = true
	return c, nil
}

// probe checks the router at addr: its proven name (when expect is set)
// and its cluster. It returns the peer's cluster ID.
func (s *tcpStream) probe(addr string, expect func(string) error) error {
	c, err := s.dial(addr, s.cfg.dialTimeout, modeProbe, expect)
	if err != nil {
		return err
	}
	return c.Close()
}

// serverConn is an accepted connection: reads time out after the idle
// timeout (returned as io.EOF, a clean end for Raft, as is a read cut by
// Close), writes after the
// same time without progress. raw is the TCP connection (Close closes
// it); c is what Raft reads and writes: raw, or TLS over it once the
// handshake is done (set before Accept hands the connection out).
type serverConn struct {
	net.Conn // raw
	c        net.Conn
	s        *tcpStream
	idle     time.Duration
	once     sync.Once
	// gate, with identities, checks every RPC before Raft reads it.
	gate *rpcGate
}

func (c *serverConn) Read(p []byte) (int, error) {
	if c.gate != nil {
		return c.gate.Read(p)
	}
	return c.readRaw(p)
}

// readFunc is a function as an io.Reader.
type readFunc func([]byte) (int, error)

func (f readFunc) Read(p []byte) (int, error) { return f(p) }

// readRaw reads what the peer sent, under the idle timeout.
func (c *serverConn) readRaw(p []byte) (int, error) {
	_ = c.Conn.SetReadDeadline(time.Now().Add(c.idle))
	n, err := c.c.Read(p)
	var ne net.Error
	if err != nil && (errors.As(err, &ne) && ne.Timeout() || errors.Is(err, net.ErrClosed)) {
		// The idle timeout, or the stream closing its connections on
		// shutdown: a clean end, which Raft does not log as an error.
		err = io.EOF
	}
	return n, err
}

func (c *serverConn) Write(p []byte) (int, error) {
	_ = c.Conn.SetWriteDeadline(time.Now().Add(c.idle))
	return c.c.Write(p)
}

func (c *serverConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.s.forget(c) })
	return err
}

// clientConn is a dialled connection Raft pools. A request that starts
// after the connection sat idle for longer than idle (and with no read
// waiting on it, which a pipeline keeps) goes out on a fresh connection:
// the peer closes idle connections, and nothing is in flight between
// two requests.
type clientConn struct {
	mu     sync.Mutex
	c      net.Conn
	redial func() (net.Conn, error)
	idle   time.Duration
	// deadline is the last one Raft set, carried over to a new connection.
	rdl, wdl time.Time
	reading  atomic.Int32
	last     atomic.Int64 // unix nanos of the last read or write
	closed   bool
	forget   func() // drops it from the stream's dialed set
}

func (c *clientConn) cur() net.Conn {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.c
}

func (c *clientConn) Read(p []byte) (int, error) {
	c.reading.Add(1)
	n, err := c.cur().Read(p)
	c.reading.Add(-1)
	c.last.Store(time.Now().UnixNano())
	return n, err
}

func (c *clientConn) Write(p []byte) (int, error) {
	now := time.Now().UnixNano()
	if c.reading.Load() == 0 && now-c.last.Load() > int64(c.idle) {
		if err := c.refresh(); err != nil {
			return 0, err
		}
	}
	n, err := c.cur().Write(p)
	c.last.Store(time.Now().UnixNano())
	return n, err
}

// refresh replaces the connection with a new one.
func (c *clientConn) refresh() error {
	nc, err := c.redial()
	if err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		_ = nc.Close()
		return net.ErrClosed
	}
	_ = c.c.Close()
	c.c = nc
	_ = nc.SetReadDeadline(c.rdl)
	_ = nc.SetWriteDeadline(c.wdl)
	return nil
}

func (c *clientConn) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.closed && c.forget != nil {
		c.forget()
	}
	c.closed = true
	return c.c.Close()
}

func (c *clientConn) SetDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.rdl, c.wdl = t, t
	return c.c.SetDeadline(t)
}

func (c *clientConn) SetReadDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.rdl = t
	return c.c.SetReadDeadline(t)
}

func (c *clientConn) SetWriteDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.wdl = t
	return c.c.SetWriteDeadline(t)
}

func (c *clientConn) LocalAddr() net.Addr  { return c.cur().LocalAddr() }
func (c *clientConn) RemoteAddr() net.Addr { return c.cur().RemoteAddr() }

// tcpTransport listens on RaftBind and advertises RaftAdvertise (or the
// bound address, which must then be a concrete IP).
func (c *Agreement) tcpTransport(hl hclog.Logger) (*raft.NetworkTransport, *tcpStream, error) {
	var adv net.Addr
	if a := c.cfg.RaftAdvertise; a != "" {
		ta, err := net.ResolveTCPAddr("tcp", a)
		if err != nil {
			return nil, nil, fmt.Errorf("cluster: raft advertise address %q: %w", a, err)
		}
		adv = ta
	}
	ln, err := net.Listen("tcp", c.cfg.RaftBind)
	if err != nil {
		return nil, nil, fmt.Errorf("cluster: raft listen on %s: %w", c.cfg.RaftBind, err)
	}
	if adv == nil {
		if ta, ok := ln.Addr().(*net.TCPAddr); !ok || ta.IP == nil || ta.IP.IsUnspecified() {
			_ = ln.Close()
			return nil, nil, errors.New("cluster: raft address " + ln.Addr().String() + " is not advertisable: set RaftAdvertise")
		}
	}
	s := newStream(ln, adv, streamConfig{
		identity:         c.cfg.Identity,
		clusterID:        c.currentClusterID,
		expect:           c.expectedAt,
		peer:             c.notePeer,
		rpcCheck:         c.rpcCheck,
		maxConns:         c.cfg.RaftMaxConns,
		maxPerIP:         c.cfg.RaftMaxConnsPerIP,
		handshakeTimeout: c.cfg.RaftHandshakeTimeout,
		idleTimeout:      c.cfg.RaftIdleTimeout,
		dialTimeout:      c.cfg.RaftHandshakeTimeout,
		log:              c.log,
		refusals:         func(reason string) { c.met.raftRefused.WithLabelValues(reason).Inc() },
	})
	return raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{
		Stream:                s,
		ServerAddressProvider: addrProvider{c},
		MaxPool:               3,
		Timeout:               10 * time.Second,
		Logger:                hl.Named("transport"),
	}), s, nil
}
