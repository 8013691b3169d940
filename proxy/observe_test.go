package proxy

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
	"github.com/warmroute/warmroute/loadtest/trace"
	"github.com/warmroute/warmroute/proxy/reqlog"
	"github.com/warmroute/warmroute/ring"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	oteltrace "go.opentelemetry.io/otel/trace"
)

// usageHandler answers like vLLM: a JSON answer with usage, or an SSE
// stream ending in a usage event. It keeps each request's traceparent.
type usageHandler struct {
	mu     sync.Mutex
	parent []string
}

func (u *usageHandler) serve(w http.ResponseWriter, r *http.Request) {
	u.mu.Lock()
	u.parent = append(u.parent, r.Header.Get("traceparent"))
	u.mu.Unlock()
	body, _ := io.ReadAll(r.Body)
	if !bytes.Contains(body, []byte(`"stream":true`)) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, usageDoc(vllmUsage(1500, 1024)))
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	io.WriteString(w, streamOf(chunkEvent("a"), chunkEvent("b"), usageChunk(vllmUsage(1500, 0))))
}

func (u *usageHandler) parents() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]string(nil), u.parent...)
}

// observed starts a proxy with a request log and a tracer in front of a
// usage stub; stop shuts the proxy down and closes the log.
func observed(t *testing.T, lc reqlog.Config, tp *sdktrace.TracerProvider) (h *harness, u *usageHandler, stop func()) {
	t.Helper()
	u = &usageHandler{}
	a := newStub(t, "a", u.serve)
	l, err := reqlog.New(lc)
	if err != nil {
		t.Fatal(err)
	}
	cfg := testProxyConfig()
	cfg.Requests = l
	if tp != nil {
		cfg.Tracer = tp.Tracer("test")
	}
	h = startProxy(t, cfg, ring.DefaultConfig(), a)
	var once sync.Once
	stop = func() {
		once.Do(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			h.p.Shutdown(ctx)
			l.Close()
		})
	}
	t.Cleanup(stop)
	return h, u, stop
}

// TestAccessLogAndRecording: each request gets an access log line with
// its route, model, tenant hash, backend, decision, status, sizes and
// times; routed chat requests become trace records that loadtest/trace
// parses, with the prompt tokens and completion tokens the backend
// reported.
func TestAccessLogAndRecording(t *testing.T) {
	dir := t.TempDir()
	accessPath, recPath := filepath.Join(dir, "access.log"), filepath.Join(dir, "rec.jsonl")
	h, _, stop := observed(t, reqlog.Config{AccessSample: 1, AccessFormat: reqlog.FormatJSON, AccessLog: accessPath, RecordPath: recPath}, nil)

	prompt := strings.Repeat("a shared document ", 300)
	post(t, h.url+"/v1/chat/completions", chatReq(prompt+"q1", ""), HeaderTenant, "acme")
	resp, body := post(t, h.url+"/v1/chat/completions", chatReq(prompt+"q2", `,"stream":true`), HeaderTenant, "acme")
	if resp.StatusCode != 200 || !bytes.Contains(body, []byte("[DONE]")) {
		t.Fatalf("stream: %d %s", resp.StatusCode, body)
	}
	post(t, h.url+"/v1/chat/completions", `{"model":`)
	post(t, h.url+"/nope", "")
	stop()

	raw, err := os.ReadFile(accessPath)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(raw)), "\n")
	if len(lines) != 4 {
		t.Fatalf("%d access lines, want 4:\n%s", len(lines), raw)
	}
	type line struct {
		Time, Route, Model, Tenant, Backend, Decision string
		Status                                        int
		BytesIn                                       int64    `json:"bytes_in"`
		BytesOut                                      int64    `json:"bytes_out"`
		TTFB                                          *float64 `json:"ttfb_ms"`
		Duration                                      float64  `json:"duration_ms"`
	}
	var ls []line
	for _, s := range lines {
		var l line
		if err := json.Unmarshal([]byte(s), &l); err != nil {
			t.Fatalf("%v: %s", err, s)
		}
		if strings.Contains(s, "shared document") || strings.Contains(s, "acme") {
			t.Errorf("prompt text or tenant in the access log: %s", s)
		}
		ls = append(ls, l)
	}
	// Lines come in the order answers end; the stream may end last.
	id := h.p.Status()[0].ID
	for _, l := range ls {
		switch {
		case l.Route == "other":
			if l.Status != 404 || l.Backend != "" {
				t.Errorf("404 line %+v", l)
			}
		case l.Status == 400:
			if l.Backend != "" || l.TTFB != nil || l.BytesIn != int64(len(`{"model":`)) {
				t.Errorf("400 line %+v", l)
			}
		default:
			if l.Route != "/v1/chat/completions" || l.Model != "m" || len(l.Tenant) != 12 || l.Backend != id ||
				l.Decision != "affinity" || l.Status != 200 || l.BytesIn < 5400 || l.BytesOut < 100 ||
				l.TTFB == nil || *l.TTFB <= 0 || l.Duration < *l.TTFB {
				t.Errorf("line %+v", l)
			}
		}
	}

	f, err := os.Open(recPath)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	recs, err := trace.Parse(f, trace.ParseConfig{BlockTokens: reqlog.BlockTokens})
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 2 {
		t.Fatalf("%d trace records, want the 2 routed requests", len(recs))
	}
	for _, r := range recs {
		// 1500 tokens reported: 5 full blocks of 256, from the 5 full
		// 1 KiB blocks of the shared prompt.
		if r.InputLength != 1500 || r.OutputLength != 3 || len(r.HashIDs) != 5 {
			t.Errorf("record %+v: want 1500 tokens in, 3 out, 5 hash ids", r)
		}
	}
	if fmt.Sprint(recs[0].HashIDs) != fmt.Sprint(recs[1].HashIDs) {
		t.Errorf("a shared prefix, different hash ids: %v %v", recs[0].HashIDs, recs[1].HashIDs)
	}
}

