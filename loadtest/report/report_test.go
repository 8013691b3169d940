package report

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"fmt"
	"io"
	"math"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/warmroute/warmroute/loadtest/stats"
)

func sampleRuns() []stats.Summary {
	mk := func(wl, label string, hit, p50, tok float64, shares map[string]float64, ratio float64) stats.Summary {
		s := stats.Summary{
			Label: label, Workload: wl, Seconds: 10, Sent: 100, Requests: 100, OK: 100,
			RequestsPerSec: 10, OutputTokensPerSec: tok,
			TTFT:     stats.Latency{Count: 100, P50Ms: p50, P90Ms: 2 * p50, P99Ms: 3 * p50},
			E2E:      stats.Latency{Count: 100, P50Ms: 500, P99Ms: 900},
			ITL:      stats.Latency{Count: 900, P50Ms: 12},
			TTFTCDF:  []stats.Point{{Ms: p50 / 2, Quantile: 0}, {Ms: p50, Quantile: 0.5}, {Ms: 3 * p50, Quantile: 1}},
			Shares:   shares,
			Backends: map[string]int64{},
			KV:       &stats.KVResult{HitRate: hit, QueriedTokens: 1000, HitTokens: 1000 * hit},
			KVSeries: []stats.KVSample{{Seconds: 2, HitRate: hit / 2, QueriedTokens: 10}, {Seconds: 4, HitRate: hit, QueriedTokens: 10}},
		}
		s.ShareMaxMin = ratio
		return s
	}
	even := map[string]float64{"127.0.0.1:1": 0.5, "127.0.0.1:2": 0.5}
	skew := map[string]float64{"127.0.0.1:1": 0.6, "127.0.0.1:2": 0.4}
	r := mk("rag", "RANDOM", 0.3, 400, 300, even, 1)
	p := mk("rag", "PREFIX_AWARE", 0.9, 100, 330, skew, 1.5)
	p.Decisions = map[string]int64{"affinity": 80, "overflow": 15, "fallback": 5}
	p.ShareFloor = 1.22
	p.Failed, p.Errors = 3, map[string]int64{"http_503": 2, "timeout": 1}
	r.WarmupSeconds, p.WarmupSeconds = 3, 3
	p.Bounds = &stats.BoundsResult{HitRate: 0.955, FleetHitRate: 0.9375, Caches: 2, CacheBlocks: 6000, BlockTokens: 16}
	r.Bounds = &stats.BoundsResult{HitRate: 0.955, FleetHitRate: 0.9375, Caches: 2, CacheBlocks: 6000, BlockTokens: 16, Truncated: true}
	c := mk("chat", "RANDOM", 0.2, 300, 200, even, 1)
	c.Partial = true
	return []stats.Summary{r, p, c}
}

func TestComparisons(t *testing.T) {
	cs := comparisons(sampleRuns(), "RANDOM", "PREFIX_AWARE")
	if len(cs) != 1 {
		t.Fatalf("%d comparisons, want 1 (chat has no PREFIX_AWARE run)", len(cs))
	}
	c := cs[0]
	if c.Workload != "rag" || math.Abs(c.HitRatio-3) > 1e-9 || c.TTFTRatio != 0.25 || c.ThroughputRatio != 1.1 || c.CandShareMaxMin != 1.5 {
		t.Fatalf("comparison %+v", c)
	}
	if s := c.String(); !strings.Contains(s, "3.0x") || !strings.Contains(s, "x0.25") {
		t.Fatalf("text %q", s)
	}
}

