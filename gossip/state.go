package gossip

import (
	"encoding/binary"
	"math"
	"slices"
	"sync"
	"time"
)

// state holds the latest figures from every other node. Messages are
// decoded and applied under mu; per-backend sums are kept incrementally so
// building a View costs a copy of one small map.
//
// With signed set (the node has an Identity) only verified messages reach
// apply, and the order of one node's messages is strict, so a replayed
// signed message changes nothing: within a run seq must grow (the packets
// of one multi-packet publish share a seq and are accepted for
// sameSeqWindow after the first), a duplicate never refreshes a figure's
// age, and there are no relayed figures. The Mesh also drops signed
// messages sent more than maxClockSkew from this node's clock.
type state struct {
	mu           sync.Mutex
	self         string
	expire       time.Duration
	engineExpire time.Duration
	signed       bool
	rej          *rejects

	nodes map[string]*remoteNode // live members except self
	sums  map[string]*agg        // backend -> sum over nodes' fresh figures
	local map[string]EngineStats // engine stats scraped by this node

	// Views share an immutable backend -> slot index while the set of
	// backends stays the same, and copy only the sums.
	slots      []*agg // by slot; nil once a backend is gone
	index      map[string]int
	indexDirty bool

	loadDirty, engineDirty, memberDirty, healthDirty bool

	msg wireMsg // decode scratch, guarded by mu

	unknown uint64 // blocks from nodes that are not (or no longer) members
	stale   uint64 // blocks from an older run of a node, or after its bye
}

type remoteNode struct {
	instance  uint64
	closed    bool // said bye in this instance
	lastHeard time.Time
	// voting: heard from directly (not through another node's push/pull
	// relay) within expire, at directAt, and not gone: its silence about
	// a backend says the backend is healthy (see View.Health).
	voting   bool
	directAt time.Time
	loads    map[string]*loadEntry
	engines  map[string]*EngineStats
	// The node's last tagParts section: its ring's partition count, its
	// busiest partitions, and when it arrived.
	parts   uint64
	partsAt time.Time
	partLd  []PartLoad
	// The node's last tagHotCounts section and when it arrived.
	hot      []HotPrefix
	hotTotal uint64
	hotParts uint64
	hotAt    time.Time
	// The node's last tagCost section and when it arrived.
	cost   CostFigure
	costAt time.Time

	// Signed mode only.
	heard       bool      // a block of some run was accepted
	maxSeq      uint64    // highest seq accepted in this run
	maxSeqAt    time.Time // when it was first accepted
	proven      bool      // its name is proven by a verified chain
	provenUntil time.Time
}

type loadEntry struct {
	v       int64
	failing bool // the node sees the backend failing
	seq     uint64
	at      time.Time // when the figure was fresh (receipt time minus its age)
	agg     *agg      // the backend's sum this figure is part of
}

type agg struct {
	key  string
	slot int
	sum  int64
	n    int // figures summed
}

func newState(self string, expire, engineExpire time.Duration) *state {
	return &state{
		self:         self,
		expire:       expire,
		engineExpire: engineExpire,
		nodes:        make(map[string]*remoteNode),
		sums:         make(map[string]*agg),
		local:        make(map[string]EngineStats),
		memberDirty:  true,
		rej:          new(rejects),
	}
}

// join records a live member.
func (s *state) join(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.memberDirty = true
	if name == s.self {
		return
	}
	if _, ok := s.nodes[name]; !ok {
		s.nodes[name] = &remoteNode{loads: make(map[string]*loadEntry), engines: make(map[string]*EngineStats)}
	}
}

// leave drops a member and all its figures. It reports whether the
// member said goodbye first (a graceful leave rather than a failure).
func (s *state) leave(name string) (saidBye bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.memberDirty = true
	if n, ok := s.nodes[name]; ok {
		saidBye = n.closed
		s.resetNode(n)
		s.silence(n)
		delete(s.nodes, name)
	}
	return saidBye
}

// touch marks the membership changed (a member's metadata changed).
func (s *state) touch() {
	s.mu.Lock()
	s.memberDirty = true
	s.mu.Unlock()
}

// handle decodes and applies one message received at now, as a node
// without an Identity does (version 2 messages are taken unverified; chain
// messages mean nothing to it). It reports whether a View needs building.
func (s *state) handle(b []byte, now time.Time) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.msg.decode(b); err != nil {
		return false, err
	}
	if s.msg.kind == kindChain {
		return false, nil
	}
	return s.applyLocked(&s.msg, now), nil
}

// apply applies a decoded message whose signature was verified (signed
// mode). It reports whether a View needs building.
func (s *state) apply(m *wireMsg, now time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.applyLocked(m, now)
}

