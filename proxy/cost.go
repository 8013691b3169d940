package proxy

import "sync/atomic"

// The recompute cost of leaving a key's owner.
//
// The COST overflow rule (ring.PickCost) leaves an owner whose engine
// queues only when more than recompute requests wait ahead of the request
// there (the engine's queue) and a backend that does not queue has room
// and more than recompute fewer in flight: recompute is what the move
// costs, in average requests' work.
//
// An average request's work is the part of its prompt its backend does
// not hold (decode aside): mean x (1 - h), where mean is the running mean
// request size and h the share of prompt tokens the owners' answers report
// cached. Leaving the owner forfeits the whole prompt: the part the owner
// holds is prefilled again elsewhere, and the part it does not hold is
// prefilled where the key's next requests (a conversation's next turn,
// the document's next question) will not find it, for they go back to the
// owner. So a request of body bytes costs
//
//	recompute = body / (mean x (1 - h))
//
// average requests, at least 1: with no reuse (h = 0) its size in mean
// requests, where owners serve 60% of every prompt from cache (a Mooncake
// trace) 2.5 times that, where they serve 90% (RAG) ten times. h comes
// from the owners' answers that report their cached tokens
// (usage.prompt_tokens_details.cached_tokens). Many deployments never
// see one: vLLM reports it only with --enable-prompt-tokens-details, and
// in a stream only when the client asks for usage. Until an answer has
// reported it, h is the engines' own prefix-cache hit rate, as their
// metrics give it (vllm:prefix_cache_hits over queries, scraped; a
// running mean over the fleet's scrapes, which counts every request,
// overflowed ones too, so it errs low); with neither, 0.5.
//
// The counts are running means over about costWindow requests (body
// sizes) and answers (tokens), updated with atomics; racing updates may
// lose one, which a running mean does not notice.
//
// mean x (1 - h) is the work unit: the bytes of prompt an average request
// makes its backend prefill. Routers in a cluster each learn it from
// their own traffic, so the same request would weigh a different number
// of units on each, and the routers would part ways on whether to leave
// an owner (an 8-router fleet agreed on three picks in four). They share
// their units through gossip, the Raft leader commits their median
// weighted by requests (node/cost.go), and every router applies the agreed
// unit from the same epoch on (SetRecomputeUnit); its own figures then
// only feed what it publishes.
type recomputeCost struct {
	// agreed is the cluster's agreed work unit in bytes; 0: none, the
	// router's own is used.
	agreed atomic.Int64
	// counted is the number of bodies counted into meanBody.
	counted atomic.Uint64
	// meanBody is the running mean request body size in bytes.
	meanBody atomic.Int64
	// prompt and cached are running means of the prompt and cached tokens
	// of owners' answers with a usage report, scaled by costScale; 0
	// before the first.
	prompt, cached atomic.Int64
	// engineHit is the running mean of the engines' scraped prefix-cache
	// hit rates, in thousandths scaled by costScale; engineSeen once one
	// came.
	engineHit  atomic.Int64
	engineSeen atomic.Bool
}

const (
	// costWindow is the number of samples a running mean spans, about.
	costWindow = 64
	// costScale keeps the token means' fractions (a mean of small counts).
	costScale = 1 << 10
	// maxOwnerHitPermille caps h: recompute stays within 20 x a
	// request's size in mean requests, so an owner whose cache serves
	// everything can still be left when it queues that much.
	maxOwnerHitPermille = 950
	// maxCostTokens bounds one answer's counts (usage reports are bounded
	// to maxUsageDigits digits already; this keeps the scaled means far
	// from overflow).
	maxCostTokens = 1 << 40
)

// units returns the recompute cost of a request of body bytes, in average
// requests, at least 1; and records body in the running mean when count.
func (c *recomputeCost) units(body int64, count bool) int64 {
	mean := c.meanBody.Load()
	if count {
		c.counted.Add(1)
		if mean == 0 {
			c.meanBody.Store(body)
		} else {
			c.meanBody.Store(mean + (body-mean)/costWindow)
		}
	}
	if u := c.agreed.Load(); u > 0 {
		return max(1, (body+u/2)/u)
	}
	if mean <= 0 {
		return 1
	}
	h := c.ownerHitPermille()
	// body / (mean x (1 - h)), rounded; body and mean are below 2^31
	// (bodies are bounded far below), h below 1000.
	num := body * 1000
	den := mean * (1000 - h)
	return max(1, (num+den/2)/den)
}

