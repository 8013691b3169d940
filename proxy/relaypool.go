package proxy

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/warmroute/warmroute/proxy/internal/relay"
)

// Idle upstream connections of the relay.
//
// A relayed stream's request goes out on a connection outside the
// backend's fasthttp pool (exchangeHead), and a new connection costs a
// connect and the backend's accept before the request can even be read:
// most of what a relayed stream's first event took longer than one on the
// goroutine path, which reuses pooled connections. So when a relayed
// answer ended exactly at its last chunk on an HTTP/1.1 connection the
// backend did not ask to close, the relay gives the upstream's descriptor
// back (relay.Result.Up) and the backend keeps it here, idle, for its next
// relayed stream.
//
// The pool is small (maxIdleRelayConns, and never more than
// MaxConnsPerBackend), a connection idle longer than IdleConnTimeout (the
// setting that expires fasthttp's idle connections) is closed, by the
// sweep or when it is found, and one is checked (relay.Quiet) before it
// carries a request: a backend that closed it, or sent anything since,
// gets a new connection instead. Idle connections stay counted in
// relayConns, since they are open connections to the backend. They are
// closed when the backend leaves the proxy (SetRing) and at Shutdown;
// after that, a connection given back is closed at once.

// maxIdleRelayConns bounds a backend's idle relay connections: enough for
// a steady stream of requests to reuse connections, few enough that a
// burst's connections are not all kept open once it is over.
const maxIdleRelayConns = 64

// idleUp is an idle upstream descriptor and when it was given back (unix
// nanoseconds).
type idleUp struct {
	fd    int
	since int64
}

// upPool is a backend's idle relay connections, oldest first.
type upPool struct {
	mu     sync.Mutex
	conns  []idleUp
	closed bool         // the backend left the proxy, or Shutdown
	n      atomic.Int32 // len(conns), read without the lock
}

// putIdleUp keeps fd, an upstream connection the relay gave back, as idle,
// unless the pool is full or closed: then it is closed.
func (b *backend) putIdleUp(fd int, now int64, limit int) {
	pl := &b.idleUps
	pl.mu.Lock()
	if pl.closed || len(pl.conns) >= limit {
		pl.mu.Unlock()
		b.closeUp(fd)
		return
	}
	pl.conns = append(pl.conns, idleUp{fd: fd, since: now})
	pl.n.Store(int32(len(pl.conns)))
	pl.mu.Unlock()
}

// takeIdleUp returns an idle connection that may carry a request, or -1:
// the newest first (the least likely to be closing); expired ones and
// ones the backend closed or wrote to are closed on the way.
func (b *backend) takeIdleUp(now int64, maxIdle time.Duration) int {
	pl := &b.idleUps
	for {
		pl.mu.Lock()
		n := len(pl.conns)
		if n == 0 {
			pl.mu.Unlock()
			return -1
		}
		c := pl.conns[n-1]
		if now-c.since > int64(maxIdle) {
			// The newest is too old: so is every other one.
			stale := pl.conns
			pl.conns = pl.conns[:0]
			pl.n.Store(0)
			pl.mu.Unlock()
			for _, c := range stale {
				b.closeUp(c.fd)
			}
			return -1
		}
		pl.conns = pl.conns[:n-1]
		pl.n.Store(int32(n - 1))
		pl.mu.Unlock()
		if relay.Quiet(c.fd) {
			return c.fd
		}
		b.closeUp(c.fd)
	}
}

// sweepIdleUp closes the idle connections given back before now-maxIdle.
func (b *backend) sweepIdleUp(now int64, maxIdle time.Duration) {
	pl := &b.idleUps
	if pl.n.Load() == 0 {
		return
	}
	var expired [maxIdleRelayConns]int
	k := 0
	pl.mu.Lock()
	for k < len(pl.conns) && k < len(expired) && now-pl.conns[k].since > int64(maxIdle) {
		expired[k] = pl.conns[k].fd
		k++
	}
	pl.conns = pl.conns[:copy(pl.conns, pl.conns[k:])]
	pl.n.Store(int32(len(pl.conns)))
	pl.mu.Unlock()
	for _, fd := range expired[:k] {
		b.closeUp(fd)
	}
}

// closeIdleUps closes every idle connection, and any given back later.
func (b *backend) closeIdleUps() {
	pl := &b.idleUps
	pl.mu.Lock()
	pl.closed = true
	conns := pl.conns
	pl.conns = nil
	pl.n.Store(0)
	pl.mu.Unlock()
	for _, c := range conns {
		b.closeUp(c.fd)
	}
}

// closeUp closes a relay connection's descriptor and stops counting it.
func (b *backend) closeUp(fd int) {
	relay.CloseFD(fd)
	b.relayConns.Add(-1)
}

// idleUpLimit is how many idle relay connections a backend keeps.
func (c *Config) idleUpLimit() int { return min(maxIdleRelayConns, c.MaxConnsPerBackend) }

// idleSweepEvery is how often idle relay connections are looked at for
// expiry: a quarter of IdleConnTimeout, so none outlives it by much.
func (c *Config) idleSweepEvery() time.Duration {
	return max(c.IdleConnTimeout/4, 10*time.Millisecond)
}

// startIdleSweep closes expired idle relay connections until Shutdown.
func (p *Proxy) startIdleSweep() {
	if p.relay == nil {
		return
	}
	p.every(&p.sweepStarted, p.cfg.idleSweepEvery(), func() {
		now := time.Now().UnixNano()
		for _, b := range p.tab.Load().bs {
			b.sweepIdleUp(now, p.cfg.IdleConnTimeout)
		}
	})
}
