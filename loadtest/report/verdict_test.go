package report

import (
	"bytes"
	"encoding/json"
	"html"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/warmroute/warmroute/loadtest/stats"
)

// verdictRuns is a demo's shape: one workload where PREFIX_AWARE ties its
// baseline, one where it wins, one where it loses, and one without a
// PREFIX_AWARE run.
func verdictRuns() []stats.Summary {
	mk := func(wl, label string, hit, p50 float64, ok, prompt int64) stats.Summary {
		return stats.Summary{
			Label: label, Workload: wl, OK: ok, Sent: ok + 20, PromptTokens: ok * prompt,
			TTFT: stats.Latency{Count: ok, P50Ms: p50, P90Ms: 2 * p50},
			KV:   &stats.KVResult{HitRate: hit, QueriedTokens: 1e6, HitTokens: 1e6 * hit},
		}
	}
	ch := mk("agent", "CONSISTENT_HASH", 0.38, 22000, 40, 7000)
	ch.Canceled = 52
	return []stats.Summary{
		mk("rag", "CONSISTENT_HASH", 0.938, 55, 1000, 1060),
		mk("rag", "PREFIX_AWARE", 0.938, 56, 1000, 1060),
		ch,
		mk("agent", "PREFIX_AWARE", 0.75, 135, 160, 7400),
		mk("chat", "PREFIX_AWARE", 0.5, 300, 100, 2000),
		mk("chat", "RANDOM", 0.9, 100, 100, 2000),
		mk("code", "RANDOM", 0.5, 100, 100, 2000),
	}
}

func TestVerdictFigures(t *testing.T) {
	v := NewVerdict(verdictRuns(), Candidate)
	if v == nil || len(v.Workloads) != 3 {
		t.Fatalf("verdict %+v, want rag, agent and chat (code has no PREFIX_AWARE run)", v)
	}
	a := v.Workloads[1]
	if a.Workload != "agent" || len(a.Baselines) != 1 {
		t.Fatalf("agent: %+v", a)
	}
	c, b := a.Candidate, a.Baselines[0]
	if c.Label != "PREFIX_AWARE" || c.TTFTP50Ms != 135 || c.PromptTokens != 7400 || c.Recomputed < 0.2499 || c.Recomputed > 0.2501 {
		t.Errorf("candidate %+v", c)
	}
	if b.Label != "CONSISTENT_HASH" || b.Unanswered != 52 || b.Sent != 60 {
		t.Errorf("baseline %+v", b)
	}
	if NewVerdict(verdictRuns()[6:], Candidate) != nil {
		t.Error("a verdict without a PREFIX_AWARE run")
	}
	if NewVerdict(verdictRuns()[3:4], Candidate) != nil {
		t.Error("a verdict without a baseline")
	}
}

func TestVerdictSentences(t *testing.T) {
	ss := NewVerdict(verdictRuns(), Candidate).Sentences()
	all := strings.Join(ss, "\n")
	for _, want := range []string{
		// rag: a tie in both, within the margins
		"rag: PREFIX_AWARE was as fast to the first token as CONSISTENT_HASH (p50 TTFT 56 ms against 55 ms), with the same prefill (6.2% of prompt tokens recomputed against 6.2%).",
		// agent: 22,000/135 = 163x; 62% against 25% recomputed is 2.5x,
		// 37 points of a 7,400-token prompt = 2,738 tokens
		"agent: PREFIX_AWARE was 163x faster to the first token than CONSISTENT_HASH (p50 TTFT 135 ms against 22.0 s), with 2.5x less prefill (25.0% of prompt tokens recomputed against 62.0%: 2,738 fewer tokens to prefill a request of 7,400).",
		"agent under CONSISTENT_HASH: 52 of the 60 requests sent (warm-up included) got no answer",
		// chat: a loss is said as plainly
		"chat: PREFIX_AWARE was 3.0x slower to the first token than RANDOM (p50 TTFT 300 ms against 100 ms), with 5.0x more prefill (50.0% of prompt tokens recomputed against 10.0%: 800 more tokens to prefill a request of 2,000).",
	} {
		if !strings.Contains(all, want) {
			t.Errorf("verdict lacks %q:\n%s", want, all)
		}
	}
	if strings.Contains(all, "code") {
		t.Errorf("a workload without a PREFIX_AWARE run in the verdict:\n%s", all)
	}
}

