package proxy

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/valyala/fasthttp"
	"github.com/warmroute/warmroute/internal/backendspec"
	"github.com/warmroute/warmroute/loadtest/gpusim"
	"github.com/warmroute/warmroute/ring"
)

// scanPieces runs a scan in mode over the pieces, in order.
func scanPieces(mode uint8, pieces ...[]byte) usageReport {
	s := usageScan{mode: mode}
	for _, p := range pieces {
		s.feed(p)
	}
	return s.report()
}

func ok(p, c int64) usageReport     { return usageReport{usageOK, p, c} }
func noDetails(p int64) usageReport { return usageReport{usageNoDetails, p, 0} }
func (r usageReport) String() string {
	return fmt.Sprintf("%s %d/%d", usageResultNames[r.result], r.cached, r.prompt)
}
func usageDoc(usage string) string {
	return `{"id":"c","object":"chat.completion","choices":[],"usage":` + usage + `}`
}
func usageEvent(doc string) string { return "data: " + doc + "\n\n" }
func usageObj(p, c string) string {
	return `{"prompt_tokens":` + p + `,"total_tokens":1,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":` + c + `}}`
}
func invalidReport() usageReport { return usageReport{result: usageInvalid} }
func noReport() usageReport      { return usageReport{} }
func chunkEvent(tok string) string {
	return usageEvent(`{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"` + tok + `"},"logprobs":null,"finish_reason":null}]}`)
}
func usageChunk(usage string) string {
	return usageEvent(`{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":` + usage + `}`)
}
func vllmUsage(p, c int) string {
	return fmt.Sprintf(`{"prompt_tokens":%d,"total_tokens":%d,"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":%d}}`, p, p+3, c)
}
func vllmUsageNoDetails(p int) string {
	return fmt.Sprintf(`{"prompt_tokens":%d,"total_tokens":%d,"completion_tokens":3}`, p, p+3)
}
func streamOf(events ...string) string { return strings.Join(events, "") + "data: [DONE]\n\n" }