func (s *state) applyLocked(m *wireMsg, now time.Time) bool {
	for i := range m.blocks {
		blk := &m.blocks[i]
		switch {
		case s.signed:
			s.applySigned(m.kind, blk, now)
		case m.kind == kindBye:
			s.bye(blk)
		default:
			s.applyBlock(blk, now)
		}
	}
	// True also when an earlier change is not built yet: harmless.
	return s.loadDirty || s.engineDirty || s.healthDirty
}

// member reports whether name is a live member other than this node.
func (s *state) member(name []byte) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.nodes[string(name)] != nil
}

// prove records that name's chain was verified, valid until until. It
// reports whether that changes the members a View lists.
func (s *state) prove(name string, until time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := s.nodes[name]
	if n == nil {
		return false
	}
	if until.After(n.provenUntil) {
		n.provenUntil = until
	}
	if n.proven {
		return false
	}
	n.proven = true
	s.memberDirty = true
	return true
}

// isProven reports whether name's chain was verified (this node: always).
func (s *state) isProven(name string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := s.nodes[name]
	return name == s.self || (n != nil && n.proven)
}

// sameSeqWindow is how long after a seq was first accepted other packets
// with the same seq (one publish split over packets) are accepted.
func (s *state) sameSeqWindow() time.Duration { return min(time.Second, s.expire/2) }

// order is what a signed block means for its node.
type order uint8

const (
	orderStale  order = iota // a replay, a reordered packet, or after a bye
	orderSame                // the current run, a newer seq
	orderNewRun              // a new run (or the first heard)
)

// signedOrder decides, without changing anything, what a signed block
// of kind with instance and seq from n means at now.
func (s *state) signedOrder(n *remoteNode, kind byte, instance, seq uint64, now time.Time) order {
	switch {
	case n.heard && instance == n.instance:
		if n.closed {
			return orderStale
		}
		if seq > n.maxSeq || (seq == n.maxSeq && kind != kindBye && now.Sub(n.maxSeqAt) < s.sameSeqWindow()) {
			return orderSame
		}
		return orderStale
	case !n.heard || instance > n.instance:
		return orderNewRun
	case kind != kindBye && now.Sub(n.lastHeard) > s.expire:
		// The newer run went quiet for longer than figures live (or
		// the node's clock went back): follow the one that talks. A
		// replay of an older run's packets cannot use this: they are
		// older than maxClockSkew unless that run ended less than that
		// ago.
		return orderNewRun
	}
	return orderStale
}

// fresh reports whether a signed block would be applied (a replayed or
// reordered one would not), so that its signature need not be checked.
func (s *state) fresh(kind byte, blk *wireBlock, now time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := s.nodes[string(blk.origin)]
	return n != nil && s.signedOrder(n, kind, blk.instance, blk.seq, now) != orderStale
}

// remoteSender returns the member that sent blk, or nil: for this node's
// own blocks, and for a sender that is no member (counted as unknown).
func (s *state) remoteSender(blk *wireBlock) *remoteNode {
	if string(blk.origin) == s.self {
		return nil
	}
	n := s.nodes[string(blk.origin)]
	if n == nil {
		s.unknown++
	}
	return n
}

func (s *state) applySigned(kind byte, blk *wireBlock, now time.Time) {
	n := s.remoteSender(blk)
	if n == nil {
		return
	}
	switch s.signedOrder(n, kind, blk.instance, blk.seq, now) {
	case orderStale:
		s.stale++
		return
	case orderNewRun:
		s.resetNode(n)
		n.instance, n.closed, n.heard = blk.instance, false, true
		n.maxSeq, n.maxSeqAt = blk.seq, now
	case orderSame:
		if blk.seq > n.maxSeq {
			n.maxSeq, n.maxSeqAt = blk.seq, now
		}
	}
	if kind == kindBye {
		s.resetNode(n)
		s.silence(n)
		n.closed = true
		return
	}
	s.heard(n, now)
	s.applyFigures(n, blk, now)
}

func (s *state) bye(blk *wireBlock) {
	n := s.nodes[string(blk.origin)]
	if n == nil {
		s.unknown++
		return
	}
	if blk.instance < n.instance {
		s.stale++
		return
	}
	s.resetNode(n)
	s.silence(n)
	n.instance = blk.instance
	n.closed = true
}

