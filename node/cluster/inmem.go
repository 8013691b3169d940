package cluster

import (
	"sync"
	"time"

	"github.com/hashicorp/raft"
)

// InmemNetwork connects the Clusters opened with it (Config.Network) over
// in-memory Raft transports, so a test can run several nodes in one process
// and cut the network between them. A node's Raft address on it is its
// NodeID.
type InmemNetwork struct {
	mu    sync.Mutex
	nodes map[string]*raft.InmemTransport
	side  map[string]int
}

// NewInmemNetwork returns an empty network.
func NewInmemNetwork() *InmemNetwork {
	return &InmemNetwork{nodes: map[string]*raft.InmemTransport{}, side: map[string]int{}}
}

func (n *InmemNetwork) join(id string) *raft.InmemTransport {
	_, t := raft.NewInmemTransportWithTimeout(raft.ServerAddress(id), time.Second)
	n.mu.Lock()
	defer n.mu.Unlock()
	n.nodes[id] = t
	n.wireLocked()
	return t
}

func (n *InmemNetwork) leave(id string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.nodes, id)
	for _, t := range n.nodes {
		t.Disconnect(raft.ServerAddress(id))
	}
}

// Partition cuts the nodes named by ids off from every other node (both
// directions). The named nodes still reach each other, and so do the rest.
// Nodes that join later are on the side of the rest.
func (n *InmemNetwork) Partition(ids ...string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.side = map[string]int{}
	for _, id := range ids {
		n.side[id] = 1
	}
	n.wireLocked()
}

// Heal reconnects every node.
func (n *InmemNetwork) Heal() {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.side = map[string]int{}
	n.wireLocked()
}

// wireLocked connects every pair on the same side and disconnects the rest.
func (n *InmemNetwork) wireLocked() {
	for a, ta := range n.nodes {
		for b, tb := range n.nodes {
			if a == b {
				continue
			}
			if n.side[a] == n.side[b] {
				ta.Connect(raft.ServerAddress(b), tb)
			} else {
				ta.Disconnect(raft.ServerAddress(b))
			}
		}
	}
}
