package gossip

import (
	"errors"
	"fmt"
	"github.com/warmroute/warmroute/internal/limit"
	"log"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
)

// transport is memberlist's transport for a LAN: TCP streams and UDP
// packets on one port, like memberlist's NetTransport, with three changes.
// Load packets (first byte wireMagic, which no memberlist packet starts
// with) never reach memberlist: onPacket handles them in the read loop,
// so they cannot fill memberlist's handoff queue, which it shares with
// membership messages and drops from when full. Every packet is read into
// one reusable buffer and memberlist gets an exact-size copy (NetTransport
// allocates and zeroes 64 KiB per packet, a quarter of the CPU a node
// spent on gossip at 1000 packets/s). And it counts the bytes it sends.
type transport struct {
	tcp      *net.TCPListener
	streams  *limit.Listener // tcp, with connection caps
	udp      *net.UDPConn
	bindAddr netip.Addr
	port     int
	log      *log.Logger
	onPacket func(b []byte) // must not keep b

	packetCh chan *memberlist.Packet
	streamCh chan net.Conn
	shutdown atomic.Bool
	done     chan struct{}
	wg       sync.WaitGroup

	packetBytes atomic.Uint64
	streamBytes atomic.Uint64

	// drop, when set (tests only), cuts traffic to and from an address:
	// a network partition.
	drop atomic.Pointer[func(netip.AddrPort) bool]
	// tap, when set (tests only), sees every load packet sent: what an
	// eavesdropper holding the gossip key captures.
	tap atomic.Pointer[func(b []byte, to netip.AddrPort)]
}

func (t *transport) dropped(ap netip.AddrPort) bool {
	f := t.drop.Load()
	return f != nil && (*f)(ap)
}

var errPartitioned = errors.New("gossip: partitioned (test)")

var _ memberlist.NodeAwareTransport = (*transport)(nil)

const (
	udpReadBuf = 65536           // largest UDP payload
	udpRcvBuf  = 2 * 1024 * 1024 // socket receive buffer we ask for
)

// newTransport listens on addr:port (TCP and UDP). With port 0 the kernel
// picks a TCP port, which may be taken for UDP, so it retries.
// Caps on memberlist's TCP streams (push/pull, joins): each lives at most
// memberlist's TCPTimeout, and a cluster of even fifty routers holds a
// few at once.
const (
	maxStreams      = 256
	maxStreamsPerIP = 64
)

func newTransport(addr string, port int, lg *log.Logger, onPacket func([]byte), refused func(string)) (*transport, error) {
	ip, err := netip.ParseAddr(addr)
	if err != nil {
		return nil, fmt.Errorf("gossip: bind address %q: %w", addr, err)
	}
	tries := 1
	if port == 0 {
		tries = 10
	}
	for range tries {
		t, err := listen(ip, port, lg, onPacket, refused)
		if err == nil {
			return t, nil
		}
		if port != 0 {
			return nil, err
		}
	}
	return nil, fmt.Errorf("gossip: no free port on %s for both TCP and UDP", addr)
}

func listen(ip netip.Addr, port int, lg *log.Logger, onPacket func([]byte), refused func(string)) (*transport, error) {
	tcp, err := net.ListenTCP("tcp", net.TCPAddrFromAddrPort(netip.AddrPortFrom(ip, uint16(port))))
	if err != nil {
		return nil, fmt.Errorf("gossip: listen tcp: %w", err)
	}
	port = tcp.Addr().(*net.TCPAddr).Port
	udp, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(ip, uint16(port))))
	if err != nil {
		tcp.Close()
		return nil, fmt.Errorf("gossip: listen udp: %w", err)
	}
	// Ask for a large receive buffer; the kernel may cap it.
	for size := udpRcvBuf; size >= 64*1024; size /= 2 {
		if udp.SetReadBuffer(size) == nil {
			break
		}
	}
	t := &transport{
		tcp: tcp, streams: limit.NewListener(tcp, maxStreams, maxStreamsPerIP, refused),
		udp: udp, bindAddr: ip, port: port, log: lg, onPacket: onPacket,
		packetCh: make(chan *memberlist.Packet),
		streamCh: make(chan net.Conn),
		done:     make(chan struct{}),
	}
	t.wg.Add(2)
	go t.acceptLoop()
	go t.readLoop()
	return t, nil
}

// FinalAdvertiseAddr returns the address other nodes should use: the
// given one, else the bound one, else (bound to all interfaces) the first
// private address of an interface that is up.
func (t *transport) FinalAdvertiseAddr(ip string, port int) (net.IP, int, error) {
	if port == 0 {
		port = t.port
	}
	if ip != "" {
		a := net.ParseIP(ip)
		if a == nil {
			return nil, 0, fmt.Errorf("gossip: advertise address %q is not an IP address", ip)
		}
		if a4 := a.To4(); a4 != nil {
			a = a4
		}
		return a, port, nil
	}
	if !t.bindAddr.IsUnspecified() {
		return net.IP(t.bindAddr.AsSlice()), port, nil
	}
	a, err := privateAddr()
	if err != nil {
		return nil, 0, err
	}
	return net.IP(a.AsSlice()), port, nil
}

