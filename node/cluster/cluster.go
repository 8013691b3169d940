package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
	wal "github.com/hashicorp/raft-wal"
	"github.com/hashicorp/raft-wal/metadb"
	"github.com/warmroute/warmroute/internal/notify"
)

// Agreement is one node's membership in the Raft group that agrees on
// backends and routing config. Routing reads State, which never waits on
// Raft: with no leader, or in a minority partition, it keeps returning the
// last applied state.
type Agreement struct {
	cfg      Config
	log      *slog.Logger
	members  Membership
	validate func(State) error

	raft    *raft.Raft
	raftPtr atomic.Pointer[raft.Raft] // raft, for the transport's goroutines
	trans   raft.Transport
	stream  *tcpStream // nil on an in-memory network
	addr    string
	fsm     *fsm

	wal *wal.WAL
	// stable is the WAL as Raft's stable store, shut before the WAL
	// closes (stable.go).
	stable *shutStable
	meta   *metadb.BoltMetaDB

	notifyCh   chan bool
	observer   *raft.Observer
	observerCh chan raft.Observation
	shutdownCh chan struct{}
	wg         sync.WaitGroup
	closeOnce  sync.Once
	closeErr   error
	closed     atomic.Bool

	view          atomic.Pointer[memberView]
	bootstrapWake chan struct{}
	leaderWake    chan struct{}
	healthWake    chan struct{}

	// writeSem serializes writes on the leader: each is validated against
	// the state all earlier writes produced.
	writeSem chan struct{}
	// ready is closed once this node, as leader, has passed a barrier and
	// seeded the state; Apply waits for it. Replaced when leadership ends.
	readyMu sync.Mutex
	ready   chan struct{}

	health *healthTracker

	// trustMu guards the cluster ID and what preambles told of peers.
	trustMu   sync.Mutex
	clusterID string
	peers     map[string]peerRecord
	fatal     chan error
	fatalOnce sync.Once
	verified  verified
	// revokedNames and revokedSerials are the revocation list last
	// handed to the identity.
	revokedNames, revokedSerials []string
	// rpcWarn rate-limits the warnings of refused RPCs.
	rpcWarn warnLimiter
	// verifyWake asks verifyLoop for a round of identity probes.
	verifyWake chan struct{}

	subs notify.Hub // applied state changes

	met *metrics
}

