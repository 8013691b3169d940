package cluster

import (
	"cmp"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
	"github.com/warmroute/warmroute/internal/identity"
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

// proof is a router name at a Raft address: what an identity probe
// checks.
type proof struct{ id, addr string }

// verified is when each router last passed an identity probe at each
// address (it proved its name, and its cluster, over a fresh connection
// there), and the probes it failed.
type verified struct {
	mu      sync.Mutex
	at      map[proof]time.Time
	refused map[proof]*refusal
}

// refusal is a probe's failure at an address where something answered
// but proved nothing.
type refusal struct {
	reason      string
	since, last time.Time
	warned      time.Time // when it was last logged
}

// verifyTTL is how long a passed probe counts; verifyEvery how often the
// node re-probes; refusalWarnEvery how often one refusal is logged again.
const (
	verifyTTL        = 2 * time.Minute
	verifyEvery      = 30 * time.Second
	refusalWarnEvery = 5 * time.Minute
)

func newVerified() verified {
	return verified{at: map[proof]time.Time{}, refused: map[proof]*refusal{}}
}

// ok reports whether router id passed a probe at addr within verifyTTL
// of now.
func (v *verified) ok(id, addr string, now time.Time) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	t, ok := v.at[proof{id, addr}]
	return ok && now.Sub(t) < verifyTTL
}

// okAnywhere reports whether router id passed a probe at any address
// within verifyTTL of now.
func (v *verified) okAnywhere(id string, now time.Time) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	for p, t := range v.at {
		if p.id == id && now.Sub(t) < verifyTTL {
			return true
		}
	}
	return false
}

// pass records a passed probe; any refusal at that address is over.
func (v *verified) pass(id, addr string, t time.Time) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.at[proof{id, addr}] = t
	delete(v.refused, proof{id, addr})
}

// refuse records a refused probe and reports whether to log it: the
// first time, when the reason changes, and every refusalWarnEvery.
func (v *verified) refuse(id, addr, reason string, now time.Time) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	p := proof{id, addr}
	delete(v.at, p)
	r := v.refused[p]
	if r == nil || r.reason != reason {
		r = &refusal{reason: reason, since: now}
		v.refused[p] = r
	}
	r.last = now
	if now.Sub(r.warned) < refusalWarnEvery {
		return false
	}
	r.warned = now
	return true
}

// forget drops what is known of the routers names (revoked: they prove
// nothing any more).
func (v *verified) forget(names []string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	for p := range v.at {
		if slices.Contains(names, p.id) {
			delete(v.at, p)
		}
	}
}

// prune drops the records of addresses no longer probed, and passes
// that expired, so the maps stay as small as the membership.
func (v *verified) prune(keep map[proof]bool, now time.Time) {
	v.mu.Lock()
	defer v.mu.Unlock()
	for p, t := range v.at {
		if !keep[p] && now.Sub(t) >= verifyTTL {
			delete(v.at, p)
		}
	}
	for p := range v.refused {
		if !keep[p] {
			delete(v.refused, p)
		}
	}
}

// Refusal is a router this node's identity probe refused: something
// answered at Addr, Raft address of member Name, but did not prove that
// name (with cluster TLS: no certificate of the cluster CA that names
// it, a revoked one, one issued for another use), or its data belong to
// another cluster. Such a member gets no Raft seat, address or vote.
type Refusal struct {
	Name   string    `json:"name"`
	Addr   string    `json:"addr"`
	Reason string    `json:"reason"`
	Since  time.Time `json:"since"`
}

// refusals lists the current refusals, sorted by name and address.
func (v *verified) refusals() []Refusal {
	v.mu.Lock()
	defer v.mu.Unlock()
	out := make([]Refusal, 0, len(v.refused))
	for p, r := range v.refused {
		out = append(out, Refusal{Name: p.id, Addr: p.addr, Reason: r.reason, Since: r.since})
	}
	slices.SortFunc(out, func(a, b Refusal) int {
		return cmp.Or(strings.Compare(a.Name, b.Name), strings.Compare(a.Addr, b.Addr))
	})
	return out
}

// Refused lists the members this node's identity probes refuse now.
func (c *Agreement) Refused() []Refusal { return c.verified.refusals() }

// verifyLoop probes every router gossip shows, and every address of the
// Raft configuration, when membership changes and every verifyEvery: a
// probe proves the router's name (with identities) and tells its cluster
// (the preamble), so a router whose data belong to another cluster
// learns it even if nobody dials it for Raft. The leader adds to the
// Raft configuration, promotes, and moves to a new address only routers
// that passed a probe there.
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

// probeTargets are the router names and addresses to probe: every live
// router gossip shows, at the address it advertises, and every server of
// the Raft configuration at its configured address (gossip may place a
// name elsewhere, by a move or by an impostor; a router restarted at its
// configured address proves itself there).
func (c *Agreement) probeTargets() map[proof]bool {
	out := map[proof]bool{}
	for _, s := range c.view.Load().servers {
		if s.ID != c.cfg.NodeID && s.alive() && s.Addr != "" {
			out[proof{s.ID, s.Addr}] = true
		}
	}
	if r := c.raftPtr.Load(); r != nil {
		for _, s := range r.GetConfiguration().Configuration().Servers {
			if id := string(s.ID); id != c.cfg.NodeID && s.Address != "" && !c.isRevoked(id) {
				out[proof{id, string(s.Address)}] = true
			}
		}
	}
	return out
}

