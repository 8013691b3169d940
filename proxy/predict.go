package proxy

import (
	"math"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/warmroute/warmroute/internal/cachefig"
	"github.com/warmroute/warmroute/ring"
)

// Predicted against delivered.
//
// For every request it routes on a key, the router knows the backend it
// chose and why (the decision's kind), and it predicts whether that
// backend's prefix cache holds the key's prefix: warm when it sent the
// same routing key to the same backend within the last recentWindow, as a
// small table per backend remembers (recentKeys); cold for a key it never
// sent there. The engine's answer says what was delivered: its
// usage.prompt_tokens_details.cached_tokens (usage.go).
//
// The key's prefix is what the router knows two requests share: the
// bytes of prompt text in the key (PrefixBytes: one block of 1 KiB under
// ADAPTIVE keys, a block more per split prefix it was routed past, up to
// PrefixLength under FIXED ones). The answer's usage turns bytes into
// tokens: the prefix counts prompt_tokens x its bytes / the body's bytes
// (whatever the tokenizer and the language). An answer is delivered warm
// when its cached tokens cover half of the key's last block, beyond the
// split prefixes before it: half of the key for a key not split (a chat
// template or a few blocks of a common opening do not pass for a warm
// prefix, nor does a tokenizer that cuts coarser than the body suggests
// turn a hit into a miss), and for a key routed past a split, more than
// the split prefix, which every backend that took a share of it holds,
// so that what is checked is the continuation the split's owner should
// hold. A session's key names no prompt text: its answers are delivered
// warm when anything was cached.
//
// Everything is counted per backend and kind, when the answer ends, with
// atomics: the request path allocates nothing for it, and the figures are
// read when /status or /metrics asks (cacheCollector). Nothing of it goes
// to clients: a warm prediction says that someone sent the same prefix to
// that backend lately, which a client must not learn of another's
// prompts.

// kind is why a request went to its backend, as far as its cache goes.
type kind uint8

const (
	// kindNone: not counted (a request without a key: GET /v1/models,
	// audio).
	kindNone kind = iota
	// kindAffinity: the owner of the key's partition (PREFIX_AWARE
	// affinity, or CONSISTENT_HASH's first choice).
	kindAffinity
	// kindSplit: the owner of a key routed past a split prefix (ADAPTIVE
	// keys deeper than their first block).
	kindSplit
	// kindSession: the owner of a session's key (the session header).
	kindSession
	// kindOverflow: a later backend in the key's overflow order.
	kindOverflow
	// kindFallback: the least loaded backend, every one in the order
	// being full.
	kindFallback
	// kindOther: a strategy blind to keys (RANDOM, ROUND_ROBIN,
	// LEAST_OUTSTANDING_REQUESTS), or a reason this table does not know.
	kindOther
	numKinds
)

// kindNames are the kind label values (kindNone is not counted).
var kindNames = [numKinds]string{"", "affinity", "split", "session", "overflow", "fallback", "other"}

// pastSplit reports whether info's key was routed past a split prefix:
// under ADAPTIVE keys (adaptive), the routing key is deeper than the first
// block only then (ring.Splits.Route).
func pastSplit(info *ring.KeyInfo, adaptive bool) bool {
	return adaptive && !info.Session && info.Key != info.KeyAt(0)
}

// kindOf classifies decision d for a request keyed by a session (session)
// or by a key routed past a split (split).
func kindOf(d ring.Decision, session, split bool) kind {
	switch d.Reason {
	case ring.ReasonAffinity:
	case ring.ReasonConsistentHash:
		switch {
		case d.Rank > 0:
			return kindOverflow
		case d.Rank < 0:
			return kindFallback
		}
	case ring.ReasonOverflow:
		return kindOverflow
	case ring.ReasonFallback:
		return kindFallback
	default:
		return kindOther
	}
	switch {
	case session:
		return kindSession
	case split:
		return kindSplit
	}
	return kindAffinity
}

// prediction is what the router expected of one request's answer.
type prediction struct {
	kind kind
	// warm: the backend was sent the request's key within recentWindow.
	warm bool
	// prefix is the key's prefix in bytes of prompt text, before the
	// part of it that split prefixes cover (0 when not split); body is
	// the request body's size, the measure the answer's prompt tokens
	// are shared over.
	prefix, before, body int32
}

// predict records that st's request, of bodyBytes bytes, goes to b by
// decision d and returns what the router expects of the answer. A request
// without a key is not predicted.
func (p *Proxy) predict(st *reqState, b *backend, d ring.Decision, bodyBytes int) prediction {
	if !st.keyed {
		return prediction{}
	}
	info := &st.info
	split := pastSplit(info, st.t.ring.Config().Adaptive())
	pr := prediction{
		kind:   kindOf(d, info.Session, split),
		warm:   b.recent.seen(info.Key, st.now),
		prefix: int32(min(info.PrefixBytes, math.MaxInt32)),
		body:   int32(min(bodyBytes, math.MaxInt32)),
	}
	if split {
		pr.before = max(0, pr.prefix-ring.ChainBlockBytes)
	}
	return pr
}

