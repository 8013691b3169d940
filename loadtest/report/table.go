package report

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/warmroute/warmroute/loadtest/stats"
)

// Report is the result of a comparison: runs of the same workloads under
// different labels (routing strategies).
type Report struct {
	Title       string    `json:"title"`
	GeneratedAt time.Time `json:"generated_at"`
	// Command is how the report was produced.
	Command string `json:"command,omitempty"`
	// Build names the warmroute build that ran the comparison: version,
	// commit, toolchain.
	Build string `json:"build,omitempty"`
	// Engines says what served the requests: for the demo, simulated
	// engines and their latency model.
	Engines string `json:"engines,omitempty"`
	// Notes say what the comparison left out and how to run more.
	Notes []string `json:"notes,omitempty"`
	// Verdict is what PREFIX_AWARE bought against the other strategies
	// run; WriteHTML and WriteJSON fill it from Runs when nil.
	Verdict *Verdict `json:"verdict,omitempty"`
	// Setup describes the fleet and the workloads, one line each.
	Setup []string `json:"setup,omitempty"`
	// Partial is set when the comparison was interrupted.
	Partial bool `json:"partial,omitempty"`
	// Instances names the fleet's instances in address order (as gpusim
	// names them: instance i of a fleet on consecutive ports is its
	// name prefix + i); the charts label instances with these names
	// instead of their positions. Runs of a comparison use fleets of
	// their own on different ports, so instances are matched by position.
	Instances []string        `json:"instances,omitempty"`
	Runs      []stats.Summary `json:"runs"`
}

// WriteJSON writes r as indented JSON, with the verdict of its runs.
func WriteJSON(w io.Writer, r *Report) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r.withVerdict())
}

// withVerdict returns r, or a copy of it with the verdict of its runs when
// it has none.
func (r *Report) withVerdict() *Report {
	if r.Verdict != nil {
		return r
	}
	c := *r
	c.Verdict = NewVerdict(r.Runs, Candidate)
	return &c
}

// workloads returns the workloads of runs in first-seen order.
func workloads(runs []stats.Summary) []string {
	var out []string
	seen := map[string]bool{}
	for _, r := range runs {
		if !seen[r.Workload] {
			seen[r.Workload] = true
			out = append(out, r.Workload)
		}
	}
	return out
}

func pct(f float64) string { return fmt.Sprintf("%.1f%%", 100*f) }

func msec(v float64) string {
	switch {
	case v == 0:
		return "-"
	case v < 10:
		return fmt.Sprintf("%.1f", v)
	default:
		return fmt.Sprintf("%.0f", v)
	}
}

// shareRange returns "min-max" of the shares over the expected backends
// (all those in Shares) and the max/min ratio as text, followed by the
// even-split floor in parentheses when known.
func shareRange(s *stats.Summary) (string, string) {
	if len(s.Shares) == 0 {
		return "-", "-"
	}
	lo, hi := math.Inf(1), 0.0
	for _, v := range s.Shares {
		lo, hi = math.Min(lo, v), math.Max(hi, v)
	}
	ratio := "inf"
	if s.ShareMaxMin > 0 {
		ratio = fmt.Sprintf("%.2f", s.ShareMaxMin)
	}
	if s.ShareFloor > 0 {
		ratio += fmt.Sprintf(" (%.2f)", s.ShareFloor)
	}
	return fmt.Sprintf("%.1f-%.1f%%", 100*lo, 100*hi), ratio
}

// errorText lists error kinds by count.
func errorText(s *stats.Summary) string {
	if s.Failed == 0 {
		if s.Canceled > 0 {
			return fmt.Sprintf("0 (%d canceled)", s.Canceled)
		}
		return "0"
	}
	kinds := make([]string, 0, len(s.Errors))
	for k := range s.Errors {
		kinds = append(kinds, k)
	}
	sort.Slice(kinds, func(i, j int) bool { return s.Errors[kinds[i]] > s.Errors[kinds[j]] })
	parts := make([]string, len(kinds))
	for i, k := range kinds {
		parts[i] = fmt.Sprintf("%s %d", k, s.Errors[k])
	}
	return strings.Join(parts, ", ")
}

