package main

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// openRow summarises one target at one stream count: medians and ranges
// over its valid repetitions (invalid ones are counted, not summarised).
type openRow struct {
	Target string `json:"target"`
	N      int    `json:"n"`
	Runs   int    `json:"runs"`
	Valid  int    `json:"valid"`
	// Errors is the failed or short streams over every repetition.
	Errors          int64  `json:"errors"`
	CPUPerChunkUs   spread `json:"cpu_per_chunk_us"`
	LifeCPUPerEvent spread `json:"life_cpu_per_event_us"`
	RSSPerStreamKB  spread `json:"rss_per_stream_kb"`
	HeapPerStreamKB spread `json:"heap_per_stream_kb"`
	AllocsPerChunk  spread `json:"allocs_per_chunk"`
	IdleRSSMB       spread `json:"idle_rss_mb"`
	SettleRatio     spread `json:"settle_rss_over_idle"`
	SettleMB        spread `json:"settle_rss_minus_idle_mb"`
	// SettleNear is, per valid repetition, when RSS first came within 20%
	// of idle after the streams ended ("never" if it did not).
	SettleNear []string `json:"settle_within_20pct"`
	FirstP50ms spread   `json:"first_p50_ms"`
	FirstP99ms spread   `json:"first_p99_ms"`
	LaterP50ms spread   `json:"later_p50_ms"`
	LaterP99ms spread   `json:"later_p99_ms"`
	GenBusy    spread   `json:"gen_busy_pct"`
	// Untimed says the events carried no send time (gpusim).
	Untimed bool `json:"untimed,omitempty"`
}

// openRatio is a warmroute/HAProxy ratio at one stream count, taken per
// repetition (both runs valid) and summarised.
type openRatio struct {
	Name   string `json:"name"`
	N      int    `json:"n"`
	Reps   int    `json:"reps"`
	Spread spread `json:"spread"`
}

func (r *results) openCounts() []int {
	var ns []int
	for _, x := range r.Open {
		if !slices.Contains(ns, x.N) {
			ns = append(ns, x.N)
		}
	}
	return ns
}

func (r *results) summariseOpen() {
	r.OpenRows, r.OpenRatios = nil, nil
	for _, n := range r.openCounts() {
		for _, tgt := range r.targetNames() {
			row := openRow{Target: tgt, N: n}
			var cpu, life, rss, heap, allocs, idle, ratio, mb, f50, f99, l50, l99, gen []float64
			for _, x := range r.Open {
				if x.N != n || x.Target != tgt {
					continue
				}
				row.Runs++
				row.Errors += x.Errors
				if x.Invalid != "" {
					continue
				}
				row.Valid++
				row.Untimed = x.Untimed
				f50 = append(f50, ms(x.FirstP50))
				f99 = append(f99, ms(x.FirstP99))
				l50 = append(l50, ms(x.LaterP50))
				l99 = append(l99, ms(x.LaterP99))
				gen = append(gen, 100*x.GenBusy)
				if !x.isProxy() {
					continue
				}
				cpu = append(cpu, x.CPUPerEventUs)
				life = append(life, x.LifeCPUPerEventUs)
				rss = append(rss, x.rssPerStreamKB())
				if x.IdleHeap > 0 {
					heap = append(heap, x.heapPerStreamKB())
					allocs = append(allocs, x.AllocsPerEvent)
				}
				idle = append(idle, float64(x.IdleRSS)/(1<<20))
				ratio = append(ratio, x.settleRatio())
				mb = append(mb, x.settleMB())
				near := "never"
				if x.SettleReached {
					near = x.SettleNear.Round(time.Second).String()
				}
				row.SettleNear = append(row.SettleNear, near)
			}
			if row.Runs == 0 {
				continue
			}
			row.CPUPerChunkUs, row.RSSPerStreamKB, row.HeapPerStreamKB = spreadOf(cpu), spreadOf(rss), spreadOf(heap)
			row.LifeCPUPerEvent = spreadOf(life)
			row.AllocsPerChunk = spreadOf(allocs)
			row.IdleRSSMB, row.SettleRatio, row.SettleMB = spreadOf(idle), spreadOf(ratio), spreadOf(mb)
			row.FirstP50ms, row.FirstP99ms, row.LaterP50ms, row.LaterP99ms = spreadOf(f50), spreadOf(f99), spreadOf(l50), spreadOf(l99)
			row.GenBusy = spreadOf(gen)
			r.OpenRows = append(r.OpenRows, row)
		}
		for _, q := range []struct {
			name string
			f    func(openRun) float64
		}{
			{"CPU per chunk", func(x openRun) float64 { return x.CPUPerEventUs }},
			{"CPU per event, whole life", func(x openRun) float64 { return x.LifeCPUPerEventUs }},
			{"RSS per open stream", func(x openRun) float64 { return x.rssPerStreamKB() }},
			{"inter-event p99 latency", func(x openRun) float64 { return float64(x.LaterP99) }}, // 0 untimed: left out
		} {
			v := r.openRatioPerRep(n, q.f)
			if len(v) > 0 {
				r.OpenRatios = append(r.OpenRatios, openRatio{Name: q.name, N: n, Reps: len(v), Spread: spreadOf(v)})
			}
		}
	}
}

