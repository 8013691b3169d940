package engine

import (
	"bytes"
	"fmt"
	"math"
	"strconv"
	"time"
)

// Stats is what one scrape of an engine reports. Known says which figures
// the engine exports; an unknown figure is zero. gossip.EngineStats
// carries the same figures and bits; the node copies them field by field
// (node/loadshare.go toGossip), since gossip does not import proxy.
type Stats struct {
	KVUsage       float64 // KV-cache blocks in use, 0..1
	Running       float64 // requests being processed
	Waiting       float64 // requests queued in the engine
	PrefixHitRate float64 // prefix-cache hit rate, 0..1
	Known         uint8   // KnownKVUsage | KnownRunning | ...
	Scraped       time.Time
	OK            bool // the scrape succeeded and found at least one figure
}

// Bits of Stats.Known (the same values as gossip's Engine* bits).
const (
	KnownKVUsage uint8 = 1 << iota
	KnownRunning
	KnownWaiting
	KnownPrefixHitRate
)

// Mapping names, for each figure, the metrics that carry it, in order of
// preference: the first name with at least one sample wins, so an engine
// that exports both a current and a deprecated name is not counted twice.
// Samples of the chosen name are summed over label sets (several engines
// or models per instance); ratios (KVUsage, PrefixHitRate) are averaged.
type Mapping struct {
	KVUsage       []string // gauge, 0..1
	Running       []string // gauge
	Waiting       []string // gauge
	PrefixHitRate []string // gauge, 0..1, for engines that export a rate
	// PrefixQueries and PrefixHits are counters (tokens queried and hit)
	// paired by position: the hit rate is their growth ratio between
	// scrapes. They take precedence over PrefixHitRate.
	PrefixQueries []string
	PrefixHits    []string
}

// DefaultMapping knows vLLM V1, vLLM V0 and early V1, SGLang and TGI.
// Counters are listed with and without the _total suffix Prometheus
// clients append.
func DefaultMapping() Mapping {
	return Mapping{
		KVUsage:       []string{"vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage"},
		Running:       []string{"vllm:num_requests_running", "sglang:num_running_reqs", "tgi_batch_current_size"},
		Waiting:       []string{"vllm:num_requests_waiting", "sglang:num_queue_reqs", "tgi_queue_size"},
		PrefixHitRate: []string{"vllm:gpu_prefix_cache_hit_rate", "sglang:cache_hit_rate"},
		PrefixQueries: []string{"vllm:prefix_cache_queries_total", "vllm:prefix_cache_queries", "vllm:gpu_prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries"},
		PrefixHits:    []string{"vllm:prefix_cache_hits_total", "vllm:prefix_cache_hits", "vllm:gpu_prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits"},
	}
}

// Figures a Parser collects.
const (
	fKV = iota
	fRunning
	fWaiting
	fHitRate
	fQueries
	fHits
	numFields
)

// maxNames bounds the names per figure.
const maxNames = 16

// maxValueLen bounds a sample value's text (Go writes any float64 in at
// most 24 characters): a longer value is skipped, not copied to be parsed.
const maxValueLen = 64

// Sample is one parse of a /metrics body: raw figures before the hit rate
// is derived from the counters.
type Sample struct {
	KVUsage, Running, Waiting, PrefixHitRate float64
	PrefixQueries, PrefixHits                float64
	// Known has the Known* bits of the figures found; HasCounters says
	// PrefixQueries and PrefixHits were found (from the same pair).
	Known       uint8
	HasCounters bool
}

// Parser extracts a Mapping's figures from Prometheus text exposition
// (format 0.0.4, and the OpenMetrics text the same engines serve). It is
// safe for concurrent use.
type Parser struct {
	names map[string]slot
}

type slot struct {
	field uint8
	prio  uint8
}

// NewParser compiles m.
func NewParser(m Mapping) (*Parser, error) {
	if len(m.PrefixQueries) != len(m.PrefixHits) {
		return nil, fmt.Errorf("engine: mapping: %d prefix query counters but %d hit counters", len(m.PrefixQueries), len(m.PrefixHits))
	}
	p := &Parser{names: make(map[string]slot)}
	for f, names := range [numFields][]string{m.KVUsage, m.Running, m.Waiting, m.PrefixHitRate, m.PrefixQueries, m.PrefixHits} {
		if len(names) > maxNames {
			return nil, fmt.Errorf("engine: mapping: more than %d names for one figure", maxNames)
		}
		for i, n := range names {
			if n == "" {
				return nil, fmt.Errorf("engine: mapping: empty metric name")
			}
			if _, dup := p.names[n]; dup {
				return nil, fmt.Errorf("engine: mapping: metric %q named twice", n)
			}
			p.names[n] = slot{field: uint8(f), prio: uint8(i)}
		}
	}
	return p, nil
}

type acc struct {
	sum float64
	n   int
}