func (s *state) applyBlock(blk *wireBlock, now time.Time) {
	n := s.remoteSender(blk)
	if n == nil {
		return
	}
	switch {
	case blk.instance > n.instance:
		// A new run of the node (or the first we hear of it).
		s.resetNode(n)
		n.instance, n.closed = blk.instance, false
	case blk.instance < n.instance:
		if now.Sub(n.lastHeard) <= s.expire {
			s.stale++
			return
		}
		// The newer run went quiet for longer than figures live (or
		// the node's clock went back): follow the one that talks.
		s.resetNode(n)
		n.instance, n.closed = blk.instance, false
	}
	if n.closed {
		s.stale++
		return
	}
	n.lastHeard = now
	if !blk.relays {
		s.heard(n, now)
	}
	s.applyFigures(n, blk, now)
}

// heard notes that n spoke to this node at now: it votes on backends'
// health.
func (s *state) heard(n *remoteNode, now time.Time) {
	n.lastHeard, n.directAt = now, now
	if !n.voting {
		n.voting = true
		s.healthDirty = true
	}
}

// silence takes n's votes away (it said bye, left, or went quiet).
func (s *state) silence(n *remoteNode) {
	if n.voting {
		n.voting = false
		s.healthDirty = true
	}
}

// validEngine reports whether engine figures are in range: finite, usage
// and hit rate in [0, 1], running and waiting in [0, MaxEngineRequests].
func validEngine(st EngineStats) bool {
	for _, f := range [...]float64{st.KVUsage, st.Running, st.Waiting, st.PrefixHitRate} {
		if math.IsNaN(f) || f < 0 {
			return false
		}
	}
	return st.KVUsage <= 1 && st.PrefixHitRate <= 1 && st.Running <= MaxEngineRequests && st.Waiting <= MaxEngineRequests
}

// applyFigures applies the figures of a block accepted from n. Figures out
// of range, and new backends beyond MaxBackends per node, are dropped and
// counted.
func (s *state) applyFigures(n *remoteNode, blk *wireBlock, now time.Time) {
	if blk.parts != 0 && !blk.relays {
		n.parts, n.partsAt = blk.parts, now
		n.partLd = append(n.partLd[:0], blk.partLoad...)
	}
	if blk.hasHotC && !blk.relays {
		n.hot, n.hotAt = append(n.hot[:0], blk.hotCounts...), now
		n.hotTotal, n.hotParts = blk.hotTotal, blk.hotParts
	}
	if blk.hasCost && !blk.relays {
		n.cost, n.costAt = blk.cost, now
	}
	for i := range blk.loads {
		l := &blk.loads[i]
		if l.inFlight < 0 || l.inFlight > MaxInFlight || l.age > maxAge {
			s.rej.add(rejRange)
			continue
		}
		if l.age >= s.expire {
			continue
		}
		at := now.Add(-l.age)
		e := n.loads[string(l.backend)]
		if e == nil {
			if len(n.loads) >= MaxBackends {
				s.rej.add(rejTooMany)
				continue
			}
			key := string(l.backend)
			n.loads[key] = &loadEntry{v: l.inFlight, failing: l.failing, seq: l.seq, at: at, agg: s.addFigure(key, l.inFlight, l.failing)}
			continue
		}
		switch {
		case l.seq > e.seq:
			if l.inFlight != e.v {
				e.agg.sum += l.inFlight - e.v
				e.v = l.inFlight
				s.loadDirty = true
			}
			if !l.relay && l.failing != e.failing {
				e.failing = l.failing
				s.healthDirty = true
			}
			e.seq = l.seq
			if at.After(e.at) {
				e.at = at
			}
		case l.seq == e.seq && at.After(e.at) && !s.signed:
			// A relayed copy of the same figure, younger than the
			// one held. (Signed figures are never relayed: an equal
			// seq is a duplicate or a replay.)
			e.at = at
		}
	}
	for i := range blk.engines {
		we := &blk.engines[i]
		if !validEngine(we.stats) || we.age > maxAge {
			s.rej.add(rejRange)
			continue
		}
		if we.age >= s.engineExpire {
			continue
		}
		st := we.stats
		st.Scraped = now.Add(-we.age)
		cur := n.engines[string(we.backend)]
		if cur == nil {
			if len(n.engines) >= MaxBackends {
				s.rej.add(rejTooMany)
				continue
			}
			n.engines[string(we.backend)] = &st
			s.engineDirty = true
			continue
		}
		if !st.Scraped.After(cur.Scraped) {
			continue
		}
		if !sameEngine(*cur, st) || st.Scraped.Sub(cur.Scraped) > engineRescrapeGap {
			s.engineDirty = true
		}
		*cur = st
	}
}

