package proxy

import (
	"crypto/tls"
	"errors"
	"math"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"
	"github.com/warmroute/warmroute/internal/backendspec"
	"github.com/warmroute/warmroute/proxy/internal/rawio"
)

// backend is the live state of one backend. It is shared by every table
// that contains the backend's ID, so counters survive ring changes.
type backend struct {
	id     string
	target backendspec.Target
	scheme []byte // "http" or "https", for upstream request URIs
	client *fasthttp.HostClient

	// inflight is this node's exact count, from send to end of stream.
	inflight loadCount
	// remote is the sum reported by the other router nodes.
	remote loadCount
	// queueAt is the cluster in-flight count above which the engine is
	// taken to queue requests (busy): at the last scrape that reported a
	// queue, the in-flight count then less the queue; math.MaxInt64 when
	// the last scrape reported none. engineSeen is that scrape's time
	// (unix nanos), which tells a new scrape from a copy of the last.
	queueAt    atomic.Int64
	engineSeen atomic.Int64
	// capacity is the learned number of requests the engine runs at once
	// (0 until learned): its running count at the last scrape that saw a
	// queue, raised by any later scrape without a queue that ran more (see
	// learn). quietHigh is the highest cluster in-flight count seen at a
	// scrape without a queue since the last one with a queue: passing it
	// asks for a scrape (TriggerScrape) at most every triggerGap
	// (lastTrigger, unix nanos). learnedAt is the last scrape learnt from.
	capacity    atomic.Int64
	quietHigh   atomic.Int64
	learnedAt   atomic.Int64
	lastTrigger atomic.Int64
	// probeDown: the active health check failed ProbeFailThreshold times.
	probeDown healthFlag
	// ejectedUntil (unix nanos): passive ejection after connect failures.
	ejectedUntil healthTime
	connFails    atomic.Int32
	// relayConns counts the upstream connections of relayed streams
	// (relay.go), idle ones included (relaypool.go), which
	// MaxConnsPerBackend bounds with the client's.
	relayConns atomic.Int64
	// idleUps are the relay's idle connections to this backend.
	idleUps upPool
	// totals lists the fleet totals this backend's counts and health feed
	// (loads.go): every change of inflight, remote, probeDown or
	// ejectedUntil reaches them. totalsMu serialises building the totals
	// of a table whose first backend this is.
	totals   atomic.Pointer[totalsList]
	totalsMu sync.Mutex

	// recent remembers the keys lately routed here, cache counts the
	// answers against what was predicted of them (predict.go).
	recent recentKeys
	cache  cacheCounts
	// cost is the proxy's recompute cost, which this backend's owner
	// answers teach (cost.go); nil in tests that build a bare backend.
	cost *recomputeCost

	probing    atomic.Bool  // a probe of this backend is in flight
	lastProbe  atomic.Int64 // unix nanos of the last probe's start
	probeMu    sync.Mutex   // serialises probes of this backend
	probeFails int
	probeOKs   int

	m *backendMetrics
}

func newBackend(id string, target backendspec.Target, cfg *Config, m *metrics) *backend {
	b := &backend{id: id, target: target, scheme: []byte("http")}
	b.inflight.b, b.remote.b, b.probeDown.b, b.ejectedUntil.b = b, b, b, b
	b.queueAt.Store(math.MaxInt64)
	if target.TLS {
		b.scheme = []byte("https")
	}
	b.client = &fasthttp.HostClient{
		Addr:                     target.HostPort,
		IsTLS:                    target.TLS,
		TLSConfig:                &tls.Config{ServerName: hostOnly(target.HostPort), MinVersion: tls.VersionTLS12},
		Name:                     "warmroute",
		NoDefaultUserAgentHeader: true,
		MaxConns:                 cfg.MaxConnsPerBackend,
		MaxConnWaitTimeout:       cfg.MaxConnWait,
		MaxIdleConnDuration:      cfg.IdleConnTimeout,
		// Streamed per request (Response.StreamBody): SSE is passed through
		// as it comes, complete answers are read whole and sent in one write,
		// up to MaxBufferedResponse (checked against a Content-Length before
		// anything is allocated for it). Streams are not bounded.
		StreamResponseBody:            false,
		MaxResponseBodySize:           int(cfg.MaxBufferedResponse),
		ReadBufferSize:                16 << 10,
		WriteBufferSize:               16 << 10,
		DisablePathNormalizing:        true,
		DisableHeaderNamesNormalizing: true,
		DialTimeout:                   newDialer(cfg),
	}
	b.client.RetryIfErr = retryUnsent(b.client)
	b.m = m.forBackend(id)
	return b
}

