package report

import (
	"fmt"
	"html/template"
	"io"
	"sort"
	"strings"

	"github.com/warmroute/warmroute/loadtest/stats"
)

type htmlRow struct {
	Label, KV, Bound, FleetBound, ReqS, TokS, TTFT50, TTFT90, TTFT99, ITL50, E2E50, E2E99, Range, Ratio, Errors, Decisions string
	Partial                                                                                                                bool
}

type htmlWorkload struct {
	Name        string
	Rows        []htmlRow
	BoundsNote  string
	Predictions []predictionRow
	Charts      []template.HTML
}

// verdictRow is one baseline of one workload in the verdict's table.
type verdictRow struct {
	Workload, Baseline, TTFT50, TTFT90, Recomputed, Saved string
}

type htmlPage struct {
	*Report
	Sentences      []string
	VerdictRows    []verdictRow
	Workloads      []htmlWorkload
	ShareNote      string
	PredictionNote string
}

// The page is laid out for a screen 1,400 pixels wide: the body is at
// most 1,320 pixels, every table fits in it (the per-workload figures are
// split in two tables for that), and a table that would not still
// scrolls inside its own box instead of being cut.
var page = template.Must(template.New("report").Parse(`<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{{.Title}}</title>
<style>
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:24px auto;max-width:1320px;padding:0 16px;color:#222}
h1{font-size:22px;margin-bottom:4px}h2{font-size:18px;margin-top:32px;border-bottom:1px solid #ddd}h3{font-size:15px;margin:18px 0 4px}
.meta{color:#666;font-size:13px}code{background:#f3f3f3;padding:1px 4px;border-radius:3px}
.wide{overflow-x:auto;max-width:100%}
table{border-collapse:collapse;font-variant-numeric:tabular-nums;margin:8px 0}
th,td{padding:3px 8px;border-bottom:1px solid #eee;text-align:right;white-space:nowrap}
th:first-child,td:first-child{text-align:left}th{background:#fafafa;font-weight:600}
.warn{background:#fff3cd;padding:8px;border:1px solid #e0c36a}
.verdict{background:#f4f8fc;border:1px solid #c9daea;padding:4px 16px 10px;margin:12px 0}
.verdict h2{margin-top:8px;border:0}.verdict li{margin:4px 0}
.verdict td:nth-child(2),.verdict th:nth-child(2){text-align:left}
.engines{background:#f7f7f7;border-left:3px solid #999;padding:6px 10px}
.charts{display:flex;flex-wrap:wrap;gap:12px}
svg{background:#fff;border:1px solid #eee}
svg .title{font-size:13px;font-weight:600}svg .tick{font-size:10px;fill:#555}svg .axis{font-size:11px;fill:#333}
svg .legend{font-size:11px}svg .grid{stroke:#eee}svg .ref{stroke:#555;stroke-dasharray:4 3}
</style></head><body>
<h1>{{.Title}}</h1>
<p class="meta">Generated {{.GeneratedAt.Format "2006-01-02 15:04:05 MST"}}{{if .Command}} by <code>{{.Command}}</code>{{end}}{{if .Build}}; build: {{.Build}}{{end}}</p>
{{if .Partial}}<p class="warn">Interrupted: the runs below are partial.</p>{{end}}
{{if .Sentences}}<section class="verdict">
<h2>Verdict: what {{.Verdict.Candidate}} bought on this fleet</h2>
<ul>{{range .Sentences}}<li>{{.}}</li>{{end}}</ul>
<div class="wide"><table>
<tr><th>workload</th><th>against</th><th>p50 TTFT</th><th>p90 TTFT</th><th>prompt recomputed</th><th>prefill saved a request</th></tr>
{{range .VerdictRows}}<tr><td>{{.Workload}}</td><td>{{.Baseline}}</td><td>{{.TTFT50}}</td><td>{{.TTFT90}}</td><td>{{.Recomputed}}</td><td>{{.Saved}}</td></tr>
{{end}}</table></div>
<p class="meta">Each pair of figures is {{.Verdict.Candidate}}'s, then the other strategy's. Prompt recomputed: the share of prompt tokens the engines prefilled rather than found in their KV cache (their prefix-cache counters over the measured window). Prefill saved: the difference in that share, in tokens, at {{.Verdict.Candidate}}'s average prompt (in parentheses); a minus sign means more prefill.</p>
</section>{{end}}
{{if .Engines}}<p class="engines">{{.Engines}}</p>{{end}}
{{if .Notes}}<ul class="meta">{{range .Notes}}<li>{{.}}</li>{{end}}</ul>{{end}}
{{if .Setup}}<h3>Setup</h3><ul class="meta">{{range .Setup}}<li>{{.}}</li>{{end}}</ul>{{end}}
{{range .Workloads}}
<h2>{{.Name}}</h2>
<div class="wide"><table>
<tr><th>strategy</th><th>req/s</th><th>out tok/s</th><th>TTFT p50 ms</th><th>p90</th><th>p99</th><th>ITL p50 ms</th><th>E2E p50 ms</th><th>p99</th><th>KV hit</th><th>bound</th><th>fleet bound</th></tr>
{{range .Rows}}<tr><td>{{.Label}}{{if .Partial}} (partial){{end}}</td><td>{{.ReqS}}</td><td>{{.TokS}}</td><td>{{.TTFT50}}</td><td>{{.TTFT90}}</td><td>{{.TTFT99}}</td><td>{{.ITL50}}</td><td>{{.E2E50}}</td><td>{{.E2E99}}</td><td>{{.KV}}</td><td>{{.Bound}}</td><td>{{.FleetBound}}</td></tr>
{{end}}</table></div>
{{if .BoundsNote}}<p class="meta">{{.BoundsNote}}</p>{{end}}
<div class="wide"><table>
<tr><th>strategy</th><th>errors</th><th>share min-max</th><th>max/min (even)</th><th>decisions</th></tr>
{{range .Rows}}<tr><td>{{.Label}}{{if .Partial}} (partial){{end}}</td><td>{{.Errors}}</td><td>{{.Range}}</td><td>{{.Ratio}}</td><td>{{.Decisions}}</td></tr>
{{end}}</table></div>
<p class="meta">{{$.ShareNote}}</p>
{{if .Predictions}}<h3>Predicted against delivered, per decision kind</h3>
<div class="wide"><table>
<tr><th>strategy</th><th>kind</th><th>answers</th><th>with usage</th><th>predicted warm</th><th>delivered warm</th><th>both</th><th>token hit</th></tr>
{{range .Predictions}}<tr><td>{{.Label}}</td><td>{{.Kind}}</td><td>{{.Answers}}</td><td>{{.Reported}}</td><td>{{.Predicted}}</td><td>{{.Delivered}}</td><td>{{.Both}}</td><td>{{.TokenHitRate}}</td></tr>
{{end}}</table></div>
<p class="meta">{{$.PredictionNote}}</p>{{end}}
<div class="charts">{{range .Charts}}{{.}}{{end}}</div>
{{end}}
</body></html>
`))

