package cachefig

// Figures are a router's cache predictions for one decision kind and what
// the answers delivered, on one backend or summed over several (or over
// routers). Only answers with a usage report can be checked: Reported
// counts them, and every figure after it is of them.
type Figures struct {
	// Kind is affinity, split, session, overflow, fallback or other.
	Kind string `json:"kind"`
	// Answers is the answers counted; Reported those with a valid usage
	// report.
	Answers  int64 `json:"answers"`
	Reported int64 `json:"reported"`
	// PredictedWarm is the answers the router expected warm (it had sent
	// their key to the backend lately), DeliveredWarm those whose cached
	// tokens covered the key's prefix (half of it, or past a split more
	// than the split prefix), BothWarm those that were both.
	PredictedWarm int64 `json:"predicted_warm"`
	DeliveredWarm int64 `json:"delivered_warm"`
	BothWarm      int64 `json:"both_warm"`
	// PromptTokens and CachedTokens are what the usage reports said;
	// PredictedTokens is the key-prefix tokens of the answers predicted
	// warm: what the router counted on, a floor of what a warm cache
	// gives, as the engine's match goes on past the key.
	PromptTokens    int64 `json:"prompt_tokens"`
	CachedTokens    int64 `json:"cached_tokens"`
	PredictedTokens int64 `json:"predicted_tokens"`
	// PredictedHitRate and DeliveredHitRate are PredictedWarm and
	// DeliveredWarm over Reported; TokenHitRate is CachedTokens over
	// PromptTokens (0 with nothing to divide by).
	PredictedHitRate float64 `json:"predicted_hit_rate"`
	DeliveredHitRate float64 `json:"delivered_hit_rate"`
	TokenHitRate     float64 `json:"token_hit_rate"`
}

// Add adds o's counts to f (kinds are not checked) and recomputes the
// rates.
func (f *Figures) Add(o Figures) {
	f.Answers += o.Answers
	f.Reported += o.Reported
	f.PredictedWarm += o.PredictedWarm
	f.DeliveredWarm += o.DeliveredWarm
	f.BothWarm += o.BothWarm
	f.PromptTokens += o.PromptTokens
	f.CachedTokens += o.CachedTokens
	f.PredictedTokens += o.PredictedTokens
	f.Rates()
}

// Since returns what was counted from start to f (two readings of the
// same cumulative counters), with its rates; f's kind. A count that went
// down (a router restarted) counts from 0.
func (f Figures) Since(start Figures) Figures {
	d := func(end, begin int64) int64 {
		if end < begin {
			return end
		}
		return end - begin
	}
	out := Figures{Kind: f.Kind,
		Answers: d(f.Answers, start.Answers), Reported: d(f.Reported, start.Reported),
		PredictedWarm: d(f.PredictedWarm, start.PredictedWarm), DeliveredWarm: d(f.DeliveredWarm, start.DeliveredWarm),
		BothWarm: d(f.BothWarm, start.BothWarm), PromptTokens: d(f.PromptTokens, start.PromptTokens),
		CachedTokens: d(f.CachedTokens, start.CachedTokens), PredictedTokens: d(f.PredictedTokens, start.PredictedTokens)}
	out.Rates()
	return out
}

// Rates recomputes the rates from the counts.
func (f *Figures) Rates() {
	f.PredictedHitRate, f.DeliveredHitRate, f.TokenHitRate = 0, 0, 0
	if f.Reported > 0 {
		f.PredictedHitRate = float64(f.PredictedWarm) / float64(f.Reported)
		f.DeliveredHitRate = float64(f.DeliveredWarm) / float64(f.Reported)
	}
	if f.PromptTokens > 0 {
		f.TokenHitRate = float64(f.CachedTokens) / float64(f.PromptTokens)
	}
}