// usageJSONCases are whole JSON answers and what their usage says.
var usageJSONCases = []struct {
	name string
	doc  string
	want usageReport
}{
	{"vLLM chat answer", `{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"hi","tool_calls":[]},"logprobs":null,"finish_reason":"stop","stop_reason":null}],"usage":{"prompt_tokens":120,"total_tokens":130,"completion_tokens":10,"prompt_tokens_details":{"cached_tokens":96}},"prompt_logprobs":null,"kv_transfer_params":null}`, ok(120, 96)},
	{"vLLM completions answer", `{"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":" a b","logprobs":null,"finish_reason":"length","stop_reason":null,"prompt_logprobs":null}],"usage":{"prompt_tokens":33,"total_tokens":35,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":32}}}`, ok(33, 32)},
	{"usage first", `{"usage":` + usageObj("5", "4") + `,"choices":[]}`, ok(5, 4)},
	{"Responses API answer", `{"id":"resp_1","object":"response","status":"completed","output":[{"type":"message","content":[{"type":"output_text","text":"hi"}]}],"usage":{"input_tokens":40,"input_tokens_details":{"cached_tokens":32},"output_tokens":5,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":45}}`, ok(40, 32)},
	{"Responses API, nothing cached", `{"object":"response","usage":{"input_tokens":40,"output_tokens":5}}`, noDetails(40)},
	{"Responses API event", `{"type":"response.completed","sequence_number":9,"response":{"id":"resp_1","object":"response","output":[],"usage":{"input_tokens":40,"input_tokens_details":{"cached_tokens":16},"output_tokens":5}}}`, ok(40, 16)},
	{"usage in a response in a response", `{"response":{"response":{"usage":` + usageObj("5", "4") + `}}}`, noReport()},
	{"usage beside a response", `{"response":{"id":"r","usage":null},"usage":` + usageObj("7", "1") + `}`, ok(7, 1)},
	{"no details (vLLM with nothing cached)", usageDoc(`{"prompt_tokens":120,"total_tokens":130,"completion_tokens":10}`), noDetails(120)},
	{"details null", usageDoc(`{"prompt_tokens":120,"prompt_tokens_details":null}`), noDetails(120)},
	{"details empty", usageDoc(`{"prompt_tokens":120,"prompt_tokens_details":{}}`), noDetails(120)},
	{"details without cached_tokens", usageDoc(`{"prompt_tokens":120,"prompt_tokens_details":{"audio_tokens":0}}`), noDetails(120)},
	{"details a string", usageDoc(`{"prompt_tokens":120,"prompt_tokens_details":"cached_tokens"}`), noDetails(120)},
	{"cached_tokens beside prompt_tokens does not count", usageDoc(`{"prompt_tokens":120,"cached_tokens":100}`), noDetails(120)},
	{"cached before prompt", usageDoc(`{"prompt_tokens_details":{"cached_tokens":16},"prompt_tokens":17}`), ok(17, 16)},
	{"cached 0", usageDoc(usageObj("120", "0")), ok(120, 0)},
	{"cached == prompt", usageDoc(usageObj("64", "64")), ok(64, 64)},
	{"prompt 0", usageDoc(usageObj("0", "0")), ok(0, 0)},
	{"largest count", usageDoc(usageObj("999999999", "999999999")), ok(999999999, 999999999)},
	{"other nested details ignored", usageDoc(`{"prompt_tokens":9,"completion_tokens_details":{"reasoning_tokens":3,"cached_tokens":99},"prompt_tokens_details":{"cached_tokens":8,"x":{"cached_tokens":99}}}`), ok(9, 8)},
	{"pretty-printed", "{\n  \"id\": \"c\",\n  \"usage\" : {\r\n\t\"prompt_tokens\" : 40 ,\n    \"prompt_tokens_details\" : { \"cached_tokens\" : 32 }\n  }\n}\n", ok(40, 32)},
	{"escapes before usage", `{"choices":[{"message":{"content":"a \"quoted\" \\ back\\\\slash \\\" \u0022usage\u0022 }]}"}}],"usage":` + usageObj("10", "2") + `}`, ok(10, 2)},
	{"key-like text in a string", `{"choices":[{"message":{"content":"\"usage\":{\"prompt_tokens\":7,\"prompt_tokens_details\":{\"cached_tokens\":7}}"}}]}`, noReport()},
	{"a string value usage", `{"object":"usage","note":"usage"}`, noReport()},
	{"a quote-escaped key", `{"say \"usage":` + usageObj("5", "5") + `}`, noReport()},
	{"a quote-escaped value", `{"content":"say \"usage","n":{"a":1}}`, noReport()},
	{"an escaped backslash before a quote", `{"content":"a\\","usage":` + usageObj("5", "1") + `}`, ok(5, 1)},
	{"the last of two usage objects", `{"usage":` + usageObj("10", "2") + `,"usage":` + usageObj("20", "3") + `}`, ok(20, 3)},
	{"trailing bytes ignored", usageDoc(usageObj("10", "2")) + `{"usage":` + usageObj("20", "3") + `}`, ok(10, 2)},

	// Not at the top level.
	{"usage in a choice", `{"choices":[{"index":0,"usage":` + usageObj("5", "5") + `}]}`, noReport()},
	{"usage in an object", `{"x":{"usage":` + usageObj("5", "5") + `}}`, noReport()},
	{"usage in an object in usage", usageDoc(`{"usage":` + usageObj("5", "5") + `}`), invalidReport()},
	{"prompt_tokens deeper in usage", usageDoc(`{"x":{"prompt_tokens":5}}`), invalidReport()},
	{"top-level array", `[{"usage":` + usageObj("5", "5") + `}]`, noReport()},
	{"escaped key", `{"usag\u0065":` + usageObj("5", "5") + `}`, noReport()},
	{"escaped inner key", usageDoc(`{"prompt_tokens":5,"prompt_tokens_details":{"cached_\u0074okens":5}}`), noDetails(5)},
	{"too deep to follow", strings.Repeat(`{"a":`, maxUsageDepth) + `{"usage":` + usageObj("5", "5") + `}`, noReport()},
	{"usage null", usageDoc(`null`), noReport()},
	{"usage a list", usageDoc(`[` + usageObj("5", "5") + `]`), noReport()},
	{"usage a string", usageDoc(`"{\"prompt_tokens\":5}"`), noReport()},
	{"not JSON", `data: {"usage":` + usageObj("5", "5") + `}`, noReport()},

	// Hostile or broken counts: the report is invalid.
	{"cached > prompt", usageDoc(usageObj("10", "11")), invalidReport()},
	{"negative prompt", usageDoc(usageObj("-10", "0")), invalidReport()},
	{"negative cached", usageDoc(usageObj("10", "-1")), invalidReport()},
	{"minus zero", usageDoc(usageObj("10", "-0")), invalidReport()},
	{"fraction", usageDoc(usageObj("10.0", "1")), invalidReport()},
	{"exponent", usageDoc(usageObj("1e3", "1")), invalidReport()},
	{"leading zero", usageDoc(usageObj("010", "1")), invalidReport()},
	{"ten digits", usageDoc(usageObj("1000000000", "1")), invalidReport()},
	{"huge", usageDoc(usageObj("99999999999999999999999999999999", "1")), invalidReport()},
	{"quoted count", usageDoc(usageObj(`"10"`, "1")), invalidReport()},
	{"null count", usageDoc(usageObj("10", "null")), invalidReport()},
	{"true count", usageDoc(usageObj("true", "1")), invalidReport()},
	{"object count", usageDoc(usageObj("{}", "1")), invalidReport()},
	{"list count", usageDoc(usageObj("[10]", "1")), invalidReport()},
	{"empty count", usageDoc(`{"prompt_tokens":}`), invalidReport()},
	{"no prompt_tokens", usageDoc(`{"total_tokens":5,"prompt_tokens_details":{"cached_tokens":1}}`), invalidReport()},
	{"empty usage", usageDoc(`{}`), invalidReport()},
	{"a bad duplicate", usageDoc(`{"prompt_tokens":-1,"prompt_tokens":5}`), invalidReport()},
}

