package gossip

import (
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"math"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/warmroute/warmroute/internal/notify"
)

// Mesh is this node's membership in the router cluster and its shared
// view of the other nodes' load. Create it with New and stop it with Close.
type Mesh struct {
	cfg  Config
	log  *slog.Logger
	ml   *memberlist.Memberlist
	tr   *transport
	seal *sealer
	sign *signer   // nil without an Identity
	keys *keyCache // nil without an Identity
	st   *state
	pub  *publisher
	cnt  counters
	view atomic.Pointer[View]
	meta atomic.Pointer[[]byte]
	kick chan struct{}
	subs notify.Hub // View changes

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
	signBuf    []byte   // a signed packet; publish loop, then Close
	sigScratch []byte   // signed input; publish loop, then Close

	chainReqs  chan chainReq // chain messages to send (chainLoop)
	chainMsgs  [2][]byte     // this node's chain message: [0] plain, [1] asking for the peer's
	skewWarned atomic.Int64  // unix ns of the last clock skew warning
	seedWarned atomic.Bool
	joinFailed time.Time // start of the current run of failed joins; joinSeeds only
	joinWarned time.Time // last warning of that run; joinSeeds only

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
	// countsSilence: the member's metadata advertises silenceVotes, read
	// once when the member is set (see allCountSilence).
	countsSilence bool
}

// newPeer returns a member at addr with metadata meta (copied).
func newPeer(addr netip.AddrPort, meta []byte) peer {
	m, err := decodeMeta(meta)
	return peer{addr: addr, meta: slices.Clone(meta), countsSilence: err == nil && m.Votes >= silenceVotes}
}

// leftNode is a member that said it was leaving (memberlist's graceful
// leave), kept for leftRetention so that RecentlyLeft can report it.
type leftNode struct {
	peer
	since time.Time
}

// leftRetention is how long RecentlyLeft reports a member after it left.
const leftRetention = 10 * time.Minute

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
func New(cfg Config, local LocalSource) (*Mesh, error) {
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
	c := &Mesh{
		cfg:     cfg,
		log:     lg,
		st:      newState(cfg.NodeName, cfg.ExpireAfter, cfg.EngineExpireAfter),
		pub:     newPublisher(cfg.NodeName, instance, local, &cfg),
		kick:    make(chan struct{}, 1),
		peers:   make(map[string]peer),
		failed:  make(map[string]failedNode),
		left:    make(map[string]leftNode),
		stopPub: make(chan struct{}),
		pubDone: make(chan struct{}),
		stop:    make(chan struct{}),

		chainReqs: make(chan chainReq, 256),
	}
	if c.seal, err = newSealer(cfg.SecretKey, cfg.ExtraKeys); err != nil {
		return nil, err
	}
	if cfg.Identity != nil {
		if c.sign, err = newSigner(cfg.Identity, cfg.NodeName); err != nil {
			return nil, err
		}
		c.keys = newKeyCache(cfg.Identity)
		c.st.signed = true
		c.pub.pk.limit = maxPacket - c.sign.overhead()
		if c.pub.pk.limit < maxPacket/2 {
			return nil, fmt.Errorf("%w: signatures of %d bytes leave too little room in a packet", ErrIdentity, c.sign.sigMax)
		}
		c.chainMsgs = [2][]byte{c.sign.chainMsg(cfg.NodeName, false), c.sign.chainMsg(cfg.NodeName, true)}
		if n := len(c.chainMsgs[1]); n > maxChainMsg {
			return nil, fmt.Errorf("%w: certificate chain message of %d bytes (at most %d)", ErrIdentity, n, maxChainMsg)
		} else if n > maxPacket {
			lg.Warn("gossip: the certificate chain does not fit one packet; it will be fragmented (drop intermediates the peers do not need)", "bytes", n)
		}
	}
	meta := cfg.Meta
	meta.Wire, meta.Votes = wireVersion, silenceVotes
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
	c.log.Info("gossip started", "addr", c.addr, "encrypted", len(cfg.SecretKey) > 0, "signed", c.sign != nil)
	if len(cfg.Join) > 0 {
		c.joinSeeds()
	}
	c.wg.Add(2)
	go c.viewLoop()
	go c.joinLoop()
	if c.sign != nil {
		c.wg.Add(1)
		go c.chainLoop()
	}
	go c.publishLoop()
	return c, nil
}