// tokensOf converts n bytes of the request into tokens of an answer that
// reported prompt tokens: in proportion to the body's bytes, at most all.
func (pr *prediction) tokensOf(n int32, prompt int64) int64 {
	if pr.body <= 0 {
		return 0
	}
	return min(int64(n)*prompt/int64(pr.body), prompt)
}

// needed is the cached tokens that make an answer reporting prompt
// tokens warm: more than the split prefixes, and half of the rest of the
// key (at least one token).
func (pr *prediction) needed(prompt int64) int64 {
	before := pr.tokensOf(pr.before, prompt)
	return max(1, before+(pr.tokensOf(pr.prefix, prompt)-before)/2)
}

// The table of recent keys, per backend: recentSlots slots, each holding
// the high recentTagBits bits of a key and when it was last sent (seconds,
// modulo 2^recentStampBits), indexed by the key's low bits. It is
// direct-mapped: a key evicts the one in its slot, so it remembers up to
// recentSlots keys, more prompts than an engine's KV cache holds of a few
// thousand tokens each. 8 KiB per backend, whatever the traffic.
const (
	recentSlots     = 1024
	recentStampBits = 24
	recentStampMask = 1<<recentStampBits - 1
	// recentWindow is how long a key sent to a backend predicts a warm
	// cache there. An engine under load evicts sooner: that shows as
	// answers predicted warm and delivered cold.
	recentWindow = 10 * time.Minute
)

// recentKeys remembers the keys lately routed to one backend. Safe for
// concurrent use: each slot is one atomic word.
type recentKeys struct {
	slots [recentSlots]atomic.Uint64
}

// seen records key as sent at now (unix nanos) and reports whether it had
// been sent within recentWindow before. (An empty slot is 0: a key whose
// top bits are all 0 sent at a second that is 0 modulo 2^24 is forgotten,
// which costs one cold prediction.)
func (r *recentKeys) seen(key uint64, now int64) bool {
	stamp := uint64(now/int64(time.Second)) & recentStampMask
	tag := key >> recentStampBits
	v := tag<<recentStampBits | stamp
	slot := &r.slots[key&(recentSlots-1)]
	old := slot.Load()
	if old == v {
		// The same key in the same second: nothing to write (a hot key
		// does not make every core write the slot's cache line).
		return true
	}
	old = slot.Swap(v)
	return old != 0 && old>>recentStampBits == tag &&
		(stamp-old)&recentStampMask <= uint64(recentWindow/time.Second)
}

// What an answer delivered, against the prediction.
const (
	deliveredCold    = iota // a usage report with fewer cached tokens than needed
	deliveredWarm           // a usage report with at least as many
	deliveredUnknown        // no valid usage report (not asked for, an error answer, invalid)
	numDelivered
)

var deliveredNames = [numDelivered]string{"cold", "warm", "unknown"}

// predictedNames are the predicted label values, by warm.
var predictedNames = [2]string{"cold", "warm"}

// kindCounts are one backend's counts for one kind.
type kindCounts struct {
	// answers by predicted (0 cold, 1 warm) and delivered.
	answers [2][numDelivered]atomic.Int64
	// prompt and cached tokens of the answers with a usage report, by
	// predicted.
	prompt, cached [2]atomic.Int64
	// predicted is the key-prefix tokens of the answers predicted warm
	// with a usage report (each at most its prompt).
	predicted atomic.Int64
}

// cacheCounts are one backend's prediction counts, by kind.
type cacheCounts [numKinds]kindCounts

// count counts the answer to a request predicted pr, whose usage report
// is r.
func (c *cacheCounts) count(pr prediction, r usageReport) {
	if pr.kind == kindNone || pr.kind >= numKinds {
		return
	}
	k := &c[pr.kind]
	w := 0
	if pr.warm {
		w = 1
	}
	if r.result != usageOK && r.result != usageNoDetails {
		k.answers[w][deliveredUnknown].Add(1)
		return
	}
	d := deliveredCold
	if r.cached >= pr.needed(r.prompt) {
		d = deliveredWarm
	}
	k.answers[w][d].Add(1)
	k.prompt[w].Add(r.prompt)
	k.cached[w].Add(r.cached)
	if pr.warm {
		k.predicted.Add(pr.tokensOf(pr.prefix, r.prompt))
	}
}

// countUsage counts the usage report r of an answer from b to a request
// predicted pr: the backend's usage series and its prediction counts.
func (b *backend) countUsage(pr prediction, r usageReport) {
	b.m.countUsage(r)
	b.cache.count(pr, r)
	b.cost.observe(pr.kind, r)
}

// CacheFigures are the router's cache predictions for one decision kind
// and what the answers delivered, on one backend or summed over several.
type CacheFigures = cachefig.Figures

