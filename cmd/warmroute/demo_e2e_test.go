package main

import (
	"bytes"
	"context"
	"encoding/json"
	"html"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

// TestE2EDemoReportOpensWithVerdict runs a small demo (rag under
// CONSISTENT_HASH and PREFIX_AWARE, one router, three instances, 3 s of
// load each) and reads what it wrote. The terminal ends with the
// verdict; the HTML report opens with it, names the build that ran (the
// binary's own version and commit) and says that the engines are
// simulated before any figure, and every table fits a screen 1,400 pixels
// wide; the JSON carries the same verdict as its runs.
func TestE2EDemoReportOpensWithVerdict(t *testing.T) {
	needBinary(t)
	t.Parallel() // about 12 s, nearly all of it waiting on the demo's load
	out := t.TempDir()
	cmd := exec.Command(binPath, "demo", "--workloads", "rag", "--strategies", "CONSISTENT_HASH,PREFIX_AWARE",
		"--routers", "1", "--instances", "3", "--warmup", "1s", "--duration", "2s", "--quiet", "--out", out)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	done := make(chan error, 1)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("demo: %v\n%s\n%s", err, stdout.String(), stderr.String())
		}
	case <-time.After(3 * time.Minute):
		cmd.Process.Kill()
		<-done
		t.Fatalf("demo still running after 3 minutes\n%s\n%s", stdout.String(), stderr.String())
	}

	// The terminal: the verdict comes last, in words.
	term := stdout.String()
	v := strings.Index(term, "verdict: what PREFIX_AWARE bought on this fleet")
	if v < 0 || !strings.Contains(term[v:], "- rag: PREFIX_AWARE was ") || !strings.Contains(term[v:], " CONSISTENT_HASH (p50 TTFT ") {
		t.Errorf("the terminal output has no verdict on rag:\n%s", term)
	}

	// The page: build, verdict and engines before the first figures.
	b, err := os.ReadFile(filepath.Join(out, "report.html"))
	if err != nil {
		t.Fatal(err)
	}
	page := string(b)
	figures := strings.Index(page, "<h2>rag</h2>")
	if figures < 0 {
		t.Fatalf("the page has no rag section:\n%.2000s", page)
	}
	vb, err := exec.Command(binPath, "version").Output()
	if err != nil {
		t.Fatal(err)
	}
	versionLine, _, _ := strings.Cut(string(vb), "\n") // "warmroute X"
	for _, want := range []string{
		"build: " + html.EscapeString(versionLine) + ", commit ",
		"Verdict: what PREFIX_AWARE bought on this fleet",
		"rag: PREFIX_AWARE was ",
		"The engines are simulated",
		"gpusim",
	} {
		i := strings.Index(page, want)
		switch {
		case i < 0:
			t.Errorf("the page does not say %q", want)
		case i > figures:
			t.Errorf("the page says %q only after the first figures", want)
		}
	}

	// Every table fits: its estimated width is within the body's, and the
	// body with its padding within 1,400 px less a scroll bar.
	m := regexp.MustCompile(`body\{[^}]*max-width:(\d+)px[^}]*padding:0 (\d+)px`).FindStringSubmatch(page)
	if m == nil {
		t.Fatal("the page's body has no max-width and padding")
	}
	body, _ := strconv.Atoi(m[1])
	pad, _ := strconv.Atoi(m[2])
	if body+2*pad > 1400-15 {
		t.Errorf("the body is %d px wide with %d px of padding each side: wider than 1,400 px less a scroll bar", body, pad)
	}
	for i, w := range estimateTableWidths(page) {
		if w > body {
			t.Errorf("table %d is about %d px wide; the body is %d px", i+1, w, body)
		}
	}

	// The JSON: the same verdict, from the runs it holds.
	var rep struct {
		Build   string `json:"build"`
		Engines string `json:"engines"`
		Verdict *struct {
			Workloads []struct {
				Workload  string `json:"workload"`
				Candidate struct {
					Label     string  `json:"label"`
					TTFTP50Ms float64 `json:"ttft_p50_ms"`
				} `json:"candidate"`
				Baselines []struct {
					Label string `json:"label"`
				} `json:"baselines"`
			} `json:"workloads"`
		} `json:"verdict"`
		Runs []struct {
			Label string `json:"label"`
			TTFT  struct {
				P50Ms float64 `json:"p50_ms"`
			} `json:"ttft"`
		} `json:"runs"`
	}
	jb, err := os.ReadFile(filepath.Join(out, "report.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(jb, &rep); err != nil {
		t.Fatal(err)
	}
	if rep.Verdict == nil || len(rep.Verdict.Workloads) != 1 || len(rep.Runs) != 2 {
		t.Fatalf("report.json: verdict %+v, %d runs", rep.Verdict, len(rep.Runs))
	}
	w := rep.Verdict.Workloads[0]
	if w.Workload != "rag" || w.Candidate.Label != "PREFIX_AWARE" || len(w.Baselines) != 1 || w.Baselines[0].Label != "CONSISTENT_HASH" {
		t.Errorf("report.json verdict %+v", w)
	}
	if rep.Runs[1].Label != "PREFIX_AWARE" || w.Candidate.TTFTP50Ms != rep.Runs[1].TTFT.P50Ms || w.Candidate.TTFTP50Ms <= 0 {
		t.Errorf("the verdict's p50 TTFT %v is not PREFIX_AWARE's run's %+v", w.Candidate.TTFTP50Ms, rep.Runs[1])
	}
	if !strings.HasPrefix(rep.Build, versionLine+", commit ") || !strings.Contains(rep.Engines, "simulated") {
		t.Errorf("report.json build %q, engines %q", rep.Build, rep.Engines)
	}
}

