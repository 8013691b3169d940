package gossip

import "time"

// Views: a change (a figure, a member, a sweep of expired figures) signals
// viewLoop, which builds a new View, swaps it in and wakes the subscribers.
// Readers never take a lock.

// View returns the current snapshot. It never blocks.
func (c *Mesh) View() *View { return c.view.Load() }

// Subscribe returns a channel that receives a value after the View
// changes (figures or membership). Notifications are coalesced: the
// channel has a buffer of one and the Mesh never blocks on it, so a
// slow reader sees one notification for many changes and should then read
// View. The channel is closed by Close. cancel unsubscribes.
func (c *Mesh) Subscribe() (<-chan struct{}, func()) { return c.subs.Subscribe() }

func (c *Mesh) signal() {
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

func (c *Mesh) viewLoop() {
	defer c.wg.Done()
	sweep := min(c.cfg.ExpireAfter, c.cfg.EngineExpireAfter) / 10
	sweep = min(max(sweep, 10*time.Millisecond), 250*time.Millisecond)
	t := time.NewTicker(sweep)
	defer t.Stop()
	for {
		select {
		case <-c.stop:
			return
		case <-c.kick:
		case now := <-t.C:
			c.st.sweep(now)
		}
		if v := c.st.build(c.view.Load()); v != nil {
			c.view.Store(v)
			c.cnt.viewUpdates.Add(1)
			c.subs.Notify()
		}
	}
}