// CacheKinds are the decision kinds, in the order CacheFigures lists them.
func CacheKinds() []string { return append([]string(nil), kindNames[1:]...) }

// SumCache sums lists of figures (several backends', say) per kind, in
// the kinds' order, leaving out the kinds without answers.
func SumCache(lists ...[]CacheFigures) []CacheFigures {
	var out []CacheFigures
	for _, k := range kindNames[1:] {
		sum := CacheFigures{Kind: k}
		for _, l := range lists {
			for _, f := range l {
				if f.Kind == k {
					sum.Add(f)
				}
			}
		}
		if sum.Answers > 0 {
			out = append(out, sum)
		}
	}
	return out
}

// figures returns c's figures for the kinds that had answers, in kind
// order.
func (c *cacheCounts) figures() []CacheFigures {
	var out []CacheFigures
	for k := kindAffinity; k < numKinds; k++ {
		kc := &c[k]
		var f CacheFigures
		for w := range 2 {
			for d := range numDelivered {
				f.Answers += kc.answers[w][d].Load()
			}
		}
		if f.Answers == 0 {
			continue
		}
		f.Kind = kindNames[k]
		cw, cc := kc.answers[0][deliveredWarm].Load(), kc.answers[0][deliveredCold].Load()
		ww, wc := kc.answers[1][deliveredWarm].Load(), kc.answers[1][deliveredCold].Load()
		f.Reported = cw + cc + ww + wc
		f.PredictedWarm = ww + wc
		f.DeliveredWarm = cw + ww
		f.BothWarm = ww
		f.PromptTokens = kc.prompt[0].Load() + kc.prompt[1].Load()
		f.CachedTokens = kc.cached[0].Load() + kc.cached[1].Load()
		f.PredictedTokens = kc.predicted.Load()
		f.Rates()
		out = append(out, f)
	}
	return out
}

// cacheCollector exports the prediction counts, read from the backends'
// atomics at scrape time. A backend's series of a kind appear with its
// first answer of that kind, all of them at once.
type cacheCollector struct{ p *Proxy }

var (
	descCacheAnswers = prometheus.NewDesc("warmroute_cache_answers_total",
		"Answers to requests routed on a key, by decision kind (affinity, split, session, overflow, fallback, other), by what the router predicted of the backend's prefix cache (warm: it sent the key there within the last 10 minutes) and by what the answer's usage delivered (warm: cached tokens covering half the key's prefix, and past a split more than the split prefix; unknown: no usage report).",
		[]string{"backend", "kind", "predicted", "delivered"}, nil)
	descCachePrompt = prometheus.NewDesc("warmroute_cache_prompt_tokens_total",
		"Prompt tokens of the answers counted in warmroute_cache_answers_total with a usage report, by decision kind and prediction.",
		[]string{"backend", "kind", "predicted"}, nil)
	descCacheCached = prometheus.NewDesc("warmroute_cache_cached_tokens_total",
		"Cached prompt tokens (usage.prompt_tokens_details.cached_tokens) of the answers counted in warmroute_cache_answers_total with a usage report, by decision kind and prediction. Over warmroute_cache_prompt_tokens_total: the hit rate each kind delivered.",
		[]string{"backend", "kind", "predicted"}, nil)
	descCachePredicted = prometheus.NewDesc("warmroute_cache_predicted_tokens_total",
		"Tokens the router counted on finding cached: the key's prefix (its share of the body's bytes times the prompt tokens) of the answers predicted warm with a usage report, by decision kind.",
		[]string{"backend", "kind"}, nil)
)

func (c *cacheCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descCacheAnswers, descCachePrompt, descCacheCached, descCachePredicted} {
		ch <- d
	}
}

func (c *cacheCollector) Collect(ch chan<- prometheus.Metric) {
	for _, b := range c.p.tab.Load().bs {
		for k := kindAffinity; k < numKinds; k++ {
			kc := &b.cache[k]
			var n [2][numDelivered]int64
			answered := false
			for w := range 2 {
				for d := range numDelivered {
					n[w][d] = kc.answers[w][d].Load()
					answered = answered || n[w][d] != 0
				}
			}
			if !answered {
				continue
			}
			kn := kindNames[k]
			for w := range 2 {
				for d := range numDelivered {
					ch <- prometheus.MustNewConstMetric(descCacheAnswers, prometheus.CounterValue, float64(n[w][d]), b.id, kn, predictedNames[w], deliveredNames[d])
				}
				ch <- prometheus.MustNewConstMetric(descCachePrompt, prometheus.CounterValue, float64(kc.prompt[w].Load()), b.id, kn, predictedNames[w])
				ch <- prometheus.MustNewConstMetric(descCacheCached, prometheus.CounterValue, float64(kc.cached[w].Load()), b.id, kn, predictedNames[w])
			}
			ch <- prometheus.MustNewConstMetric(descCachePredicted, prometheus.CounterValue, float64(kc.predicted.Load()), b.id, kn)
		}
	}
}
