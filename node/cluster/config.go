package cluster

import (
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/hashicorp/raft"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/warmroute/warmroute/internal/identity"
	"github.com/warmroute/warmroute/ring"
)

// Config configures an Agreement. Start from DefaultConfig; a Config must not
// be changed after it is passed to Open.
type Config struct {
	// NodeID is this node's Raft server ID. It must equal the node's gossip
	// name (members are matched by name) and stay the same across restarts.
	NodeID string

	// RaftBind is the TCP address the Raft transport listens on
	// (host:port; port 0 picks one, see Agreement.Addr). RaftAdvertise is the
	// address other nodes dial; empty means the bound address, which then
	// must not be 0.0.0.0 or [::]. The node advertises Agreement.Addr in its
	// gossip metadata (Meta.RaftAddr).
	RaftBind      string
	RaftAdvertise string

	// DataDir holds the Raft log (raft-wal), its metadata DB and snapshots.
	// Empty keeps everything in memory (tests): nothing survives Close.
	DataDir string

	// Identity, when set, secures Raft traffic with mutual TLS: every
	// connection proves both routers' names with certificates of the
	// cluster CA, and a router dialled at an address must prove the name
	// gossip (or the Raft configuration) gives for that address. Its name
	// must equal NodeID. Without it Raft runs in plaintext: for loopback
	// and trusted networks only.
	Identity *identity.Bundle

	// RaftMaxConns bounds the inbound Raft connections that have not
	// proved a router yet (handshaking), RaftMaxConnsPerIP those from one
	// address: a newcomer over either closes the oldest of its address,
	// or of the busiest one (internal/limit). Connections that proved a
	// router are held apart: RaftMaxConns in all, RaftMaxConnsPerIP per
	// router.
	RaftMaxConns      int
	RaftMaxConnsPerIP int
	// RaftHandshakeTimeout bounds an inbound connection's TLS handshake
	// and preamble (before Raft sees it), and a dial.
	RaftHandshakeTimeout time.Duration
	// RaftIdleTimeout closes an inbound connection that sends nothing for
	// this long, and fails a write to it that makes no progress as long.
	// Outbound connections idle for half of it are replaced before use.
	RaftIdleTimeout time.Duration

	// Network, when set, replaces the TCP transport with an in-memory one
	// on that network (tests); RaftBind and RaftAdvertise are then unused
	// and the node's address is its NodeID.
	Network *InmemNetwork

	// BootstrapExpect is how many voter-eligible nodes (gossip Meta.Voter
	// with a RaftAddr) form a new cluster: 0 never bootstraps (the node
	// waits to be added by a leader); 1 bootstraps alone (a single seed);
	// N waits until N are seen, then bootstraps with the N lowest names.
	// Ignored when the data directory already holds Raft state.
	BootstrapExpect int
	// Voters is the number of voters the leader keeps (1, 3, 5 or 7); every
	// other node is a non-voter.
	Voters int

	// DeadServerTimeout is how long a server may be missing from gossip
	// before the leader removes it from the Raft configuration. Members
	// that gossip reports as "left" are removed at once.
	DeadServerTimeout time.Duration
	// ReconcileInterval is the period of the leader's full reconcile of
	// gossip membership into the Raft configuration (membership changes
	// trigger one at once as well).
	ReconcileInterval time.Duration
	// BootstrapInterval is how often a node waiting to bootstrap rechecks
	// membership when no gossip change arrives.
	BootstrapInterval time.Duration

	// HealthFailThreshold consecutive failed reports from one reporter make
	// that reporter see a backend as unhealthy; HealthRiseThreshold
	// consecutive good ones make it healthy again. The leader commits down
	// when most reporters with a report younger than HealthReportTTL see
	// the backend unhealthy, and active again when most see it healthy.
	HealthFailThreshold int
	HealthRiseThreshold int
	HealthReportTTL     time.Duration

	// Discovery polls DNS for backends (leader only). Off when Name is
	// empty.
	Discovery DiscoveryConfig

	// SeedBackends and SeedRouting are applied once, by the first leader of
	// a cluster whose state was never seeded: usually the config file's
	// backends and routing block.
	SeedBackends []Backend
	SeedRouting  ring.Settings

	// ApplyTimeout bounds a write when its context has no deadline.
	ApplyTimeout time.Duration

	// Raft timing. The defaults are raft.DefaultConfig's (1 s heartbeat and
	// election timeouts: failover in 1.4-2 s); tests use ~50 ms.
	HeartbeatTimeout   time.Duration
	ElectionTimeout    time.Duration
	LeaderLeaseTimeout time.Duration
	CommitTimeout      time.Duration
	// SnapshotThreshold is how many log entries since the last snapshot
	// trigger a new one (checked every SnapshotInterval); TrailingLogs is
	// how many entries a snapshot leaves in the log for slow followers.
	SnapshotThreshold uint64
	SnapshotInterval  time.Duration
	TrailingLogs      uint64
	// SnapshotRetain is how many snapshots are kept on disk.
	SnapshotRetain int

	// Logger receives the Agreement's logs and Raft's (Raft's info lines at
	// debug level). Nil discards.
	Logger *slog.Logger
	// Registry, when non-nil, receives the Agreement's metrics; Close
	// unregisters them.
	Registry prometheus.Registerer
}