// TestVerdictMargins: differences within the margins are level, and just
// past them are not.
func TestVerdictMargins(t *testing.T) {
	c := RunFigure{Label: "PREFIX_AWARE", TTFTP50Ms: 200, Recomputed: 0.5}
	for _, tc := range []struct {
		c, b float64
		want string
	}{
		{200, 229, "as fast"},
		{200, 231, "1.2x faster"},
		{200, 174, "as fast"},
		{200, 172, "1.2x slower"},
		// under 20 ms apart, a large ratio is still level
		{100, 119, "as fast"},
		{10, 25, "as fast"},
		{10, 31, "3.1x faster"},
	} {
		c.TTFTP50Ms = tc.c
		if got := ttftPhrase(c, RunFigure{Label: "B", TTFTP50Ms: tc.b}); !strings.HasPrefix(got, tc.want) {
			t.Errorf("%v ms against %v ms: %q, want %q...", tc.c, tc.b, got, tc.want)
		}
	}
	for _, tc := range []struct {
		b    float64
		want string
	}{
		{0.509, "the same prefill"},
		{0.53, "1.1x less prefill"},
		{0.47, "1.1x more prefill"},
		{0.0, "more prefill"},
	} {
		if got := prefillPhrase(c, RunFigure{Label: "B", Recomputed: tc.b}); !strings.HasPrefix(got, tc.want) {
			t.Errorf("recomputed 0.5 against %v: %q, want %q...", tc.b, got, tc.want)
		}
	}
	if got := prefillPhrase(RunFigure{Recomputed: 0}, RunFigure{Label: "B", Recomputed: 0.4}); !strings.HasPrefix(got, "no prefill at all") {
		t.Errorf("nothing recomputed: %q", got)
	}
}

// TestReportOpensWithVerdict: the page's verdict comes before every
// workload's figures, with the build and the engines, and the JSON carries
// it.
func TestReportOpensWithVerdict(t *testing.T) {
	r := &Report{Title: "t", GeneratedAt: time.Unix(0, 0).UTC(), Build: "warmroute v9, commit abc",
		Engines: "The engines are simulated.", Notes: []string{"The short comparison."}, Runs: verdictRuns()}
	var b bytes.Buffer
	if err := WriteHTML(&b, r); err != nil {
		t.Fatal(err)
	}
	page := b.String()
	verdict := strings.Index(page, "Verdict: what PREFIX_AWARE bought on this fleet")
	first := strings.Index(page, "<h2>rag</h2>")
	if verdict < 0 || first < 0 || verdict > first {
		t.Fatalf("verdict at %d, first workload at %d", verdict, first)
	}
	for _, want := range []string{"build: warmroute v9, commit abc", "The engines are simulated.", "The short comparison.",
		"<td>agent</td><td>CONSISTENT_HASH</td><td>135 ms / 22.0 s</td><td>270 ms / 44.0 s</td><td>25.0% / 62.0%</td><td>2,738 (of 7,400)</td>"} {
		if !strings.Contains(page, want) {
			t.Errorf("page lacks %q", want)
		}
	}
	if strings.Index(page, "The engines are simulated.") > first {
		t.Error("the engines are described after the figures")
	}
	b.Reset()
	if err := WriteJSON(&b, r); err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.Unmarshal(b.Bytes(), &back); err != nil {
		t.Fatal(err)
	}
	if back.Verdict == nil || len(back.Verdict.Workloads) != 3 || back.Build != r.Build || back.Engines != r.Engines {
		t.Fatalf("JSON verdict %+v, build %q, engines %q", back.Verdict, back.Build, back.Engines)
	}
	if r.Verdict != nil {
		t.Error("writing the report changed it")
	}
}