// TestTracing: with a traceparent, both spans join the caller's trace;
// the backend sees the upstream span as its parent; a stream's upstream
// span ends with the stream.
func TestTracing(t *testing.T) {
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(0))))
	h, u, stop := observed(t, reqlog.Config{}, tp)

	const traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	parent := "00-" + traceID + "-00f067aa0ba902b7-01"
	post(t, h.url+"/v1/chat/completions", chatReq("hello", ""), "traceparent", parent)
	post(t, h.url+"/v1/chat/completions", chatReq("hello", `,"stream":true`), "traceparent", parent)
	// Not sampled (ratio 0, no sampled parent): no spans, but a
	// traceparent upstream still.
	post(t, h.url+"/v1/chat/completions", chatReq("hello", ""))
	stop()

	spans := sr.Ended()
	if len(spans) != 4 {
		t.Fatalf("%d spans, want 4", len(spans))
	}
	ups := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range spans {
		if s.SpanContext().TraceID().String() != traceID {
			t.Errorf("span %s in trace %s", s.Name(), s.SpanContext().TraceID())
		}
		if s.Name() == spanUpstream {
			ups[s.SpanContext().SpanID().String()] = s
			if s.Parent().SpanID().String() == "00f067aa0ba902b7" {
				t.Errorf("upstream span's parent is the caller's span, want the route span")
			}
		} else if s.Name() != spanRoute || s.Parent().SpanID().String() != "00f067aa0ba902b7" {
			t.Errorf("span %s with parent %s", s.Name(), s.Parent().SpanID())
		}
		attrs := map[string]string{}
		for _, a := range s.Attributes() {
			attrs[string(a.Key)] = a.Value.Emit()
		}
		if attrs["warmroute.decision"] != "affinity" || attrs["warmroute.backend"] == "" {
			t.Errorf("span %s attributes %v", s.Name(), attrs)
		}
		if s.Name() == spanUpstream && attrs["http.response.status_code"] != "200" {
			t.Errorf("upstream span attributes %v", attrs)
		}
		if s.Name() == spanRoute && attrs["gen_ai.request.model"] != "m" {
			t.Errorf("route span attributes %v", attrs)
		}
	}
	got := u.parents()
	if len(got) != 3 {
		t.Fatalf("backend saw %d requests", len(got))
	}
	for _, tp := range got[:2] {
		sc := (propagation.TraceContext{}).Extract(context.Background(), propagation.HeaderCarrier{"Traceparent": {tp}})
		span := oteltrace.SpanContextFromContext(sc)
		if span.TraceID().String() != traceID || ups[span.SpanID().String()] == nil {
			t.Errorf("backend's traceparent %s is not an upstream span of the caller's trace", tp)
		}
	}
	if p := got[2]; !strings.HasSuffix(p, "-00") || strings.Contains(p, traceID) {
		t.Errorf("unsampled request's traceparent %q, want a new, unsampled one", p)
	}
}