// openRatioPerRep is f(warmroute)/f(haproxy) for each repetition at n in
// which both runs are valid and f(haproxy) is positive.
func (r *results) openRatioPerRep(n int, f func(openRun) float64) []float64 {
	type pair struct {
		w, h    openRun
		hw, hh  bool
		invalid bool
	}
	byRep := map[int]*pair{}
	var reps []int
	for _, x := range r.Open {
		if x.N != n || (x.Target != "warmroute" && x.Target != "haproxy") {
			continue
		}
		p := byRep[x.Rep]
		if p == nil {
			p = &pair{}
			byRep[x.Rep] = p
			reps = append(reps, x.Rep)
		}
		p.invalid = p.invalid || x.Invalid != ""
		if x.Target == "warmroute" {
			p.w, p.hw = x, true
		} else {
			p.h, p.hh = x, true
		}
	}
	var v []float64
	for _, rep := range reps {
		p := byRep[rep]
		if p.hw && p.hh && !p.invalid && f(p.h) > 0 {
			v = append(v, f(p.w)/f(p.h))
		}
	}
	return v
}

// cells renders the row's cells, in openColumns' order.
func (x openRow) cells() []string {
	dash := func(s spread, prec int) string {
		if x.Target == "direct" || x.Valid == 0 {
			return "-"
		}
		return s.fmt(prec, "")
	}
	heap, allocs := "-", "-"
	if x.Target == "warmroute" || x.Target == "baseline" {
		heap, allocs = dash(x.HeapPerStreamKB, 2), dash(x.AllocsPerChunk, 1)
	}
	near := "-"
	if len(x.SettleNear) > 0 {
		near = strings.Join(x.SettleNear, ", ")
	}
	lat := func(s spread) string {
		if x.Valid == 0 || x.Untimed {
			return "-"
		}
		return s.fmt(3, "")
	}
	errs := fmt.Sprint(x.Errors)
	if x.Valid < x.Runs {
		errs += fmt.Sprintf(" (%d of %d runs invalid)", x.Runs-x.Valid, x.Runs)
	}
	gen := "-"
	if x.Valid > 0 {
		gen = x.GenBusy.fmt(0, "")
	}
	return []string{x.Target, dash(x.CPUPerChunkUs, 2), dash(x.LifeCPUPerEvent, 2), dash(x.RSSPerStreamKB, 2), heap, allocs, dash(x.IdleRSSMB, 1),
		dash(x.SettleRatio, 2), dash(x.SettleMB, 1), near,
		lat(x.FirstP50ms), lat(x.FirstP99ms), lat(x.LaterP50ms), lat(x.LaterP99ms), errs, gen}
}

var openColumns = []string{"target", "CPU us/chunk", "CPU us/event, whole life", "RSS KB/stream", "Go heap KB/stream", "Go allocs/chunk", "idle RSS MB",
	"RSS after settle / idle", "RSS after settle - idle, MB", "within 20% of idle after",
	"first event p50 ms", "first event p99 ms", "later events p50 ms", "later events p99 ms", "errors", "generator busy %"}

func (r *results) openHeading() string {
	o := r.Options
	return fmt.Sprintf("Open streams: N SSE streams open at once through a fresh proxy process, %d events %s apart each, started over %s; "+
		"median over the valid ones of %d repetitions (min-max). CPU per chunk and memory per stream are taken in the steady window "+
		"(every stream open); the whole-life CPU runs from just before the first request to just after the last stream ended, over every event received; Go heap is heap in use (garbage not yet collected included) and Go allocs are counted over the window (warmroute); "+
		"latency is each event's receive time minus the stub's send time; the settle columns are RSS %s after the streams ended. Engine: %s.",
		o.OpenChunks, o.OpenGap, o.OpenRamp, o.OpenReps, o.OpenSettle, o.engineText())
}