func TestTable(t *testing.T) {
	var b bytes.Buffer
	if err := WriteTable(&b, sampleRuns()); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{
		"PREFIX_AWARE", "90.0%", "30.0%", "40.0-60.0%", "1.50 (1.22)", "http_503 2, timeout 1", "(even): the median max/min",
		"aff 80% ovf 15% fb 5%", "RANDOM (partial)", "rag: PREFIX_AWARE vs RANDOM",
		"fleet bound: 2 caches of 6000 blocks of 16 tokens", "~ over the first requests only",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	for _, re := range []string{`KV hit\s+bound\s+fleet bound`, `90\.0%\s+95\.5%\s+93\.8%`, `30\.0%\s+95\.5%~\s+93\.8%~`} {
		if !regexp.MustCompile(re).MatchString(out) {
			t.Errorf("table does not match %s:\n%s", re, out)
		}
	}
	// a run without bounds shows dashes
	if !regexp.MustCompile(`chat\s+RANDOM \(partial\)\s+\S+\s+\S+\s+20\.0%\s+-\s+-\s`).MatchString(out) {
		t.Errorf("chat row without bounds:\n%s", out)
	}
	// rows are grouped by workload in first-seen order
	if strings.Index(out, "rag ") > strings.Index(out, "chat ") {
		t.Errorf("workloads out of order:\n%s", out)
	}
}

func TestJSONRoundTrip(t *testing.T) {
	r := &Report{Title: "t", GeneratedAt: time.Unix(0, 0).UTC(), Runs: sampleRuns()}
	var b bytes.Buffer
	if err := WriteJSON(&b, r); err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.Unmarshal(b.Bytes(), &back); err != nil {
		t.Fatal(err)
	}
	if len(back.Runs) != 3 || back.Runs[1].KV.HitRate != 0.9 || back.Runs[1].Decisions["overflow"] != 15 ||
		back.Runs[1].Bounds == nil || back.Runs[1].Bounds.FleetHitRate != 0.9375 || back.Runs[2].Bounds != nil {
		t.Fatalf("round trip lost data: %+v", back.Runs[1])
	}
	for _, key := range []string{`"bound_hit_rate": 0.955`, `"bound_fleet_hit_rate": 0.9375`} {
		if !strings.Contains(b.String(), key) {
			t.Errorf("JSON lacks %s", key)
		}
	}
}

func TestHTMLIsSelfContained(t *testing.T) {
	runs := sampleRuns()
	runs[0].Label = `<script>alert(1)</script>`
	r := &Report{Title: "Strategy comparison", GeneratedAt: time.Now(), Command: "warmroute demo",
		Setup: []string{"7 instances"}, Runs: runs}
	var b bytes.Buffer
	if err := WriteHTML(&b, r); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	if strings.Contains(out, "<script>") {
		t.Fatal("a label was not escaped")
	}
	if regexp.MustCompile(`(src|href)=`).MatchString(out) {
		t.Fatal("the page references external resources")
	}
	// three charts per workload, each well-formed XML
	svgs := regexp.MustCompile(`(?s)<svg.*?</svg>`).FindAllString(out, -1)
	if len(svgs) != 6 {
		t.Fatalf("%d charts, want 6", len(svgs))
	}
	for _, s := range svgs {
		d := xml.NewDecoder(strings.NewReader(s))
		for {
			_, err := d.Token()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatalf("chart is not well-formed: %v\n%.300s", err, s)
			}
		}
	}
	for _, want := range []string{"TTFT distribution", "traffic share per instance", "hit rate over time", "#1", "#2", "polyline", "rect", "end of warm-up",
		"<th>fleet bound</th>", "<td>95.5%</td><td>93.8%</td>", "fleet bound: 2 caches"} {
		if !strings.Contains(out, want) {
			t.Errorf("page lacks %q", want)
		}
	}
}

func TestTicks(t *testing.T) {
	ts := niceTicks(0, 1, 5)
	if len(ts) < 4 || ts[0] != 0 || math.Abs(ts[len(ts)-1]-1) > 1e-9 {
		t.Fatalf("ticks %v", ts)
	}
	lt := logTicks(10, 1000)
	want := []float64{10, 20, 50, 100, 200, 500, 1000}
	if len(lt) != len(want) {
		t.Fatalf("log ticks %v", lt)
	}
	for i := range want {
		if math.Abs(lt[i]-want[i]) > 1e-9 {
			t.Fatalf("log ticks %v", lt)
		}
	}
}

func TestEmptyCharts(t *testing.T) {
	for _, s := range []string{
		lineChart("x", "a", "b", nil, true, 0, 1, true, 0, ""),
		barChart("x", "y", nil, nil, 0, ""),
	} {
		if !strings.Contains(s, "no data") || !strings.HasSuffix(s, "</svg>") {
			t.Fatalf("empty chart %q", s)
		}
	}
}

func TestBarsStayInsideThePlot(t *testing.T) {
	// 0.336 would overflow an axis ending at the 0.3 tick
	svg := barChart("t", "y", []string{"a", "b", "c"},
		[]bars{{Name: "s", Colour: "#000", Values: []float64{0.336, 0.336, 0.328}}}, 1.0/3, "")
	for _, m := range regexp.MustCompile(`<rect x="[^"]+" y="([-0-9.]+)"`).FindAllStringSubmatch(svg, -1) {
		var y float64
		if _, err := fmt.Sscan(m[1], &y); err != nil {
			t.Fatal(err)
		}
		if y < padT {
			t.Fatalf("bar top at y=%g, above the plot (%d)", y, padT)
		}
	}
}

