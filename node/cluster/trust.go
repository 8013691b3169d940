package cluster

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
	"github.com/warmroute/warmroute/node/identity"
)

// clusterIDFile keeps the cluster ID in the data directory, so the Raft
// transport knows it before the log is replayed.
const clusterIDFile = "cluster-id"

// newClusterID returns a random cluster ID: 32 lowercase hex digits.
func newClusterID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// currentClusterID is the ID of the cluster this node's data belong to,
// or "" before it learnt one (a new node that has not applied the seed
// yet).
func (c *Agreement) currentClusterID() string {
	c.trustMu.Lock()
	defer c.trustMu.Unlock()
	return c.clusterID
}

// readClusterID reads the data directory's cluster ID ("" when none).
func readClusterID(dir string) (string, error) {
	b, err := os.ReadFile(filepath.Join(dir, clusterIDFile))
	if errors.Is(err, os.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("cluster: data dir: %w", err)
	}
	id := strings.TrimSpace(string(b))
	if err := checkClusterID(id); err != nil || id == "" {
		return "", fmt.Errorf("%w: %s: not a cluster ID", ErrDataDir, filepath.Join(dir, clusterIDFile))
	}
	return id, nil
}

// checkState is the FSM's check of every state before it is published:
// a state of another cluster than the data directory's halts the state
// machine. The first ID seen is kept (and written to the data directory).
func (c *Agreement) checkState(p *published) error {
	id := p.state.ClusterID
	if id == "" {
		return nil
	}
	c.trustMu.Lock()
	defer c.trustMu.Unlock()
	switch c.clusterID {
	case id:
		return nil
	case "":
		c.clusterID = id
		if c.cfg.DataDir != "" {
			if err := writeFileSync(filepath.Join(c.cfg.DataDir, clusterIDFile), []byte(id+"\n")); err != nil {
				c.log.Warn("cannot record the cluster ID in the data directory", "err", err)
			}
		}
		return nil
	}
	return fmt.Errorf("%w: the log holds cluster %s, the data directory's cluster ID is %s", ErrForeignData, id, c.clusterID)
}

// writeFileSync writes b to path atomically and durably.
func writeFileSync(path string, b []byte) error {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o640)
	if err != nil {
		return err
	}
	if _, err = f.Write(b); err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// expectedAt returns the names of the routers gossip or the Raft
// configuration place at addr: a router dialled there must prove one of
// them.
func (c *Agreement) expectedAt(addr string) map[string]bool {
	out := map[string]bool{}
	if v := c.view.Load(); v != nil {
		for _, s := range v.servers {
			if s.Addr == addr {
				out[s.ID] = true
			}
		}
	}
	if r := c.raftPtr.Load(); r != nil {
		for _, s := range r.GetConfiguration().Configuration().Servers {
			if string(s.Address) == addr {
				out[string(s.ID)] = true
			}
		}
	}
	return out
}

// peerRecord is what the preambles told of one router.
type peerRecord struct {
	clusterID string
	at        time.Time
}

// tallyWindow is how long a preamble's word on a router's cluster counts.
const tallyWindow = 2 * time.Minute

// notePeer records a preamble exchange with a router (the stream calls
// it for every connection, both ways; dialed says this node dialled).
// name is the name the peer proved, or "" without identities (the address
// then stands for the router, for dials only: an inbound connection's
// port says nothing).
//
// When the routers reporting another cluster outnumber those reporting
// this node's cluster (this node included), this node is the odd one
// out: its data directory holds another cluster's state. It then stops
// (Fatal), naming both clusters, instead of routing on that state.
func (c *Agreement) notePeer(name, addr, clusterID string, foreign, dialed bool) {
	if foreign {
		c.met.raftForeign.Inc()
		c.log.Error("a router of another cluster", "peer", name, "addr", addr, "peer_cluster", clusterID, "cluster", c.currentClusterID())
	}
	key := name
	if key == "" {
		if !dialed {
			return
		}
		key = "addr:" + addr
	}
	if clusterID == "" {
		return
	}
	now := time.Now()
	c.trustMu.Lock()
	defer c.trustMu.Unlock()
	c.peers[key] = peerRecord{clusterID: clusterID, at: now}
	ours := c.clusterID
	if ours == "" || clusterID == ours {
		return
	}
	same, other := 1, 0 // this node counts for its own data
	var others []string
	for k, r := range c.peers {
		if now.Sub(r.at) > tallyWindow {
			delete(c.peers, k)
			continue
		}
		switch r.clusterID {
		case ours:
			same++
		case clusterID:
			other++
			others = append(others, strings.TrimPrefix(k, "addr:"))
		}
	}
	if other > same {
		slices.Sort(others)
		c.fail(fmt.Errorf("%w: this router's data (%s) belong to cluster %s, but %d routers (%s) belong to cluster %s: "+
			"point --data-dir at this cluster's data, or empty it to join as a new router",
			ErrForeignData, c.cfg.DataDir, ours, other, strings.Join(others, ", "), clusterID))
	}
}

