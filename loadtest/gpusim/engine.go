package gpusim

import (
	"math"
	"slices"
	"time"
)

type seqState uint8

const (
	stateNew seqState = iota
	stateWaiting
	stateLoading // admitted; its adapter is being read or swapped in
	statePrefill
	stateDecode
	stateDone
)

// seq is one request inside the engine.
type seq struct {
	// Set before submission, then read-only.
	shape     promptShape
	maxTokens int
	limited   bool      // finish_reason "length" rather than "stop"
	arrival   time.Time // when the server accepted the request
	adapter   string    // the LoRA adapter it runs with; "" for the base model
	// tokens receives one value per generated token; its capacity is
	// maxTokens, so the engine never blocks on a slow client.
	tokens chan struct{}

	// Written by the engine before the first token is sent; read by the
	// handler after it has received that token.
	cachedTokens int

	// Engine-private.
	state     seqState
	work      int     // prefill tokens to compute (the uncached ones)
	remaining float64 // of which still to compute
	nextBlock int     // first prompt block not yet registered in the cache
	blocks    []*kvBlock
	anon      int
	generated int
	lastToken time.Time
	ready     time.Time // loading: when its adapter is ready and prefill starts
}

func newSeq(shape promptShape, maxTokens int, limited bool, arrival time.Time, adapter string) *seq {
	return &seq{shape: shape, maxTokens: maxTokens, limited: limited, arrival: arrival, adapter: adapter,
		tokens: make(chan struct{}, maxTokens)}
}

// engine is the scheduler of one instance: a single goroutine that owns the
// waiting queue, the running requests and the KV pool, and advances
// simulated time from event to event (arrival, abort, prefill completion,
// decode step). Prefill is processor-shared: the prefill throughput is
// split equally among the requests prefilling at the same moment, and, as
// vLLM's per-step token budget (max_num_batched_tokens) does, a waiting
// request starts its prefill only while the prefills in progress have
// fewer than MaxNumBatchedTokens tokens left (or none is in progress).
// Computed prompt blocks enter the cache as prefill progresses, as vLLM
// caches each chunk's full blocks. Decode runs in steps: every step gives
// each decoding request one token and lasts ITLBase + ITLPerSeq x running.
// A request for a LoRA adapter that holds no GPU slot is admitted into
// loading, and starts its prefill once the adapter is swapped in (lora.go).
type engine struct {
	cfg *Config
	c   *counters
	m   *metrics

	submitCh chan *seq
	abortCh  chan *seq
	ctrlCh   chan func()
	stop     chan struct{}
	done     chan struct{}

	kv          *kvPool
	lora        *loraResidency
	waiting     []*seq
	loading     []*seq
	prefilling  []*seq
	decoding    []*seq
	lastAdvance time.Time
	nextStep    time.Time // zero when no decode step is scheduled
	// lastTokens holds finished requests whose last token is sent only
	// after the state is published, so that a client that has its whole
	// answer sees the request completed in /metrics and Stats.
	lastTokens  []*seq
	prefillRate float64 // tokens per wall-clock second
}

func newEngine(cfg *Config, c *counters, m *metrics) *engine {
	return &engine{
		cfg: cfg, c: c, m: m,
		submitCh:    make(chan *seq, 256),
		abortCh:     make(chan *seq, 256),
		ctrlCh:      make(chan func()),
		stop:        make(chan struct{}),
		done:        make(chan struct{}),
		kv:          newKVPool(cfg.KVCacheBlocks),
		lora:        newLoRAResidency(cfg, c),
		prefillRate: cfg.PrefillTokensPerSec / cfg.TimeScale,
	}
}

// submit hands s to the engine; false if the engine has stopped.
func (e *engine) submit(s *seq) bool {
	select {
	case e.submitCh <- s:
		return true
	case <-e.done:
		return false
	}
}

// abort withdraws s (a client went away); a no-op if s already finished.
func (e *engine) abort(s *seq) {
	select {
	case e.abortCh <- s:
	case <-e.done:
	}
}

// do runs f on the engine goroutine and waits for it.
func (e *engine) do(f func()) bool {
	ran := make(chan struct{})
	select {
	case e.ctrlCh <- func() { f(); close(ran) }:
		<-ran
		return true
	case <-e.done:
		return false
	}
}

// close stops the engine and waits for it; safe to call once.
func (e *engine) close() {
	close(e.stop)
	<-e.done
}

func (e *engine) run() {
	defer close(e.done)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for {
		var now time.Time
		select {
		case <-e.stop:
			timer.Stop()
			return
		case s := <-e.submitCh:
			now = time.Now()
			e.advance(now)
			s.state = stateWaiting
			e.waiting = append(e.waiting, s)
			if s.adapter != "" {
				e.lora.add(e.lora.waiting, s.adapter)
			}
		case s := <-e.abortCh:
			now = time.Now()
			e.advance(now)
			e.remove(s)
		case f := <-e.ctrlCh:
			now = time.Now()
			e.advance(now)
			f()
		case <-timer.C:
			now = time.Now()
			e.advance(now)
		}
		e.startLoaded(now)
		e.finishPrefills(now)
		if !e.nextStep.IsZero() && !now.Before(e.nextStep) {
			e.step(now)
		}
		e.admit(now)
		e.publish()
		for i, s := range e.lastTokens {
			s.tokens <- struct{}{}
			e.lastTokens[i] = nil
		}
		e.lastTokens = e.lastTokens[:0]
		if at, ok := e.nextEvent(now); ok {
			timer.Reset(at.Sub(now))
		} else {
			timer.Stop()
		}
	}
}

