package stats

import (
	"sort"

	"github.com/warmroute/warmroute/internal/cachefig"
)

// Prediction is what routers predicted of one decision kind's answers
// (was the backend's prefix cache expected warm?) against what the
// answers delivered, counted by the routers themselves (their
// warmroute_cache_* metrics) and summed over routers and backends.
type Prediction = cachefig.Figures

// PredictionCounters are a router's cumulative prediction counts by kind,
// as one scrape read them.
type PredictionCounters map[string]Prediction

// Add adds c's counts, kind by kind (several routers' counters).
func (p PredictionCounters) Add(c PredictionCounters) {
	for k, v := range c {
		s := p[k]
		s.Kind = k
		s.Add(v)
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
		p := e.Since(start[k])
		p.Kind = k
		if p.Answers == 0 {
			continue
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