// openCells renders the rows at n streams.
func (r *results) openCells(n int) [][]string {
	var rows [][]string
	for _, x := range r.OpenRows {
		if x.N == n {
			rows = append(rows, x.cells())
		}
	}
	return rows
}

// writeAligned writes a header and rows as text columns, each as wide as
// its widest cell.
func writeAligned(b *strings.Builder, header []string, rows [][]string) {
	widths := make([]int, len(header))
	for _, row := range append([][]string{header}, rows...) {
		for i, c := range row {
			widths[i] = max(widths[i], len(c))
		}
	}
	for _, row := range append([][]string{header}, rows...) {
		for i, c := range row {
			fmt.Fprintf(b, "%-*s  ", widths[i], c)
		}
		b.WriteString("\n")
	}
}

// writeMarkdownTable writes a header and rows as a Markdown table.
func writeMarkdownTable(b *strings.Builder, header []string, rows [][]string) {
	fmt.Fprintf(b, "| %s |\n|%s\n", strings.Join(header, " | "), strings.Repeat("---|", len(header)))
	for _, row := range rows {
		fmt.Fprintf(b, "| %s |\n", strings.Join(row, " | "))
	}
}

func (r *results) openText(b *strings.Builder) {
	fmt.Fprintf(b, "\n%s\n", r.openHeading())
	for _, n := range r.openCounts() {
		fmt.Fprintf(b, "\nn=%d open streams\n", n)
		writeAligned(b, openColumns, r.openCells(n))
		for _, q := range r.OpenRatios {
			if q.N == n {
				fmt.Fprintf(b, "  warmroute / HAProxy, %-24s %s  (%d repetitions)\n", q.Name+":", q.Spread.fmt(2, ""), q.Reps)
			}
		}
	}
	r.openNotes(b)
}

func (r *results) openMarkdown(b *strings.Builder) {
	fmt.Fprintf(b, "\n%s\n", r.openHeading())
	for _, n := range r.openCounts() {
		fmt.Fprintf(b, "\n**%d open streams**\n\n", n)
		writeMarkdownTable(b, openColumns, r.openCells(n))
		first := true
		for _, q := range r.OpenRatios {
			if q.N != n {
				continue
			}
			if first {
				b.WriteString("\n| warmroute / HAProxy | ratio | repetitions |\n|---|---|---|\n")
				first = false
			}
			fmt.Fprintf(b, "| %s | %s | %d |\n", q.Name, q.Spread.fmt(2, ""), q.Reps)
		}
	}
	r.openNotes(b)
}

// openBusyGenerator is the generator's busy share over the window above
// which a run's latencies (and the proxies' buffering, as the client reads
// late) measure the generator as much as the proxy.
const openBusyGenerator = 0.9

// openNotes lists the runs that did not count, and why, and those whose
// generator was close to saturation.
func (r *results) openNotes(b *strings.Builder) {
	var busy []string
	for _, x := range r.Open {
		if x.Invalid == "" && x.GenBusy >= openBusyGenerator {
			busy = append(busy, fmt.Sprintf("rep %d %s n=%d (%.0f%%)", x.Rep, x.Target, x.N, 100*x.GenBusy))
		}
	}
	if len(busy) > 0 {
		fmt.Fprintf(b, "\nnote: the generator's CPU (stubs and client) was at least %.0f%% busy in the window of %s: their latencies, and the proxies' memory (data waits in them while the client reads late), measure the generator as much as the proxy.\n",
			100*openBusyGenerator, strings.Join(busy, ", "))
	}
	for _, x := range r.Open {
		if x.Invalid == "" {
			continue
		}
		fmt.Fprintf(b, "\ninvalid: rep %d %s n=%d: %s", x.Rep, x.Target, x.N, x.Invalid)
		for _, e := range x.ErrorSamples {
			fmt.Fprintf(b, "\n  %s", e)
		}
		if x.ProxyLog != "" {
			fmt.Fprintf(b, "\n  the proxy's last output:\n    %s", strings.ReplaceAll(strings.TrimSpace(x.ProxyLog), "\n", "\n    "))
		}
		b.WriteString("\n")
	}
}

// engineText names the open phase's backends for the report.
func (o options) engineText() string {
	if o.OpenEngine == engineGpusim {
		return "gpusim (vLLM's chunk shape and usage chunk; events are not timed, so the latency columns are empty)"
	}
	return "the stub (one timed chunk per event)"
}