// DefaultConfig returns production defaults: 3 voters, no bootstrap (set
// BootstrapExpect), Raft's default timing.
func DefaultConfig() Config {
	rc := raft.DefaultConfig()
	return Config{
		RaftBind:            "0.0.0.0:7947",
		Voters:              3,
		DeadServerTimeout:   2 * time.Minute,
		ReconcileInterval:   30 * time.Second,
		BootstrapInterval:   time.Second,
		HealthFailThreshold: 3,
		HealthRiseThreshold: 2,
		HealthReportTTL:     30 * time.Second,
		Discovery:           DefaultDiscoveryConfig(),
		SeedRouting:         ring.DefaultSettings(),
		ApplyTimeout:        10 * time.Second,
		HeartbeatTimeout:    rc.HeartbeatTimeout,
		ElectionTimeout:     rc.ElectionTimeout,
		LeaderLeaseTimeout:  rc.LeaderLeaseTimeout,
		CommitTimeout:       rc.CommitTimeout,
		SnapshotThreshold:   1024,
		SnapshotInterval:    rc.SnapshotInterval,
		TrailingLogs:        1024,
		SnapshotRetain:      2,

		RaftMaxConns:         256,
		RaftMaxConnsPerIP:    64,
		RaftHandshakeTimeout: 5 * time.Second,
		RaftIdleTimeout:      2 * time.Minute,
	}
}

// Validate reports the first problem, naming the setting.
func (c *Config) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, args...)...)
	}
	switch {
	case c.NodeID == "":
		return bad("NodeID is empty")
	case c.Network == nil && c.RaftBind == "":
		return bad("RaftBind is empty")
	case c.Voters != 1 && c.Voters != 3 && c.Voters != 5 && c.Voters != 7:
		return bad("Voters %d: want 1, 3, 5 or 7", c.Voters)
	case c.BootstrapExpect < 0 || c.BootstrapExpect > c.Voters:
		return bad("BootstrapExpect %d out of range [0, Voters=%d]", c.BootstrapExpect, c.Voters)
	case c.DeadServerTimeout <= 0, c.ReconcileInterval <= 0, c.BootstrapInterval <= 0, c.ApplyTimeout <= 0:
		return bad("DeadServerTimeout, ReconcileInterval, BootstrapInterval and ApplyTimeout must be positive")
	case c.HealthFailThreshold < 1 || c.HealthRiseThreshold < 1:
		return bad("health thresholds must be at least 1")
	case c.HealthReportTTL <= 0:
		return bad("HealthReportTTL must be positive")
	case c.HeartbeatTimeout <= 0 || c.ElectionTimeout <= 0 || c.LeaderLeaseTimeout <= 0 || c.CommitTimeout <= 0:
		return bad("Raft timeouts must be positive")
	case c.SnapshotRetain < 1:
		return bad("SnapshotRetain must be at least 1")
	case c.RaftMaxConns < 1 || c.RaftMaxConnsPerIP < 1:
		return bad("RaftMaxConns and RaftMaxConnsPerIP must be at least 1")
	case c.RaftHandshakeTimeout <= 0 || c.RaftIdleTimeout <= 0:
		return bad("RaftHandshakeTimeout and RaftIdleTimeout must be positive")
	case c.Identity != nil && c.Identity.Name != c.NodeID:
		return bad("NodeID %q differs from the name %q this router's certificate proves", c.NodeID, c.Identity.Name)
	}
	if c.Network == nil {
		if _, _, err := net.SplitHostPort(c.RaftBind); err != nil {
			return bad("RaftBind %q: %v", c.RaftBind, err)
		}
		if c.RaftAdvertise != "" {
			if _, err := net.ResolveTCPAddr("tcp", c.RaftAdvertise); err != nil {
				return bad("RaftAdvertise %q: %v", c.RaftAdvertise, err)
			}
		}
	}
	if err := c.Discovery.validate(); err != nil {
		return bad("discovery: %v", err)
	}
	if _, _, err := apply(&State{}, Seed(c.SeedBackends, c.SeedRouting)); err != nil {
		return bad("seed: %v", err)
	}
	if err := raft.ValidateConfig(c.raftConfig()); err != nil {
		return bad("%v", err)
	}
	return nil
}

func (c *Config) raftConfig() *raft.Config {
	rc := raft.DefaultConfig()
	rc.LocalID = raft.ServerID(c.NodeID)
	rc.HeartbeatTimeout = c.HeartbeatTimeout
	rc.ElectionTimeout = c.ElectionTimeout
	rc.LeaderLeaseTimeout = c.LeaderLeaseTimeout
	rc.CommitTimeout = c.CommitTimeout
	if c.SnapshotThreshold > 0 {
		rc.SnapshotThreshold = c.SnapshotThreshold
	}
	if c.SnapshotInterval > 0 {
		rc.SnapshotInterval = c.SnapshotInterval
	}
	rc.TrailingLogs = c.TrailingLogs
	// A node removed while partitioned keeps running so the leader can add
	// it back when it reappears in gossip.
	rc.ShutdownOnRemove = false
	rc.NoLegacyTelemetry = true
	return rc
}
