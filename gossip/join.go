package gossip

import (
	"context"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync/atomic"
	"time"
)

// Joining: the seeds at start (retried in the background until another
// node is a member), the seeds again when alone, and members that failed,
// so both sides of a healed partition find each other again.

// joinState is how joining the seeds goes.
type joinState struct {
	joined     atomic.Bool // some other node has been a member
	seedWarned atomic.Bool // warned that every seed is this node
	// The start of the current run of failed joins, and the last warning
	// of that run; joinSeeds only.
	failingSince time.Time
	warned       time.Time
}

// joinWarnAfter is how long joining the seeds may fail before it is
// logged as a warning; joinWarnEvery how often it is warned about again
// while it keeps failing (each attempt is logged at debug).
const (
	joinWarnAfter = 10 * time.Second
	joinWarnEvery = 30 * time.Second
)

// joinSeeds resolves the seeds and joins them. It reports whether another
// node is now a member. When none could be joined it logs each seed's
// failure, with what it usually means.
func (c *Mesh) joinSeeds() bool {
	addrs := c.resolveSeeds()
	if len(addrs) == 0 {
		return false
	}
	n, err := c.ml.Join(addrs)
	if err != nil && n == 0 {
		now := time.Now()
		if c.join.failingSince.IsZero() {
			c.join.failingSince = now
		}
		// Routers started together try each other before all listen: a
		// join that succeeds within joinWarnAfter is no problem.
		lv := slog.LevelDebug
		if now.Sub(c.join.failingSince) >= joinWarnAfter && now.Sub(c.join.warned) >= joinWarnEvery {
			lv, c.join.warned = slog.LevelWarn, now
		}
		// memberlist joins the seeds one by one and gathers their errors.
		errs := []error{err}
		if me, ok := err.(interface{ WrappedErrors() []error }); ok && len(me.WrappedErrors()) > 0 {
			errs = me.WrappedErrors()
		}
		for _, e := range errs {
			attrs := []any{"failing_for", now.Sub(c.join.failingSince).Round(time.Millisecond), "err", e}
			if h := joinHint(e); h != "" {
				attrs = append(attrs, "hint", h)
			}
			c.log.Log(context.Background(), lv, "gossip join failed; retrying in the background", attrs...)
		}
		return false
	}
	attrs := []any{"contacted", n, "members", c.ml.NumMembers()}
	if !c.join.failingSince.IsZero() {
		attrs = append(attrs, "after_failing_for", time.Since(c.join.failingSince).Round(time.Millisecond))
	}
	c.join.failingSince, c.join.warned = time.Time{}, time.Time{}
	c.log.Info("gossip joined", attrs...)
	return c.ml.NumMembers() > 1
}

// joinHint says what a seed's join error usually means, or "".
func joinHint(err error) string {
	msg := err.Error()
	switch {
	case strings.Contains(msg, "decrypt"), strings.Contains(msg, "not encrypted"), strings.Contains(msg, "Encryption"):
		return "the seed and this router do not share a gossip key: give every router the same --gossip-key-file (or WARMROUTE_GOSSIP_KEY)"
	case strings.Contains(msg, "connection refused"):
		return "nothing listens there: check that the seed router runs and that the address is its --gossip-listen (or --gossip-advertise)"
	case strings.Contains(msg, "i/o timeout"), strings.Contains(msg, "no route to host"):
		return "no answer from the seed: check the address and that a firewall lets gossip (TCP and UDP) through"
	}
	return ""
}