// estimateTableWidths gives every table's width in pixels, generously:
// each column as wide as its longest cell at 0.7 em of 14 px a character
// (the font's average is nearer 0.6), plus 8 px of padding each side.
func estimateTableWidths(page string) []int {
	var out []int
	for _, tb := range regexp.MustCompile(`(?s)<table>(.*?)</table>`).FindAllStringSubmatch(page, -1) {
		var cols []int
		for _, row := range regexp.MustCompile(`(?s)<tr>(.*?)</tr>`).FindAllStringSubmatch(tb[1], -1) {
			cells := regexp.MustCompile(`(?s)<t[hd]>(.*?)</t[hd]>`).FindAllStringSubmatch(row[1], -1)
			for i, c := range cells {
				text := html.UnescapeString(regexp.MustCompile(`<[^>]*>`).ReplaceAllString(c[1], ""))
				w := int(float64(utf8.RuneCountInString(text))*0.7*14) + 16
				if i == len(cols) {
					cols = append(cols, 0)
				}
				cols[i] = max(cols[i], w)
			}
		}
		sum := 0
		for _, c := range cols {
			sum += c
		}
		out = append(out, sum)
	}
	return out
}

// TestE2EDemoDefaultFitsThreeMinutes: `make demo` runs `warmroute demo`
// with no flags, and that plan takes at most three minutes however long
// its drains run; --full is the complete comparison, and flags given with
// it win. --dry-run starts nothing.
func TestE2EDemoDefaultFitsThreeMinutes(t *testing.T) {
	needBinary(t)
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "out")
	plan := func(args ...string) string {
		t.Helper()
		out, err := exec.Command(binPath, append([]string{"demo", "--dry-run", "--out", dir}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("demo --dry-run %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	length := regexp.MustCompile(`(?m)^demo: (\d+) runs: .*: (\S+) to (\S+)$`)
	runsAndLongest := func(out string) (int, time.Duration) {
		t.Helper()
		m := length.FindStringSubmatch(out)
		if m == nil {
			t.Fatalf("no length in the plan:\n%s", out)
		}
		n, _ := strconv.Atoi(m[1])
		d, err := time.ParseDuration(m[3])
		if err != nil {
			t.Fatal(err)
		}
		return n, d
	}

	def := plan()
	n, longest := runsAndLongest(def)
	if n != 6 || longest > 3*time.Minute {
		t.Errorf("the default plan is %d runs of up to %s, want 6 within 3 minutes:\n%s", n, longest, def)
	}
	for _, want := range []string{"demo: rag: ", "demo: agent: ", "8s warm-up then 10s measured"} {
		if !strings.Contains(def, want) {
			t.Errorf("the default plan lacks %q:\n%s", want, def)
		}
	}
	if strings.Contains(def, "demo: chat: ") || strings.Contains(def, "demo: preamble: ") {
		t.Errorf("the default plan runs more than rag and agent:\n%s", def)
	}

	full := plan("--full")
	if n, longest := runsAndLongest(full); n != 12 || longest < 6*time.Minute {
		t.Errorf("--full is %d runs of up to %s, want the 12-run comparison:\n%s", n, longest, full)
	}
	for _, want := range []string{"demo: rag: ", "demo: chat: ", "demo: preamble: ", "demo: agent: ", "8s warm-up then 20s measured"} {
		if !strings.Contains(full, want) {
			t.Errorf("--full lacks %q:\n%s", want, full)
		}
	}
	chosen := plan("--full", "--workloads", "chat", "--strategies", "PREFIX_AWARE")
	if n, _ := runsAndLongest(chosen); n != 1 || !strings.Contains(chosen, "demo: chat: ") || !strings.Contains(chosen, "20s measured") {
		t.Errorf("--full --workloads chat --strategies PREFIX_AWARE:\n%s", chosen)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("--dry-run made its output directory (%v)", err)
	}
}

// TestE2EDemoAgreement runs the demo with two routers and --agreement: the
// routers are asked about the workload's first requests over the measured
// window, the terminal says how often they agreed, and report.json carries
// the counts: every request compared in every round, and the owners (the
// agreed ring) the same on both routers. The picks may differ: three
// instances take rag at the rate sized for seven, so requests overflow.
func TestE2EDemoAgreement(t *testing.T) {
	integOnly(t, "a fleet of 2 routers and 3 instances under load for 8 s, beside the gate's other end-to-end tests; loadtest/agree and loadtest/report test the probe and its report in the gate")
	needBinary(t)
	t.Parallel() // about 12 s, waiting on the demo's load
	out := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	b, err := exec.CommandContext(ctx, binPath, "demo", "--workloads", "rag", "--strategies", "PREFIX_AWARE",
		"--routers", "2", "--instances", "3", "--warmup", "1s", "--duration", "3s", "--agreement", "--quiet", "--out", out).CombinedOutput()
	if err != nil {
		t.Fatalf("demo: %v\n%s", err, b)
	}
	if !regexp.MustCompile(`rag / PREFIX_AWARE: 2 routers, [1-9][0-9]* rounds: picks agreed on [0-9]+ of [1-9][0-9]* \([0-9.]+%\), owners on ([0-9]+) of ([0-9]+) \(100\.0%\)`).Match(b) {
		t.Errorf("no agreement line for rag:\n%s", b)
	}
	js, err := os.ReadFile(filepath.Join(out, "report.json"))
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Runs []struct {
			Agreement *struct {
				Routers  int `json:"routers"`
				Rounds   int `json:"rounds"`
				Compared int `json:"compared"`
				Picks    int `json:"picks_agreeing"`
				Owners   int `json:"owners_agreeing"`
			} `json:"agreement"`
		} `json:"runs"`
	}
	if err := json.Unmarshal(js, &rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.Runs) != 1 || rep.Runs[0].Agreement == nil {
		t.Fatalf("report.json runs without agreement: %s", js)
	}
	a := rep.Runs[0].Agreement
	if a.Routers != 2 || a.Rounds < 1 || a.Compared != 16*a.Rounds || a.Owners != a.Compared || a.Picks > a.Compared {
		t.Errorf("agreement %+v", *a)
	}
}