// addParts adds to dst (indexed by partition, len(dst) partitions) the
// partition counts of every node heard from within maxAge whose ring has
// as many partitions, and returns how many nodes it added.
func (s *state) addParts(dst []uint64, maxAge time.Duration, now time.Time) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	nodes := 0
	for _, n := range s.nodes {
		if n.closed || n.parts != uint64(len(dst)) || now.Sub(n.partsAt) > maxAge {
			continue
		}
		nodes++
		for _, e := range n.partLd {
			dst[e.Partition] += uint64(e.Count)
		}
	}
	return nodes
}

// hotReports appends to dst the counted hot prefixes of every node heard
// from within maxAge, with the partition counts it published within
// partsAge.
func (s *state) hotReports(dst []HotReport, maxAge, partsAge time.Duration, now time.Time) []HotReport {
	s.mu.Lock()
	defer s.mu.Unlock()
	for name, n := range s.nodes {
		if n.closed || n.hotAt.IsZero() || now.Sub(n.hotAt) > maxAge {
			continue
		}
		r := HotReport{Node: name, Total: n.hotTotal, Partitions: n.hotParts, Prefixes: slices.Clone(n.hot)}
		if n.parts == n.hotParts && now.Sub(n.partsAt) <= partsAge {
			r.Parts = slices.Clone(n.partLd)
		}
		dst = append(dst, r)
	}
	return dst
}

// costReports appends to dst the cost figures of every node heard from
// within maxAge.
func (s *state) costReports(dst []CostReport, maxAge time.Duration, now time.Time) []CostReport {
	s.mu.Lock()
	defer s.mu.Unlock()
	for name, n := range s.nodes {
		if n.closed || n.costAt.IsZero() || now.Sub(n.costAt) > maxAge {
			continue
		}
		dst = append(dst, CostReport{Node: name, CostFigure: n.cost})
	}
	return dst
}

// engineRescrapeGap: a newer scrape with identical figures rebuilds the
// View only when it is this much newer (re-sent copies of one scrape
// differ by rounding).
const engineRescrapeGap = 500 * time.Millisecond

func sameEngine(a, b EngineStats) bool {
	return a.KVUsage == b.KVUsage && a.Running == b.Running && a.Waiting == b.Waiting &&
		a.PrefixHitRate == b.PrefixHitRate && a.Known == b.Known && a.OK == b.OK
}

// addFigure adds a new figure v for backend key, failing or not, and
// returns the backend's sum.
func (s *state) addFigure(key string, v int64, failing bool) *agg {
	a := s.sums[key]
	if a == nil {
		a = &agg{key: key, slot: len(s.slots)}
		s.sums[key] = a
		s.slots = append(s.slots, a)
		s.indexDirty = true
	}
	a.sum += v
	a.n++
	s.loadDirty = true
	if failing {
		s.healthDirty = true
	}
	return a
}

// removeFigure takes figure e out of its backend's sum.
func (s *state) removeFigure(e *loadEntry) {
	a := e.agg
	a.sum -= e.v
	a.n--
	if a.n <= 0 {
		delete(s.sums, a.key)
		s.slots[a.slot] = nil
		s.indexDirty = true
	}
	s.loadDirty = true
	if e.failing {
		s.healthDirty = true
	}
}

func (s *state) resetNode(n *remoteNode) {
	for k, e := range n.loads {
		s.removeFigure(e)
		delete(n.loads, k)
	}
	if len(n.engines) > 0 {
		clear(n.engines)
		s.engineDirty = true
	}
	n.parts, n.partLd = 0, n.partLd[:0]
	n.hot, n.hotAt, n.hotTotal, n.hotParts = n.hot[:0], time.Time{}, 0, 0
	n.cost, n.costAt = CostFigure{}, time.Time{}
}

// setLocal records engine stats scraped by this node.
func (s *state) setLocal(backend string, st EngineStats) {
	s.mu.Lock()
	defer s.mu.Unlock()
	cur, ok := s.local[backend]
	if !ok || !sameEngine(cur, st) || st.Scraped.Sub(cur.Scraped) > engineRescrapeGap {
		s.engineDirty = true
	}
	s.local[backend] = st
}

// sweep drops figures older than their bounds.
func (s *state) sweep(now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, n := range s.nodes {
		if n.proven && !now.Before(n.provenUntil) {
			n.proven = false
			s.memberDirty = true
		}
		if n.voting && now.Sub(n.directAt) > s.expire {
			s.silence(n)
		}
		for k, e := range n.loads {
			if now.Sub(e.at) > s.expire {
				s.removeFigure(e)
				delete(n.loads, k)
			}
		}
		for k, e := range n.engines {
			if now.Sub(e.Scraped) > s.engineExpire {
				delete(n.engines, k)
				s.engineDirty = true
			}
		}
	}
	for k, e := range s.local {
		if now.Sub(e.Scraped) > s.engineExpire {
			delete(s.local, k)
			s.engineDirty = true
		}
	}
}