// resolveSeeds turns the Join list into ip:port addresses, every A/AAAA
// record of a name included, without this node's own address. When two
// or more seeds were all this node's own address, it warns (once): the
// node joins no one.
func (c *Mesh) resolveSeeds() []string {
	self, _ := netip.ParseAddrPort(c.addr)
	bind := netip.IPv4Unspecified()
	if c.cfg.BindAddr != "" {
		bind, _ = netip.ParseAddr(c.cfg.BindAddr)
	}
	var local []netip.Addr
	if bind.IsUnspecified() {
		local = interfaceAddrs()
	}
	isSelf := selfMatcher(self, bind, uint16(c.tr.port), local)
	seen := make(map[string]bool)
	var out []string
	var selfSeeds []string
	for _, s := range c.cfg.Join {
		host, port, err := splitSeed(s, c.cfg.seedPort())
		if err != nil {
			continue
		}
		var ips []netip.Addr
		if a, err := netip.ParseAddr(host); err == nil {
			ips = []netip.Addr{a}
		} else {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			res, err := net.DefaultResolver.LookupNetIP(ctx, "ip", host)
			cancel()
			if err != nil {
				c.log.Warn("gossip seed does not resolve", "seed", s, "err", err)
				continue
			}
			ips = res
		}
		onlySelf := len(ips) > 0
		for _, ip := range ips {
			if isSelf(ip, uint16(port)) {
				continue
			}
			onlySelf = false
			a := netip.AddrPortFrom(ip.Unmap(), uint16(port)).String()
			if !seen[a] {
				seen[a] = true
				out = append(out, a)
			}
		}
		if onlySelf {
			selfSeeds = append(selfSeeds, s)
		}
	}
	if len(out) == 0 && len(selfSeeds) > 1 && !c.join.seedWarned.Swap(true) {
		c.log.Warn("gossip: every seed is this node's own address, so it joins no one; "+
			"nodes sharing a port on one host must each bind their own address",
			"seeds", selfSeeds, "addr", c.addr, "bind", c.cfg.BindAddr)
	}
	return out
}

// selfMatcher returns a function reporting whether a seed address is this
// node: its advertised address and port, its bound address and port, or,
// bound to all addresses, any loopback, unspecified or interface address
// (local) with its port. Another loopback address with the same port is
// another node (127.0.0.0/8 all reaches this host).
func selfMatcher(adv netip.AddrPort, bind netip.Addr, port uint16, local []netip.Addr) func(netip.Addr, uint16) bool {
	bind = bind.Unmap()
	return func(a netip.Addr, p uint16) bool {
		a = a.Unmap()
		if a == adv.Addr().Unmap() && p == adv.Port() {
			return true
		}
		if p != port {
			return false
		}
		if !bind.IsUnspecified() {
			return a == bind
		}
		return a.IsLoopback() || a.IsUnspecified() || slices.Contains(local, a)
	}
}

// interfaceAddrs returns this host's interface addresses.
func interfaceAddrs() []netip.Addr {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil
	}
	var out []netip.Addr
	for _, a := range addrs {
		if p, err := netip.ParsePrefix(a.String()); err == nil {
			out = append(out, p.Addr().Unmap())
		}
	}
	return out
}

// joinLoop retries the seeds until another node is a member, then every
// RejoinInterval rejoins the seeds when alone and tries members that
// failed, so both sides of a healed partition find each other again.
func (c *Mesh) joinLoop() {
	defer c.wg.Done()
	if c.ml.NumMembers() > 1 {
		c.join.joined.Store(true)
	}
	backoff := 200 * time.Millisecond
	t := time.NewTimer(c.cfg.RejoinInterval)
	defer t.Stop()
	for {
		wait := c.cfg.RejoinInterval
		if len(c.cfg.Join) > 0 && !c.join.joined.Load() {
			wait = min(backoff, c.cfg.RejoinInterval)
			backoff *= 2
		}
		t.Reset(wait)
		select {
		case <-c.stop:
			return
		case <-t.C:
		}
		if len(c.cfg.Join) > 0 && c.ml.NumMembers() <= 1 {
			if c.joinSeeds() {
				c.join.joined.Store(true)
			}
		}
		if addrs := c.failedAddrs(time.Now()); len(addrs) > 0 {
			if n, _ := c.ml.Join(addrs); n > 0 {
				c.log.Info("gossip reconnected to failed members", "contacted", n)
			}
		}
	}
}

// maxReconnects bounds the failed members tried per round: Join dials
// them one after another, and Close waits for a round in progress.
const maxReconnects = 3

// failedAddrs returns up to maxReconnects addresses of members declared
// dead within failedRetention (map order picks them at random).
func (c *Mesh) failedAddrs(now time.Time) []string {
	c.members.mu.Lock()
	defer c.members.mu.Unlock()
	var out []string
	for name, f := range c.members.failed {
		if now.Sub(f.since) > failedRetention {
			delete(c.members.failed, name)
			continue
		}
		if len(out) < maxReconnects {
			out = append(out, f.addr)
		}
	}
	return out
}
