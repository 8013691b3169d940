package gpusim

import (
	"net/http"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// scrape fetches /metrics and parses it with the Prometheus text parser.
func scrape(t *testing.T, ts *testServer) map[string]*dto.MetricFamily {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, ts.srv.URL+"/metrics", nil)
	req.Header.Set("Accept", "text/plain; version=0.0.4")
	resp, err := ts.c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
		t.Fatalf("/metrics Content-Type %q", ct)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parsing /metrics: %v", err)
	}
	return fams
}

func labelsMatch(m *dto.Metric, want map[string]string) bool {
	n := 0
	for _, l := range m.GetLabel() {
		if v, ok := want[l.GetName()]; ok {
			if v != l.GetValue() {
				return false
			}
			n++
		}
	}
	return n == len(want)
}

func gaugeValue(t *testing.T, fams map[string]*dto.MetricFamily, name string) float64 {
	t.Helper()
	f := fams[name]
	if f == nil || f.GetType() != dto.MetricType_GAUGE || len(f.GetMetric()) != 1 {
		t.Fatalf("%s: missing or not a single gauge: %v", name, f)
	}
	return f.GetMetric()[0].GetGauge().GetValue()
}

func counterValue(t *testing.T, fams map[string]*dto.MetricFamily, name string, labels map[string]string) float64 {
	t.Helper()
	f := fams[name]
	if f == nil || f.GetType() != dto.MetricType_COUNTER {
		t.Fatalf("%s: missing or not a counter: %v", name, f)
	}
	for _, m := range f.GetMetric() {
		if labelsMatch(m, labels) {
			return m.GetCounter().GetValue()
		}
	}
	t.Fatalf("%s: no series with labels %v", name, labels)
	return 0
}

func TestMetricsParseWithVLLMNamesAndCountersNeverDecrease(t *testing.T) {
	ts := startInstance(t, FastConfig())
	vllmLabels := map[string]string{"model_name": "meta-llama/Llama-3.1-70B-Instruct", "engine": "0"}
	want := map[string]dto.MetricType{
		"vllm:num_requests_running":        dto.MetricType_GAUGE,
		"vllm:num_requests_waiting":        dto.MetricType_GAUGE,
		"vllm:kv_cache_usage_perc":         dto.MetricType_GAUGE,
		"vllm:prefix_cache_queries_total":  dto.MetricType_COUNTER,
		"vllm:prefix_cache_hits_total":     dto.MetricType_COUNTER,
		"vllm:prompt_tokens_total":         dto.MetricType_COUNTER,
		"vllm:generation_tokens_total":     dto.MetricType_COUNTER,
		"vllm:request_success_total":       dto.MetricType_COUNTER,
		"vllm:time_to_first_token_seconds": dto.MetricType_HISTOGRAM,
		"vllm:inter_token_latency_seconds": dto.MetricType_HISTOGRAM,
		"vllm:e2e_request_latency_seconds": dto.MetricType_HISTOGRAM,
		"vllm:request_queue_time_seconds":  dto.MetricType_HISTOGRAM,
		"gpusim_requests_aborted_total":    dto.MetricType_COUNTER,
	}
	before := scrape(t, ts)
	for name, typ := range want {
		f := before[name]
		if f == nil || f.GetType() != typ {
			t.Fatalf("%s: missing or type %v, want %v", name, f.GetType(), typ)
		}
		if strings.HasPrefix(name, "vllm:") {
			for _, m := range f.GetMetric() {
				if !labelsMatch(m, vllmLabels) {
					t.Fatalf("%s: labels %v, want model_name and engine=\"0\"", name, m.GetLabel())
				}
			}
		}
	}
	if n := len(before["vllm:time_to_first_token_seconds"].GetMetric()[0].GetHistogram().GetBucket()); n != 22+1 {
		t.Fatalf("TTFT histogram has %d buckets, want vLLM's 22 and +Inf", n)
	}

	body := tokenIDsBody(seqIDs(0, 100), `,"max_tokens":5`)
	ts.postJSON(t, "/v1/completions", body)
	ts.postJSON(t, "/v1/completions", body)
	mid := scrape(t, ts)
	ts.postJSON(t, "/v1/completions", `{"prompt":"other","max_tokens":2}`)
	after := scrape(t, ts)

	checks := []struct {
		name   string
		labels map[string]string
		delta  float64 // expected increase between before and mid
	}{
		{"vllm:prompt_tokens_total", vllmLabels, 200},
		{"vllm:prefix_cache_queries_total", vllmLabels, 200},
		{"vllm:prefix_cache_hits_total", vllmLabels, 96},
		{"vllm:generation_tokens_total", vllmLabels, 10},
		{"vllm:request_success_total", map[string]string{"finished_reason": "length"}, 2},
		{"vllm:request_success_total", map[string]string{"finished_reason": "stop"}, 0},
	}
	for _, c := range checks {
		b, m, a := counterValue(t, before, c.name, c.labels), counterValue(t, mid, c.name, c.labels), counterValue(t, after, c.name, c.labels)
		if m-b != c.delta {
			t.Errorf("%s%v grew by %v, want %v", c.name, c.labels, m-b, c.delta)
		}
		if m < b || a < m {
			t.Errorf("%s%v decreased: %v %v %v", c.name, c.labels, b, m, a)
		}
	}
	for _, name := range []string{"vllm:time_to_first_token_seconds", "vllm:e2e_request_latency_seconds"} {
		if n := after[name].GetMetric()[0].GetHistogram().GetSampleCount(); n != 3 {
			t.Errorf("%s count %d, want 3", name, n)
		}
	}
	// Tokens 2..5 of each of the three requests (2+2 ... ) are inter-token gaps.
	if n := after["vllm:inter_token_latency_seconds"].GetMetric()[0].GetHistogram().GetSampleCount(); n != 4+4+1 {
		t.Errorf("inter-token latency count %d, want 9", n)
	}
	if v := gaugeValue(t, after, "vllm:kv_cache_usage_perc"); v != 0 {
		t.Errorf("idle KV usage %v, want 0 (cached free blocks count as free)", v)
	}
}

func TestInstancesHaveSeparateRegistries(t *testing.T) {
	a, b := startInstance(t, FastConfig()), startInstance(t, FastConfig())
	a.postJSON(t, "/v1/completions", `{"prompt":"only on a","max_tokens":2}`)
	if v := counterValue(t, scrape(t, b), "vllm:generation_tokens_total", nil); v != 0 {
		t.Fatalf("instance b counted a's tokens: %v", v)
	}
	if a.in.m.reg == b.in.m.reg {
		t.Fatal("instances share a registry")
	}
}
