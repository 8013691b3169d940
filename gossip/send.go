package gossip

import "time"

// Sending this node's figures: publishLoop reads them every ChangeDelay
// and sends what changed, sendAll signs, seals and sends packets straight
// to every other live member, and localState is the push/pull payload.

// publishLoop reads this node's figures every ChangeDelay and sends what
// changed at once (in a large cluster at most once per changeInterval);
// every PublishInterval (to within one ChangeDelay, on
// average exactly) the read is a tick, which also resends recent changes
// and refreshes. One publish per ChangeDelay at most: a ticker drops the
// ticks a slow loop misses rather than bunching them.
func (c *Mesh) publishLoop() {
	defer close(c.pubDone)
	every, poll := c.cfg.PublishInterval, c.cfg.ChangeDelay
	t := time.NewTicker(poll)
	defer t.Stop()
	// Half a poll early, so that timer jitter does not push a tick to
	// the poll after.
	due := time.Now().Add(every - poll/2)
	var last time.Time // the last publish
	for {
		select {
		case <-c.stopPub:
			return
		case now := <-t.C:
			var pkts [][]byte
			if !now.Before(due) {
				if due = due.Add(every); due.Before(now) {
					due = now.Add(every - poll/2) // fell behind: no catching up
				}
				pkts = c.pub.next(now)
			} else if now.Sub(last) >= c.changeInterval()-poll/2 {
				pkts = c.pub.changes(now)
			}
			if len(pkts) > 0 {
				c.sendAll(pkts)
				last = now
			}
		}
	}
}

// changeInterval is the shortest time between two publishes of changes:
// ChangeDelay, or longer in a cluster so large that every peer's changes
// at once would exceed ChangeBudget publishes per second at each
// receiver (Config.ChangeBudget).
func (c *Mesh) changeInterval() time.Duration {
	peers := len(*c.members.sendList.Load())
	return max(c.cfg.ChangeDelay, min(c.cfg.PublishInterval, time.Duration(peers)*time.Second/time.Duration(c.cfg.ChangeBudget)))
}

// sendScratch holds sendAll's buffers, reused from one publish to the next:
// the publish loop's, then, once it has stopped, Close's.
type sendScratch struct {
	sealed   [][]byte // sealed packets
	signed   []byte   // a signed packet
	sigInput []byte   // signed input
}

// sendAll signs (with an Identity) and seals every packet once and sends
// it straight to every other live member.
func (c *Mesh) sendAll(pkts [][]byte) {
	for len(c.scratch.sealed) < len(pkts) {
		c.scratch.sealed = append(c.scratch.sealed, nil)
	}
	sealed := c.scratch.sealed[:len(pkts)]
	now := time.Now()
	n := 0
	for _, p := range pkts {
		if c.sign != nil {
			var err error
			if c.scratch.signed, err = c.sign.sign(c.scratch.signed[:0], p, now, &c.scratch.sigInput); err != nil {
				c.cnt.sendErrors.Add(1)
				c.log.Warn("gossip: cannot sign", "err", err)
				continue
			}
			p = c.scratch.signed
		}
		sealed[n] = c.seal.seal(sealed[n][:0], p)
		n++
	}
	sealed = sealed[:n]
	for _, to := range *c.members.sendList.Load() {
		for _, p := range sealed {
			if err := c.tr.send(p, to); err != nil {
				c.cnt.sendErrors.Add(1)
				continue
			}
			c.cnt.msgsSent.Add(1)
			c.cnt.bytesSent.Add(uint64(len(p)))
		}
	}
}

// localState is this node's push/pull payload. Without an Identity: its
// own figures and the fresh figures it holds from every other node, so a
// joining node converges in one exchange. With one: its own figures and
// its certificate chain, signed (other nodes' figures cannot be
// verified, so each node's reach a joiner directly, within a
// RefreshInterval).
func (c *Mesh) localState() []byte {
	now := time.Now()
	b := appendHeader(nil, kindState)
	if c.sign == nil {
		b = c.pub.ownBlock(b, now, nil)
		return c.st.appendRelay(b, now)
	}
	b = c.pub.ownBlock(b, now, c.sign.chain)
	var scratch []byte
	out, err := c.sign.sign(nil, b, now, &scratch)
	if err != nil || len(out) > maxStateBytes {
		c.log.Warn("gossip: cannot send this node's state", "err", err, "bytes", len(out))
		return nil
	}
	return out
}