// Parse reads one /metrics body. Lines it does not understand, and samples
// whose value is not a finite number, are skipped.
func (p *Parser) Parse(body []byte) Sample {
	var accs [numFields][maxNames]acc
	for len(body) > 0 {
		var line []byte
		if i := bytes.IndexByte(body, '\n'); i >= 0 {
			line, body = body[:i], body[i+1:]
		} else {
			line, body = body, nil
		}
		name, rest, inLabels, ok := metricName(line)
		if !ok {
			continue
		}
		s, ok := p.names[string(name)]
		if !ok {
			continue
		}
		v, ok := sampleValue(rest, inLabels)
		if !ok {
			continue
		}
		a := &accs[s.field][s.prio]
		a.sum += v
		a.n++
	}

	var out Sample
	// A sum that overflowed makes the figure unknown.
	pick := func(f int, mean bool) (float64, bool) {
		for i := range accs[f] {
			if a := accs[f][i]; a.n > 0 {
				v := a.sum
				if mean {
					v /= float64(a.n)
				}
				if math.IsInf(v, 0) || math.IsNaN(v) {
					return 0, false
				}
				return v, true
			}
		}
		return 0, false
	}
	var ok bool
	if out.KVUsage, ok = pick(fKV, true); ok {
		out.Known |= KnownKVUsage
	}
	if out.Running, ok = pick(fRunning, false); ok {
		out.Known |= KnownRunning
	}
	if out.Waiting, ok = pick(fWaiting, false); ok {
		out.Known |= KnownWaiting
	}
	if out.PrefixHitRate, ok = pick(fHitRate, true); ok {
		out.Known |= KnownPrefixHitRate
	}
	for i := range accs[fQueries] {
		q, h := accs[fQueries][i], accs[fHits][i]
		if q.n > 0 && h.n > 0 && !math.IsInf(q.sum, 0) && !math.IsInf(h.sum, 0) {
			out.PrefixQueries, out.PrefixHits, out.HasCounters = q.sum, h.sum, true
			break
		}
	}
	return out
}

// metricName returns the metric name of a sample line and the rest of the
// line after the name (labels, value, timestamp); inLabels says the rest
// starts inside an open label set (a quoted name). Comments, blank lines
// and malformed names report false.
func metricName(line []byte) (name, rest []byte, inLabels, ok bool) {
	i := 0
	for i < len(line) && (line[i] == ' ' || line[i] == '\t') {
		i++
	}
	line = line[i:]
	if len(line) == 0 || line[0] == '#' {
		return nil, nil, false, false
	}
	if line[0] == '{' {
		// Quoted name inside the braces: {"name",label="v"} 1
		j := 1
		for j < len(line) && line[j] == ' ' {
			j++
		}
		if j >= len(line) || line[j] != '"' {
			return nil, nil, false, false
		}
		end := bytes.IndexByte(line[j+1:], '"')
		if end < 0 {
			return nil, nil, false, false
		}
		name = line[j+1 : j+1+end]
		if bytes.IndexByte(name, '\\') >= 0 {
			return nil, nil, false, false // escaped names are not ours
		}
		return name, line[j+1+end+1:], true, true
	}
	j := 0
	for j < len(line) && isNameByte(line[j], j == 0) {
		j++
	}
	if j == 0 {
		return nil, nil, false, false
	}
	return line[:j], line[j:], false, true
}

func isNameByte(c byte, first bool) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '_' || c == ':' || (!first && c >= '0' && c <= '9')
}

// sampleValue parses what follows a metric name: an optional label set in
// braces (already open when inLabels), then the value (a timestamp after
// it is ignored).
func sampleValue(rest []byte, inLabels bool) (float64, bool) {
	if inLabels || (len(rest) > 0 && rest[0] == '{') {
		start := 1
		if inLabels {
			start = 0
		}
		end := labelsEnd(rest, start)
		if end < 0 {
			return 0, false
		}
		rest = rest[end+1:]
	}
	if len(rest) == 0 || (rest[0] != ' ' && rest[0] != '\t') {
		return 0, false
	}
	i := 0
	for i < len(rest) && (rest[i] == ' ' || rest[i] == '\t') {
		i++
	}
	rest = rest[i:]
	j := 0
	for j < len(rest) && rest[j] != ' ' && rest[j] != '\t' && rest[j] != '\r' {
		j++
	}
	if j == 0 || j > maxValueLen {
		return 0, false
	}
	v, err := strconv.ParseFloat(string(rest[:j]), 64)
	if err != nil || math.IsNaN(v) || math.IsInf(v, 0) {
		return 0, false
	}
	return v, true
}

// labelsEnd returns the index of the '}' closing the label set whose
// contents start at b[start], honouring quoted values with backslash
// escapes, or -1.
func labelsEnd(b []byte, start int) int {
	inQuote := false
	for i := start; i < len(b); i++ {
		switch c := b[i]; {
		case inQuote && c == '\\':
			i++
		case c == '"':
			inQuote = !inQuote
		case !inQuote && c == '}':
			return i
		}
	}
	return -1
}