func TestNaturalLess(t *testing.T) {
	in := []string{"127.0.0.1:10000", "127.0.0.1:9999", "gpu-10", "gpu-2", "gpu-1", "127.0.0.1:09998"}
	sort.Slice(in, func(i, j int) bool { return naturalLess(in[i], in[j]) })
	want := "127.0.0.1:09998 127.0.0.1:9999 127.0.0.1:10000 gpu-1 gpu-2 gpu-10"
	if got := strings.Join(in, " "); got != want {
		t.Fatalf("got %s, want %s", got, want)
	}
}

// TestShareChartNamesInstancesAndLabelsTheEvenShare: instances carry the
// names gpusim gives them, in address order, and the dashed line says
// what it is.
func TestShareChartNamesInstancesAndLabelsTheEvenShare(t *testing.T) {
	runs := sampleRuns()
	r := &Report{Title: "t", GeneratedAt: time.Now(), Instances: []string{"gpu-0", "gpu-1"}, Runs: runs[:2]}
	var b bytes.Buffer
	if err := WriteHTML(&b, r); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	// 127.0.0.1:1 is the first instance in address order: gpu-0.
	for _, want := range []string{">gpu-0</text>", ">gpu-1</text>", "<title>PREFIX_AWARE gpu-0: 60.0%</title>", "even share (1/2 = 50.0%)"} {
		if !strings.Contains(out, want) {
			t.Errorf("page lacks %q", want)
		}
	}
	if strings.Contains(out, ">#1<") {
		t.Error("instances still numbered")
	}
	// Without names (or with a count that does not match) positions remain.
	r.Instances = []string{"gpu-0"}
	b.Reset()
	if err := WriteHTML(&b, r); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), ">#1</text>") {
		t.Error("no position labels without matching names")
	}
}

// TestHitChartFoldsThePartialLastBucket: the last sample, taken when the
// load ended and covering a fraction of an interval with a few cold
// tokens, is folded into the one before (weighted by tokens) instead of
// being drawn as a drop; a full last bucket stays as it is.
func TestHitChartFoldsThePartialLastBucket(t *testing.T) {
	series := []stats.KVSample{
		{Seconds: 1, HitRate: 0.5, QueriedTokens: 1000},
		{Seconds: 2, HitRate: 0.9, QueriedTokens: 1000},
		{Seconds: 3, HitRate: 0.9, QueriedTokens: 900},
		{Seconds: 3.3, HitRate: 0.0, QueriedTokens: 100},
	}
	got := completeBuckets(series)
	if len(got) != 3 || got[2].Seconds != 3 || math.Abs(got[2].HitRate-0.81) > 1e-9 || got[2].QueriedTokens != 1000 {
		t.Fatalf("folded: %+v", got)
	}
	if series[2].HitRate != 0.9 {
		t.Fatal("the input was changed")
	}
	full := append(series[:3:3], stats.KVSample{Seconds: 4, HitRate: 0.2, QueriedTokens: 1000})
	if got := completeBuckets(full); len(got) != 4 || got[3].HitRate != 0.2 {
		t.Fatalf("a full last bucket was changed: %+v", got)
	}

	s := sampleRuns()[1]
	s.KVSeries = series
	svg := hitChart("rag", []*stats.Summary{&s}, map[string]string{s.Label: "#000"})
	pts := regexp.MustCompile(`points="([^"]*)"`).FindStringSubmatch(svg)
	if pts == nil || len(strings.Fields(pts[1])) != 3 {
		t.Fatalf("hit chart points %v", pts)
	}
	// The line ends at the last full bucket's height, not at 0.
	last := strings.Fields(pts[1])[2]
	var x, y float64
	if _, err := fmt.Sscanf(last, "%f,%f", &x, &y); err != nil {
		t.Fatal(err)
	}
	if floor := float64(chartH - padB); y > floor-10 {
		t.Fatalf("the line drops to y=%g (plot floor %g)", y, floor)
	}
}

