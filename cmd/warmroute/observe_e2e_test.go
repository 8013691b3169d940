package main

import (
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warmroute/warmroute/loadtest/proc"
	"github.com/warmroute/warmroute/loadtest/trace"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

// otlpReceiver is an OTLP/HTTP collector: it decodes the protobuf
// exports posted to /v1/traces and keeps their spans.
type otlpReceiver struct {
	srv   *httptest.Server
	mu    sync.Mutex
	spans []*tracepb.Span
	paths []string
	// services are the resources' service.name values.
	services []string
}

func newOTLPReceiver(t *testing.T) *otlpReceiver {
	o := &otlpReceiver{}
	o.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		var req coltracepb.ExportTraceServiceRequest
		if err == nil {
			err = proto.Unmarshal(b, &req)
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		o.mu.Lock()
		o.paths = append(o.paths, r.URL.Path)
		for _, rs := range req.ResourceSpans {
			for _, kv := range rs.GetResource().GetAttributes() {
				if kv.Key == "service.name" {
					o.services = append(o.services, kv.Value.GetStringValue())
				}
			}
			for _, ss := range rs.ScopeSpans {
				o.spans = append(o.spans, ss.Spans...)
			}
		}
		o.mu.Unlock()
		out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.Write(out)
	}))
	t.Cleanup(o.srv.Close)
	return o
}

func (o *otlpReceiver) received() ([]*tracepb.Span, []string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]*tracepb.Span(nil), o.spans...), append([]string(nil), o.paths...)
}

// TestE2EAccessLogTracingRecording runs the binary against gpusim with
// the access log, tracing (to an in-process OTLP/HTTP receiver) and the
// trace recording on: every request gets its log line, the caller's trace
// gets the router's two spans, and the recording parses with
// loadtest/trace, requests sharing a prefix sharing their leading hash
// ids.
func TestE2EAccessLogTracingRecording(t *testing.T) {
	t.Parallel()
	needBinary(t)
	be := startGpusim(t)
	otlp := newOTLPReceiver(t)
	dir := t.TempDir()
	accessPath, recPath := filepath.Join(dir, "access.log"), filepath.Join(dir, "traffic.jsonl")
	r := startRouter(t, proc.ServeArgs{Backends: []string{be}, Extra: []string{
		"--access-log", "on", "--access-log-output", accessPath,
		"--tracing-endpoint", otlp.srv.URL, "--tracing-sample-ratio", "0",
		"--record-trace", recPath,
	}})

	shared := strings.Repeat("You are a careful assistant. Answer from the document below. ", 100) // 6,200 bytes
	const traceID = "0af7651916cd43dd8448eb211c80319c"
	send := func(content string, stream bool, traceparent string) {
		t.Helper()
		m := map[string]any{"model": gpusimModel, "max_tokens": 5, "stream": stream,
			"messages": []map[string]any{{"role": "user", "content": content}}}
		if stream {
			m["stream_options"] = map[string]any{"include_usage": true}
		}
		body, _ := json.Marshal(m)
		req, _ := http.NewRequest("POST", r.url+"/v1/chat/completions", strings.NewReader(string(body)))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Amzn-SageMaker-Prefix-Aware-Id", "tenant-secret-name")
		if traceparent != "" {
			req.Header.Set("traceparent", traceparent)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("status %d: %s", resp.StatusCode, b)
		}
	}
	send(shared+"Question one?", false, "00-"+traceID+"-b7ad6b7169203331-01")
	send(shared+"Question two, streamed?", true, "")
	send("An unrelated short prompt", false, "")
	if err := r.Stop(10 * time.Second); err != nil {
		t.Fatalf("router stopped with %v\n%s", err, r.Logs())
	}

	// The access log: three lines, the fields of each, no prompt text and
	// no tenant.
	raw, err := os.ReadFile(accessPath)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(raw)), "\n")
	if len(lines) != 3 {
		t.Fatalf("%d access log lines, want 3:\n%s", len(lines), raw)
	}
	for _, l := range lines {
		t.Logf("access log: %s", l)
		if strings.Contains(l, "careful assistant") || strings.Contains(l, "tenant-secret") {
			t.Errorf("prompt text or the tenant in the access log: %s", l)
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("%v: %s", err, l)
		}
		for _, k := range []string{"time", "route", "model", "tenant", "backend", "decision", "status", "bytes_in", "bytes_out", "ttfb_ms", "duration_ms"} {
			if _, ok := m[k]; !ok {
				t.Errorf("access log line without %s: %s", k, l)
			}
		}
		if m["route"] != "/v1/chat/completions" || m["model"] != gpusimModel || m["status"] != 200.0 ||
			m["decision"] != "affinity" || m["backend"] == "" || len(m["tenant"].(string)) != 12 {
			t.Errorf("access log line %s", l)
		}
	}

	// Tracing: the caller's trace has the route span (child of the
	// caller's span) and the upstream span (child of the route span); the
	// requests without a traceparent were not sampled (ratio 0).
	spans, paths := otlp.received()
	for _, p := range paths {
		if p != "/v1/traces" {
			t.Errorf("spans posted to %s, want /v1/traces", p)
		}
	}
	byName := map[string]*tracepb.Span{}
	for _, s := range spans {
		if got := hex.EncodeToString(s.TraceId); got != traceID {
			t.Errorf("span %s in trace %s, want only the caller's %s", s.Name, got, traceID)
		}
		byName[s.Name] = s
	}
	route, up := byName["warmroute.route"], byName["warmroute.upstream"]
	if len(spans) != 2 || route == nil || up == nil {
		t.Fatalf("spans %v, want warmroute.route and warmroute.upstream", spans)
	}
	if hex.EncodeToString(route.ParentSpanId) != "b7ad6b7169203331" || string(up.ParentSpanId) != string(route.SpanId) {
		t.Errorf("route span's parent %x, upstream's %x (route %x)", route.ParentSpanId, up.ParentSpanId, route.SpanId)
	}
	attrs := func(s *tracepb.Span) map[string]string {
		m := map[string]string{}
		for _, kv := range s.Attributes {
			m[kv.Key] = strings.Trim(kv.Value.String(), " ")
		}
		return m
	}
	if a := attrs(route); !strings.Contains(a["warmroute.decision"], "affinity") || !strings.Contains(a["gen_ai.request.model"], "Llama") {
		t.Errorf("route span attributes %v", a)
	}
	if a := attrs(up); !strings.Contains(a["http.response.status_code"], "200") || a["warmroute.backend"] == "" {
		t.Errorf("upstream span attributes %v", a)
	}

	// The recording parses as a trace of 256-token blocks; the two
	// questions on the shared document share its 6 full blocks.
	f, err := os.Open(recPath)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	recs, err := trace.Parse(f, trace.ParseConfig{BlockTokens: 256})
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 3 {
		t.Fatalf("%d records, want 3", len(recs))
	}
	var long [][]int64
	for _, rec := range recs {
		t.Logf("record: %d ms, %d tokens in, %d out, %d hash ids", rec.Timestamp.Milliseconds(), rec.InputLength, rec.OutputLength, len(rec.HashIDs))
		if rec.OutputLength != 5 {
			t.Errorf("output_length %d, want gpusim's 5 completion tokens", rec.OutputLength)
		}
		if len(rec.HashIDs) >= 4 {
			long = append(long, rec.HashIDs)
		}
	}
	if len(long) != 2 {
		t.Fatalf("%d records with hash ids, want the 2 questions on the document", len(long))
	}
	n := 0
	for n < len(long[0]) && n < len(long[1]) && long[0][n] == long[1][n] {
		n++
	}
	if n < 4 {
		t.Errorf("the questions on a shared document share %d leading hash ids:\n%v\n%v", n, long[0], long[1])
	}
}

