package cluster

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/hashicorp/raft"
	"github.com/warmroute/warmroute/gossip"
)

// Membership is what the Agreement reads from gossip; *gossip.Mesh
// implements it. Members must include this node (Self) and may include
// members whose State is "left" (removed from Raft at once) or "dead".
// Subscribe's channel receives a value after membership (or anything else)
// changes; it is closed when gossip stops.
type Membership interface {
	Members() []gossip.Member
	Subscribe() (<-chan struct{}, func())
}

var _ Membership = (*gossip.Mesh)(nil)

// server is a gossip member that runs Raft (it advertises a RaftAddr).
type server struct {
	ID       string
	Addr     string
	Zone     string
	Eligible bool   // wants a vote (Meta.Voter)
	State    string // alive, suspect, left, dead
	Ops      uint8  // the CommandLevel it advertises (0: an earlier version)
}

func (s server) alive() bool { return s.State == "alive" || s.State == "suspect" || s.State == "" }

// memberView is the Raft servers gossip knows, sorted by ID. Immutable.
type memberView struct {
	servers []server
	key     string // fingerprint: a new view is published only when it changes
}

func (v *memberView) get(id string) (server, bool) {
	i, ok := slices.BinarySearchFunc(v.servers, id, func(s server, id string) int { return strings.Compare(s.ID, id) })
	if !ok {
		return server{}, false
	}
	return v.servers[i], true
}

// buildView converts members to servers. self is always present: when
// gossip does not list it, it is added as an eligible voter at selfAddr.
func buildView(members []gossip.Member, selfID, selfAddr string) *memberView {
	v := &memberView{}
	seenSelf := false
	for _, m := range members {
		s := server{ID: m.Name, Addr: m.Meta.RaftAddr, Zone: m.Meta.Zone, Eligible: m.Meta.Voter, State: m.State, Ops: m.Meta.Ops}
		if m.Name == selfID {
			seenSelf = true
			s.Addr = selfAddr
			s.State = "alive"
		}
		if s.ID == "" || s.Addr == "" {
			continue
		}
		v.servers = append(v.servers, s)
	}
	if !seenSelf {
		v.servers = append(v.servers, server{ID: selfID, Addr: selfAddr, Eligible: true, State: "alive", Ops: CommandLevel})
	}
	slices.SortFunc(v.servers, func(a, b server) int { return strings.Compare(a.ID, b.ID) })
	v.servers = slices.CompactFunc(v.servers, func(a, b server) bool { return a.ID == b.ID })
	var sb strings.Builder
	for _, s := range v.servers {
		fmt.Fprintf(&sb, "%s|%s|%s|%t|%s|%d\n", s.ID, s.Addr, s.Zone, s.Eligible, s.State, s.Ops)
	}
	v.key = sb.String()
	return v
}

// addrProvider implements raft.ServerAddressProvider: Raft dials a server
// at the address gossip advertises for its ID now, so a node that restarted
// on a new IP is reachable before the configuration is updated, but only
// once the router proved its name there (an identity probe): anyone with
// the gossip key can advertise an address for any name. Until then, and
// when gossip has none, Raft dials the configured address.
type addrProvider struct{ c *Agreement }

func (p addrProvider) ServerAddr(id raft.ServerID) (raft.ServerAddress, error) {
	c := p.c
	if string(id) == c.cfg.NodeID {
		return raft.ServerAddress(c.addr), nil
	}
	if v := c.view.Load(); v != nil {
		if s, ok := v.get(string(id)); ok && s.alive() && (c.stream == nil || c.verified.ok(s.ID, s.Addr, time.Now())) {
			return raft.ServerAddress(s.Addr), nil
		}
	}
	if r := c.raftPtr.Load(); r != nil {
		for _, s := range r.GetConfiguration().Configuration().Servers {
			if s.ID == id {
				return s.Address, nil
			}
		}
	}
	return "", fmt.Errorf("cluster: no address for %s", id)
}

// watchMembers keeps c.view current and wakes the bootstrap and leader
// loops when the set of servers changes.
func (c *Agreement) watchMembers() {
	defer c.wg.Done()
	if c.members == nil {
		return
	}
	ch, cancel := c.members.Subscribe()
	defer cancel()
	c.refreshView()
	for {
		select {
		case <-c.shutdownCh:
			return
		case _, ok := <-ch:
			if !ok {
				ch = nil // gossip stopped: keep the last view
				continue
			}
			c.refreshView()
		}
	}
}

func (c *Agreement) refreshView() {
	v := buildView(c.members.Members(), c.cfg.NodeID, c.addr)
	if old := c.view.Load(); old != nil && old.key == v.key {
		return
	}
	c.view.Store(v)
	wake(c.bootstrapWake)
	wake(c.leaderWake)
	wake(c.verifyWake)
}

// wake sends on a one-slot channel without blocking.
func wake(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}