func hostOnly(hostport string) string {
	h, _, err := net.SplitHostPort(hostport)
	if err != nil {
		return hostport
	}
	return h
}

// available says whether the backend may take requests right now: it passes
// its health checks and is not ejected.
func (b *backend) available(now int64) bool {
	return !b.probeDown.Load() && b.ejectedUntil.Load() <= now
}

// globalInFlight is this node's in-flight plus the other nodes'.
func (b *backend) globalInFlight() int64 { return b.inflight.Load() + b.remote.Load() }

// busy reports whether the engine is taken to queue requests now: its last
// scrape reported a queue while it ran R requests, and the cluster's
// in-flight count is still above R. A request in flight is one the engine
// runs or queues, so requests that end drain the estimate as soon as their
// counts arrive (within a publish interval) and new ones grow it, instead
// of one scrape's queue holding until the next scrape.
func (b *backend) busy() bool { return b.queued() > 0 }

// queued is how many requests the engine is taken to queue now: the
// cluster's in-flight count above the level busy compares it with, 0 when
// it does not queue.
func (b *backend) queued() int64 { return max(0, b.globalInFlight()-b.queueAt.Load()) }

// anchorSlack is how far the in-flight count at a scrape less its queue
// may be from what the engine ran for the busy estimate to anchor at the
// latter (setQueue): two requests, or an eighth of them.
func anchorSlack(running int64) int64 { return max(2, running/8) }

// engineCopyGap: engine figures scraped within this of the ones in use are
// a copy of them, not a new scrape (gossip derives a remote scrape's time
// from its age, so copies re-sent by the cluster differ by a few
// milliseconds). Scrapes are a second apart by default.
const engineCopyGap = 100 * time.Millisecond

// setQueue takes an engine scrape: a queue of W anchors the busy estimate
// at the cluster's in-flight count when the scrape arrived less W; no
// queue clears it. Every router takes the scrape at its own moment,
// through gossip, so routers a request apart would anchor a request apart
// and part ways on whether to leave the owner; so when the engine ran R
// requests and that anchor is within anchorSlack of R (the engine runs
// and queues what the routers sent it, the usual case), the anchor is R,
// the same on every router. An engine that also serves traffic bypassing
// the routers, or one whose figures do not match the routers' counts,
// keeps the anchor from the counts. A copy of the scrape in use changes
// nothing, so the estimate drains with the counts rather than being
// re-anchored by each copy. A new scrape also teaches the backend's
// capacity (learn).
func (b *backend) setQueue(q EngineQueue) {
	b.learn(q)
	if q.Waiting <= 0 || q.Scraped.IsZero() {
		// Called on every change of the cluster's view: write only on a
		// change, so the request path's reads of queueAt stay cached.
		if b.queueAt.Load() != math.MaxInt64 {
			b.queueAt.Store(math.MaxInt64)
		}
		if b.engineSeen.Load() != 0 {
			b.engineSeen.Store(0)
		}
		return
	}
	at := q.Scraped.UnixNano()
	if last := b.engineSeen.Load(); last != 0 && at-last < int64(engineCopyGap) && last-at < int64(engineCopyGap) {
		return
	}
	b.engineSeen.Store(at)
	anchor := max(0, b.globalInFlight()-min(q.Waiting, maxEngineQueue))
	if run := min(q.Running, maxEngineQueue); run > 0 && anchor-run <= anchorSlack(run) && run-anchor <= anchorSlack(run) {
		anchor = run
	}
	b.queueAt.Store(anchor)
}