// TestE2ETracingFromOTELEnvironment: with no --tracing-endpoint, the
// standard OTEL_EXPORTER_OTLP_ENDPOINT turns tracing on (spans go to its
// /v1/traces, the batch delay from OTEL_BSP_SCHEDULE_DELAY), and
// OTEL_SERVICE_NAME names the service; OTEL_SDK_DISABLED=true keeps it off.
func TestE2ETracingFromOTELEnvironment(t *testing.T) {
	t.Parallel()
	needBinary(t)
	be := newEngine(t, 0, 0, 1)
	for _, disabled := range []bool{false, true} {
		otlp := newOTLPReceiver(t)
		env := []string{"OTEL_EXPORTER_OTLP_ENDPOINT=" + otlp.srv.URL, "OTEL_BSP_SCHEDULE_DELAY=100", "OTEL_SERVICE_NAME=router-under-test"}
		if disabled {
			env = append(env, "OTEL_SDK_DISABLED=true")
		}
		a := proc.ServeArgs{Listen: freeAddr(t), AdminListen: freeAddr(t), Backends: []string{"http://" + be.addr()},
			ProbeInterval: 100 * time.Millisecond, ShutdownTimeout: 2 * time.Second}
		p, err := proc.Start(proc.Spec{Name: "router", Path: binPath, Args: a.Args(), Env: env, TailBytes: routerLogBytes})
		if err != nil {
			t.Fatal(err)
		}
		r := &router{Process: p, url: "http://" + a.Listen}
		if err := r.waitReady(); err != nil {
			p.Stop(10 * time.Second)
			t.Fatalf("%v\n%s", err, p.Logs())
		}
		req, _ := http.NewRequest("POST", r.url+"/v1/chat/completions", strings.NewReader(chatBody("hello", false)))
		req.Header.Set("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if !disabled {
			if _, err := pollUntil(10*time.Second, func() (bool, error) { s, _ := otlp.received(); return len(s) == 2, nil }); err != nil {
				t.Errorf("spans from OTEL_EXPORTER_OTLP_ENDPOINT: %v", err)
			}
		}
		if err := p.Stop(10 * time.Second); err != nil {
			t.Fatalf("router stopped with %v\n%s", err, p.Logs())
		}
		spans, paths := otlp.received()
		switch {
		case disabled && len(spans) != 0:
			t.Errorf("OTEL_SDK_DISABLED=true: %d spans exported", len(spans))
		case !disabled && (len(spans) != 2 || len(paths) == 0 || paths[0] != "/v1/traces"):
			t.Errorf("%d spans to %v, want 2 to /v1/traces", len(spans), paths)
		case !disabled:
			otlp.mu.Lock()
			if len(otlp.services) == 0 || otlp.services[0] != "router-under-test" {
				t.Errorf("service.name %v, want OTEL_SERVICE_NAME's router-under-test", otlp.services)
			}
			otlp.mu.Unlock()
		}
	}
}