// build returns a new View when anything changed since prev was built, or
// nil.
func (s *state) build(prev *View) *View {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.loadDirty && !s.engineDirty && !s.memberDirty && !s.healthDirty && prev != nil {
		return nil
	}
	v := &View{self: s.self}
	if prev != nil {
		*v = *prev
	}
	v.version++
	if s.indexDirty || s.index == nil {
		// Compact the slots and publish a new index; Views built before
		// keep theirs.
		live := s.slots[:0]
		for _, a := range s.slots {
			if a != nil {
				a.slot = len(live)
				live = append(live, a)
			}
		}
		clear(s.slots[len(live):])
		s.slots = live
		s.index = make(map[string]int, len(live))
		for _, a := range live {
			s.index[a.key] = a.slot
		}
		s.indexDirty = false
	}
	if s.loadDirty || prev == nil || v.index == nil {
		v.index = s.index
		v.remote = make([]int64, len(s.slots))
		for i, a := range s.slots {
			v.remote[i] = a.sum
		}
	}
	if s.engineDirty || prev == nil {
		v.engine = make(map[string]EngineStats, len(s.local))
		for k, e := range s.local {
			v.engine[k] = e
		}
		for _, n := range s.nodes {
			for k, e := range n.engines {
				if cur, ok := v.engine[k]; !ok || e.Scraped.After(cur.Scraped) {
					v.engine[k] = *e
				}
			}
		}
	}
	if s.healthDirty || prev == nil {
		v.failing = make(map[string][]string)
		v.voters = nil
		for name, n := range s.nodes {
			if !n.voting {
				continue
			}
			v.voters = append(v.voters, name)
			for k, e := range n.loads {
				if e.failing {
					v.failing[k] = append(v.failing[k], name)
				}
			}
		}
		slices.Sort(v.voters)
		for _, f := range v.failing {
			slices.Sort(f)
		}
		v.healthVersion = v.version
	}
	if s.memberDirty || prev == nil {
		v.members = make([]string, 0, len(s.nodes)+1)
		v.members = append(v.members, s.self)
		for name, n := range s.nodes {
			// With an Identity, a member counts once it proved its
			// name: one that cannot does not get backends to scrape.
			if !s.signed || n.proven {
				v.members = append(v.members, name)
			}
		}
		slices.Sort(v.members)
	}
	s.loadDirty, s.engineDirty, s.memberDirty, s.healthDirty = false, false, false, false
	return v
}

// oldestAge is the age of the oldest remote figure still counted.
func (s *state) oldestAge(now time.Time) time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	var oldest time.Duration
	for _, n := range s.nodes {
		for _, e := range n.loads {
			oldest = max(oldest, now.Sub(e.at))
		}
	}
	return oldest
}

func (s *state) noteUnknown() {
	s.mu.Lock()
	s.unknown++
	s.mu.Unlock()
}

func (s *state) noteStale() {
	s.mu.Lock()
	s.stale++
	s.mu.Unlock()
}

func (s *state) counters() (unknown, stale uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.unknown, s.stale
}

// appendRelay appends one block per other node with its fresh figures
// (for memberlist push/pull), each figure with its own seq and age.
func (s *state) appendRelay(dst []byte, now time.Time) []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	var body, loads, engines []byte
	for name, n := range s.nodes {
		if n.closed || (len(n.loads) == 0 && len(n.engines) == 0) {
			continue
		}
		loads, engines = loads[:0], engines[:0]
		var maxSeq uint64
		for k, e := range n.loads {
			age := now.Sub(e.at)
			if age >= s.expire {
				continue
			}
			maxSeq = max(maxSeq, e.seq)
			loads = appendLoadRelay(loads, k, e.v, e.seq, age)
		}
		for k, e := range n.engines {
			if age := now.Sub(e.Scraped); age < s.engineExpire {
				engines = appendEngine(engines, k, *e, age)
			}
		}
		if len(loads) == 0 && len(engines) == 0 {
			continue
		}
		body = appendBlockHead(body[:0], name, n.instance, maxSeq)
		body = appendSection(body, tagLoadsRelay, loads)
		body = appendSection(body, tagEngine, engines)
		if len(dst)+len(body)+binary.MaxVarintLen64 > maxStateBytes {
			break
		}
		dst = appendBlock(dst, body)
	}
	return dst
}