// TestObservedAllocations: the access log and the trace recording add no
// allocation per request to a complete answer.
func TestObservedAllocations(t *testing.T) {
	if raceEnabled {
		t.Skip("under the race detector sync.Pool drops objects on purpose")
	}
	stub := newRawStub(t)
	l, err := reqlog.New(reqlog.Config{AccessSample: 1, AccessFormat: reqlog.FormatJSON, AccessLog: reqlog.Stdout,
		Stdout: io.Discard, RecordPath: filepath.Join(t.TempDir(), "rec.jsonl")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	cfg := DefaultConfig()
	cfg.ProbePath = ""
	cfg.Requests = l
	h := startProxyBackends(t, cfg, ring.DefaultConfig(), []ring.Backend{{ID: "stub/", Addr: stub.url()}})
	c := newRawClient(t, strings.TrimPrefix(h.url, "http://"))
	n := allocsPerRequest(t, c, chatRequest(4<<10, false), func(head, body []byte) bool {
		return bytes.HasPrefix(head, []byte("HTTP/1.1 200"))
	})
	t.Logf("a request with an access log line and a trace record allocates %.2f times", n)
	if want := maxRequestAllocs(); n > want {
		t.Errorf("a logged and recorded request allocates %.2f times, want %v", n, want)
	}
}

// BenchmarkObserve is BenchmarkProxy's single connection with the access
// log off, on, and on with the trace recording.
func BenchmarkObserve(b *testing.B) {
	for _, mode := range []string{"off", "access", "access+record"} {
		b.Run(mode, func(b *testing.B) {
			var lc reqlog.Config
			if mode != "off" {
				lc = reqlog.Config{AccessSample: 1, AccessFormat: reqlog.FormatJSON, AccessLog: reqlog.Stdout, Stdout: io.Discard}
			}
			if mode == "access+record" {
				lc.RecordPath = filepath.Join(b.TempDir(), "rec.jsonl")
			}
			l, err := reqlog.New(lc)
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { l.Close() })
			stub := newRawStub(b)
			cfg := DefaultConfig()
			cfg.ProbePath = ""
			cfg.Requests = l
			h := startProxyBackends(b, cfg, ring.DefaultConfig(), []ring.Backend{{ID: "stub/", Addr: stub.url()}})
			c := newRawClient(b, strings.TrimPrefix(h.url, "http://"))
			req := chatRequest(4<<10, false)
			b.ReportAllocs()
			for b.Loop() {
				if _, _, err := c.do(req); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// FuzzTraceparent: any traceparent and tracestate a client sends are
// read by the W3C propagator without harm, and what goes upstream is
// either nothing or a well-formed traceparent.
func FuzzTraceparent(f *testing.F) {
	f.Add("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "congo=t61rcWkgMzE")
	f.Add("ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "")
	f.Add("00-00000000000000000000000000000000-00f067aa0ba902b7-01", "a=b,c=d")
	f.Fuzz(func(t *testing.T, parent, state string) {
		var in, out fasthttp.RequestHeader
		in.Set("traceparent", parent)
		in.Set("tracestate", state)
		var prop propagation.TraceContext
		ctx := prop.Extract(context.Background(), headerCarrier{&in})
		prop.Inject(ctx, headerCarrier{&out})
		got := string(out.Peek("traceparent"))
		sc := oteltrace.SpanContextFromContext(ctx)
		if sc.IsValid() != (got != "") {
			t.Fatalf("valid %v, injected %q", sc.IsValid(), got)
		}
		if got != "" && (len(got) != 55 || !strings.Contains(got, sc.TraceID().String())) {
			t.Fatalf("injected %q for %q", got, parent)
		}
	})
}

// BenchmarkObserveHotPath is what the request path itself spends on a
// request's record and spans, without the network: key extraction and the
// pick (as for any request), then the record or spans filled and handed
// over, for a 4 KiB chat prompt. The writer formats and writes the lines
// on its own goroutine (reqlog's BenchmarkFormat).
func BenchmarkObserveHotPath(b *testing.B) {
	raw := chatRequest(4<<10, false)
	body := raw[bytes.Index(raw, []byte("\r\n\r\n"))+4:]
	for _, mode := range []string{"off", "access", "access+record", "tracing", "tracing-unsampled"} {
		b.Run(mode, func(b *testing.B) {
			cfg := DefaultConfig()
			cfg.ProbePath = ""
			var lc reqlog.Config
			if strings.HasPrefix(mode, "access") {
				lc = reqlog.Config{AccessSample: 1, AccessFormat: reqlog.FormatJSON, AccessLog: reqlog.Stdout, Stdout: io.Discard}
			}
			if mode == "access+record" {
				lc.RecordPath = filepath.Join(b.TempDir(), "rec.jsonl")
			}
			l, err := reqlog.New(lc)
			if err != nil {
				b.Fatal(err)
			}
			defer l.Close()
			cfg.Requests = l
			if strings.HasPrefix(mode, "tracing") {
				sampler := sdktrace.AlwaysSample()
				if mode == "tracing-unsampled" {
					sampler = sdktrace.ParentBased(sdktrace.TraceIDRatioBased(0))
				}
				tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sampler))
				defer tp.Shutdown(context.Background())
				cfg.Tracer = tp.Tracer("bench")
			}
			p, err := New(cfg)
			if err != nil {
				b.Fatal(err)
			}
			r, err := ring.New(ring.DefaultConfig(), []ring.Backend{{ID: "a/", Addr: "http://127.0.0.1:1"}, {ID: "b/", Addr: "http://127.0.0.1:2"}})
			if err != nil {
				b.Fatal(err)
			}
			if err := p.SetRing(r, 1); err != nil {
				b.Fatal(err)
			}
			var ctx fasthttp.RequestCtx
			ctx.Request.Header.SetMethod("POST")
			ctx.Request.SetBody(body)
			st := new(reqState)
			dropped := 0
			b.ReportAllocs()
			cpu0 := processCPU()
			for b.Loop() {
				t := p.tab.Load()
				start := time.Now()
				st.reset(t, start)
				if p.observing {
					p.observeStart(&ctx, st, routeChat, start)
				}
				if err := p.readKey(t, ring.Chat, body, nil, nil, st, true); err != nil {
					b.Fatal(err)
				}
				if p.observing {
					if st.obs.rec == nil && strings.HasPrefix(mode, "access") {
						dropped++
					}
					p.observeKey(t, ring.Chat, body, nil, st)
				}
				d, err := t.ring.PickCost(st.info.Key, st.recompute, st)
				if err != nil {
					b.Fatal(err)
				}
				if p.observing {
					now := time.Now()
					p.observeRouted(st, d, nil, now)
					p.observeSend(&ctx.Request, st, t.bs[d.Backend], d, now)
					ctx.Response.SetStatusCode(200)
					p.observeAnswer(st, &ctx.Response, now)
					p.observeEnd(&ctx, st, start)
				}
			}
			if mode != "tracing" && mode != "tracing-unsampled" {
				l.Close() // the writer's share of the CPU counts too
			}
			b.ReportMetric(float64(processCPU()-cpu0)/float64(b.N), "cpu-ns/op")
			b.ReportMetric(float64(dropped)/float64(b.N), "dropped/op")
		})
	}
}

// processCPU is the CPU time the process has used (user and system, every
// thread), in nanoseconds: wall time on a shared machine says little.
func processCPU() int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}