// privateAddr is the first private (RFC 1918 / ULA) address of an
// interface that is up, IPv4 first.
func privateAddr() (netip.Addr, error) {
	ifs, err := net.Interfaces()
	if err != nil {
		return netip.Addr{}, fmt.Errorf("gossip: list interfaces: %w", err)
	}
	var v6 netip.Addr
	for _, ifc := range ifs {
		if ifc.Flags&net.FlagUp == 0 || ifc.Flags&net.FlagLoopback != 0 {
			continue
		}
		addrs, err := ifc.Addrs()
		if err != nil {
			continue
		}
		for _, a := range addrs {
			pfx, err := netip.ParsePrefix(a.String())
			if err != nil || !pfx.Addr().IsPrivate() {
				continue
			}
			if pfx.Addr().Is4() {
				return pfx.Addr(), nil
			}
			if !v6.IsValid() {
				v6 = pfx.Addr()
			}
		}
	}
	if v6.IsValid() {
		return v6, nil
	}
	return netip.Addr{}, errors.New("gossip: no private IP address found; set the advertise address")
}

func (t *transport) WriteTo(b []byte, addr string) (time.Time, error) {
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		ua, rerr := net.ResolveUDPAddr("udp", addr)
		if rerr != nil {
			return time.Time{}, rerr
		}
		ap = ua.AddrPort()
	}
	if t.dropped(ap) {
		return time.Now(), nil
	}
	_, err = t.udp.WriteToUDPAddrPort(b, ap)
	if err == nil {
		t.packetBytes.Add(uint64(len(b)))
	}
	return time.Now(), err
}

// send writes one load packet.
func (t *transport) send(b []byte, to netip.AddrPort) error {
	if f := t.tap.Load(); f != nil {
		(*f)(b, to)
	}
	if t.dropped(to) {
		return nil
	}
	_, err := t.udp.WriteToUDPAddrPort(b, to)
	if err == nil {
		t.packetBytes.Add(uint64(len(b)))
	}
	return err
}

func (t *transport) WriteToAddress(b []byte, a memberlist.Address) (time.Time, error) {
	return t.WriteTo(b, a.Addr)
}

func (t *transport) PacketCh() <-chan *memberlist.Packet { return t.packetCh }

func (t *transport) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	if ap, err := netip.ParseAddrPort(addr); err == nil && t.dropped(ap) {
		return nil, errPartitioned
	}
	c, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return nil, err
	}
	return &countingConn{Conn: c, n: &t.streamBytes}, nil
}

func (t *transport) DialAddressTimeout(a memberlist.Address, timeout time.Duration) (net.Conn, error) {
	return t.DialTimeout(a.Addr, timeout)
}

func (t *transport) StreamCh() <-chan net.Conn { return t.streamCh }

// Shutdown closes the listeners and waits for their goroutines.
func (t *transport) Shutdown() error {
	if t.shutdown.Swap(true) {
		return nil
	}
	close(t.done)
	t.tcp.Close()
	t.udp.Close()
	t.wg.Wait()
	return nil
}

func (t *transport) acceptLoop() {
	defer t.wg.Done()
	const maxDelay = time.Second
	var delay time.Duration
	for {
		conn, err := t.streams.Accept()
		if err != nil {
			if t.shutdown.Load() {
				return
			}
			delay = min(max(2*delay, 5*time.Millisecond), maxDelay)
			t.log.Printf("[ERR] memberlist: accept: %v", err)
			time.Sleep(delay)
			continue
		}
		delay = 0
		select {
		case t.streamCh <- conn:
		case <-t.done:
			conn.Close()
			return
		}
	}
}

func (t *transport) readLoop() {
	defer t.wg.Done()
	buf := make([]byte, udpReadBuf)
	for {
		n, from, err := t.udp.ReadFromUDPAddrPort(buf)
		ts := time.Now()
		if err != nil {
			if t.shutdown.Load() {
				return
			}
			t.log.Printf("[ERR] memberlist: read UDP: %v", err)
			continue
		}
		if n < 1 || t.dropped(from) {
			continue
		}
		if buf[0] == wireMagic {
			t.onPacket(buf[:n])
			continue
		}
		// memberlist keeps the buffer (queued messages): hand it a copy.
		p := &memberlist.Packet{
			Buf:       append([]byte(nil), buf[:n]...),
			From:      net.UDPAddrFromAddrPort(from),
			Timestamp: ts,
		}
		select {
		case t.packetCh <- p:
		case <-t.done:
			return
		}
	}
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
