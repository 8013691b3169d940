package stats

import "sort"

// Prediction is what routers predicted of one decision kind's answers
// (was the backend's prefix cache expected warm?) against what the
// answers delivered, counted by the routers themselves (their
// warmroute_cache_* metrics) and summed over routers and backends. Only
// answers with a usage report can be checked: Reported counts them, and
// the figures after it are of them.
type Prediction struct {
	// Kind is affinity, split, session, overflow, fallback or other.
	Kind     string `json:"kind"`
	Answers  int64  `json:"answers"`
	Reported int64  `json:"reported"`
	// PredictedWarm: the router had sent the key to that backend lately;
	// DeliveredWarm: the cached tokens covered at least half the key's
	// prefix; BothWarm: both.
	PredictedWarm int64 `json:"predicted_warm"`
	DeliveredWarm int64 `json:"delivered_warm"`
	BothWarm      int64 `json:"both_warm"`
	// Tokens of the reported answers; PredictedTokens is the key-prefix
	// tokens of those predicted warm (what the router counted on).
	PromptTokens    int64 `json:"prompt_tokens"`
	CachedTokens    int64 `json:"cached_tokens"`
	PredictedTokens int64 `json:"predicted_tokens"`
	// PredictedHitRate and DeliveredHitRate are PredictedWarm and
	// DeliveredWarm over Reported, TokenHitRate CachedTokens over
	// PromptTokens (0 with nothing to divide by).
	PredictedHitRate float64 `json:"predicted_hit_rate"`
	DeliveredHitRate float64 `json:"delivered_hit_rate"`
	TokenHitRate     float64 `json:"token_hit_rate"`
}

// PredictionCounters are a router's cumulative prediction counts by kind,
// as one scrape read them (rates not set).
type PredictionCounters map[string]Prediction

// Add adds c's counts, kind by kind (several routers' counters).
func (p PredictionCounters) Add(c PredictionCounters) {
	for k, v := range c {
		s := p[k]
		s.Kind = k
		s.Answers += v.Answers
		s.Reported += v.Reported
		s.PredictedWarm += v.PredictedWarm
		s.DeliveredWarm += v.DeliveredWarm
		s.BothWarm += v.BothWarm
		s.PromptTokens += v.PromptTokens
		s.CachedTokens += v.CachedTokens
		s.PredictedTokens += v.PredictedTokens
		p[k] = s
	}
}

// kindOrder is the order predictions are listed in; other kinds follow,
// by name.
var kindOrder = map[string]int{"affinity": 0, "split": 1, "session": 2, "overflow": 3, "fallback": 4, "other": 5}

// PredictionDelta returns what was counted between the scrapes start and
// end, per kind with answers, in kind order, with its rates. A count that
// went down (a router restarted) counts from 0.
func PredictionDelta(start, end PredictionCounters) []Prediction {
	var out []Prediction
	for k, e := range end {
		s := start[k]
		d := func(a, b int64) int64 {
			if a < b {
				return a
			}
			return a - b
		}
		p := Prediction{Kind: k,
			Answers: d(e.Answers, s.Answers), Reported: d(e.Reported, s.Reported),
			PredictedWarm: d(e.PredictedWarm, s.PredictedWarm), DeliveredWarm: d(e.DeliveredWarm, s.DeliveredWarm),
			BothWarm: d(e.BothWarm, s.BothWarm), PromptTokens: d(e.PromptTokens, s.PromptTokens),
			CachedTokens: d(e.CachedTokens, s.CachedTokens), PredictedTokens: d(e.PredictedTokens, s.PredictedTokens)}
		if p.Answers == 0 {
			continue
		}
		if p.Reported > 0 {
			p.PredictedHitRate = float64(p.PredictedWarm) / float64(p.Reported)
			p.DeliveredHitRate = float64(p.DeliveredWarm) / float64(p.Reported)
		}
		if p.PromptTokens > 0 {
			p.TokenHitRate = float64(p.CachedTokens) / float64(p.PromptTokens)
		}
		out = append(out, p)
	}
	sort.Slice(out, func(i, j int) bool {
		oi, iok := kindOrder[out[i].Kind]
		oj, jok := kindOrder[out[j].Kind]
		switch {
		case iok && jok:
			return oi < oj
		case iok != jok:
			return iok
		}
		return out[i].Kind < out[j].Kind
	})
	return out
}
