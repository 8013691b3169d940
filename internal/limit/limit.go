package limit

import (
	"net"
	"net/netip"
	"sync"
)

// Listener is a net.Listener with connection bounds in two pools.
//
// Every accepted connection starts pending: its peer has proven nothing.
// Pending connections are bounded (Max in all, PerIP from one address),
// and a new connection always gets a slot: over PerIP, the oldest
// pending connection of its own address is closed to make room; over
// Max, the oldest pending connection of the address holding the most.
// So a neighbour who opens connections and sends nothing churns its own
// connections, never holds a slot against a newcomer from another
// address, and a connection from an address with few pending ones is
// closed only after the busier addresses opened Max newer ones.
//
// Promote moves a connection whose peer proved who it is (a router's
// TLS certificate, the operator's token) out of the pending pool into
// the proven pool, bounded apart (Max in all, PerIP per key): nothing
// an unauthenticated neighbour does closes a proven connection or stops
// one from being promoted. Connections release their slot when closed
// (once, however often Close is called).
type Listener struct {
	net.Listener
	max, perIP        int                 // pending
	maxProven, perKey int                 // proven
	refused           func(reason string) // nil: not counted

	mu      sync.Mutex
	seq     uint64 // connections accepted
	pending int
	byIP    map[netip.Addr][]*conn // pending, oldest first
	proven  int
	byKey   map[string]int
}

// Reasons passed to the refused callback.
const (
	// ReasonLimit: a pending connection closed to make room under Max
	// (the oldest of the address holding the most).
	ReasonLimit = "limit"
	// ReasonLimitPerIP: a pending connection closed to make room under
	// PerIP for a newer one from its address.
	ReasonLimitPerIP = "limit_per_ip"
	// ReasonLimitProven: a connection that proved its peer, closed
	// because the proven pool (or its key's share) is full.
	ReasonLimitProven = "limit_proven"
)

// NewListener bounds ln: at most max pending connections, perIP from one
// address, and as many proven ones (max in all, perIP per key). refused,
// when not nil, is called for every connection closed over a bound, with
// a Reason.
func NewListener(ln net.Listener, max, perIP int, refused func(reason string)) *Listener {
	return &Listener{Listener: ln, max: max, perIP: perIP, maxProven: max, perKey: perIP, refused: refused,
		byIP: map[netip.Addr][]*conn{}, byKey: map[string]int{}}
}

// Accept returns the next connection, pending, after making room for it.
func (l *Listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		nc := &conn{Conn: c, l: l, ip: remoteIP(c)}
		victim, reason, ok := l.admit(nc)
		if victim != nil {
			_ = victim.Conn.Close() // its slot is already taken back
			l.refuse(reason)
		}
		if ok {
			return nc, nil
		}
		_ = c.Close() // no pending slot at all (max or perIP 0)
		l.refuse(reason)
	}
}

func (l *Listener) refuse(reason string) {
	if l.refused != nil {
		l.refused(reason)
	}
}

// Open is the number of connections held, pending and proven.
func (l *Listener) Open() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.pending + l.proven
}

// Pending and Proven are the connections held in each pool.
func (l *Listener) Pending() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.pending
}

func (l *Listener) Proven() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.proven
}

// admit takes a pending slot for c, and returns the connection it closes
// to make room (nil: none), why, and whether c has a slot.
func (l *Listener) admit(c *conn) (*conn, string, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.max <= 0 || l.perIP <= 0 {
		c.state = stateReleased
		return nil, ReasonLimit, false
	}
	var victim *conn
	reason := ""
	switch {
	case len(l.byIP[c.ip]) >= l.perIP:
		victim, reason = l.byIP[c.ip][0], ReasonLimitPerIP
	case l.pending >= l.max:
		var busiest []*conn
		for _, cs := range l.byIP {
			if len(cs) > len(busiest) || len(cs) == len(busiest) && len(cs) > 0 && cs[0].seq < busiest[0].seq {
				busiest = cs
			}
		}
		victim, reason = busiest[0], ReasonLimit
	}
	if victim != nil {
		l.dropPending(victim)
		victim.state = stateReleased
	}
	l.seq++
	c.seq, c.state = l.seq, statePending
	l.pending++
	l.byIP[c.ip] = append(l.byIP[c.ip], c)
	return victim, reason, true
}

// dropPending removes a pending connection from the pool (l.mu held).
func (l *Listener) dropPending(c *conn) {
	cs := l.byIP[c.ip]
	for i, x := range cs {
		if x == c {
			cs = append(cs[:i:i], cs[i+1:]...)
			break
		}
	}
	if len(cs) == 0 {
		delete(l.byIP, c.ip)
	} else {
		l.byIP[c.ip] = cs
	}
	l.pending--
}

// promote moves c to the proven pool under key, and reports whether it
// is held there (false: c was closed or the pool is full).
func (l *Listener) promote(c *conn, key string) bool {
	l.mu.Lock()
	switch c.state {
	case stateProven:
		l.mu.Unlock()
		return true
	case stateReleased:
		l.mu.Unlock()
		return false
	}
	if l.proven >= l.maxProven || l.byKey[key] >= l.perKey {
		l.mu.Unlock()
		l.refuse(ReasonLimitProven)
		return false
	}
	l.dropPending(c)
	l.proven++
	l.byKey[key]++
	c.state, c.key = stateProven, key
	l.mu.Unlock()
	return true
}

// release gives c's slot back, once.
func (l *Listener) release(c *conn) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch c.state {
	case statePending:
		l.dropPending(c)
	case stateProven:
		l.proven--
		if l.byKey[c.key]--; l.byKey[c.key] <= 0 {
			delete(l.byKey, c.key)
		}
	}
	c.state = stateReleased
}

func remoteIP(c net.Conn) netip.Addr {
	if ap, err := netip.ParseAddrPort(c.RemoteAddr().String()); err == nil {
		return ap.Addr().Unmap()
	}
	return netip.Addr{}
}

// Connection states; the Listener's mutex guards them.
const (
	statePending uint8 = iota + 1
	stateProven
	stateReleased
)

// conn is an accepted connection: pending until promoted, released on
// the first Close or when closed to make room.
type conn struct {
	net.Conn
	l     *Listener
	ip    netip.Addr
	seq   uint64 // accept order
	state uint8
	key   string // proven: its key
}

func (c *conn) Close() error {
	err := c.Conn.Close()
	c.l.release(c)
	return err
}

// Promote moves c, a connection a Listener accepted (or a TLS connection
// over one), from the pending pool to the proven pool under key (a
// router's name, say, or the operator's address): call it once the peer
// proved who it is. It reports whether c is held there; false means the
// listener closed c to make room, or the proven pool is full (c should
// be closed then). A connection of no Listener is left alone (true).
func Promote(c net.Conn, key string) bool {
	for range 4 { // unwrap TLS and the like
		switch x := c.(type) {
		case *conn:
			return x.l.promote(x, key)
		case interface{ NetConn() net.Conn }:
			c = x.NetConn()
		default:
			return true
		}
	}
	return true
}