// learn takes what a new scrape (not a copy of the last one learnt from)
// says of the engine's capacity. An engine that queues while it runs N
// requests runs at most N at once: its capacity is N. One that runs more
// than that without a queue has room for them: the capacity rises to what
// it ran. quietHigh, the highest cluster in-flight count seen without a
// queue, starts over at a queue from the level the engine ran then, so
// that a rise past it asks for the next scrape at once (TriggerScrape)
// rather than at the next round. A scrape without a running figure
// teaches nothing of the capacity. A new scrape's prefix-cache hit rate
// also goes to the recompute cost (cost.go).
func (b *backend) learn(q EngineQueue) {
	if q.Scraped.IsZero() {
		return
	}
	at := q.Scraped.UnixNano()
	if last := b.learnedAt.Load(); last != 0 && at-last < int64(engineCopyGap) && last-at < int64(engineCopyGap) {
		return
	}
	b.learnedAt.Store(at)
	if q.HasPrefixHit && b.cost != nil {
		b.cost.observeEngine(q.PrefixHit)
	}
	inflight := b.globalInFlight()
	run := min(q.Running, maxEngineQueue)
	if q.Waiting > 0 {
		if run > 0 {
			b.capacity.Store(run)
		}
		b.quietHigh.Store(max(0, inflight-min(q.Waiting, maxEngineQueue)))
		return
	}
	if c := b.capacity.Load(); c > 0 && run > c {
		b.capacity.Store(run)
	}
	if inflight > b.quietHigh.Load() {
		b.quietHigh.Store(inflight)
	}
}

// triggerGap is the least time between two scrapes a backend's rising
// count asks for.
const triggerGap = 250 * time.Millisecond

// rising asks trigger for a scrape of b's engine when the cluster's
// in-flight count on it, inflight, is past the highest level seen without
// a queue, at most every triggerGap; now is unix nanos. An engine that
// never gave a figure (no scrape yet, or one whose /metrics carries none
// of the engine's: a backend that is not vLLM-shaped, a stub) is not
// asked between rounds: there is no level to pass, and a scrape that
// teaches nothing would otherwise be asked for every triggerGap, beside
// the request that asked.
func (b *backend) rising(trigger ScrapeTrigger, inflight, now int64) {
	if trigger == nil || b.learnedAt.Load() == 0 || inflight <= b.quietHigh.Load() {
		return
	}
	last := b.lastTrigger.Load()
	if now-last < int64(triggerGap) || !b.lastTrigger.CompareAndSwap(last, now) {
		return
	}
	trigger.TriggerScrape(b.id)
}

// pressed reports whether the backend has more work than it runs at
// once: its engine is taken to queue (busy), or the cluster's in-flight
// count reached its limit (ConcurrencyThreshold x weight) or its learned
// capacity.
func (b *backend) pressed(limit int64) bool {
	n := b.globalInFlight()
	c := b.capacity.Load()
	return b.busy() || n >= limit || (c > 0 && n >= c)
}

// maxEngineQueue bounds the queue an engine's figure can claim.
const maxEngineQueue = 1 << 20

// EngineQueue is what a backend's engine said about its queue at a scrape.
type EngineQueue struct {
	// Waiting is how many requests it queued: 0 when none or not known.
	Waiting int64
	// Running is how many requests it ran: 0 when none or not known.
	Running int64
	// Scraped is when the figure was read; zero when there is none.
	Scraped time.Time
	// PrefixHit is the engine's prefix-cache hit rate (0..1) over the
	// last scrape window, when HasPrefixHit: what the recompute cost
	// takes as the owners' cached share until their answers report one
	// (cost.go).
	PrefixHit    float64
	HasPrefixHit bool
}

// ScrapeTrigger asks for a scrape of a backend's engine before the next
// round (engine.Scraper.Trigger). It must not block: the request path
// calls it.
type ScrapeTrigger interface {
	TriggerScrape(backend string)
}

// connFailed records a connect failure; after EjectAfter in a row the
// backend is ejected for EjectFor.
func (b *backend) connFailed(cfg *Config, now time.Time) bool {
	if cfg.EjectAfter <= 0 {
		return false
	}
	if int(b.connFails.Add(1)) >= cfg.EjectAfter {
		b.connFails.Store(0)
		b.ejectedUntil.Store(now.Add(cfg.EjectFor).UnixNano())
		return true
	}
	return false
}

func (b *backend) connOK() {
	if b.connFails.Load() != 0 {
		b.connFails.Store(0)
	}
}

// dialError wraps a failure to connect: the request was never sent. It is
// errDial.
type dialError struct{ err error }

func (e *dialError) Error() string { return "dial backend: " + e.err.Error() }
func (e *dialError) Unwrap() error { return e.err }
func (e *dialError) Is(target error) bool {
	return target == errDial
}

