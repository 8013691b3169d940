package engine

import (
	"fmt"
	"math"
	"os"
	"strings"
	"testing"
)

// testdata returns the file name in testdata/.
func testdata(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile("testdata/" + name)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func mustParser(t testing.TB) *Parser {
	t.Helper()
	p, err := NewParser(DefaultMapping())
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

func TestParseEngines(t *testing.T) {
	p := mustParser(t)
	cases := []struct {
		file string
		want Sample
	}{
		{"vllm_v1.txt", Sample{Running: 5, Waiting: 1, KVUsage: 0.375, PrefixQueries: 150000, PrefixHits: 90000,
			Known: KnownRunning | KnownWaiting | KnownKVUsage, HasCounters: true}},
		{"vllm_v0.txt", Sample{Running: 4, Waiting: 2, KVUsage: 0.75, PrefixHitRate: 0.42,
			Known: KnownRunning | KnownWaiting | KnownKVUsage | KnownPrefixHitRate}},
		{"vllm_v1_early.txt", Sample{Running: 1, Waiting: 0, KVUsage: 0.1, PrefixQueries: 2000, PrefixHits: 500,
			Known: KnownRunning | KnownWaiting | KnownKVUsage, HasCounters: true}},
		{"sglang.txt", Sample{Running: 11, Waiting: 3, KVUsage: 0.4, PrefixHitRate: 0.7,
			Known: KnownRunning | KnownWaiting | KnownKVUsage | KnownPrefixHitRate}},
		{"tgi.txt", Sample{Running: 16, Waiting: 4, Known: KnownRunning | KnownWaiting}},
	}
	for _, tc := range cases {
		got := p.Parse(testdata(t, tc.file))
		w := tc.want
		if got.Known != w.Known || got.HasCounters != w.HasCounters || !near(got.Running, w.Running) || !near(got.Waiting, w.Waiting) ||
			!near(got.KVUsage, w.KVUsage) || !near(got.PrefixHitRate, w.PrefixHitRate) ||
			!near(got.PrefixQueries, w.PrefixQueries) || !near(got.PrefixHits, w.PrefixHits) {
			t.Errorf("%s:\n got %+v\nwant %+v", tc.file, got, w)
		}
	}
}

func TestParseSyntax(t *testing.T) {
	p := mustParser(t)
	cases := []struct {
		name, body string
		running    float64
		known      bool
	}{
		{"plain", "vllm:num_requests_running 3\n", 3, true},
		{"timestamp", "vllm:num_requests_running{a=\"b\"} 3 1700000000000\n", 3, true},
		{"exponent", "vllm:num_requests_running 2.5e+00\n", 2.5, true},
		{"tabs and indent", "  \tvllm:num_requests_running\t\t7\n", 7, true},
		{"quoted braces", `vllm:num_requests_running{model_name="a}b{",x="\"}"} 4` + "\n", 4, true},
		{"escaped backslash", `vllm:num_requests_running{p="c:\\"} 6` + "\n", 6, true},
		{"utf8 quoted name", `{"vllm:num_requests_running",engine="0"} 8` + "\n", 8, true},
		{"utf8 quoted name only", `{"vllm:num_requests_running"} 9` + "\n", 9, true},
		{"NaN skipped", "vllm:num_requests_running NaN\nvllm:num_requests_running 1\n", 1, true},
		{"Inf skipped", "vllm:num_requests_running +Inf\n", 0, false},
		{"no value", "vllm:num_requests_running\n", 0, false},
		{"no space", "vllm:num_requests_running{}3\n", 0, false},
		{"unterminated labels", "vllm:num_requests_running{a=\"b 3\n", 0, false},
		{"garbage value", "vllm:num_requests_running three\n", 0, false},
		{"comment", "# vllm:num_requests_running 3\n", 0, false},
		{"longer name", "vllm:num_requests_running_total 3\n", 0, false},
		{"prefix of name", "vllm:num_requests_run 3\n", 0, false},
		{"empty", "", 0, false},
		{"overflowing sum", "vllm:num_requests_running 1e308\nvllm:num_requests_running 1e308\n", 0, false},
		{"openmetrics eof", "vllm:num_requests_running 2\n# EOF\n", 2, true},
	}
	for _, tc := range cases {
		got := p.Parse([]byte(tc.body))
		if (got.Known&KnownRunning != 0) != tc.known || got.Running != tc.running {
			t.Errorf("%s: running %v known %v, want %v %v", tc.name, got.Running, got.Known&KnownRunning != 0, tc.running, tc.known)
		}
	}
}

func TestParsePreference(t *testing.T) {
	p := mustParser(t)
	// An engine exporting the current and the deprecated KV name, and V1
	// counters next to a V0 rate gauge: only the preferred ones count.
	body := `vllm:gpu_cache_usage_perc{engine="0"} 0.9
vllm:kv_cache_usage_perc{engine="0"} 0.3
vllm:gpu_prefix_cache_queries_total 10
vllm:gpu_prefix_cache_hits_total 1
vllm:prefix_cache_queries_total 100
vllm:prefix_cache_hits_total 50
`
	got := p.Parse([]byte(body))
	if got.KVUsage != 0.3 || got.PrefixQueries != 100 || got.PrefixHits != 50 {
		t.Fatalf("got %+v", got)
	}
	// Counters are taken as a pair: a hits counter without its queries
	// counter falls through to the next pair.
	got = p.Parse([]byte("vllm:prefix_cache_hits_total 50\nvllm:gpu_prefix_cache_queries_total 10\nvllm:gpu_prefix_cache_hits_total 1\n"))
	if !got.HasCounters || got.PrefixQueries != 10 || got.PrefixHits != 1 {
		t.Fatalf("pair fallback: %+v", got)
	}
}

func TestCustomMapping(t *testing.T) {
	m := Mapping{Running: []string{"trtllm_active_requests"}, Waiting: []string{"trtllm_queued_requests"}}
	p, err := NewParser(m)
	if err != nil {
		t.Fatal(err)
	}
	got := p.Parse([]byte("trtllm_active_requests 2\ntrtllm_queued_requests 5\nvllm:num_requests_running 9\n"))
	if got.Running != 2 || got.Waiting != 5 || got.Known != KnownRunning|KnownWaiting {
		t.Fatalf("got %+v", got)
	}
	bad := []Mapping{
		{PrefixQueries: []string{"q"}},
		{Running: []string{""}},
		{Running: []string{"a"}, Waiting: []string{"a"}},
		{Running: strings.Fields(strings.Repeat("x ", maxNames+1))},
	}
	for i, m := range bad {
		if i == 3 {
			for j := range m.Running {
				m.Running[j] = fmt.Sprint("n", j)
			}
		}
		if _, err := NewParser(m); err == nil {
			t.Errorf("mapping %d accepted", i)
		}
	}
}

func TestParseAllocs(t *testing.T) {
	p := mustParser(t)
	body := testdata(t, "vllm_v1.txt")
	allocs := testing.AllocsPerRun(100, func() { p.Parse(body) })
	if allocs > 0 {
		t.Fatalf("Parse allocates %.0f times per body", allocs)
	}
}

func BenchmarkParse(b *testing.B) {
	p := mustParser(b)
	body := testdata(b, "vllm_v1.txt")
	// A realistic V1 body is larger: repeat the histograms of more models.
	var big strings.Builder
	big.Write(body)
	for i := range 20 {
		for _, line := range strings.Split(string(body), "\n") {
			if strings.HasPrefix(line, "vllm:time_to_first_token") {
				big.WriteString(strings.ReplaceAll(line, "Llama", fmt.Sprint("Model", i)) + "\n")
			}
		}
	}
	for _, in := range []struct {
		name string
		body []byte
	}{{"fixture", body}, {"large", []byte(big.String())}} {
		b.Run(fmt.Sprintf("%s-%dB", in.name, len(in.body)), func(b *testing.B) {
			b.SetBytes(int64(len(in.body)))
			b.ReportAllocs()
			for b.Loop() {
				p.Parse(in.body)
			}
		})
	}
}

// FuzzParse checks that any body parses without panicking, without
// changing the body, and into finite figures.
func FuzzParse(f *testing.F) {
	for _, name := range []string{"vllm_v1.txt", "vllm_v0.txt", "vllm_v1_early.txt", "sglang.txt", "tgi.txt"} {
		f.Add(testdata(f, name))
	}
	f.Add([]byte(`{"vllm:num_requests_running",a="}"} 1`))
	f.Add([]byte("vllm:num_requests_running{a=\"\\"))
	f.Add([]byte("vllm:num_requests_running 1e308\nvllm:num_requests_running 1e308\n"))
	p := mustParser(f)
	f.Fuzz(func(t *testing.T, body []byte) {
		orig := string(body)
		s := p.Parse(body)
		if string(body) != orig {
			t.Fatal("Parse modified its input")
		}
		for _, v := range []float64{s.KVUsage, s.Running, s.Waiting, s.PrefixHitRate, s.PrefixQueries, s.PrefixHits} {
			if math.IsNaN(v) || math.IsInf(v, 0) {
				t.Fatalf("non-finite figure in %+v", s)
			}
		}
		if s.Known&^(KnownKVUsage|KnownRunning|KnownWaiting|KnownPrefixHitRate) != 0 {
			t.Fatalf("known bits %b", s.Known)
		}
	})
}

// FuzzParseSums builds an exposition from fuzzed figures and label values
// and checks the parser sums what was written.
func FuzzParseSums(f *testing.F) {
	f.Add(uint16(3), uint16(4), "model-a", "0", 0.5)
	f.Add(uint16(0), uint16(65535), `we"ird}{`, `\`, 1.0)
	p := mustParser(f)
	f.Fuzz(func(t *testing.T, r1, r2 uint16, model, engine string, kv float64) {
		if math.IsNaN(kv) || math.IsInf(kv, 0) {
			return
		}
		esc := strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`)
		lbl := fmt.Sprintf(`{model_name="%s",engine="%s"}`, esc.Replace(model), esc.Replace(engine))
		body := fmt.Sprintf("# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running%s %d\nvllm:num_requests_running{engine=\"x\"} %d\nvllm:kv_cache_usage_perc%s %v\n",
			lbl, r1, r2, lbl, kv)
		s := p.Parse([]byte(body))
		if s.Running != float64(r1)+float64(r2) || s.Known&KnownRunning == 0 {
			t.Fatalf("running %v, want %d+%d, body:\n%s", s.Running, r1, r2, body)
		}
		if s.KVUsage != kv || s.Known&KnownKVUsage == 0 {
			t.Fatalf("kv %v, want %v, body:\n%s", s.KVUsage, kv, body)
		}
	})
}
