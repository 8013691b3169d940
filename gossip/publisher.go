package gossip

import (
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// publisher decides what this node sends. It reads its own figures every
// ChangeDelay (a poll) and every PublishInterval (a tick):
//
//   - at every poll, each figure that differs from what it last sent (a
//     request started or ended, a verdict changed, a backend went away)
//     travels at once, so a peer stops counting a request that ended
//     within one ChangeDelay plus transit instead of a PublishInterval;
//   - at every tick, also each figure that changed during the last
//     `resend` ticks (so a lost packet is repaired at the next tick), the
//     engine figures that changed, and every figure that counts
//     something every refreshTicks ticks (so receivers keep them fresh
//     and late or lossy receivers catch up).
//
// A figure that is 0, not failing and settled (unchanged for two
// refreshes) is not refreshed: a receiver counts a figure it does not
// hold as 0, and one it still holds expires. So an idle backend costs
// nothing on the wire, and a router's refresh carries only the backends
// it has requests open to (and those that just went idle), however large
// the fleet. That holds while every member counts a router's silence
// about a backend as a healthy verdict (skipZeros, Meta.Votes).
//
// A poll at which nothing changed sends nothing; changes within one
// ChangeDelay share a publish, so a node sends at most one publish per
// ChangeDelay.
type publisher struct {
	mu           sync.Mutex
	name         string
	instance     uint64
	src          LocalSource
	resend       uint64
	refreshTicks uint64
	engineExpire time.Duration
	// keepalive: every refresh sends a packet even with no figures, so
	// that the other nodes keep counting this one's silence about a
	// backend as a healthy verdict (View.Health), and, signed, do not
	// take an older run of it for the live one (state.signedOrder).
	keepalive bool
	// skipZeros: every member counts a router's silence about a backend
	// as a healthy verdict (Meta.Votes), so settled zeros may be left out
	// (counts). Until then, or while a member of an earlier version is
	// in the cluster, every figure is refreshed as before.
	skipZeros atomic.Bool

	tick        uint64 // ticks so far
	poll        uint64 // reads of the source so far (ticks included)
	seq         uint64
	lastRefresh uint64
	buf, prev   []BackendLoad // this read of the source and the one before
	loads       map[string]*pubLoad
	engines     map[string]*pubEngine
	entry       []byte
	health      []byte
	parts       []byte // a tagParts payload for the next tick (empty: none)
	hot         []byte // a tagHot payload for the next tick (empty: none)
	hotC        []byte // a tagHotCounts payload for the next tick (empty: none)
	cost        []byte // a tagCost payload for the next tick (empty: none)
	partTop     []PartLoad
	pk          packer
}

type pubLoad struct {
	v       int64
	failing bool
	unsent  bool   // changed since it was last sent
	changed uint64 // tick of the last change
	seen    uint64 // poll the source last reported the backend at
	removed bool   // gone from the source: sent as 0 for `resend` ticks
}

type pubEngine struct {
	s       EngineStats
	changed uint64
}

func newPublisher(name string, instance uint64, src LocalSource, cfg *Config) *publisher {
	refresh := uint64(cfg.RefreshInterval / cfg.PublishInterval)
	return &publisher{
		name:         name,
		instance:     instance,
		src:          src,
		resend:       uint64(cfg.ResendCount),
		refreshTicks: max(refresh, 1),
		engineExpire: cfg.EngineExpireAfter,
		loads:        make(map[string]*pubLoad),
		engines:      make(map[string]*pubEngine),
		keepalive:    true,
		pk:           packer{limit: maxPacket},
	}
}

// next is a tick: it returns the packets to send to every other member at
// now, or nil. The packets stay valid until the next call of next or
// changes.
func (p *publisher) next(now time.Time) [][]byte { return p.publish(now, true) }

// changes is a poll between ticks: it returns the packets carrying the
// figures that changed since they were last sent, or nil when none did.
func (p *publisher) changes(now time.Time) [][]byte { return p.publish(now, false) }

func (p *publisher) publish(now time.Time, tick bool) [][]byte {
	p.mu.Lock()
	defer p.mu.Unlock()
	if tick {
		p.tick++
	}
	p.poll++
	p.buf, p.prev = p.prev[:0], p.buf
	if p.src != nil {
		p.buf = p.src.AppendInFlight(p.buf)
	}
	// The common poll: the source reads as it did last time, so nothing
	// changed, nothing went away and nothing is unsent (every publish
	// sends what is). Entries keep their older seen: the next publish
	// that looks at them sets it for every backend it reads first.
	if !tick && slices.Equal(p.buf, p.prev) {
		return nil
	}
	for _, bl := range p.buf {
		e := p.loads[bl.Backend]
		switch {
		case e == nil:
			e = &pubLoad{v: bl.InFlight, failing: bl.Failing, unsent: true, changed: p.tick}
			p.loads[bl.Backend] = e
		case e.v != bl.InFlight || e.failing != bl.Failing || e.removed:
			e.v, e.failing, e.removed, e.unsent, e.changed = bl.InFlight, bl.Failing, false, true, p.tick
		}
		e.seen = p.poll
	}
	full := tick && (p.tick == 1 || p.tick-p.lastRefresh >= p.refreshTicks)
	if full {
		p.lastRefresh = p.tick
	}
	p.pk.reset(kindPublish, p.name, p.instance, p.seq+1)
	for k, e := range p.loads {
		if e.seen != p.poll {
			if !e.removed {
				e.v, e.failing, e.removed, e.unsent, e.changed = 0, false, true, true, p.tick
			} else if !e.unsent && p.tick-e.changed >= p.resend {
				delete(p.loads, k)
				continue
			}
		}
		if e.unsent || (tick && (p.tick-e.changed < p.resend || full && p.counts(e))) {
			e.unsent = false
			p.entry = appendLoad(p.entry[:0], k, e.v)
			p.health = p.health[:0]
			if e.failing {
				p.health = appendHealth(p.health, k, healthFailing)
			}
			p.pk.addLoad(p.entry, p.health)
		}
	}
	if tick {
		for k, e := range p.engines {
			age := now.Sub(e.s.Scraped)
			if age >= p.engineExpire {
				delete(p.engines, k)
				continue
			}
			if full || p.tick-e.changed < p.resend {
				p.entry = appendEngine(p.entry[:0], k, e.s, age)
				p.pk.addEngine(p.entry)
			}
		}
	}
	if tick && len(p.parts) > 0 {
		p.pk.addParts(p.parts)
		p.parts = p.parts[:0]
	}
	if tick && len(p.hot) > 0 {
		p.pk.addHot(p.hot)
		p.hot = p.hot[:0]
	}
	if tick && len(p.hotC) > 0 {
		p.pk.addHotCounts(p.hotC)
		p.hotC = p.hotC[:0]
	}
	if tick && len(p.cost) > 0 {
		p.pk.addCost(p.cost)
		p.cost = p.cost[:0]
	}
	pkts := p.pk.packets()
	if len(pkts) == 0 && full && p.keepalive {
		p.pk.flush()
		pkts = p.pk.out[:p.pk.n]
	}
	if len(pkts) > 0 {
		p.seq++
	}
	return pkts
}

// counts reports whether a refresh (or a push/pull state) carries e: it
// counts a request or a failing verdict, or went to 0 within the last
// two refreshes (so a receiver that lost those packets is repaired
// before its stale figure would expire), or some member of an earlier
// version counts only figures as health verdicts (skipZeros unset).
func (p *publisher) counts(e *pubLoad) bool {
	return e.v != 0 || e.failing || p.tick-e.changed < 2*p.refreshTicks || !p.skipZeros.Load()
}

// setEngine records engine stats scraped by this node. Changed figures
// go out at the next tick; unchanged ones only refresh their scrape time,
// which the next refresh carries.
func (p *publisher) setEngine(backend string, s EngineStats) {
	p.mu.Lock()
	defer p.mu.Unlock()
	e := p.engines[backend]
	if e == nil {
		e = &pubEngine{}
		p.engines[backend] = e
	} else if sameEngine(e.s, s) {
		e.s.Scraped = s.Scraped
		return
	}
	e.s = s
	e.changed = p.tick + 1
}

// setParts queues the tagParts payload of loads (see appendParts) for the
// next tick, which sends it once: a lost one is replaced by the next.
func (p *publisher) setParts(loads []uint32, min uint32) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(loads) == 0 || len(loads) > MaxPartitions {
		p.parts = p.parts[:0]
		return
	}
	p.parts, p.partTop = appendParts(p.parts[:0], loads, min, p.partTop)
}

