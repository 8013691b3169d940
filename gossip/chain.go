package gossip

import (
	"net/netip"
	"time"
)

// With an Identity, receivers need each member's certificate chain before
// they can check its signatures. A node sends its chain message straight
// to a member that just joined (asking for the member's in return), to a
// member that sent figures signed with a chain the node has not verified
// (the member asks, the node answers), and to every member every
// chainInterval; its push/pull state carries the chain too. The chain
// message is not signed: the certificates prove themselves, and replaying
// one only repeats a proof.

// chainInterval is how often a node sends its chain to every member.
const chainInterval = 5 * time.Second

// chainGap bounds how often a node sends its chain to one member outside
// the periodic round: once per gap for requests and once for answers, so
// a replayed request cannot make it send more.
const chainGap = 250 * time.Millisecond

// chainReq asks chainLoop to send this node's chain to a member.
type chainReq struct {
	name string
	want bool // ask for the member's chain in return
}

// chainState is this node's side of the exchange.
type chainState struct {
	reqs chan chainReq // chain messages to send (chainLoop)
	msgs [2][]byte     // this node's chain message: [0] plain, [1] asking for the peer's
}

// queueChain asks chainLoop to send this node's chain to member name. It
// never blocks; a full queue drops the request (the periodic round
// repairs it).
func (c *Mesh) queueChain(name string, want bool) {
	if c.sign == nil {
		return
	}
	select {
	case c.chain.reqs <- chainReq{name: name, want: want}:
	default:
	}
}

// chainLoop sends chain messages: those queued, and every chainInterval
// one to every member.
func (c *Mesh) chainLoop() {
	defer c.wg.Done()
	t := time.NewTicker(chainInterval)
	defer t.Stop()
	last := make(map[chainReq]time.Time) // name and kind -> last sent
	for {
		select {
		case <-c.stop:
			return
		case r := <-c.chain.reqs:
			now := time.Now()
			if now.Sub(last[r]) < chainGap {
				continue
			}
			if to, ok := c.peerAddr(r.name); ok {
				last[r] = now
				c.sendChain(to, r.want)
			}
		case now := <-t.C:
			for _, to := range *c.members.sendList.Load() {
				c.sendChain(to, false)
			}
			for r, at := range last {
				if now.Sub(at) > chainInterval {
					delete(last, r)
				}
			}
		}
	}
}

func (c *Mesh) peerAddr(name string) (netip.AddrPort, bool) {
	c.members.mu.Lock()
	defer c.members.mu.Unlock()
	p, ok := c.members.peers[name]
	return p.addr, ok && name != c.cfg.NodeName
}

// sendChain seals and sends this node's chain message to one member.
func (c *Mesh) sendChain(to netip.AddrPort, want bool) {
	msg := c.chain.msgs[0]
	if want {
		msg = c.chain.msgs[1]
	}
	p := c.seal.seal(nil, msg)
	if err := c.tr.send(p, to); err != nil {
		c.cnt.sendErrors.Add(1)
		return
	}
	c.cnt.msgsSent.Add(1)
	c.cnt.bytesSent.Add(uint64(len(p)))
}

// receiveChain learns a member's certificate chain and, when asked,
// answers with this node's.
func (c *Mesh) receiveChain(m *wireMsg, now time.Time) bool {
	origin := string(m.origin)
	if origin == c.cfg.NodeName {
		return false
	}
	if !c.st.member(m.origin) {
		c.st.noteUnknown()
		return false
	}
	_, key, why, ok := c.keys.learn(m.chain, now)
	if !ok {
		c.st.rej.add(why)
		return false
	}
	if key.name != origin {
		c.st.rej.add(rejWrongName)
		return false
	}
	if m.want {
		c.queueChain(origin, false)
	}
	return c.st.prove(origin, key.notAfter)
}