func (c *Mesh) memberlistConfig() (*memberlist.Config, error) {
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
	mc.Alive = aliveFilter{c}
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

	tr, err := newTransport(mc.BindAddr, cfg.BindPort, mc.Logger, c.receivePacket(), func(string) { c.st.rej.add(rejStreamLimit) })
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
func (c *Mesh) Close() error {
	c.closeOnce.Do(func() {
		close(c.stopPub)
		<-c.pubDone
		bye := c.pub.bye()
		// Twice: UDP may drop one; the memberlist leave follows anyway.
		c.sendAll([][]byte{bye, bye})
		var errs []error
		if c.ml.NumMembers() > 1 {
			if err := c.ml.Leave(c.cfg.LeaveTimeout); err != nil {
				if c.ml.NumMembers() > 1 {
					errs = append(errs, fmt.Errorf("gossip: leave: %w", err))
				} else {
					// The others left while this node waited to tell
					// them (routers stopped together): nobody is left
					// to tell.
					c.log.Debug("gossip leave: the other members left first", "err", err)
				}
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
func (c *Mesh) halt() {
	close(c.stop)
	c.wg.Wait()
	c.subs.Close()
	c.unregister()
}

func (c *Mesh) unregister() {
	if c.cfg.Registry == nil {
		return
	}
	for _, col := range c.registered {
		c.cfg.Registry.Unregister(col)
	}
	c.registered = nil
}

// View returns the current snapshot. It never blocks.
func (c *Mesh) View() *View { return c.view.Load() }

// Subscribe returns a channel that receives a value after the View
// changes (figures or membership). Notifications are coalesced: the
// channel has a buffer of one and the Mesh never blocks on it, so a
// slow reader sees one notification for many changes and should then read
// View. The channel is closed by Close. cancel unsubscribes.
func (c *Mesh) Subscribe() (<-chan struct{}, func()) { return c.subs.Subscribe() }

// Members returns the live members, this node included, sorted by name.
// State is "alive" for every member: memberlist does not report its
// suspicion of a member to the application, and a suspect is still a
// member until it is declared dead. With an Identity, Proven says whether
// a member proved its name with a certificate of the cluster CA; any
// holder of the gossip key can join memberlist under a name of its
// choice, so a member that has not is no router to trust.
func (c *Mesh) Members() []Member {
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
	if c.sign != nil {
		for i := range out {
			out[i].Proven = c.st.isProven(out[i].Name)
		}
	}
	slices.SortFunc(out, func(a, b Member) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// RecentlyLeft returns, sorted by name, the members that left the cluster
// gracefully (they said so before shutting down) within leftRetention and
// have not come back, with State "left". Members does not include them; a
// member that crashed is not among them either.
func (c *Mesh) RecentlyLeft() []Member {
	now := time.Now()
	c.peersMu.Lock()
	out := make([]Member, 0, len(c.left))
	for name, l := range c.left {
		if now.Sub(l.since) > leftRetention {
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
func (c *Mesh) Addr() string { return c.addr }

// Name is this node's name.
func (c *Mesh) Name() string { return c.cfg.NodeName }

// SetMeta changes the metadata this node advertises and gossips it.
func (c *Mesh) SetMeta(m Meta) error {
	m.Wire, m.Votes = wireVersion, silenceVotes
	b, err := encodeMeta(m)
	if err != nil {
		return err
	}
	c.meta.Store(&b)
	return c.ml.UpdateNode(c.cfg.LeaveTimeout)
}

// IsScraper reports whether this node owns scraping backend's engine
// metrics right now (see View.Scraper).
func (c *Mesh) IsScraper(backend string) bool {
	return c.View().Scraper(backend) == c.cfg.NodeName
}

// PublishEngine records engine metrics this node scraped for backend and
// shares them with the other nodes. A zero s.Scraped means now.
func (c *Mesh) PublishEngine(backend string, s EngineStats) {
	if s.Scraped.IsZero() {
		s.Scraped = time.Now()
	}
	c.pub.setEngine(backend, s)
	c.st.setLocal(backend, s)
	c.signal()
}

// PublishPartitions shares this node's recent request counts per ring
// partition (loads, one per partition, in the caller's unit) with the
// other nodes: the busiest MaxPartEntries of at least min go out once,
// with the next publish. Call it about once a second from one goroutine;
// the Raft leader's balancer adds up every node's with PartitionLoads, so
// it decides from the whole cluster's traffic rather than its own share.
func (c *Mesh) PublishPartitions(loads []uint32, min uint32) {
	c.pub.setParts(loads, min)
}

// PartitionLoads adds to dst (one count per partition) the counts the
// other nodes published within maxAge for a ring of len(dst) partitions,
// and returns how many nodes it added.
func (c *Mesh) PartitionLoads(dst []uint64, maxAge time.Duration) int {
	return c.st.addParts(dst, maxAge, time.Now())
}

// PublishHot shares the prompt prefixes this node's own traffic calls to
// split, as the candidates of its hot-prefix counter, with the other
// nodes, once, with the next publish: at most MaxHotCounted of list
// (shallowest first as given) with their counts and routing partitions,
// out of total requests counted alike, on a ring of partitions
// partitions. Call it about twice a second while there are any; the Raft
// leader adds every node's counts up (HotReports) and splits a prefix
// only when its owner is pressed, so traffic that reaches only other
// routers counts too.
func (c *Mesh) PublishHot(total uint64, partitions int, list []HotPrefix) {
	if len(list) > 0 {
		c.pub.setHot(total, partitions, list)
	}
}

// HotReport is one other node's last counted hot prefixes (PublishHot),
// with the partition counts it published (PublishPartitions) for a ring
// of as many partitions, if fresh: the traffic its claims must be part of.
type HotReport struct {
	Node       string
	Total      uint64
	Partitions uint64
	Prefixes   []HotPrefix
	Parts      []PartLoad
}

// HotReports appends to dst the counted hot prefixes the other nodes
// published within maxAge, each with the partition counts the same node
// published within partsAge.
func (c *Mesh) HotReports(dst []HotReport, maxAge, partsAge time.Duration) []HotReport {
	return c.st.hotReports(dst, maxAge, partsAge, time.Now())
}

func (c *Mesh) signal() {
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// receivePacket returns the transport's handler for load packets. It runs
// on the transport's read loop only, so one set of scratch buffers serves.
func (c *Mesh) receivePacket() func([]byte) {
	scratch := make([]byte, 0, udpReadBuf)
	rx := new(rxScratch)
	return func(b []byte) {
		msg, err := c.seal.open(scratch, b)
		if err != nil {
			c.cnt.msgsRecv.Add(1)
			c.cnt.bytesRecv.Add(uint64(len(b)))
			c.cnt.malformed.Add(1)
			return
		}
		c.receive(msg, rx)
	}
}

// rxScratch is the decoding and verification scratch of one receiving
// goroutine.
type rxScratch struct {
	msg wireMsg
	sig []byte
}

// receive applies a message from another node (UDP or push/pull).
func (c *Mesh) receive(b []byte, rx *rxScratch) {
	c.cnt.msgsRecv.Add(1)
	c.cnt.bytesRecv.Add(uint64(len(b)))
	now := time.Now()
	var changed bool
	if c.sign == nil {
		var err error
		if changed, err = c.st.handle(b, now); err != nil {
			c.cnt.malformed.Add(1)
			return
		}
	} else {
		if err := rx.msg.decode(b); err != nil {
			c.cnt.malformed.Add(1)
			return
		}
		changed = c.receiveSigned(&rx.msg, now, &rx.sig)
	}
	if changed {
		c.signal()
	}
}

// receiveSigned checks a decoded message the way a node with an Identity
// must, cheapest checks first, and applies it when it passes. It reports
// whether a View needs building.
func (c *Mesh) receiveSigned(m *wireMsg, now time.Time, scratch *[]byte) bool {
	if m.version != wireV2 {
		c.st.rej.add(rejUnsigned)
		return false
	}
	if m.kind == kindChain {
		return c.receiveChain(m, now)
	}
	blk := &m.blocks[0]
	if string(blk.origin) == c.cfg.NodeName {
		return false
	}
	if !c.st.member(blk.origin) {
		c.st.noteUnknown()
		return false
	}
	if skew, ok := clockSkew(m.sentAt, now); !ok {
		c.st.rej.add(rejClockSkew)
		c.warnSkew(string(blk.origin), skew)
		return false
	}
	key := c.keys.lookup(m.key, now)
	if key == nil && len(blk.chain) > 0 {
		id, k, why, ok := c.keys.learn(blk.chain, now)
		if !ok {
			c.st.rej.add(why)
			return false
		}
		if id == m.key {
			key = k
		}
	}
	if key == nil {
		c.st.rej.add(rejUnknownKey)
		c.queueChain(string(blk.origin), true)
		return false
	}
	if key.name != string(blk.origin) {
		c.st.rej.add(rejWrongName)
		return false
	}
	// A replayed or reordered block would change nothing: skip the
	// signature check.
	if !c.st.fresh(m.kind, blk, now) {
		c.st.noteStale()
		return false
	}
	if !key.verifySig(m.signed, m.sig, scratch) {
		c.st.rej.add(rejBadSignature)
		return false
	}
	proved := c.st.prove(key.name, key.notAfter)
	return c.st.apply(m, now) || proved
}

// receiveChain learns a member's certificate chain and, when asked,
// answers with this node's.
func (c *Mesh) receiveChain(m *wireMsg, now time.Time) bool {
	origin := string(m.origin)
	if origin == c.cfg.NodeName {
		return false
	}
	if !c.st.member(m.origin) {
		c.st.noteUnknown()
		return false
	}
	_, key, why, ok := c.keys.learn(m.chain, now)
	if !ok {
		c.st.rej.add(why)
		return false
	}
	if key.name != origin {
		c.st.rej.add(rejWrongName)
		return false
	}
	if m.want {
		c.queueChain(origin, false)
	}
	return c.st.prove(origin, key.notAfter)
}

// clockSkew returns how far sentAt (ms since the epoch) is from now, and
// whether that is within maxClockSkew.
func clockSkew(sentAt uint64, now time.Time) (time.Duration, bool) {
	ms := uint64(now.UnixMilli())
	d := ms - sentAt
	if sentAt > ms {
		d = sentAt - ms
	}
	if d > uint64(maxClockSkew/time.Millisecond) {
		if d > uint64(math.MaxInt64/int64(time.Millisecond)) {
			return math.MaxInt64, false
		}
		return time.Duration(d) * time.Millisecond, false
	}
	return time.Duration(d) * time.Millisecond, true
}

// warnSkew logs, at most once a minute, that a member's signed messages
// are refused for their send time.
func (c *Mesh) warnSkew(origin string, skew time.Duration) {
	now := time.Now().UnixNano()
	last := c.skewWarned.Load()
	if now-last < int64(time.Minute) || !c.skewWarned.CompareAndSwap(last, now) {
		return
	}
	c.log.Warn("gossip: refusing signed figures sent too far from this node's clock (a replay, or clocks out of sync)",
		"from", origin, "skew", skew, "max", maxClockSkew)
}

func (c *Mesh) viewLoop() {
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
			c.subs.Notify()
		}
	}
}

// publishLoop reads this node's figures every ChangeDelay and sends what
// changed at once (in a large cluster at most once per changeInterval);
// every PublishInterval (to within one ChangeDelay, on
// average exactly) the read is a tick, which also resends recent changes
// and refreshes. One publish per ChangeDelay at most: a ticker drops the
// ticks a slow loop misses rather than bunching them.
func (c *Mesh) publishLoop() {
	defer close(c.pubDone)
	every, poll := c.cfg.PublishInterval, c.cfg.ChangeDelay
	t := time.NewTicker(poll)
	defer t.Stop()
	// Half a poll early, so that timer jitter does not push a tick to
	// the poll after.
	due := time.Now().Add(every - poll/2)
	var last time.Time // the last publish
	for {
		select {
		case <-c.stopPub:
			return
		case now := <-t.C:
			var pkts [][]byte
			if !now.Before(due) {
				if due = due.Add(every); due.Before(now) {
					due = now.Add(every - poll/2) // fell behind: no catching up
				}
				pkts = c.pub.next(now)
			} else if now.Sub(last) >= c.changeInterval()-poll/2 {
				pkts = c.pub.changes(now)
			}
			if len(pkts) > 0 {
				c.sendAll(pkts)
				last = now
			}
		}
	}
}

// changeInterval is the shortest time between two publishes of changes:
// ChangeDelay, or longer in a cluster so large that every peer's changes
// at once would exceed ChangeBudget publishes per second at each
// receiver (Config.ChangeBudget).
func (c *Mesh) changeInterval() time.Duration {
	peers := len(*c.sendList.Load())
	return max(c.cfg.ChangeDelay, min(c.cfg.PublishInterval, time.Duration(peers)*time.Second/time.Duration(c.cfg.ChangeBudget)))
}

// sendAll signs (with an Identity) and seals every packet once and sends
// it straight to every other live member.
func (c *Mesh) sendAll(pkts [][]byte) {
	for len(c.sendBuf) < len(pkts) {
		c.sendBuf = append(c.sendBuf, nil)
	}
	sealed := c.sendBuf[:len(pkts)]
	now := time.Now()
	n := 0
	for _, p := range pkts {
		if c.sign != nil {
			var err error
			if c.signBuf, err = c.sign.sign(c.signBuf[:0], p, now, &c.sigScratch); err != nil {
				c.cnt.sendErrors.Add(1)
				c.log.Warn("gossip: cannot sign", "err", err)
				continue
			}
			p = c.signBuf
		}
		sealed[n] = c.seal.seal(sealed[n][:0], p)
		n++
	}
	sealed = sealed[:n]
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

// localState is this node's push/pull payload. Without an Identity: its
// own figures and the fresh figures it holds from every other node, so a
// joining node converges in one exchange. With one: its own figures and
// its certificate chain, signed (other nodes' figures cannot be
// verified, so each node's reach a joiner directly, within a
// RefreshInterval).
func (c *Mesh) localState() []byte {
	now := time.Now()
	b := appendHeader(nil, kindState)
	if c.sign == nil {
		b = c.pub.ownBlock(b, now, nil)
		return c.st.appendRelay(b, now)
	}
	b = c.pub.ownBlock(b, now, c.sign.chain)
	var scratch []byte
	out, err := c.sign.sign(nil, b, now, &scratch)
	if err != nil || len(out) > maxStateBytes {
		c.log.Warn("gossip: cannot send this node's state", "err", err, "bytes", len(out))
		return nil
	}
	return out
}

// mergeState applies a push/pull state from another node.
func (c *Mesh) mergeState(b []byte) {
	if len(b) == 0 {
		return
	}
	if len(b) > maxStateBytes {
		c.st.rej.add(rejStateSize)
		return
	}
	c.receive(b, new(rxScratch))
}

// joinWarnAfter is how long joining the seeds may fail before it is
// logged as a warning; joinWarnEvery how often it is warned about again
// while it keeps failing (each attempt is logged at debug).
const (
	joinWarnAfter = 10 * time.Second
	joinWarnEvery = 30 * time.Second
)

// joinSeeds resolves the seeds and joins them. It reports whether another
// node is now a member. When none could be joined it logs each seed's
// failure, with what it usually means.
func (c *Mesh) joinSeeds() bool {
	addrs := c.resolveSeeds()
	if len(addrs) == 0 {
		return false
	}
	n, err := c.ml.Join(addrs)
	if err != nil && n == 0 {
		now := time.Now()
		if c.joinFailed.IsZero() {
			c.joinFailed = now
		}
		// Routers started together try each other before all listen: a
		// join that succeeds within joinWarnAfter is no problem.
		lv := slog.LevelDebug
		if now.Sub(c.joinFailed) >= joinWarnAfter && now.Sub(c.joinWarned) >= joinWarnEvery {
			lv, c.joinWarned = slog.LevelWarn, now
		}
		// memberlist joins the seeds one by one and gathers their errors.
		errs := []error{err}
		if me, ok := err.(interface{ WrappedErrors() []error }); ok && len(me.WrappedErrors()) > 0 {
			errs = me.WrappedErrors()
		}
		for _, e := range errs {
			attrs := []any{"failing_for", now.Sub(c.joinFailed).Round(time.Millisecond), "err", e}
			if h := joinHint(e); h != "" {
				attrs = append(attrs, "hint", h)
			}
			c.log.Log(context.Background(), lv, "gossip join failed; retrying in the background", attrs...)
		}
		return false
	}
	attrs := []any{"contacted", n, "members", c.ml.NumMembers()}
	if !c.joinFailed.IsZero() {
		attrs = append(attrs, "after_failing_for", time.Since(c.joinFailed).Round(time.Millisecond))
	}
	c.joinFailed, c.joinWarned = time.Time{}, time.Time{}
	c.log.Info("gossip joined", attrs...)
	return c.ml.NumMembers() > 1
}

// joinHint says what a seed's join error usually means, or "".
func joinHint(err error) string {
	msg := err.Error()
	switch {
	case strings.Contains(msg, "decrypt"), strings.Contains(msg, "not encrypted"), strings.Contains(msg, "Encryption"):
		return "the seed and this router do not share a gossip key: give every router the same --gossip-key-file (or WARMROUTE_GOSSIP_KEY)"
	case strings.Contains(msg, "connection refused"):
		return "nothing listens there: check that the seed router runs and that the address is its --gossip-listen (or --gossip-advertise)"
	case strings.Contains(msg, "i/o timeout"), strings.Contains(msg, "no route to host"):
		return "no answer from the seed: check the address and that a firewall lets gossip (TCP and UDP) through"
	}
	return ""
}

// resolveSeeds turns the Join list into ip:port addresses, every A/AAAA
// record of a name included, without this node's own address. When two
// or more seeds were all this node's own address, it warns (once): the
// node joins no one.
func (c *Mesh) resolveSeeds() []string {
	self, _ := netip.ParseAddrPort(c.addr)
	bind := netip.IPv4Unspecified()
	if c.cfg.BindAddr != "" {
		bind, _ = netip.ParseAddr(c.cfg.BindAddr)
	}
	var local []netip.Addr
	if bind.IsUnspecified() {
		local = interfaceAddrs()
	}
	isSelf := selfMatcher(self, bind, uint16(c.tr.port), local)
	seen := make(map[string]bool)
	var out []string
	var selfSeeds []string
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
		onlySelf := len(ips) > 0
		for _, ip := range ips {
			if isSelf(ip, uint16(port)) {
				continue
			}
			onlySelf = false
			a := netip.AddrPortFrom(ip.Unmap(), uint16(port)).String()
			if !seen[a] {
				seen[a] = true
				out = append(out, a)
			}
		}
		if onlySelf {
			selfSeeds = append(selfSeeds, s)
		}
	}
	if len(out) == 0 && len(selfSeeds) > 1 && !c.seedWarned.Swap(true) {
		c.log.Warn("gossip: every seed is this node's own address, so it joins no one; "+
			"nodes sharing a port on one host must each bind their own address",
			"seeds", selfSeeds, "addr", c.addr, "bind", c.cfg.BindAddr)
	}
	return out
}

// selfMatcher returns a function reporting whether a seed address is this
// node: its advertised address and port, its bound address and port, or,
// bound to all addresses, any loopback, unspecified or interface address
// (local) with its port. Another loopback address with the same port is
// another node (127.0.0.0/8 all reaches this host).
func selfMatcher(adv netip.AddrPort, bind netip.Addr, port uint16, local []netip.Addr) func(netip.Addr, uint16) bool {
	bind = bind.Unmap()
	return func(a netip.Addr, p uint16) bool {
		a = a.Unmap()
		if a == adv.Addr().Unmap() && p == adv.Port() {
			return true
		}
		if p != port {
			return false
		}
		if !bind.IsUnspecified() {
			return a == bind
		}
		return a.IsLoopback() || a.IsUnspecified() || slices.Contains(local, a)
	}
}

// interfaceAddrs returns this host's interface addresses.
func interfaceAddrs() []netip.Addr {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil
	}
	var out []netip.Addr
	for _, a := range addrs {
		if p, err := netip.ParsePrefix(a.String()); err == nil {
			out = append(out, p.Addr().Unmap())
		}
	}
	return out
}

// joinLoop retries the seeds until another node is a member, then every
// RejoinInterval rejoins the seeds when alone and tries members that
// failed, so both sides of a healed partition find each other again.
func (c *Mesh) joinLoop() {
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
func (c *Mesh) failedAddrs(now time.Time) []string {
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
type delegate struct{ c *Mesh }

func (d delegate) NodeMeta(limit int) []byte {
	b := *d.c.meta.Load()
	if len(b) > limit {
		return nil
	}
	return b
}

// NotifyMsg ignores memberlist user messages: figures travel in load
// packets and push/pull states only, and nothing sends user messages.
func (d delegate) NotifyMsg(b []byte) {}

func (d delegate) GetBroadcasts(overhead, limit int) [][]byte { return nil }

func (d delegate) LocalState(join bool) []byte { return d.c.localState() }

func (d delegate) MergeRemoteState(b []byte, join bool) { d.c.mergeState(b) }

// aliveFilter implements memberlist.AliveDelegate: a member whose name is
// not a valid router name (see Config.NodeName) is refused, so names with
// control characters or separators never reach logs, metrics or the Raft
// configuration.
type aliveFilter struct{ c *Mesh }

func (a aliveFilter) NotifyAlive(n *memberlist.Node) error {
	if err := checkName(n.Name); err != nil {
		a.c.st.rej.add(rejMemberName)
		return err
	}
	return nil
}

// events implements memberlist.EventDelegate. It must not call back into
// memberlist (Members would deadlock).
type events struct{ c *Mesh }

func (e events) NotifyJoin(n *memberlist.Node) {
	c := e.c
	c.st.join(n.Name)
	c.setPeer(n, false, false)
	if n.Name != c.cfg.NodeName {
		c.joined.Store(true)
		// Exchange chains with the new member at once.
		c.queueChain(n.Name, true)
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
func (c *Mesh) setPeer(n *memberlist.Node, gone, left bool) {
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
				p = newPeer(addr, n.Meta)
			}
			c.left[n.Name] = leftNode{peer: p, since: time.Now()}
		default:
			c.failed[n.Name] = failedNode{addr: addr.String(), since: time.Now()}
		}
	} else {
		c.peers[n.Name] = newPeer(addr, n.Meta)
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
	c.pub.skipZeros.Store(allCountSilence(c.peers, c.cfg.NodeName))
}

// silenceVotes is what Meta.Votes advertises: this node counts a router's
// silence about a backend as a healthy verdict.
const silenceVotes = 1

// allCountSilence reports whether every member but self advertises
// silenceVotes, so that this node may leave its settled zero figures out
// (see publisher.counts).
func allCountSilence(peers map[string]peer, self string) bool {
	for name, p := range peers {
		if name != self && !p.countsSilence {
			return false
		}
	}
	return true
}