// newDialer dials with ConnectTimeout and wraps the connection so reads time
// out after FirstByteTimeout while waiting for a response and after
// StreamIdleTimeout between reads of one, a request write that makes no
// progress for FirstByteTimeout (a backend that stopped reading) fails, and
// a pooled connection the backend has closed is detected before a request
// is written to it.
//
// A request with its own deadline (a health probe) dials within it: a
// probe of an unreachable backend must not outlive its timeout, or the
// next probe, the one that would find the backend back, waits for it.
func newDialer(cfg *Config) fasthttp.DialFuncWithTimeout {
	connect := cfg.ConnectTimeout
	first, idle := cfg.FirstByteTimeout, cfg.StreamIdleTimeout
	return func(addr string, timeout time.Duration) (net.Conn, error) {
		if timeout <= 0 || timeout > connect {
			timeout = connect
		}
		// No TCP keep-alive probes (four setsockopt calls per dial): a
		// backend that vanishes is found by the first-byte and stream-idle
		// deadlines, and an idle pooled connection by the check before
		// reuse. TCP_NODELAY is the net package's default.
		d := net.Dialer{Timeout: timeout, KeepAlive: -1}
		c, err := d.Dial("tcp", addr)
		if err != nil {
			return nil, &dialError{err: err}
		}
		return newUpstreamConn(c, first, idle), nil
	}
}

// newUpstreamConn wraps c, a connection to a backend, with the first-byte
// deadline first and the idle deadline idle.
func newUpstreamConn(c net.Conn, first, idle time.Duration) *upstreamConn {
	uc := &upstreamConn{Conn: c, first: first, idle: idle, d: rawio.NewDeferredWrite(c, first)}
	uc.laddr = upstreamAddr{Addr: c.LocalAddr(), c: uc}
	return uc
}

// errStaleConn: a pooled connection was closed by the backend while idle.
// Nothing was written to it, so the request may go out on another
// connection (retryUnsent tells fasthttp so).
var errStaleConn = errors.New("pooled upstream connection closed by the backend")

// errNotReusable: the pool handed out a connection whose last response
// was not a plain final one (see upstreamConn.sniff). Nothing was written
// to it; the request goes out on another connection.
var errNotReusable = errors.New("upstream connection not reusable after its last response")

// retryUnsent is fasthttp's RetryIfErr: retry only requests that were never
// written. A stale connection usually means the backend restarted or died,
// so every idle connection to it is dropped and the retry dials afresh.
func retryUnsent(hc *fasthttp.HostClient) fasthttp.RetryIfErrFunc {
	return func(_ *fasthttp.Request, attempts int, err error) (bool, bool) {
		switch {
		case errors.Is(err, errNotReusable):
			return false, attempts < 3
		case errors.Is(err, errStaleConn):
			hc.CloseIdleConnections()
			return false, attempts < 3
		}
		return false, false
	}
}

// upstreamConn applies the first-byte deadline to the first read after a
// request was written and the idle deadline to later reads. fasthttp uses
// one connection for one request at a time, so the phases cannot mix.
// The last write of a request is held back and made with the first read
// of its response (see rawio.DeferredWrite): a write and one read per
// exchange instead of a write and two reads.
type upstreamConn struct {
	net.Conn
	first, idle time.Duration
	sending     bool                 // a request is being written; no response byte read yet
	waiting     bool                 // a request was written and no byte came back yet
	used        bool                 // a response was read on this connection before
	d           *rawio.DeferredWrite // nil where raw I/O is not available
	laddr       upstreamAddr
	// outer is a read deadline fasthttp set for the current request
	// (unix nanos, 0 for none): a request with its own timeout, such as a
	// health probe. Reads never wait past it. It is atomic because
	// fasthttp may also set it from another goroutine to interrupt a read.
	outer atomic.Int64

	// head holds the first bytes of the current response, headN how many
	// (see sniff).
	head  [len("HTTP/1.1 2")]byte
	headN int
	// noReuse: a response on this connection did not start as a plain
	// final one; no further request may be written to it. Atomic because
	// closeUpstream reads it from the goroutine that got the response.
	noReuse atomic.Bool
}

// sniff looks at the first bytes of each response, before fasthttp parses
// them and pools the connection. Unless the response starts exactly as
// "HTTP/1.1 " or "HTTP/1.0 " and a status from 200 to 599 (then fasthttp's
// parser, too, reads it as the final response), the connection is never
// reused: a backend that switched protocols (101, which fasthttp would
// pool) or sent interim responses, an unknown status or leading junk gets
// a new connection for the next request, so what it sends later can reach
// no other client.
func (c *upstreamConn) sniff(p []byte) {
	n := copy(c.head[c.headN:], p)
	c.headN += n
	if c.headN == len(c.head) && !plainFinalStatus(c.head[:]) {
		c.noReuse.Store(true)
	}
}