// advance credits every prefilling request with its share of the prefill
// work done since the last event.
func (e *engine) advance(now time.Time) {
	if n := len(e.prefilling); n > 0 {
		if dt := now.Sub(e.lastAdvance).Seconds(); dt > 0 {
			work := dt * e.prefillRate / float64(n)
			for _, s := range e.prefilling {
				s.remaining -= work
				e.cacheComputed(s, s.work-int(math.Ceil(s.remaining-prefillEpsilon)))
			}
		}
	}
	e.lastAdvance = now
}

// prefillEpsilon absorbs float rounding in the processor-sharing clock.
const prefillEpsilon = 1e-3

// cacheComputed registers the full prompt blocks covered once computed of
// s's uncached tokens are done.
func (e *engine) cacheComputed(s *seq, computed int) {
	b := e.cfg.BlockSize
	upTo := min(len(s.shape.hashes), (s.shape.tokens-s.work+max(0, computed))/b)
	for ; s.nextBlock < upTo && s.anon > 0; s.nextBlock++ {
		if blk := e.kv.promote(s.shape.hashes[s.nextBlock]); blk != nil {
			s.blocks = append(s.blocks, blk)
			s.anon--
		}
	}
}

func (e *engine) running() int { return len(e.loading) + len(e.prefilling) + len(e.decoding) }

// itl is the wall-clock length of a decode step at the current load.
func (e *engine) itl() time.Duration {
	return e.cfg.scaled(e.cfg.ITLBase + time.Duration(e.running())*e.cfg.ITLPerSeq)
}

// admit moves waiting requests (FIFO) into prefill while a sequence slot
// is free, the prefill token budget has room and, with the admission check,
// their KV blocks fit. A request whose LoRA adapter would make one adapter
// too many in the running batch is passed over for those behind it, as
// vLLM's scheduler skips it; one whose adapter holds no ready GPU slot is
// admitted into loading.
func (e *engine) admit(now time.Time) {
	b := e.cfg.BlockSize
	pending := 0.0 // prefill tokens left in the prefills in progress or about to start
	for _, s := range e.prefilling {
		pending += max(0, s.remaining)
	}
	for _, s := range e.loading {
		pending += s.remaining
	}
	inProgress := len(e.prefilling) + len(e.loading)
	i, kept := 0, 0 // e.waiting[:kept] holds the requests passed over
	for ; i < len(e.waiting); i++ {
		s := e.waiting[i]
		if e.running() >= e.cfg.MaxNumSeqs {
			break
		}
		if s.adapter != "" && !e.lora.fits(s.adapter) {
			e.waiting[kept] = s
			kept++
			continue
		}
		p := s.shape.tokens
		// At least the last prompt token is always computed.
		hits := e.kv.longestPrefix(s.shape.hashes, (p-1)/b)
		work := p - hits*b
		if inProgress > 0 && pending+float64(work) > float64(e.cfg.MaxNumBatchedTokens) {
			break
		}
		need := (p+s.maxTokens+b-1)/b - hits
		if e.cfg.KVAdmissionCheck && !e.kv.canAllocate(need, s.shape.hashes[:hits]) {
			break
		}
		inProgress++
		pending += float64(work)
		s.blocks = e.kv.acquire(s.blocks, s.shape.hashes[:hits])
		s.anon = e.kv.allocate(need)
		s.nextBlock = hits
		s.cachedTokens = hits * b
		s.work = work
		s.remaining = float64(work)
		s.state = statePrefill
		if s.adapter != "" {
			e.lora.done(e.lora.waiting, s.adapter)
			if s.ready = e.lora.acquire(s.adapter, now); s.ready.After(now) {
				s.state = stateLoading
			}
		}
		if s.state == stateLoading {
			e.loading = append(e.loading, s)
		} else {
			e.prefilling = append(e.prefilling, s)
		}
		e.c.cacheQueries.Add(uint64(p))
		e.c.cacheHits.Add(uint64(hits * b))
		e.m.queue.Observe(now.Sub(s.arrival).Seconds())
	}
	if admitted := i - kept; admitted > 0 {
		n := copy(e.waiting[kept:], e.waiting[i:])
		clear(e.waiting[kept+n:])
		e.waiting = e.waiting[:kept+n]
	}
}

// startLoaded moves the loading requests whose adapter is ready into
// prefill.
func (e *engine) startLoaded(now time.Time) {
	keep := e.loading[:0]
	for _, s := range e.loading {
		if s.ready.After(now) {
			keep = append(keep, s)
			continue
		}
		s.state = statePrefill
		e.prefilling = append(e.prefilling, s)
	}
	clear(e.loading[len(keep):])
	e.loading = keep
}

