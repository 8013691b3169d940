package kvmetrics

import (
	"errors"
	"strings"
	"testing"
)

// vllmV1 is an excerpt of a vLLM V1 /metrics page (Python client: the TYPE
// line names the family without _total).
const vllmV1 = `# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 12000.0
vllm:prefix_cache_queries_total{engine="1",model_name="m"} 8000.0
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 9000.0
vllm:prefix_cache_hits_total{engine="1",model_name="m"} 1000.0
`

func TestParse(t *testing.T) {
	cases := []struct {
		name          string
		in            string
		queries, hits float64
	}{
		{"V1", vllmV1, 20000, 10000},
		// prometheus_client (Python) declares the family without _total
		// and suffixes the samples; expfmt then files the samples under
		// their own untyped name.
		{"family without _total", `# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{model_name="m"} 50
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{model_name="m"} 20
vllm:prefix_cache_hits_created{model_name="m"} 1.7e9
`, 50, 20},
		{"early V1 names", "vllm:gpu_prefix_cache_queries_total 10\nvllm:gpu_prefix_cache_hits_total 4\n", 10, 4},
	}
	for _, c := range cases {
		got, err := Parse(strings.NewReader(c.in))
		if err != nil || got.Queries != c.queries || got.Hits != c.hits {
			t.Errorf("%s: got %+v, %v; want queries %g hits %g", c.name, got, err, c.queries, c.hits)
		}
	}
}

func TestParseErrors(t *testing.T) {
	_, err := Parse(strings.NewReader("# TYPE x counter\nx 1\n"))
	if !errors.Is(err, ErrNoCounters) {
		t.Fatalf("no counters: %v", err)
	}
	// queries without hits is not a pair
	_, err = Parse(strings.NewReader("vllm:prefix_cache_queries_total 1\n"))
	if !errors.Is(err, ErrNoCounters) {
		t.Fatalf("half a pair: %v", err)
	}
	_, err = Parse(strings.NewReader("vllm:prefix_cache_queries_total{ 1\n"))
	if !errors.Is(err, ErrParse) {
		t.Fatalf("malformed: %v", err)
	}
	_, err = Parse(strings.NewReader("<html>not metrics</html>\n"))
	if err == nil {
		t.Fatal("HTML accepted")
	}
}

func FuzzParse(f *testing.F) {
	f.Add(vllmV1)
	f.Add("vllm:gpu_prefix_cache_queries_total 10\nvllm:gpu_prefix_cache_hits_total 4\n")
	f.Add("# TYPE a counter\na_total{x=\"y\"} NaN\n")
	f.Add("")
	f.Fuzz(func(t *testing.T, s string) {
		c, err := Parse(strings.NewReader(s))
		if err != nil && (c.Queries != 0 || c.Hits != 0) {
			t.Fatalf("error %v with counters %+v", err, c)
		}
	})
}