// plainFinalStatus reports whether head (10 bytes) is an HTTP/1.x status
// line's start with a status from 2xx to 5xx.
func plainFinalStatus(head []byte) bool {
	s := string(head[:len(head)-1])
	return (s == "HTTP/1.1 " || s == "HTTP/1.0 ") && head[len(head)-1] >= '2' && head[len(head)-1] <= '5'
}

// SetReadDeadline records a deadline of fasthttp's own and applies it at
// once (it may be an interrupt of a blocked read); Read keeps honouring it
// as it sets its phase deadlines.
func (c *upstreamConn) SetReadDeadline(t time.Time) error {
	c.outer.Store(deadlineNanos(t))
	return c.pollerSet(c.Conn.SetReadDeadline(t))
}

// SetDeadline is SetReadDeadline plus the write deadline.
func (c *upstreamConn) SetDeadline(t time.Time) error {
	c.outer.Store(deadlineNanos(t))
	return c.pollerSet(c.Conn.SetDeadline(t))
}

// pollerSet tells the raw socket, if any, that the read deadline was just
// set on the connection behind its back, and returns err, the setting's
// result.
func (c *upstreamConn) pollerSet(err error) error {
	if c.d != nil {
		c.d.PollerChanged()
	}
	return err
}

// setReadDeadline sets the read deadline dl (unix nanoseconds), lazily
// where the connection does its own I/O (see rawio.Socket.SetReadDeadline).
func (c *upstreamConn) setReadDeadline(dl, now int64) error {
	if c.d != nil {
		return c.d.SetReadDeadline(dl, now)
	}
	return c.Conn.SetReadDeadline(time.Unix(0, dl))
}

func deadlineNanos(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

// upstreamAddr is an upstream connection's local address. fasthttp hands
// it to the response (Response.LocalAddr), which is how the proxy finds the
// connection a streamed answer arrives on.
type upstreamAddr struct {
	net.Addr
	c *upstreamConn
}

// LocalAddr returns the local address, as an *upstreamAddr.
func (c *upstreamConn) LocalAddr() net.Addr { return &c.laddr }

func (c *upstreamConn) Write(p []byte) (int, error) {
	if !c.sending {
		if c.noReuse.Load() {
			return 0, errNotReusable
		}
		c.sending = true
		c.headN = 0
		// A new request: a deadline set for the previous one is over.
		c.outer.Store(0)
		// The backend may have closed this pooled connection while it sat
		// idle (a restart, a crash, its keep-alive timeout). Writing would
		// look like a request lost in flight; look first.
		if c.used && c.peerClosed() {
			return 0, errStaleConn
		}
	}
	c.waiting = true
	if c.d != nil {
		return c.d.Write(p)
	}
	return c.Conn.Write(p)
}

// peerClosed reports whether the backend closed this idle connection:
// through the connection's own raw socket where it has one, with the
// portable check otherwise.
func (c *upstreamConn) peerClosed() bool {
	if c.d != nil {
		return c.d.PeerClosed()
	}
	return rawio.PeerClosed(c.Conn)
}

func (c *upstreamConn) Read(p []byte) (int, error) {
	c.sending = false
	d := c.idle
	if c.waiting {
		d = c.first
	}
	now := time.Now().UnixNano()
	dl := now + int64(d)
	if o := c.outer.Load(); o != 0 && o < dl {
		dl = o
	}
	if err := c.setReadDeadline(dl, now); err != nil {
		return 0, err
	}
	// A deadline error keeps its Timeout() method, which fasthttp turns
	// into ErrTimeout.
	var n int
	var err error
	if c.d != nil {
		n, err = c.d.Read(p)
	} else {
		n, err = c.Conn.Read(p)
	}
	if n > 0 {
		if c.headN < len(c.head) {
			c.sniff(p[:n])
		}
		c.waiting = false
		c.used = true
	}
	return n, err
}

// metric handles for one backend, resolved once.
type backendMetrics struct {
	id       string
	reqs     requestCounters
	ttfb     prometheus.Observer
	retries  prometheus.Counter
	ejects   prometheus.Counter
	aborts   prometheus.Counter
	upErrors map[string]prometheus.Counter
	usage    usageCounters // nil series for requests that reached no backend
}