// finishPrefills emits the first token of every request whose prefill is
// done and registers its computed prompt blocks in the cache.
func (e *engine) finishPrefills(now time.Time) {
	keep := e.prefilling[:0]
	for _, s := range e.prefilling {
		if s.remaining > prefillEpsilon {
			keep = append(keep, s)
			continue
		}
		e.cacheComputed(s, s.work)
		e.c.promptTokens.Add(uint64(s.shape.tokens))
		e.m.ttft.Observe(now.Sub(s.arrival).Seconds())
		s.state = stateDecode
		e.emit(s, now)
		if s.generated >= s.maxTokens {
			e.finish(s, now)
			continue
		}
		e.decoding = append(e.decoding, s)
		if e.nextStep.IsZero() {
			e.nextStep = now.Add(e.itl())
		}
	}
	clear(e.prefilling[len(keep):])
	e.prefilling = keep
}

// step is one decode iteration: every decoding request gets a token.
func (e *engine) step(now time.Time) {
	planned := e.nextStep
	e.nextStep = time.Time{}
	keep := e.decoding[:0]
	for _, s := range e.decoding {
		e.emit(s, now)
		if s.generated >= s.maxTokens {
			e.finish(s, now)
			continue
		}
		keep = append(keep, s)
	}
	clear(e.decoding[len(keep):])
	e.decoding = keep
	if len(e.decoding) > 0 {
		// Keep to the planned cadence when the timer fires late, but never
		// schedule a step in the past (no bursts).
		next := planned.Add(e.itl())
		if next.Before(now) {
			next = now
		}
		e.nextStep = next
	}
}

func (e *engine) emit(s *seq, now time.Time) {
	if s.generated > 0 {
		e.m.itl.Observe(now.Sub(s.lastToken).Seconds())
	}
	s.generated++
	s.lastToken = now
	e.c.generationTokens.Add(1)
	if s.generated >= s.maxTokens {
		e.lastTokens = append(e.lastTokens, s) // sent after publish
		return
	}
	s.tokens <- struct{}{} // never blocks: capacity is maxTokens
}

func (e *engine) finish(s *seq, now time.Time) {
	s.state = stateDone
	e.kv.release(s.blocks, s.anon)
	s.blocks, s.anon = nil, 0
	if s.adapter != "" {
		e.lora.done(e.lora.inUse, s.adapter)
	}
	if s.limited {
		e.c.successLength.Add(1)
	} else {
		e.c.successStop.Add(1)
	}
	e.m.e2e.Observe(now.Sub(s.arrival).Seconds())
}

// remove aborts s if it is still in the engine.
func (e *engine) remove(s *seq) {
	var list *[]*seq
	switch s.state {
	case stateWaiting:
		list = &e.waiting
	case stateLoading:
		list = &e.loading
	case statePrefill:
		list = &e.prefilling
	case stateDecode:
		list = &e.decoding
	default:
		return // finished, or never submitted
	}
	if i := slices.Index(*list, s); i >= 0 {
		*list = slices.Delete(*list, i, i+1)
	}
	if s.adapter != "" {
		if s.state == stateWaiting {
			e.lora.done(e.lora.waiting, s.adapter)
		} else {
			e.lora.done(e.lora.inUse, s.adapter)
		}
	}
	e.kv.release(s.blocks, s.anon)
	s.blocks, s.anon = nil, 0
	s.state = stateDone
	e.c.aborted.Add(1)
}

// nextEvent is the time of the next adapter ready, prefill completion or
// decode step.
func (e *engine) nextEvent(now time.Time) (time.Time, bool) {
	var at time.Time
	ok := false
	for _, s := range e.loading {
		if !ok || s.ready.Before(at) {
			at, ok = s.ready, true
		}
	}
	if n := len(e.prefilling); n > 0 {
		least := math.Inf(1)
		for _, s := range e.prefilling {
			least = min(least, s.remaining)
		}
		secs := max(0, least) * float64(n) / e.prefillRate
		if done := now.Add(time.Duration(math.Ceil(secs * 1e9))); !ok || done.Before(at) {
			at, ok = done, true
		}
	}
	if !e.nextStep.IsZero() && (!ok || e.nextStep.Before(at)) {
		at, ok = e.nextStep, true
	}
	return at, ok
}

// publish exports the scheduler state for /metrics and /admin/stats.
func (e *engine) publish() {
	e.c.running.Store(int64(e.running()))
	e.c.waiting.Store(int64(len(e.waiting)))
	e.c.kvUsage.Store(math.Float64bits(e.kv.usage()))
	e.c.kvUsedBlocks.Store(int64(e.kv.used()))
	e.c.kvCachedBlocks.Store(int64(len(e.kv.cached)))
	e.c.kvEvictions.Store(e.kv.evictions)
	if e.cfg.EnableLoRA {
		if l := e.lora; l.changed || e.c.lora.Load() == nil {
			l.changed = false
			e.c.lora.Store(&loraInfo{running: names(l.inUse), waiting: names(l.waiting)})
		}
		e.c.loraAt.Store(math.Float64bits(float64(time.Now().UnixNano()) / 1e9))
	}
}