// TestTablesFitTheScreen: every table of a demo's page, with the longest
// strategy names, is narrower than the page's body, which fits a screen
// 1,400 pixels wide. Widths are estimated generously from the text.
func TestTablesFitTheScreen(t *testing.T) {
	var runs []stats.Summary
	for _, wl := range []string{"rag", "agent"} {
		for _, label := range []string{"LEAST_OUTSTANDING_REQUESTS", "CONSISTENT_HASH", "PREFIX_AWARE_FIXED", "PREFIX_AWARE"} {
			s := sampleRuns()[1]
			s.Workload, s.Label = wl, label
			s.Canceled, s.Errors, s.Failed = 170, map[string]int64{"timeout": 12, "http_503": 3}, 15
			s.TTFT = stats.Latency{P50Ms: 25477, P90Ms: 34341, P99Ms: 36471}
			s.E2E = stats.Latency{P50Ms: 26739, P99Ms: 37716}
			s.Shares = map[string]float64{"gpu-0": 0, "gpu-1": 1}
			s.Decisions = map[string]int64{"affinity": 36, "overflow": 60, "fallback": 4}
			s.Predictions = []stats.Prediction{{Kind: "overflow", Answers: 12345, Reported: 12345, PredictedWarm: 12000, DeliveredWarm: 12000, BothWarm: 12000, PromptTokens: 1}}
			runs = append(runs, s)
		}
	}
	var b bytes.Buffer
	if err := WriteHTML(&b, &Report{Title: "t", GeneratedAt: time.Now(), Runs: runs}); err != nil {
		t.Fatal(err)
	}
	page := b.String()
	body := bodyWidth(t, page)
	if body+2*16 > 1400-15 {
		t.Fatalf("body %d px wide with its padding does not fit 1,400 px less a scroll bar", body)
	}
	for i, w := range tableWidths(page) {
		if w > float64(body) {
			t.Errorf("table %d is about %.0f px wide, the body %d px", i, w, body)
		}
	}
}

var (
	bodyWidthRE = regexp.MustCompile(`body\{[^}]*max-width:(\d+)px`)
	tableRE     = regexp.MustCompile(`(?s)<table>(.*?)</table>`)
	rowRE       = regexp.MustCompile(`(?s)<tr>(.*?)</tr>`)
	cellRE      = regexp.MustCompile(`(?s)<t([hd])>(.*?)</t[hd]>`)
	tagRE       = regexp.MustCompile(`<[^>]*>`)
)

func bodyWidth(t *testing.T, page string) int {
	t.Helper()
	m := bodyWidthRE.FindStringSubmatch(page)
	if m == nil {
		t.Fatal("the body has no max-width")
	}
	n, err := strconv.Atoi(m[1])
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// tableWidths estimates every table's width: per column, its widest
// cell's text at 14 px (headers bold) and 8 px of padding each side.
// Measured against a browser's layout (DejaVu Sans), it overestimates by
// 8-11%.
func tableWidths(page string) []float64 {
	var out []float64
	for _, tb := range tableRE.FindAllStringSubmatch(page, -1) {
		var cols []float64
		for _, r := range rowRE.FindAllStringSubmatch(tb[1], -1) {
			for i, c := range cellRE.FindAllStringSubmatch(r[1], -1) {
				w := textWidth(html.UnescapeString(tagRE.ReplaceAllString(c[2], "")), 14)
				if c[1] == "h" {
					w *= 1.1
				}
				if i >= len(cols) {
					cols = append(cols, 0)
				}
				cols[i] = max(cols[i], w+16)
			}
		}
		sum := 0.0
		for _, c := range cols {
			sum += c
		}
		out = append(out, sum)
	}
	return out
}