// verifyAll probes the targets whose last pass is getting old, and
// reports whether every probe passed.
func (c *Agreement) verifyAll() bool {
	now := time.Now()
	targets := c.probeTargets()
	c.verified.prune(targets, now)
	sem := make(chan struct{}, maxProbes)
	var wg sync.WaitGroup
	var failed atomic.Bool
	for p := range targets {
		if c.verified.ok(p.id, p.addr, now.Add(verifyEvery)) {
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
				expect = identity.ExpectName(p.id)
			}
			err := c.stream.probe(p.addr, expect)
			if err == nil {
				c.verified.pass(p.id, p.addr, time.Now())
				wake(c.leaderWake)
				return
			}
			failed.Store(true)
			reason, refused := refusalReason(err)
			if !refused {
				c.log.Debug("raft: router did not answer its identity probe", "router", p.id, "addr", p.addr, "err", err)
				return
			}
			c.met.probeRefused.Inc()
			if c.verified.refuse(p.id, p.addr, reason, time.Now()) {
				c.log.Warn("raft: refusing a member that does not prove its name: it gets no Raft seat, address or vote",
					"member", p.id, "addr", p.addr, "reason", reason)
			}
		}()
	}
	wg.Wait()
	return !failed.Load()
}

// refusalReason tells whether a failed probe is a refusal (something
// answered and proved nothing, or another cluster) and why, or the
// router was not reachable (not listening yet, gone, or too slow).
func refusalReason(err error) (string, bool) {
	var ne net.Error
	var op *net.OpError
	switch {
	case errors.As(err, &op) && op.Op == "dial":
		return "", false
	case errors.As(err, &ne) && ne.Timeout():
		return "", false
	case errors.Is(err, errForeignCluster):
		return "its data belong to another cluster", true
	case errors.Is(err, identity.ErrRevoked):
		return "its certificate is revoked", true
	case errors.Is(err, identity.ErrKeyUsage):
		return "its certificate is not issued for TLS server authentication", true
	case errors.Is(err, identity.ErrWrongPeer):
		return "its certificate proves another router name", true
	case errors.Is(err, identity.ErrNoName), errors.Is(err, identity.ErrBadName):
		return "its certificate names no router", true
	case errors.Is(err, identity.ErrUntrusted):
		return "no certificate of the cluster CA", true
	case errors.Is(err, errTLSHandshake):
		return "no TLS handshake (a router without cluster TLS, or not a router)", true
	case errors.Is(err, errPreamble):
		return "no valid Raft preamble (not a warmroute router of this version)", true
	}
	return "", false
}

// trusted filters a gossip view for the leader's reconcile. A server
// counts only where it proved its name: at the address gossip gives for
// it (a seat, an address update, a vote), else, for a server of the Raft
// configuration, at its configured address (it keeps that address,
// whatever gossip says). A configured server that proved itself nowhere
// counts as missing from gossip (the dead-server timeout runs), one that
// is revoked or left gracefully as left (removed at once); an unproven
// one outside the configuration gets nothing. Any holder of the gossip key can put a
// member of any name and address in gossip: this is what keeps it out
// of Raft.
func (c *Agreement) trusted(v *memberView, cfg []raft.Server) *memberView {
	if c.stream == nil {
		return v // in-memory network: nothing to prove
	}
	inCfg := map[string]raft.Server{}
	for _, s := range cfg {
		inCfg[string(s.ID)] = s
	}
	now := time.Now()
	out := &memberView{key: v.key}
	for _, s := range v.servers {
		cs, configured := inCfg[s.ID]
		switch {
		case s.ID == c.cfg.NodeID:
		case c.isRevoked(s.ID):
			if !configured {
				continue
			}
			s.Addr, s.State = string(cs.Address), "left"
		case s.State == "left":
			// A departure only frees the seat (at once, as before
			// identities): it moves no address and gives no vote.
			if !configured {
				continue
			}
			s.Addr = string(cs.Address)
		case c.verified.ok(s.ID, s.Addr, now):
		case configured && c.verified.ok(s.ID, string(cs.Address), now):
			s.Addr, s.State = string(cs.Address), "alive"
		default:
			continue
		}
		out.servers = append(out.servers, s)
	}
	return out
}

// isRevoked reports whether router id is revoked by name in the agreed
// state.
func (c *Agreement) isRevoked(id string) bool {
	st := c.fsm.view().state
	return st.Revoked(id)
}

// applyRevocations hands a published state's revocation list to this
// router's identity, which every certificate check consults (the TLS
// handshakes of Raft and the admin API, each Raft RPC, gossip
// signatures), forgets what revoked routers proved, and wakes the leader
// loop, which removes them from the Raft configuration.
func (c *Agreement) applyRevocations(p *published) {
	names, serials := p.state.RevokedNames, p.state.RevokedSerials
	c.trustMu.Lock()
	same := slices.Equal(names, c.revokedNames) && slices.Equal(serials, c.revokedSerials)
	c.revokedNames, c.revokedSerials = names, serials
	c.trustMu.Unlock()
	if same {
		return
	}
	if id := c.cfg.Identity; id != nil {
		id.Revocations().Set(names, serials)
		if err := id.Revocations().Check(id.Cert.Leaf, id.Name); err != nil {
			c.log.Error("this router's own certificate is revoked: the other routers refuse it; give it a new name or certificate", "err", err)
		}
	}
	c.verified.forget(names)
	c.log.Info("revocation list changed", "names", len(names), "serials", len(serials))
	wake(c.leaderWake)
	wake(c.verifyWake)
}
