package kvmetrics

import (
	"fmt"
	"io"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/warmroute/warmroute/loadtest/stats"
)

// ParsePredictions reads a warmroute router's Prometheus text exposition
// (its admin /metrics) and returns its cache prediction counters
// (warmroute_cache_*_total) summed over backends, per decision kind. A
// router that answered no keyed request yet exports none: the result is
// then empty, not an error.
func ParsePredictions(r io.Reader) (stats.PredictionCounters, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(r)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrParse, err)
	}
	out := stats.PredictionCounters{}
	each := func(name string, fn func(c *stats.Prediction, labels map[string]string, v int64)) {
		f, ok := fams[name]
		if !ok {
			return
		}
		for _, m := range f.GetMetric() {
			labels := labelMap(m)
			kind := labels["kind"]
			if kind == "" {
				continue
			}
			v := value(m)
			if !(v >= 0 && v < 1e15) {
				continue // not a count (NaN, negative, absurd)
			}
			c := out[kind]
			c.Kind = kind
			fn(&c, labels, int64(v))
			out[kind] = c
		}
	}
	each("warmroute_cache_answers_total", func(c *stats.Prediction, l map[string]string, v int64) {
		c.Answers += v
		if l["delivered"] != "warm" && l["delivered"] != "cold" {
			return
		}
		c.Reported += v
		warm, delivered := l["predicted"] == "warm", l["delivered"] == "warm"
		if warm {
			c.PredictedWarm += v
		}
		if delivered {
			c.DeliveredWarm += v
		}
		if warm && delivered {
			c.BothWarm += v
		}
	})
	each("warmroute_cache_prompt_tokens_total", func(c *stats.Prediction, _ map[string]string, v int64) { c.PromptTokens += v })
	each("warmroute_cache_cached_tokens_total", func(c *stats.Prediction, _ map[string]string, v int64) { c.CachedTokens += v })
	each("warmroute_cache_predicted_tokens_total", func(c *stats.Prediction, _ map[string]string, v int64) { c.PredictedTokens += v })
	return out, nil
}

func labelMap(m *dto.Metric) map[string]string {
	l := make(map[string]string, len(m.GetLabel()))
	for _, lp := range m.GetLabel() {
		l[lp.GetName()] = lp.GetValue()
	}
	return l
}

// value is a sample's value, whatever its type.
func value(m *dto.Metric) float64 {
	switch {
	case m.GetCounter() != nil:
		return m.GetCounter().GetValue()
	case m.GetUntyped() != nil:
		return m.GetUntyped().GetValue()
	case m.GetGauge() != nil:
		return m.GetGauge().GetValue()
	}
	return 0
}