var decisionAbbrev = map[string]string{
	"affinity": "aff", "overflow": "ovf", "fallback": "fb",
}

// decisionText gives the router's decisions as percentages.
func decisionText(s *stats.Summary) string {
	var total int64
	for _, n := range s.Decisions {
		total += n
	}
	if total == 0 {
		return "-"
	}
	keys := make([]string, 0, len(s.Decisions))
	for k := range s.Decisions {
		keys = append(keys, k)
	}
	order := map[string]int{"affinity": 0, "overflow": 1, "fallback": 2}
	sort.Slice(keys, func(i, j int) bool {
		oi, iok := order[keys[i]]
		oj, jok := order[keys[j]]
		switch {
		case iok && jok:
			return oi < oj
		case iok != jok:
			return iok
		}
		return keys[i] < keys[j]
	})
	parts := make([]string, len(keys))
	for i, k := range keys {
		name := k
		if a, ok := decisionAbbrev[k]; ok {
			name = a
		}
		parts[i] = fmt.Sprintf("%s %.0f%%", name, 100*float64(s.Decisions[k])/float64(total))
	}
	return strings.Join(parts, " ")
}

func kvText(s *stats.Summary) string {
	if s.KV == nil {
		if s.PromptTokens > 0 {
			return pct(s.UsageCachedRate) + "*"
		}
		return "-"
	}
	return pct(s.KV.HitRate)
}

// boundTexts gives the offline bounds next to the measured hit rate: the
// infinite cache's and the fleet's ("-" when not computed; "~" when they
// cover only the first requests).
func boundTexts(s *stats.Summary) (string, string) {
	b := s.Bounds
	if b == nil {
		return "-", "-"
	}
	mark := ""
	if b.Truncated {
		mark = "~"
	}
	return pct(b.HitRate) + mark, pct(b.FleetHitRate) + mark
}

// boundsNote describes the bounds of runs in one line ("" when none has
// them).
func boundsNote(runs []stats.Summary) string {
	var fleets []string
	seen := map[string]bool{}
	truncated := false
	for i := range runs {
		b := runs[i].Bounds
		if b == nil {
			continue
		}
		truncated = truncated || b.Truncated
		f := fmt.Sprintf("%d caches of %d blocks of %d tokens", b.Caches, b.CacheBlocks, b.BlockTokens)
		if !seen[f] {
			seen[f] = true
			fleets = append(fleets, f)
		}
	}
	if len(fleets) == 0 {
		return ""
	}
	note := "bound: KV hit rate of an infinite cache on the requests sent; fleet bound: " +
		strings.Join(fleets, "; ") + ", each request on the cache with its longest cached prefix under a load cap (docs/loadtest.md)"
	if truncated {
		note += "; ~ over the first requests only (too many distinct blocks)"
	}
	return note
}

// shareNote explains the share columns under a table.
const shareNote = "max/min: the busiest backend's share of the requests over the least busy one's; (even): the median max/min of as many requests each sent to a backend drawn at random, what hashing with perfect luck gives (only choosing per request by load, as least-outstanding does, goes below it)"