// usageSSECases are event streams and the usage they count.
var usageSSECases = []struct {
	name   string
	stream string
	want   usageReport
}{
	{"vLLM include_usage", streamOf(chunkEvent("a"), chunkEvent(" b"), usageChunk(vllmUsage(40, 32))), ok(40, 32)},
	{"vLLM nothing cached", streamOf(chunkEvent("a"), usageChunk(vllmUsageNoDetails(40))), noDetails(40)},
	{"no usage asked", streamOf(chunkEvent("a"), chunkEvent(" b")), noReport()},
	{"continuous usage: the last counts", streamOf(
		usageEvent(`{"choices":[{"delta":{"content":"a"}}],"usage":`+vllmUsage(40, 0)+`}`),
		usageEvent(`{"choices":[{"delta":{"content":"b"}}],"usage":`+vllmUsage(40, 16)+`}`),
		usageChunk(vllmUsage(40, 32))), ok(40, 32)},
	{"usage before a final chunk without it", streamOf(usageChunk(vllmUsage(40, 32)), chunkEvent("a")), ok(40, 32)},
	{"OpenAI usage null then a report", streamOf(
		usageEvent(`{"choices":[{"delta":{"content":"a"}}],"usage":null}`),
		usageChunk(vllmUsage(12, 0))), ok(12, 0)},
	{"an invalid report last", streamOf(usageChunk(vllmUsage(40, 32)), usageChunk(vllmUsage(4, 32))), invalidReport()},
	{"no space after data:", "data:" + usageDoc(usageObj("7", "3")) + "\n\n", ok(7, 3)},
	{"CRLF lines", strings.ReplaceAll(streamOf(chunkEvent("a"), usageChunk(vllmUsage(40, 32))), "\n", "\r\n"), ok(40, 32)},
	{"other fields and comments", ": " + usageDoc(usageObj("1", "1")) + "\nevent: " + usageDoc(usageObj("2", "2")) + "\nid: 1\n" + usageEvent(usageDoc(usageObj("3", "1"))), ok(3, 1)},
	{"a comment last", usageEvent(usageDoc(usageObj("3", "1"))) + ":" + usageDoc(usageObj("5", "5")) + "\n\n", ok(3, 1)},
	{"a data line not JSON", usageEvent(usageDoc(usageObj("3", "1"))) + `data: "usage":` + usageObj("5", "5") + "\n\n", ok(3, 1)},
	{"usage nested in an event", streamOf(usageEvent(`{"choices":[{"usage":` + vllmUsage(5, 5) + `}]}`)), noReport()},
	{"usage text in a token", streamOf(chunkEvent(`\"usage\":{\"prompt_tokens\":5}`)), noReport()},
	{"an unfinished last line", usageEvent(usageDoc(usageObj("3", "1"))) + "data: " + `{"usage":` + usageObj("6", "2"), ok(6, 2)},
	{"an error event", "data: " + `{"error":{"message":"x","code":500}}` + "\n\n", noReport()},
	{"Responses API stream", "event: response.created\n" + usageEvent(`{"type":"response.created","response":{"id":"r","status":"in_progress","usage":null}}`) +
		"event: response.output_text.delta\n" + usageEvent(`{"type":"response.output_text.delta","delta":"hi"}`) +
		"event: response.completed\n" + usageEvent(`{"type":"response.completed","response":{"id":"r","status":"completed","usage":{"input_tokens":40,"input_tokens_details":{"cached_tokens":32},"output_tokens":2}}}`), ok(40, 32)},
}

