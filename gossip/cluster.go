package gossip

import (
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/prometheus/client_golang/prometheus"
)

// Cluster is this node's membership in the router cluster and its shared
// view of the other nodes' load. Create it with New and stop it with Close.
type Cluster struct {
	cfg  Config
	log  *slog.Logger
	ml   *memberlist.Memberlist
	tr   *transport
	seal *sealer
	st   *state
	pub  *publisher
	cnt  counters
	view atomic.Pointer[View]
	meta atomic.Pointer[[]byte]
	kick chan struct{}

	subMu      sync.Mutex
	subs       map[uint64]chan struct{}
	nextSub    uint64
	subsClosed bool

	joined atomic.Bool // some other node has been a member
	addr   string      // advertised host:port, fixed after New

	// Members as the event callbacks report them. memberlist rewrites
	// the Node structs Members() returns in place (without a lock the
	// reader could take), so only the callbacks, which run under its
	// node lock, read them, and copy what is needed here.
	peersMu  sync.Mutex
	peers    map[string]peer
	failed   map[string]failedNode // members declared dead, for reconnects
	left     map[string]leftNode   // members that left gracefully, recently
	sendList atomic.Pointer[[]netip.AddrPort]

	registered []prometheus.Collector
	sendBuf    [][]byte // sealed packets; publish loop, then Close

	stopPub   chan struct{}
	pubDone   chan struct{}
	stop      chan struct{}
	wg        sync.WaitGroup
	closeOnce sync.Once
	closeErr  error
}

type peer struct {
	addr netip.AddrPort
	meta []byte
}

// leftNode is a member that said it was leaving (memberlist's graceful
// leave), kept for LeftRetention so that RecentlyLeft can report it.
type leftNode struct {
	peer
	since time.Time
}

// LeftRetention is how long RecentlyLeft reports a member after it left.
const LeftRetention = 10 * time.Minute

type failedNode struct {
	addr  string
	since time.Time
}

// failedRetention is how long a failed member's address is retried.
const failedRetention = 30 * time.Minute

// New starts memberlist on the configured address, joins the seeds (a
// failed join is retried in the background, so seeds may start in any
// order), and starts publishing local's figures. local may be nil on a
// node that only observes.
func New(cfg Config, local LocalSource) (*Cluster, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	lg := cfg.Logger
	if lg == nil {
		lg = slog.New(slog.DiscardHandler)
	}
	lg = lg.With("node", cfg.NodeName)
	instance := uint64(time.Now().UnixNano())
	var err error
	c := &Cluster{
		cfg:     cfg,
		log:     lg,
		st:      newState(cfg.NodeName, cfg.ExpireAfter, cfg.EngineExpireAfter),
		pub:     newPublisher(cfg.NodeName, instance, local, &cfg),
		kick:    make(chan struct{}, 1),
		subs:    make(map[uint64]chan struct{}),
		peers:   make(map[string]peer),
		failed:  make(map[string]failedNode),
		left:    make(map[string]leftNode),
		stopPub: make(chan struct{}),
		pubDone: make(chan struct{}),
		stop:    make(chan struct{}),
	}
	if c.seal, err = newSealer(cfg.SecretKey, cfg.ExtraKeys); err != nil {
		return nil, err
	}
	meta := cfg.Meta
	meta.Wire = wireVersion
	mb, err := encodeMeta(meta)
	if err != nil {
		return nil, err
	}
	c.meta.Store(&mb)
	c.view.Store(c.st.build(nil))
	c.sendList.Store(&[]netip.AddrPort{})

	mc, err := c.memberlistConfig()
	if err != nil {
		return nil, err
	}
	c.ml, err = memberlist.Create(mc)
	if err != nil {
		_ = c.tr.Shutdown()
		return nil, fmt.Errorf("gossip: start memberlist: %w", err)
	}
	if cfg.Registry != nil {
		for _, col := range c.newCollectors() {
			if err := cfg.Registry.Register(col); err != nil {
				c.unregister()
				_ = c.ml.Shutdown()
				return nil, fmt.Errorf("gossip: register metrics: %w", err)
			}
			c.registered = append(c.registered, col)
		}
	}
	c.peersMu.Lock()
	c.addr = c.peers[cfg.NodeName].addr.String()
	c.peersMu.Unlock()
	c.log.Info("gossip started", "addr", c.addr, "encrypted", len(cfg.SecretKey) > 0)
	if len(cfg.Join) > 0 {
		c.joinSeeds()
	}
	c.wg.Add(2)
	go c.viewLoop()
	go c.joinLoop()
	go c.publishLoop()
	return c, nil
}