// verdictRows lays the verdict out as a table: one row per baseline of
// each workload, the candidate's figure first.
func verdictRows(v *Verdict) []verdictRow {
	if v == nil {
		return nil
	}
	var out []verdictRow
	for _, w := range v.Workloads {
		c := w.Candidate
		for _, b := range w.Baselines {
			saved := "-"
			if c.PromptTokens > 0 {
				saved = grouped((b.Recomputed-c.Recomputed)*c.PromptTokens) + " (of " + grouped(c.PromptTokens) + ")"
			}
			out = append(out, verdictRow{
				Workload: w.Workload, Baseline: b.Label,
				TTFT50:     duration(c.TTFTP50Ms) + " / " + duration(b.TTFTP50Ms),
				TTFT90:     duration(c.TTFTP90Ms) + " / " + duration(b.TTFTP90Ms),
				Recomputed: pct(c.Recomputed) + " / " + pct(b.Recomputed),
				Saved:      saved,
			})
		}
	}
	return out
}

// colours assigns every label a colour.
func colours(runs []stats.Summary) map[string]string {
	m := map[string]string{}
	i := 0
	for _, r := range runs {
		if _, ok := m[r.Label]; ok {
			continue
		}
		if c, ok := fixedColours[r.Label]; ok {
			m[r.Label] = c
			continue
		}
		m[r.Label] = palette[i%len(palette)]
		i++
	}
	return m
}

// WriteHTML writes r as one self-contained HTML page.
func WriteHTML(w io.Writer, r *Report) error {
	r = r.withVerdict()
	p := htmlPage{Report: r, Sentences: r.Verdict.Sentences(), VerdictRows: verdictRows(r.Verdict),
		ShareNote: shareNote, PredictionNote: predictionNote}
	col := colours(r.Runs)
	for _, wl := range workloads(r.Runs) {
		hw := htmlWorkload{Name: wl}
		var runs []*stats.Summary
		for i := range r.Runs {
			if r.Runs[i].Workload == wl {
				runs = append(runs, &r.Runs[i])
			}
		}
		for _, s := range runs {
			rng, ratio := shareRange(s)
			bound, fleet := boundTexts(s)
			hw.Rows = append(hw.Rows, htmlRow{
				Label: s.Label, KV: kvText(s), Bound: bound, FleetBound: fleet, Partial: s.Partial,
				ReqS: fmt.Sprintf("%.1f", s.RequestsPerSec), TokS: fmt.Sprintf("%.0f", s.OutputTokensPerSec),
				TTFT50: msec(s.TTFT.P50Ms), TTFT90: msec(s.TTFT.P90Ms), TTFT99: msec(s.TTFT.P99Ms),
				ITL50: msec(s.ITL.P50Ms), E2E50: msec(s.E2E.P50Ms), E2E99: msec(s.E2E.P99Ms),
				Range: rng, Ratio: ratio, Errors: errorText(s), Decisions: decisionText(s),
			})
		}
		hw.Charts = []template.HTML{
			template.HTML(ttftChart(wl, runs, col)),
			template.HTML(shareChart(wl, runs, col, r.Instances)),
			template.HTML(hitChart(wl, runs, col)),
		}
		var own []stats.Summary
		for _, s := range runs {
			own = append(own, *s)
		}
		hw.BoundsNote = boundsNote(own)
		hw.Predictions = predictionRows(own)
		p.Workloads = append(p.Workloads, hw)
	}
	return page.Execute(w, p)
}