// WriteTable writes one row per run, grouped by workload, then for every
// workload run under both RANDOM and PREFIX_AWARE the ratios between them,
// the routers' predictions and, last, the verdict. Next to the measured
// KV hit rate are the offline bounds of the requests sent, when computed.
func WriteTable(w io.Writer, runs []stats.Summary) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "workload\tstrategy\treq/s\tout tok/s\tKV hit\tbound\tfleet bound\tTTFT p50\tp90\tp99\tITL p50\tE2E p50\tp99\tshare min-max\tmax/min (even)\terrors\tdecisions\t")
	fmt.Fprintln(tw, "\t\t\t\t\t\t\t(ms)\t(ms)\t(ms)\t(ms)\t(ms)\t(ms)\t\t\t\t\t")
	usage := false
	for _, wl := range workloads(runs) {
		for i := range runs {
			s := &runs[i]
			if s.Workload != wl {
				continue
			}
			if s.KV == nil && s.PromptTokens > 0 {
				usage = true
			}
			label := s.Label
			if s.Partial {
				label += " (partial)"
			}
			rng, ratio := shareRange(s)
			bound, fleet := boundTexts(s)
			fmt.Fprintf(tw, "%s\t%s\t%.1f\t%.0f\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n",
				wl, label, s.RequestsPerSec, s.OutputTokensPerSec, kvText(s), bound, fleet,
				msec(s.TTFT.P50Ms), msec(s.TTFT.P90Ms), msec(s.TTFT.P99Ms), msec(s.ITL.P50Ms),
				msec(s.E2E.P50Ms), msec(s.E2E.P99Ms), rng, ratio, errorText(s), decisionText(s))
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if usage {
		fmt.Fprintln(w, "* from the responses' usage.prompt_tokens_details.cached_tokens (no backend metrics)")
	}
	if note := boundsNote(runs); note != "" {
		fmt.Fprintln(w, note)
	}
	fmt.Fprintln(w, shareNote)
	for _, c := range comparisons(runs, "RANDOM", "PREFIX_AWARE") {
		fmt.Fprintln(w, c.String())
	}
	if err := writePredictions(w, runs); err != nil {
		return err
	}
	if err := writeAgreement(w, runs); err != nil {
		return err
	}
	return writeVerdict(w, NewVerdict(runs, Candidate))
}

// writeVerdict writes the verdict's sentences last, where a terminal
// leaves them in view.
func writeVerdict(w io.Writer, v *Verdict) error {
	ss := v.Sentences()
	if len(ss) == 0 {
		return nil
	}
	fmt.Fprintf(w, "\nverdict: what %s bought on this fleet\n", v.Candidate)
	for _, s := range ss {
		if _, err := fmt.Fprintln(w, "- "+s); err != nil {
			return err
		}
	}
	return nil
}

// predictionRow is one decision kind of one run, as text.
type predictionRow struct {
	Workload, Label, Kind                                       string
	Answers, Reported, Predicted, Delivered, Both, TokenHitRate string
}

// predictionRows lists the runs' predictions, by workload, run and kind.
func predictionRows(runs []stats.Summary) []predictionRow {
	var out []predictionRow
	for _, wl := range workloads(runs) {
		for i := range runs {
			s := &runs[i]
			if s.Workload != wl {
				continue
			}
			for _, p := range s.Predictions {
				of := func(n int64) string {
					if p.Reported == 0 {
						return "-"
					}
					return fmt.Sprintf("%d (%s)", n, pct(float64(n)/float64(p.Reported)))
				}
				tok := "-"
				if p.PromptTokens > 0 {
					tok = pct(p.TokenHitRate)
				}
				out = append(out, predictionRow{Workload: wl, Label: s.Label, Kind: p.Kind,
					Answers: fmt.Sprint(p.Answers), Reported: fmt.Sprint(p.Reported),
					Predicted: of(p.PredictedWarm), Delivered: of(p.DeliveredWarm), Both: fmt.Sprint(p.BothWarm), TokenHitRate: tok})
			}
		}
	}
	return out
}

// predictionNote explains the predictions table.
const predictionNote = "predicted warm: the router had sent the request's key to that backend in the last 10 minutes; delivered warm: the engine's cached_tokens covered the key's prefix (half of it; past a split, the split prefix and half a block more); shares of the answers with a usage report; token hit: cached over prompt tokens of those answers. Counted by the routers over the measured window (docs/loadtest.md)"

// writePredictions writes the routers' cache predictions against what was
// delivered, per run and decision kind, when any run has them.
func writePredictions(w io.Writer, runs []stats.Summary) error {
	rows := predictionRows(runs)
	if len(rows) == 0 {
		return nil
	}
	fmt.Fprintln(w, "\npredicted against delivered, per decision kind")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "workload\tstrategy\tkind\tanswers\twith usage\tpredicted warm\tdelivered warm\tboth\ttoken hit\t")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", r.Workload, r.Label, r.Kind, r.Answers, r.Reported, r.Predicted, r.Delivered, r.Both, r.TokenHitRate)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w, predictionNote)
	return nil
}