func (c *Cluster) memberlistConfig() (*memberlist.Config, error) {
	cfg := &c.cfg
	mc := memberlist.DefaultLANConfig()
	mc.Name = cfg.NodeName
	mc.BindAddr = cfg.BindAddr
	if mc.BindAddr == "" {
		mc.BindAddr = "0.0.0.0"
	}
	mc.AdvertiseAddr = cfg.AdvertiseAddr
	mc.Logger = log.New(logWriter{c.log}, "", 0)
	mc.Delegate = delegate{c}
	mc.Events = events{c}
	mc.PushPullInterval = cfg.PushPullInterval
	mc.GossipInterval = cfg.GossipInterval
	mc.ProbeInterval = cfg.ProbeInterval
	mc.ProbeTimeout = cfg.ProbeTimeout
	mc.SuspicionMult = cfg.SuspicionMult
	mc.SuspicionMaxTimeoutMult = cfg.SuspicionMaxTimeoutMult
	mc.TCPTimeout = 3 * time.Second
	// A restarted node may come back under its name on a new address (a
	// rescheduled pod) once its old incarnation has been dead this long.
	mc.DeadNodeReclaimTime = 5 * time.Second
	// Load packets are small binary figures; LZW costs CPU on every packet
	// and saves little.
	mc.EnableCompression = false
	if len(cfg.SecretKey) > 0 {
		kr, err := memberlist.NewKeyring(cfg.ExtraKeys, cfg.SecretKey)
		if err != nil {
			return nil, fmt.Errorf("gossip: keyring: %w", err)
		}
		mc.Keyring = kr
	}

	tr, err := newTransport(mc.BindAddr, cfg.BindPort, mc.Logger, c.receivePacket())
	if err != nil {
		return nil, err
	}
	c.tr = tr
	mc.Transport = tr
	mc.BindPort = tr.port
	mc.AdvertisePort = cfg.AdvertisePort
	if mc.AdvertisePort == 0 {
		mc.AdvertisePort = mc.BindPort
	}
	return mc, nil
}

// Close sends a goodbye to every member (they drop this node's figures at
// once), leaves the cluster gracefully, and stops. It is idempotent and
// waits for every goroutine.
func (c *Cluster) Close() error {
	c.closeOnce.Do(func() {
		close(c.stopPub)
		<-c.pubDone
		bye := c.pub.bye()
		// Twice: UDP may drop one; the memberlist leave follows anyway.
		c.sendAll([][]byte{bye, bye})
		var errs []error
		if c.ml.NumMembers() > 1 {
			if err := c.ml.Leave(c.cfg.LeaveTimeout); err != nil {
				errs = append(errs, fmt.Errorf("gossip: leave: %w", err))
			}
		}
		if err := c.ml.Shutdown(); err != nil {
			errs = append(errs, fmt.Errorf("gossip: shutdown: %w", err))
		}
		c.halt()
		c.closeErr = errors.Join(errs...)
		c.log.Info("gossip stopped")
	})
	return c.closeErr
}

// halt stops the background loops and closes subscriber channels.
func (c *Cluster) halt() {
	close(c.stop)
	c.wg.Wait()
	c.subMu.Lock()
	c.subsClosed = true
	for id, ch := range c.subs {
		close(ch)
		delete(c.subs, id)
	}
	c.subMu.Unlock()
	c.unregister()
}

func (c *Cluster) unregister() {
	if c.cfg.Registry == nil {
		return
	}
	for _, col := range c.registered {
		c.cfg.Registry.Unregister(col)
	}
	c.registered = nil
}

// View returns the current snapshot. It never blocks.
func (c *Cluster) View() *View { return c.view.Load() }

// Subscribe returns a channel that receives a value after the View
// changes (figures or membership). Notifications are coalesced: the
// channel has a buffer of one and the Cluster never blocks on it, so a
// slow reader sees one notification for many changes and should then read
// View. The channel is closed by Close. cancel unsubscribes.
func (c *Cluster) Subscribe() (<-chan struct{}, func()) {
	c.subMu.Lock()
	defer c.subMu.Unlock()
	ch := make(chan struct{}, 1)
	if c.subsClosed {
		close(ch)
		return ch, func() {}
	}
	id := c.nextSub
	c.nextSub++
	c.subs[id] = ch
	return ch, func() {
		c.subMu.Lock()
		defer c.subMu.Unlock()
		delete(c.subs, id)
	}
}