// setHot queues the tagHot and tagHotCounts payloads of list (see
// appendHot and appendHotCounts) for the next tick, which sends them
// once: a lost one is replaced by the next. partitions 0 sends no counts.
func (p *publisher) setHot(total uint64, partitions int, list []HotPrefix) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.hot = appendHot(p.hot[:0], list)
	p.hotC = p.hotC[:0]
	if partitions > 0 && partitions <= MaxPartitions {
		p.hotC = appendHotCounts(p.hotC, total, partitions, list)
	}
}

// setCost queues the tagCost payload of f for the next tick, which sends
// it once: a lost one is replaced by the next.
func (p *publisher) setCost(f CostFigure) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cost = appendCost(p.cost[:0], f)
}

// ownBlock appends this node's block with all its current figures, under
// a new seq (for memberlist push/pull), and chain in a tagChain section
// when not nil.
func (p *publisher) ownBlock(dst []byte, now time.Time, chain [][]byte) []byte {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.seq++
	var loads, engines, health []byte
	for k, e := range p.loads {
		if !e.removed && p.counts(e) {
			loads = appendLoad(loads, k, e.v)
			if e.failing {
				health = appendHealth(health, k, healthFailing)
			}
		}
	}
	for k, e := range p.engines {
		if age := now.Sub(e.s.Scraped); age < p.engineExpire {
			engines = appendEngine(engines, k, e.s, age)
		}
	}
	body := appendBlockHead(nil, p.name, p.instance, p.seq)
	body = appendSection(body, tagLoads, loads)
	body = appendSection(body, tagEngine, engines)
	body = appendSection(body, tagHealth, health)
	if chain != nil {
		body = appendSection(body, tagChain, appendChain(nil, chain))
	}
	return appendBlock(dst, body)
}

// bye returns the packet announcing that this node leaves.
func (p *publisher) bye() []byte {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.seq++
	var pk packer
	pk.limit = maxPacket
	pk.reset(kindBye, p.name, p.instance, p.seq)
	pk.flush()
	return pk.out[0]
}