// comparison sets a candidate run against a baseline run of the same
// workload.
type comparison struct {
	Workload, Baseline, Candidate string
	// KV hit rates and their ratio (candidate / baseline; 0 if the baseline
	// is 0).
	BaseHit, CandHit, HitRatio float64
	// TTFTRatio is candidate p50 TTFT / baseline p50 TTFT.
	TTFTRatio float64
	// ThroughputRatio compares output tokens per second.
	ThroughputRatio float64
	// CandShareMaxMin is the candidate's max/min traffic share.
	CandShareMaxMin float64
}

func (c comparison) String() string {
	hit := "n/a"
	if c.HitRatio > 0 {
		hit = fmt.Sprintf("%.1fx", c.HitRatio)
	}
	bal := "inf"
	if c.CandShareMaxMin > 0 {
		bal = fmt.Sprintf("%.2f", c.CandShareMaxMin)
	}
	return fmt.Sprintf("%s: %s vs %s: KV hit %s vs %s (%s), p50 TTFT x%.2f, output tokens/s x%.2f, max/min share %s",
		c.Workload, c.Candidate, c.Baseline, pct(c.CandHit), pct(c.BaseHit), hit, c.TTFTRatio, c.ThroughputRatio, bal)
}

// comparisons pairs, per workload, the run labelled baseline with the run
// labelled candidate.
func comparisons(runs []stats.Summary, baseline, candidate string) []comparison {
	var out []comparison
	for _, wl := range workloads(runs) {
		var b, c *stats.Summary
		for i := range runs {
			if runs[i].Workload != wl {
				continue
			}
			switch runs[i].Label {
			case baseline:
				b = &runs[i]
			case candidate:
				c = &runs[i]
			}
		}
		if b == nil || c == nil {
			continue
		}
		cmp := comparison{Workload: wl, Baseline: baseline, Candidate: candidate,
			BaseHit: hitRate(b), CandHit: hitRate(c), CandShareMaxMin: c.ShareMaxMin}
		if cmp.BaseHit > 0 {
			cmp.HitRatio = cmp.CandHit / cmp.BaseHit
		}
		if b.TTFT.P50Ms > 0 {
			cmp.TTFTRatio = c.TTFT.P50Ms / b.TTFT.P50Ms
		}
		if b.OutputTokensPerSec > 0 {
			cmp.ThroughputRatio = c.OutputTokensPerSec / b.OutputTokensPerSec
		}
		out = append(out, cmp)
	}
	return out
}

func hitRate(s *stats.Summary) float64 {
	if s.KV != nil {
		return s.KV.HitRate
	}
	return s.UsageCachedRate
}

// writeAgreement writes, for the runs that asked the routers where the
// same requests would go (demo --agreement), how often they chose alike.
func writeAgreement(w io.Writer, runs []stats.Summary) error {
	header := false
	for _, r := range runs {
		a := r.Agreement
		if a == nil {
			continue
		}
		if !header {
			fmt.Fprintln(w, "\nagreement: every router asked where the workload's first requests would go, at the same moment, from the end of the warm-up to the end of the run")
			header = true
		}
		line := fmt.Sprintf("  %s / %s: %d routers, %d rounds: picks agreed on %s, owners on %s; every answer of a round at one epoch in %d of %d rounds",
			r.Workload, r.Label, a.Routers, a.Rounds, ofCount(a.Picks, a.Compared), ofCount(a.Owners, a.Compared), a.SameEpoch, a.Rounds)
		if a.SameEpoch < a.Rounds {
			line += fmt.Sprintf("; picks in those rounds %s", ofCount(a.SteadyPicks, a.SteadyCompared))
		}
		if a.Failed > 0 {
			line += fmt.Sprintf("; %d calls unanswered", a.Failed)
		}
		if _, err := fmt.Fprintln(w, line); err != nil {
			return err
		}
		if a.First != "" {
			fmt.Fprintf(w, "    first disagreement: %s\n", a.First)
		}
		if a.FirstSteady != "" && a.FirstSteady != a.First {
			fmt.Fprintf(w, "    first disagreement at one epoch: %s\n", a.FirstSteady)
		}
	}
	return nil
}

// ofCount is "k of n (p%)".
func ofCount(k, n int) string {
	if n == 0 {
		return "0 of 0"
	}
	return fmt.Sprintf("%d of %d (%.1f%%)", k, n, 100*float64(k)/float64(n))
}
