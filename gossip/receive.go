package gossip

import (
	"math"
	"time"
)

// Receiving the other nodes' figures: load packets from the transport and
// push/pull states from memberlist, opened, checked (signed, with an
// Identity) and applied to the state.

// receivePacket returns the transport's handler for load packets. It runs
// on the transport's read loop only, so one set of scratch buffers serves.
func (c *Mesh) receivePacket() func([]byte) {
	scratch := make([]byte, 0, udpReadBuf)
	rx := new(rxScratch)
	return func(b []byte) {
		msg, err := c.seal.open(scratch, b)
		if err != nil {
			c.cnt.msgsRecv.Add(1)
			c.cnt.bytesRecv.Add(uint64(len(b)))
			c.cnt.malformed.Add(1)
			return
		}
		c.receive(msg, rx)
	}
}

// rxScratch is the decoding and verification scratch of one receiving
// goroutine.
type rxScratch struct {
	msg wireMsg
	sig []byte
}

// receive applies a message from another node (UDP or push/pull).
func (c *Mesh) receive(b []byte, rx *rxScratch) {
	c.cnt.msgsRecv.Add(1)
	c.cnt.bytesRecv.Add(uint64(len(b)))
	now := time.Now()
	var changed bool
	if c.sign == nil {
		var err error
		if changed, err = c.st.handle(b, now); err != nil {
			c.cnt.malformed.Add(1)
			return
		}
	} else {
		if err := rx.msg.decode(b); err != nil {
			c.cnt.malformed.Add(1)
			return
		}
		changed = c.receiveSigned(&rx.msg, now, &rx.sig)
	}
	if changed {
		c.signal()
	}
}

// receiveSigned checks a decoded message the way a node with an Identity
// must, cheapest checks first, and applies it when it passes. It reports
// whether a View needs building.
func (c *Mesh) receiveSigned(m *wireMsg, now time.Time, scratch *[]byte) bool {
	if m.version != wireV2 {
		c.st.rej.add(rejUnsigned)
		return false
	}
	if m.kind == kindChain {
		return c.receiveChain(m, now)
	}
	blk := &m.blocks[0]
	if string(blk.origin) == c.cfg.NodeName {
		return false
	}
	if !c.st.member(blk.origin) {
		c.st.noteUnknown()
		return false
	}
	if skew, ok := clockSkew(m.sentAt, now); !ok {
		c.st.rej.add(rejClockSkew)
		c.warnSkew(string(blk.origin), skew)
		return false
	}
	key := c.keys.lookup(m.key, now)
	if key == nil && len(blk.chain) > 0 {
		id, k, why, ok := c.keys.learn(blk.chain, now)
		if !ok {
			c.st.rej.add(why)
			return false
		}
		if id == m.key {
			key = k
		}
	}
	if key == nil {
		c.st.rej.add(rejUnknownKey)
		c.queueChain(string(blk.origin), true)
		return false
	}
	if key.name != string(blk.origin) {
		c.st.rej.add(rejWrongName)
		return false
	}
	// A replayed or reordered block would change nothing: skip the
	// signature check.
	if !c.st.fresh(m.kind, blk, now) {
		c.st.noteStale()
		return false
	}
	if !key.verifySig(m.signed, m.sig, scratch) {
		c.st.rej.add(rejBadSignature)
		return false
	}
	proved := c.st.prove(key.name, key.notAfter)
	return c.st.apply(m, now) || proved
}

// clockSkew returns how far sentAt (ms since the epoch) is from now, and
// whether that is within maxClockSkew.
func clockSkew(sentAt uint64, now time.Time) (time.Duration, bool) {
	ms := uint64(now.UnixMilli())
	d := ms - sentAt
	if sentAt > ms {
		d = sentAt - ms
	}
	if d > uint64(maxClockSkew/time.Millisecond) {
		if d > uint64(math.MaxInt64/int64(time.Millisecond)) {
			return math.MaxInt64, false
		}
		return time.Duration(d) * time.Millisecond, false
	}
	return time.Duration(d) * time.Millisecond, true
}

// warnSkew logs, at most once a minute, that a member's signed messages
// are refused for their send time.
func (c *Mesh) warnSkew(origin string, skew time.Duration) {
	now := time.Now().UnixNano()
	last := c.skewWarned.Load()
	if now-last < int64(time.Minute) || !c.skewWarned.CompareAndSwap(last, now) {
		return
	}
	c.log.Warn("gossip: refusing signed figures sent too far from this node's clock (a replay, or clocks out of sync)",
		"from", origin, "skew", skew, "max", maxClockSkew)
}

// mergeState applies a push/pull state from another node.
func (c *Mesh) mergeState(b []byte) {
	if len(b) == 0 {
		return
	}
	if len(b) > maxStateBytes {
		c.st.rej.add(rejStateSize)
		return
	}
	c.receive(b, new(rxScratch))
}