// Members returns the live members, this node included, sorted by name.
// State is "alive" for every member: memberlist does not report its
// suspicion of a member to the application, and a suspect is still a
// member until it is declared dead.
func (c *Cluster) Members() []Member {
	c.peersMu.Lock()
	out := make([]Member, 0, len(c.peers))
	for name, p := range c.peers {
		m := Member{Name: name, Addr: p.addr.String(), State: "alive", Self: name == c.cfg.NodeName}
		if meta, err := decodeMeta(p.meta); err == nil {
			m.Meta = meta
		}
		out = append(out, m)
	}
	c.peersMu.Unlock()
	slices.SortFunc(out, func(a, b Member) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// RecentlyLeft returns, sorted by name, the members that left the cluster
// gracefully (they said so before shutting down) within LeftRetention and
// have not come back, with State "left". Members does not include them; a
// member that crashed is not among them either.
func (c *Cluster) RecentlyLeft() []Member {
	now := time.Now()
	c.peersMu.Lock()
	out := make([]Member, 0, len(c.left))
	for name, l := range c.left {
		if now.Sub(l.since) > LeftRetention {
			delete(c.left, name)
			continue
		}
		m := Member{Name: name, Addr: l.addr.String(), State: "left"}
		if meta, err := decodeMeta(l.meta); err == nil {
			m.Meta = meta
		}
		out = append(out, m)
	}
	c.peersMu.Unlock()
	slices.SortFunc(out, func(a, b Member) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// Addr is the address other nodes reach this one at (host:port).
func (c *Cluster) Addr() string { return c.addr }

// Name is this node's name.
func (c *Cluster) Name() string { return c.cfg.NodeName }

// SetMeta changes the metadata this node advertises and gossips it.
func (c *Cluster) SetMeta(m Meta) error {
	m.Wire = wireVersion
	b, err := encodeMeta(m)
	if err != nil {
		return err
	}
	c.meta.Store(&b)
	return c.ml.UpdateNode(c.cfg.LeaveTimeout)
}

// IsScraper reports whether this node owns scraping backend's engine
// metrics right now (see View.Scraper).
func (c *Cluster) IsScraper(backend string) bool {
	return c.View().Scraper(backend) == c.cfg.NodeName
}

// PublishEngine records engine metrics this node scraped for backend and
// shares them with the other nodes. A zero s.Scraped means now.
func (c *Cluster) PublishEngine(backend string, s EngineStats) {
	if s.Scraped.IsZero() {
		s.Scraped = time.Now()
	}
	c.pub.setEngine(backend, s)
	c.st.setLocal(backend, s)
	c.signal()
}

func (c *Cluster) signal() {
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// receivePacket returns the transport's handler for load packets. It runs
// on the transport's read loop only, so one scratch buffer serves.
func (c *Cluster) receivePacket() func([]byte) {
	scratch := make([]byte, 0, udpReadBuf)
	return func(b []byte) {
		msg, err := c.seal.open(scratch, b)
		if err != nil {
			c.cnt.msgsRecv.Add(1)
			c.cnt.bytesRecv.Add(uint64(len(b)))
			c.cnt.malformed.Add(1)
			return
		}
		c.receive(msg)
	}
}

// receive applies a message from another node (UDP or push/pull).
func (c *Cluster) receive(b []byte) {
	c.cnt.msgsRecv.Add(1)
	c.cnt.bytesRecv.Add(uint64(len(b)))
	changed, err := c.st.handle(b, time.Now())
	if err != nil {
		c.cnt.malformed.Add(1)
		return
	}
	if changed {
		c.signal()
	}
}

func (c *Cluster) viewLoop() {
	defer c.wg.Done()
	sweep := min(c.cfg.ExpireAfter, c.cfg.EngineExpireAfter) / 10
	sweep = min(max(sweep, 10*time.Millisecond), 250*time.Millisecond)
	t := time.NewTicker(sweep)
	defer t.Stop()
	for {
		select {
		case <-c.stop:
			return
		case <-c.kick:
		case now := <-t.C:
			c.st.sweep(now)
		}
		if v := c.st.build(c.view.Load()); v != nil {
			c.view.Store(v)
			c.cnt.viewUpdates.Add(1)
			c.notify()
		}
	}
}

func (c *Cluster) notify() {
	c.subMu.Lock()
	defer c.subMu.Unlock()
	for _, ch := range c.subs {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

func (c *Cluster) publishLoop() {
	defer close(c.pubDone)
	t := time.NewTicker(c.cfg.PublishInterval)
	defer t.Stop()
	for {
		select {
		case <-c.stopPub:
			return
		case now := <-t.C:
			if pkts := c.pub.next(now); len(pkts) > 0 {
				c.sendAll(pkts)
			}
		}
	}
}

// sendAll seals every packet once and sends it straight to every other
// live member.
func (c *Cluster) sendAll(pkts [][]byte) {
	for len(c.sendBuf) < len(pkts) {
		c.sendBuf = append(c.sendBuf, nil)
	}
	sealed := c.sendBuf[:len(pkts)]
	for i, p := range pkts {
		sealed[i] = c.seal.seal(sealed[i][:0], p)
	}
	for _, to := range *c.sendList.Load() {
		for _, p := range sealed {
			if err := c.tr.send(p, to); err != nil {
				c.cnt.sendErrors.Add(1)
				continue
			}
			c.cnt.msgsSent.Add(1)
			c.cnt.bytesSent.Add(uint64(len(p)))
		}
	}
}

// localState is this node's push/pull payload: its own figures and the
// fresh figures it holds from every other node, so a joining node
// converges in one exchange.
func (c *Cluster) localState() []byte {
	now := time.Now()
	b := appendHeader(nil, kindState)
	b = c.pub.ownBlock(b, now)
	return c.st.appendRelay(b, now)
}

// joinSeeds resolves the seeds and joins them. It reports whether another
// node is now a member.
func (c *Cluster) joinSeeds() bool {
	addrs := c.resolveSeeds()
	if len(addrs) == 0 {
		return false
	}
	n, err := c.ml.Join(addrs)
	if err != nil && n == 0 {
		c.log.Warn("gossip join failed; retrying in the background", "seeds", c.cfg.Join, "err", err)
		return false
	}
	c.log.Info("gossip joined", "contacted", n, "members", c.ml.NumMembers())
	return c.ml.NumMembers() > 1
}

// resolveSeeds turns the Join list into ip:port addresses, every A/AAAA
// record of a name included, without this node's own address.
func (c *Cluster) resolveSeeds() []string {
	self, _ := netip.ParseAddrPort(c.addr)
	selfAddr := self.Addr()
	isSelf := func(a netip.Addr, port int) bool {
		if port != int(self.Port()) {
			return false
		}
		a = a.Unmap()
		return a == selfAddr || (a.IsLoopback() && (selfAddr.IsLoopback() || c.cfg.BindAddr == "0.0.0.0"))
	}
	seen := make(map[string]bool)
	var out []string
	for _, s := range c.cfg.Join {
		host, port, err := splitSeed(s, c.cfg.seedPort())
		if err != nil {
			continue
		}
		var ips []netip.Addr
		if a, err := netip.ParseAddr(host); err == nil {
			ips = []netip.Addr{a}
		} else {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			res, err := net.DefaultResolver.LookupNetIP(ctx, "ip", host)
			cancel()
			if err != nil {
				c.log.Warn("gossip seed does not resolve", "seed", s, "err", err)
				continue
			}
			ips = res
		}
		for _, ip := range ips {
			if isSelf(ip, port) {
				continue
			}
			a := netip.AddrPortFrom(ip.Unmap(), uint16(port)).String()
			if !seen[a] {
				seen[a] = true
				out = append(out, a)
			}
		}
	}
	return out
}

// joinLoop retries the seeds until another node is a member, then every
// RejoinInterval rejoins the seeds when alone and tries members that
// failed, so both sides of a healed partition find each other again.
func (c *Cluster) joinLoop() {
	defer c.wg.Done()
	if c.ml.NumMembers() > 1 {
		c.joined.Store(true)
	}
	backoff := 200 * time.Millisecond
	t := time.NewTimer(c.cfg.RejoinInterval)
	defer t.Stop()
	for {
		wait := c.cfg.RejoinInterval
		if len(c.cfg.Join) > 0 && !c.joined.Load() {
			wait = min(backoff, c.cfg.RejoinInterval)
			backoff *= 2
		}
		t.Reset(wait)
		select {
		case <-c.stop:
			return
		case <-t.C:
		}
		if len(c.cfg.Join) > 0 && c.ml.NumMembers() <= 1 {
			if c.joinSeeds() {
				c.joined.Store(true)
			}
		}
		if addrs := c.failedAddrs(time.Now()); len(addrs) > 0 {
			if n, _ := c.ml.Join(addrs); n > 0 {
				c.log.Info("gossip reconnected to failed members", "contacted", n)
			}
		}
	}
}

// maxReconnects bounds the failed members tried per round: Join dials
// them one after another, and Close waits for a round in progress.
const maxReconnects = 3

// failedAddrs returns up to maxReconnects addresses of members declared
// dead within failedRetention (map order picks them at random).
func (c *Cluster) failedAddrs(now time.Time) []string {
	c.peersMu.Lock()
	defer c.peersMu.Unlock()
	var out []string
	for name, f := range c.failed {
		if now.Sub(f.since) > failedRetention {
			delete(c.failed, name)
			continue
		}
		if len(out) < maxReconnects {
			out = append(out, f.addr)
		}
	}
	return out
}

// delegate implements memberlist.Delegate. Its methods never block on
// anything but the state's short mutex.
type delegate struct{ c *Cluster }

func (d delegate) NodeMeta(limit int) []byte {
	b := *d.c.meta.Load()
	if len(b) > limit {
		return nil
	}
	return b
}

// NotifyMsg decodes b at once and keeps no reference to it.
func (d delegate) NotifyMsg(b []byte) { d.c.receive(b) }

func (d delegate) GetBroadcasts(overhead, limit int) [][]byte { return nil }

func (d delegate) LocalState(join bool) []byte { return d.c.localState() }

func (d delegate) MergeRemoteState(b []byte, join bool) { d.c.receive(b) }

// events implements memberlist.EventDelegate. It must not call back into
// memberlist (Members would deadlock).
type events struct{ c *Cluster }

func (e events) NotifyJoin(n *memberlist.Node) {
	c := e.c
	c.st.join(n.Name)
	c.setPeer(n, false, false)
	if n.Name != c.cfg.NodeName {
		c.joined.Store(true)
	}
	c.signal()
}

// NotifyLeave is called for a member that left or was declared dead.
// memberlist knows which, but the Node it passes does not say (the state
// lives in a field the callback cannot see), so a member counts as having
// left when its goodbye arrived first; Close sends one before leaving.
func (e events) NotifyLeave(n *memberlist.Node) {
	c := e.c
	left := c.st.leave(n.Name)
	c.setPeer(n, true, left)
	c.signal()
}

func (e events) NotifyUpdate(n *memberlist.Node) {
	e.c.st.touch()
	e.c.setPeer(n, false, false)
	e.c.signal()
}

// setPeer copies what is needed of n (called under memberlist's node
// lock) and refreshes the list load packets are sent to. A member that is
// gone goes to the left list when it said goodbye, else to the failed
// list that joinLoop retries.
func (c *Cluster) setPeer(n *memberlist.Node, gone, left bool) {
	ip, _ := netip.AddrFromSlice(n.Addr)
	addr := netip.AddrPortFrom(ip.Unmap(), n.Port)
	c.peersMu.Lock()
	defer c.peersMu.Unlock()
	if gone {
		p, known := c.peers[n.Name]
		delete(c.peers, n.Name)
		switch {
		case n.Name == c.cfg.NodeName:
		case left:
			if !known {
				p = peer{addr: addr, meta: slices.Clone(n.Meta)}
			}
			c.left[n.Name] = leftNode{peer: p, since: time.Now()}
		default:
			c.failed[n.Name] = failedNode{addr: addr.String(), since: time.Now()}
		}
	} else {
		c.peers[n.Name] = peer{addr: addr, meta: slices.Clone(n.Meta)}
		delete(c.failed, n.Name)
		delete(c.left, n.Name)
	}
	list := make([]netip.AddrPort, 0, len(c.peers))
	for name, p := range c.peers {
		if name != c.cfg.NodeName {
			list = append(list, p.addr)
		}
	}
	c.sendList.Store(&list)
}