// TestLegendFits: the legend's names do not overlap, and shrink to fit
// when there are many.
func TestLegendFits(t *testing.T) {
	for _, names := range [][]string{
		{"CONSISTENT_HASH", "PREFIX_AWARE_FIXED", "PREFIX_AWARE"},
		{"CONSISTENT_HASH", "PREFIX_AWARE_FIXED", "PREFIX_AWARE", "RANDOM", "LEAST_OUTSTANDING_REQUESTS", "ROUND_ROBIN"},
	} {
		var b strings.Builder
		legend(&b, names, make([]string, len(names)))
		re := regexp.MustCompile(`<text x="([0-9.]+)" y="[0-9]+" class="legend" font-size="([0-9.]+)">([^<]*)</text>`)
		ms := re.FindAllStringSubmatch(b.String(), -1)
		if len(ms) != len(names) {
			t.Fatalf("%d names drawn, want %d", len(ms), len(names))
		}
		end := 0.0
		for _, m := range ms {
			var x, size float64
			fmt.Sscan(m[1], &x)
			fmt.Sscan(m[2], &size)
			if x < end {
				t.Errorf("%q starts at %.1f, before the previous name ends (%.1f)", m[3], x, end)
			}
			end = x + textWidth(m[3], size)
		}
		if end > chartW {
			t.Errorf("legend ends at %.1f, past the chart's %d", end, chartW)
		}
	}
}

// TestPredictionsTable: the routers' predictions against what was
// delivered show per run and decision kind, in the text table and the
// page, and not at all when no run has them.
func TestPredictionsTable(t *testing.T) {
	runs := sampleRuns()
	var b bytes.Buffer
	if err := WriteTable(&b, runs); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(b.String(), "predicted against delivered") {
		t.Fatalf("a predictions table without predictions:\n%s", b.String())
	}
	runs[1].Predictions = []stats.Prediction{
		{Kind: "affinity", Answers: 90, Reported: 80, PredictedWarm: 60, DeliveredWarm: 56, BothWarm: 54, PromptTokens: 100000, CachedTokens: 70000, TokenHitRate: 0.7},
		{Kind: "overflow", Answers: 10, Reported: 0},
	}
	b.Reset()
	if err := WriteTable(&b, runs); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, re := range []string{
		`predicted against delivered, per decision kind`,
		`rag\s+PREFIX_AWARE\s+affinity\s+90\s+80\s+60 \(75\.0%\)\s+56 \(70\.0%\)\s+54\s+70\.0%`,
		`rag\s+PREFIX_AWARE\s+overflow\s+10\s+0\s+-\s+-\s+0\s+-`,
		`delivered warm: the engine's cached_tokens covered the key's prefix`,
	} {
		if !regexp.MustCompile(re).MatchString(out) {
			t.Errorf("table does not match %s:\n%s", re, out)
		}
	}
	b.Reset()
	if err := WriteHTML(&b, &Report{Title: "t", GeneratedAt: time.Now(), Runs: runs}); err != nil {
		t.Fatal(err)
	}
	page := b.String()
	if n := strings.Count(page, "<h3>Predicted against delivered"); n != 1 {
		t.Errorf("%d predictions tables, want 1 (rag only)", n)
	}
	if !strings.Contains(page, "<td>PREFIX_AWARE</td><td>affinity</td><td>90</td><td>80</td><td>60 (75.0%)</td><td>56 (70.0%)</td><td>54</td><td>70.0%</td>") {
		t.Errorf("page lacks the affinity row:\n%s", page)
	}
}

// TestAgreementLines: a run that asked its routers (demo --agreement)
// gets a line with its counts and first disagreement; none otherwise.
func TestAgreementLines(t *testing.T) {
	runs := sampleRuns()
	var b bytes.Buffer
	if err := WriteTable(&b, runs); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(b.String(), "agreement:") {
		t.Fatalf("agreement lines without an agreement probe:\n%s", b.String())
	}
	runs[1].Agreement = &stats.Agreement{Routers: 8, Rounds: 35, Compared: 560, Picks: 552, Owners: 560, SameEpoch: 34, SteadyCompared: 544, SteadyPicks: 543, Failed: 2,
		First: "request 3: router-0->b1 (overflow rank 1) router-1->b0 (affinity)"}
	b.Reset()
	if err := WriteTable(&b, runs); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{
		"rag / PREFIX_AWARE: 8 routers, 35 rounds: picks agreed on 552 of 560 (98.6%), owners on 560 of 560 (100.0%); every answer of a round at one epoch in 34 of 35 rounds; picks in those rounds 543 of 544 (99.8%); 2 calls unanswered",
		"first disagreement: request 3: router-0->b1 (overflow rank 1) router-1->b0 (affinity)",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
}