// fail reports a fatal error once on Fatal.
func (c *Agreement) fail(err error) {
	c.fatalOnce.Do(func() {
		c.log.Error("stopping: "+err.Error(), "err", err)
		c.fatal <- err
	})
}

// Fatal receives an error when this node must stop: its data belong to
// another cluster than its peers'. The node should exit with it.
func (c *Agreement) Fatal() <-chan error { return c.fatal }

// haltInfo is why the state machine stopped applying.
type haltInfo struct {
	index uint64
	err   error
}

// onHalt is the FSM's report of an entry it cannot apply.
func (c *Agreement) onHalt(index uint64, err error) {
	c.met.fsmHalted.Set(1)
	c.log.Error("raft: this router stopped applying the log: its copy of a committed entry is damaged or foreign; "+
		"it keeps the last good state and reports not ready. Replace its data directory (it then copies the state from the leader)",
		"index", index, "err", err)
	c.subs.Notify()
}

// Halted returns why this node stopped applying the Raft log (a damaged
// or foreign entry), or nil. A halted node keeps its last good state but
// must not be used: report it not ready.
func (c *Agreement) Halted() error {
	if h := c.fsm.halted.Load(); h != nil {
		return fmt.Errorf("raft entry %d: %w", h.index, h.err)
	}
	return nil
}

// verified is when each router last passed an identity probe: it proved
// its name and its cluster over a fresh connection.
type verified struct {
	mu sync.Mutex
	at map[string]time.Time
}

// verifyTTL is how long a passed probe counts; verifyEvery how often the
// node re-probes.
const (
	verifyTTL   = 2 * time.Minute
	verifyEvery = 30 * time.Second
)

func (v *verified) ok(id string, now time.Time) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	t, ok := v.at[id]
	return ok && now.Sub(t) < verifyTTL
}

func (v *verified) set(id string, t time.Time) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.at[id] = t
}

// verifyLoop probes every router gossip shows, when membership changes
// and every verifyEvery: a probe proves the router's name (with
// identities) and tells its cluster (the preamble), so a router whose
// data belong to another cluster learns it even if nobody dials it for
// Raft. The leader adds to the Raft configuration, and promotes, only
// routers that passed a probe.
func (c *Agreement) verifyLoop() {
	defer c.wg.Done()
	if c.stream == nil || c.members == nil {
		return
	}
	// A router shows in gossip just before its Raft listener opens, and
	// may be unreachable for a while: failed probes are retried soon,
	// backing off to verifyEvery.
	const firstRetry = 100 * time.Millisecond
	retry := firstRetry
	t := time.NewTimer(verifyEvery)
	defer t.Stop()
	for {
		wait := verifyEvery
		if c.verifyAll() {
			retry = firstRetry
		} else {
			wait, retry = retry, min(2*retry, verifyEvery)
		}
		t.Reset(wait)
		select {
		case <-c.shutdownCh:
			return
		case <-c.verifyWake:
		case <-t.C:
		}
	}
}

// maxProbes bounds the probes running at once.
const maxProbes = 4

// verifyAll probes the routers whose last pass is getting old, and
// reports whether every probe passed.
func (c *Agreement) verifyAll() bool {
	v := c.view.Load()
	now := time.Now()
	sem := make(chan struct{}, maxProbes)
	var wg sync.WaitGroup
	var failed atomic.Bool
	for _, s := range v.servers {
		if s.ID == c.cfg.NodeID || !s.alive() || s.Addr == "" || c.verified.ok(s.ID, now.Add(verifyEvery)) {
			continue
		}
		select {
		case <-c.shutdownCh:
			wg.Wait()
			return true
		case sem <- struct{}{}:
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			var expect func(string) error
			if c.cfg.Identity != nil {
				expect = identity.ExpectName(s.ID)
			}
			if err := c.stream.probe(s.Addr, expect); err != nil {
				failed.Store(true)
				c.log.Debug("raft: router did not pass its identity probe", "router", s.ID, "addr", s.Addr, "err", err)
				return
			}
			c.verified.set(s.ID, time.Now())
			wake(c.leaderWake)
		}()
	}
	wg.Wait()
	return !failed.Load()
}

// trusted filters a gossip view for the leader's reconcile: routers that
// did not pass an identity probe are neither added to the Raft
// configuration nor promoted (the configuration's own servers stay).
func (c *Agreement) trusted(v *memberView, cfg []raft.Server) *memberView {
	if c.stream == nil {
		return v // in-memory network: nothing to prove
	}
	inCfg := map[string]raft.ServerSuffrage{}
	for _, s := range cfg {
		inCfg[string(s.ID)] = s.Suffrage
	}
	now := time.Now()
	out := &memberView{key: v.key}
	for _, s := range v.servers {
		if s.ID != c.cfg.NodeID && !c.verified.ok(s.ID, now) {
			suffrage, ok := inCfg[s.ID]
			if !ok {
				continue
			}
			if suffrage != raft.Voter {
				s.Eligible = false
			}
		}
		out.servers = append(out.servers, s)
	}
	return out
}
