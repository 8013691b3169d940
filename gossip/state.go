package gossip

import (
	"slices"
	"sync"
	"time"
)

// state holds the latest figures from every other node. Messages are
// decoded and applied under mu; per-backend sums are kept incrementally so
// building a View costs a copy of one small map.
type state struct {
	mu           sync.Mutex
	self         string
	expire       time.Duration
	engineExpire time.Duration

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
	loads     map[string]*loadEntry
	engines   map[string]*EngineStats
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

// handle decodes and applies one message received at now. It reports
// whether a View needs building.
func (s *state) handle(b []byte, now time.Time) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.msg.decode(b); err != nil {
		return false, err
	}
	for i := range s.msg.blocks {
		blk := &s.msg.blocks[i]
		if s.msg.kind == kindBye {
			s.bye(blk)
		} else {
			s.applyBlock(blk, now)
		}
	}
	// True also when an earlier change is not built yet: harmless.
	return s.loadDirty || s.engineDirty || s.healthDirty, nil
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
	n.instance = blk.instance
	n.closed = true
}

func (s *state) applyBlock(blk *wireBlock, now time.Time) {
	if string(blk.origin) == s.self {
		return
	}
	n := s.nodes[string(blk.origin)]
	if n == nil {
		s.unknown++
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
	for i := range blk.loads {
		l := &blk.loads[i]
		if l.age >= s.expire {
			continue
		}
		at := now.Add(-l.age)
		e := n.loads[string(l.backend)]
		if e == nil {
			key := string(l.backend)
			n.loads[key] = &loadEntry{v: l.inFlight, failing: l.failing, seq: l.seq, at: at, agg: s.addFigure(key, l.inFlight)}
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
		case l.seq == e.seq && at.After(e.at):
			e.at = at
		}
	}
	for i := range blk.engines {
		we := &blk.engines[i]
		if we.age >= s.engineExpire {
			continue
		}
		st := we.stats
		st.Scraped = now.Add(-we.age)
		cur := n.engines[string(we.backend)]
		if cur == nil {
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

// engineRescrapeGap: a newer scrape with identical figures rebuilds the
// View only when it is this much newer (re-sent copies of one scrape
// differ by rounding).
const engineRescrapeGap = 500 * time.Millisecond

func sameEngine(a, b EngineStats) bool {
	return a.KVUsage == b.KVUsage && a.Running == b.Running && a.Waiting == b.Waiting &&
		a.PrefixHitRate == b.PrefixHitRate && a.Known == b.Known && a.OK == b.OK
}

// addFigure adds a new figure v for backend key and returns the
// backend's sum.
func (s *state) addFigure(key string, v int64) *agg {
	a := s.sums[key]
	if a == nil {
		a = &agg{key: key, slot: len(s.slots)}
		s.sums[key] = a
		s.slots = append(s.slots, a)
		s.indexDirty = true
	}
	a.sum += v
	a.n++
	s.loadDirty, s.healthDirty = true, true
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
	s.loadDirty, s.healthDirty = true, true
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
		v.health = make(map[string]BackendHealth)
		for name, n := range s.nodes {
			for k, e := range n.loads {
				h := v.health[k]
				if e.failing {
					h.Failing = append(h.Failing, name)
				} else {
					h.Healthy = append(h.Healthy, name)
				}
				v.health[k] = h
			}
		}
		for _, h := range v.health {
			slices.Sort(h.Healthy)
			slices.Sort(h.Failing)
		}
		v.healthVersion = v.version
	}
	if s.memberDirty || prev == nil {
		v.members = make([]string, 0, len(s.nodes)+1)
		v.members = append(v.members, s.self)
		for name := range s.nodes {
			v.members = append(v.members, name)
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
		dst = appendBlock(dst, body)
	}
	return dst
}