// localUnit returns the router's own work unit in bytes (0 before its
// first request) and whether h in it came from answers' usage reports.
func (c *recomputeCost) localUnit() (int64, bool) {
	mean := c.meanBody.Load()
	if mean <= 0 {
		return 0, false
	}
	h := c.ownerHitPermille()
	return max(1, (mean*(1000-h)+500)/1000), c.prompt.Load() > 0
}

// ownerHitPermille returns h in thousandths: the owners' running cached
// share; before any report the engines' scraped hit rate, or 500; at most
// maxOwnerHitPermille.
func (c *recomputeCost) ownerHitPermille() int64 {
	p, k := c.prompt.Load(), c.cached.Load()
	if p <= 0 {
		if c.engineSeen.Load() {
			return min(maxOwnerHitPermille, max(0, c.engineHit.Load()/costScale))
		}
		return 500
	}
	return min(maxOwnerHitPermille, max(0, k*1000/p))
}

// observeEngine records an engine's prefix-cache hit rate (0..1) from a
// new scrape of its metrics; a rate outside 0..1 (or NaN) is ignored.
func (c *recomputeCost) observeEngine(rate float64) {
	if !(rate >= 0 && rate <= 1) {
		return
	}
	x := int64(rate*1000) * costScale
	if !c.engineSeen.Load() {
		c.engineHit.Store(x)
		c.engineSeen.Store(true)
		return
	}
	m := c.engineHit.Load()
	c.engineHit.Store(m + (x-m)/costWindow)
}

// observe records an answer to a request of kind k whose engine reported
// prompt and cached tokens. Only an owner's answers count (affinity,
// split, session): what an overflow forfeits is what the owner holds.
func (c *recomputeCost) observe(k kind, r usageReport) {
	if c == nil || (k != kindAffinity && k != kindSplit && k != kindSession) || r.result != usageOK {
		return
	}
	prompt, cached := min(r.prompt, maxCostTokens), min(r.cached, r.prompt, maxCostTokens)
	if prompt <= 0 {
		return
	}
	mp, mk := c.prompt.Load(), c.cached.Load()
	if mp == 0 {
		c.prompt.Store(prompt * costScale)
		c.cached.Store(cached * costScale)
		return
	}
	c.prompt.Store(mp + (prompt*costScale-mp)/costWindow)
	c.cached.Store(mk + (cached*costScale-mk)/costWindow)
}

// MaxRecomputeUnit bounds a work unit, agreed or published: a request
// body's size (bodies are bounded far below).
const MaxRecomputeUnit = 1 << 31

// RecomputeFigures are what a router's own traffic says of the work unit
// (see recomputeCost), for the cluster's agreement.
type RecomputeFigures struct {
	// Unit is the router's own work unit in bytes; 0 before its first
	// request.
	Unit int64
	// FromAnswers says h in it came from answers' usage reports (not
	// from the engines' scraped hit rates or the default).
	FromAnswers bool
	// Requests counts the requests it has weighed since the start.
	Requests uint64
	// Agreed is the agreed unit in use; 0: none.
	Agreed int64
}

// RecomputeFigures returns the router's own work unit and request count.
func (p *Proxy) RecomputeFigures() RecomputeFigures {
	u, answers := p.cost.localUnit()
	return RecomputeFigures{Unit: u, FromAnswers: answers, Requests: p.cost.counted.Load(), Agreed: p.cost.agreed.Load()}
}

// SetRecomputeUnit installs the cluster's agreed work unit in bytes; 0
// (or a value out of 0..MaxRecomputeUnit) goes back to the router's own.
func (p *Proxy) SetRecomputeUnit(unit int64) {
	if unit < 0 || unit > MaxRecomputeUnit {
		unit = 0
	}
	p.cost.agreed.Store(unit)
}
