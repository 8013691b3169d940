package report

import (
	"fmt"
	"math"
	"strings"

	"github.com/warmroute/warmroute/loadtest/stats"
)

// Candidate is the strategy a verdict speaks for.
const Candidate = "PREFIX_AWARE"

// Within these margins two runs count as level: a p50 TTFT ratio under
// sameTTFT (and a difference under sameTTFTMs, below which a busy 2-core
// machine's scheduling noise dominates), a share of recomputed prompt
// tokens within samePrefill of the other's (relative) or samePoints
// (absolute). The figures are always printed next to the words, so a
// reader can judge a verdict near a margin.
const (
	sameTTFT    = 1.15
	sameTTFTMs  = 20
	samePrefill = 1.05
	samePoints  = 0.01
)

// Verdict is what the candidate strategy bought against each other
// strategy run on the same workload, in time to first token and in
// prefill (prompt tokens the engines recomputed rather than found in their
// KV cache).
type Verdict struct {
	Candidate string            `json:"candidate"`
	Workloads []WorkloadVerdict `json:"workloads"`
}

// WorkloadVerdict compares the candidate's run of one workload with the
// baselines' runs of it.
type WorkloadVerdict struct {
	Workload  string      `json:"workload"`
	Candidate RunFigure   `json:"candidate"`
	Baselines []RunFigure `json:"baselines"`
}

// RunFigure is what a verdict reads from one run.
type RunFigure struct {
	Label     string  `json:"label"`
	TTFTP50Ms float64 `json:"ttft_p50_ms"`
	TTFTP90Ms float64 `json:"ttft_p90_ms"`
	// HitRate is the share of prompt tokens found in the KV cache (the
	// engines' counters, else the answers' usage); Recomputed is the rest,
	// the share the engines prefilled.
	HitRate    float64 `json:"hit_rate"`
	Recomputed float64 `json:"recomputed"`
	// PromptTokens is the average prompt of the answered requests, in
	// tokens (0 without usage reports).
	PromptTokens float64 `json:"prompt_tokens_per_request"`
	Answered     int64   `json:"answered"`
	// Sent counts the requests sent, warm-up included; Unanswered those
	// of them that failed or were still waiting when the run stopped,
	// whose TTFT is in no percentile above.
	Sent       int64 `json:"sent"`
	Unanswered int64 `json:"unanswered"`
	Partial    bool  `json:"partial,omitempty"`
}

func figureOf(s *stats.Summary) RunFigure {
	f := RunFigure{
		Label: s.Label, TTFTP50Ms: s.TTFT.P50Ms, TTFTP90Ms: s.TTFT.P90Ms,
		HitRate: hitRate(s), Answered: s.OK, Sent: s.Sent, Unanswered: s.Failed + s.Canceled, Partial: s.Partial,
	}
	f.Recomputed = 1 - f.HitRate
	if s.OK > 0 {
		f.PromptTokens = float64(s.PromptTokens) / float64(s.OK)
	}
	return f
}

// NewVerdict compares, per workload, the run labelled candidate with every
// other run of that workload; workloads without a candidate run, or with
// nothing to compare it with, are left out (nil when none is left).
func NewVerdict(runs []stats.Summary, candidate string) *Verdict {
	v := &Verdict{Candidate: candidate}
	for _, wl := range workloads(runs) {
		var cand *stats.Summary
		var base []*stats.Summary
		for i := range runs {
			switch {
			case runs[i].Workload != wl:
			case runs[i].Label == candidate && cand == nil:
				cand = &runs[i]
			default:
				base = append(base, &runs[i])
			}
		}
		if cand == nil || len(base) == 0 {
			continue
		}
		w := WorkloadVerdict{Workload: wl, Candidate: figureOf(cand)}
		for _, b := range base {
			w.Baselines = append(w.Baselines, figureOf(b))
		}
		v.Workloads = append(v.Workloads, w)
	}
	if len(v.Workloads) == 0 {
		return nil
	}
	return v
}

