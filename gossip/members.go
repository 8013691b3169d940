package gossip

import (
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
)

// Membership as this node keeps it: the live members, those that left or
// failed, where load packets go, and this node's own address and metadata.
// setPeer keeps the table; the memberlist callbacks (delegate.go) call it.

// memberTable holds the members as the event callbacks report them.
// memberlist rewrites the Node structs Members() returns in place (without
// a lock the reader could take), so only the callbacks, which run under its
// node lock, read them, and copy what is needed here.
type memberTable struct {
	mu       sync.Mutex
	peers    map[string]peer                  // live members, this node included
	failed   map[string]failedNode            // members declared dead, for reconnects
	left     map[string]leftNode              // members that left gracefully, recently
	sendList atomic.Pointer[[]netip.AddrPort] // where load packets go: the live members but this node
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

// Members returns the live members, this node included, sorted by name.
// State is "alive" for every member: memberlist does not report its
// suspicion of a member to the application, and a suspect is still a
// member until it is declared dead. With an Identity, Proven says whether
// a member proved its name with a certificate of the cluster CA; any
// holder of the gossip key can join memberlist under a name of its
// choice, so a member that has not is no router to trust.
func (c *Mesh) Members() []Member {
	c.members.mu.Lock()
	out := make([]Member, 0, len(c.members.peers))
	for name, p := range c.members.peers {
		m := Member{Name: name, Addr: p.addr.String(), State: "alive", Self: name == c.cfg.NodeName}
		if meta, err := decodeMeta(p.meta); err == nil {
			m.Meta = meta
		}
		out = append(out, m)
	}
	c.members.mu.Unlock()
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
	c.members.mu.Lock()
	out := make([]Member, 0, len(c.members.left))
	for name, l := range c.members.left {
		if now.Sub(l.since) > leftRetention {
			delete(c.members.left, name)
			continue
		}
		m := Member{Name: name, Addr: l.addr.String(), State: "left"}
		if meta, err := decodeMeta(l.meta); err == nil {
			m.Meta = meta
		}
		out = append(out, m)
	}
	c.members.mu.Unlock()
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

// setPeer copies what is needed of n (called under memberlist's node
// lock) and refreshes the list load packets are sent to. A member that is
// gone goes to the left list when it said goodbye, else to the failed
// list that joinLoop retries.
func (c *Mesh) setPeer(n *memberlist.Node, gone, left bool) {
	ip, _ := netip.AddrFromSlice(n.Addr)
	addr := netip.AddrPortFrom(ip.Unmap(), n.Port)
	c.members.mu.Lock()
	defer c.members.mu.Unlock()
	if gone {
		p, known := c.members.peers[n.Name]
		delete(c.members.peers, n.Name)
		switch {
		case n.Name == c.cfg.NodeName:
		case left:
			if !known {
				p = newPeer(addr, n.Meta)
			}
			c.members.left[n.Name] = leftNode{peer: p, since: time.Now()}
		default:
			c.members.failed[n.Name] = failedNode{addr: addr.String(), since: time.Now()}
		}
	} else {
		c.members.peers[n.Name] = newPeer(addr, n.Meta)
		delete(c.members.failed, n.Name)
		delete(c.members.left, n.Name)
	}
	list := make([]netip.AddrPort, 0, len(c.members.peers))
	for name, p := range c.members.peers {
		if name != c.cfg.NodeName {
			list = append(list, p.addr)
		}
	}
	c.members.sendList.Store(&list)
	c.pub.skipZeros.Store(allCountSilence(c.members.peers, c.cfg.NodeName))
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
