package gossip

import "github.com/hashicorp/memberlist"

// memberlist's callbacks into the Mesh: node metadata and push/pull
// states, names checked before a member is accepted, and membership
// events that keep the member table (members.go). They never block on
// more than a short mutex.

// delegate implements memberlist.Delegate. Its methods never block on
// anything but the state's short mutex.
type delegate struct{ c *Mesh }

func (d delegate) NodeMeta(limit int) []byte {
	b := *d.c.meta.Load()
	if len(b) > limit {
		return nil
	}
	return b
}

// NotifyMsg ignores memberlist user messages: figures travel in load
// packets and push/pull states only, and nothing sends user messages.
func (d delegate) NotifyMsg(b []byte) {}

func (d delegate) GetBroadcasts(overhead, limit int) [][]byte { return nil }

func (d delegate) LocalState(join bool) []byte { return d.c.localState() }

func (d delegate) MergeRemoteState(b []byte, join bool) { d.c.mergeState(b) }

// aliveFilter implements memberlist.AliveDelegate: a member whose name is
// not a valid router name (see Config.NodeName) is refused, so names with
// control characters or separators never reach logs, metrics or the Raft
// configuration.
type aliveFilter struct{ c *Mesh }

func (a aliveFilter) NotifyAlive(n *memberlist.Node) error {
	if err := checkName(n.Name); err != nil {
		a.c.st.rej.add(rejMemberName)
		return err
	}
	return nil
}

// events implements memberlist.EventDelegate. It must not call back into
// memberlist (Members would deadlock).
type events struct{ c *Mesh }

func (e events) NotifyJoin(n *memberlist.Node) {
	c := e.c
	c.st.join(n.Name)
	c.setPeer(n, false, false)
	if n.Name != c.cfg.NodeName {
		c.join.joined.Store(true)
		// Exchange chains with the new member at once.
		c.queueChain(n.Name, true)
	}
	c.signal()
}

// NotifyLeave is called for a member that left or was declared dead.
// memberlist knows which, but the Node it passes does not say (the state
// lives in a field the callback cannot see), so a member counts as having
// left when its goodbye arrived first; Close sends one before leaving.
func (e events) NotifyLeave(n *memberlist.Node) {
	c := e.c
	left := c.st.leave(n.Name)
	c.setPeer(n, true, left)
	c.signal()
}

func (e events) NotifyUpdate(n *memberlist.Node) {
	e.c.st.touch()
	e.c.setPeer(n, false, false)
	e.c.signal()
}
