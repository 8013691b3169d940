package limit

import (
	"net"
	"net/netip"
	"sync"
)

// Listener is a net.Listener with connection bounds. Its connections
// release their slot when closed (once, however often Close is called).
type Listener struct {
	net.Listener
	max, perIP int
	refused    func(reason string) // nil: not counted

	mu   sync.Mutex
	open int
	byIP map[netip.Addr]int
}

// Reasons passed to the refused callback.
const (
	ReasonLimit      = "limit"
	ReasonLimitPerIP = "limit_per_ip"
)

// NewListener bounds ln. refused, when not nil, is called (from Accept)
// for every connection closed over a bound, with ReasonLimit or
// ReasonLimitPerIP.
func NewListener(ln net.Listener, max, perIP int, refused func(reason string)) *Listener {
	return &Listener{Listener: ln, max: max, perIP: perIP, refused: refused, byIP: map[netip.Addr]int{}}
}

// Accept returns the next connection within the bounds.
func (l *Listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		ip := remoteIP(c)
		if reason := l.admit(ip); reason != "" {
			_ = c.Close()
			if l.refused != nil {
				l.refused(reason)
			}
			continue
		}
		return &conn{Conn: c, l: l, ip: ip}, nil
	}
}

// Open is the number of connections held.
func (l *Listener) Open() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.open
}

func (l *Listener) admit(ip netip.Addr) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.open >= l.max:
		return ReasonLimit
	case l.byIP[ip] >= l.perIP:
		return ReasonLimitPerIP
	}
	l.open++
	l.byIP[ip]++
	return ""
}

func (l *Listener) release(ip netip.Addr) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.open--
	if l.byIP[ip]--; l.byIP[ip] <= 0 {
		delete(l.byIP, ip)
	}
}

func remoteIP(c net.Conn) netip.Addr {
	if ap, err := netip.ParseAddrPort(c.RemoteAddr().String()); err == nil {
		return ap.Addr().Unmap()
	}
	return netip.Addr{}
}

// conn releases its slot on the first Close.
type conn struct {
	net.Conn
	l    *Listener
	ip   netip.Addr
	once sync.Once
}

func (c *conn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.l.release(c.ip) })
	return err
}