// Open starts this node's Raft member. members is the gossip view (nil for
// a single node without gossip: it bootstraps alone when BootstrapExpect is
// 1, and nothing is reconciled). validate, when non-nil, is called on the
// leader with the state a write would produce; an error rejects the write
// before it reaches the log (the node passes a function that builds a
// ring).
func Open(cfg Config, members Membership, validate func(State) error) (c *Agreement, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	lg := cfg.Logger
	if lg == nil {
		lg = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	lg = lg.With("component", "cluster", "node", cfg.NodeID)
	c = &Agreement{
		cfg:           cfg,
		log:           lg,
		members:       members,
		validate:      validate,
		notifyCh:      make(chan bool, 8),
		observerCh:    make(chan raft.Observation, 64),
		shutdownCh:    make(chan struct{}),
		bootstrapWake: make(chan struct{}, 1),
		leaderWake:    make(chan struct{}, 1),
		healthWake:    make(chan struct{}, 1),
		writeSem:      make(chan struct{}, 1),
		ready:         make(chan struct{}),
		peers:         map[string]peerRecord{},
		fatal:         make(chan error, 1),
		verified:      newVerified(),
		rpcWarn:       warnLimiter{interval: time.Minute},
		verifyWake:    make(chan struct{}, 1),
	}
	c.health = newHealthTracker(cfg.HealthFailThreshold, cfg.HealthRiseThreshold, cfg.HealthReportTTL)
	c.met = newMetrics(c)

	var cleanup []func()
	defer func() {
		if err != nil {
			for i := len(cleanup) - 1; i >= 0; i-- {
				cleanup[i]()
			}
		}
	}()

	hl := newHclog(libLogger(&cfg), "raft")
	var (
		logs   raft.LogStore
		stable raft.StableStore
		snaps  raft.SnapshotStore
	)
	if cfg.DataDir == "" {
		s := raft.NewInmemStore()
		logs, stable, snaps = s, s, raft.NewInmemSnapshotStore()
	} else {
		if err := claimDataDir(cfg.DataDir, cfg.NodeID); err != nil {
			return nil, err
		}
		if c.clusterID, err = readClusterID(cfg.DataDir); err != nil {
			return nil, err
		}
		walDir := filepath.Join(cfg.DataDir, "wal")
		if err := os.MkdirAll(walDir, 0o750); err != nil {
			return nil, fmt.Errorf("cluster: data dir: %w", err)
		}
		c.meta = &metadb.BoltMetaDB{}
		if _, err := repairUnindexed(walDir, c.meta, lg); err != nil {
			_ = c.meta.Close()
			return nil, c.damaged(err)
		}
		c.wal, err = wal.Open(walDir, wal.WithMetaStore(c.meta), wal.WithLogger(newHclog(libLogger(&cfg), "raft-wal")))
		if err != nil {
			_ = c.meta.Close()
			return nil, c.damaged(err)
		}
		cleanup = append(cleanup, c.closeStores)
		fs, err := raft.NewFileSnapshotStoreWithLogger(cfg.DataDir, cfg.SnapshotRetain, hl.Named("snapshot"))
		if err != nil {
			return nil, fmt.Errorf("cluster: snapshot store: %w", err)
		}
		// raft.NewRaft panics on an entry it cannot read.
		if err := checkLog(c.wal, fs); err != nil {
			return nil, c.damaged(err)
		}
		c.stable = &shutStable{StableStore: c.wal, dropped: func() {
			lg.Debug("a Raft term or vote write came after Raft stopped; dropped")
		}}
		logs, stable, snaps = c.wal, c.stable, fs
	}

	if cfg.Network != nil {
		t := cfg.Network.join(cfg.NodeID)
		c.trans, c.addr = t, cfg.NodeID
		cleanup = append(cleanup, func() { cfg.Network.leave(cfg.NodeID); _ = t.Close() })
	} else {
		nt, st, err := c.tcpTransport(hl)
		if err != nil {
			return nil, err
		}
		c.trans, c.stream, c.addr = nt, st, string(nt.LocalAddr())
		cleanup = append(cleanup, func() { _ = nt.Close() })
	}
	// The view must exist before Raft dials anyone.
	if members != nil {
		c.view.Store(buildView(members.Members(), cfg.NodeID, c.addr))
	} else {
		c.view.Store(buildView(nil, cfg.NodeID, c.addr))
	}

	hasState, err := raft.HasExistingState(logs, stable, snaps)
	if err != nil {
		return nil, fmt.Errorf("cluster: read raft state: %w", err)
	}
	var (
		persist func(*published)
		cached  *published
	)
	if cfg.DataDir != "" {
		sc := stateCache{path: filepath.Join(cfg.DataDir, stateCacheFile), log: lg.Warn}
		persist = sc.store
		if hasState {
			if cached, err = sc.load(); err != nil && !errors.Is(err, os.ErrNotExist) {
				lg.Warn("ignoring the cached state", "err", err)
			}
			if cached != nil {
				if err := c.checkCache(cached, logs, snaps); err != nil {
					lg.Warn("ignoring the cached state: it is not what this router's Raft log holds", "epoch", cached.epoch, "err", err)
					cached = nil
				}
			}
		}
	}
	c.fsm = newFSM(c.subs.Notify, persist, cached)
	c.fsm.check, c.fsm.onHalt = c.checkState, c.onHalt
	c.fsm.onPublish = c.applyRevocations
	c.applyRevocations(c.fsm.view()) // the cached state's, until Raft replays past it
	rc := cfg.raftConfig()
	rc.Logger = hl
	rc.NotifyCh = c.notifyCh
	c.raft, err = newRaft(rc, c.fsm, logs, stable, snaps, c.trans)
	switch {
	case errors.Is(err, errRaftPanic) && cfg.DataDir != "":
		return nil, c.damaged(err)
	case err != nil:
		return nil, fmt.Errorf("cluster: start raft: %w", err)
	}
	c.raftPtr.Store(c.raft)
	c.observer = raft.NewObserver(c.observerCh, false, func(o *raft.Observation) bool {
		_, ok := o.Data.(raft.LeaderObservation)
		return ok
	})
	c.raft.RegisterObserver(c.observer)

	if cfg.Registry != nil {
		if err := c.met.register(cfg.Registry); err != nil {
			_ = c.raft.Shutdown().Error()
			return nil, err
		}
	}

	c.wg.Add(4)
	go c.watchMembers()
	go c.monitorLeadership()
	go c.observe()
	go c.verifyLoop()
	if !hasState && cfg.BootstrapExpect > 0 {
		c.wg.Add(1)
		go c.bootstrapLoop()
	} else if hasState {
		c.log.Info("raft state found; resuming", "epoch", c.fsm.view().epoch)
	}
	c.log.Info("raft started", "addr", c.addr, "bootstrap_expect", cfg.BootstrapExpect, "voters", cfg.Voters)
	return c, nil
}

// checkCache reports whether the cached state is what this node's own
// snapshots and log hold at its epoch.
func (c *Agreement) checkCache(p *published, logs raft.LogStore, snaps raft.SnapshotStore) error {
	if err := checkClusterID(p.state.ClusterID); err != nil {
		return err
	}
	if id := c.clusterID; id != "" && p.state.ClusterID != "" && p.state.ClusterID != id {
		return fmt.Errorf("the cache holds cluster %s, the data directory cluster %s", p.state.ClusterID, id)
	}
	st, err := replay(p.epoch, logs, snaps)
	if err != nil {
		return err
	}
	if !st.equal(&p.state) {
		return errors.New("the log holds another state at that epoch")
	}
	return nil
}

// libLogger is the logger for Raft's and raft-wal's own output.
func libLogger(cfg *Config) *slog.Logger {
	if cfg.Logger == nil {
		return slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return cfg.Logger.With("node", cfg.NodeID)
}

// claimDataDir creates dir and records which node owns it, refusing a
// directory that holds another node's state (a stable ServerID is what
// keeps Raft membership right across restarts).
func claimDataDir(dir, id string) error {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return fmt.Errorf("cluster: data dir: %w", err)
	}
	f := filepath.Join(dir, "node-id")
	b, err := os.ReadFile(f)
	switch {
	case err == nil:
		if got := strings.TrimSpace(string(b)); got != id {
			return fmt.Errorf("%w: %s holds node %q, this node is %q", ErrDataDir, dir, got, id)
		}
		return nil
	case errors.Is(err, os.ErrNotExist):
		return os.WriteFile(f, []byte(id+"\n"), 0o640)
	default:
		return fmt.Errorf("cluster: data dir: %w", err)
	}
}

func (c *Agreement) closeStores() {
	if c.wal != nil {
		_ = c.wal.Close()
		c.wal = nil
	}
	if c.meta != nil {
		_ = c.meta.Close()
		c.meta = nil
	}
}

// Close stops the leader loop, discovery, bootstrap and Raft, and closes the
// log store. It is idempotent and waits for every goroutine it started.
func (c *Agreement) Close() error {
	c.closeOnce.Do(func() {
		c.closed.Store(true)
		close(c.shutdownCh)
		var errs []error
		if err := c.shutdownRaft(); err != nil {
			errs = append(errs, fmt.Errorf("cluster: raft shutdown: %w", err))
		}
		c.wg.Wait()
		c.raft.DeregisterObserver(c.observer)
		if nt, ok := c.trans.(*raft.NetworkTransport); ok {
			nt.CloseStreams() // pooled outbound connections
		}
		if c.cfg.Network != nil {
			c.cfg.Network.leave(c.cfg.NodeID)
		}
		if c.stable != nil {
			c.stable.shutdown()
		}
		if c.wal != nil {
			if err := c.wal.Close(); err != nil {
				errs = append(errs, fmt.Errorf("cluster: close raft log: %w", err))
			}
			c.wal = nil
		}
		if c.meta != nil {
			if err := c.meta.Close(); err != nil {
				errs = append(errs, fmt.Errorf("cluster: close raft meta db: %w", err))
			}
			c.meta = nil
		}
		if c.cfg.Registry != nil {
			c.met.unregister(c.cfg.Registry)
		}
		c.subs.Close()
		c.closeErr = errors.Join(errs...)
		c.log.Info("raft stopped")
	})
	return c.closeErr
}

// raftShutdownGrace is how long Close lets Raft stop on its own before it
// closes Raft's outbound connections under it.
const raftShutdownGrace = 2 * time.Second

// shutdownRaft stops Raft. A replication goroutine pipelining to a peer
// that stopped answering keeps Raft's shutdown waiting (closeDialed says
// why); after raftShutdownGrace the outbound connections are closed so
// that it ends.
func (c *Agreement) shutdownRaft() error {
	f := c.raft.Shutdown()
	done := make(chan error, 1)
	go func() { done <- f.Error() }()
	select {
	case err := <-done:
		return err
	case <-time.After(raftShutdownGrace):
	}
	if c.stream != nil {
		n := c.stream.closeDialed()
		c.log.Warn("raft shutdown waits on a peer that does not answer; closed this router's raft connections",
			"waited", raftShutdownGrace, "connections", n)
	}
	return <-done
}

// Addr is the Raft address other nodes dial (advertise it as gossip
// Meta.RaftAddr). On an InmemNetwork it is the NodeID.
func (c *Agreement) Addr() string { return c.addr }

// State returns the latest applied state and its epoch: the index of the
// Raft log entry that produced it, the same on every node that applied it.
// It never blocks. Before the first seed is applied the state is empty,
// Seeded is false and the epoch 0: route on the config file then.
func (c *Agreement) State() (State, uint64) {
	p := c.fsm.view()
	return p.state.Clone(), p.epoch
}

// Subscribe returns a channel that receives a value after the state
// changes. Notifications are coalesced (buffer of one; the Agreement never
// blocks on it): read State after each. The channel is closed by Close;
// cancel unsubscribes.
func (c *Agreement) Subscribe() (<-chan struct{}, func()) { return c.subs.Subscribe() }

// Leader returns the leader's Raft server ID and address, or empty strings
// when none is known. The node maps the ID to an admin address through
// gossip metadata to forward writes.
func (c *Agreement) Leader() (id, raftAddr string) {
	addr, sid := c.raft.LeaderWithID()
	return string(sid), string(addr)
}

// TransferLeadership hands leadership to another voter when this node
// leads (call it before a planned Close: writes pause for one round trip
// instead of an election timeout). It is a no-op on a follower.
func (c *Agreement) TransferLeadership() error {
	if c.raft.State() != raft.Leader {
		return nil
	}
	if err := c.raft.LeadershipTransfer().Error(); err != nil {
		return c.raftErr(err)
	}
	return nil
}

// IsLeader reports whether this node is the Raft leader.
func (c *Agreement) IsLeader() bool { return c.raft.State() == raft.Leader }

// Apply commits cmd through Raft and returns the epoch of the resulting
// state once this node has applied it. Only the leader accepts writes:
// elsewhere it returns ErrNotLeader (a leader is known: forward to it) or
// ErrNoLeader (retry later). A command that would leave the state as it is
// commits nothing and returns the current epoch. An invalid command
// (ErrInvalid, ErrUnknownBackend) changes nothing on any node.
func (c *Agreement) Apply(ctx context.Context, cmd Command) (uint64, error) {
	if c.closed.Load() {
		return 0, ErrClosed
	}
	if err := c.leaderErr(); err != nil {
		return 0, err
	}
	c.readyMu.Lock()
	ready := c.ready
	c.readyMu.Unlock()
	select {
	case <-ready:
	case <-ctx.Done():
		return 0, fmt.Errorf("cluster: leader not ready: %w", ctx.Err())
	case <-c.shutdownCh:
		return 0, ErrClosed
	}
	return c.write(ctx, cmd)
}

func (c *Agreement) leaderErr() error {
	if c.raft.State() == raft.Leader {
		return nil
	}
	if id, _ := c.Leader(); id != "" {
		return fmt.Errorf("%w (leader is %s)", ErrNotLeader, id)
	}
	return ErrNoLeader
}

// write validates cmd against the latest state and commits it. Writes are
// serialized so each is validated against the state the previous produced.
func (c *Agreement) write(ctx context.Context, cmd Command) (uint64, error) {
	select {
	case c.writeSem <- struct{}{}:
	case <-ctx.Done():
		return 0, ctx.Err()
	case <-c.shutdownCh:
		return 0, ErrClosed
	}
	defer func() { <-c.writeSem }()
	if err := c.leaderErr(); err != nil {
		return 0, err
	}
	cur := c.fsm.load()
	next, changed, err := apply(&cur.state, cmd)
	if err != nil {
		return 0, err
	}
	if !changed {
		return cur.epoch, nil
	}
	if err := c.canApply(cmd.level()); err != nil {
		c.met.versionSkew.Inc()
		return 0, err
	}
	if c.validate != nil {
		if err := c.validate(next); err != nil {
			return 0, fmt.Errorf("%w: %v", ErrInvalid, err)
		}
	}
	data, err := encodeCommand(cmd)
	if err != nil {
		return 0, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	timeout := c.cfg.ApplyTimeout
	if dl, ok := ctx.Deadline(); ok {
		timeout = time.Until(dl)
		if timeout <= 0 {
			return 0, context.DeadlineExceeded
		}
	}
	start := time.Now()
	f := c.raft.Apply(data, timeout)
	if err := f.Error(); err != nil {
		return 0, c.raftErr(err)
	}
	c.met.commitSeconds.Observe(time.Since(start).Seconds())
	res, _ := f.Response().(applyResult)
	if res.err != nil {
		return 0, res.err
	}
	return res.epoch, nil
}

// canApply returns an ErrVersionSkew error unless every other router in
// the Raft configuration, and every router in gossip that will join it,
// advertises at least CommandLevel need. A configured router missing from
// gossip counts as unable: it may come back running its old version. Such a
// write waits until the router is back (and upgraded) or removed.
func (c *Agreement) canApply(need uint8) error {
	if need <= 1 || c.members == nil {
		return nil // every version applies level 1; in memory: one build
	}
	f := c.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return c.raftErr(err)
	}
	v := c.view.Load()
	behind := func(id string, m server) error {
		if m.Ops == 0 {
			return fmt.Errorf("%w: router %s runs an earlier version, which advertises no command level; upgrade it first", ErrVersionSkew, id)
		}
		return fmt.Errorf("%w: router %s applies commands up to level %d, this change needs %d; upgrade it first", ErrVersionSkew, id, m.Ops, need)
	}
	for _, s := range f.Configuration().Servers {
		id := string(s.ID)
		if id == c.cfg.NodeID {
			continue
		}
		m, ok := v.get(id)
		if !ok || !m.alive() {
			return fmt.Errorf("%w: router %s is not in gossip, so its version is unknown; the change waits until it is back or removed", ErrVersionSkew, id)
		}
		if m.Ops < need {
			return behind(id, m)
		}
	}
	for _, m := range v.servers {
		if m.ID != c.cfg.NodeID && m.alive() && m.Ops < need {
			return behind(m.ID, m)
		}
	}
	return nil
}

// raftErr maps Raft's errors to the package's sentinels.
func (c *Agreement) raftErr(err error) error {
	switch {
	case errors.Is(err, raft.ErrNotLeader), errors.Is(err, raft.ErrLeadershipLost),
		errors.Is(err, raft.ErrLeadershipTransferInProgress), errors.Is(err, raft.ErrNotVoter):
		if id, _ := c.Leader(); id != "" {
			return fmt.Errorf("%w: %v (leader is %s)", ErrNotLeader, err, id)
		}
		return fmt.Errorf("%w: %v", ErrNoLeader, err)
	case errors.Is(err, raft.ErrRaftShutdown):
		return ErrClosed
	}
	return fmt.Errorf("cluster: raft: %w", err)
}

// Server is one member of the Raft configuration.
type Server struct {
	ID     string `json:"id"`
	Addr   string `json:"addr"`
	Voter  bool   `json:"voter"`
	Leader bool   `json:"leader,omitempty"`
}

// Status describes this node's view of the Raft group.
type Status struct {
	ID         string `json:"id"`
	Addr       string `json:"addr"`
	RaftState  string `json:"raft_state"` // Leader, Follower, Candidate, Shutdown
	LeaderID   string `json:"leader_id,omitempty"`
	LeaderAddr string `json:"leader_addr,omitempty"`
	Term       uint64 `json:"term"`
	// Epoch is the index of the entry that produced the current state (the
	// ring epoch); AppliedIndex, CommitIndex and LastIndex are Raft's.
	Epoch        uint64 `json:"epoch"`
	AppliedIndex uint64 `json:"applied_index"`
	CommitIndex  uint64 `json:"commit_index"`
	LastIndex    uint64 `json:"last_index"`
	// LastContact is when a follower last heard from the leader (zero on
	// the leader and before any contact).
	LastContact time.Time `json:"last_contact,omitzero"`
	Servers     []Server  `json:"servers"`
	Seeded      bool      `json:"seeded"`
	Backends    int       `json:"backends"`
	// Refused are the members this node's identity probes refuse now
	// (see Refusal).
	Refused []Refusal `json:"refused,omitempty"`
	// RevokedNames and RevokedSerials are the agreed revocation list.
	RevokedNames   []string `json:"revoked_names,omitempty"`
	RevokedSerials []string `json:"revoked_serials,omitempty"`
}

// Status returns this node's view of the group.
func (c *Agreement) Status() Status {
	p := c.fsm.view()
	lid, laddr := c.Leader()
	st := Status{
		ID:           c.cfg.NodeID,
		Addr:         c.addr,
		RaftState:    c.raft.State().String(),
		LeaderID:     lid,
		LeaderAddr:   laddr,
		Term:         c.raft.CurrentTerm(),
		Epoch:        p.epoch,
		AppliedIndex: c.raft.AppliedIndex(),
		CommitIndex:  c.raft.CommitIndex(),
		LastIndex:    c.raft.LastIndex(),
		Seeded:       p.state.Seeded,
		Backends:     len(p.state.Backends),
		Refused:      c.Refused(),

		RevokedNames:   slices.Clone(p.state.RevokedNames),
		RevokedSerials: slices.Clone(p.state.RevokedSerials),
	}
	if c.raft.State() != raft.Leader {
		st.LastContact = c.raft.LastContact()
	}
	if f := c.raft.GetConfiguration(); f.Error() == nil {
		for _, s := range f.Configuration().Servers {
			st.Servers = append(st.Servers, Server{
				ID: string(s.ID), Addr: string(s.Address), Voter: s.Suffrage == raft.Voter, Leader: string(s.ID) == lid,
			})
		}
	}
	return st
}
