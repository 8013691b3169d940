package cluster

import "errors"

// Sentinel errors, matched with errors.Is. Errors returned by Apply wrap one
// of them.
var (
	// ErrNotLeader: this node is not the Raft leader. Forward the write to
	// the leader named by Leader (its admin address is in gossip metadata).
	// A write that fails with ErrNotLeader after it was handed to Raft may
	// or may not have been committed; every command is idempotent, so
	// retrying it on the new leader is safe.
	ErrNotLeader = errors.New("cluster: not the leader")
	// ErrNoLeader: no leader is known (election in progress, minority
	// partition, or the cluster is not bootstrapped yet). Retry with jitter.
	ErrNoLeader = errors.New("cluster: no leader")
	// ErrUnknownBackend: the command names a backend that does not exist.
	ErrUnknownBackend = errors.New("cluster: unknown backend")
	// ErrInvalid: the command, or the state it would produce, is invalid.
	// Nothing changed on any node.
	ErrInvalid = errors.New("cluster: invalid command")
	// ErrInvalidConfig: Config.Validate failed.
	ErrInvalidConfig = errors.New("cluster: invalid config")
	// ErrDataDir: the data directory holds another node's Raft state.
	ErrDataDir = errors.New("cluster: data directory belongs to another node")
	// ErrDamagedLog: the Raft log in the data directory cannot be read
	// where Raft reads it at start. Open returns it with the directory,
	// the entry and the way to recover, instead of letting Raft panic.
	ErrDamagedLog = errors.New("cluster: the Raft log cannot be read")
	// ErrForeignData: this node's data directory holds another cluster's
	// state than the routers it joined (see Agreement.Fatal).
	ErrForeignData = errors.New("cluster: the data directory belongs to another cluster")
	// ErrClosed: the Agreement was closed.
	ErrClosed = errors.New("cluster: closed")
	// ErrCorrupt: a log entry fails its checksum or does not decode. The
	// entry was committed, so the other nodes applied their own copy of
	// it: this node's copy is damaged.
	ErrCorrupt = errors.New("cluster: corrupt log entry")
	// ErrHalted: this node stopped applying the Raft log (see
	// Agreement.Halted).
	ErrHalted = errors.New("cluster: state machine halted")
	// ErrVersionSkew: a router of the cluster runs a version that cannot
	// apply the command (see CommandLevel); upgrade every router first.
	// Nothing changed on any node.
	ErrVersionSkew = errors.New("cluster: a router cannot apply this change yet")
)
