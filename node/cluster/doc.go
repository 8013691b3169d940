// Package cluster puts a router fleet's backend membership and routing
// config under Raft (hashicorp/raft), so every change is ordered and applied
// on every node, and every node builds the same ring at the same epoch.
//
// The replicated State holds the backends (id, url, zone, weight, state
// active/draining/down, labels, source) and the routing config. Each
// applied change publishes a new immutable state; its epoch is the index of
// the log entry that produced it. The node reads State (never blocking on
// Raft), rebuilds its ring on every Subscribe notification and swaps it in
// atomically. With no leader, or in a minority partition, State keeps
// returning the last applied state, so routing never waits on Raft.
//
// Writes go through the leader: Apply returns ErrNotLeader elsewhere and
// Leader names the node to forward to. Commands are validated on the leader
// (including the node's validate function, which builds a ring) and again,
// deterministically, by the state machine on every node, so an invalid
// command changes nothing anywhere.
//
// Membership follows gossip, as in Consul: a new cluster forms by
// bootstrap-expect (wait for N voter-eligible servers, bootstrap with the N
// lowest IDs, after checking that none of them already belongs to a
// cluster) or from a single seed (BootstrapExpect 1); other nodes join by
// appearing in gossip. The leader reconciles gossip into the Raft
// configuration: it adds joiners as non-voters, keeps Voters voters
// (promoting and demoting, spreading zones), and removes servers that left
// or stayed missing past DeadServerTimeout. It also commits backend health
// (ReportHealth, with thresholds and hysteresis), seeds the state from the
// config file once, and polls DNS discovery.
//
// Trust: gossip can be joined by any holder of the gossip key, under any
// name and address, so it is never taken at its word. Every node probes
// the routers gossip shows, and the configuration's addresses, over a
// fresh connection (TLS proving the name, and the preamble's cluster ID):
// the leader gives a seat, an address and a vote only where a router
// proved its name, Raft dials a gossip address only once it did, and a
// member that answers without proving it is refused (Refused, logged,
// counted). On every authenticated Raft connection an rpcGate checks each
// RPC before Raft reads it: its header must name the router the
// certificate proves, and only a member of the configuration leads. The
// state holds the cluster's revocation list (Revoke, Unrevoke), which
// every published state hands to the node's identity.
//
// Raft state persists in raft-wal with file snapshots; an Agreement reopens
// from the same DataDir in the same process. Before Raft starts, Open reads
// every log entry Raft will read (raft.NewRaft panics on one it cannot) and
// returns ErrDamagedLog, naming the directory and the recovery, when one
// cannot be read; it first repairs the segments raft-wal v0.4.0 sealed
// without an index block when it cut the log's tail. InmemNetwork runs many
// nodes in one test process with partitions.
package cluster
