package gossip

import (
	"errors"
	"fmt"
	"log"
	"log/slog"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/warmroute/warmroute/internal/notify"
)

// A Mesh's life: New starts memberlist on its own transport, joins the
// seeds and starts the loops (views, joins, chains, publishing); Close says
// goodbye, leaves and stops them. Each concern has its file: members.go
// (the member table), delegate.go (memberlist's callbacks), join.go,
// send.go and receive.go (load packets and push/pull states), figures.go
// (what the application shares and reads), viewloop.go, chain.go and
// metrics.go.

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
	kick chan struct{} // a View needs building (signal)
	subs notify.Hub    // View changes

	addr       string                 // advertised host:port, fixed after New
	meta       atomic.Pointer[[]byte] // advertised metadata (SetMeta)
	members    memberTable            // members.go
	join       joinState              // join.go
	chain      chainState             // chain.go; used with an Identity
	scratch    sendScratch            // send.go
	skewWarned atomic.Int64           // unix ns of the last clock skew warning (receive.go)

	registered []prometheus.Collector

	stopPub   chan struct{}
	pubDone   chan struct{}
	stop      chan struct{}
	wg        sync.WaitGroup
	closeOnce sync.Once
	closeErr  error
}

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
		cfg:  cfg,
		log:  lg,
		st:   newState(cfg.NodeName, cfg.ExpireAfter, cfg.EngineExpireAfter),
		pub:  newPublisher(cfg.NodeName, instance, local, &cfg),
		kick: make(chan struct{}, 1),
		members: memberTable{
			peers:  make(map[string]peer),
			failed: make(map[string]failedNode),
			left:   make(map[string]leftNode),
		},
		chain:   chainState{reqs: make(chan chainReq, 256)},
		stopPub: make(chan struct{}),
		pubDone: make(chan struct{}),
		stop:    make(chan struct{}),
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
		c.chain.msgs = [2][]byte{c.sign.chainMsg(cfg.NodeName, false), c.sign.chainMsg(cfg.NodeName, true)}
		if n := len(c.chain.msgs[1]); n > maxChainMsg {
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
	c.members.sendList.Store(&[]netip.AddrPort{})

	mc, err := c.memberlistConfig()
	if err != nil {
		return nil, err
	}
	c.ml, err = memberlist.Create(mc)
	if err != nil {
		_ = c.tr.Shutdown()
		return nil, fmt.Errorf("gossip: start memberlist: %w", err)
	}
	if err := c.register(); err != nil {
		_ = c.ml.Shutdown()
		return nil, err
	}
	c.members.mu.Lock()
	c.addr = c.members.peers[cfg.NodeName].addr.String()
	c.members.mu.Unlock()
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
