package kvmetrics

import (
	"errors"
	"fmt"
	"io"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/warmroute/warmroute/loadtest/stats"
)

// Errors returned by Parse.
var (
	// ErrNoCounters means the exposition parsed but holds no prefix-cache
	// counters (not a vLLM-compatible engine, or prefix caching is off).
	ErrNoCounters = errors.New("kvmetrics: no prefix-cache counters")
	// ErrParse wraps a malformed exposition.
	ErrParse = errors.New("kvmetrics: malformed metrics")
)

// names pairs the queries and hits counters of one engine generation.
type names struct{ queries, hits string }

var known = []names{
	{"vllm:prefix_cache_queries", "vllm:prefix_cache_hits"},
	{"vllm:gpu_prefix_cache_queries", "vllm:gpu_prefix_cache_hits"},
}

// Parse reads a Prometheus text exposition and returns the first known pair
// of prefix-cache counters, each summed over its series (label sets such as
// model_name and engine).
func Parse(r io.Reader) (stats.CacheCounters, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(r)
	if err != nil {
		return stats.CacheCounters{}, fmt.Errorf("%w: %v", ErrParse, err)
	}
	for _, n := range known {
		q, okq := sum(fams, n.queries)
		h, okh := sum(fams, n.hits)
		if okq && okh {
			return stats.CacheCounters{Queries: q, Hits: h}, nil
		}
	}
	return stats.CacheCounters{}, ErrNoCounters
}

// sum adds the samples of a counter found under base or base_total.
func sum(fams map[string]*dto.MetricFamily, base string) (float64, bool) {
	found := false
	total := 0.0
	for _, name := range []string{base + "_total", base} {
		f, ok := fams[name]
		if !ok {
			continue
		}
		for _, m := range f.GetMetric() {
			switch {
			case m.GetCounter() != nil:
				total += m.GetCounter().GetValue()
			case m.GetUntyped() != nil:
				total += m.GetUntyped().GetValue()
			case m.GetGauge() != nil:
				total += m.GetGauge().GetValue()
			default:
				continue
			}
			found = true
		}
		if found {
			return total, true
		}
	}
	return 0, false
}