func ttftChart(wl string, runs []*stats.Summary, col map[string]string) string {
	var ss []series
	for _, s := range runs {
		pts := make([]xy, 0, len(s.TTFTCDF))
		for _, p := range s.TTFTCDF {
			pts = append(pts, xy{p.Ms, p.Quantile})
		}
		ss = append(ss, series{s.Label, col[s.Label], pts})
	}
	return lineChart(wl+": TTFT distribution", "time to first token (ms, log scale)", "fraction of requests", ss, true, 0, 1, true, 0, "")
}

// shareChart draws each run's share per instance. Runs of a comparison
// use different fleets (a cold one each), so instances are matched by
// their position in address order, not by address, and labelled with
// names[i] (as gpusim names them), or #i+1 without names. The even share
// is drawn as a labelled dashed line.
func shareChart(wl string, runs []*stats.Summary, col map[string]string, names []string) string {
	n := 0
	ordered := make([][]string, len(runs))
	for i, s := range runs {
		for k := range s.Shares {
			ordered[i] = append(ordered[i], k)
		}
		sort.Slice(ordered[i], func(a, b int) bool { return naturalLess(ordered[i][a], ordered[i][b]) })
		n = max(n, len(ordered[i]))
	}
	var bs []bars
	for i, s := range runs {
		v := make([]float64, n)
		for j, k := range ordered[i] {
			v[j] = s.Shares[k]
		}
		bs = append(bs, bars{s.Label, col[s.Label], v})
	}
	ref := 0.0
	if n > 0 {
		ref = 1 / float64(n)
	}
	labels := make([]string, n)
	for i := range labels {
		labels[i] = fmt.Sprintf("#%d", i+1)
		if len(names) == n {
			labels[i] = names[i]
		}
	}
	refLabel := ""
	if n > 0 {
		refLabel = fmt.Sprintf("even share (1/%d = %.1f%%)", n, 100*ref)
	}
	return barChart(wl+": traffic share per instance", "share of requests", labels, bs, ref, refLabel)
}

// naturalLess orders strings with their digit runs compared as numbers,
// so 127.0.0.1:9999 comes before 127.0.0.1:10000.
func naturalLess(a, b string) bool {
	for a != "" && b != "" {
		da, db := digitRun(a), digitRun(b)
		if da > 0 && db > 0 {
			na, nb := strings.TrimLeft(a[:da], "0"), strings.TrimLeft(b[:db], "0")
			if len(na) != len(nb) {
				return len(na) < len(nb)
			}
			if na != nb {
				return na < nb
			}
			a, b = a[da:], b[db:]
			continue
		}
		if a[0] != b[0] {
			return a[0] < b[0]
		}
		a, b = a[1:], b[1:]
	}
	return len(a) < len(b)
}

func digitRun(s string) int {
	i := 0
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		i++
	}
	return i
}

func hitChart(wl string, runs []*stats.Summary, col map[string]string) string {
	var ss []series
	for _, s := range runs {
		samples := completeBuckets(s.KVSeries)
		pts := make([]xy, 0, len(samples))
		for _, p := range samples {
			if p.QueriedTokens > 0 {
				pts = append(pts, xy{p.Seconds, p.HitRate})
			}
		}
		ss = append(ss, series{s.Label, col[s.Label], pts})
	}
	warm := 0.0
	for _, s := range runs {
		warm = max(warm, s.WarmupSeconds)
	}
	return lineChart(wl+": KV-cache hit rate over time", "seconds since start", "hit tokens / queried tokens", ss, false, 0, 1, true, warm, "end of warm-up")
}

// completeBuckets returns the hit-rate samples with the last one folded
// into the one before when it covers a shorter span than the others: the
// final scrape after the load ends closes a partial bucket, whose few
// tokens (often from requests that began cold) would be drawn as a drop
// the run never had. Its tokens still count, weighted into the previous
// bucket.
func completeBuckets(in []stats.KVSample) []stats.KVSample {
	n := len(in)
	if n < 3 {
		return in
	}
	spans := make([]float64, 0, n-1)
	for i := 1; i < n-1; i++ {
		spans = append(spans, in[i].Seconds-in[i-1].Seconds)
	}
	sort.Float64s(spans)
	typical := spans[len(spans)/2]
	last, prev := in[n-1], in[n-2]
	if typical <= 0 || last.Seconds-prev.Seconds >= 0.9*typical {
		return in
	}
	out := append([]stats.KVSample(nil), in[:n-1]...)
	if q := prev.QueriedTokens + last.QueriedTokens; q > 0 {
		m := &out[n-2]
		m.HitRate = (prev.HitRate*prev.QueriedTokens + last.HitRate*last.QueriedTokens) / q
		m.QueriedTokens = q
	}
	return out
}