// Sentences says the verdict in words, one sentence per workload, then
// one for each run that left requests unanswered.
func (v *Verdict) Sentences() []string {
	if v == nil {
		return nil
	}
	var out []string
	for _, w := range v.Workloads {
		c := w.Candidate
		clauses := make([]string, 0, len(w.Baselines))
		for _, b := range w.Baselines {
			clauses = append(clauses, fmt.Sprintf("%s, with %s", ttftPhrase(c, b), prefillPhrase(c, b)))
		}
		s := fmt.Sprintf("%s: %s was %s", w.Workload, v.Candidate, strings.Join(clauses, "; "))
		if c.Partial {
			s += " (interrupted: partial runs)"
		}
		out = append(out, s+".")
		for _, b := range append([]RunFigure{c}, w.Baselines...) {
			if b.Unanswered > 0 {
				out = append(out, fmt.Sprintf("%s under %s: %d of the %d requests sent (warm-up included) got no answer, failed or still waiting when the run stopped; their time to first token is longer than any counted.",
					w.Workload, b.Label, b.Unanswered, b.Sent))
			}
		}
	}
	return out
}

// ttftPhrase compares the candidate's median time to first token with
// b's.
func ttftPhrase(c, b RunFigure) string {
	fig := fmt.Sprintf("p50 TTFT %s against %s", duration(c.TTFTP50Ms), duration(b.TTFTP50Ms))
	switch {
	case c.TTFTP50Ms <= 0 || b.TTFTP50Ms <= 0:
		return fmt.Sprintf("not comparable in TTFT with %s (%s)", b.Label, fig)
	case b.TTFTP50Ms/c.TTFTP50Ms >= sameTTFT && b.TTFTP50Ms-c.TTFTP50Ms >= sameTTFTMs:
		return fmt.Sprintf("%s faster to the first token than %s (%s)", times(b.TTFTP50Ms/c.TTFTP50Ms), b.Label, fig)
	case c.TTFTP50Ms/b.TTFTP50Ms >= sameTTFT && c.TTFTP50Ms-b.TTFTP50Ms >= sameTTFTMs:
		return fmt.Sprintf("%s slower to the first token than %s (%s)", times(c.TTFTP50Ms/b.TTFTP50Ms), b.Label, fig)
	}
	return fmt.Sprintf("as fast to the first token as %s (%s)", b.Label, fig)
}

// prefillPhrase compares the share of prompt tokens the engines
// recomputed under the candidate with b's, and says how many tokens that
// is per request at the candidate's average prompt.
func prefillPhrase(c, b RunFigure) string {
	fig := fmt.Sprintf("%s of prompt tokens recomputed against %s", pct(c.Recomputed), pct(b.Recomputed))
	// tokens is the difference per request at the candidate's average
	// prompt: what its routing saved, or cost, each request.
	tokens := func(word string) string {
		if c.PromptTokens <= 0 {
			return ""
		}
		return fmt.Sprintf(": %s %s tokens to prefill a request of %s", grouped(math.Abs(b.Recomputed-c.Recomputed)*c.PromptTokens), word, grouped(c.PromptTokens))
	}
	switch {
	case math.Abs(b.Recomputed-c.Recomputed) < samePoints:
	case c.Recomputed <= 0:
		return fmt.Sprintf("no prefill at all (%s%s)", fig, tokens("fewer"))
	case b.Recomputed/c.Recomputed >= samePrefill:
		return fmt.Sprintf("%s less prefill (%s%s)", times(b.Recomputed/c.Recomputed), fig, tokens("fewer"))
	case b.Recomputed <= 0:
		return fmt.Sprintf("more prefill (%s%s)", fig, tokens("more"))
	case c.Recomputed/b.Recomputed >= samePrefill:
		return fmt.Sprintf("%s more prefill (%s%s)", times(c.Recomputed/b.Recomputed), fig, tokens("more"))
	}
	return "the same prefill (" + fig + ")"
}

// times writes a ratio: 1.3x, 12x, 165x.
func times(r float64) string {
	if r >= 10 {
		return fmt.Sprintf("%.0fx", r)
	}
	return fmt.Sprintf("%.1fx", r)
}

// duration writes milliseconds as ms below 10 s and s above.
func duration(ms float64) string {
	switch {
	case ms <= 0:
		return "-"
	case ms >= 10000:
		return fmt.Sprintf("%.1f s", ms/1000)
	case ms >= 1000:
		return fmt.Sprintf("%.2f s", ms/1000)
	}
	return fmt.Sprintf("%.0f ms", ms)
}

// grouped writes a count rounded to an integer with thousands separated
// by commas.
func grouped(v float64) string {
	s := fmt.Sprintf("%.0f", math.Round(v))
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, r := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(r)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}