func TestUsageScanJSON(t *testing.T) {
	for _, tc := range usageJSONCases {
		t.Run(tc.name, func(t *testing.T) {
			if got := scanPieces(scanJSON, []byte(tc.doc)); got != tc.want {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
			// The same document as an SSE event.
			if !strings.ContainsAny(tc.doc, "\r\n") {
				if got := scanPieces(scanSSE, []byte(usageEvent(tc.doc))); got != tc.want {
					t.Fatalf("as an event: got %v, want %v", got, tc.want)
				}
			}
		})
	}
}

func TestUsageScanSSE(t *testing.T) {
	for _, tc := range usageSSECases {
		t.Run(tc.name, func(t *testing.T) {
			if got := scanPieces(scanSSE, []byte(tc.stream)); got != tc.want {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
		})
	}
}

// TestUsageScanSplit: however an answer is cut into reads, the scan finds
// the same: at every byte across two reads, at every pair of bytes near
// the usage key across three, and one byte per read.
func TestUsageScanSplit(t *testing.T) {
	type input struct {
		mode uint8
		name string
		body string
		want usageReport
	}
	var in []input
	for _, tc := range usageJSONCases {
		in = append(in, input{scanJSON, tc.name, tc.doc, tc.want})
	}
	for _, tc := range usageSSECases {
		in = append(in, input{scanSSE, tc.name, tc.stream, tc.want})
	}
	for _, tc := range in {
		b := []byte(tc.body)
		for i := 0; i <= len(b); i++ {
			if got := scanPieces(tc.mode, b[:i], b[i:]); got != tc.want {
				t.Fatalf("%s cut at %d (%q | %q): got %v, want %v", tc.name, i, b[:i], b[i:], got, tc.want)
			}
		}
		// Two cuts around the last key, where they matter most.
		k := max(0, strings.LastIndex(tc.body, `usage"`)-24)
		for i := k; i <= min(len(b), k+64); i++ {
			for j := i; j <= min(len(b), k+64); j++ {
				if got := scanPieces(tc.mode, b[:i], b[i:j], b[j:]); got != tc.want {
					t.Fatalf("%s cut at %d and %d: got %v, want %v", tc.name, i, j, got, tc.want)
				}
			}
		}
		var bytewise [][]byte
		for i := range b {
			bytewise = append(bytewise, b[i:i+1])
		}
		if got := scanPieces(tc.mode, bytewise...); got != tc.want {
			t.Fatalf("%s a byte at a time: got %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestUsageScanBegin: only 2xx JSON and SSE answers are read.
func TestUsageScanBegin(t *testing.T) {
	for _, tc := range []struct {
		status int
		ct     string
		want   uint8
	}{
		{200, "application/json", scanJSON},
		{200, "application/json; charset=utf-8", scanJSON},
		{200, "text/event-stream; charset=utf-8", scanSSE},
		{201, "text/event-stream", scanSSE},
		{200, "text/plain", scanOff},
		{200, "application/octet-stream", scanOff},
		{400, "application/json", scanOff},
		{500, "text/event-stream", scanOff},
	} {
		var h fasthttp.ResponseHeader
		h.SetStatusCode(tc.status)
		h.SetContentType(tc.ct)
		var s usageScan
		s.mode, s.line = scanSSE, lineSkip
		s.begin(&h)
		if s.mode != tc.want || s.line != 0 {
			t.Errorf("%d %s: mode %d line %d, want mode %d line 0", tc.status, tc.ct, s.mode, s.line, tc.want)
		}
	}
}

// TestUsageScanAllocations: scanning a chunk, a complete answer, and
// counting a report allocate nothing.
func TestUsageScanAllocations(t *testing.T) {
	tokens := []byte(chunkEvent(" word"))
	cont := []byte(usageEvent(`{"choices":[{"delta":{"content":"a"}}],"usage":` + vllmUsage(4000, 3000) + `}`))
	final := []byte(streamOf(usageChunk(vllmUsage(4000, 3008))))
	var h fasthttp.ResponseHeader
	h.SetContentType("text/event-stream")
	var s usageScan
	if n := testing.AllocsPerRun(100, func() {
		s.begin(&h)
		for range 10 {
			s.feed(tokens)
			s.feed(cont[:40])
			s.feed(cont[40:])
		}
		s.feed(final)
	}); n != 0 || s.report() != ok(4000, 3008) {
		t.Errorf("a stream's scan allocates %v times and reads %v", n, s.report())
	}

	m := newMetrics(prometheus.NewRegistry())
	b := &backend{id: "b/", m: m.forBackend("b/")}
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseResponse(resp)
	resp.Header.SetContentType("application/json")
	resp.SetBodyString(usageJSONCases[0].doc)
	// 120 prompt tokens over a body of 480 bytes: the key's 400 bytes
	// are 100 tokens.
	pr := prediction{kind: kindAffinity, warm: true, prefix: 400, body: 480}
	if n := testing.AllocsPerRun(100, func() { b.countBodyUsage(resp, pr) }); n != 0 {
		t.Errorf("counting a complete answer's usage allocates %v times", n)
	}
	if got := testutil.ToFloat64(m.cachedTokens.WithLabelValues("b/")); got != 101*96 {
		t.Errorf("cached tokens %v, want %v", got, 101*96)
	}
	// The answer (120 prompt tokens, 96 cached) covers more than half the
	// 100 tokens predicted: 101 answers predicted and delivered warm.
	want := []CacheFigures{{Kind: "affinity", Answers: 101, Reported: 101, PredictedWarm: 101, DeliveredWarm: 101, BothWarm: 101,
		PromptTokens: 101 * 120, CachedTokens: 101 * 96, PredictedTokens: 101 * 100, PredictedHitRate: 1, DeliveredHitRate: 1, TokenHitRate: 0.8}}
	if got := b.cache.figures(); !reflect.DeepEqual(got, want) {
		t.Errorf("cache figures %+v, want %+v", got, want)
	}
}

// usageCounts reads backend id's usage series.
type usageCounts struct {
	prompt, cached         float64
	ok, noDetails, invalid float64
}

func readUsage(h *harness, id string) usageCounts {
	m := h.p.m
	return usageCounts{
		prompt:    testutil.ToFloat64(m.promptTokens.WithLabelValues(id)),
		cached:    testutil.ToFloat64(m.cachedTokens.WithLabelValues(id)),
		ok:        testutil.ToFloat64(m.usageReports.WithLabelValues(id, "ok")),
		noDetails: testutil.ToFloat64(m.usageReports.WithLabelValues(id, "no_details")),
		invalid:   testutil.ToFloat64(m.usageReports.WithLabelValues(id, "invalid")),
	}
}

// answerUsage is the usage object of an answer as a client decodes it.
type answerUsage struct {
	PromptTokens        int `json:"prompt_tokens"`
	PromptTokensDetails *struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

// lastUsage decodes the usage of a JSON answer or the last one of a stream.
func lastUsage(t *testing.T, body []byte, stream bool) *answerUsage {
	t.Helper()
	var doc struct {
		Usage *answerUsage `json:"usage"`
	}
	if !stream {
		if err := json.Unmarshal(body, &doc); err != nil {
			t.Fatalf("answer %q: %v", body, err)
		}
		return doc.Usage
	}
	var last *answerUsage
	sc := bufio.NewScanner(strings.NewReader(string(body)))
	for sc.Scan() {
		data, found := strings.CutPrefix(sc.Text(), "data: ")
		if !found || data == "[DONE]" {
			continue
		}
		doc.Usage = nil
		if err := json.Unmarshal([]byte(data), &doc); err != nil {
			t.Fatalf("event %q: %v", data, err)
		}
		if doc.Usage != nil {
			last = doc.Usage
		}
	}
	return last
}

// TestUsageThroughProxyGpusim: answers from a simulated vLLM instance,
// streamed and not, add exactly the usage they carry to the backend's
// counters; the same prompt again is served from the cache.
func TestUsageThroughProxyGpusim(t *testing.T) {
	cfg := gpusim.FastConfig()
	cfg.Model = "m"
	in, err := gpusim.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(in.Handler())
	t.Cleanup(func() {
		_ = in.Close()
		srv.Close()
	})
	tg, err := backendspec.ParseTarget(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	h := startProxyBackends(t, testProxyConfig(), ring.DefaultConfig(), []ring.Backend{{ID: tg.HostPort, Addr: srv.URL}})
	prompt := strings.Repeat("A long shared system prompt that the engine caches. ", 40)

	var want usageCounts
	for i, extra := range []string{
		`,"max_tokens":4`,
		`,"max_tokens":4`,
		`,"max_tokens":4,"stream":true,"stream_options":{"include_usage":true}`,
		`,"max_tokens":4,"stream":true,"stream_options":{"include_usage":true,"continuous_usage_stats":true}`,
		`,"max_tokens":4,"stream":true`, // no usage asked: nothing to count
	} {
		stream := strings.Contains(extra, "stream")
		resp, body := post(t, h.url+"/v1/chat/completions", chatReq(prompt, extra))
		if resp.StatusCode != 200 {
			t.Fatalf("request %d: %d %s", i, resp.StatusCode, body)
		}
		u := lastUsage(t, body, stream)
		if u == nil {
			continue
		}
		if u.PromptTokensDetails == nil {
			t.Fatalf("request %d: gpusim sent no prompt_tokens_details: %s", i, body)
		}
		want.prompt += float64(u.PromptTokens)
		want.cached += float64(u.PromptTokensDetails.CachedTokens)
		want.ok++
	}
	if want.ok != 4 || want.cached == 0 {
		t.Fatalf("the answers reported %+v: want 4 reports and cached tokens", want)
	}
	waitFor(t, func() bool { return readUsage(h, tg.HostPort) == want }, fmt.Sprintf("usage counters %+v", want))
}

// TestUsageThroughProxyStubs: what the proxy counts from answers that
// vLLM would not send, and from a stream whose usage event arrives a few
// bytes at a time.
func TestUsageThroughProxyStubs(t *testing.T) {
	final := usageChunk(vllmUsage(300, 288))
	a := newStub(t, "a", func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		prompt := string(body)
		switch {
		case strings.Contains(prompt, "dribble"):
			w.Header().Set("Content-Type", "text/event-stream")
			fl := w.(http.Flusher)
			io.WriteString(w, chunkEvent("a"))
			fl.Flush()
			for i := 0; i < len(final); i += 7 {
				io.WriteString(w, final[i:min(i+7, len(final))])
				fl.Flush()
			}
			io.WriteString(w, "data: [DONE]\n\n")
		case strings.Contains(prompt, "continuous"):
			w.Header().Set("Content-Type", "text/event-stream")
			for i := range 5 {
				fmt.Fprintf(w, "data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}],\"usage\":%s}\n\n", vllmUsage(100, 16*i))
				w.(http.Flusher).Flush()
			}
			io.WriteString(w, streamOf(usageChunk(vllmUsage(100, 64))))
		case strings.Contains(prompt, "hostile"):
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, usageDoc(usageObj("10", "11")))
		case strings.Contains(prompt, "plain"):
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, usageDoc(vllmUsageNoDetails(50)))
		case strings.Contains(prompt, "failed"):
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(500)
			io.WriteString(w, usageDoc(vllmUsage(70, 70)))
		default:
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, usageDoc(vllmUsage(20, 16)))
		}
	})
	h := startProxy(t, testProxyConfig(), ring.DefaultConfig(), a)
	id := a.srv.Listener.Addr().String()
	for _, c := range []struct{ prompt, extra string }{
		{"dribble", `,"stream":true`},
		{"continuous", `,"stream":true`},
		{"hostile", ""},
		{"plain", ""},
		{"failed", ""},
		{"fine", ""},
	} {
		resp, body := post(t, h.url+"/v1/chat/completions", chatReq(c.prompt, c.extra))
		if c.prompt == "dribble" && !strings.HasSuffix(string(body), final+"data: [DONE]\n\n") {
			t.Fatalf("dribbled stream arrived as %q", body)
		}
		resp.Body.Close()
	}
	want := usageCounts{prompt: 300 + 100 + 50 + 20, cached: 288 + 64 + 0 + 16, ok: 3, noDetails: 1, invalid: 1}
	waitFor(t, func() bool { return readUsage(h, id) == want }, fmt.Sprintf("usage counters %+v", want))
	if got := readUsage(h, id); got != want {
		t.Fatalf("usage counters %+v, want %+v", got, want)
	}
}

// BenchmarkUsageScan is the scan's cost per read: a token event (the
// common chunk), one with continuous usage stats, the final usage event,
// an event cut in two reads, and a complete 4 KiB answer (prose).
func BenchmarkUsageScan(b *testing.B) {
	tokens := []byte(chunkEvent(" word"))
	cont := []byte(usageEvent(`{"id":"chatcmpl-7a3f","object":"chat.completion.chunk","created":1700000000,"model":"meta-llama/Llama-3.1-70B-Instruct","choices":[{"index":0,"delta":{"content":" word"},"logprobs":null,"finish_reason":null}],"usage":` + vllmUsage(4000, 3008) + `}`))
	final := []byte(streamOf(usageChunk(vllmUsage(4000, 3008))))
	var answer []byte
	{
		var sb strings.Builder
		sb.WriteString(`{"id":"chatcmpl-7a3f","object":"chat.completion","created":1700000000,"model":"meta-llama/Llama-3.1-70B-Instruct","choices":[{"index":0,"message":{"role":"assistant","content":"`)
		for sb.Len() < 4000 { // prose: a line break every 80 bytes, a quotation every 400
			sb.WriteString(`The router reads the usage the engine reports as answers pass through it.\n`)
			if sb.Len()%400 < 80 {
				sb.WriteString(`It said \"cached\". `)
			}
		}
		sb.WriteString(`","tool_calls":[]},"logprobs":null,"finish_reason":"length","stop_reason":null}],"usage":` + vllmUsage(4000, 3008) + `,"prompt_logprobs":null}`)
		answer = []byte(sb.String())
	}
	for _, c := range []struct {
		name   string
		mode   uint8
		pieces [][]byte
	}{
		{"token-event", scanSSE, [][]byte{tokens}},
		{"continuous-usage-event", scanSSE, [][]byte{cont}},
		{"final-usage-event", scanSSE, [][]byte{final}},
		{"token-event-cut-in-two", scanSSE, [][]byte{tokens[:100], tokens[100:]}},
		{"answer-4KiB", scanJSON, [][]byte{answer}},
	} {
		n := 0
		for _, p := range c.pieces {
			n += len(p)
		}
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(n))
			var s usageScan
			for b.Loop() {
				s = usageScan{mode: c.mode}
				for _, p := range c.pieces {
					s.feed(p)
				}
			}
			_ = s.report()
		})
	}
}
