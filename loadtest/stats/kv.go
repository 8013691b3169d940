package stats

import "sort"

// CacheCounters are a backend's cumulative prefix-cache counters, in tokens
// (vLLM's prefix_cache_queries_total and prefix_cache_hits_total).
type CacheCounters struct {
	Queries float64 `json:"queries"`
	Hits    float64 `json:"hits"`
}

// since returns the increase from before to c. A decrease of either counter
// means the backend restarted (a counter reset, in Prometheus terms): the
// increase is then c itself.
func (c CacheCounters) since(before CacheCounters) CacheCounters {
	if c.Queries < before.Queries || c.Hits < before.Hits {
		return c
	}
	return CacheCounters{Queries: c.Queries - before.Queries, Hits: c.Hits - before.Hits}
}

// KVResult is the KV-cache hit rate over a window: hit tokens / queried
// tokens, summed over the fleet, and per backend.
type KVResult struct {
	HitRate       float64            `json:"hit_rate"`
	QueriedTokens float64            `json:"queried_tokens"`
	HitTokens     float64            `json:"hit_tokens"`
	ByBackend     map[string]float64 `json:"by_backend,omitempty"`
}

// HitRate computes the hit rate between two scrapes of the fleet, keyed by
// backend. A backend missing from before counts from zero (it started in
// the window); one missing from after is left out (its last scrape
// failed). Rates are 0 where nothing was queried.
func HitRate(before, after map[string]CacheCounters) KVResult {
	r := KVResult{ByBackend: make(map[string]float64, len(after))}
	names := make([]string, 0, len(after))
	for k := range after {
		names = append(names, k)
	}
	sort.Strings(names) // a fixed summation order: the same inputs give the same float
	for _, k := range names {
		d := after[k].since(before[k])
		r.QueriedTokens += d.Queries
		r.HitTokens += d.Hits
		r.ByBackend[k] = rate(d.Hits, d.Queries)
	}
	r.HitRate = rate(r.HitTokens, r.QueriedTokens)
	return r
}

func rate(hits, queries float64) float64 {
	if queries <= 0 {
		return 0
	}
	return hits / queries
}

// KVSample is the fleet's hit rate over one scrape interval ending Seconds
// after the start of the run.
type KVSample struct {
	Seconds       float64 `json:"t"`
	HitRate       float64 `json:"hit_rate"`
	QueriedTokens float64 `json:"queried_tokens"`
}
